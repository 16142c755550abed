//! The exact cache shared by gateway replicas, in Redis.
//!
//! A local miss asks Redis before the model; every stored answer is also written there with
//! the cache's time to live, so one replica's answer serves the others. Entries are keyed by
//! the SHA-256 of the canonical request key and hold the full key, compared on read, so a
//! hash collision never serves another request's answer. Redis is an accelerator, not a
//! dependency of correctness: when it is unreachable a lookup is a miss and a write is
//! dropped (both counted and logged), and requests go on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use frugal_cost::Money;
use frugal_engine::scheduler::FinishReason;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use crate::api::Usage;
use crate::cache::{Answer, Chunk};

/// Longest a Redis call may take before the request goes on without it.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_millis(250);

pub struct SharedCache {
    conn: redis::aio::ConnectionManager,
    ttl: Duration,
    pub hits: AtomicU64,
    pub errors: AtomicU64,
}

/// An answer as Redis holds it.
#[derive(Serialize, Deserialize)]
struct Stored {
    key: String,
    chunks: Vec<Chunk>,
    finish: String,
    usage: [usize; 3],
    cost_nanos: i64,
    #[serde(default)]
    judged: Option<Vec<f32>>,
}

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

impl SharedCache {
    /// Connects (and checks the server answers) before serving starts.
    pub async fn connect(url: &str, ttl: Duration) -> Result<SharedCache, String> {
        Ok(SharedCache {
            conn: connect_redis("cache_redis", url).await?,
            ttl,
            hits: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        })
    }

    fn redis_key(key: &str) -> String {
        format!("frugal:exact:v1:{}", crate::keys::hash_key(key))
    }

    fn failed(&self, what: &str, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("shared cache {what}: {e}");
    }

    /// The answer another replica stored under `key`, if any.
    pub async fn get(&self, key: &str) -> Option<Answer> {
        match self.read(key).await {
            Ok(found) => {
                if found.is_some() {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                }
                found
            }
            Err(e) => {
                self.failed("read", e);
                None
            }
        }
    }

    async fn read(&self, key: &str) -> Result<Option<Answer>, String> {
        let mut conn = self.conn.clone();
        let call = conn.get::<_, Option<Vec<u8>>>(SharedCache::redis_key(key));
        let bytes = tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| e.to_string())?;
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let stored: Stored =
            serde_json::from_slice(&bytes).map_err(|e| format!("unreadable entry: {e}"))?;
        if stored.key != key {
            return Ok(None);
        }
        Ok(Some(Answer {
            chunks: stored.chunks,
            finish_reason: if stored.finish == "length" {
                FinishReason::Length
            } else {
                FinishReason::Stop
            },
            usage: Usage {
                prompt_tokens: stored.usage[0],
                completion_tokens: stored.usage[1],
                total_tokens: stored.usage[2],
            },
            cost: Money::from_nanos(stored.cost_nanos),
            judged: stored.judged,
        }))
    }

    /// Writes the answer in the background; the request does not wait for Redis.
    pub fn put(self: &Arc<Self>, key: &str, answer: &Answer) {
        let stored = Stored {
            key: key.to_owned(),
            chunks: answer.chunks.clone(),
            finish: match answer.finish_reason {
                FinishReason::Stop => "stop".into(),
                FinishReason::Length => "length".into(),
            },
            usage: [
                answer.usage.prompt_tokens,
                answer.usage.completion_tokens,
                answer.usage.total_tokens,
            ],
            cost_nanos: answer.cost.nanos(),
            judged: answer.judged.clone(),
        };
        let Ok(bytes) = serde_json::to_vec(&stored) else {
            return;
        };
        let (this, redis_key) = (self.clone(), SharedCache::redis_key(key));
        tokio::spawn(async move {
            let mut conn = this.conn.clone();
            let call = conn.set_ex::<_, _, ()>(redis_key, bytes, this.ttl.as_secs().max(1));
            match tokio::time::timeout(CALL_TIMEOUT, call).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => this.failed("write", e),
                Err(_) => this.failed("write", "timed out"),
            }
        });
    }
}

#[cfg(test)]
mod redaction_tests {
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
