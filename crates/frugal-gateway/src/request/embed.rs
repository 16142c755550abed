//! One `POST /v1/embeddings` request once admitted and checked, on the path chat takes:
//! the tenant's worst case held, the exact cache consulted, then the local embedder run or
//! the upstream called, on a [`Bill`] that on every exit writes the ledger row, charges the
//! tenant and keeps a completed answer in the cache. The local embedder is priced by its
//! time on the machine, an upstream at its input-token price (or its machine's time).

use std::sync::Arc;

use axum::http::HeaderMap;
use serde_json::Value;

use frugal_cost::Money;
use frugal_engine::scheduler::FinishReason;

use crate::admit::keys::Tenant;
use crate::backend::Backend;
use crate::backend::embed::{self, LocalEmbedder, upstream_worst_case};
use crate::backend::upstream::{self, Reply};
use crate::http::embeddings::{EmbeddingJob, Inputs, render};
use crate::http::error::ApiError;
use crate::request::pipeline::{consult, estimate_tokens};
use crate::request::settle::{Bill, CacheNote, CacheUse, End};
use crate::request::state::{AppState, EmbedTarget};

/// The endpoint below `/v1`, as upstreams serve it and the cache keys it.
pub const ENDPOINT: &str = "embeddings";

/// An answered embeddings request, settled.
pub struct Answered {
    /// The response body, without its cost.
    pub body: Value,
    pub cost: Money,
    pub cache: CacheNote,
    pub saved: Option<Money>,
}

/// Answers `job` with `target` for `tenant`.
pub(crate) async fn run(
    state: &AppState,
    tenant: Option<Arc<Tenant>>,
    job: &EmbeddingJob,
    target: &EmbedTarget,
    headers: &HeaderMap,
) -> Result<Answered, ApiError> {
    let rejected = |e: ApiError| state.rejected(e);
    let (backend, worst): (Arc<dyn Backend>, Money) = match target {
        EmbedTarget::Local(e) => {
            let texts = local_texts(job).map_err(rejected)?;
            (e.clone(), e.worst_case(texts))
        }
        EmbedTarget::Upstream(u) => (u.clone(), upstream_worst_case(u, job.input_bytes())),
    };
    let reservation = match &tenant {
        Some(t) => Some(
            t.reserve(worst, chrono::Utc::now())
                .await
                .map_err(rejected)?,
        ),
        None => None,
    };
    let mut bill = Bill::new(state.clone(), backend.clone(), tenant.clone(), reservation);
    let name = backend.name().to_owned();
    let lookup = state.key_lookup(
        &job.body,
        ENDPOINT,
        &name,
        tenant.as_deref(),
        headers,
        state.policy(&name),
    );
    bill.cache = consult(state, &lookup, &name).await;
    let hit = match &bill.cache {
        CacheUse::Hit(answer, _) => Some(answer.clone()),
        _ => None,
    };
    let body = match hit {
        Some(answer) => {
            bill.work.prompt_tokens = answer.usage.prompt_tokens as u64;
            serde_json::from_str(&answer.text()).map_err(|e| {
                bill.settle(End::Failed);
                ApiError::Internal(format!("a cached answer does not parse: {e}"))
            })?
        }
        None => {
            let fresh = produce(&mut bill, job, target).await?;
            let text = fresh.to_string();
            bill.record(&text, &[]);
            // Answered from the text the cache keeps, so that a hit repeats this answer to
            // the bit: serde_json reads a float back only to its best effort.
            serde_json::from_str(&text).unwrap_or(fresh)
        }
    };
    let cost = bill.settle(End::Completed {
        reason: FinishReason::Stop,
        first_token: None,
        judged: None,
        cacheable: true,
    });
    Ok(Answered {
        body,
        cost,
        cache: bill.cache.label(),
        saved: bill.cache.saved().map(|(m, _)| m),
    })
}

/// The texts the local embedder can take from `job`, as it was asked.
fn local_texts(job: &EmbeddingJob) -> Result<&[String], ApiError> {
    let Inputs::Texts(texts) = &job.inputs else {
        return Err(ApiError::InvalidParam {
            param: "input",
            message: format!(
                "`{}` embeds text: send strings (token ids are passed only to an upstream, in its own vocabulary)",
                embed::NAME
            ),
        });
    };
    if let Some(d) = job
        .dimensions
        .filter(|d| *d != LocalEmbedder::DIMENSIONS as i64)
    {
        return Err(ApiError::InvalidParam {
            param: "dimensions",
            message: format!(
                "`{}` has {} dimensions and cannot shorten them to {d}: leave dimensions out",
                embed::NAME,
                LocalEmbedder::DIMENSIONS
            ),
        });
    }
    Ok(texts)
}

/// The answer of a cache miss: the local embedder's vectors, or the upstream's body as it
/// came. A failure is settled here, on record with what it spent.
async fn produce(
    bill: &mut Bill,
    job: &EmbeddingJob,
    target: &EmbedTarget,
) -> Result<Value, ApiError> {
    let produced = match target {
        EmbedTarget::Local(e) => match local_texts(job) {
            Ok(texts) => e.embed(texts.to_vec()).await.map(|out| {
                bill.work.prompt_tokens = out.tokens;
                bill.work.share = out.took;
                render(&out.vectors, job.encoding, embed::NAME, out.tokens)
            }),
            Err(e) => Err(e),
        },
        EmbedTarget::Upstream(u) => {
            // Held until the bill settles: an hourly upstream's share of its machine.
            bill.work.hold = Some(u.occupy());
            match u.send(ENDPOINT, job.body.clone(), false).await {
                Ok(Reply::Json(v)) => {
                    bill.work.prompt_tokens = upstream::usage_of(&v).map_or_else(
                        || estimate_tokens(job.input_bytes()),
                        |(usage, _)| usage.prompt_tokens as u64,
                    );
                    Ok(v)
                }
                Ok(Reply::Stream(_)) => Err(ApiError::Internal(
                    "the upstream streamed an answer that was asked for whole".into(),
                )),
                Err(e) => Err(e),
            }
        }
    };
    produced.inspect_err(|_| {
        if bill.work.prompt_tokens == 0 {
            bill.work.prompt_tokens = estimate_tokens(job.input_bytes());
        }
        bill.settle(End::Failed);
    })
}
