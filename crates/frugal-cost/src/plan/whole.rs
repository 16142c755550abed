//! The whole plan for one workload on one instance type: what to commit to, how the choice
//! did on the months it was not fitted on, and what interruptible work costs on spot. What
//! `frugal plan` prints, writes as JSON and draws.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use super::backtest::{Backtest, BacktestConfig, BacktestError, backtest};
use super::commit::{CommitPlan, CommitPrices, Sizing, plan_commitments};
use super::demand::{HourlyDemand, MAX_HOURS};
use super::size::{RightSizing, ZeroPlan};
use super::spot::{
    DeadlinePlan, Job, Policy, Replay, SpotError, SpotPrices, SpotTrace, TraceStats, plan_deadline,
    replay, young_daly_interval,
};
use crate::catalog::{InstanceOffer, ReservedBasis};
use crate::event::Kind;
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
    /// What the reserved prices rest on: the instance's own, its cloud's average discount,
    /// or an assumed one; `None` when no reserved price is known.
    pub reserved_basis: Option<ReservedBasis>,
    /// The same, in words for a reader.
    pub reserved_rests_on: Option<String>,
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
            reserved_basis: offer.reserved_basis,
            reserved_rests_on: offer.reserved_basis.map(ReservedBasis::describe),
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
    let mut spot_only = replay(ask.trace, &job, Policy::SpotOnly, &prices, 0.0)?;
    let mut on_demand = replay(ask.trace, &job, Policy::OnDemandOnly, &prices, 0.0)?;
    let deadline = match ask.deadline_hours {
        Some(hours) => {
            // Every row of the table says whether it met the deadline.
            spot_only = spot_only.against(hours);
            on_demand = on_demand.against(hours);
            Some(plan_deadline(ask.trace, &job, &prices, hours, 0.0)?)
        }
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

/// A workload's demand as the ledger holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerDemand {
    /// Instances busy each hour; `None` when the workload held no machine time.
    pub demand: Option<HourlyDemand>,
    /// Requests to per-token APIs (rows with no instance type): they hold no instance, so
    /// they are no demand for one, and are left out.
    pub per_token_requests: u64,
}

/// A workload's hourly demand from the ledger, in machine time, not request time: what
/// its machines were busy each hour, from its first hour to its last (idle time left out:
/// autoscaling removes it, and committing to it would pay for it for years).
///
/// - Replicas that write spans (pools, watched servers): the spans' busy time, replica by
///   replica, so concurrent requests on one replica count once.
/// - Requests on a machine without spans (the gateway's own engine), by machine (model and
///   instance type) and hour: summed, but never past the machine's instances, as a batched
///   server's overlapping requests share it.
/// - Training segments: their instances for their duration.
/// - Requests to per-token APIs hold no instance: counted apart, not demand.
///
/// Only the latest [`MAX_HOURS`] are kept: an event at an absurd time would otherwise size
/// the series by the whole span.
pub fn ledger_demand(
    ledger: &Ledger,
    workload: &str,
    window: Window,
) -> Result<LedgerDemand, LedgerError> {
    let hour = super::HOUR_MS;
    let names = ledger.names()?;
    let mut hours: BTreeMap<Millis, Millis> = BTreeMap::new();
    // The served names whose replicas write spans: their requests are in the spans.
    let mut spanned: HashSet<String> = HashSet::new();
    ledger.spans(window, |s| {
        if s.workload == workload {
            spanned.insert(s.pool.clone());
            *hours.entry(s.ts_ms - s.ts_ms.rem_euclid(hour)).or_default() += s.busy_ms.max(0);
        }
    })?;
    // (hour, model, instance) -> (instance-ms, ms) of requests on machines without spans.
    let mut machines: HashMap<(Millis, u32, u32), (Millis, Millis)> = HashMap::new();
    let mut per_token_requests = 0u64;
    ledger.rollups(window, |k, s| {
        if names.get(k.workload) != workload {
            return;
        }
        match k.kind {
            Kind::Training => *hours.entry(k.hour_ms).or_default() += s.instance_ms,
            Kind::Inference if k.instance == 0 => {
                per_token_requests += u64::try_from(s.requests).unwrap_or(0);
            }
            Kind::Inference if !spanned.contains(names.get(k.model)) => {
                let m = machines
                    .entry((k.hour_ms, k.model, k.instance))
                    .or_default();
                m.0 = m.0.saturating_add(s.instance_ms);
                m.1 = m.1.saturating_add(s.duration_ms);
            }
            _ => {}
        }
    })?;
    for ((hour_ms, _, _), (instance_ms, ms)) in machines {
        // The machine's instances: what its rows ran on (1 for a server's requests).
        let instances = if ms > 0 {
            (instance_ms.saturating_add(ms - 1) / ms).max(1)
        } else {
            1
        };
        *hours.entry(hour_ms).or_default() += instance_ms.min(hour.saturating_mul(instances));
    }
    let demand = match hours.keys().next_back() {
        None => None,
        Some(&last) => {
            let oldest = last.saturating_sub((MAX_HOURS as Millis - 1) * hour);
            hours.retain(|&h, _| h >= oldest);
            let first = hours.keys().next().copied().unwrap_or(last);
            let mut series = vec![0.0; ((last - first) / hour + 1) as usize];
            for (h, ms) in hours {
                series[((h - first) / hour) as usize] = ms as f64 / hour as f64;
            }
            HourlyDemand::from_hourly(first, series).ok()
        }
    };
    Ok(LedgerDemand {
        demand,
        per_token_requests,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, Kind, ReplicaSpan};
    use crate::money::Money;

    const T0: Millis = 1_792_998_000_000;

    fn event(ts: Millis, kind: Kind, workload: &str, minutes: i64) -> Event {
        let mut e = Event::new(ts, kind, workload, Money::from_cents(1));
        e.duration_ms = minutes * 60_000;
        e.instance_type = Some("g5.xlarge".into());
        e.model = Some("m".into());
        e.requests = 1;
        e
    }

    #[test]
    fn ledger_demand_is_the_busy_instance_hours_of_the_workload_each_hour() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
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
            .demand
            .unwrap();
        assert_eq!(d.start_ms(), T0);
        assert_eq!(d.peak(), [1.0, 0.0, 0.25]);
        assert_eq!(d.instances(), [1, 0, 1]);
        let nobody = ledger_demand(&ledger, "nobody", Window::default()).unwrap();
        assert_eq!(nobody.demand, None);
    }

    /// Issue 31: demand summed request wall time, so 8 streams batched on one server were 8
    /// instances, and calls to a per-token API counted though they hold none. It is machine
    /// time now: the server's overlapping requests count once, a pool's by its replicas'
    /// busy time, and per-token calls are counted apart.
    #[test]
    fn ledger_demand_counts_machines_not_requests() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        let hour = super::super::HOUR_MS;
        let mut events: Vec<Event> = (0..8)
            .map(|i| event(T0 + i * 1_000, Kind::Inference, "chat", 55))
            .collect();
        let mut api = event(T0 + hour, Kind::Inference, "chat", 60);
        (api.instance_type, api.model) = (None, Some("gpt-4o".into()));
        events.push(api);
        // A pool of two replicas, each busy 45 minutes of the third hour, serving 6 requests
        // of 30 minutes: 1.5 instances.
        let pool_request = |i: i64| {
            let mut e = event(T0 + 2 * hour + i * 1_000, Kind::Inference, "chat", 30);
            e.model = Some("pool".into());
            e
        };
        events.extend((0..6).map(pool_request));
        let replica = |n: u32| ReplicaSpan {
            duration_ms: hour,
            busy_ms: 45 * 60_000,
            pool: "pool".into(),
            replica: n,
            ..crate::test_events::span(T0 + 2 * hour, Money::from_cents(100))
        };
        ledger
            .append_with_spans("test", &events, &[replica(1), replica(2)])
            .unwrap();
        let d = ledger_demand(&ledger, "chat", Window::default()).unwrap();
        assert_eq!(d.per_token_requests, 1);
        let demand = d.demand.unwrap();
        assert_eq!(demand.peak(), [1.0, 0.0, 1.5], "not [7.33, 1, 3]");
        assert_eq!(demand.instances(), [1, 0, 2]);

        let only_api = ledger_demand(&ledger, "api", Window::default()).unwrap();
        assert_eq!(only_api.demand, None);
        let mut api = event(T0, Kind::Inference, "api", 60);
        api.instance_type = None;
        ledger.append("test", &[api]).unwrap();
        let only_api = ledger_demand(&ledger, "api", Window::default()).unwrap();
        assert_eq!((only_api.demand, only_api.per_token_requests), (None, 1));
    }
}
