//! Builders of ledger rows for tests: an inference event, a replica span, a pool's span. A
//! test changes the fields it looks at (`ReplicaSpan { pool: .., ..span(..) }`).
//!
//! frugal-cost's own unit tests compile this file into their crate (see the testkit's
//! `lib.rs`), where `frugal_cost` names that crate itself.

use frugal_cost::money::Millis;
use frugal_cost::{Event, Kind, Money, ReplicaSpan, ReplicaState};

const MINUTE_MS: Millis = 60_000;

/// One inference request of workload `chat` on model `m`, for `cents`.
pub fn event(ts_ms: Millis, cents: i64) -> Event {
    let mut e = Event::new(ts_ms, Kind::Inference, "chat", Money::from_cents(cents));
    e.model = Some("m".into());
    e.requests = 1;
    e
}

/// A minute of replica 1 of pool `m` (workload `chat`), ready and idle, for `cost`; a pool
/// of at most one replica, of no known instance type.
pub fn span(ts_ms: Millis, cost: Money) -> ReplicaSpan {
    ReplicaSpan {
        id: None,
        ts_ms,
        duration_ms: MINUTE_MS,
        workload: "chat".into(),
        pool: "m".into(),
        replica: 1,
        state: ReplicaState::Ready,
        busy_ms: 0,
        cost,
        instance_type: None,
        min_replicas: 0,
        max_replicas: 1,
        need_bytes: None,
        failed: false,
        server: None,
        requests: 0,
        input_tokens: 0,
        output_tokens: 0,
    }
}

/// Pool `qwen` of 0 to 4 replicas needing 3 GiB each, on p4d.24xlarge at $1 a
/// replica-hour (exact for whole tenths of an hour): `replica` in `state` from `at_min`
/// minutes after `t0`, for `minutes`, `busy_min` of them busy.
pub fn pool_span(
    t0: Millis,
    at_min: i64,
    replica: u32,
    state: ReplicaState,
    minutes: i64,
    busy_min: i64,
) -> ReplicaSpan {
    ReplicaSpan {
        pool: "qwen".into(),
        replica,
        state,
        duration_ms: minutes * MINUTE_MS,
        busy_ms: busy_min * MINUTE_MS,
        instance_type: Some("p4d.24xlarge".into()),
        max_replicas: 4,
        need_bytes: Some(3 << 30),
        ..span(
            t0 + at_min * MINUTE_MS,
            Money::from_cents(100 * minutes / 60),
        )
    }
}
