//! The ledger a group commit goes to, and when to try it again after a failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use frugal_cost::{Event, Ledger, ReplicaSpan};

use super::parts::RETRY_EVERY;
use crate::metrics::LedgerHealth;

/// A ledger, and whether it takes writes.
pub(super) struct Target {
    ledger: Ledger,
    health: Arc<LedgerHealth>,
    /// After a failed write: when to try the ledger again.
    retry_at: Option<Instant>,
}

impl Target {
    pub(super) fn new(ledger: Ledger, health: Arc<LedgerHealth>) -> Target {
        Target {
            ledger,
            health,
            retry_at: None,
        }
    }

    /// Whether the ledger is to be tried now (it took the last write, or it is time to
    /// try again).
    pub(super) fn due(&self) -> bool {
        self.retry_at.is_none_or(|at| Instant::now() >= at)
    }

    /// How long until the ledger is due a try.
    pub(super) fn due_in(&self) -> Duration {
        self.retry_at.map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }

    /// Makes the ledger due a try now (at shutdown).
    pub(super) fn hurry(&mut self) {
        self.retry_at = self.retry_at.map(|_| Instant::now());
    }

    /// One group commit; a failure is logged when the ledger goes down, not on every retry.
    pub(super) fn commit(&mut self, events: &[Event], spans: &[ReplicaSpan]) -> bool {
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
