//! Metering: every settled request, and the machines' idle time, into the usage ledger.
//!
//! A writer thread owns the ledger and appends in batches (one transaction each), so a
//! request never waits on the disk. Every row gets an id before its first try, so a commit
//! retried (or replayed) after a failure it could not see through is stored once. Every
//! machine frugal pays for by the hour (the local engine, a self-hosted upstream)
//! accumulates its requests' busy time; once a minute the time no request used is written
//! as idle capacity, so the report's cost per 1,000 inferences includes it.
//! [`Meter::close`] drains the queue and joins the writer: what was settled before a
//! shutdown is in the ledger (or the spool) when the process exits.
//!
//! When a write fails:
//! - A SQLite ledger (the local disk): rows wait in memory and are retried; past
//!   `PENDING_MAX` the writer stops taking rows, so the bounded channel fills and settling
//!   requests wait for the disk rather than rows being dropped.
//! - A PostgreSQL ledger (a server that may be away): what is pending moves to a local
//!   spool (see `spool`, `MeterConfig::spool`) in one transaction, and every later row goes
//!   there too while the ledger is down or the spool holds rows, so serving goes on at full
//!   speed and order is kept. The ledger is tried again every `RETRY_EVERY`, waiting at most
//!   `CONNECTION_WAIT` for a connection; once it answers, the spool is replayed oldest first
//!   in batches, each deleted from the spool only after the ledger committed it (ids make a
//!   replay after a crash between the two harmless). A spool left by a killed process is
//!   replayed after the next start. If the spool cannot be written either (a full disk),
//!   rows stay in memory up to `PENDING_MAX`; past it they are dropped, and the loss is
//!   logged and counted in `frugal_ledger_lost_events_total` and `_lost_usd_total`.
//!
//! [`LedgerHealth`] (`frugal_ledger_*` in `/metrics`) says which of these is happening.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use frugal_cost::ledger::{LedgerError, Location};
use frugal_cost::money::HourlyRate;
use frugal_cost::{Capacity, Event, Kind, Ledger, Lever, Money, Outcome, ReplicaSpan};

pub use crate::metrics::LedgerHealth;
use spool::Spool;
pub use spool::SpoolError;

mod spool;

const FLUSH_EVERY: Duration = Duration::from_millis(250);
const IDLE_EVERY: Duration = Duration::from_secs(60);
/// Rows queued for the writer at most; past it, settling waits (back-pressure).
const QUEUE: usize = 16_384;
/// Rows kept in memory at most while the ledger cannot be written (nor the spool): past
/// it, a SQLite ledger's writer stops taking rows, so the queue fills and requests wait
/// until the disk takes them; a PostgreSQL ledger's drops them and counts the loss.
const PENDING_MAX: usize = 100_000;
/// How long after a failed write the ledger is tried again; meanwhile rows are spooled.
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// How long a write waits for a connection to a PostgreSQL ledger: an outage turns into
/// spooling within it, not into requests held back.
const CONNECTION_WAIT: Duration = Duration::from_secs(1);
/// Spooled rows replayed per transaction.
const REPLAY_BATCH: usize = 5_000;
/// How long one round of replay may keep the writer from the queue.
const REPLAY_FOR: Duration = Duration::from_secs(2);
/// How often a continuing loss of rows is logged (each time with what was dropped since).
const LOSS_LOG_EVERY: Duration = Duration::from_secs(10);
/// The workload batch jobs' lines are recorded under, beside interactive traffic.
pub const BATCH_WORKLOAD: &str = "batch";

/// What the meter needs to write rows.
#[derive(Debug, Clone)]
pub struct MeterConfig {
    /// A SQLite file or a PostgreSQL URL.
    pub ledger: frugal_cost::Location,
    pub workload: String,
    pub capacity: Option<Capacity>,
    /// Machines paid by the hour (the local engine's, self-hosted upstreams'), whose idle
    /// time is recorded.
    pub machines: Vec<Machine>,
    /// Pools' replicas, by pool: their requests' rows name the instance type; their idle
    /// time comes with their spans ([`Meter::record_span`]).
    pub pools: Vec<Machine>,
    /// Where rows go while a PostgreSQL ledger cannot take them (a SQLite file, made when
    /// first needed, replayed after a restart); unused with a SQLite ledger. `None`: they
    /// wait in memory only.
    pub spool: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum MeterError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error("cannot start the ledger writer")]
    Start(#[source] std::io::Error),
}

/// A machine frugal pays for by the hour: the local engine's, or a self-hosted upstream's.
#[derive(Debug, Clone)]
pub struct Machine {
    /// The model it serves, as its requests are recorded.
    pub model: String,
    pub rate: HourlyRate,
    pub instance_type: Option<String>,
    /// What it would cost an hour on demand, where `rate` is a spot or committed one: its
    /// rows carry the on-demand price of their time as the list cost.
    pub on_demand: Option<HourlyRate>,
}

impl Machine {
    /// `time` on this machine, priced to the microsecond.
    pub fn cost(&self, time: Duration) -> Money {
        self.rate.cost_of(time).unwrap_or(Money::ZERO)
    }

    /// `time` on this machine at its on-demand price, where it has one.
    pub fn list_cost(&self, time: Duration) -> Option<Money> {
        self.on_demand.and_then(|r| r.cost_of(time))
    }
}

/// One settled request (or call): what it spent and how it ended.
#[derive(Debug, Clone)]
pub struct Row {
    pub started: SystemTime,
    pub duration: Duration,
    /// The served name it was billed under.
    pub model: String,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub cost: Money,
    /// Time it held a machine paid by the hour (the engine's share, an upstream's share).
    pub busy: Option<Duration>,
    /// `None`: answered in full. `Failed` rows serve no request; `Cancelled` ones were left
    /// by their client part-way, billed for what was produced.
    pub outcome: Option<Outcome>,
    /// What a lever saved on it, once.
    pub saved: Option<(Money, Lever)>,
    /// The API key's tenant, for budgets that outlive a restart.
    pub tenant: Option<String>,
    /// Time a pool's activator held it.
    pub wait: Duration,
    /// The batch job it was a line of: recorded as workload `batch`, the job as its run.
    pub batch: Option<Arc<str>>,
}

/// A saving apart from any call: a cascade's cheap tier answered, so its dearest tier's
/// call (`saved`, priced on the same tokens) was not made.
#[derive(Debug, Clone)]
pub struct Saving {
    pub started: SystemTime,
    /// The route.
    pub model: String,
    pub saved: Money,
    pub tenant: Option<String>,
}

enum Record {
    Row(Row),
    Saving(Saving),
    /// A pool replica's span, and the part of its cost no request paid (idle).
    Span(ReplicaSpan, Money),
}

/// A cheap, cloneable handle to the ledger writer.
#[derive(Clone)]
pub struct Meter {
    inner: Arc<Shared>,
}

struct Shared {
    /// `None` once closed.
    tx: Mutex<Option<mpsc::SyncSender<Record>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    health: Arc<LedgerHealth>,
}

impl Meter {
    /// Opens the ledger and a spool a previous run left (an error here stops the server
    /// before it listens) and starts the writer thread, which replays that spool first.
    pub fn start(config: MeterConfig) -> Result<Meter, MeterError> {
        let mut ledger = Ledger::open(&config.ledger)?;
        ledger.set_connection_wait(CONNECTION_WAIT);
        let spool = match (&config.ledger, &config.spool) {
            (Location::Postgres(_), Some(path)) => Some(Spool::open(path)?),
            _ => None,
        };
        let health = Arc::new(LedgerHealth::default());
        if let Some(spool) = &spool
            && spool.rows() > 0
        {
            tracing::info!(
                rows = spool.rows(),
                spool = %spool.path().display(),
                "replaying what an earlier run spooled while the ledger was unreachable"
            );
            health.set_spooled(spool.rows());
        }
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let writer = Writer::new(ledger, spool, config, health.clone());
        let writer = std::thread::Builder::new()
            .name("frugal-meter".into())
            .spawn(move || writer.run(rx))
            .map_err(MeterError::Start)?;
        Ok(Meter {
            inner: Arc::new(Shared {
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(writer)),
                health,
            }),
        })
    }

    /// The ledger writer's health, for `/metrics`.
    pub fn health(&self) -> &LedgerHealth {
        &self.inner.health
    }

    pub fn record(&self, row: Row) {
        self.send(Record::Row(row));
    }

    pub fn record_saving(&self, saving: Saving) {
        self.send(Record::Saving(saving));
    }

    /// A span of a pool replica's life; `idle` (its cost no request paid) is written as
    /// idle capacity beside it.
    pub fn record_span(&self, span: ReplicaSpan, idle: Money) {
        self.send(Record::Span(span, idle));
    }

    fn send(&self, record: Record) {
        // The sender is cloned out of the lock: a full queue blocks this sender only.
        let tx = self
            .inner
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match tx {
            Some(tx) if tx.send(record).is_ok() => {}
            _ => {
                tracing::error!(
                    "the ledger writer has stopped; a settled request (or replica span) is not recorded"
                )
            }
        }
    }

    /// Stops taking rows, writes every queued one and the idle time so far, and waits for
    /// the writer to finish.
    pub fn close(&self) {
        drop(
            self.inner
                .tx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        let writer = self
            .inner
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(w) = writer
            && w.join().is_err()
        {
            tracing::error!("the ledger writer panicked");
        }
    }
}

fn split(saved: Option<(Money, Lever)>) -> (Money, Option<Lever>) {
    saved.map_or((Money::ZERO, None), |(m, l)| (m, Some(l)))
}

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

struct Writer {
    target: Target,
    /// A PostgreSQL ledger's spool.
    spool: Option<Spool>,
    /// Whether the last write to the spool failed (said once, not per batch).
    spool_failing: bool,
    /// Rows dropped (and their cost) since the last line that said so, and its time.
    unlogged_loss: (u64, Money),
    loss_logged_at: Option<Instant>,
    config: MeterConfig,
    /// Rows taken and not yet in the ledger or the spool.
    pending: Vec<Event>,
    spans: Vec<ReplicaSpan>,
    /// Each machine's busy time since the last idle record, by its model, and when that was.
    busy: HashMap<String, Duration>,
    since: (Instant, SystemTime),
}

/// The ledger, and whether it takes writes.
struct Target {
    ledger: Ledger,
    health: Arc<LedgerHealth>,
    /// After a failed write: when to try the ledger again.
    retry_at: Option<Instant>,
}

impl Target {
    /// Whether the ledger is to be tried now (it took the last write, or it is time to
    /// try again).
    fn due(&self) -> bool {
        self.retry_at.is_none_or(|at| Instant::now() >= at)
    }

    /// One group commit; a failure is logged when the ledger goes down, not on every retry.
    fn commit(&mut self, events: &[Event], spans: &[ReplicaSpan]) -> bool {
        let started = Instant::now();
        let result = self.ledger.append_with_spans("frugal serve", events, spans);
        self.health.commit.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(_) => {
                if self.retry_at.take().is_some() {
                    tracing::info!(ledger = %self.ledger.location(), "the ledger takes writes again");
                }
                self.health.set_up(true);
                true
            }
            Err(e) => {
                if self.retry_at.is_none() {
                    tracing::error!(error = %e, rows = events.len() + spans.len(), "cannot write usage to the ledger; will retry");
                }
                self.retry_at = Some(Instant::now() + RETRY_EVERY);
                self.health.set_up(false);
                false
            }
        }
    }
}

impl Writer {
    fn new(
        ledger: Ledger,
        spool: Option<Spool>,
        config: MeterConfig,
        health: Arc<LedgerHealth>,
    ) -> Writer {
        Writer {
            target: Target {
                ledger,
                health,
                retry_at: None,
            },
            spool,
            spool_failing: false,
            unlogged_loss: (0, Money::ZERO),
            loss_logged_at: None,
            pending: Vec::new(),
            spans: Vec::new(),
            busy: HashMap::new(),
            since: (Instant::now(), SystemTime::now()),
            config,
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Record>) {
        loop {
            // While the ledger cannot be written and too much is pending, take nothing: the
            // bounded queue then holds settling requests back instead of rows piling up.
            let stopped = if self.spool.is_none() && self.pending.len() >= PENDING_MAX {
                std::thread::sleep(FLUSH_EVERY);
                false
            } else {
                match rx.recv_timeout(FLUSH_EVERY) {
                    Ok(record) => {
                        self.take(record);
                        // Group commit: everything that queued up while the last transaction
                        // was being synced goes into the next one, so a busy server pays one
                        // transaction (and fsync) per batch, not per request.
                        loop {
                            match rx.try_recv() {
                                Ok(record) => self.take(record),
                                Err(mpsc::TryRecvError::Empty) => break false,
                                Err(mpsc::TryRecvError::Disconnected) => break true,
                            }
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => false,
                    Err(mpsc::RecvTimeoutError::Disconnected) => true,
                }
            };
            if stopped {
                self.idle();
                self.flush_until_written();
                return;
            }
            if self.since.0.elapsed() >= IDLE_EVERY {
                self.idle();
            }
            self.flush();
        }
    }

    fn take(&mut self, record: Record) {
        match record {
            Record::Row(row) => self.add(row),
            Record::Saving(saving) => self.add_saving(saving),
            Record::Span(span, idle) => self.add_span(span, idle),
        }
    }

    fn machine(&self, model: &str) -> Option<&Machine> {
        self.config.machines.iter().find(|m| m.model == model)
    }

    fn add_span(&mut self, span: ReplicaSpan, idle: Money) {
        let idle_ms = span.duration_ms - span.busy_ms;
        if idle_ms > 0 {
            let mut e = Event::new(span.ts_ms, Kind::Idle, span.workload.clone(), idle);
            e.duration_ms = idle_ms;
            e.model = Some(span.pool.clone());
            e.instance_type.clone_from(&span.instance_type);
            e.capacity = self.config.capacity;
            self.pending.push(e);
        }
        self.spans.push(span);
    }

    fn add(&mut self, r: Row) {
        let workload = match r.batch {
            Some(_) => BATCH_WORKLOAD.to_owned(),
            None => self.config.workload.clone(),
        };
        let mut e = Event::new(epoch_ms(r.started), Kind::Inference, workload, r.cost);
        e.run_id = r.batch.map(|j| j.to_string());
        e.duration_ms = r.duration.as_millis() as i64;
        if let Some(machine) = self.machine(&r.model) {
            e.instance_type.clone_from(&machine.instance_type);
            e.capacity = self.config.capacity;
            e.list_cost = machine.list_cost(r.busy.unwrap_or_default());
            *self.busy.entry(r.model.clone()).or_default() += r.busy.unwrap_or_default();
        } else if let Some(pool) = self.config.pools.iter().find(|m| m.model == r.model) {
            e.instance_type.clone_from(&pool.instance_type);
            e.capacity = self.config.capacity;
        }
        e.wait_ms = r.wait.as_millis() as i64;
        e.model = Some(r.model);
        e.requests = u64::from(r.outcome != Some(Outcome::Failed));
        e.outcome = r.outcome;
        e.input_tokens = r.prompt_tokens;
        e.cached_input_tokens = r.cached_tokens;
        e.output_tokens = r.completion_tokens;
        (e.saved, e.lever) = split(r.saved);
        e.tenant = r.tenant;
        self.pending.push(e);
    }

    /// A row of its own that serves no request and costs nothing: only the saving.
    fn add_saving(&mut self, s: Saving) {
        let mut e = Event::new(
            epoch_ms(s.started),
            Kind::Inference,
            self.config.workload.clone(),
            Money::ZERO,
        );
        e.model = Some(s.model);
        e.saved = s.saved;
        e.lever = Some(Lever::Routing);
        e.tenant = s.tenant;
        self.pending.push(e);
    }

    /// Each machine's time since the last record that no request used.
    fn idle(&mut self) {
        let elapsed = self.since.0.elapsed();
        let ts_ms = epoch_ms(self.since.1);
        let busy = std::mem::take(&mut self.busy);
        let idles: Vec<Event> = self
            .config
            .machines
            .iter()
            .filter_map(|m| {
                let idle = elapsed.saturating_sub(busy.get(&m.model).copied().unwrap_or_default());
                (idle > Duration::ZERO).then(|| {
                    let mut e = Event::new(
                        ts_ms,
                        Kind::Idle,
                        self.config.workload.clone(),
                        m.cost(idle),
                    );
                    e.duration_ms = idle.as_millis() as i64;
                    e.model = Some(m.model.clone());
                    e.instance_type.clone_from(&m.instance_type);
                    e.capacity = self.config.capacity;
                    e.list_cost = m.list_cost(idle);
                    e
                })
            })
            .collect();
        self.pending.extend(idles);
        self.since = (Instant::now(), SystemTime::now());
    }

    /// Writes what is pending: to the ledger, or, while it is down or older rows wait in
    /// the spool, to the spool (replayed first when the ledger is due a try). Returns
    /// whether nothing is left in memory.
    fn flush(&mut self) -> bool {
        // An id per row, kept with it across retries and the spool: a commit whose
        // acknowledgement was lost (a PostgreSQL connection cut after COMMIT) is not
        // stored twice when retried or replayed.
        for id in self
            .pending
            .iter_mut()
            .map(|e| &mut e.id)
            .chain(self.spans.iter_mut().map(|s| &mut s.id))
            .filter(|id| id.is_none())
        {
            let mut new = [0u8; 16];
            *id = getrandom::fill(&mut new).ok().map(|()| new);
        }
        if self.target.due() && self.replay() {
            if self.pending.is_empty() && self.spans.is_empty() {
                return true;
            }
            if self.target.commit(&self.pending, &self.spans) {
                self.pending.clear();
                self.spans.clear();
                return true;
            }
        }
        self.spool_pending()
    }

    /// Replays the spool into the ledger, oldest first, for at most `REPLAY_FOR`; returns
    /// whether the spool is empty (rows taken now may go to the ledger directly).
    fn replay(&mut self) -> bool {
        let Some(spool) = &mut self.spool else {
            return true;
        };
        let started = Instant::now();
        while spool.rows() > 0 {
            if started.elapsed() >= REPLAY_FOR {
                return false;
            }
            let batch = match spool.oldest(REPLAY_BATCH) {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the ledger spool; its rows wait there");
                    return false;
                }
            };
            if !self.target.commit(&batch.events, &batch.spans) {
                return false;
            }
            // Deleted only now the ledger holds them: a crash in between replays them
            // again, and their ids keep the ledger from storing them twice.
            if let Err(e) = spool.remove_through(batch.last) {
                tracing::error!(error = %e, "cannot remove replayed rows from the ledger spool; they will be replayed again, and skipped");
                return false;
            }
            self.target.health.add_replayed(batch.len() as u64);
            self.target.health.set_spooled(spool.rows());
        }
        true
    }

    /// Moves what is pending into the spool, in one transaction; where there is none, or it
    /// cannot be written, rows stay in memory (see `shed`). Returns whether nothing is left
    /// in memory.
    fn spool_pending(&mut self) -> bool {
        let Some(spool) = &mut self.spool else {
            return false;
        };
        if self.pending.is_empty() && self.spans.is_empty() {
            return true;
        }
        match spool.push(&self.pending, &self.spans) {
            Ok(()) => {
                if std::mem::take(&mut self.spool_failing) {
                    tracing::info!(spool = %spool.path().display(), "the ledger spool takes rows again");
                }
                self.target.health.set_spooled(spool.rows());
                self.pending.clear();
                self.spans.clear();
                true
            }
            Err(e) => {
                if !std::mem::replace(&mut self.spool_failing, true) {
                    tracing::error!(error = %e, kept = self.pending.len(), "cannot write the ledger spool either; rows wait in memory, and past {PENDING_MAX} are dropped");
                }
                self.shed();
                false
            }
        }
    }

    /// Drops the newest events past `PENDING_MAX`, counting the loss and logging it (at
    /// most every `LOSS_LOG_EVERY`: a flush may come many times a second): serving goes
    /// on, and what it cost is known.
    fn shed(&mut self) {
        if self.pending.len() > PENDING_MAX {
            let dropped: Vec<Event> = self.pending.drain(PENDING_MAX..).collect();
            let cost: Money = dropped.iter().map(|e| e.cost).sum();
            self.target.health.add_lost(dropped.len() as u64, cost);
            self.unlogged_loss.0 += dropped.len() as u64;
            self.unlogged_loss.1 += cost;
        }
        if self
            .loss_logged_at
            .is_none_or(|at| at.elapsed() >= LOSS_LOG_EVERY)
        {
            self.log_loss();
        }
    }

    /// Logs the rows dropped since the last such line, if any.
    fn log_loss(&mut self) {
        let (lost, cost) = std::mem::take(&mut self.unlogged_loss);
        if lost == 0 {
            return;
        }
        self.loss_logged_at = Some(Instant::now());
        let (total, total_cost) = self.target.health.lost();
        tracing::error!(
            lost,
            usd = %cost,
            lost_total = total,
            usd_total = %total_cost,
            "neither the ledger nor its spool can be written: usage rows dropped"
        );
    }

    /// At shutdown: a few more tries before giving up on what is in memory, and saying
    /// so. Rows in the spool stay there for the next start when the ledger is down.
    fn flush_until_written(&mut self) {
        self.try_before_exit();
        // Rows dropped since the last line that said so (the loss goes on being counted).
        self.log_loss();
    }

    fn try_before_exit(&mut self) {
        for _ in 0..20 {
            self.target.retry_at = self.target.retry_at.map(|_| Instant::now());
            let written = self.flush();
            let spooled = self.spool.as_ref().map_or(0, Spool::rows);
            if written && spooled == 0 {
                return;
            }
            if written && !self.target.health.up() {
                if let Some(spool) = &self.spool {
                    tracing::warn!(
                        rows = spooled,
                        spool = %spool.path().display(),
                        "the ledger is unreachable at shutdown; its rows stay in the spool, replayed at the next start"
                    );
                }
                return;
            }
            std::thread::sleep(FLUSH_EVERY);
        }
        let cost: Money = self.pending.iter().map(|e| e.cost).sum();
        let lost = self.pending.len() + self.spans.len();
        if lost > 0 {
            self.target.health.add_lost(lost as u64, cost);
            tracing::error!(
                lost,
                usd = %cost,
                "the ledger could not be written before shutdown; these rows are lost"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn row(model: &str, cost: Money, busy: Option<Duration>, outcome: Option<Outcome>) -> Row {
        Row {
            started: SystemTime::now(),
            duration: Duration::from_millis(5),
            model: model.into(),
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens: 3,
            cost,
            busy,
            outcome,
            saved: None,
            tenant: Some("t".into()),
            wait: Duration::ZERO,
            batch: None,
        }
    }

    #[test]
    fn close_writes_every_queued_row_and_the_idle_time_before_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite");
        let meter = Meter::start(MeterConfig {
            ledger: path.clone().into(),
            workload: "w".into(),
            capacity: Some(Capacity::OnDemand),
            machines: vec![Machine {
                model: "m".into(),
                rate: HourlyRate(Money::from_cents(360_000)),
                instance_type: None,
                on_demand: None,
            }],
            pools: Vec::new(),
            spool: None,
        })
        .unwrap();
        for _ in 0..1000 {
            meter.record(row(
                "m",
                Money::from_nanos(7),
                Some(Duration::from_micros(1)),
                None,
            ));
        }
        meter.record(row("m", Money::ZERO, None, Some(Outcome::Cancelled)));
        meter.record(row("up", Money::ZERO, None, Some(Outcome::Failed)));
        // Longer than the rows' busy time: the machine idled.
        std::thread::sleep(Duration::from_millis(20));
        meter.close();
        meter.record(row("m", Money::ZERO, None, None));
        let ledger = Ledger::open(&path).unwrap();
        let mut rows = Vec::new();
        ledger
            .scan(frugal_cost::ledger::Window::default(), |r| rows.push(*r))
            .unwrap();
        let inference: Vec<_> = rows.iter().filter(|e| e.kind == Kind::Inference).collect();
        assert_eq!(inference.len(), 1002, "every row before close, none after");
        assert_eq!(
            inference.iter().map(|e| e.requests).sum::<u64>(),
            1001,
            "a failed call serves no request"
        );
        assert!(
            inference
                .iter()
                .any(|e| e.outcome == Some(Outcome::Cancelled))
        );
        assert!(rows.iter().any(|e| e.kind == Kind::Idle));
    }

    /// A meter on a PostgreSQL ledger with its spool at `spool`.
    fn on_postgres(url: &str, spool: PathBuf) -> Meter {
        Meter::start(MeterConfig {
            ledger: Location::Postgres(url.to_owned()),
            workload: "w".into(),
            capacity: None,
            machines: Vec::new(),
            pools: Vec::new(),
            spool: Some(spool),
        })
        .unwrap()
    }

    /// Waits (up to a minute) until `done` holds.
    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let why = || format!("timed out waiting: {what}");
        frugal_testkit::wait_until(Duration::from_secs(60), done, why);
    }

    /// Events in the ledger and their cost.
    fn stored(url: &str) -> (u64, Money) {
        let info = Ledger::open(Location::Postgres(url.to_owned()))
            .unwrap()
            .info()
            .unwrap();
        (info.events, info.total_cost)
    }

    #[test]
    fn postgres_killed_while_rows_flow_loses_nothing_and_stores_each_row_once() {
        let mut server = frugal_testkit::postgres::Server::start().unwrap();
        let url = server.database().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool.sqlite");
        let meter = on_postgres(&url, spool.clone());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flow = {
            let (meter, stop) = (meter.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut sent, mut cost) = (0u64, Money::ZERO);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let c = Money::from_nanos(1_000 + sent as i64);
                    meter.record(row("m", c, None, None));
                    (sent, cost) = (sent + 1, cost + c);
                    std::thread::sleep(Duration::from_micros(200));
                }
                (sent, cost)
            })
        };
        std::thread::sleep(Duration::from_millis(500));
        server.kill().unwrap();
        let health = meter.health();
        wait_until("the ledger down and rows spooled", || {
            !health.up() && health.spooled() > 0
        });
        std::thread::sleep(Duration::from_millis(500));
        assert!(spool.exists());
        server.restart().unwrap();
        wait_until("the spool replayed", || {
            health.up() && health.spooled() == 0
        });
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (sent, cost) = flow.join().unwrap();
        meter.close();
        assert!(meter.health().replayed() > 0);
        assert_eq!(meter.health().lost(), (0, Money::ZERO));
        // Ids are unique in the ledger: as many rows as were sent is each exactly once.
        assert_eq!(stored(&url), (sent, cost));
        assert_eq!(Spool::open(&spool).unwrap().rows(), 0);
    }

    /// A fresh database on the shared test server, and a folder for the spool.
    fn postgres_and_dir() -> (String, tempfile::TempDir) {
        let url = frugal_testkit::postgres::database();
        (url, tempfile::tempdir().unwrap())
    }

    #[test]
    fn a_spool_left_by_a_killed_gateway_is_replayed_at_the_next_start() {
        let (url, dir) = postgres_and_dir();
        let path = dir.path().join("spool.sqlite");
        let events: Vec<Event> = (0..7u8)
            .map(|i| {
                let mut e = Event::new(i64::from(i), Kind::Inference, "w", Money::from_nanos(10));
                e.id = Some([i + 1; 16]);
                e
            })
            .collect();
        // The first was committed to the ledger before the kill, but not yet deleted from
        // the spool.
        Ledger::open(Location::Postgres(url.clone()))
            .unwrap()
            .append("frugal serve", &events[..1])
            .unwrap();
        Spool::open(&path).unwrap().push(&events, &[]).unwrap();
        let meter = on_postgres(&url, path.clone());
        assert_eq!(meter.health().spooled(), 7);
        meter.close();
        assert_eq!(stored(&url), (7, Money::from_nanos(70)));
        assert_eq!(meter.health().replayed(), 7);
        assert_eq!(Spool::open(&path).unwrap().rows(), 0);
    }

    #[test]
    fn an_unreadable_spool_stops_the_start_with_its_name() {
        let (url, dir) = postgres_and_dir();
        let path = dir.path().join("spool.sqlite");
        std::fs::write(&path, vec![b'x'; 4096]).unwrap();
        let err = Meter::start(MeterConfig {
            ledger: Location::Postgres(url),
            workload: "w".into(),
            capacity: None,
            machines: Vec::new(),
            pools: Vec::new(),
            spool: Some(path.clone()),
        })
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("not a frugal ledger spool"), "{err}");
    }

    #[test]
    fn with_no_ledger_and_no_spool_rows_past_the_cap_are_dropped_and_counted() {
        let mut server = frugal_testkit::postgres::Server::start().unwrap();
        let url = server.database().unwrap();
        let dir = tempfile::tempdir().unwrap();
        // Its folder is a file: no spool can be made there, by root either.
        std::fs::write(dir.path().join("file"), "").unwrap();
        let meter = on_postgres(&url, dir.path().join("file").join("spool.sqlite"));
        server.kill().unwrap();
        let extra = 1_000;
        let sent = PENDING_MAX + extra;
        for _ in 0..sent {
            meter.record(row("m", Money::from_nanos(3), None, None));
        }
        let health = meter.health();
        wait_until("the rows past the cap dropped", || health.lost().0 > 0);
        let (lost, cost) = health.lost();
        assert!(lost <= extra as u64, "{lost}");
        assert_eq!(
            cost,
            Money::from_nanos(3 * lost as i64),
            "their cost, exactly"
        );
        assert!(!health.up());
        server.restart().unwrap();
        meter.close();
        // Every row not counted lost is in the ledger.
        assert_eq!(stored(&url).0, sent as u64 - lost);
        assert_eq!(meter.health().lost().0, lost);
        let mut text = String::new();
        meter.health().render(&mut text);
        assert!(
            text.contains(&format!("frugal_ledger_lost_events_total {lost}\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "frugal_ledger_lost_usd_total {}\n",
                cost.to_string_places(9)
            )),
            "{text}"
        );
    }

    #[test]
    fn machine_time_is_priced_to_the_microsecond() {
        let m = Machine {
            model: "m".into(),
            rate: HourlyRate(Money::from_cents(360_000)),
            instance_type: None,
            on_demand: None,
        };
        // $3,600 an hour is a micro-dollar per microsecond.
        assert_eq!(
            m.cost(Duration::from_micros(1500)),
            Money::from_nanos(1_500_000)
        );
        assert_eq!(m.cost(Duration::from_micros(1)), Money::from_nanos(1000));
        assert_eq!(
            m.cost(Duration::from_nanos(999)),
            Money::ZERO,
            "below the resolution"
        );
    }
}
