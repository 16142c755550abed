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

use crate::cache::exact::{Answer, Chunk};
use crate::http::api::Usage;
use crate::redis_conn::{CALL_TIMEOUT, connect_redis};

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
        format!("frugal:exact:v1:{}", crate::admit::keys::hash_key(key))
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
                cached_tokens: 0,
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
