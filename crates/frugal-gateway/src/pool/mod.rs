//! Pools of replicas that grow with demand and shrink to zero (`[[serve.pool]]`).
//!
//! A pool is a [`Backend`] under the model name clients ask for, so the caches, routes and
//! the meter treat it like any other. Three parts:
//! - the **activator** ([`Pool::acquire`]): a request goes to the ready replica most
//!   likely to hold its prompt's prefix, within a load bound ([`prefix`]), or with
//!   `routing = "least_in_flight"` to the one with the fewest requests in flight; at
//!   zero, or with every replica busy (at `max_in_flight`,
//!   a hard limit above the autoscaler's soft `target_in_flight`, as Knative's
//!   containerConcurrency is above its target), it is held in a bounded queue until a
//!   replica is ready or frees up (503 with Retry-After when none can start in time, 429
//!   past `max_queue`);
//! - the **autoscaler** ([`autoscale`]), an actor ticking every `tick`: Knative's KPA rule
//!   on in-flight plus held requests, starting replicas at once and draining one at a time;
//! - the **replicas** ([`replica`]): processes from a command template, engines in this
//!   process, or one external endpoint that Kubernetes scales from what
//!   [`Pool::status`] publishes.
//!
//! Every replica's life goes to the ledger as spans at its price (starting, ready,
//! draining); requests pay for their processor-sharing share of their replica's time, and
//! the rest of each span is idle capacity.

pub mod autoscale;
pub mod prefix;
mod replica;
pub mod settings;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::BoxFuture;
use serde::Serialize;
use tokio::sync::Notify;

use frugal_cost::money::HourlyRate;
use frugal_cost::{Money, ReplicaSpan, ReplicaState};

use crate::backend::upstream::Ticket;
use crate::backend::{Backend, Output, Plan, Priced, Work};
use crate::config::PoolRouting;
use crate::http::error::ApiError;
use crate::http::validate::Job;
use crate::meter::Meter;
use crate::metrics::Histogram;

use autoscale::{Autoscaler, Observed};
use prefix::{Candidate, Outcome, Served};
use replica::{Serving, Target};
pub use settings::{Kind, PoolConfig};

/// Set in a process replica's environment (`POOL/ID`): a `frugal serve` replica that reads
/// the gateway's frugal.toml must not start the pools in it again.
pub const REPLICA_ENV: &str = "FRUGAL_POOL_REPLICA";
/// A ready replica's span is cut this often, so the ledger stays current.
const SPAN_EVERY: Duration = Duration::from_secs(60);
/// Longest wait between failed starts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A replica up this long ends a crash loop's backoff.
const STAYED_UP: Duration = Duration::from_secs(60);
/// Tries of a request on other replicas after its replica failed before answering.
const RETRIES: u32 = 2;
/// Cold-start histogram bounds in seconds.
const COLD_START_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

pub struct Pool {
    pub config: PoolConfig,
    state: Mutex<State>,
    /// A replica became ready, freed a slot, failed to start or went away: held requests
    /// look again.
    changed: Arc<Notify>,
    /// A request is held where nothing is starting: the autoscaler acts before its tick.
    wake: Notify,
    probe: reqwest::Client,
    log_dir: PathBuf,
    /// Set once the gateway has its meter.
    ledger: OnceLock<(Meter, String)>,
    /// Spans closed under the pool's lock, sent to the meter after it is released (a full
    /// ledger queue must not block the pool while it is locked).
    outbox: Mutex<Vec<(ReplicaSpan, Money)>>,
    /// Memory a replica needs, for right-sizing (weights plus KV cache), where known: read
    /// from the model file at the first start, off the gateway's start-up.
    need_bytes: OnceLock<Option<u64>>,
    stopping: AtomicBool,
    cold_starts: AtomicU64,
    /// Requests routed by prefix, by [`Outcome`] (hit, miss, overflow).
    routed: [AtomicU64; 3],
    cold_start_seconds: Histogram,
}

struct State {
    replicas: Vec<Entry>,
    /// Requests held by the activator, oldest first.
    waiting: VecDeque<Waiting>,
    next_held: u64,
    next_id: u32,
    last_activity: Instant,
    autoscaler: Autoscaler,
    /// Starts that failed in a row, ready replicas that exited since one last stayed up,
    /// and when the next start may begin.
    failures: u32,
    crashes: u32,
    retry_at: Option<Instant>,
    /// Bumped at each failed start; a held request that saw it move while nothing else
    /// can serve it gives up with a 503.
    failed_starts: u64,
    last_error: Option<String>,
}

struct Entry {
    id: u32,
    phase: ReplicaState,
    serving: Option<Arc<Serving>>,
    /// The open span: since when, and the replica's clock share then.
    since: (Instant, SystemTime),
    share_mark: Duration,
    /// When its start began.
    started: Instant,
    /// The prefixes it was sent, for prefix routing.
    served: Served,
    /// Requests it was given.
    requests: u64,
}

/// A pool's demand and replicas, as `GET /v1/pools/NAME/scale` and `/metrics` show them
/// (and KEDA's `metrics-api` scaler reads: `demand` against `target_in_flight`).
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub pool: String,
    pub in_flight: u32,
    pub queued: u32,
    pub demand: u32,
    pub ready: u32,
    pub starting: u32,
    pub draining: u32,
    pub desired_replicas: u32,
    pub target_in_flight: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub cold_starts: u64,
    /// Why the last start failed, while starts are failing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// `prefix` or `least_in_flight`.
    pub routing: PoolRouting,
    /// Each replica, oldest first: where a tool reads its own `/metrics` (`url`), and the
    /// requests the pool gave it (the most loaded replica's share).
    pub replicas: Vec<ReplicaStatus>,
}

/// One replica in [`Status`].
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaStatus {
    pub id: u32,
    pub state: &'static str,
    pub in_flight: u32,
    /// Requests the pool sent it since it started, retries included.
    pub requests: u64,
    /// Prefix chunks it is remembered to hold (`routing = "prefix"`).
    pub prefixes: usize,
    /// Its origin (`http://127.0.0.1:PORT`): a `process` replica's, or an `external`
    /// pool's endpoint; none for a `local` engine or a replica still starting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

impl Pool {
    /// A pool with no replicas yet; [`Pool::run`] starts its autoscaler. `log_dir` holds
    /// process replicas' logs unless the pool names its own.
    pub fn new(config: PoolConfig, log_dir: PathBuf) -> Result<Arc<Pool>, ApiError> {
        let probe = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| ApiError::Internal(format!("cannot build an HTTP client: {e}")))?;
        let log_dir = match &config.kind {
            Kind::Process {
                log_dir: Some(d), ..
            } => d.clone(),
            _ => log_dir,
        };
        let now = Instant::now();
        Ok(Arc::new(Pool {
            state: Mutex::new(State {
                replicas: Vec::new(),
                waiting: VecDeque::new(),
                next_held: 0,
                next_id: 1,
                last_activity: now,
                autoscaler: Autoscaler::new(&config),
                failures: 0,
                crashes: 0,
                retry_at: None,
                failed_starts: 0,
                last_error: None,
            }),
            config,
            changed: Arc::new(Notify::new()),
            wake: Notify::new(),
            probe,
            log_dir,
            ledger: OnceLock::new(),
            outbox: Mutex::new(Vec::new()),
            need_bytes: OnceLock::new(),
            stopping: AtomicBool::new(false),
            cold_starts: AtomicU64::new(0),
            routed: Default::default(),
            cold_start_seconds: Histogram::with_bounds(COLD_START_BUCKETS),
        }))
    }

    /// Where replica spans go, under `workload`.
    pub fn attach(&self, meter: Meter, workload: String) {
        let _ = self.ledger.set((meter, workload));
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the autoscaler until [`Pool::shutdown`]; spawn it once per pool.
    pub async fn run(self: Arc<Pool>) {
        let mut tick = tokio::time::interval(self.config.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let sampled = tokio::select! {
                _ = tick.tick() => true,
                () = self.wake.notified() => false,
            };
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            self.decide(sampled);
            self.flush_spans();
        }
    }

    /// One decision: sample demand (on a tick) or activate (when woken), then start or
    /// drain replicas toward the wanted number.
    fn decide(self: &Arc<Pool>, sampled: bool) {
        let now = Instant::now();
        let mut st = self.lock();
        let Census {
            ready,
            starting,
            draining,
            in_flight,
        } = st.census();
        let live = ready + starting;
        let demand = in_flight + st.queued();
        if demand > 0 {
            st.last_activity = now;
        }
        if st.crashes > 0
            && st.replicas.iter().any(|e| {
                e.phase == ReplicaState::Ready
                    && now.saturating_duration_since(e.started) >= STAYED_UP
            })
        {
            // A replica has stayed up: the crashes before it are over.
            st.crashes = 0;
        }
        let want = if sampled {
            let idle_for = now.saturating_duration_since(st.last_activity);
            st.autoscaler.tick(
                now,
                Observed {
                    demand,
                    ready,
                    live,
                    idle_for,
                },
            )
        } else if st.queued() > 0 && live == 0 {
            st.autoscaler.activate(now, live)
        } else {
            return;
        };
        if sampled {
            self.cut_spans(&mut st, now);
        }
        // An external pool's replicas are Kubernetes's: it wants them (KEDA reads `desired`);
        // here it watches one endpoint while any is wanted.
        let want = match self.config.kind {
            Kind::External { .. } => want.min(1),
            _ => want,
        };
        if want > live {
            let failing = st.failures > 0 || st.crashes > 0;
            if st.retry_at.is_some_and(|t| now < t) || (failing && starting > 0) {
                return;
            }
            // While starts fail, one at a time: a crash loop must not fork a storm.
            let n = if failing { 1 } else { want - live };
            for _ in 0..n {
                self.spawn_start(&mut st);
            }
        } else if want < live && draining == 0 {
            // A starting replica is not drained: the demand that asked for it may return.
            let victim = st
                .replicas
                .iter()
                .filter(|e| e.phase == ReplicaState::Ready)
                .min_by_key(|e| e.serving.as_ref().map_or(0, |s| s.in_flight()))
                .map(|e| e.id);
            if let Some(id) = victim {
                self.spawn_drain(&mut st, id, now);
            }
        }
    }

    fn spawn_start(self: &Arc<Pool>, st: &mut State) {
        let id = st.next_id;
        st.next_id += 1;
        let now = Instant::now();
        st.replicas.push(Entry {
            id,
            phase: ReplicaState::Starting,
            serving: None,
            since: (now, SystemTime::now()),
            share_mark: Duration::ZERO,
            started: now,
            served: Served::default(),
            requests: 0,
        });
        if self.need_bytes.get().is_none() {
            // Beside the start, which reads the same file: spans closed before it is known
            // carry none.
            let pool = self.clone();
            tokio::task::spawn_blocking(move || {
                pool.need_bytes.get_or_init(|| need_bytes(&pool.config));
            });
        }
        let pool = self.clone();
        tokio::spawn(async move {
            let result = replica::start(&pool.config, id, &pool.log_dir, &pool.probe).await;
            pool.started(id, result);
        });
    }

    /// A start ended: ready, or failed (backoff, and held requests told).
    fn started(self: &Arc<Pool>, id: u32, result: Result<Serving, String>) {
        let mut st = self.lock();
        let now = Instant::now();
        let Some(at) = st.replicas.iter().position(|e| e.id == id) else {
            return;
        };
        match result {
            Ok(serving) => {
                let took = now.saturating_duration_since(st.replicas[at].started);
                self.cold_starts.fetch_add(1, Ordering::Relaxed);
                self.cold_start_seconds.observe(took.as_secs_f64());
                tracing::info!(pool = %self.config.name, replica = id, secs = took.as_secs_f64(), "replica ready");
                self.close_span(&mut st.replicas[at], now, false);
                let serving = Arc::new(serving);
                let e = &mut st.replicas[at];
                e.phase = ReplicaState::Ready;
                e.share_mark = Duration::ZERO;
                e.serving = Some(serving.clone());
                st.failures = 0;
                st.retry_at = None;
                st.last_error = None;
                if self.stopping.load(Ordering::Acquire) {
                    // Ready after the gateway began to stop: stop it too.
                    self.spawn_drain(&mut st, id, now);
                } else if serving.process.is_some() {
                    self.watch_exit(serving);
                }
            }
            Err(why) => {
                tracing::warn!(pool = %self.config.name, replica = id, error = %why, "replica failed to start");
                let mut e = st.replicas.remove(at);
                self.close_span(&mut e, now, true);
                st.failures += 1;
                st.retry_at = Some(now + backoff(st.failures));
                st.failed_starts += 1;
                st.last_error = Some(why);
            }
        }
        drop(st);
        self.flush_spans();
        self.changed.notify_waiters();
    }

    /// A process replica that exits on its own is removed and counted as a failure (a
    /// crash loop backs off); the autoscaler replaces it at its next tick.
    fn watch_exit(self: &Arc<Pool>, serving: Arc<Serving>) {
        let pool = self.clone();
        tokio::spawn(async move {
            let Some(process) = &serving.process else {
                return;
            };
            let status = process.exited().await;
            let mut st = pool.lock();
            let now = Instant::now();
            let Some(at) = st
                .replicas
                .iter()
                .position(|e| e.id == serving.id && e.phase == ReplicaState::Ready)
            else {
                return; // Draining: its stop is under way.
            };
            let mut e = st.replicas.remove(at);
            pool.close_span(&mut e, now, false);
            let why = format!(
                "replica {} exited ({}); see {}",
                serving.id,
                status.map_or("status unknown".into(), |s| s.to_string()),
                process.log.display()
            );
            tracing::warn!(pool = %pool.config.name, "{why}");
            // Ready, then gone: it backs off as failed starts do, until one stays up.
            st.crashes += 1;
            st.retry_at = Some(now + backoff(st.crashes));
            st.last_error = Some(why);
            drop(st);
            pool.flush_spans();
            pool.changed.notify_waiters();
        });
    }

    /// Replica `id` takes no new requests, finishes those in flight (up to the drain
    /// grace), then stops.
    fn spawn_drain(self: &Arc<Pool>, st: &mut State, id: u32, now: Instant) {
        let Some(e) = st.replicas.iter_mut().find(|e| e.id == id) else {
            return;
        };
        // A starting replica is drained once ready (`started` sees the pool stopping).
        let (ReplicaState::Ready, Some(serving)) = (e.phase, e.serving.clone()) else {
            return;
        };
        self.close_span(e, now, false);
        e.phase = ReplicaState::Draining;
        tracing::info!(pool = %self.config.name, replica = id, "draining a replica");
        let pool = self.clone();
        tokio::spawn(async move {
            let grace = pool.config.drain_grace;
            let until = Instant::now() + grace;
            // An engine in this process cannot be killed: its requests, bounded by their
            // max_tokens, finish before its span closes. A process gets the grace.
            let bounded = serving.process.is_some();
            loop {
                let in_flight = serving.in_flight();
                if in_flight == 0 || (bounded && Instant::now() >= until) {
                    break;
                }
                let freed = pool.changed.notified();
                let _ = tokio::time::timeout(Duration::from_millis(100), freed).await;
            }
            if let Some(p) = &serving.process {
                p.stop(grace).await;
            }
            let mut st = pool.lock();
            let now = Instant::now();
            if let Some(at) = st.replicas.iter().position(|e| e.id == id) {
                let mut e = st.replicas.remove(at);
                pool.close_span(&mut e, now, false);
            }
            drop(st);
            pool.flush_spans();
            pool.changed.notify_waiters();
        });
    }

    /// Ends the entry's open span (into the ledger) and opens the next at `now`.
    fn close_span(&self, e: &mut Entry, now: Instant, failed: bool) {
        let share = e.serving.as_ref().map_or(Duration::ZERO, |s| {
            s.clock
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .share_at(now)
        });
        let wall = now.saturating_duration_since(e.since.0);
        let busy = share.saturating_sub(e.share_mark).min(wall);
        let start = e.since.1;
        e.since = (now, start + wall);
        e.share_mark = share;
        let (Some((_, workload)), Some(rate)) = (self.ledger.get(), self.config.rate) else {
            return;
        };
        if matches!(self.config.kind, Kind::External { .. }) {
            return; // Not replicas frugal runs: nothing of theirs to bill here.
        }
        if wall.is_zero() {
            return;
        }
        let cost = cost_of(rate, wall);
        let span = ReplicaSpan {
            id: None,
            ts_ms: epoch_ms(start),
            duration_ms: wall.as_millis() as i64,
            workload: workload.clone(),
            pool: self.config.name.clone(),
            replica: e.id,
            state: e.phase,
            busy_ms: busy.as_millis() as i64,
            cost,
            instance_type: self.config.instance_type.clone(),
            min_replicas: self.config.min_replicas,
            max_replicas: self.config.max_replicas,
            need_bytes: self.need_bytes.get().copied().flatten(),
            failed,
            server: None,
            requests: 0,
            input_tokens: 0,
            output_tokens: 0,
        };
        self.outbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((span, cost_of(rate, wall - busy)));
    }

    /// Sends the spans closed so far to the meter; called with the pool's lock released.
    fn flush_spans(&self) {
        let spans = std::mem::take(&mut *self.outbox.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some((meter, _)) = self.ledger.get() {
            for (span, idle) in spans {
                meter.record_span(span, idle);
            }
        }
    }

    /// Cuts ready replicas' spans older than a minute.
    fn cut_spans(&self, st: &mut State, now: Instant) {
        for e in &mut st.replicas {
            if e.phase == ReplicaState::Ready
                && now.saturating_duration_since(e.since.0) >= SPAN_EVERY
            {
                self.close_span(e, now, false);
            }
        }
    }

    /// A replica for one request whose prompt has prefix `keys`: a ready one by the pool's
    /// routing ([`Pool::choose`]), or, at zero or with every replica busy, the first to
    /// become ready or free (interactive requests before batch lines). Returns the replica,
    /// its hold, and how long the request was held.
    async fn acquire(
        &self,
        avoid: &[u32],
        keys: &[u64],
        batch: bool,
    ) -> Result<(Arc<Serving>, Ticket, Duration), ApiError> {
        let arrived = Instant::now();
        // An external pool's endpoint is a Service in front of many pods: no per-replica
        // limit holds for it.
        let limit = match self.config.kind {
            Kind::External { .. } => u32::MAX,
            _ => self.config.max_in_flight,
        };
        let deadline = arrived + self.config.cold_start_timeout;
        let fifo = avoid.is_empty();
        let mut held: Option<Held<'_>> = None;
        let mut seen_failures = 0;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut st = self.lock();
                if self.stopping.load(Ordering::Acquire) {
                    return Err(ApiError::Unavailable {
                        message: format!("pool `{}` is stopping", self.config.name),
                        retry_after_s: 5,
                    });
                }
                st.last_activity = Instant::now();
                let live = st
                    .replicas
                    .iter()
                    .filter(|e| e.phase != ReplicaState::Draining)
                    .count() as u32;
                // First come, first served: a slot goes to the oldest held interactive
                // request, else to the oldest held batch line.
                let first = st.first_in_line();
                let my_turn = !fifo || first == held.as_ref().map(|h| h.1);
                if my_turn && let Some(s) = self.choose(&mut st, avoid, keys, limit) {
                    let ticket = Ticket::take(&s.clock, Some(self.changed.clone()));
                    drop(st);
                    drop(held);
                    return Ok((s, ticket, arrived.elapsed()));
                }
                if held.is_none() {
                    if st.queued() >= self.config.max_queue as u32 {
                        return Err(ApiError::Overloaded(format!(
                            "pool `{}` holds {} requests already (max_queue); try again shortly",
                            self.config.name,
                            st.queued()
                        )));
                    }
                    let n = st.next_held;
                    st.next_held += 1;
                    st.waiting.push_back(Waiting { n, fifo, batch });
                    seen_failures = st.failed_starts;
                    held = Some(Held(self, n));
                    if live == 0 {
                        self.wake.notify_one();
                    }
                } else if st.failed_starts != seen_failures && live == 0 {
                    let retry = st.retry_at.map_or(1, |t| {
                        t.saturating_duration_since(Instant::now()).as_secs().max(1)
                    });
                    return Err(ApiError::Unavailable {
                        message: format!(
                            "pool `{}` could not start a replica: {}",
                            self.config.name,
                            st.last_error.as_deref().unwrap_or("unknown error")
                        ),
                        retry_after_s: retry,
                    });
                }
            }
            if tokio::time::timeout_at(deadline.into(), changed)
                .await
                .is_err()
            {
                let busy = self
                    .lock()
                    .replicas
                    .iter()
                    .any(|e| e.phase == ReplicaState::Ready);
                let why = if busy {
                    "had every replica busy (max_in_flight)"
                } else {
                    "had no replica ready"
                };
                return Err(ApiError::Unavailable {
                    message: format!(
                        "pool `{}` {why} for cold_start_timeout ({:.0?})",
                        self.config.name, self.config.cold_start_timeout
                    ),
                    retry_after_s: 5,
                });
            }
        }
    }

    /// The ready replica for a request with prefix `keys`, among those it need not avoid:
    /// by prefix within the load bound ([`prefix::pick`]), or the one with the fewest in
    /// flight. Counts the request on it (and remembers its prefix there); `None` while
    /// every one is at `limit`.
    fn choose(
        &self,
        st: &mut State,
        avoid: &[u32],
        keys: &[u64],
        limit: u32,
    ) -> Option<Arc<Serving>> {
        let usable: Vec<(usize, u32)> = st
            .replicas
            .iter()
            .enumerate()
            .filter_map(|(at, e)| {
                let (ReplicaState::Ready, Some(s)) = (e.phase, &e.serving) else {
                    return None;
                };
                // A replica that failed this request, or whose process is gone and not
                // yet removed, is passed over.
                if avoid.contains(&e.id) || s.process.as_ref().is_some_and(|p| p.has_exited()) {
                    return None;
                }
                Some((at, s.in_flight()))
            })
            .collect();
        let at = match self.config.routing {
            PoolRouting::LeastInFlight => {
                let &(at, n) = usable.iter().min_by_key(|(_, n)| *n)?;
                if n >= limit {
                    return None;
                }
                at
            }
            PoolRouting::Prefix => {
                let cands: Vec<Candidate> = usable
                    .iter()
                    .map(|&(at, in_flight)| Candidate {
                        id: st.replicas[at].id,
                        in_flight,
                        held: st.replicas[at].served.held(keys),
                    })
                    .collect();
                let first = keys.first().copied().unwrap_or(0);
                let (c, outcome) = prefix::pick(&cands, first, limit)?;
                self.routed[outcome as usize].fetch_add(1, Ordering::Relaxed);
                let at = usable[c].0;
                st.replicas[at].served.remember(keys, prefix::REMEMBERED);
                at
            }
        };
        let e = &mut st.replicas[at];
        e.requests += 1;
        e.serving.clone()
    }

    /// What the pool is doing now.
    pub fn status(&self) -> Status {
        let st = self.lock();
        let c = st.census();
        Status {
            pool: self.config.name.clone(),
            in_flight: c.in_flight,
            queued: st.queued(),
            demand: c.in_flight + st.queued(),
            ready: c.ready,
            starting: c.starting,
            draining: c.draining,
            desired_replicas: st.autoscaler.desired(),
            target_in_flight: self.config.target_in_flight,
            min_replicas: self.config.min_replicas,
            max_replicas: self.config.max_replicas,
            cold_starts: self.cold_starts.load(Ordering::Relaxed),
            last_error: st.last_error.clone(),
            routing: self.config.routing,
            replicas: st
                .replicas
                .iter()
                .map(|e| ReplicaStatus {
                    id: e.id,
                    state: match e.phase {
                        ReplicaState::Starting => "starting",
                        ReplicaState::Ready => "ready",
                        ReplicaState::Draining => "draining",
                    },
                    in_flight: e.serving.as_ref().map_or(0, |s| s.in_flight()),
                    requests: e.requests,
                    prefixes: e.served.remembered(),
                    url: e.serving.as_ref().and_then(|s| s.url.clone()),
                })
                .collect(),
        }
    }

    /// Prometheus lines for this pool (`frugal_pool_*`), after the `# HELP`/`# TYPE` lines
    /// that [`render_metrics`] writes once.
    fn metric_lines(&self, out: &mut Metrics) {
        use std::fmt::Write;
        let s = self.status();
        let p = &self.config.name;
        for (state, n) in [
            ("starting", s.starting),
            ("ready", s.ready),
            ("draining", s.draining),
        ] {
            let _ = writeln!(
                out.replicas,
                "frugal_pool_replicas{{pool=\"{p}\",state=\"{state}\"}} {n}"
            );
        }
        let _ = writeln!(
            out.desired,
            "frugal_pool_desired_replicas{{pool=\"{p}\"}} {}",
            s.desired_replicas
        );
        let _ = writeln!(out.queue, "frugal_pool_queue{{pool=\"{p}\"}} {}", s.queued);
        let _ = writeln!(
            out.in_flight,
            "frugal_pool_in_flight{{pool=\"{p}\"}} {}",
            s.in_flight
        );
        let _ = writeln!(
            out.cold_starts,
            "frugal_pool_cold_starts_total{{pool=\"{p}\"}} {}",
            s.cold_starts
        );
        self.cold_start_seconds.render_series(
            "frugal_pool_cold_start_seconds",
            &format!("pool=\"{p}\""),
            &mut out.cold_start_seconds,
        );
        if self.config.routing == PoolRouting::Prefix {
            for o in Outcome::ALL {
                let _ = writeln!(
                    out.prefix_routed,
                    "frugal_pool_prefix_routed_total{{pool=\"{p}\",outcome=\"{}\"}} {}",
                    o.label(),
                    self.routed[o as usize].load(Ordering::Relaxed)
                );
            }
        }
    }

    /// Stops every replica (draining those with requests in flight) and writes their last
    /// spans; the autoscaler stops with it.
    pub async fn shutdown(self: &Arc<Pool>) {
        self.stopping.store(true, Ordering::Release);
        self.wake.notify_one();
        {
            let mut st = self.lock();
            let now = Instant::now();
            let ids: Vec<u32> = st.replicas.iter().map(|e| e.id).collect();
            for id in ids {
                self.spawn_drain(&mut st, id, now);
            }
        }
        // Starting replicas are drained as they become ready (or fail); all are gone
        // within the drain grace twice over (finish, then SIGTERM to SIGKILL).
        let until = Instant::now()
            + self.config.drain_grace * 2
            + self.config.cold_start_timeout.min(Duration::from_secs(10));
        while !self.lock().replicas.is_empty() && Instant::now() < until {
            let _ = tokio::time::timeout(Duration::from_millis(50), self.changed.notified()).await;
        }
        // What is left (a start still loading) is given up: its span closes here, and its
        // process is killed when its start task is dropped with the runtime.
        let mut st = self.lock();
        let now = Instant::now();
        for mut e in std::mem::take(&mut st.replicas) {
            self.close_span(&mut e, now, false);
        }
        drop(st);
        self.flush_spans();
    }
}

/// A request held by the activator.
struct Waiting {
    n: u64,
    /// It keeps its turn: a retry that must avoid a replica takes any slot it can use, so
    /// that it never blocks the line.
    fifo: bool,
    /// A batch job's line: served after every held interactive request.
    batch: bool,
}

/// The oldest held interactive request that keeps its turn, else the oldest batch line.
fn first_in_line(waiting: &VecDeque<Waiting>) -> Option<u64> {
    let keeps_turn = |batch: bool| {
        waiting
            .iter()
            .find(|w| w.fifo && w.batch == batch)
            .map(|w| w.n)
    };
    keeps_turn(false).or_else(|| keeps_turn(true))
}

/// A request held by the activator, by its number: in the line until it leaves, however
/// it leaves (served, refused, or its client gone); the next in line is told.
struct Held<'a>(&'a Pool, u64);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        if let Some(at) = st.waiting.iter().position(|w| w.n == self.1) {
            st.waiting.remove(at);
        }
        drop(st);
        self.0.changed.notify_waiters();
    }
}

/// A pool's replicas by state, and their requests in flight.
struct Census {
    ready: u32,
    starting: u32,
    draining: u32,
    in_flight: u32,
}

impl State {
    fn census(&self) -> Census {
        let mut c = Census {
            ready: 0,
            starting: 0,
            draining: 0,
            in_flight: 0,
        };
        for e in &self.replicas {
            match e.phase {
                ReplicaState::Starting => c.starting += 1,
                ReplicaState::Ready => c.ready += 1,
                ReplicaState::Draining => c.draining += 1,
            }
            c.in_flight += e.serving.as_ref().map_or(0, |s| s.in_flight());
        }
        c
    }

    fn queued(&self) -> u32 {
        self.waiting.len() as u32
    }

    fn first_in_line(&self) -> Option<u64> {
        first_in_line(&self.waiting)
    }
}

/// The wait before the next start after `n` failures in a row: 1 s, doubling, at most
/// `MAX_BACKOFF`.
fn backoff(n: u32) -> Duration {
    (Duration::from_secs(1) * 2u32.saturating_pow(n.saturating_sub(1).min(16))).min(MAX_BACKOFF)
}

fn cost_of(rate: HourlyRate, time: Duration) -> Money {
    rate.cost_of(time).unwrap_or(Money::ZERO)
}

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Weights plus KV cache for `target_in_flight` sequences at the model's context (f16
/// keys and values), from a GGUF `model` the pool names; the file size alone where its
/// header cannot be read.
fn need_bytes(c: &PoolConfig) -> Option<u64> {
    let model = match &c.kind {
        Kind::Local { model } => model,
        Kind::Process { model: Some(m), .. } => m,
        _ => return None,
    };
    let size = std::fs::metadata(model).ok()?.len();
    let kv = frugal_engine::gguf::Gguf::open(model)
        .ok()
        .and_then(|g| frugal_engine::model::Config::from_gguf(&g).ok())
        .map_or(0, |m| {
            (2 * m.n_layer * m.n_head_kv * m.head_dim * 2 * m.ctx_len) as u64
                * u64::from(c.target_in_flight)
        });
    Some(size + kv)
}

/// The `frugal_pool_*` series of every pool, each family under one header.
#[derive(Default)]
struct Metrics {
    replicas: String,
    desired: String,
    queue: String,
    in_flight: String,
    cold_starts: String,
    cold_start_seconds: String,
    prefix_routed: String,
}

/// Appends the pools' series to a Prometheus page.
pub fn render_metrics<'a>(pools: impl Iterator<Item = &'a Arc<Pool>>, out: &mut String) {
    let mut m = Metrics::default();
    let mut any = false;
    for p in pools {
        p.metric_lines(&mut m);
        any = true;
    }
    if !any {
        return;
    }
    for (name, kind, help, lines) in [
        (
            "frugal_pool_replicas",
            "gauge",
            "Replicas of each pool by state.",
            &m.replicas,
        ),
        (
            "frugal_pool_desired_replicas",
            "gauge",
            "Replicas each pool's autoscaler wants.",
            &m.desired,
        ),
        (
            "frugal_pool_queue",
            "gauge",
            "Requests held by each pool's activator.",
            &m.queue,
        ),
        (
            "frugal_pool_in_flight",
            "gauge",
            "Requests in flight on each pool's replicas.",
            &m.in_flight,
        ),
        (
            "frugal_pool_cold_starts_total",
            "counter",
            "Replicas started and ready.",
            &m.cold_starts,
        ),
        (
            "frugal_pool_cold_start_seconds",
            "histogram",
            "Time from a replica's start to ready.",
            &m.cold_start_seconds,
        ),
        (
            "frugal_pool_prefix_routed_total",
            "counter",
            "Requests routed by prefix: to the replica holding their longest prefix (hit), by rendezvous hashing where none held any (miss), or to another past the load bound (overflow).",
            &m.prefix_routed,
        ),
    ] {
        if lines.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{lines}"
        ));
    }
}

impl Backend for Pool {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn prepare(&self, _job: &Job) -> Result<Plan, ApiError> {
        // A request cannot hold a replica longer than its timeout, on each try.
        Ok(Plan::hourly(
            self.config.rate,
            self.config.timeout,
            RETRIES + 1,
        ))
    }

    fn produce<'a>(
        &'a self,
        job: &'a Job,
        _plan: Plan,
        work: &'a mut Work,
    ) -> BoxFuture<'a, Result<Output, ApiError>> {
        Box::pin(async move {
            let keys = match self.config.routing {
                PoolRouting::Prefix => prefix::keys(job),
                PoolRouting::LeastInFlight => Vec::new(),
            };
            let mut failed: Vec<u32> = Vec::new();
            let mut last: Option<ApiError> = None;
            loop {
                let (serving, ticket, waited) =
                    match self.acquire(&failed, &keys, job.batch.is_some()).await {
                        Ok(got) => got,
                        // A retry that finds no replica ends as the failure it retried: the
                        // request is settled as failed, with the replica time it used.
                        Err(e) => return Err(last.unwrap_or(e)),
                    };
                work.wait += waited;
                work.hold = Some(ticket);
                let result = match &serving.target {
                    Target::Http(up) => up.call(job).await,
                    Target::Local(local) => {
                        let plan = local.prepare(job)?;
                        local.produce(job, plan, work).await
                    }
                };
                match result {
                    // Nothing was produced: another replica may answer it.
                    Err(ApiError::Upstream { status, message })
                        if failed.len() < RETRIES as usize && (status == 502 || status == 503) =>
                    {
                        tracing::warn!(pool = %self.config.name, replica = serving.id, %message, "retrying on another replica");
                        // The failed try's hold ends now: the wait for another replica is
                        // not this replica's time.
                        if let Some(old) = work.hold.take() {
                            work.share += old.finish();
                        }
                        failed.push(serving.id);
                        last = Some(ApiError::Upstream { status, message });
                        self.suspect(serving.id);
                    }
                    other => return other,
                }
            }
        })
    }

    fn price(&self, work: &Work) -> Priced {
        Priced {
            cost: self
                .config
                .rate
                .map_or(Money::ZERO, |r| cost_of(r, work.share)),
            busy: Some(work.share),
            batching_saved: Money::ZERO,
        }
    }
}

impl Pool {
    /// A replica failed a request without answering: an external endpoint is probed again
    /// before it gets more; a process replica that died is removed by its exit watcher.
    fn suspect(&self, id: u32) {
        if !matches!(self.config.kind, Kind::External { .. }) {
            return;
        }
        let mut st = self.lock();
        let now = Instant::now();
        if let Some(at) = st
            .replicas
            .iter()
            .position(|e| e.id == id && e.phase == ReplicaState::Ready)
        {
            let mut e = st.replicas.remove(at);
            self.close_span(&mut e, now, false);
        }
        drop(st);
        self.flush_spans();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_interactive_requests_go_before_older_batch_lines_and_retries_keep_no_turn() {
        let w = |n, fifo, batch| Waiting { n, fifo, batch };
        let mut line: VecDeque<Waiting> = [w(1, true, true), w(2, false, false), w(3, true, true)]
            .into_iter()
            .collect();
        // Batch lines only (a retry keeps no turn): the oldest batch line.
        assert_eq!(first_in_line(&line), Some(1));
        line.push_back(w(4, true, false));
        line.push_back(w(5, true, false));
        assert_eq!(first_in_line(&line), Some(4));
        line.retain(|x| x.n != 4);
        assert_eq!(first_in_line(&line), Some(5));
        line.retain(|x| x.n != 5);
        assert_eq!(first_in_line(&line), Some(1));
        assert_eq!(first_in_line(&VecDeque::new()), None);
    }
}
