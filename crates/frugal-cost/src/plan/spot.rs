//! Interruptible work on spot: how often a trace preempts, how often to checkpoint, and
//! what a run of `W` hours of work costs and when it finishes when replayed on the trace,
//! with or without a deadline.
//!
//! A replay steps through the trace tick by tick. Every start of an instance (the first one
//! too) pays `restart_hours` of boot and restore before work resumes; on spot, the run
//! writes a checkpoint after every `interval_hours` of work, which takes `checkpoint_hours`;
//! a preemption (spot gone at a tick) loses the work since the last finished checkpoint.
//! On demand nothing preempts, so work there is never at risk and is not checkpointed.
//! Leaving an instance on purpose (the deadline policy moving between spot and on demand)
//! checkpoints on the way out, a cost folded into the next start's restart, as the "Can't
//! Be Late" paper folds it into its changeover delay. Time on an instance is billed,
//! restarts and checkpoints included; time waiting for spot is not. A trace shorter than
//! the run repeats from its start.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cost_of_hours;
use crate::money::{HourlyRate, Money};

/// Work, in hours, within which a run counts as done: float sums of tick lengths.
const EPS: f64 = 1e-9;
/// A run on spot alone that has not finished after this many times its work is reported
/// unfinished: the trace offers spot too seldom, or in stretches too short to restart in.
const GIVE_UP_FACTOR: f64 = 100.0;

/// The preemption trace `frugal plan --spot-trace` defaults to, by its path in the
/// repository, compiled in so that the default works from any folder (the binary installs it
/// into its data folder when the path is not there).
pub const BUNDLED: &[(&str, &[u8])] = &[(
    "data/spot-traces/preemption/1-node/aws-04-22-2023/us-east-1c_v100_1.json",
    include_bytes!(
        "../../../../data/spot-traces/preemption/1-node/aws-04-22-2023/us-east-1c_v100_1.json"
    ),
)];

#[derive(Debug, thiserror::Error)]
pub enum SpotError {
    #[error("cannot read spot trace {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spot trace is not `{{\"metadata\": {{\"gap_seconds\": ..}}, \"data\": [..]}}`")]
    Json(#[source] serde_json::Error),
    #[error("spot trace: {0}")]
    Invalid(String),
    #[error("{name} must be {rule}, got {value}")]
    Parameter {
        name: &'static str,
        rule: &'static str,
        value: f64,
    },
    #[error(
        "the deadline ({deadline_hours} h) is shorter than the work plus one restart \
         ({needed_hours} h): no policy meets it"
    )]
    Deadline {
        deadline_hours: f64,
        needed_hours: f64,
    },
}

/// What a trace's value counts. The SkyPilot traces (see data/spot-traces/PROVENANCE.md)
/// are read two ways: their README says a value is the number of available instances,
/// while the authors' own simulator takes a 1 as "no spot" (`spot_available = not
/// trace[tick]`) and their availability collector writes 1 for a launch that failed. The
/// caller says which it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "counts", rename_all = "snake_case")]
pub enum TraceReading {
    /// A value counts nodes without spot: the run has spot at a tick whose value is 0.
    /// How the trace authors' simulator reads them.
    Unavailable,
    /// A value counts nodes with spot: the run has spot when it is at least `nodes`.
    /// How the trace repository's README describes them.
    Available { nodes: u32 },
}

/// Spot availability of the instances one run needs, tick by tick.
#[derive(Debug, Clone, PartialEq)]
pub struct SpotTrace {
    gap_hours: f64,
    up: Vec<bool>,
}

/// The file as the SkyPilot traces write it; other keys (some files carry `prices`) are
/// not read.
#[derive(Deserialize)]
struct RawTrace {
    metadata: RawMetadata,
    data: Vec<u32>,
}

#[derive(Deserialize)]
struct RawMetadata {
    gap_seconds: f64,
}

/// How often a trace preempts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TraceStats {
    pub hours: f64,
    /// Share of the trace with spot.
    pub available_share: f64,
    /// Spot lost from one tick to the next (the end wrapping to the start not counted).
    pub preemptions: u32,
    /// Hours with spot per preemption; `None` when spot is never lost.
    pub mtbf_hours: Option<f64>,
    /// Preemptions per hour on spot: 1 / MTBF.
    pub interruptions_per_hour: f64,
    /// Mean stretch without spot, in hours; `None` when spot never goes.
    pub mean_outage_hours: Option<f64>,
}

impl SpotTrace {
    /// A trace of `up` ticks (spot available or not), `gap_hours` apart.
    pub fn from_ticks(gap_hours: f64, up: Vec<bool>) -> Result<SpotTrace, SpotError> {
        if !(gap_hours.is_finite() && gap_hours > 0.0) {
            return Err(SpotError::Parameter {
                name: "the trace's tick",
                rule: "a positive number of hours",
                value: gap_hours,
            });
        }
        if up.is_empty() {
            return Err(SpotError::Invalid("no ticks".into()));
        }
        Ok(SpotTrace { gap_hours, up })
    }

    /// Parses a SkyPilot trace (`{"metadata": {"gap_seconds": 32}, "data": [0, 1, ..]}`).
    pub fn from_json(text: &str, reading: TraceReading) -> Result<SpotTrace, SpotError> {
        let raw: RawTrace = serde_json::from_str(text).map_err(SpotError::Json)?;
        let up = match reading {
            TraceReading::Unavailable => raw.data.iter().map(|&v| v == 0).collect(),
            TraceReading::Available { nodes: 0 } => {
                return Err(SpotError::Invalid("a run needs at least one node".into()));
            }
            TraceReading::Available { nodes } => raw.data.iter().map(|&v| v >= nodes).collect(),
        };
        SpotTrace::from_ticks(raw.metadata.gap_seconds / 3600.0, up)
    }

    pub fn read(path: &Path, reading: TraceReading) -> Result<SpotTrace, SpotError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpotError::Read {
            path: path.to_owned(),
            source,
        })?;
        SpotTrace::from_json(&text, reading)
    }

    pub fn gap_hours(&self) -> f64 {
        self.gap_hours
    }

    pub fn hours(&self) -> f64 {
        self.up.len() as f64 * self.gap_hours
    }

    /// Whether spot is there at tick `tick`, the trace repeating.
    fn up_at(&self, tick: usize) -> bool {
        self.up[tick % self.up.len()]
    }

    pub fn stats(&self) -> TraceStats {
        let up_ticks = self.up.iter().filter(|&&u| u).count();
        let preemptions = self.up.windows(2).filter(|w| w[0] && !w[1]).count() as u32;
        let outages = self
            .up
            .iter()
            .enumerate()
            .filter(|&(i, &u)| !u && (i == 0 || self.up[i - 1]))
            .count();
        let up_hours = up_ticks as f64 * self.gap_hours;
        let down_hours = self.hours() - up_hours;
        TraceStats {
            hours: self.hours(),
            available_share: up_ticks as f64 / self.up.len() as f64,
            preemptions,
            mtbf_hours: (preemptions > 0).then(|| up_hours / f64::from(preemptions)),
            interruptions_per_hour: if up_hours > 0.0 {
                f64::from(preemptions) / up_hours
            } else {
                0.0
            },
            mean_outage_hours: (outages > 0).then(|| down_hours / outages as f64),
        }
    }
}

/// The Young/Daly checkpoint interval, `sqrt(2 * checkpoint cost * MTBF)`: checkpointing
/// more often spends more time writing checkpoints, less often loses more work (half an
/// interval on average) to each preemption; this balances the two to first order.
pub fn young_daly_interval(checkpoint_hours: f64, mtbf_hours: f64) -> f64 {
    (2.0 * checkpoint_hours * mtbf_hours).sqrt()
}

/// A run to replay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Job {
    /// Hours of work on one instance with nothing lost.
    pub work_hours: f64,
    /// Time to write one checkpoint.
    pub checkpoint_hours: f64,
    /// Time from an instance's start to work resuming: boot, restore, warm-up.
    pub restart_hours: f64,
    /// Work between two checkpoints on spot.
    pub interval_hours: f64,
}

impl Job {
    fn check(&self) -> Result<(), SpotError> {
        let positive = |name, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(())
            } else {
                Err(SpotError::Parameter {
                    name,
                    rule: "a positive number of hours",
                    value,
                })
            }
        };
        let at_least_zero = |name, value: f64| {
            if value.is_finite() && value >= 0.0 {
                Ok(())
            } else {
                Err(SpotError::Parameter {
                    name,
                    rule: "a number of hours >= 0",
                    value,
                })
            }
        };
        positive("the work", self.work_hours)?;
        positive("the checkpoint interval", self.interval_hours)?;
        at_least_zero("the checkpoint cost", self.checkpoint_hours)?;
        at_least_zero("the restart time", self.restart_hours)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SpotPrices {
    pub spot: HourlyRate,
    pub on_demand: HourlyRate,
}

/// Which capacity a run uses, tick by tick.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Policy {
    /// Spot whenever the trace has it; wait otherwise.
    SpotOnly,
    /// On demand throughout.
    OnDemandOnly,
    /// The uniform progress policy of "Can't Be Late" (Wu et al., NSDI 2024) for a run that
    /// must finish within `deadline_hours` of its start. Progress is held against the line
    /// from nothing at the start to all the work one restart before the deadline. Spot is
    /// used whenever the trace has it; without spot the run waits while ahead of the line
    /// and runs on demand while behind it. Once on demand it leaves only for spot, and only
    /// when ahead of the line by one restart's worth, so the restart does not put it
    /// straight back behind (leaving on demand to wait would save no more than the restart
    /// back costs). When the time left is no more than the work left plus a restart and a
    /// tick, it moves to on demand for good: the slack is gone. Progress is what a
    /// checkpoint has secured, since work since the last one can still be lost.
    UniformProgress { deadline_hours: f64 },
}

/// A run replayed on a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replay {
    pub policy: Policy,
    /// Where in the trace the run started.
    pub start_hour: f64,
    pub finished: bool,
    /// Wall hours from the start to the end of the work (or to giving up).
    pub finish_hours: f64,
    pub spot_hours: f64,
    pub on_demand_hours: f64,
    pub cost: Money,
    /// Work done and then lost to preemptions.
    pub lost_work_hours: f64,
    pub preemptions: u32,
    pub checkpoints: u32,
    pub checkpoint_hours: f64,
    pub restarts: u32,
    pub restart_hours: f64,
    /// Hours with no instance: waiting for spot.
    pub waiting_hours: f64,
    /// Whether the run finished by the policy's deadline, for a policy that has one.
    pub deadline_met: Option<bool>,
}

impl Replay {
    /// This replay with whether it finished by `deadline_hours`, for a policy that does not
    /// aim at one (spot alone, on demand alone) shown beside one that does.
    pub fn against(self, deadline_hours: f64) -> Replay {
        let met = self.finished && self.finish_hours <= deadline_hours + EPS;
        Replay {
            deadline_met: Some(met),
            ..self
        }
    }
}

/// Where an instance of the run is bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Market {
    Spot,
    OnDemand,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Restarting(f64),
    Working,
    Checkpointing(f64),
}

/// A run in progress: one path for every policy.
struct Run<'a> {
    job: &'a Job,
    machine: Option<(Market, Phase)>,
    /// Work a checkpoint (or on-demand time) has secured.
    saved: f64,
    /// Work on spot since the last checkpoint.
    volatile: f64,
    /// The deadline policy has run out of slack.
    committed: bool,
    out: Replay,
}

impl Run<'_> {
    fn remaining(&self) -> f64 {
        self.job.work_hours - self.saved - self.volatile
    }

    /// Where the policy wants the run for the tick starting `t` hours in (`None`: wait).
    fn decide(&mut self, t: f64, up: bool, dt: f64) -> Option<Market> {
        let current = self.machine.map(|(c, _)| c);
        match self.out.policy {
            Policy::SpotOnly => up.then_some(Market::Spot),
            Policy::OnDemandOnly => Some(Market::OnDemand),
            Policy::UniformProgress { deadline_hours } => {
                let (work, restart) = (self.job.work_hours, self.job.restart_hours);
                let slack = deadline_hours - t - (work - self.saved);
                if slack <= restart + dt {
                    self.committed = true;
                }
                let line = |at: f64| work * (at / (deadline_hours - restart)).min(1.0);
                let on_demand = current == Some(Market::OnDemand);
                // A start on spot spends a restart of the slack; with no more than two
                // left, the next tick would leave for on demand and waste it.
                let spot_pays = current == Some(Market::Spot) || slack > 2.0 * restart + dt;
                if self.committed || (on_demand && !(up && self.saved >= line(t + restart))) {
                    Some(Market::OnDemand)
                } else if up && spot_pays {
                    Some(Market::Spot)
                } else {
                    (self.saved < line(t)).then_some(Market::OnDemand)
                }
            }
        }
    }

    /// Runs the machine for up to `dt` hours; returns the hours used (less than `dt` only
    /// when the work ends inside the tick).
    fn advance(&mut self, market: Market, mut phase: Phase, dt: f64) -> f64 {
        let job = self.job;
        let mut left = dt;
        while left > EPS && self.remaining() > EPS {
            phase = match phase {
                Phase::Restarting(r) => {
                    let s = r.min(left);
                    left -= s;
                    self.out.restart_hours += s;
                    if r - s > EPS {
                        Phase::Restarting(r - s)
                    } else {
                        Phase::Working
                    }
                }
                Phase::Working => {
                    let to_checkpoint = match market {
                        Market::Spot => job.interval_hours - self.volatile,
                        Market::OnDemand => f64::INFINITY,
                    };
                    let s = left.min(self.remaining()).min(to_checkpoint);
                    left -= s;
                    match market {
                        Market::Spot => self.volatile += s,
                        Market::OnDemand => self.saved += s,
                    }
                    if market == Market::Spot
                        && self.volatile >= job.interval_hours - EPS
                        && self.remaining() > EPS
                    {
                        Phase::Checkpointing(job.checkpoint_hours)
                    } else {
                        Phase::Working
                    }
                }
                Phase::Checkpointing(c) => {
                    let s = c.min(left);
                    left -= s;
                    self.out.checkpoint_hours += s;
                    if c - s > EPS {
                        Phase::Checkpointing(c - s)
                    } else {
                        self.saved += std::mem::take(&mut self.volatile);
                        self.out.checkpoints += 1;
                        Phase::Working
                    }
                }
            };
        }
        self.machine = Some((market, phase));
        dt - left
    }
}

/// Replays `job` under `policy` on `trace` from `start_hour` into it.
pub fn replay(
    trace: &SpotTrace,
    job: &Job,
    policy: Policy,
    prices: &SpotPrices,
    start_hour: f64,
) -> Result<Replay, SpotError> {
    job.check()?;
    let horizon = match policy {
        Policy::UniformProgress { deadline_hours } => {
            let needed_hours = job.work_hours + job.restart_hours;
            if deadline_hours.is_nan() || deadline_hours < needed_hours {
                return Err(SpotError::Deadline {
                    deadline_hours,
                    needed_hours,
                });
            }
            deadline_hours
        }
        _ => GIVE_UP_FACTOR * job.work_hours,
    };
    let dt = trace.gap_hours;
    let first_tick = (start_hour.max(0.0) / dt).floor() as usize;
    let mut run = Run {
        job,
        machine: None,
        saved: 0.0,
        volatile: 0.0,
        committed: false,
        out: Replay {
            policy,
            start_hour: first_tick as f64 * dt,
            finished: false,
            finish_hours: 0.0,
            spot_hours: 0.0,
            on_demand_hours: 0.0,
            cost: Money::ZERO,
            lost_work_hours: 0.0,
            preemptions: 0,
            checkpoints: 0,
            checkpoint_hours: 0.0,
            restarts: 0,
            restart_hours: 0.0,
            waiting_hours: 0.0,
            deadline_met: None,
        },
    };
    let mut t = 0.0;
    let mut tick = first_tick;
    // The deadline policy always finishes (it moves to on demand in time); the horizon
    // only bounds the others, with a tick to spare for float sums.
    while run.remaining() > EPS && t < horizon + dt {
        let up = trace.up_at(tick);
        tick += 1;
        if let (Some((Market::Spot, _)), false) = (run.machine, up) {
            run.out.lost_work_hours += std::mem::take(&mut run.volatile);
            run.out.preemptions += 1;
            run.machine = None;
        }
        let want = run.decide(t, up, dt);
        if want != run.machine.map(|(c, _)| c) {
            // Leaving on purpose checkpoints on the way out.
            run.saved += std::mem::take(&mut run.volatile);
            run.machine = want.map(|c| (c, Phase::Restarting(job.restart_hours)));
            run.out.restarts += u32::from(want.is_some());
        }
        let Some((market, phase)) = run.machine else {
            run.out.waiting_hours += dt;
            t += dt;
            continue;
        };
        let used = run.advance(market, phase, dt);
        match market {
            Market::Spot => run.out.spot_hours += used,
            Market::OnDemand => run.out.on_demand_hours += used,
        }
        t += used;
    }
    let mut out = run.out;
    out.finished = run.saved + run.volatile >= job.work_hours - EPS;
    out.finish_hours = t;
    out.cost = cost_of_hours(prices.spot, out.spot_hours)
        + cost_of_hours(prices.on_demand, out.on_demand_hours);
    if let Policy::UniformProgress { deadline_hours } = policy {
        out.deadline_met = Some(out.finished && t <= deadline_hours + EPS);
    }
    Ok(out)
}

/// The mean of replays from evenly spaced starts at one checkpoint interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IntervalCost {
    pub interval_hours: f64,
    /// Mean billed hours: work, checkpoints, restarts and lost work.
    pub mean_billed_hours: f64,
    pub mean_cost: Money,
    pub mean_finish_hours: f64,
    pub mean_lost_work_hours: f64,
    /// Starts whose run did not finish (see `GIVE_UP_FACTOR`); their partial cost is in
    /// the means.
    pub unfinished: u32,
}

/// The expected cost of `job` on spot alone at each checkpoint interval in `intervals`
/// (the job's own interval is ignored), as the mean over `starts` starts spread evenly over
/// the trace: a simulated sweep to hold the Young/Daly interval against.
pub fn sweep_intervals(
    trace: &SpotTrace,
    job: &Job,
    prices: &SpotPrices,
    intervals: &[f64],
    starts: usize,
) -> Result<Vec<IntervalCost>, SpotError> {
    let starts = starts.max(1);
    intervals
        .iter()
        .map(|&interval_hours| {
            let job = Job {
                interval_hours,
                ..*job
            };
            let mut sum = IntervalCost {
                interval_hours,
                mean_billed_hours: 0.0,
                mean_cost: Money::ZERO,
                mean_finish_hours: 0.0,
                mean_lost_work_hours: 0.0,
                unfinished: 0,
            };
            for i in 0..starts {
                let start = trace.hours() * i as f64 / starts as f64;
                let r = replay(trace, &job, Policy::SpotOnly, prices, start)?;
                sum.mean_billed_hours += r.spot_hours;
                sum.mean_cost += r.cost;
                sum.mean_finish_hours += r.finish_hours;
                sum.mean_lost_work_hours += r.lost_work_hours;
                sum.unfinished += u32::from(!r.finished);
            }
            let n = starts as f64;
            sum.mean_billed_hours /= n;
            sum.mean_finish_hours /= n;
            sum.mean_lost_work_hours /= n;
            sum.mean_cost = sum
                .mean_cost
                .mul_div(1, starts as i128)
                .unwrap_or(sum.mean_cost);
            Ok(sum)
        })
        .collect()
}

/// A run with a deadline: spot alone, the uniform progress policy and on demand alone, all
/// from the same start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadlinePlan {
    pub deadline_hours: f64,
    pub spot_only: Replay,
    /// Whether spot alone finishes by the deadline.
    pub spot_only_meets: bool,
    pub uniform_progress: Replay,
    pub on_demand: Replay,
}

/// Replays `job` against a deadline of `deadline_hours` from `start_hour` into `trace`.
pub fn plan_deadline(
    trace: &SpotTrace,
    job: &Job,
    prices: &SpotPrices,
    deadline_hours: f64,
    start_hour: f64,
) -> Result<DeadlinePlan, SpotError> {
    let uniform_progress = replay(
        trace,
        job,
        Policy::UniformProgress { deadline_hours },
        prices,
        start_hour,
    )?;
    let spot_only =
        replay(trace, job, Policy::SpotOnly, prices, start_hour)?.against(deadline_hours);
    Ok(DeadlinePlan {
        deadline_hours,
        spot_only_meets: spot_only.deadline_met == Some(true),
        spot_only,
        uniform_progress,
        on_demand: replay(trace, job, Policy::OnDemandOnly, prices, start_hour)?
            .against(deadline_hours),
    })
}

#[cfg(test)]
mod tests;
