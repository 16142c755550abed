//! Runs a batch job's pending lines through a gateway, in process.
//!
//! Each line is an HTTP request to the gateway's own router (`tower`'s `oneshot`, no
//! socket), so it takes the same way as an interactive request: keys aside, the caches,
//! routes, pools, upstreams, budgets and the meter all apply, and the answer is what a
//! client would have got. Retryable answers (429, 5xx) are tried again with exponential
//! backoff and jitter, honouring Retry-After, up to a per-line budget; other answers are
//! final (a 4xx goes to the error file as OpenAI writes it). Lines past the job's
//! completion window fail as `batch_expired`.
//!
//! A result the store cannot write for a reason that passes (a full disk) is tried again
//! with backoff, held in memory meanwhile; each line in flight holds its place until its
//! result is written, so the job pauses, at most `concurrency` results held, and goes on
//! when the disk has room again.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use frugal_cost::causes::with_causes;
use serde_json::Value;
use tower::ServiceExt;

use super::BatchLine;
use super::input::{Input, Line};
use super::store::{Failure, LineError, Response, Store, StoreError};
use crate::admit::keys::Tenant;
use crate::backend::upstream::retry_after;

/// Largest answer body read for one line.
const MAX_ANSWER: usize = 32 << 20;
/// First wait before a store write that failed is tried again; doubled each try up to
/// the second.
const STORE_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Lines in flight at once.
    pub concurrency: usize,
    /// Tries of a line whose answers are retryable, in all.
    pub max_attempts: u32,
    /// First wait between tries; doubled each try, with jitter.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Every line asks for this model instead of its body's.
    pub model: Option<String>,
    /// Whose budgets the lines spend (the tenant that submitted the job).
    pub tenant: Option<Arc<Tenant>>,
}

impl Default for RunConfig {
    fn default() -> RunConfig {
        RunConfig {
            concurrency: 8,
            max_attempts: 5,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(60),
            model: None,
            tenant: None,
        }
    }
}

/// Counters for a progress bar, updated as lines finish.
#[derive(Debug, Default)]
pub struct Progress {
    pub done: AtomicU64,
    pub failed: AtomicU64,
    pub retries: AtomicU64,
    pub tokens: AtomicU64,
    /// What the answers said they cost (`x-frugal-cost-usd`), in nano-dollars.
    pub cost_nanos: AtomicI64,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Every line is done or failed.
    Finished,
    /// Asked to stop: lines left pending run on the next start.
    Stopped,
}

/// Runs the store's pending lines of `input` through `app` until none is left or `stop`
/// resolves; lines in flight when it does are finished.
pub async fn run(
    app: Router,
    store: Arc<Store>,
    input: &Input,
    config: &RunConfig,
    progress: Arc<Progress>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Ended, StoreError> {
    let by_id: HashMap<&str, &Line> = input
        .lines
        .iter()
        .map(|l| (l.custom_id.as_str(), l))
        .collect();
    let pending = store.pending()?;
    let tag = BatchLine {
        job: Arc::from(store.job().id.as_str()),
        tenant: config.tenant.clone(),
    };
    let gate = Arc::new(tokio::sync::Semaphore::new(config.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    let mut stopped = false;
    for p in pending {
        let Some(line) = by_id.get(p.custom_id.as_str()) else {
            continue;
        };
        let permit = tokio::select! {
            permit = gate.clone().acquire_owned() => permit,
            () = &mut stop => { stopped = true; break; }
        };
        let Ok(permit) = permit else { break };
        let (app, store, progress, config, tag) = (
            app.clone(),
            store.clone(),
            progress.clone(),
            config.clone(),
            tag.clone(),
        );
        let (line, attempts) = ((*line).clone(), p.attempts);
        tasks.spawn(async move {
            let _permit = permit;
            run_line(app, &store, &line, attempts, &config, &progress, tag).await
        });
        // Results (and store errors) are taken as they come, so a failing disk stops the
        // job early.
        while let Some(done) = tasks.try_join_next() {
            flatten(done)?;
        }
    }
    while let Some(done) = tasks.join_next().await {
        flatten(done)?;
    }
    Ok(if stopped {
        Ended::Stopped
    } else {
        Ended::Finished
    })
}

fn flatten(done: Result<Result<(), StoreError>, tokio::task::JoinError>) -> Result<(), StoreError> {
    match done {
        Ok(r) => r,
        // A line's task that panicked stays pending: it runs again next time.
        Err(e) => {
            tracing::error!("a batch line's task failed: {e}");
            Ok(())
        }
    }
}

/// One line to its end: done, failed, or (retries spent) failed with its last answer.
async fn run_line(
    app: Router,
    store: &Arc<Store>,
    line: &Line,
    mut attempts: u32,
    config: &RunConfig,
    progress: &Progress,
    tag: BatchLine,
) -> Result<(), StoreError> {
    let body = body_for(line, config.model.as_deref());
    let expires = store.job().expires_at();
    loop {
        if now_s() >= expires {
            let failure = Failure::Error(LineError {
                code: "batch_expired".into(),
                message: "the line did not finish within the batch's completion window".into(),
            });
            progress.failed.fetch_add(1, Ordering::Relaxed);
            return durably(store, move |s, id| s.record_failed(id, &failure), line).await;
        }
        let answer = send(app.clone(), line, body.clone(), tag.clone()).await;
        let retryable = match &answer {
            Answer::Http { status, .. } => {
                *status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
            }
            Answer::Broken(_) => true,
        };
        attempts += 1;
        if retryable && attempts < config.max_attempts {
            let what = answer.describe();
            let wait = answer.retry_after(config.max_backoff).unwrap_or_else(|| {
                jitter(
                    config.backoff * 2u32.saturating_pow(attempts - 1),
                    line.number,
                    attempts,
                )
                .min(config.max_backoff)
            });
            durably(
                store,
                move |s, id| s.record_attempt(id, &what).map(drop),
                line,
            )
            .await?;
            progress.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(wait).await;
            continue;
        }
        return match answer {
            Answer::Http {
                status,
                request_id,
                body,
                cost_nanos,
                ..
            } => {
                progress.cost_nanos.fetch_add(cost_nanos, Ordering::Relaxed);
                let tokens = body["usage"]["total_tokens"].as_u64().unwrap_or(0);
                progress.tokens.fetch_add(tokens, Ordering::Relaxed);
                let response = Response {
                    status_code: status.as_u16(),
                    request_id,
                    body,
                };
                if status.is_success() {
                    progress.done.fetch_add(1, Ordering::Relaxed);
                    durably(store, move |s, id| s.record_done(id, &response), line).await
                } else {
                    progress.failed.fetch_add(1, Ordering::Relaxed);
                    let failure = Failure::Response(response);
                    durably(store, move |s, id| s.record_failed(id, &failure), line).await
                }
            }
            Answer::Broken(message) => {
                progress.failed.fetch_add(1, Ordering::Relaxed);
                let failure = Failure::Error(LineError {
                    code: "invalid_response".into(),
                    message,
                });
                durably(store, move |s, id| s.record_failed(id, &failure), line).await
            }
        };
    }
}

/// Writes the line's result (or attempt) with `f`, off the async threads (the store's
/// writes fsync), until it is written: a transient failure is tried again with backoff.
/// A try that put the line in its file before the commit failed finds it recorded at the
/// next: that is its success, so the line is written once.
async fn durably(
    store: &Arc<Store>,
    f: impl Fn(&Store, &str) -> Result<(), StoreError> + Send + Sync + 'static,
    line: &Line,
) -> Result<(), StoreError> {
    let f = Arc::new(f);
    let (mut wait, max) = STORE_BACKOFF;
    let mut failed = false;
    loop {
        let (store, id, f) = (store.clone(), line.custom_id.clone(), f.clone());
        let tried = tokio::task::spawn_blocking(move || f(&store, &id))
            .await
            .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())));
        match tried {
            Ok(()) => {
                if failed {
                    tracing::info!(
                        line = line.number,
                        "the batch's store took the result; going on"
                    );
                }
                return Ok(());
            }
            Err(StoreError::AlreadyRecorded { .. }) if failed => return Ok(()),
            Err(e) if e.is_transient() => {
                if !failed {
                    tracing::warn!(
                        line = line.number,
                        "the batch pauses: {}; the result is kept and written when it can be",
                        with_causes(&e)
                    );
                }
                failed = true;
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(max);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The line's body, with `model` put in its place when the run names one.
fn body_for(line: &Line, model: Option<&str>) -> axum::body::Bytes {
    match model {
        Some(m) => {
            let mut body = line.body.clone();
            body["model"] = Value::from(m);
            axum::body::Bytes::from(body.to_string())
        }
        None => line.bytes.clone(),
    }
}

/// What the gateway answered a line.
enum Answer {
    Http {
        status: StatusCode,
        request_id: String,
        body: Value,
        cost_nanos: i64,
        retry_after: Option<String>,
    },
    /// No usable answer (a body that is not JSON, cut short).
    Broken(String),
}

impl Answer {
    fn describe(&self) -> String {
        match self {
            Answer::Http { status, body, .. } => format!(
                "HTTP {}: {}",
                status.as_u16(),
                body["error"]["message"].as_str().unwrap_or("")
            ),
            Answer::Broken(m) => m.clone(),
        }
    }

    fn retry_after(&self, max: Duration) -> Option<Duration> {
        match self {
            Answer::Http { retry_after: v, .. } => v
                .as_deref()
                .and_then(|v| retry_after(v, max, chrono::Utc::now())),
            Answer::Broken(_) => None,
        }
    }
}

async fn send(app: Router, line: &Line, body: axum::body::Bytes, tag: BatchLine) -> Answer {
    let request = Request::post(line.url.url())
        .header(header::CONTENT_TYPE, "application/json")
        .extension(tag)
        .body(Body::from(body));
    let request = match request {
        Ok(r) => r,
        Err(e) => return Answer::Broken(format!("cannot build the request: {e}")),
    };
    let response = match app.oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let status = response.status();
    let headers = response.headers().clone();
    let header_text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let bytes = match axum::body::to_bytes(response.into_body(), MAX_ANSWER).await {
        Ok(b) => b,
        Err(e) => return Answer::Broken(format!("the answer broke off: {e}")),
    };
    let body: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return Answer::Broken(format!(
                "the answer (HTTP {}) is not JSON: {e}",
                status.as_u16()
            ));
        }
    };
    let cost_nanos = header_text("x-frugal-cost-usd")
        .and_then(|c| c.parse::<frugal_cost::Money>().ok())
        .map_or(0, |m| m.nanos());
    let request_id = header_text("x-request-id")
        .or_else(|| body["id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("req_{}", line.number));
    Answer::Http {
        status,
        request_id,
        body,
        cost_nanos,
        retry_after: header_text("retry-after"),
    }
}

/// Up to a quarter more than `d`, spread by line and try (a multiplicative hash), so that
/// lines that failed together do not retry together.
fn jitter(d: Duration, line: usize, attempt: u32) -> Duration {
    let h = (line as u64 ^ (u64::from(attempt) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    d.mul_f64(1.0 + (h >> 40) as f64 / (1u64 << 24) as f64 * 0.25)
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
