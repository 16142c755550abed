//! End-to-end: two `frugal serve` replicas sharing their exact cache through a real Redis
//! server, and what happens when Redis goes away.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Server, header};
use frugal_testkit::redis::Redis;

#[test]
fn replicas_share_answers_through_redis_and_survive_losing_it() {
    let mut redis = Redis::start().unwrap();
    let flags = ["--cache-redis", redis.url.as_str(), "--no-semantic-cache"];
    let a = Server::start(&flags);
    let b = Server::start(&flags);

    let (head, first) = a.ask("Name a color.", 12);
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"), "{head}");
    // The write to Redis is in the background: give it a moment, then ask the other replica.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (head, again) = loop {
        std::thread::sleep(Duration::from_millis(50));
        let probe = std::process::Command::new("redis-cli")
            .args(["-u", &redis.url, "dbsize"])
            .output();
        let stored = probe
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() != "0")
            .unwrap_or(true);
        if stored || Instant::now() > deadline {
            break b.ask("Name a color.", 12);
        }
    };
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"), "{head}");
    assert_eq!(again, first, "the other replica's answer");
    assert!(common::saved_usd(&head) > 0.0, "{head}");
    assert_eq!(b.metric("frugal_shared_cache_total{result=\"hit\"}"), 1.0);
    assert_eq!(b.metric("frugal_requests_total{status=\"ok\"}"), 1.0);
    // Now held locally too: Redis is not asked again.
    let (head, _) = b.ask("Name a color.", 12);
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"));
    assert_eq!(b.metric("frugal_shared_cache_total{result=\"hit\"}"), 1.0);

    // Redis goes away: requests are still answered, and the failures are counted.
    redis.kill();
    let (head, _) = a.ask("Name a fruit.", 12);
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"));
    std::thread::sleep(Duration::from_millis(400));
    assert!(a.metric("frugal_shared_cache_total{result=\"error\"}") >= 1.0);

    // A replica cannot start against a Redis that is not there.
    let err = common::serve_error(&[
        "serve",
        "--no-meter",
        "--no-semantic-cache",
        "--cache-redis",
        &redis.url,
    ]);
    assert!(err.contains("cannot reach the shared cache"), "{err}");
}
