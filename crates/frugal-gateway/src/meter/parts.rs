//! What the meter's threads share: the rows it takes, its settings, and how far rows are
//! durable. A leaf: the writer, the shipper and the handle all use it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use frugal_cost::money::HourlyRate;
use frugal_cost::{Capacity, Lever, Money, Outcome, ReplicaSpan, Verdict};

pub const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// Rows kept in memory at most while neither the ledger nor the journal takes them.
pub const PENDING_MAX: usize = 100_000;
/// How long after a failed write the ledger is tried again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// How long a settling request waits for its row's group commit (milliseconds when the
/// disk is well): a bound, so that a disk that stalls cannot hold the answers.
pub const DURABLE_WAIT: Duration = Duration::from_millis(50);
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
    /// The journal of a PostgreSQL ledger (a SQLite file, made at start; what it holds at
    /// start is shipped first); unused with a SQLite ledger. `None`: rows are written to
    /// the ledger directly and wait in memory while it is away.
    pub spool: Option<PathBuf>,
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
    /// A verified semantic hit's chance of being wrong.
    pub wrong_chance: Option<f64>,
    /// A shadow's call: recorded as no request and no saving, under the served name of
    /// the answer it checks.
    pub shadow: Option<ShadowOf>,
}

/// What a shadow checks: the lever that served an answer, and the served name it went out
/// under (a route, or a model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowOf {
    pub lever: Lever,
    pub model: String,
}

/// A quality sample: a shadow's answer compared with the one served. Its call's cost is on
/// the call's own row.
#[derive(Debug, Clone)]
pub struct Sample {
    pub started: SystemTime,
    pub of: ShadowOf,
    pub verdict: Verdict,
}

/// A saving in a row of its own, beside the call's: a cascade's cheap tier answered, so
/// its dearest tier's call (`saved`, priced on the same tokens) was not made (`Routing`);
/// a call reused a cached prompt prefix (`PrefixCache`), beside what its own row saved.
#[derive(Debug, Clone)]
pub struct Saving {
    pub started: SystemTime,
    /// The route, or the served name.
    pub model: String,
    pub saved: Money,
    pub lever: Lever,
    pub tenant: Option<String>,
}

pub enum Record {
    Row(Row),
    Saving(Saving),
    Sample(Sample),
    /// A pool replica's span, and the part of its cost no request paid (idle).
    Span(ReplicaSpan, Money),
}

/// How far rows are durable, for the requests waiting on theirs.
#[derive(Default)]
pub struct Durable {
    /// The sequence number of the last record written (to the journal or the ledger).
    through: Mutex<u64>,
    cond: Condvar,
    /// The last write failed: requests do not wait until one succeeds.
    failing: AtomicBool,
}

impl Durable {
    pub fn advance(&self, through: u64) {
        *self.through.lock().unwrap_or_else(|p| p.into_inner()) = through;
        self.failing.store(false, Ordering::Relaxed);
        self.cond.notify_all();
    }

    pub fn failing(&self) {
        if !self.failing.swap(true, Ordering::Relaxed) {
            self.cond.notify_all();
        }
    }

    /// Waits until record `seq` is written, at most `DURABLE_WAIT`; returns whether it is.
    pub fn wait(&self, seq: u64) -> bool {
        if self.failing.load(Ordering::Relaxed) {
            return false;
        }
        let through = self.through.lock().unwrap_or_else(|p| p.into_inner());
        let (through, _) = self
            .cond
            .wait_timeout_while(through, DURABLE_WAIT, |t| {
                *t < seq && !self.failing.load(Ordering::Relaxed)
            })
            .unwrap_or_else(|p| p.into_inner());
        *through >= seq
    }
}
