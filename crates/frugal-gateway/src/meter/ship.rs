//! The shipper: a thread that moves the journal's rows into a PostgreSQL ledger, oldest
//! first, each batch deleted from the journal only after the ledger committed it (ids make
//! a batch shipped twice, after a crash in between, harmless). It runs apart from the
//! writer so that a ledger that stalls (a frozen server, a network dropping packets, a lock
//! held) holds only the shipper: requests go on being journaled at full speed, and the
//! journal grows, shown in `/metrics`, up to its bound.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::journal::Journal;
use super::parts::FLUSH_EVERY;
use super::target::Target;
use crate::metrics::LedgerHealth;

/// Journaled rows shipped per transaction.
const SHIP_BATCH: usize = 5_000;

/// What the writer and `Meter::close` tell the shipper, and what it tells them.
#[derive(Default)]
pub(super) struct Wake {
    state: Mutex<WakeState>,
    cond: Condvar,
}

#[derive(Default)]
struct WakeState {
    /// Rows were pushed since the shipper last looked.
    pushed: bool,
    /// Ship what is left, then stop.
    stop: bool,
    /// Stop now: `close` gave up waiting; the rows stay for the next start.
    abandon: bool,
    /// The shipper has stopped.
    done: bool,
}

impl Wake {
    fn lock(&self) -> MutexGuard<'_, WakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn pushed(&self) {
        self.lock().pushed = true;
        self.cond.notify_all();
    }

    pub(super) fn stop(&self) {
        self.lock().stop = true;
        self.cond.notify_all();
    }

    pub(super) fn abandon(&self) {
        self.lock().abandon = true;
        self.cond.notify_all();
    }

    /// Waits up to `wait` for the shipper to stop; returns whether it has.
    pub(super) fn wait_done(&self, wait: Duration) -> bool {
        let state = self.lock();
        let (state, _) = self
            .cond
            .wait_timeout_while(state, wait, |s| !s.done)
            .unwrap_or_else(|p| p.into_inner());
        state.done
    }

    /// Sleeps up to `wait`, or until rows are pushed, a stop not yet `seen` is asked, or
    /// the shipper is abandoned; returns (stop, abandon).
    fn nap(&self, wait: Duration, seen: bool) -> (bool, bool) {
        let state = self.lock();
        let (mut state, _) = self
            .cond
            .wait_timeout_while(state, wait, |s| !s.pushed && !s.abandon && s.stop == seen)
            .unwrap_or_else(|p| p.into_inner());
        state.pushed = false;
        (state.stop, state.abandon)
    }

    fn done(&self) {
        self.lock().done = true;
        self.cond.notify_all();
    }
}

pub(super) struct Shipper {
    pub(super) target: Target,
    pub(super) journal: Journal,
    pub(super) wake: Arc<Wake>,
    pub(super) health: Arc<LedgerHealth>,
}

impl Shipper {
    pub(super) fn run(mut self) {
        // Rows found at start were left by an earlier run: shipping them is a replay.
        let mut catching_up = self.journal.rows() > 0;
        let mut stop = false;
        loop {
            let rows = self.journal.rows();
            self.health.set_spooled(rows);
            self.health.set_behind(rows > 0);
            if stop && rows == 0 {
                break;
            }
            let wait = if rows == 0 {
                catching_up = false;
                FLUSH_EVERY
            } else {
                self.target.due_in()
            };
            if !wait.is_zero() {
                let (stopping, abandon) = self.wake.nap(wait, stop);
                if abandon {
                    break;
                }
                if stopping && !stop {
                    // At shutdown a ledger that was away is tried at once, not at its turn.
                    stop = true;
                    self.target.hurry();
                }
                continue;
            }
            if self.wake.lock().abandon {
                break;
            }
            if !self.ship_one(&mut catching_up) {
                catching_up = true;
            }
        }
        self.wake.done();
    }

    /// Ships the oldest batch; returns whether the ledger took it.
    fn ship_one(&mut self, catching_up: &mut bool) -> bool {
        let batch = match self.journal.oldest(SHIP_BATCH) {
            Ok(batch) => batch,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the ledger journal; its rows wait there");
                std::thread::sleep(FLUSH_EVERY);
                return true;
            }
        };
        let started = Instant::now();
        if !self.target.commit(&batch.events, &batch.spans) {
            return false;
        }
        if started.elapsed() > FLUSH_EVERY * 20 {
            tracing::warn!(
                seconds = started.elapsed().as_secs_f64(),
                rows = batch.len(),
                "the ledger took long to commit; rows waited in the journal meanwhile"
            );
        }
        // Deleted only now the ledger holds them: a crash in between ships them again, and
        // their ids keep the ledger from storing them twice.
        if let Err(e) = self.journal.remove_through(batch.last) {
            tracing::error!(error = %e, "cannot remove shipped rows from the ledger journal; they will be shipped again, and skipped");
            std::thread::sleep(FLUSH_EVERY);
            return true;
        }
        if *catching_up {
            self.health.add_replayed(batch.len() as u64);
        }
        true
    }
}
