//! Asynchronous successive halving (Li et al., "A System for Massively Parallel
//! Hyperparameter Tuning", MLSys 2020) as a state machine with no I/O: the caller asks what
//! a free slot should do, runs it, and reports the trial's metric at the rung it reached.
//!
//! Rungs sit at `min_resource * rf^k` below `max_resource`, and `max_resource` is the last
//! (Ray Tune's ASHAScheduler places them the same way). A trial is promoted as soon as it is
//! in the top `1/rf` of its rung's results so far, not when the rung fills: no slot waits.
//! A promoted trial resumes from its checkpoint, so a promotion costs only the resource
//! between its two rungs.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// Trials are numbered from 0 in the order they start.
pub type TrialId = u32;

/// Whether a lower or a higher metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Min,
    Max,
}

/// The scheduler's settings, validated by [`super::Space`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AshaConfig {
    pub mode: Mode,
    pub min_resource: u64,
    pub max_resource: u64,
    pub reduction_factor: u64,
    /// `None`: trials start until [`Asha::close`] (a dollar budget, priced by the caller).
    pub max_trials: Option<u32>,
}

impl AshaConfig {
    /// The resource at each rung: `min_resource * rf^k` below `max_resource`, then
    /// `max_resource`.
    pub fn rungs(&self) -> Vec<u64> {
        let mut rungs = Vec::new();
        let mut r = self.min_resource.max(1);
        while r < self.max_resource {
            rungs.push(r);
            r = r.saturating_mul(self.reduction_factor.max(2));
        }
        rungs.push(self.max_resource.max(self.min_resource));
        rungs
    }
}

/// What a free slot should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Job {
    /// Run `trial` from scratch (or from its own checkpoint, when re-issued) to the first rung.
    Start { trial: TrialId, to_resource: u64 },
    /// Resume `trial` from its checkpoint at rung `from_rung` and run it to the next rung.
    Promote {
        trial: TrialId,
        from_rung: usize,
        to_resource: u64,
    },
    /// Nothing to do until a running trial reports.
    Wait,
    /// Every trial has stopped.
    Done,
}

impl Job {
    /// The trial and the rung the job runs it to.
    pub fn target(&self) -> Option<(TrialId, usize)> {
        match *self {
            Job::Start { trial, .. } => Some((trial, 0)),
            Job::Promote {
                trial, from_rung, ..
            } => Some((trial, from_rung + 1)),
            Job::Wait | Job::Done => None,
        }
    }
}

/// Why a report does not fit the scheduler's state: a caller's bug or a state file that
/// does not match this search.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AshaError {
    #[error("trial {trial} does not exist")]
    UnknownTrial { trial: TrialId },
    #[error("trial {trial} reported rung {got} while it runs to {expected:?}")]
    UnexpectedRung {
        trial: TrialId,
        got: usize,
        expected: Option<usize>,
    },
    #[error("trial {trial} has failed")]
    Failed { trial: TrialId },
}

/// One trial as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Trial {
    /// The metric at each rung reached, in rung order (NaN ranks last).
    pub metrics: Vec<f64>,
    /// The rung its current job runs it to.
    pub target: Option<usize>,
    /// Its job is out on a slot; false with a target means the job waits to be re-issued.
    pub running: bool,
    /// Excluded from every ranking and never promoted.
    pub failed: bool,
}

/// The ASHA scheduler.
#[derive(Debug, Clone, PartialEq)]
pub struct Asha {
    config: AshaConfig,
    rungs: Vec<u64>,
    trials: Vec<Trial>,
    closed: bool,
}

impl Asha {
    pub fn new(config: AshaConfig) -> Self {
        Self::restore(config, Vec::new(), false)
    }

    /// Rebuilds a scheduler from saved trials. Jobs that were out when it stopped are
    /// issued again first: their trials resume from their checkpoints.
    pub fn restore(config: AshaConfig, mut trials: Vec<Trial>, closed: bool) -> Self {
        for t in &mut trials {
            t.running = false;
        }
        Self {
            rungs: config.rungs(),
            config,
            trials,
            closed,
        }
    }

    pub fn config(&self) -> &AshaConfig {
        &self.config
    }

    pub fn rungs(&self) -> &[u64] {
        &self.rungs
    }

    pub fn trials(&self) -> &[Trial] {
        &self.trials
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Starts no more trials; running ones go on and may still be promoted.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// What a free slot should do, without handing it out.
    pub fn peek_job(&self) -> Job {
        if let Some((trial, t)) = self.trials_by_id().find(|(_, t)| t.queued()) {
            return match t.target {
                Some(rung) if rung > 0 => Job::Promote {
                    trial,
                    from_rung: rung - 1,
                    to_resource: self.rungs[rung],
                },
                _ => Job::Start {
                    trial,
                    to_resource: self.rungs[0],
                },
            };
        }
        // The highest rung first, as in the paper: the nearer a trial is to the end, the
        // sooner its result is useful.
        for rung in (0..self.rungs.len() - 1).rev() {
            if let Some(trial) = self.promotable(rung) {
                return Job::Promote {
                    trial,
                    from_rung: rung,
                    to_resource: self.rungs[rung + 1],
                };
            }
        }
        let started = self.trials.len();
        let may_start = !self.closed
            && self
                .config
                .max_trials
                .is_none_or(|max| started < max as usize);
        if may_start && let Ok(trial) = TrialId::try_from(started) {
            return Job::Start {
                trial,
                to_resource: self.rungs[0],
            };
        }
        if self.trials.iter().any(|t| t.target.is_some()) {
            Job::Wait
        } else {
            Job::Done
        }
    }

    /// Hands out what a free slot should do; a trial it names counts as running.
    pub fn next_job(&mut self) -> Job {
        let job = self.peek_job();
        if let Some((trial, rung)) = job.target() {
            if trial as usize == self.trials.len() {
                self.trials.push(Trial::default());
            }
            if let Some(t) = self.trials.get_mut(trial as usize) {
                t.target = Some(rung);
                t.running = true;
            }
        }
        job
    }

    /// A promotion ahead of its turn, for a slot that would otherwise wait with nothing left
    /// to start: the best trial at the highest rung that stopped there, is not yet in its
    /// top `1/rf`, and `fits` (the caller's check that the job ends before the running
    /// ones do, so the search takes no longer). The slot is paid for either way; the result
    /// can only sharpen the choice, and it stands if the trial qualifies later. `None`
    /// while a regular job exists, or nothing fits.
    pub fn speculate(&mut self, fits: impl Fn(TrialId, usize) -> bool) -> Option<Job> {
        if self.peek_job() != Job::Wait {
            return None;
        }
        let (trial, rung) = (0..self.rungs.len() - 1).rev().find_map(|rung| {
            self.ranked(rung)
                .into_iter()
                .map(|(id, _)| id)
                .find(|&id| self.trials[id as usize].stopped_at() == Some(rung) && fits(id, rung))
                .map(|id| (id, rung))
        })?;
        let t = self.trials.get_mut(trial as usize)?;
        t.target = Some(rung + 1);
        t.running = true;
        Some(Job::Promote {
            trial,
            from_rung: rung,
            to_resource: self.rungs[rung + 1],
        })
    }

    /// Records `trial`'s metric at the rung its job ran it to.
    pub fn report(&mut self, trial: TrialId, rung: usize, metric: f64) -> Result<(), AshaError> {
        let t = self.trial_mut(trial)?;
        if t.target != Some(rung) {
            return Err(AshaError::UnexpectedRung {
                trial,
                got: rung,
                expected: t.target,
            });
        }
        t.metrics.push(metric);
        t.target = None;
        t.running = false;
        Ok(())
    }

    /// Marks `trial` failed: it leaves every ranking, and its place in a rung's top goes
    /// to the next trial.
    pub fn fail(&mut self, trial: TrialId) -> Result<(), AshaError> {
        let t = self.trial_mut(trial)?;
        t.failed = true;
        t.target = None;
        t.running = false;
        Ok(())
    }

    /// Puts `trial`'s job back to be issued again (a crashed attempt to retry).
    pub fn requeue(&mut self, trial: TrialId) -> Result<(), AshaError> {
        let t = self.trial_mut(trial)?;
        if t.target.is_none() {
            return Err(AshaError::UnexpectedRung {
                trial,
                got: t.metrics.len(),
                expected: None,
            });
        }
        t.running = false;
        Ok(())
    }

    /// The best trial at the highest rung any live trial reached, with its metric.
    pub fn best(&self) -> Option<(TrialId, f64)> {
        let top = self
            .trials
            .iter()
            .filter(|t| !t.failed)
            .map(|t| t.metrics.len())
            .max()
            .filter(|&n| n > 0)?;
        self.ranked(top - 1).first().copied()
    }

    /// The resource the trials have run so far: each to the last rung it reported, since
    /// a promoted trial resumes where it stopped.
    pub fn resource_used(&self) -> u64 {
        self.trials
            .iter()
            .filter_map(|t| t.metrics.len().checked_sub(1))
            .map(|rung| self.rungs[rung])
            .sum()
    }

    fn trial_mut(&mut self, trial: TrialId) -> Result<&mut Trial, AshaError> {
        let t = self
            .trials
            .get_mut(trial as usize)
            .ok_or(AshaError::UnknownTrial { trial })?;
        if t.failed {
            return Err(AshaError::Failed { trial });
        }
        Ok(t)
    }

    fn trials_by_id(&self) -> impl Iterator<Item = (TrialId, &Trial)> {
        (0..).zip(&self.trials)
    }

    /// The live trials with a result at `rung`, best first; ties go to the earlier trial.
    fn ranked(&self, rung: usize) -> Vec<(TrialId, f64)> {
        let mut done: Vec<(TrialId, f64)> = self
            .trials_by_id()
            .filter(|(_, t)| !t.failed)
            .filter_map(|(id, t)| Some((id, *t.metrics.get(rung)?)))
            .collect();
        done.sort_by(|a, b| self.compare(a.1, b.1).then(a.0.cmp(&b.0)));
        done
    }

    /// Better first; NaN (a diverged trial) after every number in either mode.
    fn compare(&self, a: f64, b: f64) -> Ordering {
        match (a.is_nan(), b.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => match self.config.mode {
                Mode::Min => a.total_cmp(&b),
                Mode::Max => b.total_cmp(&a),
            },
        }
    }

    /// The best trial in the top `1/rf` of `rung` that stopped there.
    fn promotable(&self, rung: usize) -> Option<TrialId> {
        let ranked = self.ranked(rung);
        let top = ranked.len() / self.config.reduction_factor as usize;
        ranked[..top]
            .iter()
            .map(|&(id, _)| id)
            .find(|&id| self.trials[id as usize].stopped_at() == Some(rung))
    }
}

impl Trial {
    fn queued(&self) -> bool {
        self.target.is_some() && !self.running && !self.failed
    }

    /// The rung it reported last and has no job past.
    fn stopped_at(&self) -> Option<usize> {
        match self.target {
            Some(_) => None,
            None => self.metrics.len().checked_sub(1),
        }
    }
}

/// The schedule the tuner's tests share: rungs at 100, 400 and 1600, a quarter promoted.
#[cfg(test)]
pub(crate) fn test_config(mode: Mode, max_trials: Option<u32>) -> AshaConfig {
    AshaConfig {
        mode,
        min_resource: 100,
        max_resource: 1600,
        reduction_factor: 4,
        max_trials,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mode: Mode, trials: u32) -> AshaConfig {
        test_config(mode, Some(trials))
    }

    /// Rung-0 metrics of 16 trials, a permutation of 0..16; later rungs keep the order.
    const METRICS: [f64; 16] = [
        8.0, 3.0, 12.0, 1.0, 15.0, 6.0, 10.0, 0.0, 14.0, 5.0, 9.0, 2.0, 13.0, 7.0, 11.0, 4.0,
    ];

    fn metric(trial: TrialId, rung: usize) -> f64 {
        METRICS[trial as usize] / (1 << rung) as f64
    }

    /// One slot, each job reported as soon as it is handed out.
    fn run_serially(asha: &mut Asha) -> Vec<Job> {
        let mut jobs = Vec::new();
        loop {
            let job = asha.next_job();
            jobs.push(job);
            match job.target() {
                Some((trial, rung)) => asha
                    .report(trial, rung, metric(trial, rung))
                    .unwrap_or_else(|e| unreachable!("{e}")),
                None => return jobs,
            }
        }
    }

    fn start(trial: TrialId) -> Job {
        Job::Start {
            trial,
            to_resource: 100,
        }
    }

    fn promote(trial: TrialId, from_rung: usize) -> Job {
        Job::Promote {
            trial,
            from_rung,
            to_resource: [400, 1600][from_rung],
        }
    }

    #[test]
    fn a_waiting_slot_promotes_the_next_best_ahead_of_its_turn() {
        let mut asha = Asha::new(config(Mode::Min, 4));
        for trial in 0..4 {
            assert_eq!(asha.next_job(), start(trial));
        }
        assert_eq!(
            asha.speculate(|_, _| true),
            None,
            "a regular job would wait only once all started"
        );
        // Trials 0..3 report 8, 3, 12, 1: trial 3 is promoted in its turn, then nothing.
        for trial in 0..4 {
            asha.report(trial, 0, metric(trial, 0)).unwrap();
        }
        assert_eq!(asha.next_job(), promote(3, 0));
        assert_eq!(asha.peek_job(), Job::Wait);
        // The next best at rung 0 (trial 1, 3.0) runs ahead; then trial 0, 8.0.
        assert_eq!(asha.speculate(|_, _| true), Some(promote(1, 0)));
        assert_eq!(asha.speculate(|_, _| true), Some(promote(0, 0)));
        asha.report(3, 1, metric(3, 1)).unwrap();
        asha.report(1, 1, metric(1, 1)).unwrap();
        // Two results at rung 1 and a slot free: still not the top quarter, so ahead again,
        // from the highest rung first.
        assert_eq!(asha.speculate(|_, _| true), Some(promote(3, 1)));
        // Only what fits: trial 1 (at rung 1) does not, so trial 2 at rung 0 goes.
        assert_eq!(asha.speculate(|t, _| t != 1), Some(promote(2, 0)));
        assert_eq!(asha.speculate(|t, _| t != 1), None);
        assert_eq!(asha.speculate(|_, _| true), Some(promote(1, 1)));
    }

    #[test]
    fn rungs_grow_by_the_reduction_factor_up_to_max_resource() {
        assert_eq!(config(Mode::Min, 1).rungs(), [100, 400, 1600]);
        let mut c = config(Mode::Min, 1);
        c.max_resource = 1000;
        assert_eq!(c.rungs(), [100, 400, 1000]);
        c.max_resource = 100;
        assert_eq!(c.rungs(), [100]);
    }

    #[test]
    fn promotes_the_top_quarter_of_each_rung_as_soon_as_it_qualifies() {
        let mut asha = Asha::new(config(Mode::Min, 16));
        let jobs = run_serially(&mut asha);
        let mut expected: Vec<Job> = (0..4).map(start).collect();
        expected.push(promote(3, 0)); // best of {8, 3, 12, 1}
        expected.extend((4..8).map(start));
        expected.push(promote(7, 0)); // 8 results: top 2 = {7, 3}
        expected.extend((8..12).map(start));
        expected.push(promote(11, 0)); // 12 results: top 3 = {7, 3, 11}
        expected.extend((12..16).map(start));
        // 16 results: top 4 = {7, 3, 11, 1}; trial 1 qualifies only now, long after it ran.
        expected.push(promote(1, 0));
        expected.push(promote(7, 1)); // rung 1 has 4 results: the best goes on
        expected.push(Job::Done);
        assert_eq!(jobs, expected);
        assert_eq!(asha.best(), Some((7, 0.0)));
    }

    #[test]
    fn on_parallel_slots_every_promotion_is_in_its_rungs_top_quarter_at_that_moment() {
        let mut asha = Asha::new(config(Mode::Min, 16));
        let mut slots: Vec<(TrialId, usize)> = Vec::new();
        loop {
            // Fill 4 slots, then finish the oldest job: results arrive out of start order.
            while slots.len() < 4 {
                let job = asha.next_job();
                if let Job::Promote {
                    trial, from_rung, ..
                } = job
                {
                    let ranked = asha.ranked(from_rung);
                    let top = &ranked[..ranked.len() / 4];
                    assert!(top.iter().any(|&(id, _)| id == trial), "{job:?}");
                }
                match job.target() {
                    Some(slot) => slots.push(slot),
                    None => break,
                }
            }
            if slots.is_empty() {
                break;
            }
            let (trial, rung) = slots.remove(0);
            asha.report(trial, rung, metric(trial, rung))
                .unwrap_or_else(|e| unreachable!("{e}"));
        }
        assert_eq!(asha.peek_job(), Job::Done);
        // Once every result is in, the final top quarter of each rung has gone on.
        for rung in 0..2 {
            let ranked = asha.ranked(rung);
            for &(id, _) in &ranked[..ranked.len() / 4] {
                assert!(asha.trials()[id as usize].metrics.len() > rung + 1, "{id}");
            }
        }
    }

    #[test]
    fn max_mode_promotes_the_highest_metrics() {
        let mut asha = Asha::new(config(Mode::Max, 16));
        let promoted: Vec<Job> = run_serially(&mut asha)
            .into_iter()
            .filter(|j| matches!(j, Job::Promote { .. }))
            .collect();
        // Trial 4 (15) qualifies the moment it reports, ahead of the rung filling.
        assert_eq!(
            promoted,
            [
                promote(2, 0),
                promote(4, 0),
                promote(8, 0),
                promote(12, 0),
                promote(4, 1)
            ]
        );
        assert_eq!(asha.best(), Some((4, 15.0 / 4.0)));
    }

    #[test]
    fn uses_a_sixth_of_the_resource_of_running_every_trial_to_the_end() {
        let mut asha = Asha::new(config(Mode::Min, 16));
        run_serially(&mut asha);
        // 12 trials stop at 100, 3 at 400 and one runs to 1600.
        assert_eq!(asha.resource_used(), 12 * 100 + 3 * 400 + 1600);
        assert!(asha.resource_used() * 6 < 16 * 1600);
    }

    #[test]
    fn a_failed_trial_is_never_promoted_and_yields_its_place() {
        let mut asha = Asha::new(config(Mode::Min, 16));
        for _ in 0..4 {
            let job = asha.next_job();
            let Some((trial, rung)) = job.target() else {
                unreachable!("{job:?}")
            };
            if trial == 3 {
                asha.fail(trial).unwrap_or_else(|e| unreachable!("{e}"));
            } else {
                asha.report(trial, rung, metric(trial, rung))
                    .unwrap_or_else(|e| unreachable!("{e}"));
            }
        }
        // Three live results: none in the top quarter yet.
        assert_eq!(asha.next_job(), start(4));
        asha.report(4, 0, metric(4, 0))
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(asha.next_job(), promote(1, 0));
        assert_eq!(asha.report(3, 0, 1.0), Err(AshaError::Failed { trial: 3 }));
    }

    #[test]
    fn ties_go_to_the_earlier_trial_and_nan_ranks_last() {
        let mut asha = Asha::new(config(Mode::Max, 4));
        for value in [f64::NAN, 2.0, 5.0, 5.0] {
            let job = asha.next_job();
            let Some((trial, rung)) = job.target() else {
                unreachable!("{job:?}")
            };
            asha.report(trial, rung, value)
                .unwrap_or_else(|e| unreachable!("{e}"));
        }
        assert_eq!(asha.next_job(), promote(2, 0));
    }

    #[test]
    fn waits_while_trials_run_and_reissues_a_requeued_job() {
        let mut asha = Asha::new(config(Mode::Min, 1));
        assert_eq!(asha.next_job(), start(0));
        assert_eq!(asha.next_job(), Job::Wait);
        asha.requeue(0).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(asha.next_job(), start(0));
        assert_eq!(
            asha.report(0, 1, 1.0),
            Err(AshaError::UnexpectedRung {
                trial: 0,
                got: 1,
                expected: Some(0)
            })
        );
        asha.report(0, 0, 1.0)
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(asha.next_job(), Job::Done);
    }

    #[test]
    fn a_closed_open_ended_search_starts_no_more_trials() {
        let mut c = config(Mode::Min, 1);
        c.max_trials = None;
        let mut asha = Asha::new(c);
        assert_eq!(asha.next_job(), start(0));
        assert_eq!(asha.next_job(), start(1));
        asha.close();
        assert_eq!(asha.next_job(), Job::Wait);
    }
}
