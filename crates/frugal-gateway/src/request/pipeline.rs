//! The request pipeline: *consult the caches -> produce -> settle*, one path for every
//! backend. [`start`] prepares the job on its backend, holds the tenant's worst case,
//! consults the caches and starts the backend on a miss; [`finish`] runs an answer to its
//! end for a whole-body response; [`crate::http::render`] streams one. Both carry the request's
//! [`Bill`], which settles on every exit.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::http::HeaderMap;
use serde_json::Value;

use frugal_cost::{Lever, Money};
use frugal_engine::scheduler::FinishReason;

use crate::admit::keys::Tenant;
use crate::backend::text::{Piece, Replay, Source};
use crate::backend::upstream;
use crate::backend::{Backend, Output, Plan};
use crate::cache::exact::{self as cache, CachePolicy, Claim, Lookup};
use crate::cache::semantic::{Bounds, Search};
use crate::http::api::{TokenLogprob, Usage};
use crate::http::error::ApiError;
use crate::http::validate::{Job, Kind};
use crate::meter::ShadowOf;
use crate::request::settle::{Bill, CacheNote, CacheUse, End, HitKind};
use crate::request::shadow::draw::{Drawn, Served};
use crate::request::state::AppState;

/// A request under way: its bill, and where its answer comes from.
pub struct Started {
    pub bill: Bill,
    pub output: Output,
    /// The response id, in OpenAI's style.
    pub id: String,
    pub kind: Kind,
    /// What the request sends, for its tokens when an upstream reports no usage.
    pub prompt_bytes: u64,
    /// A semantic hit drawn for a shadow, for the caller to start (`request::shadow`).
    pub shadow: Option<Drawn>,
}

/// An answer run to its end and settled.
pub struct Finished {
    pub id: String,
    pub body: Body,
    /// What this request cost (a cache hit: nothing).
    pub cost: Money,
    /// What producing the answer cost when it was produced (for a cache hit, the cost of
    /// the call it replays): what a cascade's routing saving is measured against.
    pub produced: Money,
    /// How it met the caches (`x-frugal-cache`, `x-frugal-semantic-veto`).
    pub cache: CacheNote,
    pub saved: Option<Money>,
    /// Each token's logprob, where the backend gives them.
    pub judged: Option<Vec<f32>>,
    pub created: u64,
    /// Prompt tokens whose work was reused (`x-frugal-cached-tokens`): the engine's prefix
    /// cache, or an upstream's cached input; 0 on a cache hit.
    pub cached_tokens: u64,
}

/// A finished answer's content.
pub enum Body {
    /// Our own rendering: text, the logprobs the client asked for, finish, usage.
    Text {
        text: String,
        logprobs: Option<Vec<TokenLogprob>>,
        reason: FinishReason,
        usage: Usage,
    },
    /// An upstream's answer, passed on as it came.
    Raw(Value),
}

/// Who is asking, and how the answer may be cached.
pub struct Ask<'a> {
    pub tenant: Option<Arc<Tenant>>,
    pub headers: &'a HeaderMap,
    /// The cache policy of the name the client asked for (a route's holds for every tier
    /// it calls); `None`: the backend's own.
    pub policy: Option<CachePolicy>,
    /// The share of cheap answers shadowed (a route's `shadow_rate`); `None`: `[serve]`'s.
    pub shadow_rate: Option<f64>,
    /// This call is a shadow of a served answer: billed as one, and never shadowed itself.
    pub shadow: Option<ShadowOf>,
}

/// Prepares `job` on `backend`, holds its worst case from the tenant's budgets, consults
/// the caches and, on a miss, starts the backend.
pub async fn start(
    state: &AppState,
    backend: Arc<dyn Backend>,
    job: &Arc<Job>,
    ask: &Ask<'_>,
) -> Result<Started, ApiError> {
    let started = Instant::now();
    let rejected = |e: ApiError| state.rejected(e);
    let plan = prepare(&backend, job).await.map_err(rejected)?;
    let reservation = match &ask.tenant {
        Some(t) => Some(
            t.reserve(plan.worst_case, chrono::Utc::now())
                .await
                .map_err(rejected)?,
        ),
        None => None,
    };
    let mut bill = Bill::new(
        state.clone(),
        backend.clone(),
        ask.tenant.clone(),
        reservation,
    );
    bill.batch.clone_from(&job.batch);
    bill.shadow.clone_from(&ask.shadow);
    let id = response_id(job.kind, started);
    if let Some(tokens) = plan.prompt_tokens {
        bill.work.prompt_tokens = tokens;
    }
    let name = backend.name().to_owned();
    let policy = ask.policy.unwrap_or_else(|| state.policy(&name));
    let lookup = state.lookup(job, &name, ask.tenant.as_deref(), ask.headers, policy);
    bill.cache = consult(state, &lookup, &name).await;
    if let CacheUse::Hit(answer, how) = &bill.cache {
        // A semantic hit is a cheap lever's answer: a sampled share is checked.
        let rate = ask.shadow_rate.unwrap_or(state.inner.shadows.rate);
        let shadow = match how {
            HitKind::Semantic(_) if ask.shadow.is_none() => {
                state.inner.shadows.pick(rate, &state.inner.metrics, || {
                    Some(Served {
                        of: ShadowOf {
                            lever: Lever::SemanticCache,
                            model: name.clone(),
                        },
                        text: answer.chunks.iter().map(|c| c.text.as_str()).collect(),
                        reference: backend.clone(),
                        job: job.clone(),
                    })
                })
            }
            _ => None,
        };
        let replay = Replay::new(answer, job.top.is_some());
        return Ok(Started {
            bill,
            output: Output::Pieces(Source::Replay(replay)),
            id,
            kind: job.kind,
            prompt_bytes: job.prompt_bytes(),
            shadow,
        });
    }
    let produced = backend.produce(job, plan, &mut bill.work).await;
    match produced {
        Ok(output) => Ok(Started {
            bill,
            output,
            id,
            kind: job.kind,
            prompt_bytes: job.prompt_bytes(),
            shadow: None,
        }),
        Err(e) if refused(&e) => {
            bill.discard();
            Err(rejected(e))
        }
        Err(e) => {
            // The call was made and failed: on record with what it spent.
            if bill.work.prompt_tokens == 0 {
                bill.work.prompt_tokens = estimate_tokens(job.prompt_bytes());
            }
            bill.settle(End::Failed);
            Err(e)
        }
    }
}

/// The backend's plan, computed off the async threads when it takes CPU.
async fn prepare(backend: &Arc<dyn Backend>, job: &Arc<Job>) -> Result<Plan, ApiError> {
    if !backend.prepare_is_heavy() {
        return backend.prepare(job);
    }
    let (b, j) = (backend.clone(), job.clone());
    tokio::task::spawn_blocking(move || b.prepare(&j))
        .await
        .map_err(|e| ApiError::Internal(format!("request validation stopped: {e}")))?
}

/// Errors that mean nothing was spent: the request was refused before any work.
fn refused(e: &ApiError) -> bool {
    matches!(
        e,
        ApiError::BadRequest(_)
            | ApiError::InvalidParam { .. }
            | ApiError::ContextLength(_)
            | ApiError::Overloaded(_)
            | ApiError::Unavailable { .. }
    )
}

/// Prompt tokens of a call cut short before its usage was known: about four bytes a token,
/// as OpenAI's tokenizers average on English text.
pub fn estimate_tokens(bytes: u64) -> u64 {
    bytes.div_ceil(4)
}

/// The tokens of an upstream's answer that came without usage, as both paths bill them:
/// the prompt from what was sent, the completion a token per content chunk streamed or per
/// four bytes of the answer's text (`answer_bytes`), whichever is more. A stream and a
/// whole answer of the same text cost the same.
pub fn estimated_usage(prompt_bytes: u64, answer_bytes: u64, chunks: u64) -> Usage {
    let prompt_tokens = estimate_tokens(prompt_bytes) as usize;
    let completion_tokens = chunks.max(estimate_tokens(answer_bytes)) as usize;
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
        cached_tokens: 0,
    }
}

/// A whole answer's usage (and cached prompt tokens), or [`estimated_usage`] when the
/// upstream sent none: never $0 for an answer that has text.
pub fn usage_or_estimate(v: &Value, kind: Kind, prompt_bytes: u64) -> (Usage, u64) {
    upstream::usage_of(v).unwrap_or_else(|| {
        let choices = v["choices"].as_array().map_or(&[][..], Vec::as_slice);
        let text: u64 = choices
            .iter()
            .map(|c| match kind {
                Kind::Chat => answer_bytes(&c["message"]),
                Kind::Text => c["text"].as_str().map_or(0, str::len) as u64,
            })
            .sum();
        (estimated_usage(prompt_bytes, text, 0), 0)
    })
}

/// The bytes a model wrote in a message or a stream's delta: its content, and its tool
/// calls' names and arguments.
pub fn answer_bytes(message: &Value) -> u64 {
    let content = message["content"].as_str().map_or(0, str::len);
    let calls: usize = message["tool_calls"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|c| {
            let f = &c["function"];
            f["name"].as_str().map_or(0, str::len) + f["arguments"].as_str().map_or(0, str::len)
        })
        .sum();
    (content + calls) as u64
}

fn response_id(kind: Kind, started: Instant) -> String {
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{:x}",
        kind.id_prefix(),
        started.elapsed().as_nanos() ^ epoch
    )
}

/// The cache's answer, or the right (or duty) to produce it: a miss leads its key, and a
/// request identical to one being answered waits for that answer. `model`: the served name
/// the answer is credited to.
pub(crate) async fn consult(state: &AppState, lookup: &Lookup, model: &str) -> CacheUse {
    let inner = &state.inner;
    let (Lookup::Key { key, read, probe }, Some(cache)) = (lookup, &inner.cache) else {
        return CacheUse::Bypass;
    };
    let m = &inner.metrics;
    let hit = |answer: Arc<cache::Answer>, how: HitKind| {
        let (count, lever) = match how {
            HitKind::Exact => (&m.cache_hits, Lever::Cache),
            HitKind::Semantic(_) => (&m.semantic_hits, Lever::SemanticCache),
        };
        count.fetch_add(1, Ordering::Relaxed);
        m.add_saving(lever, model, answer.cost);
        CacheUse::Hit(answer, how)
    };
    if *read && let Some(answer) = cache.get(key) {
        return hit(answer, HitKind::Exact);
    }
    if *read
        && let Some(shared) = &inner.shared
        && let Some(answer) = shared.get(key).await
    {
        let answer = Arc::new(answer);
        cache.insert(key.clone(), answer.clone());
        return hit(answer, HitKind::Exact);
    }
    let (mut fill, mut veto) = (None, None);
    if let (Some(sem), Some(probe)) = (&inner.semantic, probe) {
        let (v, found, took) = sem
            .lookup(
                probe.space.clone(),
                probe.text.clone(),
                Bounds {
                    threshold: probe.threshold,
                    max_error: probe.max_error,
                },
                *read,
            )
            .await;
        if v.is_some() {
            m.semantic_lookup.observe(took.as_secs_f64());
        }
        match found {
            Search::Hit(found) => return hit(found.answer, HitKind::Semantic(found.probability)),
            Search::Miss(Some(why)) => {
                m.count_veto(why);
                veto = Some(why);
            }
            Search::Miss(None) => {}
        }
        fill = v.map(|v| (probe.clone(), v));
    }
    let miss = |leader| {
        m.cache_misses.fetch_add(1, Ordering::Relaxed);
        CacheUse::Miss(leader, fill, veto)
    };
    match cache.claim(key) {
        Claim::Leader(leader) => miss(Some(leader)),
        // `no-cache` must not be handed another request's answer: it runs at once.
        Claim::Follower(_) if !*read => miss(None),
        Claim::Follower(pending) => match cache::wait(pending).await {
            Some(answer) => hit(answer, HitKind::Exact),
            // The first one failed: answer this one alone.
            None => miss(None),
        },
    }
}

/// A live answer and its bill: dropped part-way, the tokens and engine time the source has
/// used go on the bill before it settles as cancelled.
pub struct Live {
    pub bill: Bill,
    pub source: Source,
}

impl Live {
    /// Takes the next piece, keeping it for the cache and the bill.
    pub async fn next(&mut self) -> Piece {
        let piece = self.source.next().await;
        if let Piece::Text { text, logprobs } = &piece {
            self.bill.record(text, logprobs);
        }
        if let Piece::Done {
            usage,
            engine,
            prefill,
            ..
        } = &piece
        {
            self.bill.count(*usage, usage.cached_tokens as u64);
            self.bill.work.engine = *engine;
            self.bill.work.prefill = *prefill;
        }
        piece
    }

    /// The answer is complete: settles it (a one-choice text answer, so cacheable).
    pub fn complete(
        &mut self,
        reason: FinishReason,
        first_token: Option<std::time::Duration>,
        judged: Option<Vec<f32>>,
    ) -> Money {
        self.bill.settle(End::Completed {
            reason,
            first_token,
            judged,
            cacheable: true,
        })
    }

    /// The request failed part-way: billed for what it used.
    pub fn fail(&mut self) -> Money {
        self.absorb();
        self.bill.settle(End::Failed)
    }

    fn absorb(&mut self) {
        if let Source::Live(t) = &self.source {
            let (usage, engine) = t.progress();
            let prompt = self.bill.work.prompt_tokens;
            self.bill.count(usage, usage.cached_tokens as u64);
            self.bill.work.prompt_tokens = prompt.max(usage.prompt_tokens as u64);
            self.bill.work.engine = engine;
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if self.bill.cost().is_none() {
            self.absorb();
        }
    }
}

/// Runs a started answer to its end and settles it.
pub async fn finish(started: Started) -> Result<Finished, ApiError> {
    let Started {
        mut bill,
        output,
        id,
        kind,
        prompt_bytes,
        ..
    } = started;
    let cache = bill.cache.label();
    let saved = bill.cache.saved().map(|(m, _)| m);
    let hit_cost = match &bill.cache {
        CacheUse::Hit(a, _) => Some(a.cost),
        _ => None,
    };
    let created = created(&bill);
    match output {
        Output::Pieces(source) => {
            let wants = source.wants_logprobs();
            let mut live = Live { bill, source };
            let mut text = String::new();
            let mut entries = Vec::new();
            loop {
                match live.next().await {
                    Piece::Text { text: t, logprobs } => {
                        text.push_str(&t);
                        entries.extend(logprobs);
                    }
                    Piece::Done {
                        reason,
                        usage,
                        first_token,
                        judged,
                        ..
                    } => {
                        let cost = live.complete(reason, first_token, judged.clone());
                        return Ok(Finished {
                            id,
                            body: Body::Text {
                                text,
                                logprobs: wants.then_some(entries),
                                reason,
                                usage,
                            },
                            cost,
                            produced: hit_cost.unwrap_or(cost),
                            cache,
                            saved,
                            judged,
                            created,
                            cached_tokens: usage.cached_tokens as u64,
                        });
                    }
                    Piece::Failed(e) => {
                        live.fail();
                        return Err(ApiError::Internal(e));
                    }
                }
            }
        }
        Output::Json(v) => {
            let (usage, cached) = usage_or_estimate(&v, kind, prompt_bytes);
            bill.count(usage, cached);
            let cached_tokens = bill.work.cached_tokens;
            let plain = plain_answer(&v, kind);
            if let Some((text, _)) = &plain {
                bill.record(text, &[]);
            }
            let cost = bill.settle(End::Completed {
                reason: plain.as_ref().map_or(FinishReason::Stop, |p| p.1),
                first_token: None,
                judged: None,
                cacheable: plain.is_some(),
            });
            Ok(Finished {
                id,
                body: Body::Raw(v),
                cost,
                produced: cost,
                cache,
                saved,
                judged: None,
                created,
                cached_tokens,
            })
        }
        Output::Events(_) => {
            bill.settle(End::Failed);
            Err(ApiError::Internal(
                "the upstream streamed an answer that was asked for whole".into(),
            ))
        }
    }
}

pub fn created(bill: &Bill) -> u64 {
    bill.started
        .1
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The text and finish reason of a one-choice answer of plain text (no tool calls), which
/// the cache can replay.
pub fn plain_answer(v: &Value, kind: Kind) -> Option<(String, FinishReason)> {
    let choices = v["choices"].as_array().filter(|c| c.len() == 1)?;
    let choice = &choices[0];
    let text = match kind {
        Kind::Chat => {
            let m = &choice["message"];
            if m.get("tool_calls").is_some_and(|t| !t.is_null()) {
                return None;
            }
            m["content"].as_str()?
        }
        Kind::Text => choice["text"].as_str()?,
    };
    let reason = match choice["finish_reason"].as_str()? {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        _ => return None,
    };
    Some((text.to_owned(), reason))
}
