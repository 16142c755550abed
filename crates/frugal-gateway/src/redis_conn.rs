//! Connections to Redis (the shared cache's, the shared budgets'): opened and checked
//! before serving, each call bounded by [`CALL_TIMEOUT`], and URLs shown with their
//! password redacted.

use std::time::Duration;

use frugal_cost::secret_url::{Hide, SecretUrl};

/// Longest a Redis call may take before the request goes on without it.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_millis(250);

/// `url` as it may be shown: its password (and any user name) replaced, so no secret
/// reaches a log or an error message. Also what upstream and health URLs are shown with.
pub fn redact_url(url: &str) -> String {
    SecretUrl::parse(url).shown(Hide::UserInfo)
}

/// Whether `url` carries a credential (a user part, a `password` or `pass` parameter):
/// what must come from a secret store, never from a plain file.
pub fn has_credentials(url: &str) -> bool {
    SecretUrl::parse(url).has_secret(Hide::UserInfo)
}

/// A connection to the Redis at `url`, checked to answer within 5 s; errors name the
/// setting `what` and show the URL redacted.
pub async fn connect_redis(what: &str, url: &str) -> Result<redis::aio::ConnectionManager, String> {
    let shown = redact_url(url);
    // The client's own errors may quote the URL: they are shown with it redacted.
    let hide = |e: redis::RedisError| e.to_string().replace(url, &shown);
    let client = redis::Client::open(url).map_err(|e| format!("{what} {shown}: {}", hide(e)))?;
    // A plain connection first, which says why Redis cannot be reached (the manager's
    // first connection retries until the timeout).
    tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| format!("{what} {shown}: no answer within 5 s"))?
    .map_err(|e| format!("{what} {shown}: {}", hide(e)))?;
    // Reconnecting backs off to a second at most, so a Redis back after a long outage is
    // found within about a second.
    let config = redis::aio::ConnectionManagerConfig::new().set_max_delay(Duration::from_secs(1));
    tokio::time::timeout(
        Duration::from_secs(5),
        client.get_connection_manager_with_config(config),
    )
    .await
    .map_err(|_| format!("{what} {shown}: no answer within 5 s"))?
    .map_err(|e| format!("{what} {shown}: {}", hide(e)))
}

#[cfg(test)]
mod tests {
    use super::{connect_redis, redact_url};

    #[test]
    fn urls_are_shown_without_their_secrets() {
        assert_eq!(
            redact_url("redis://:hunter2@cache.internal:6379/0"),
            "redis://***@cache.internal:6379/0"
        );
        // Issue 31: a password pasted unencoded, with a `/` (base64) or an `@`.
        assert_eq!(
            redact_url("redis://:Zm9v/YmFy@cache:6379/0"),
            "redis://***@cache:6379/0"
        );
        assert_eq!(redact_url("rediss://user:p@ss@h/1"), "rediss://***@h/1");
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Issue 31: a password pasted unencoded reaches neither the URL as shown nor the
        /// error of a Redis that cannot be reached.
        #[test]
        fn no_password_reaches_a_connection_error(pw in frugal_testkit::secrets::url_password()) {
            let port = frugal_testkit::free_port().unwrap();
            let url = format!("redis://frugal:{pw}@127.0.0.1:{port}/0");
            proptest::prop_assert!(super::has_credentials(&url));
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let err = runtime
                .block_on(connect_redis("cache_redis", &url))
                .err()
                .unwrap();
            let shown = redact_url(&url);
            proptest::prop_assert!(!err.contains(&pw) && !shown.contains(&pw), "{url}: {err}");
        }
    }
}
