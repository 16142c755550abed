//! The meter's writer thread: records in, ledger rows out, one group commit at a time,
//! into a SQLite ledger or the journal a PostgreSQL ledger is shipped from.

use std::collections::HashMap;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use frugal_cost::{Event, Kind, Lever, Money, Outcome, ReplicaSpan, Shadow};

use super::journal::Journal;
use super::parts::{
    BATCH_WORKLOAD, Durable, FLUSH_EVERY, Machine, MeterConfig, PENDING_MAX, Record, Row, Sample,
    Saving,
};
use super::ship::Wake;
use super::target::Target;
use crate::metrics::LedgerHealth;

const IDLE_EVERY: Duration = Duration::from_secs(60);
/// How often a continuing loss of rows is logged (each time with what was dropped since).
const LOSS_LOG_EVERY: Duration = Duration::from_secs(10);

fn split(saved: Option<(Money, Lever)>) -> (Money, Option<Lever>) {
    saved.map_or((Money::ZERO, None), |(m, l)| (m, Some(l)))
}

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Where the writer's group commits go.
pub(super) enum Sink {
    /// The ledger itself: a SQLite file is its own journal (or a PostgreSQL ledger run
    /// without one, whose rows then wait in memory while it is away).
    Ledger(Target),
    /// The journal a shipper empties into a PostgreSQL ledger.
    Journal(Journal, Arc<Wake>),
}

pub(super) struct Writer {
    sink: Sink,
    health: Arc<LedgerHealth>,
    durable: Arc<Durable>,
    /// Whether the last write to the journal failed (said once, not per batch).
    journal_failing: bool,
    /// Rows dropped (and their cost) since the last line that said so, and its time.
    unlogged_loss: (u64, Money),
    loss_logged_at: Option<Instant>,
    config: MeterConfig,
    /// Records taken so far: the sequence number of the last one (they come in order).
    taken: u64,
    /// Rows taken and not yet written.
    pending: Vec<Event>,
    spans: Vec<ReplicaSpan>,
    /// Each machine's busy time since the last idle record, by its model, and when that was.
    busy: HashMap<String, Duration>,
    since: (Instant, SystemTime),
}

impl Writer {
    pub(super) fn new(
        sink: Sink,
        config: MeterConfig,
        health: Arc<LedgerHealth>,
        durable: Arc<Durable>,
    ) -> Writer {
        Writer {
            sink,
            health,
            durable,
            journal_failing: false,
            unlogged_loss: (0, Money::ZERO),
            loss_logged_at: None,
            taken: 0,
            pending: Vec::new(),
            spans: Vec::new(),
            busy: HashMap::new(),
            since: (Instant::now(), SystemTime::now()),
            config,
        }
    }

    pub(super) fn run(mut self, rx: mpsc::Receiver<Record>) {
        loop {
            // While the ledger cannot be written and too much is pending, take nothing: the
            // bounded queue then holds settling requests back instead of rows piling up.
            let held = matches!(self.sink, Sink::Ledger(_)) && self.pending.len() >= PENDING_MAX;
            let stopped = if held {
                std::thread::sleep(FLUSH_EVERY);
                false
            } else {
                match rx.recv_timeout(FLUSH_EVERY) {
                    Ok(record) => {
                        self.take(record);
                        // Group commit: everything that queued up while the last transaction
                        // was being written goes into the next one, so a busy server pays one
                        // transaction per batch, not per request.
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
                self.try_before_exit();
                // Rows dropped since the last line that said so (the loss goes on being counted).
                self.log_loss();
                return;
            }
            if self.since.0.elapsed() >= IDLE_EVERY {
                self.idle();
            }
            self.flush();
        }
    }

    fn take(&mut self, record: Record) {
        self.taken += 1;
        match record {
            Record::Row(row) => self.add(row),
            Record::Saving(saving) => self.add_saving(saving),
            Record::Sample(sample) => self.add_sample(sample),
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
        e.wrong_chance = r.wrong_chance;
        if let Some(of) = r.shadow {
            // Not user traffic, and no lever's saving: only its cost, under what it checks.
            e.requests = 0;
            (e.saved, e.lever) = (Money::ZERO, None);
            e.model = Some(of.model);
            e.shadow = Some(Shadow {
                lever: of.lever,
                verdict: None,
            });
        }
        self.pending.push(e);
    }

    /// A quality sample's row: no request, no cost, the verdict.
    fn add_sample(&mut self, s: Sample) {
        let mut e = Event::new(
            epoch_ms(s.started),
            Kind::Inference,
            self.config.workload.clone(),
            Money::ZERO,
        );
        e.model = Some(s.of.model);
        e.shadow = Some(Shadow {
            lever: s.of.lever,
            verdict: Some(s.verdict),
        });
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
        e.lever = Some(s.lever);
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

    /// Writes what is pending in one transaction, to the ledger or the journal; then the
    /// requests waiting for their rows go on. Returns whether nothing is left in memory.
    fn flush(&mut self) -> bool {
        // An id per row, kept with it across retries and the journal: a commit whose
        // acknowledgement was lost (a PostgreSQL connection cut after COMMIT) is not
        // stored twice when retried or shipped again.
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
        let written = (self.pending.is_empty() && self.spans.is_empty())
            || match &mut self.sink {
                Sink::Ledger(target) => target.due() && target.commit(&self.pending, &self.spans),
                Sink::Journal(journal, wake) => match journal.push(&self.pending, &self.spans) {
                    Ok(()) => {
                        if std::mem::take(&mut self.journal_failing) {
                            tracing::info!(journal = %journal.path().display(), "the ledger journal takes rows again");
                        }
                        self.health.set_spooled(journal.rows());
                        wake.pushed();
                        true
                    }
                    Err(e) => {
                        if !std::mem::replace(&mut self.journal_failing, true) {
                            tracing::error!(error = %e, kept = self.pending.len(), "cannot write the ledger journal; rows wait in memory, and past {PENDING_MAX} are dropped");
                        }
                        false
                    }
                },
            };
        if written {
            self.pending.clear();
            self.spans.clear();
            self.durable.advance(self.taken);
        } else {
            self.durable.failing();
            if matches!(self.sink, Sink::Journal(..)) {
                self.shed();
            }
        }
        written
    }

    /// Drops the newest events past `PENDING_MAX`, counting the loss and logging it (at
    /// most every `LOSS_LOG_EVERY`: a flush may come many times a second): serving goes
    /// on, and what it cost is known.
    fn shed(&mut self) {
        if self.pending.len() > PENDING_MAX {
            let dropped: Vec<Event> = self.pending.drain(PENDING_MAX..).collect();
            let cost: Money = dropped.iter().map(|e| e.cost).sum();
            self.health.add_lost(dropped.len() as u64, cost);
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
        let (total, total_cost) = self.health.lost();
        tracing::error!(
            lost,
            usd = %cost,
            lost_total = total,
            usd_total = %total_cost,
            "neither the ledger nor its journal can be written: usage rows dropped"
        );
    }

    /// At shutdown: a few more tries before giving up on what is in memory, and saying so.
    /// What reached the journal is the shipper's to move (or the next start's).
    fn try_before_exit(&mut self) {
        for _ in 0..20 {
            if let Sink::Ledger(target) = &mut self.sink {
                target.hurry();
            }
            if self.flush() {
                return;
            }
            std::thread::sleep(FLUSH_EVERY);
        }
        let cost: Money = self.pending.iter().map(|e| e.cost).sum();
        let lost = self.pending.len() + self.spans.len();
        if lost > 0 {
            self.health.add_lost(lost as u64, cost);
            tracing::error!(
                lost,
                usd = %cost,
                "the ledger could not be written before shutdown; these rows are lost"
            );
        }
    }
}
