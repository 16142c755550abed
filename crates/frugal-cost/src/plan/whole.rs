//! The whole plan for one workload on one instance type: what to commit to, how the choice
//! did on the months it was not fitted on, and what interruptible work costs on spot. What
//! `frugal plan` prints, writes as JSON and draws.

use serde::Serialize;

use super::backtest::{Backtest, BacktestConfig, BacktestError, backtest};
use super::commit::{CommitPlan, CommitPrices, Sizing, plan_commitments};
use super::demand::HourlyDemand;
use super::size::{RightSizing, ZeroPlan};
use super::spot::{
    DeadlinePlan, Job, Policy, Replay, SpotError, SpotPrices, SpotTrace, TraceStats, plan_deadline,
    replay, young_daly_interval,
};
use crate::catalog::InstanceOffer;
use crate::ledger::{Ledger, LedgerError, Window};
use crate::money::Millis;

/// The recommended count per capacity type, as `--json` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Recommended {
    pub reserved_1y: Option<u32>,
    pub reserved_3y: Option<u32>,
    /// What on demand (or an autoscaled pool) must reach above the commitment.
    pub on_demand_peak: u32,
    /// Instances of interruptible work on spot (the spot section's run), where planned.
    pub spot: Option<u32>,
}

/// Spot for an interruptible run of `job` on a preemption trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpotPlan {
    pub trace: String,
    pub stats: TraceStats,
    pub job: Job,
    /// The checkpoint interval that minimizes expected cost: sqrt(2 x checkpoint x MTBF).
    pub young_daly_hours: Option<f64>,
    pub spot_only: Replay,
    pub on_demand: Replay,
    /// With a deadline: whether spot alone meets it, and the uniform-progress policy.
    pub deadline: Option<DeadlinePlan>,
}

/// Everything the planner says about one workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// Where the demand came from: a file, or the ledger's workload.
    pub source: String,
    pub instance_type: String,
    pub region: String,
    pub start_ms: Millis,
    /// The busiest hour's demand, and the mean of each hour's (in instances).
    pub peak: f64,
    pub mean: f64,
    pub recommended: Recommended,
    pub commitments: CommitPlan,
    /// Rolling fit/test windows for the cheapest term with a price.
    pub backtest: Option<Backtest>,
    pub spot: Option<SpotPlan>,
    /// The instance type per 1M tokens within the SLO, from bench runs on each.
    pub sizing: Option<RightSizing>,
    /// Scale to zero replayed on the workload's arrivals from the ledger.
    pub scale_to_zero: Option<ZeroPlan>,
    /// Hourly demand in whole instances, for the chart.
    pub hourly: Vec<u32>,
}

/// What to run on spot, and against what.
pub struct SpotAsk<'a> {
    pub trace: &'a SpotTrace,
    pub trace_name: String,
    /// The run; its checkpoint interval is replaced by Young/Daly's where the trace has
    /// preemptions to derive an MTBF from.
    pub job: Job,
    pub deadline_hours: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Backtest(#[from] BacktestError),
    #[error(transparent)]
    Spot(#[from] SpotError),
    #[error("{instance} has no spot price in the catalog: give one in a price file to plan spot")]
    NoSpotPrice { instance: String },
}

impl Plan {
    /// Plans `demand` on `offer`: every term the price file has, the backtest of the
    /// cheapest (with `windows`), and spot for `spot`.
    pub fn build(
        source: String,
        demand: &HourlyDemand,
        offer: &InstanceOffer,
        windows: Option<&BacktestConfig>,
        spot: Option<SpotAsk<'_>>,
    ) -> Result<Plan, PlanError> {
        // Windows the demand cannot hold are refused whether or not a term is priced.
        if let Some(config) = windows {
            config.fits(demand.len())?;
        }
        let prices = CommitPrices::from_offer(offer);
        let commitments = plan_commitments(demand, &prices, Sizing::Cheapest);
        // The term the backtest scores: the cheapest that was not refused.
        let term = [&commitments.reserved_1y, &commitments.reserved_3y]
            .into_iter()
            .flatten()
            .min_by_key(|o| o.window_cost);
        let backtest = match (windows, term) {
            (Some(config), Some(term)) => Some(backtest(
                demand,
                term.capacity,
                term.rate,
                prices.on_demand,
                config,
            )?),
            _ => None,
        };
        let spot = match spot {
            Some(ask) => Some(spot_plan(ask, offer)?),
            None => None,
        };
        let counts = commitments.counts();
        Ok(Plan {
            source,
            instance_type: offer.instance_type.clone(),
            region: offer.region.clone(),
            start_ms: demand.start_ms(),
            peak: demand.peak().iter().copied().fold(0.0, f64::max),
            mean: demand.peak().iter().sum::<f64>() / demand.len().max(1) as f64,
            recommended: Recommended {
                reserved_1y: counts.reserved_1y,
                reserved_3y: counts.reserved_3y,
                on_demand_peak: counts.on_demand_peak,
                spot: spot.as_ref().map(|_| 1),
            },
            commitments,
            backtest,
            spot,
            sizing: None,
            scale_to_zero: None,
            hourly: demand.instances(),
        })
    }
}

fn spot_plan(ask: SpotAsk<'_>, offer: &InstanceOffer) -> Result<SpotPlan, PlanError> {
    let spot = offer.spot.ok_or_else(|| PlanError::NoSpotPrice {
        instance: offer.instance_type.clone(),
    })?;
    let prices = SpotPrices {
        spot,
        on_demand: offer.on_demand,
    };
    let stats = ask.trace.stats();
    let young_daly_hours = stats
        .mtbf_hours
        .map(|mtbf| young_daly_interval(ask.job.checkpoint_hours, mtbf));
    let job = Job {
        interval_hours: young_daly_hours.unwrap_or(ask.job.interval_hours),
        ..ask.job
    };
    let spot_only = replay(ask.trace, &job, Policy::SpotOnly, &prices, 0.0)?;
    let on_demand = replay(ask.trace, &job, Policy::OnDemandOnly, &prices, 0.0)?;
    let deadline = match ask.deadline_hours {
        Some(hours) => Some(plan_deadline(ask.trace, &job, &prices, hours, 0.0)?),
        None => None,
    };
    Ok(SpotPlan {
        trace: ask.trace_name,
        stats,
        job,
        young_daly_hours,
        spot_only,
        on_demand,
        deadline,
    })
}

/// A workload's hourly demand from the ledger: the instance-hours its requests and training
/// segments held in each hour (idle time left out: autoscaling removes it, and committing
/// to it would pay for it for years), from its first hour to its last.
pub fn ledger_demand(
    ledger: &Ledger,
    workload: &str,
    window: Window,
) -> Result<Option<HourlyDemand>, LedgerError> {
    let names = ledger.names()?;
    let mut hours: std::collections::BTreeMap<Millis, Millis> = Default::default();
    ledger.rollups(window, |k, s| {
        let busy = matches!(
            k.kind,
            crate::event::Kind::Inference | crate::event::Kind::Training
        );
        if busy && names.get(k.workload) == workload {
            *hours.entry(k.hour_ms).or_default() += s.instance_ms;
        }
    })?;
    let (Some(&first), Some(&last)) = (hours.keys().next(), hours.keys().next_back()) else {
        return Ok(None);
    };
    let n = ((last - first) / super::HOUR_MS + 1) as usize;
    let mut series = vec![0.0; n];
    for (hour, ms) in hours {
        series[((hour - first) / super::HOUR_MS) as usize] = ms as f64 / super::HOUR_MS as f64;
    }
    Ok(HourlyDemand::from_hourly(first, series).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, Kind};
    use crate::money::Money;

    const T0: Millis = 1_792_998_000_000;

    #[test]
    fn ledger_demand_is_the_busy_instance_hours_of_the_workload_each_hour() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        let event = |ts: Millis, kind: Kind, workload: &str, minutes: i64| {
            let mut e = Event::new(ts, kind, workload, Money::from_cents(1));
            e.duration_ms = minutes * 60_000;
            e
        };
        let hour = super::super::HOUR_MS;
        ledger
            .append(
                "test",
                &[
                    event(T0, Kind::Inference, "chat", 30),
                    event(T0 + 60_000, Kind::Inference, "chat", 30),
                    // Idle time and other workloads are not demand.
                    event(T0, Kind::Idle, "chat", 60),
                    event(T0, Kind::Inference, "other", 60),
                    event(T0 + 2 * hour, Kind::Training, "chat", 15),
                ],
            )
            .unwrap();
        let d = ledger_demand(&ledger, "chat", Window::default())
            .unwrap()
            .unwrap();
        assert_eq!(d.start_ms(), T0);
        assert_eq!(d.peak(), [1.0, 0.0, 0.25]);
        assert_eq!(d.instances(), [1, 0, 1]);
        assert!(
            ledger_demand(&ledger, "nobody", Window::default())
                .unwrap()
                .is_none()
        );
    }
}
