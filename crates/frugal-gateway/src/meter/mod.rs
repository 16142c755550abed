//! Metering: every settled request, and the machines' idle time, into the usage ledger.
//!
//! What was answered is durable before the answer completes, and no database can stall an
//! answer:
//! - A writer thread (`writer`) takes settled rows from a bounded queue and writes them in
//!   group commits (one transaction for everything that queued meanwhile) to a local file in
//!   WAL mode with `synchronous = NORMAL`: a committed write survives a killed process
//!   without an fsync per request. With a SQLite ledger that file is the ledger; with a
//!   PostgreSQL ledger it is the journal (`journal`, at `MeterConfig::spool`), and a shipper
//!   thread (`ship`) moves its rows to the ledger, oldest first, with a statement timeout
//!   and TCP timeouts. A ledger that is slow, frozen or away holds only the shipper: the
//!   journal grows (`frugal_ledger_spooled_events`, `_lag_seconds`), up to its bound.
//! - [`Meter::record`] waits for its row's group commit, at most `DURABLE_WAIT`: the
//!   answer's last bytes go out after its row is on disk. While the file cannot be written
//!   (a full disk), requests do not wait, and `frugal_ledger_undurable_answers_total` counts
//!   the answers that went out first.
//! - Every row gets an id before its first write, so a commit retried or shipped again
//!   after a failure it could not see through is stored once.
//! - When the file cannot be written, rows wait in memory. Past `PENDING_MAX`, a SQLite
//!   ledger's writer stops taking rows, so the queue fills and settling requests wait for
//!   the disk rather than rows being dropped; a journal's writer drops the newest and counts
//!   the loss (`frugal_ledger_lost_events_total`, `_lost_usd_total`), logged.
//! - Machines frugal pays for by the hour (the local engine, a self-hosted upstream)
//!   accumulate their requests' busy time; once a minute the time no request used is
//!   written as idle capacity, so the report's cost per 1,000 inferences includes it.
//!
//! [`Meter::close`] drains the queue, joins the writer, and gives the shipper
//! `SHIP_AT_CLOSE` to empty the journal; what it could not ship is shipped after the next
//! start. [`LedgerHealth`] (`frugal_ledger_*` in `/metrics`) says which of these is
//! happening.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use frugal_cost::ledger::{LedgerError, Location};
use frugal_cost::{Ledger, Money, ReplicaSpan};

pub use crate::metrics::LedgerHealth;
use journal::Journal;
pub use journal::JournalError;
pub use parts::{BATCH_WORKLOAD, Machine, MeterConfig, Row, Sample, Saving, ShadowOf};
use parts::{Durable, Record};
use ship::{Shipper, Wake};
use target::Target;
use writer::{Sink, Writer};

mod journal;
mod parts;
mod ship;
mod target;
mod writer;

/// Rows queued for the writer at most; past it, settling waits (back-pressure).
const QUEUE: usize = 16_384;
/// How long a write waits for a connection to a PostgreSQL ledger.
const CONNECTION_WAIT: Duration = Duration::from_secs(1);
/// A PostgreSQL ledger's statement timeout for the meter's writes: a group commit takes
/// milliseconds; one held by a lock or a starved server is ended and tried again.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `close` gives the shipper to empty the journal into the ledger.
const SHIP_AT_CLOSE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum MeterError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("cannot start the ledger writer")]
    Start(#[source] std::io::Error),
}

/// A cheap, cloneable handle to the ledger writer.
#[derive(Clone)]
pub struct Meter {
    inner: Arc<Shared>,
}

struct Shared {
    /// The queue, and the sequence number of the last record sent; `None` once closed.
    tx: Mutex<Option<(mpsc::SyncSender<Record>, u64)>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    shipper: Mutex<Option<(JoinHandle<()>, Arc<Wake>)>>,
    durable: Arc<Durable>,
    health: Arc<LedgerHealth>,
    journal: Option<PathBuf>,
}

impl Meter {
    /// Opens the ledger and the journal (an error here stops the server before it listens;
    /// rows an earlier run left in the journal are shipped first), and starts the writer
    /// and, for a journal, the shipper.
    pub fn start(config: MeterConfig) -> Result<Meter, MeterError> {
        let mut ledger = Ledger::open(&config.ledger)?;
        ledger.set_connection_wait(CONNECTION_WAIT);
        ledger.for_meter(STATEMENT_TIMEOUT)?;
        let health = Arc::new(LedgerHealth::default());
        let durable = Arc::new(Durable::default());
        let target = Target::new(ledger, health.clone());
        let (sink, shipper, journal) = match (&config.ledger, &config.spool) {
            (Location::Postgres(_), Some(path)) => {
                let journal = Journal::open(path)?;
                if journal.rows() > 0 {
                    tracing::info!(
                        rows = journal.rows(),
                        journal = %path.display(),
                        "shipping what an earlier run left in the ledger journal"
                    );
                    health.set_spooled(journal.rows());
                }
                let wake = Arc::new(Wake::default());
                let shipper = Shipper {
                    target,
                    journal: journal.another()?,
                    wake: wake.clone(),
                    health: health.clone(),
                };
                let handle = std::thread::Builder::new()
                    .name("frugal-ledger".into())
                    .spawn(move || shipper.run())
                    .map_err(MeterError::Start)?;
                (
                    Sink::Journal(journal, wake.clone()),
                    Some((handle, wake)),
                    Some(path.clone()),
                )
            }
            _ => (Sink::Ledger(target), None, None),
        };
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let writer = Writer::new(sink, config, health.clone(), durable.clone());
        let writer = std::thread::Builder::new()
            .name("frugal-meter".into())
            .spawn(move || writer.run(rx))
            .map_err(MeterError::Start)?;
        Ok(Meter {
            inner: Arc::new(Shared {
                tx: Mutex::new(Some((tx, 0))),
                writer: Mutex::new(Some(writer)),
                shipper: Mutex::new(shipper),
                durable,
                health,
                journal,
            }),
        })
    }

    /// The ledger writer's health, for `/metrics`.
    pub fn health(&self) -> &LedgerHealth {
        &self.inner.health
    }

    /// Records a settled request, and returns once its row is durable (see the module doc).
    pub fn record(&self, row: Row) {
        if let Some(seq) = self.send(Record::Row(row))
            && !self.inner.durable.wait(seq)
        {
            self.inner.health.add_undurable();
        }
    }

    pub fn record_saving(&self, saving: Saving) {
        self.send(Record::Saving(saving));
    }

    pub fn record_sample(&self, sample: Sample) {
        self.send(Record::Sample(sample));
    }

    /// A span of a pool replica's life; `idle` (its cost no request paid) is written as
    /// idle capacity beside it.
    pub fn record_span(&self, span: ReplicaSpan, idle: Money) {
        self.send(Record::Span(span, idle));
    }

    /// Queues a record; returns its sequence number.
    fn send(&self, record: Record) -> Option<u64> {
        // Numbered and sent under one lock, so numbers follow the queue's order. A full
        // queue holds the lock: every sender waits for the writer, as it would on the queue.
        let mut tx = self.inner.tx.lock().unwrap_or_else(|p| p.into_inner());
        let sent = tx.as_mut().and_then(|(tx, seq)| {
            tx.send(record).ok().map(|()| {
                *seq += 1;
                *seq
            })
        });
        if sent.is_none() {
            tracing::error!(
                "the ledger writer has stopped; a settled request (or replica span) is not recorded"
            );
        }
        sent
    }

    /// Stops taking rows, writes every queued one and the idle time so far, waits for the
    /// writer to finish, and gives the shipper `SHIP_AT_CLOSE` to empty the journal.
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
        let shipper = self
            .inner
            .shipper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some((handle, wake)) = shipper else {
            return;
        };
        wake.stop();
        if wake.wait_done(SHIP_AT_CLOSE) {
            if handle.join().is_err() {
                tracing::error!("the ledger shipper panicked");
            }
            return;
        }
        // A shipper inside a commit the ledger does not answer cannot be interrupted; it is
        // left to the process's exit, and the rows stay in the journal.
        wake.abandon();
        if let Some(path) = &self.inner.journal {
            tracing::warn!(
                rows = self.inner.health.spooled(),
                journal = %path.display(),
                "the ledger did not take every row before shutdown; they stay in the journal and are shipped after the next start"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::SystemTime;

    use frugal_cost::money::HourlyRate;
    use frugal_cost::{Capacity, Event, Kind, Outcome};

    use super::parts::PENDING_MAX;
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
            wrong_chance: None,
            shadow: None,
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

    /// A meter on a PostgreSQL ledger with its journal at `journal`.
    fn on_postgres(url: &str, journal: PathBuf) -> Meter {
        Meter::start(MeterConfig {
            ledger: Location::Postgres(url.to_owned()),
            workload: "w".into(),
            capacity: None,
            machines: Vec::new(),
            pools: Vec::new(),
            spool: Some(journal),
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
        let journal = dir.path().join("journal.sqlite");
        let meter = on_postgres(&url, journal.clone());
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
        wait_until("the ledger down and rows journaled", || {
            !health.up() && health.spooled() > 0
        });
        std::thread::sleep(Duration::from_millis(500));
        server.restart().unwrap();
        wait_until("the journal shipped", || {
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
        assert_eq!(Journal::open(&journal).unwrap().rows(), 0);
    }

    /// A fresh database on the shared test server, and a folder for the journal.
    fn postgres_and_dir() -> (String, tempfile::TempDir) {
        let url = frugal_testkit::postgres::database();
        (url, tempfile::tempdir().unwrap())
    }

    #[test]
    fn a_journal_left_by_a_killed_gateway_is_shipped_at_the_next_start() {
        let (url, dir) = postgres_and_dir();
        let path = dir.path().join("journal.sqlite");
        let events: Vec<Event> = (0..7u8)
            .map(|i| {
                let mut e = Event::new(i64::from(i), Kind::Inference, "w", Money::from_nanos(10));
                e.id = Some([i + 1; 16]);
                e
            })
            .collect();
        // The first was committed to the ledger before the kill, but not yet deleted from
        // the journal.
        Ledger::open(Location::Postgres(url.clone()))
            .unwrap()
            .append("frugal serve", &events[..1])
            .unwrap();
        Journal::open(&path).unwrap().push(&events, &[]).unwrap();
        let meter = on_postgres(&url, path.clone());
        meter.close();
        assert_eq!(stored(&url), (7, Money::from_nanos(70)));
        assert_eq!(meter.health().replayed(), 7);
        assert_eq!(Journal::open(&path).unwrap().rows(), 0);
    }

    #[test]
    fn an_unreadable_journal_stops_the_start_with_its_name() {
        let (url, dir) = postgres_and_dir();
        let path = dir.path().join("journal.sqlite");
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
        assert!(err.contains("not a frugal ledger journal"), "{err}");
    }

    #[test]
    fn past_the_cap_rows_a_stuck_journal_cannot_take_are_dropped_and_counted() {
        let (url, dir) = postgres_and_dir();
        let path = dir.path().join("journal.sqlite");
        let meter = on_postgres(&url, path.clone());
        // Another process holds the journal's write lock: every push fails, as on a disk
        // that stopped taking writes.
        let blocker = rusqlite::Connection::open(&path).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
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
        assert!(health.undurable() > 0, "answers went on without waiting");
        blocker.execute_batch("ROLLBACK").unwrap();
        // Every row not counted lost reaches the ledger.
        wait_until("every row kept shipped", || {
            stored(&url).0 == sent as u64 - lost
        });
        meter.close();
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
    fn a_row_is_on_disk_when_record_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite");
        let meter = Meter::start(MeterConfig {
            ledger: path.clone().into(),
            workload: "w".into(),
            capacity: None,
            machines: Vec::new(),
            pools: Vec::new(),
            spool: None,
        })
        .unwrap();
        let ledger = Ledger::open(&path).unwrap();
        for n in 1..=50u64 {
            meter.record(row("m", Money::from_nanos(5), None, None));
            // Read by another connection, as after a kill: no close, no flush.
            assert_eq!(ledger.info().unwrap().events, n);
        }
        assert_eq!(meter.health().undurable(), 0);
        meter.close();
    }

    #[test]
    fn a_frozen_postgres_holds_no_request_and_a_kill_during_the_freeze_loses_nothing() {
        let server = frugal_testkit::postgres::Server::start().unwrap();
        let url = server.database().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("journal.sqlite");
        let meter = on_postgres(&url, journal.clone());
        for _ in 0..100 {
            meter.record(row("m", Money::from_nanos(2), None, None));
        }
        wait_until("the first rows shipped", || meter.health().spooled() == 0);
        server.freeze().unwrap();
        // More than the queue holds, while the ledger answers nothing: each returns with
        // its row in the journal.
        let during = QUEUE as u64 * 2;
        for _ in 0..during {
            meter.record(row("m", Money::from_nanos(2), None, None));
        }
        // Had the frozen ledger held them, every one would have waited past DURABLE_WAIT;
        // a journal write slowed past 50 ms by other load on a shared machine is not that.
        let undurable = meter.health().undurable();
        assert!(undurable < during / 10, "{undurable} of {during} waited");
        assert!(Journal::open(&journal).unwrap().rows() >= during);
        // A killed gateway leaves its journal behind; close returns without the ledger.
        meter.close();
        server.thaw().unwrap();
        let next = on_postgres(&url, journal.clone());
        next.close();
        assert_eq!(
            stored(&url),
            (100 + during, Money::from_nanos(2 * (100 + during) as i64))
        );
        assert_eq!(Journal::open(&journal).unwrap().rows(), 0);
    }

    #[test]
    fn a_ledger_held_by_a_lock_times_out_its_writes_and_gets_every_row_once_released() {
        let (url, dir) = postgres_and_dir();
        let meter = on_postgres(&url, dir.path().join("journal.sqlite"));
        meter.record(row("m", Money::from_nanos(1), None, None));
        wait_until("the first row shipped", || stored(&url).0 == 1);
        // Another session holds the table: inserts wait on the lock, as on a slow ledger.
        let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut tx = db.transaction().unwrap();
        tx.batch_execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
            .unwrap();
        for _ in 0..200 {
            meter.record(row("m", Money::from_nanos(1), None, None));
        }
        // The shipper's write ends at its statement timeout, not at the lock's release.
        let health = meter.health();
        wait_until("a write timed out", || !health.up());
        assert_eq!(health.undurable(), 0, "no answer waited on the ledger");
        tx.rollback().unwrap();
        wait_until("every row shipped", || stored(&url).0 == 201);
        meter.close();
        assert_eq!(stored(&url), (201, Money::from_nanos(201)));
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
