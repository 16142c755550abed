//! The supervisor: runs the training command segment after segment until it finishes.
//!
//! A segment is one life of the command. It ends when the command exits: done, crashed, or
//! stopped because the machine is going away (a cloud's notice, or SIGTERM/SIGINT to the
//! supervisor). Before a stop the command is asked to checkpoint; every checkpoint it
//! publishes is copied to the store in the background, newest first. A crash is restarted
//! with backoff from the newest checkpoint. After a preemption notice, once the checkpoint is
//! in the store, the run stops (exit 75 in `frugal train`: the next run elsewhere resumes),
//! unless the notice was withdrawn by then: then it restarts here.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime};

use frugal_cost::event::{Outcome, Precision};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use frugal_cloud::notice::{Action, Notice, NoticeSource};
use frugal_cloud::store::{CheckpointStore, local_checkpoints};
use frugal_cloud::watch::{Changes, NoticeWatcher};

use crate::contract;
use crate::watchdog::{Diagnosis, MetricsTail, Peak, StepMetrics, Watchdog};

/// How often checkpoints are looked for and the watchdog samples.
const TICK: Duration = Duration::from_millis(250);
/// The same while a stop waits for its checkpoint: every step past it is lost.
const STOP_TICK: Duration = Duration::from_millis(20);
/// Once the checkpoint is stored after a notice, how long (at most a poll) a withdrawal
/// the last poll missed is waited for before the run stops.
const LAST_LOOK: Duration = Duration::from_secs(3);
/// How long an acknowledgement (Azure's: "go ahead now") may take to go out before exit.
const ACK_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct Plan {
    pub command: Vec<OsString>,
    pub run_id: String,
    pub checkpoint_dir: PathBuf,
    pub metrics: PathBuf,
    /// What the metrics' model FLOPs are measured against (MFU).
    pub peak: Peak,
    pub checkpoint_signal: Signal,
    /// Between SIGTERM and SIGKILL when stopping the command.
    pub stop_grace: Duration,
    /// The deadline SIGTERM or SIGINT to the supervisor gives (nothing says how long is left).
    pub term_deadline: Duration,
    pub poll: Duration,
    /// Restarts allowed, after crashes and preemptions together.
    pub max_restarts: u32,
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Checkpoints kept in the store and in the local directory.
    pub keep: usize,
    /// How long uploads are retried once the run has ended before giving up.
    pub store_wait: Duration,
    /// Watch GPUs through NVML (off: CPU-only mode).
    pub gpu: bool,
    /// More variables for the command (a tuner's parameters, a slot's device).
    pub env: Vec<(String, String)>,
    /// Where the command's stdout and stderr go (appended); `None`: the supervisor's own.
    pub log: Option<PathBuf>,
}

/// Watches a run from outside (a tuner) and may end it early.
pub trait Observer {
    /// A segment's command started as process (and group) `pid`, resuming from a checkpoint
    /// at `resumed_from`; the segment is billed from `since` (its [`Segment::started`]).
    fn started(
        &mut self,
        _attempt: u32,
        _pid: u32,
        _resumed_from: Option<u64>,
        _since: SystemTime,
    ) {
    }
    /// The metrics lines since the last call, every tick (often none): `true` asks the
    /// command to checkpoint and stop, and the run ends [`Ending::Paused`].
    fn watch(&mut self, _steps: &[StepMetrics]) -> bool {
        false
    }
}

/// No observer: `frugal train`.
impl Observer for () {}

/// One life of the command.
#[derive(Debug, Clone)]
pub struct Segment {
    pub attempt: u32,
    /// From the end of the previous segment (or the supervisor's start): the machine is paid
    /// for the restart too.
    pub started: SystemTime,
    pub ended: SystemTime,
    pub outcome: Outcome,
    /// How it ended, in words ("exit 0", "killed by SIGKILL", "aws notice: terminate").
    pub cause: String,
    pub resumed_from: Option<u64>,
    /// The newest checkpoint published when it ended.
    pub last_checkpoint: Option<u64>,
    pub first_step: Option<u64>,
    pub last_step: Option<u64>,
    /// Work to be redone plus the restart's overhead before the first step.
    pub lost: Duration,
    pub utilization: Option<f64>,
    pub diagnoses: Vec<Diagnosis>,
    /// Model FLOPs utilization over the segment's steps.
    pub mfu: Option<f64>,
    pub precision: Option<Precision>,
    /// Shares of step time spent waiting on data and on host syncs.
    pub data_stall: Option<f64>,
    pub sync_stall: Option<f64>,
}

impl Segment {
    pub fn duration(&self) -> Duration {
        self.ended.duration_since(self.started).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Completed,
    /// Stopped by a signal to the supervisor with its progress saved: run it again to resume.
    Stopped,
    /// Stopped when its [`Observer`] asked, with its progress saved.
    Paused,
}

#[derive(Debug)]
pub struct Summary {
    pub ending: Ending,
    pub segments: Vec<Segment>,
    /// The newest checkpoint in the store at the end.
    pub stored: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("cannot start `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot prepare the checkpoint directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the restart budget ({budget}) is spent: the last segment ended with {cause}; \
         the newest checkpoint is {checkpoint}"
    )]
    BudgetSpent {
        budget: u32,
        cause: String,
        checkpoint: String,
    },
    #[error(
        "checkpoint {step} could not be copied to the store within {waited:?} ({why}); \
         it is kept in {dir}"
    )]
    StoreBehind {
        step: u64,
        waited: Duration,
        why: String,
        dir: PathBuf,
    },
    #[error("cannot record segment {attempt} in the ledger: {why}")]
    Record { attempt: u32, why: String },
    #[error(transparent)]
    Store(#[from] frugal_cloud::store::StoreError),
    #[error("cannot listen for signals")]
    Signals(#[source] std::io::Error),
}

/// Why a stop was asked for.
#[derive(Debug, Clone)]
enum StopReason {
    /// The cloud takes the machine: restart once the notice clears.
    Notice(Notice),
    /// SIGTERM or SIGINT to the supervisor: stop for good.
    Signal(&'static str),
    /// The observer asked: stop for good.
    Asked,
}

#[derive(Debug)]
struct Stopping {
    reason: StopReason,
    deadline: Instant,
    /// The newest checkpoint when the checkpoint signal went out.
    before: Option<u64>,
    terminated_at: Option<Instant>,
    killed: bool,
}

/// Runs the command to completion, through crashes and preemptions.
pub async fn supervise<S: NoticeSource + 'static>(
    plan: &Plan,
    store: CheckpointStore,
    source: Option<S>,
    mut record: impl FnMut(&Segment) -> Result<(), String>,
    observer: &mut dyn Observer,
) -> Result<Summary, SuperviseError> {
    let dir_err = |path: &Path| {
        let path = path.to_owned();
        move |source| SuperviseError::Dir { path, source }
    };
    std::fs::create_dir_all(&plan.checkpoint_dir).map_err(dir_err(&plan.checkpoint_dir))?;
    if let Some(parent) = plan.metrics.parent() {
        std::fs::create_dir_all(parent).map_err(dir_err(parent))?;
    }
    let mut signals = Signals::new()?;
    let notices = source.map(|s| NoticeWatcher::spawn(s, plan.poll));
    let stored = store.complete().await?.first().map(|m| m.step);
    let uploader = Uploader::spawn(
        store.clone(),
        plan.keep,
        plan.checkpoint_dir.clone(),
        stored,
    );
    let mut watchdog = Watchdog::new(plan.gpu).with_peak(plan.peak.clone());
    tracing::info!(
        "run {}: checkpoints in {}, store {}, accelerator watch {}",
        plan.run_id,
        plan.checkpoint_dir.display(),
        store.describe(),
        watchdog.mode()
    );

    let mut segments: Vec<Segment> = Vec::new();
    let mut bad: BTreeSet<u64> = BTreeSet::new();
    let mut backoff = plan.backoff;
    let mut started = SystemTime::now();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        clear_partial(&plan.checkpoint_dir);
        let resume = resume_point(&plan.checkpoint_dir, &store, &bad).await?;
        let mut life = Life::start(plan, attempt, resume.as_ref(), &mut watchdog)?;
        observer.started(
            attempt,
            life.pid.as_raw().unsigned_abs(),
            life.resumed_from,
            started,
        );
        let status = life
            .run(
                plan,
                &mut signals,
                notices.as_ref(),
                &uploader,
                &mut watchdog,
                observer,
            )
            .await;
        let segment = life.finish(started, attempt, status, &watchdog);
        tracing::info!(
            "segment {} ended: {} after {:.1} s (steps {}..{}, checkpoint {}, lost {:.1} s)",
            segment.attempt,
            segment.cause,
            segment.duration().as_secs_f64(),
            fmt_opt(segment.first_step),
            fmt_opt(segment.last_step),
            fmt_opt(segment.last_checkpoint),
            segment.lost.as_secs_f64()
        );
        record(&segment).map_err(|why| SuperviseError::Record { attempt, why })?;
        started = segment.ended;
        // A segment that died before its first step after resuming blames the checkpoint.
        if segment.outcome == Outcome::Failed
            && segment.first_step.is_none()
            && let Some(step) = segment.resumed_from
        {
            tracing::warn!(
                "checkpoint {step} did not get the command going; resuming from an older one next"
            );
            bad.insert(step);
        }
        let outcome = segment.outcome;
        let reason = life.stopping.map(|s| s.reason);
        segments.push(segment);
        let ending = match (outcome, &reason) {
            (Outcome::Completed, _) => Some(Ending::Completed),
            (_, Some(StopReason::Signal(_))) => Some(Ending::Stopped),
            (_, Some(StopReason::Asked)) => Some(Ending::Paused),
            _ => None,
        };
        if let Some(ending) = ending {
            let stored = uploader
                .flush(plan, Instant::now() + plan.store_wait)
                .await?;
            return Ok(Summary {
                ending,
                segments,
                stored,
            });
        }
        if let Some(StopReason::Notice(notice)) = reason {
            // Save what can be saved before the machine goes, then see whether it does.
            let deadline = instant_of(notice.deadline);
            if let Err(e) = uploader
                .flush(plan, deadline.max(Instant::now() + plan.poll))
                .await
            {
                tracing::warn!("{e}");
            }
            if let Some(n) = &notices {
                // One last look, for a withdrawal the last poll has not seen yet; a notice
                // that stands ends the run now, not at its deadline: whatever restarts runs
                // learns at once that this one may go on elsewhere.
                let look = (Instant::now() + plan.poll.min(LAST_LOOK)).min(deadline);
                if !withdrawn(n, &mut signals, look).await {
                    n.acknowledge_before(notice, (Instant::now() + ACK_WAIT).min(deadline))
                        .await;
                    let stored = uploader.state.borrow().stored;
                    tracing::info!(
                        "the notice stands: stopping here with checkpoint {} in the store",
                        fmt_opt(stored)
                    );
                    return Ok(Summary {
                        ending: Ending::Stopped,
                        segments,
                        stored,
                    });
                }
                tracing::info!(
                    "the {} notice was withdrawn before its deadline: the machine stays, \
                     restarting here",
                    notice.cloud
                );
            }
        }
        if attempt > plan.max_restarts {
            let last = segments.last();
            // Keep what the store has: the error says where the work stands.
            let stored = uploader
                .flush(plan, Instant::now() + plan.store_wait)
                .await
                .ok()
                .flatten();
            return Err(SuperviseError::BudgetSpent {
                budget: plan.max_restarts,
                cause: last.map_or_else(String::new, |s| s.cause.clone()),
                checkpoint: stored.map_or_else(|| "none".into(), |s| format!("step {s}")),
            });
        }
        if outcome == Outcome::Failed {
            tracing::info!("restarting in {:.1} s", backoff.as_secs_f64());
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(plan.max_backoff);
        } else {
            backoff = plan.backoff;
        }
    }
}

/// The newest usable checkpoint: the local directory's, or the store's restored into it.
async fn resume_point(
    dir: &Path,
    store: &CheckpointStore,
    bad: &BTreeSet<u64>,
) -> Result<Option<(u64, PathBuf)>, SuperviseError> {
    let local = local_checkpoints(dir)
        .unwrap_or_default()
        .into_iter()
        .rfind(|(s, _)| !bad.contains(s));
    let stored = store
        .complete()
        .await?
        .into_iter()
        .map(|m| m.step)
        .find(|s| !bad.contains(s));
    match (local, stored) {
        (Some(l), s) if s.is_none_or(|s| s <= l.0) => Ok(Some(l)),
        (_, None) => Ok(None),
        (_, Some(_)) => {
            let restored = store.restore_newest(dir).await?;
            if let Some((m, path)) = &restored {
                tracing::info!("restored checkpoint {} from {}", m.step, store.describe());
                return Ok(Some((m.step, path.clone())));
            }
            Ok(None)
        }
    }
}

/// Removes what a crash left half-written (`.tmp-*`, `.restore-*`): it is never used.
fn clear_partial(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with('.') {
            let path = e.path();
            let gone = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if let Err(err) = gone {
                tracing::warn!(
                    "cannot remove the partial checkpoint {}: {err}",
                    path.display()
                );
            }
        }
    }
}

/// One running segment.
struct Life {
    child: tokio::process::Child,
    pid: Pid,
    spawned: Instant,
    resumed_from: Option<u64>,
    metrics: MetricsTail,
    first_step: Option<(u64, Instant)>,
    last_step: Option<u64>,
    /// Checkpoints published in this segment, with when they were seen.
    published: BTreeMap<u64, Instant>,
    known: BTreeSet<u64>,
    stopping: Option<Stopping>,
    rebalanced: bool,
    diagnoses: Vec<Diagnosis>,
}

impl Life {
    fn start(
        plan: &Plan,
        attempt: u32,
        resume: Option<&(u64, PathBuf)>,
        watchdog: &mut Watchdog,
    ) -> Result<Life, SuperviseError> {
        let command = plan
            .command
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let spawn_err = |source| SuperviseError::Spawn {
            command: command.clone(),
            source,
        };
        let (program, args) = plan
            .command
            .split_first()
            .ok_or_else(|| spawn_err(std::io::Error::other("no command given")))?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .env(contract::RUN_ID, &plan.run_id)
            .env(contract::ATTEMPT, attempt.to_string())
            .env(contract::CHECKPOINT_DIR, &plan.checkpoint_dir)
            .env(contract::METRICS, &plan.metrics)
            .env(contract::CHECKPOINT_SIGNAL, plan.checkpoint_signal.as_str())
            .env_remove(contract::RESUME_FROM)
            // Its own process group: a terminal's Ctrl-C reaches the supervisor, which stops
            // the command cleanly, and a stop reaches the command's workers too.
            .process_group(0);
        for (k, v) in &plan.env {
            cmd.env(k, v);
        }
        if let Some(path) = &plan.log {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| SuperviseError::Dir {
                    path: path.clone(),
                    source,
                })?;
            let err = file.try_clone().map_err(spawn_err)?;
            cmd.stdout(file).stderr(err);
        }
        if let Some((step, path)) = resume {
            tracing::info!("segment {attempt}: resuming from checkpoint {step}");
            cmd.env(contract::RESUME_FROM, path);
        }
        let metrics = MetricsTail::new(&plan.metrics);
        let child = cmd.spawn().map_err(spawn_err)?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| spawn_err(std::io::Error::other("the command exited at once")))?;
        watchdog.start_segment(pid.as_raw());
        let known = local_checkpoints(&plan.checkpoint_dir)
            .unwrap_or_default()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        Ok(Life {
            child,
            pid,
            spawned: Instant::now(),
            resumed_from: resume.map(|(s, _)| *s),
            metrics,
            first_step: None,
            last_step: None,
            published: BTreeMap::new(),
            known,
            stopping: None,
            rebalanced: false,
            diagnoses: Vec::new(),
        })
    }

    async fn run(
        &mut self,
        plan: &Plan,
        signals: &mut Signals,
        notices: Option<&NoticeWatcher>,
        uploader: &Uploader,
        watchdog: &mut Watchdog,
        observer: &mut dyn Observer,
    ) -> std::io::Result<ExitStatus> {
        let mut changes = Changes::of(notices);
        loop {
            let tick = if self.stopping.is_some() {
                STOP_TICK
            } else {
                TICK
            };
            tokio::select! {
                status = self.child.wait() => {
                    self.scan(plan, uploader, watchdog, observer);
                    return status;
                }
                () = tokio::time::sleep(tick) => {
                    if self.scan(plan, uploader, watchdog, observer) && self.stopping.is_none() {
                        self.begin_stop(plan, StopReason::Asked, Instant::now() + plan.term_deadline);
                    }
                    self.advance_stop(plan);
                }
                notice = changes.next() => {
                    if let Some(n) = notice {
                        self.on_notice(plan, n);
                    }
                }
                sig = signals.next() => match sig {
                    Incoming::Stop(name) if self.stopping.is_none() => {
                        tracing::info!("{name}: checkpointing and stopping the command");
                        self.begin_stop(plan, StopReason::Signal(name), Instant::now() + plan.term_deadline);
                    }
                    Incoming::Stop(name) => {
                        tracing::warn!("{name} again: stopping the command now");
                        self.signal_group(Signal::SIGKILL);
                    }
                    Incoming::Forward(sig) => {
                        let _ = kill(self.pid, sig);
                    }
                },
            }
        }
    }

    fn on_notice(&mut self, plan: &Plan, notice: Notice) {
        match notice.action {
            Action::Terminate if self.stopping.is_none() => {
                let left = notice
                    .deadline
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                tracing::warn!(
                    "{} notice: {} ({:.0} s left): checkpointing and stopping the command",
                    notice.cloud,
                    notice.detail,
                    left.as_secs_f64()
                );
                let deadline = instant_of(notice.deadline);
                self.begin_stop(plan, StopReason::Notice(notice), deadline);
            }
            Action::Rebalance if !self.rebalanced => {
                tracing::info!(
                    "{} rebalance recommendation: asking for a checkpoint, the command goes on",
                    notice.cloud
                );
                self.rebalanced = true;
                let _ = kill(self.pid, plan.checkpoint_signal);
            }
            _ => {}
        }
    }

    fn begin_stop(&mut self, plan: &Plan, reason: StopReason, deadline: Instant) {
        // From the directory, not from the last scan: a checkpoint published since is not
        // the one asked for.
        let before = local_checkpoints(&plan.checkpoint_dir)
            .unwrap_or_default()
            .last()
            .map(|(s, _)| *s)
            .max(self.known.last().copied());
        let _ = kill(self.pid, plan.checkpoint_signal);
        self.stopping = Some(Stopping {
            reason,
            deadline,
            before,
            terminated_at: None,
            killed: false,
        });
        self.advance_stop(plan);
    }

    /// Asks, then tells, then forces: SIGTERM once the checkpoint is out or time is short,
    /// SIGKILL after the grace (or at the deadline).
    fn advance_stop(&mut self, plan: &Plan) {
        let now = Instant::now();
        let newest = self.known.last().copied();
        let Some(stop) = &mut self.stopping else {
            return;
        };
        let mut send = None;
        match stop.terminated_at {
            None => {
                let checkpointed = newest > stop.before;
                let last_call = stop
                    .deadline
                    .checked_sub(plan.stop_grace)
                    .is_none_or(|t| now >= t);
                if checkpointed || last_call {
                    if !checkpointed {
                        tracing::warn!("no checkpoint before the deadline: stopping without one");
                    }
                    stop.terminated_at = Some(now);
                    send = Some(Signal::SIGTERM);
                }
            }
            Some(at) if !stop.killed && (now >= at + plan.stop_grace || now >= stop.deadline) => {
                stop.killed = true;
                send = Some(Signal::SIGKILL);
            }
            Some(_) => {}
        }
        if let Some(sig) = send {
            self.signal_group(sig);
        }
    }

    fn signal_group(&self, sig: Signal) {
        let _ = killpg(self.pid, sig);
    }

    /// New checkpoints go to the uploader; new step metrics to the observer and the
    /// watchdog. `true`: the observer asks for a stop.
    fn scan(
        &mut self,
        plan: &Plan,
        uploader: &Uploader,
        watchdog: &mut Watchdog,
        observer: &mut dyn Observer,
    ) -> bool {
        let now = Instant::now();
        for (step, path) in local_checkpoints(&plan.checkpoint_dir).unwrap_or_default() {
            if self.known.insert(step) {
                self.published.insert(step, now);
                uploader.send(step, path);
            }
        }
        let steps = self.metrics.read_new();
        if let Some(first) = steps.first() {
            self.first_step.get_or_insert((first.step, now));
        }
        if let Some(last) = steps.last() {
            self.last_step = Some(last.step);
        }
        let stop = observer.watch(&steps);
        watchdog.sample(steps);
        if let Some(d) = watchdog.news() {
            tracing::warn!("{d}");
            self.diagnoses.push(d);
        }
        stop
    }

    fn finish(
        &mut self,
        started: SystemTime,
        attempt: u32,
        status: std::io::Result<ExitStatus>,
        watchdog: &Watchdog,
    ) -> Segment {
        // The command is gone; its workers must not outlive it.
        self.signal_group(Signal::SIGKILL);
        let ended_at = Instant::now();
        let ended = SystemTime::now();
        let exit = match &status {
            Ok(s) => describe_exit(*s),
            Err(e) => format!("lost track of it ({e})"),
        };
        let success = status.as_ref().is_ok_and(ExitStatus::success);
        let (outcome, cause) = match (&self.stopping, success) {
            (None, true) => (Outcome::Completed, exit),
            (None, false) => (Outcome::Failed, exit),
            (Some(s), _) => {
                let why = match &s.reason {
                    StopReason::Notice(n) => format!("{} notice: {}", n.cloud, n.detail),
                    StopReason::Signal(name) => (*name).to_owned(),
                    StopReason::Asked => "stopped by its observer".to_owned(),
                };
                let outcome = match s.reason {
                    StopReason::Notice(_) => Outcome::Preempted,
                    StopReason::Signal(_) | StopReason::Asked => Outcome::Stopped,
                };
                (outcome, format!("{why}, then {exit}"))
            }
        };
        let spawned_wall = ended - ended_at.duration_since(self.spawned);
        // Overhead of a restart: from the segment's start to its first step.
        let overhead = if attempt > 1 || self.resumed_from.is_some() {
            match self.first_step {
                Some((_, at)) => {
                    at.duration_since(self.spawned)
                        + spawned_wall.duration_since(started).unwrap_or_default()
                }
                None => ended.duration_since(started).unwrap_or_default(),
            }
        } else {
            Duration::ZERO
        };
        // Work since the newest checkpoint is done again by the next segment.
        let redo = if outcome == Outcome::Completed {
            Duration::ZERO
        } else {
            let since = self
                .published
                .last_key_value()
                .map(|(_, at)| *at)
                .or(self.first_step.map(|(_, at)| at))
                .unwrap_or(ended_at);
            ended_at.duration_since(since)
        };
        let duration = ended.duration_since(started).unwrap_or_default();
        Segment {
            attempt,
            started,
            ended,
            outcome,
            cause,
            resumed_from: self.resumed_from,
            last_checkpoint: self.known.last().copied(),
            first_step: self.first_step.map(|(s, _)| s),
            last_step: self.last_step,
            lost: (overhead + redo).min(duration),
            utilization: watchdog.utilization(),
            diagnoses: std::mem::take(&mut self.diagnoses),
            mfu: watchdog.mfu(),
            precision: watchdog.segment().precision,
            data_stall: watchdog.segment().data_stall(),
            sync_stall: watchdog.segment().sync_stall(),
        }
    }
}

fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(s) => format!("killed by {}", s.as_str()),
            Err(_) => format!("killed by signal {sig}"),
        },
        (None, None) => "an unknown exit".into(),
    }
}

fn fmt_opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn instant_of(t: SystemTime) -> Instant {
    let now = Instant::now();
    match t.duration_since(SystemTime::now()) {
        Ok(left) => now + left,
        Err(_) => now,
    }
}

enum Incoming {
    /// Stop the command cleanly (SIGTERM, SIGINT).
    Stop(&'static str),
    /// Pass on to the command.
    Forward(Signal),
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals, SuperviseError> {
        let on = |k| signal(k).map_err(SuperviseError::Signals);
        Ok(Signals {
            term: on(SignalKind::terminate())?,
            int: on(SignalKind::interrupt())?,
            hup: on(SignalKind::hangup())?,
            usr1: on(SignalKind::user_defined1())?,
            usr2: on(SignalKind::user_defined2())?,
        })
    }

    async fn next(&mut self) -> Incoming {
        tokio::select! {
            _ = self.term.recv() => Incoming::Stop("SIGTERM"),
            _ = self.int.recv() => Incoming::Stop("SIGINT"),
            _ = self.hup.recv() => Incoming::Forward(Signal::SIGHUP),
            _ = self.usr1.recv() => Incoming::Forward(Signal::SIGUSR1),
            _ = self.usr2.recv() => Incoming::Forward(Signal::SIGUSR2),
        }
    }
}

/// Waits until no termination notice stands: `true`; `false` if told to stop meanwhile.
async fn withdrawn(notices: &NoticeWatcher, signals: &mut Signals, until: Instant) -> bool {
    let withdrawn = notices.withdrawn_by(until);
    tokio::pin!(withdrawn);
    loop {
        tokio::select! {
            w = &mut withdrawn => return w,
            sig = signals.next() => {
                if let Incoming::Stop(name) = sig {
                    tracing::info!("{name} while the notice stands: stopping");
                    return false;
                }
            }
        }
    }
}

/// Copies checkpoints to the store on its own task, newest first: while the store is away
/// only the newest waiting checkpoint is kept in line, and it is retried with backoff.
struct Uploader {
    queue: mpsc::UnboundedSender<(u64, PathBuf)>,
    state: watch::Receiver<UploadState>,
}

#[derive(Debug, Clone, Default)]
struct UploadState {
    /// The newest checkpoint in the store.
    stored: Option<u64>,
    /// The last upload error, while the store fails.
    failing: Option<String>,
}

impl Uploader {
    fn spawn(store: CheckpointStore, keep: usize, local: PathBuf, stored: Option<u64>) -> Uploader {
        let (queue, mut rx) = mpsc::unbounded_channel::<(u64, PathBuf)>();
        let (tx, state) = watch::channel(UploadState {
            stored,
            failing: None,
        });
        tokio::spawn(async move {
            let mut next = None;
            loop {
                let Some(mut job) = next.take().or(rx.recv().await) else {
                    return;
                };
                while let Ok(newer) = rx.try_recv() {
                    job = newer;
                }
                let (step, dir) = job;
                let mut delay = Duration::from_millis(250);
                let mut tries = 0u32;
                while dir.exists() {
                    match store.upload(step, &dir).await {
                        Ok(_) => {
                            if tries > 0 {
                                tracing::info!(
                                    "checkpoint {step} stored after {tries} failed tries"
                                );
                            }
                            if let Err(e) = store.prune(keep).await {
                                tracing::warn!("cannot prune the store: {e}");
                            }
                            prune_local(&local, step, keep);
                            // Said stored once pruned too: a flush that returns lets the
                            // process exit at once, and --keep must hold then.
                            tx.send_modify(|s| {
                                s.stored = s.stored.max(Some(step));
                                s.failing = None;
                            });
                            break;
                        }
                        Err(e) => {
                            tries += 1;
                            if tries == 1 || tries.is_multiple_of(20) {
                                tracing::warn!(
                                    "cannot store checkpoint {step} (try {tries}, retrying): {e}"
                                );
                            }
                            tx.send_modify(|s| s.failing = Some(e.to_string()));
                            // A newer checkpoint takes this one's place in line.
                            tokio::select! {
                                () = tokio::time::sleep(delay) => {}
                                newer = rx.recv() => {
                                    next = newer;
                                    break;
                                }
                            }
                            delay = (delay * 2).min(Duration::from_secs(30));
                        }
                    }
                }
            }
        });
        Uploader { queue, state }
    }

    fn send(&self, step: u64, dir: PathBuf) {
        let _ = self.queue.send((step, dir));
    }

    /// Waits until the newest local checkpoint is in the store, or the deadline passes.
    async fn flush(&self, plan: &Plan, deadline: Instant) -> Result<Option<u64>, SuperviseError> {
        let newest = local_checkpoints(&plan.checkpoint_dir)
            .unwrap_or_default()
            .last()
            .map(|(s, _)| *s);
        let mut rx = self.state.clone();
        let started = Instant::now();
        loop {
            let state = rx.borrow_and_update().clone();
            if state.stored >= newest {
                return Ok(state.stored);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let step = newest.unwrap_or_default();
                return Err(SuperviseError::StoreBehind {
                    step,
                    waited: started.elapsed(),
                    why: state.failing.unwrap_or_else(|| "still uploading".into()),
                    dir: plan.checkpoint_dir.join(step.to_string()),
                });
            }
            let _ = tokio::time::timeout(left, rx.changed()).await;
        }
    }
}

/// Keeps the newest `keep` local checkpoints, and never one newer than what is stored.
fn prune_local(dir: &Path, stored: u64, keep: usize) {
    let all = local_checkpoints(dir).unwrap_or_default();
    let cut = all.len().saturating_sub(keep);
    for (step, path) in &all[..cut] {
        if *step < stored
            && let Err(e) = std::fs::remove_dir_all(path)
        {
            tracing::warn!("cannot remove old checkpoint {}: {e}", path.display());
        }
    }
}
