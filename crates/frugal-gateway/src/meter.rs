//! Metering: every finished request, and the engine's idle time, into the usage ledger.
//!
//! A writer thread owns the ledger and appends in batches (one transaction each), so a
//! request never waits on the disk. Each request is charged its share of engine time at
//! the machine's hourly price; once a minute the machine time no request used is written
//! as idle capacity, so the report's cost per 1,000 inferences includes it. Upstreams priced
//! by the hour are machines too: their calls' shares are their busy time, the rest is idle.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use frugal_cost::money::HourlyRate;
use frugal_cost::{Capacity, Event, Kind, Ledger, Lever, Money, Outcome};

const FLUSH_EVERY: Duration = Duration::from_millis(250);
const IDLE_EVERY: Duration = Duration::from_secs(60);

/// What the meter needs to price a request.
#[derive(Debug, Clone)]
pub struct MeterConfig {
    pub ledger: PathBuf,
    pub workload: String,
    /// The local engine's machine; None when the gateway serves only upstreams.
    pub engine: Option<Machine>,
    pub capacity: Option<Capacity>,
    /// Upstreams priced by the hour, whose idle time is recorded like the engine's.
    pub machines: Vec<Machine>,
}

/// A machine frugal pays for by the hour: the local engine's, or a self-hosted upstream's.
#[derive(Debug, Clone)]
pub struct Machine {
    /// The model it serves, as its requests are recorded.
    pub model: String,
    pub rate: HourlyRate,
    pub instance_type: Option<String>,
}

/// One finished request.
#[derive(Debug, Clone)]
pub struct Usage {
    pub started: SystemTime,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub engine: Duration,
    /// A cache answered: what the call it replaced cost, and which cache.
    pub saved: Option<(Money, Lever)>,
    /// The API key's tenant, for budgets that outlive a restart.
    pub tenant: Option<String>,
}

/// One finished call to an upstream, priced by its tokens.
#[derive(Debug, Clone)]
pub struct Call {
    pub started: SystemTime,
    pub duration: Duration,
    pub model: String,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub cost: Money,
    /// The call failed: recorded as a failed outcome, serving no request.
    pub failed: bool,
    /// On an upstream priced by the hour: the call's share of the machine's time.
    pub share: Option<Duration>,
    pub saved: Option<(Money, Lever)>,
    pub tenant: Option<String>,
}

/// A saving apart from any call: a cascade's cheap tier answered, so its dearest tier's
/// call (`saved`, priced on the same tokens) was not made.
#[derive(Debug, Clone)]
pub struct Saving {
    pub started: SystemTime,
    /// The route.
    pub model: String,
    pub saved: Money,
}

enum Record {
    Engine(Usage),
    Upstream(Call),
    Saving(Saving),
}

#[derive(Clone)]
pub struct Meter {
    tx: mpsc::Sender<Record>,
    rate: HourlyRate,
}

impl Meter {
    /// Opens the ledger (an error here stops the server before it listens) and starts the
    /// writer thread.
    pub fn start(config: MeterConfig) -> Result<Meter, frugal_cost::ledger::LedgerError> {
        let ledger = Ledger::open(&config.ledger)?;
        let (tx, rx) = mpsc::channel();
        let rate = config
            .engine
            .as_ref()
            .map_or(HourlyRate(Money::ZERO), |m| m.rate);
        std::thread::Builder::new()
            .name("frugal-meter".into())
            .spawn(move || Writer::new(ledger, config).run(rx))
            .map_err(|e| frugal_cost::ledger::LedgerError::Unwritable {
                path: PathBuf::new(),
                source: e,
            })?;
        Ok(Meter { tx, rate })
    }

    /// The cost of `engine` time at the machine's rate.
    pub fn cost(&self, engine: Duration) -> Money {
        self.rate
            .cost(engine.as_millis() as i64, 1)
            .unwrap_or(Money::ZERO)
    }

    pub fn record(&self, usage: Usage) {
        self.send(Record::Engine(usage));
    }

    pub fn record_call(&self, call: Call) {
        self.send(Record::Upstream(call));
    }

    pub fn record_saving(&self, saving: Saving) {
        self.send(Record::Saving(saving));
    }

    fn send(&self, record: Record) {
        if self.tx.send(record).is_err() {
            tracing::warn!("the ledger writer has stopped; usage not recorded");
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
    /// Engine time used since the last idle record, and when that was.
    busy: Duration,
    since: (Instant, SystemTime),
    /// Each hourly upstream's time used since the last idle record, by its name.
    upstream_busy: HashMap<String, Duration>,
}

impl Writer {
    fn new(ledger: Ledger, config: MeterConfig) -> Writer {
        Writer {
            ledger,
            pending: Vec::new(),
            busy: Duration::ZERO,
            since: (Instant::now(), SystemTime::now()),
            upstream_busy: HashMap::new(),
            config,
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Record>) {
        loop {
            let first = rx.recv_timeout(FLUSH_EVERY);
            let stopped = match first {
                Ok(record) => {
                    self.take(record);
                    // Group commit: everything that queued up while the last transaction
                    // was being synced goes into the next one, so a busy server pays one
                    // transaction (and fsync) per batch, not per request. No record waits
                    // for a batch to fill: durability is as before, a crash loses only
                    // the records not yet committed (queued, or in the transaction being
                    // written), and a committed one survives a power cut.
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
            };
            if stopped {
                self.idle();
                self.flush();
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
            Record::Engine(usage) => self.add(usage),
            Record::Upstream(call) => self.add_call(call),
            Record::Saving(saving) => self.add_saving(saving),
        }
    }

    /// Time on `machine`, at its rate.
    fn event(&self, kind: Kind, ts_ms: i64, duration: Duration, machine: &Machine) -> Event {
        let duration_ms = duration.as_millis() as i64;
        let cost = machine.rate.cost(duration_ms, 1).unwrap_or(Money::ZERO);
        let mut e = Event::new(ts_ms, kind, self.config.workload.clone(), cost);
        e.duration_ms = duration_ms;
        e.model = Some(machine.model.clone());
        e.instance_type.clone_from(&machine.instance_type);
        e.capacity = self.config.capacity;
        e
    }

    fn add(&mut self, u: Usage) {
        // Only the local engine's requests come here.
        let Some(engine) = &self.config.engine else {
            return;
        };
        self.busy += u.engine;
        let mut e = self.event(Kind::Inference, epoch_ms(u.started), u.engine, engine);
        e.requests = 1;
        e.input_tokens = u.prompt_tokens;
        e.output_tokens = u.completion_tokens;
        (e.saved, e.lever) = split(u.saved);
        e.tenant = u.tenant;
        self.pending.push(e);
    }

    fn add_call(&mut self, c: Call) {
        let mut e = Event::new(
            epoch_ms(c.started),
            Kind::Inference,
            self.config.workload.clone(),
            c.cost,
        );
        e.duration_ms = c.duration.as_millis() as i64;
        if let Some(machine) = self.config.machines.iter().find(|m| m.model == c.model) {
            *self.upstream_busy.entry(c.model.clone()).or_default() += c.share.unwrap_or_default();
            e.instance_type.clone_from(&machine.instance_type);
            e.capacity = self.config.capacity;
        }
        e.model = Some(c.model);
        e.requests = u64::from(!c.failed);
        e.outcome = c.failed.then_some(Outcome::Failed);
        e.input_tokens = c.prompt_tokens;
        e.cached_input_tokens = c.cached_tokens;
        e.output_tokens = c.completion_tokens;
        (e.saved, e.lever) = split(c.saved);
        e.tenant = c.tenant;
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
        self.pending.push(e);
    }

    /// The machine time since the last record that no request used.
    fn idle(&mut self) {
        let elapsed = self.since.0.elapsed();
        let idle = elapsed.saturating_sub(self.busy);
        let ts_ms = epoch_ms(self.since.1);
        if let Some(engine) = self
            .config
            .engine
            .as_ref()
            .filter(|_| idle > Duration::ZERO)
        {
            let e = self.event(Kind::Idle, ts_ms, idle, engine);
            self.pending.push(e);
        }
        let busy = std::mem::take(&mut self.upstream_busy);
        let idles: Vec<Event> = self
            .config
            .machines
            .iter()
            .filter_map(|m| {
                let idle = elapsed.saturating_sub(busy.get(&m.model).copied().unwrap_or_default());
                (idle.as_millis() > 0).then(|| self.event(Kind::Idle, ts_ms, idle, m))
            })
            .collect();
        self.pending.extend(idles);
        self.busy = Duration::ZERO;
        self.since = (Instant::now(), SystemTime::now());
    }

    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        match self.ledger.append("frugal serve", &self.pending) {
            Ok(_) => self.pending.clear(),
            // Kept for the next round: a full disk may clear up; bounded so it cannot grow
            // without end.
            Err(e) => {
                tracing::error!(error = %e, kept = self.pending.len(), "cannot write usage to the ledger");
                if self.pending.len() > 100_000 {
                    self.pending.drain(..50_000);
                }
            }
        }
    }
}
