//! Settling: one place where a request's bill is written, whatever way it ends.
//!
//! A [`Bill`] is opened when a request is admitted and owned by whatever carries the request
//! on (the handler's future, or the response stream). It settles exactly once: explicitly
//! when the answer completes or fails, and from `Drop` on every other exit (the client left
//! mid-stream, a timeout dropped the future, a task panicked and unwound), in which case the
//! row is marked `cancelled` and billed for the tokens and machine time used so far.
//! Settling writes the ledger row, turns the tenant's reservation into the real cost, counts
//! the metrics, and keeps a completed answer in the caches.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use frugal_cost::{Lever, Money, Outcome};
use frugal_engine::scheduler::FinishReason;
use frugal_semantic::Veto;

use crate::admit::keys::{Reservation, Tenant};
use crate::backend::{Backend, Priced, Work};
use crate::cache::exact::{self as cache, Answer, Leader, Probe};
use crate::http::api::{TokenLogprob, Usage};
use crate::meter;
use crate::request::state::AppState;

/// How a request met the caches.
pub enum CacheUse {
    /// Served from a cache: the answer, which saved what it first cost.
    Hit(Arc<Answer>, HitKind),
    /// Not found: the answer is stored (and handed to identical requests waiting for it)
    /// when it completes, if this request leads its key; and kept in the semantic cache
    /// under the probe and its embedding.
    /// The semantic cache's veto, when it turned a near neighbour away.
    Miss(Option<Leader>, Option<(Probe, Vec<f32>)>, Option<Veto>),
    Bypass,
}

/// How a request met the caches, as its response says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheNote {
    pub label: &'static str,
    pub veto: Option<Veto>,
}

impl CacheNote {
    pub const BYPASS: CacheNote = CacheNote {
        label: "bypass",
        veto: None,
    };
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HitKind {
    Exact,
    /// With the verifier's calibrated probability that the answer is right, when it read
    /// the pair (the guard alone gives none).
    Semantic(Option<f32>),
}

impl CacheUse {
    /// The `x-frugal-cache` value, and the `x-frugal-semantic-veto` one.
    pub fn label(&self) -> CacheNote {
        let label = match self {
            CacheUse::Hit(_, HitKind::Exact) => "hit-exact",
            CacheUse::Hit(_, HitKind::Semantic(_)) => "hit-semantic",
            CacheUse::Miss(..) => "miss",
            CacheUse::Bypass => "bypass",
        };
        let veto = match self {
            CacheUse::Miss(_, _, v) => *v,
            _ => None,
        };
        CacheNote { label, veto }
    }

    /// What a hit saved, and which cache it was.
    pub fn saved(&self) -> Option<(Money, Lever)> {
        match self {
            CacheUse::Hit(a, HitKind::Exact) => Some((a.cost, Lever::Cache)),
            CacheUse::Hit(a, HitKind::Semantic(_)) => Some((a.cost, Lever::SemanticCache)),
            _ => None,
        }
    }

    /// A verified semantic hit's chance of serving a wrong answer, `1 - P(same)`, for its
    /// ledger row.
    pub fn wrong_chance(&self) -> Option<f64> {
        match self {
            CacheUse::Hit(_, HitKind::Semantic(Some(p))) => Some(1.0 - f64::from(*p)),
            _ => None,
        }
    }
}

/// How a request ended.
pub enum End {
    /// Answered in full. `cacheable`: a plain one-choice answer the caches can replay.
    Completed {
        reason: FinishReason,
        first_token: Option<Duration>,
        judged: Option<Vec<f32>>,
        cacheable: bool,
    },
    Failed,
    Cancelled,
}

/// One request's bill; see the module doc.
pub struct Bill {
    state: AppState,
    backend: Arc<dyn Backend>,
    pub started: (Instant, SystemTime),
    tenant: Option<Arc<Tenant>>,
    reservation: Option<Reservation>,
    pub cache: CacheUse,
    pub work: Work,
    /// The answer's chunks so far, kept when it is to be cached.
    recorded: Vec<cache::Chunk>,
    /// Set once settled: what the request cost.
    settled: Option<Money>,
    /// The batch job the request is a line of.
    pub batch: Option<Arc<str>>,
    /// A shadow's call: billed, but no request of a user's and no lever's saving.
    pub shadow: Option<meter::ShadowOf>,
}

impl Bill {
    pub fn new(
        state: AppState,
        backend: Arc<dyn Backend>,
        tenant: Option<Arc<Tenant>>,
        reservation: Option<Reservation>,
    ) -> Bill {
        Bill {
            state,
            backend,
            started: (Instant::now(), SystemTime::now()),
            tenant,
            reservation,
            cache: CacheUse::Bypass,
            work: Work::default(),
            recorded: Vec::new(),
            settled: None,
            batch: None,
            shadow: None,
        }
    }

    /// The served name the request is billed under.
    pub fn model(&self) -> &str {
        self.backend.name()
    }

    /// What the request cost, once settled.
    pub fn cost(&self) -> Option<Money> {
        self.settled
    }

    /// Keeps a piece of the answer if it will be cached.
    pub fn record(&mut self, text: &str, logprobs: &[TokenLogprob]) {
        if matches!(self.cache, CacheUse::Miss(Some(_), ..)) {
            self.recorded.push(cache::Chunk {
                text: text.to_owned(),
                logprobs: logprobs.to_vec(),
            });
        }
    }

    /// Tokens used so far: as the backend reported them, or estimated for a call cut short.
    pub fn count(&mut self, usage: Usage, cached: u64) {
        self.work.prompt_tokens = usage.prompt_tokens as u64;
        self.work.completion_tokens = usage.completion_tokens as u64;
        self.work.cached_tokens = cached;
    }

    /// Settles the request (once; later calls return the first cost): the ledger row, the
    /// tenant's spend, metrics, and a completed answer into the caches.
    pub fn settle(&mut self, end: End) -> Money {
        if let Some(cost) = self.settled {
            return cost;
        }
        let share = self
            .work
            .hold
            .take()
            .map_or(Duration::ZERO, crate::backend::upstream::Ticket::finish);
        // A pool's retries on another replica added their holds already.
        self.work.share += share;
        let hit = matches!(self.cache, CacheUse::Hit(..));
        // A cache hit used no backend: nothing to price, and no prompt it reused.
        let (priced, prefix_saved) = if hit {
            (Priced::default(), Money::ZERO)
        } else {
            let priced = self.backend.price(&self.work);
            (priced, self.backend.prefix_saving(&self.work))
        };
        self.settled = Some(priced.cost);
        let elapsed = self.started.0.elapsed();
        let inner = &self.state.inner;
        let m = &inner.metrics;
        let model = self.backend.name().to_owned();
        m.add_spend(&model, priced.cost);
        let shadow = self.shadow.is_some();
        if shadow {
            m.add_shadow_cost(priced.cost);
        }
        // A shadow saves nothing: its reuse of a prompt or a batch is no lever's doing.
        let prefix_saved = if shadow { Money::ZERO } else { prefix_saved };
        if priced.batching_saved > Money::ZERO && !shadow {
            m.add_saving(Lever::Batching, &model, priced.batching_saved);
        }
        if prefix_saved > Money::ZERO {
            m.add_saving(Lever::PrefixCache, &model, prefix_saved);
        }
        let outcome = match &end {
            // A shadow's outcome is on its row; its latency is no user's.
            _ if shadow => match &end {
                End::Completed { .. } => None,
                End::Failed => Some(Outcome::Failed),
                End::Cancelled => Some(Outcome::Cancelled),
            },
            End::Completed { first_token, .. } => {
                m.requests_ok.fetch_add(1, Ordering::Relaxed);
                m.latency.observe(elapsed.as_secs_f64());
                if let Some(first) = first_token {
                    m.ttft.observe(first.as_secs_f64());
                    if self.work.completion_tokens > 1 {
                        let rest = elapsed.saturating_sub(*first).as_secs_f64();
                        m.tpot
                            .observe(rest / (self.work.completion_tokens - 1) as f64);
                    }
                }
                None
            }
            End::Failed => {
                m.requests_failed.fetch_add(1, Ordering::Relaxed);
                Some(Outcome::Failed)
            }
            End::Cancelled => {
                m.requests_cancelled.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(model, "request left part-way; billed for what was produced");
                Some(Outcome::Cancelled)
            }
        };
        let now = chrono::Utc::now();
        match (self.reservation.take(), &self.tenant) {
            (Some(r), _) => r.settle(priced.cost, now),
            (None, Some(t)) => t.spend(priced.cost, now),
            (None, None) => {}
        }
        // One lever per row: a cache hit's saving, else batching's. The prefix cache's
        // (which a cache hit never has) goes beside it, in a row of its own.
        let saved = self.cache.saved().or_else(|| {
            (priced.batching_saved > Money::ZERO)
                .then_some((priced.batching_saved, Lever::Batching))
        });
        if let Some(meter) = &inner.meter
            && prefix_saved > Money::ZERO
        {
            meter.record_saving(meter::Saving {
                started: self.started.1,
                model: model.clone(),
                saved: prefix_saved,
                lever: Lever::PrefixCache,
                tenant: self.tenant.as_ref().map(|t| t.name.clone()),
            });
        }
        if let Some(meter) = &inner.meter {
            meter.record(meter::Row {
                started: self.started.1,
                duration: elapsed,
                model,
                prompt_tokens: self.work.prompt_tokens,
                cached_tokens: self.work.cached_tokens,
                completion_tokens: self.work.completion_tokens,
                cost: priced.cost,
                busy: priced.busy,
                outcome,
                saved,
                tenant: self.tenant.as_ref().map(|t| t.name.clone()),
                wait: self.work.wait,
                batch: self.batch.clone(),
                wrong_chance: self.cache.wrong_chance(),
                shadow: self.shadow.clone(),
            });
        }
        if let End::Completed {
            reason,
            judged,
            cacheable: true,
            ..
        } = end
        {
            self.store(reason, judged, priced.cost);
        }
        priced.cost
    }

    /// Keeps the recorded answer if the request missed the cache and leads its key.
    fn store(&mut self, reason: FinishReason, judged: Option<Vec<f32>>, cost: Money) {
        let inner = &self.state.inner;
        let (CacheUse::Miss(leader, fill, _), Some(cache)) = (&mut self.cache, &inner.cache) else {
            return;
        };
        let Some(leader) = leader.take() else {
            return;
        };
        let key = leader.key().clone();
        let answer = leader.fulfil(
            cache,
            Answer {
                chunks: std::mem::take(&mut self.recorded),
                finish_reason: reason,
                usage: Usage {
                    prompt_tokens: self.work.prompt_tokens as usize,
                    completion_tokens: self.work.completion_tokens as usize,
                    total_tokens: (self.work.prompt_tokens + self.work.completion_tokens) as usize,
                    // A replay reuses no prompt: it computes none.
                    cached_tokens: 0,
                },
                cost,
                judged,
            },
        );
        if let Some(shared) = &inner.shared {
            shared.put(&key, &answer);
        }
        if let (Some((probe, v)), Some(sem)) = (fill.take(), &inner.semantic) {
            sem.insert_later(probe.space, probe.text, v, answer);
        }
    }

    /// Closes a bill for a request that was refused before any work (the engine's queue
    /// was full): no row, and the reservation goes back.
    pub fn discard(mut self) {
        self.settled = Some(Money::ZERO);
        drop(self.reservation.take());
    }
}

impl Drop for Bill {
    fn drop(&mut self) {
        if self.settled.is_none() {
            self.settle(End::Cancelled);
        }
    }
}
