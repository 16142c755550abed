//! Metering: every settled request, and the machines' idle time, into the usage ledger.
//!
//! A writer thread owns the ledger and appends in batches (one transaction each), so a
//! request never waits on the disk. The channel to it is bounded: when the disk falls behind
//! (or is full), settling requests wait for room instead of the queue growing without end or
//! rows being dropped. Every machine frugal pays for by the hour (the local engine, a
//! self-hosted upstream) accumulates its requests' busy time; once a minute the time no
//! request used is written as idle capacity, so the report's cost per 1,000 inferences
//! includes it. [`Meter::close`] drains the queue and joins the writer: what was settled
//! before a shutdown is in the ledger when the process exits.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use frugal_cost::money::HourlyRate;
use frugal_cost::{Capacity, Event, Kind, Ledger, Lever, Money, Outcome, ReplicaSpan};

const FLUSH_EVERY: Duration = Duration::from_millis(250);
const IDLE_EVERY: Duration = Duration::from_secs(60);
/// Rows queued for the writer at most; past it, settling waits (back-pressure).
const QUEUE: usize = 16_384;
/// Rows kept in memory at most while the ledger cannot be written; past it, the writer
/// stops taking rows, so the queue fills and requests wait until the disk takes them.
const PENDING_MAX: usize = 100_000;
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
}

impl Meter {
    /// Opens the ledger (an error here stops the server before it listens) and starts the
    /// writer thread.
    pub fn start(config: MeterConfig) -> Result<Meter, frugal_cost::ledger::LedgerError> {
        let ledger = Ledger::open(&config.ledger)?;
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let writer = std::thread::Builder::new()
            .name("frugal-meter".into())
            .spawn(move || Writer::new(ledger, config).run(rx))
            .map_err(|e| frugal_cost::ledger::LedgerError::Unwritable {
                path: PathBuf::new(),
                source: e,
            })?;
        Ok(Meter {
            inner: Arc::new(Shared {
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(writer)),
            }),
        })
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
    ledger: Ledger,
    config: MeterConfig,
    pending: Vec<Event>,
    spans: Vec<ReplicaSpan>,
    /// Each machine's busy time since the last idle record, by its model, and when that was.
    busy: HashMap<String, Duration>,
    since: (Instant, SystemTime),
}

impl Writer {
    fn new(ledger: Ledger, config: MeterConfig) -> Writer {
        Writer {
            ledger,
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
            let stopped = if self.pending.len() >= PENDING_MAX {
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

    /// Appends what is pending; kept for the next round if the ledger refuses (a full disk
    /// may clear up).
    fn flush(&mut self) -> bool {
        if self.pending.is_empty() && self.spans.is_empty() {
            return true;
        }
        // An id per event, kept with it across retries: a commit whose acknowledgement was
        // lost (a PostgreSQL connection cut after COMMIT) is not stored twice when retried.
        for e in self.pending.iter_mut().filter(|e| e.id.is_none()) {
            let mut id = [0u8; 16];
            e.id = getrandom::fill(&mut id).ok().map(|()| id);
        }
        match self
            .ledger
            .append_with_spans("frugal serve", &self.pending, &self.spans)
        {
            Ok(_) => {
                self.pending.clear();
                self.spans.clear();
                true
            }
            Err(e) => {
                tracing::error!(error = %e, kept = self.pending.len(), "cannot write usage to the ledger; will retry");
                false
            }
        }
    }

    /// At shutdown: a few more tries before giving up on what is pending, and saying so.
    fn flush_until_written(&mut self) {
        for _ in 0..20 {
            if self.flush() {
                return;
            }
            std::thread::sleep(FLUSH_EVERY);
        }
        tracing::error!(
            lost = self.pending.len(),
            "the ledger could not be written before shutdown; these rows are lost"
        );
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
