//! Runs a search: ASHA's jobs on parallel slots, each trial under the spot-safe supervisor.
//!
//! A trial runs to its rung and stops there: the command is told the step to stop at
//! (`FRUGAL_STOP_AT`, for commands that honour it) and an observer of its metrics stream
//! asks it to checkpoint and stop once the metric is reported at the rung's resource (for
//! those that do not). A promoted trial is the same supervised run started again, so it
//! resumes from its own checkpoint, on any slot. Every segment reaches the ledger with the
//! tune's id, and its time, steps and cost reach the tuner's state, which a killed tuner
//! resumes from.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use frugal_cloud::notice::{Action, AnySource, NoticeSource};
use frugal_cloud::price::Pricing;
use frugal_cloud::store::{CheckpointStore, StoreError, local_checkpoints};
use frugal_cloud::watch::{Changes, NoticeWatcher};
use frugal_cost::Money;
use frugal_cost::event::{Event, Kind};
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use super::asha::{Job, Mode, TrialId};
use super::space::{Limit, Params, Space, Value, param_env, render_args};
use super::state::{StateError, TrialRecord, TuneState, Work};
use crate::supervisor::{Ending, Observer, Plan, Segment, Summary, SuperviseError, supervise};
use crate::watchdog::StepMetrics;
use crate::{contract, orphan};

/// The step a trial is to stop at (a contract variable for commands run by the tuner).
pub const STOP_AT: &str = "FRUGAL_STOP_AT";

/// How the search runs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub tune_id: String,
    /// The tuner's state and each trial's checkpoints, metrics and log.
    pub dir: PathBuf,
    pub space: Space,
    /// The command, with `{name}` placeholders.
    pub command: Vec<String>,
    /// A command template that launches a trial elsewhere (`{command}`, `{env}`, `{run}`,
    /// `{trial}`, `{slot}`), run through `sh -c`.
    pub launcher: Option<String>,
    pub parallel: usize,
    /// `CUDA_VISIBLE_DEVICES` of each slot; empty: left as it is.
    pub devices: Vec<String>,
    /// Seeds the configurations sampled.
    pub seed: u64,
    /// Fill a slot that would wait with a promotion ahead of its turn, when it ends before
    /// the running jobs do ([`super::Asha::speculate`]).
    pub speculate: bool,
    /// A trial that reports no step for this long is stopped and counted as a crash.
    pub trial_timeout: Duration,
    /// Checkpoint store URL; each trial keeps its checkpoints under its run id.
    pub store: String,
    /// Supervisor settings every trial shares; the command, run id, paths, environment and
    /// restarts are each trial's.
    pub supervisor: Plan,
    /// One slot's share of the machine.
    pub pricing: Pricing,
}

#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("trial {trial}")]
    Supervise {
        trial: TrialId,
        #[source]
        source: SuperviseError,
    },
    #[error(
        "trial {trial} never reported `{metric}` by {field} {reached} (its rung is at {rung}): \
         its metrics lines have {seen}; report the metric at least every {rung} {field}s"
    )]
    NoMetric {
        trial: TrialId,
        metric: String,
        field: String,
        reached: String,
        rung: u64,
        seen: String,
    },
    #[error("every trial failed; trial {trial}'s last error: {error}")]
    AllFailed { trial: TrialId, error: String },
    #[error(
        "trial {trial} ignores {}: resumed from checkpoint {checkpoint}, it reported step \
         {first} (it must load the checkpoint and go on from its step)",
        contract::RESUME_FROM
    )]
    IgnoresResume {
        trial: TrialId,
        checkpoint: u64,
        first: u64,
    },
    #[error(
        "trial {trial} is new, but {where_} already holds checkpoints of its run {run}, from \
         an earlier search with this id: give another --id, or remove them"
    )]
    Stale {
        trial: TrialId,
        run: String,
        where_: String,
    },
    #[error("cannot create {}", path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot record in the ledger: {0}")]
    Record(String),
    #[error("cannot listen for signals")]
    Signals(#[source] std::io::Error),
}

/// How the search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TuneEnding {
    /// Every trial stopped or reached the last rung.
    Finished,
    /// Stopped by a signal or a preemption notice, state saved: run it again to resume.
    Stopped,
}

/// One trial in the summary.
#[derive(Debug, Clone, Serialize)]
pub struct TrialSummary {
    pub trial: TrialId,
    pub run: String,
    pub params: Params,
    pub status: &'static str,
    /// Rungs reached.
    pub rungs: usize,
    pub results: Vec<RungResult>,
    pub steps: u64,
    pub seconds: f64,
    pub segments: u32,
    pub cost_usd: f64,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RungResult {
    pub resource: u64,
    /// `None` for a metric that was not a number (a diverged run's NaN).
    pub metric: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Best {
    pub trial: TrialId,
    pub params: Params,
    pub metric: f64,
    pub resource: u64,
}

/// The search's summary (`frugal tune --json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub tune_id: String,
    pub ending: TuneEnding,
    pub metric: String,
    pub mode: Mode,
    pub resource: String,
    pub rungs: Vec<u64>,
    pub best: Option<Best>,
    pub trials: Vec<TrialSummary>,
    pub total_steps: u64,
    /// Steps had every trial run to `max_resource`.
    pub full_steps: u64,
    pub cost_usd: f64,
    /// Each trial's cost per unit of resource times `max_resource`, summed.
    pub full_cost_usd: f64,
    pub saved_usd: f64,
    /// Busy slot time over the slots' time, in this run of the tuner.
    pub slot_utilization: Option<f64>,
    pub wall_s: f64,
}

/// Why a trial's observer stopped it.
#[derive(Debug, Clone, PartialEq)]
enum Why {
    Rung,
    Timeout,
    /// The tuner stops (a notice, a fatal error elsewhere).
    Stop,
    IgnoresResume {
        checkpoint: u64,
        first: u64,
    },
    NoMetric,
}

/// Follows one trial's metrics: its metric at the rung, and the faults the tuner names.
struct TrialWatch {
    dir: PathBuf,
    resource: String,
    metric: String,
    target: u64,
    /// Past this resource with no metric at all, the command does not report it.
    give_up_at: u64,
    resumed_from: Option<u64>,
    checked_resume: bool,
    metric_seen: bool,
    fields: BTreeSet<String>,
    /// `(resource, metric)` of the first report at or past the rung.
    result: Option<(f64, f64)>,
    last_resource: Option<f64>,
    last_progress: Instant,
    timeout: Duration,
    stop: watch::Receiver<bool>,
    why: Option<Why>,
}

impl Observer for TrialWatch {
    fn started(&mut self, _attempt: u32, pid: u32, resumed_from: Option<u64>, since: SystemTime) {
        // Until the segment is billed, this file says it runs (see `settle_orphans`).
        orphan::mark(&self.dir.join(PID_FILE), pid, resumed_from, since);
        self.resumed_from = resumed_from;
        self.checked_resume = false;
        self.last_progress = Instant::now();
    }

    fn watch(&mut self, steps: &[StepMetrics]) -> bool {
        if self.why.is_some() {
            return true;
        }
        for line in steps {
            self.last_progress = Instant::now();
            if !self.checked_resume {
                self.checked_resume = true;
                if let Some(checkpoint) = self.resumed_from
                    && line.step < checkpoint
                {
                    self.why = Some(Why::IgnoresResume {
                        checkpoint,
                        first: line.step,
                    });
                    return true;
                }
            }
            self.fields.extend(line.fields.keys().cloned());
            // JSON has no NaN: a diverged run writes null (or a string).
            let metric = line
                .fields
                .get(&self.metric)
                .map(|v| v.as_f64().unwrap_or(f64::NAN));
            self.metric_seen |= metric.is_some();
            let Some(resource) = line.number(&self.resource) else {
                continue;
            };
            self.last_resource = Some(resource);
            if let Some(m) = metric
                && resource >= self.target as f64
            {
                self.result = Some((resource, m));
                self.why = Some(Why::Rung);
                return true;
            }
            if !self.metric_seen && resource >= self.give_up_at as f64 {
                self.why = Some(Why::NoMetric);
                return true;
            }
        }
        if *self.stop.borrow() {
            self.why = Some(Why::Stop);
        } else if self.last_progress.elapsed() > self.timeout {
            tracing::warn!(
                "{}: no step reported for {:.0} s: stopping it as hung",
                self.dir.display(),
                self.timeout.as_secs_f64()
            );
            self.why = Some(Why::Timeout);
        }
        self.why.is_some()
    }
}

const PID_FILE: &str = "pid";
const LOG_FILE: &str = "log";

/// A trial's job as it ended.
struct TrialEnd {
    slot: usize,
    trial: TrialId,
    rung: usize,
    busy: Duration,
    watch: TrialWatch,
    result: Result<Summary, SuperviseError>,
}

/// Writes ledger events.
pub type Record<'r> = dyn FnMut(&[Event]) -> Result<(), String> + 'r;

/// What the trials share while the search runs (one task: no locks).
struct Shared<'a> {
    settings: &'a Settings,
    rungs: Vec<u64>,
    state: RefCell<TuneState>,
    record: RefCell<&'a mut Record<'a>>,
}

impl Shared<'_> {
    fn run_id(&self, trial: TrialId) -> String {
        format!("{}-t{trial:03}", self.settings.tune_id)
    }

    fn trial_dir(&self, trial: TrialId) -> PathBuf {
        self.settings
            .dir
            .join("trials")
            .join(format!("t{trial:03}"))
    }

    /// A segment into the ledger (under the tune's id) and into the tuner's state; then
    /// its pid file goes (it is billed).
    fn record(&self, trial: TrialId, run: &str, s: &Segment) -> Result<(), String> {
        let mut event = s.event(run, &self.settings.pricing);
        event.workload.clone_from(&self.settings.tune_id);
        (self.record.borrow_mut())(std::slice::from_ref(&event))?;
        let steps = match (s.first_step, s.last_step) {
            (Some(_), Some(last)) => last.saturating_sub(s.resumed_from.unwrap_or(0)),
            _ => 0,
        };
        let work = Work {
            segments: 1,
            seconds: s.duration().as_secs_f64(),
            steps,
            cost: event.cost,
        };
        self.state
            .borrow_mut()
            .record_segment(trial, event.ts_ms, s.outcome.as_str(), work)
            .map_err(|e| format!("{e:#}"))?;
        orphan::clear(&self.trial_dir(trial).join(PID_FILE));
        Ok(())
    }

    async fn run_trial(
        &self,
        slot: usize,
        job: Job,
        params: Params,
        fresh: bool,
        stop: watch::Receiver<bool>,
    ) -> Result<TrialEnd, TuneError> {
        let settings = self.settings;
        let (trial, rung) = job.target().unwrap_or((0, 0));
        let target = self.rungs[rung];
        let run = self.run_id(trial);
        let dir = self.trial_dir(trial);
        std::fs::create_dir_all(&dir).map_err(|source| TuneError::Dir {
            path: dir.clone(),
            source,
        })?;
        let mut env = param_env(&params);
        if settings.space.resource == "step" {
            env.push((STOP_AT.into(), target.to_string()));
        }
        env.push(("FRUGAL_TUNE_ID".into(), settings.tune_id.clone()));
        env.push(("FRUGAL_TRIAL".into(), trial.to_string()));
        env.push(("FRUGAL_SLOT".into(), slot.to_string()));
        if let Some(devices) = settings.devices.get(slot) {
            env.push(("CUDA_VISIBLE_DEVICES".into(), devices.clone()));
        }
        let mut builtin = Params::new();
        builtin.insert("trial".into(), Value::Int(i64::from(trial)));
        builtin.insert("trial_dir".into(), Value::Str(dir.display().to_string()));
        let args = render_args(&render_args(&settings.command, &builtin), &params);
        let command: Vec<OsString> = match &settings.launcher {
            Some(template) => ["sh", "-c"]
                .into_iter()
                .map(String::from)
                .chain([render_launcher(template, &args, &env, &run, trial, slot)])
                .map(OsString::from)
                .collect(),
            None => args.into_iter().map(OsString::from).collect(),
        };
        let plan = Plan {
            command,
            run_id: run.clone(),
            checkpoint_dir: dir.join("checkpoints"),
            metrics: dir.join("metrics.jsonl"),
            max_restarts: 0,
            env,
            log: Some(dir.join(LOG_FILE)),
            ..settings.supervisor.clone()
        };
        let store = CheckpointStore::open(&settings.store, &run)?;
        // A new trial resumes from nothing: another search's checkpoints under its run id
        // would pass for its own.
        if fresh {
            let local = local_checkpoints(&plan.checkpoint_dir).unwrap_or_default();
            let stale = if !local.is_empty() {
                Some(plan.checkpoint_dir.display().to_string())
            } else if !store.complete().await?.is_empty() {
                Some(store.describe())
            } else {
                None
            };
            if let Some(where_) = stale {
                return Err(TuneError::Stale { trial, run, where_ });
            }
        }
        let next = self.rungs.get(rung + 1).copied().unwrap_or(target);
        let mut watch = TrialWatch {
            dir,
            resource: settings.space.resource.clone(),
            metric: settings.space.metric.clone(),
            target,
            give_up_at: next.max(target.saturating_mul(2)),
            resumed_from: None,
            checked_resume: false,
            metric_seen: false,
            fields: BTreeSet::new(),
            result: None,
            last_resource: None,
            last_progress: Instant::now(),
            timeout: settings.trial_timeout,
            stop,
            why: None,
        };
        tracing::info!(
            "trial {trial} on slot {slot}: to {target} {} ({})",
            settings.space.resource,
            describe(&params)
        );
        let started = Instant::now();
        let result = supervise(
            &plan,
            store,
            None::<AnySource>,
            |s| self.record(trial, &run, s),
            &mut watch,
        )
        .await;
        Ok(TrialEnd {
            slot,
            trial,
            rung,
            busy: started.elapsed(),
            watch,
            result,
        })
    }
}

/// Seconds per unit of resource, each trial's own, or the mean of those known.
struct Pace {
    own: Vec<Option<f64>>,
    mean: Option<f64>,
}

impl Pace {
    fn new(trials: &[TrialRecord]) -> Pace {
        let own: Vec<Option<f64>> = trials
            .iter()
            .map(|t| (t.work.steps > 0).then(|| t.work.seconds / t.work.steps as f64))
            .collect();
        let known: Vec<f64> = own.iter().flatten().copied().collect();
        let mean = (!known.is_empty()).then(|| known.iter().sum::<f64>() / known.len() as f64);
        Pace { own, mean }
    }

    /// When a job of `trial` over `units` would end if it started now.
    fn eta(&self, trial: TrialId, units: u64) -> Option<Instant> {
        let pace = self
            .own
            .get(trial as usize)
            .copied()
            .flatten()
            .or(self.mean)?;
        Instant::now().checked_add(Duration::try_from_secs_f64(pace * units as f64).ok()?)
    }
}

/// A configuration in words: `name=value`, space-separated.
pub fn describe(params: &Params) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The launcher template with its placeholders filled, for `sh -c`. `{env}` passes the
/// contract's variables on as the shell sees them when the trial starts (they change with
/// each segment), then the trial's own; an unset `FRUGAL_RESUME_FROM` arrives empty.
fn render_launcher(
    template: &str,
    args: &[String],
    env: &[(String, String)],
    run: &str,
    trial: TrialId,
    slot: usize,
) -> String {
    let quote = |s: &str| {
        shlex::try_quote(s).map_or_else(|_| format!("'{}'", s.replace('\0', "")), |q| q.into())
    };
    let command = args.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ");
    let contract_vars = [
        contract::RUN_ID,
        contract::ATTEMPT,
        contract::CHECKPOINT_DIR,
        contract::RESUME_FROM,
        contract::METRICS,
        contract::CHECKPOINT_SIGNAL,
    ];
    let env_text = contract_vars
        .iter()
        .map(|k| format!("{k}=\"${{{k}-}}\""))
        .chain(env.iter().map(|(k, v)| format!("{k}={}", quote(v))))
        .collect::<Vec<_>>()
        .join(" ");
    template
        .replace("{command}", &command)
        .replace("{env}", &env_text)
        .replace("{run}", &quote(run))
        .replace("{trial}", &trial.to_string())
        .replace("{slot}", &slot.to_string())
}

/// Settles what a killed tuner left behind: each trial segment it never billed
/// ([`crate::orphan`]).
fn settle_orphans(shared: &Shared<'_>, trials: &[TrialRecord]) -> Result<(), TuneError> {
    for t in trials {
        let dir = shared.trial_dir(t.id);
        let run_id = shared.run_id(t.id);
        let run = orphan::Run {
            id: &run_id,
            metrics: &dir.join("metrics.jsonl"),
            checkpoint_dir: &dir.join("checkpoints"),
            log: Some(&dir.join(LOG_FILE)),
        };
        if let Some(segment) = orphan::settle(&dir.join(PID_FILE), &run) {
            shared
                .record(t.id, &run_id, &segment)
                .map_err(TuneError::Record)?;
        }
    }
    Ok(())
}

/// Runs the search until every trial has stopped, or a signal or `notices` stop it.
/// `record` writes ledger events.
pub async fn tune<S: NoticeSource + 'static>(
    settings: &Settings,
    notices: Option<S>,
    record: &mut Record<'_>,
) -> Result<Report, TuneError> {
    // The state travels in the store too, so a new machine with the same --store goes on.
    let copies = CheckpointStore::open(&settings.store, &format!("{}-state", settings.tune_id))?;
    if !TuneState::exists(&settings.dir) {
        let scratch = settings.dir.join(".restore");
        if let Some((m, path)) = copies.restore_newest(&scratch).await? {
            TuneState::restore(&path, &settings.dir)?;
            tracing::info!(
                "restored the search's state from {} (copy {})",
                copies.describe(),
                m.step
            );
        }
        let _ = std::fs::remove_dir_all(&scratch);
    }
    let state = TuneState::open(&settings.dir, settings.space.asha_config())?;
    let shared = Shared {
        settings,
        rungs: state.asha().rungs().to_vec(),
        state: RefCell::new(state),
        record: RefCell::new(record),
    };
    let trials = shared.state.borrow().trials()?;
    settle_orphans(&shared, &trials)?;
    let on = |k| signal(k).map_err(TuneError::Signals);
    let (mut term, mut int) = (on(SignalKind::terminate())?, on(SignalKind::interrupt())?);
    let notices = notices.map(|s| NoticeWatcher::spawn(s, settings.supervisor.poll));
    let mut changes = Changes::of(notices.as_ref());
    let (stop_tx, stop_rx) = watch::channel(false);

    let started = Instant::now();
    let mut free: BTreeSet<usize> = (0..settings.parallel.max(1)).collect();
    let mut busy = Duration::ZERO;
    let mut slot_started = std::collections::BTreeMap::new();
    // When each slot's job should end, where its trial's pace (or the others') says.
    let mut slot_eta: std::collections::BTreeMap<usize, Instant> =
        std::collections::BTreeMap::new();
    let mut running = FuturesUnordered::new();
    let mut stopping = false;
    let mut fatal: Option<TuneError> = None;
    loop {
        while !stopping && let Some(&slot) = free.first() {
            let in_flight = slot_started
                .values()
                .filter_map(|at: &Instant| settings.pricing.rate.cost_of(at.elapsed()))
                .sum();
            check_budget(&shared, in_flight)?;
            let mut fresh = false;
            let mut job = {
                let space = &settings.space;
                shared.state.borrow_mut().next_job(|t| {
                    fresh = true;
                    space.sample(settings.seed, t)
                })?
            };
            // One read of the trials for this job: its parameters and everyone's pace.
            let trials = shared.state.borrow().trials()?;
            let pace = Pace::new(&trials);
            if job == Job::Wait
                && settings.speculate
                && let Some(&last) = slot_eta.values().max()
            {
                let rungs = &shared.rungs;
                let fits = |t: TrialId, k: usize| {
                    pace.eta(t, rungs[k + 1] - rungs[k])
                        .is_some_and(|eta| eta <= last)
                };
                job = shared
                    .state
                    .borrow_mut()
                    .speculate(fits)?
                    .unwrap_or(Job::Wait);
            }
            let Some((trial, rung)) = job.target() else {
                break;
            };
            let from = match job {
                Job::Promote { from_rung, .. } => shared.rungs[from_rung],
                _ => 0,
            };
            let eta = pace.eta(trial, shared.rungs[rung] - from);
            let params = trials
                .into_iter()
                .find(|t| t.id == trial)
                .map(|t| t.params)
                .unwrap_or_default();
            free.remove(&slot);
            slot_started.insert(slot, Instant::now());
            match eta {
                Some(eta) => slot_eta.insert(slot, eta),
                None => slot_eta.remove(&slot),
            };
            running.push(shared.run_trial(slot, job, params, fresh, stop_rx.clone()));
        }
        if running.is_empty() {
            break;
        }
        tokio::select! {
            Some(end) = running.next() => {
                let end = match end {
                    Ok(end) => end,
                    Err(e) => {
                        // Its slot stays taken: nothing more starts.
                        tracing::error!("{e}: stopping the search");
                        fatal.get_or_insert(e);
                        stopping = true;
                        let _ = stop_tx.send(true);
                        continue;
                    }
                };
                free.insert(end.slot);
                slot_started.remove(&end.slot);
                slot_eta.remove(&end.slot);
                busy += end.busy;
                let result = settle(&shared, end);
                copy_state(&shared, &copies).await;
                if let Err(e) = result
                    && fatal.is_none()
                {
                    tracing::error!("{e}: stopping the search");
                    fatal = Some(e);
                    stopping = true;
                    let _ = stop_tx.send(true);
                }
            }
            _ = term.recv() => {
                tracing::info!("SIGTERM: the trials checkpoint and stop");
                stopping = true;
            }
            _ = int.recv() => {
                tracing::info!("SIGINT: the trials checkpoint and stop");
                stopping = true;
            }
            notice = changes.next() => {
                if let Some(n) = notice.filter(|n| n.action == Action::Terminate) {
                    tracing::warn!("{} notice: {}: the trials checkpoint and stop", n.cloud, n.detail);
                    stopping = true;
                    let _ = stop_tx.send(true);
                    if let Some(task) = &notices {
                        task.acknowledge(n);
                    }
                }
            }
        }
    }
    let wall = started.elapsed();
    record_idle(&shared, wall, busy)?;
    copy_state(&shared, &copies).await;
    if let Some(e) = fatal {
        return Err(e);
    }
    let ending = if stopping {
        TuneEnding::Stopped
    } else {
        TuneEnding::Finished
    };
    let slots = settings.parallel.max(1) as f64;
    let utilization =
        (wall > Duration::ZERO).then(|| busy.as_secs_f64() / (slots * wall.as_secs_f64()));
    drop(running);
    let state = shared.state.into_inner();
    let report = summarize(settings, &state, ending, utilization, wall)?;
    if ending == TuneEnding::Finished
        && report.best.is_none()
        && let Some(t) = report.trials.iter().find(|t| t.error.is_some())
    {
        return Err(TuneError::AllFailed {
            trial: t.trial,
            error: t.error.clone().unwrap_or_default(),
        });
    }
    Ok(report)
}

/// Closes the search once a dollar budget is spent: running trials go on, none starts.
fn check_budget(shared: &Shared<'_>, running: Money) -> Result<(), TuneError> {
    let Limit::BudgetUsd(budget) = shared.settings.space.limit else {
        return Ok(());
    };
    let mut state = shared.state.borrow_mut();
    if state.asha().is_closed() {
        return Ok(());
    }
    let spent: Money = state.trials()?.iter().map(|t| t.work.cost).sum::<Money>() + running;
    if spent.as_f64() >= budget {
        tracing::info!("the budget ${budget} is spent ({spent}): no more trials start");
        state.close()?;
    }
    Ok(())
}

/// Puts a finished job's outcome into the state: a rung result, a retry, a failure, or
/// nothing (stopped by the tuner: the job is issued again when it resumes).
fn settle(shared: &Shared<'_>, end: TrialEnd) -> Result<(), TuneError> {
    let TrialEnd {
        trial,
        rung,
        watch,
        result,
        ..
    } = end;
    let mut state = shared.state.borrow_mut();
    let crash = |state: &mut TuneState, why: String| -> Result<(), TuneError> {
        let log = log_tail(&watch.dir.join(LOG_FILE), 20);
        let attempts = state
            .trials()?
            .get(trial as usize)
            .map_or(0, |t| t.attempts);
        if attempts == 0 {
            tracing::warn!("trial {trial} crashed ({why}): retrying it once");
            state.retry(trial, &why)?;
        } else {
            tracing::warn!(
                "trial {trial} crashed again ({why}): it fails; its log {}:\n{log}",
                watch.dir.join(LOG_FILE).display()
            );
            state.fail(trial, &format!("{why}\n{log}"))?;
        }
        Ok(())
    };
    match (&watch.why, &result) {
        (Some(Why::IgnoresResume { checkpoint, first }), _) => {
            return Err(TuneError::IgnoresResume {
                trial,
                checkpoint: *checkpoint,
                first: *first,
            });
        }
        (_, Ok(summary)) if watch.result.is_some() => {
            let (_, metric) = watch.result.unwrap_or_default();
            if let Some(step) = summary.stored {
                state.set_checkpoint(trial, &format!("step {step}"))?;
            }
            state.report(trial, rung, metric)?;
            tracing::info!(
                "trial {trial}: {} {metric} at {} {}",
                shared.settings.space.metric,
                shared.rungs[rung],
                shared.settings.space.resource
            );
        }
        (Some(Why::NoMetric), _)
        | (
            None,
            Ok(Summary {
                ending: Ending::Completed,
                ..
            }),
        ) => {
            let mut seen: Vec<&str> = watch.fields.iter().map(String::as_str).collect();
            seen.sort_unstable();
            return Err(TuneError::NoMetric {
                trial,
                metric: watch.metric.clone(),
                field: watch.resource.clone(),
                reached: watch
                    .last_resource
                    .map_or_else(|| "none".into(), |r| r.to_string()),
                rung: shared.rungs[rung],
                seen: if seen.is_empty() {
                    "no fields (no lines)".into()
                } else {
                    seen.join(", ")
                },
            });
        }
        (Some(Why::Timeout), _) => crash(
            &mut state,
            format!(
                "no step reported for {:.0} s",
                shared.settings.trial_timeout.as_secs_f64()
            ),
        )?,
        (_, Err(SuperviseError::BudgetSpent { cause, .. })) => crash(&mut state, cause.clone())?,
        (_, Err(_)) => {
            let Err(source) = result else {
                return Ok(());
            };
            return Err(TuneError::Supervise { trial, source });
        }
        // Stopped by the tuner, a signal or a notice: issued again on resume.
        (_, Ok(_)) => {}
    }
    Ok(())
}

/// Copies the state to the store after each change that matters, keeping the last two;
/// while the store is away the search goes on (the local state is the truth).
async fn copy_state(shared: &Shared<'_>, copies: &CheckpointStore) {
    let seq = u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(0);
    let dir = shared.settings.dir.join(format!(".copy-{seq}"));
    let snapshot = shared.state.borrow().snapshot(&dir);
    let copied = match snapshot {
        Ok(()) => copies.upload(seq, &dir).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match copied {
        Ok(_) => {
            if let Err(e) = copies.prune(2).await {
                tracing::warn!("cannot prune the state's copies: {e}");
            }
        }
        Err(e) => tracing::warn!("cannot copy the search's state to the store: {e}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The last `n` lines of a trial's log, for its failure.
fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The slots' time no trial used, as an idle event: capacity paid for and unused.
fn record_idle(shared: &Shared<'_>, wall: Duration, busy: Duration) -> Result<(), TuneError> {
    let slots = u32::try_from(shared.settings.parallel.max(1)).unwrap_or(u32::MAX);
    let idle = (wall * slots).saturating_sub(busy);
    let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
    if idle_ms == 0 {
        return Ok(());
    }
    let pricing = &shared.settings.pricing;
    let cost = pricing.rate.cost(idle_ms, 1).unwrap_or(Money::ZERO);
    let start = SystemTime::now() - wall;
    let ts_ms = i64::try_from(
        start
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(0);
    let mut e = Event::new(ts_ms, Kind::Idle, &shared.settings.tune_id, cost);
    e.duration_ms = idle_ms;
    e.instance_type.clone_from(&pricing.instance_type);
    e.region.clone_from(&pricing.region);
    e.capacity = Some(pricing.capacity);
    e.list_cost = pricing.on_demand.and_then(|r| r.cost(idle_ms, 1));
    (shared.record.borrow_mut())(&[e]).map_err(TuneError::Record)
}

fn summarize(
    settings: &Settings,
    state: &TuneState,
    ending: TuneEnding,
    slot_utilization: Option<f64>,
    wall: Duration,
) -> Result<Report, TuneError> {
    let asha = state.asha();
    let rungs = asha.rungs().to_vec();
    let max = settings.space.max_resource;
    let records = state.trials()?;
    let mut full_cost = 0.0;
    let full_steps = max * records.len() as u64;
    let trials: Vec<TrialSummary> = records
        .iter()
        .map(|t| {
            let reached = t.results.last().map_or(0, |&(r, _)| r);
            // What this trial would have cost run to the end, at its own pace.
            if reached > 0 {
                full_cost += t.work.cost.as_f64() * max as f64 / reached as f64;
            }
            TrialSummary {
                trial: t.id,
                run: format!("{}-t{:03}", settings.tune_id, t.id),
                params: t.params.clone(),
                status: t.status.as_str(),
                rungs: t.results.len(),
                results: t
                    .results
                    .iter()
                    .map(|&(resource, m)| RungResult {
                        resource,
                        metric: (!m.is_nan()).then_some(m),
                    })
                    .collect(),
                steps: t.work.steps,
                seconds: t.work.seconds,
                segments: t.work.segments,
                cost_usd: t.work.cost.as_f64(),
                error: t.last_error.clone(),
            }
        })
        .collect();
    let best = asha.best().and_then(|(id, metric)| {
        let t = records.get(id as usize)?;
        Some(Best {
            trial: id,
            params: t.params.clone(),
            metric,
            resource: t.results.last()?.0,
        })
    });
    let cost: f64 = trials.iter().map(|t| t.cost_usd).sum();
    Ok(Report {
        tune_id: settings.tune_id.clone(),
        ending,
        metric: settings.space.metric.clone(),
        mode: settings.space.mode,
        resource: settings.space.resource.clone(),
        rungs,
        best,
        total_steps: trials.iter().map(|t| t.steps).sum(),
        full_steps,
        cost_usd: cost,
        full_cost_usd: full_cost,
        saved_usd: (full_cost - cost).max(0.0),
        trials,
        slot_utilization,
        wall_s: wall.as_secs_f64(),
    })
}
