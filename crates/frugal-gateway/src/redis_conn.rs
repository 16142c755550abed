//! Connections to Redis (the shared cache's, the shared budgets'): opened and checked
//! before serving, each call bounded by [`CALL_TIMEOUT`], and URLs shown with their
//! password redacted.

use std::time::Duration;

/// Longest a Redis call may take before the request goes on without it.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_millis(250);

/// `url` as it may be shown: its password (and any user name) replaced, so no secret
/// reaches a log or an error message.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}{path}"),
        None => url.to_owned(),
    }
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
    use super::redact_url;

    #[test]
    fn urls_are_shown_without_their_secrets() {
        assert_eq!(
            redact_url("redis://:hunter2@cache.internal:6379/0"),
            "redis://***@cache.internal:6379/0"
        );
        assert_eq!(
            redact_url("rediss://user:pw@h/1?x=y@z"),
            "rediss://***@h/1?x=y@z"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }
}
