//! Commitments for one instance type, simulated hour by hour: `k` instances reserved for
//! the whole window, every hour's demand above `k` on demand.
//!
//! The window's cost is `k * reserved * hours + sum over hours of max(0, demand - k) *
//! on_demand`. Committing unit `k` adds `reserved` every hour and saves `on_demand` in each
//! hour whose demand reaches `k`, so it pays exactly when the share of hours with
//! `demand >= k` exceeds `reserved / on_demand`: the newsvendor quantile. That share only
//! falls as `k` grows, so the first unit that does not pay ends the search, and the count
//! found is the exact optimum, not a heuristic, in O(hours + peak). Demand is in whole
//! instances per hour (a fractional hour's peak is rounded up before it gets here; see
//! `HourlyDemand::instances`).

use serde::Serialize;

use super::demand::HourlyDemand;
use super::{HOURS_PER_MONTH, cost_of_instance_hours, share};
use crate::catalog::InstanceOffer;
use crate::event::Capacity;
use crate::money::{HourlyRate, Money};

/// Least history, in days, on which a 1-year term is recommended: two weeks hold two weekly
/// cycles, the least from which a weekly pattern can be told from a one-off week.
pub const MIN_DAYS_1Y: f64 = 14.0;
/// Least history, in days, on which a 3-year term is recommended: three months show a trend
/// and a seasonal swing that two weeks cannot, and a 3-year term bets 36 months of payments
/// on the baseline holding.
pub const MIN_DAYS_3Y: f64 = 90.0;

/// Hourly prices of one instance type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CommitPrices {
    pub on_demand: HourlyRate,
    pub reserved_1y: Option<HourlyRate>,
    pub reserved_3y: Option<HourlyRate>,
}

impl CommitPrices {
    pub fn from_offer(offer: &InstanceOffer) -> CommitPrices {
        CommitPrices {
            on_demand: offer.on_demand,
            reserved_1y: offer.reserved_1y,
            reserved_3y: offer.reserved_3y,
        }
    }
}

/// How many instances to commit to, given a window's demand.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sizing {
    /// The count that makes the window cheapest: the newsvendor quantile.
    Cheapest,
    /// The largest count up to the cheapest one whose committed instances are busy at least
    /// this share of the window's instance-hours. Cheapest commitments idle a part of what
    /// they buy by design (every committed unit is idle in the hours below it); a floor
    /// trades some of the saving for a commitment that is nearly always busy.
    UtilizationFloor(f64),
}

/// Hours at or above each demand level: the one pass both sizings read.
struct Profile {
    hours: u64,
    /// `at_least[k]`: hours with demand >= k, for k in 0..=peak.
    at_least: Vec<u64>,
}

impl Profile {
    fn new(demand: &[u32]) -> Profile {
        let peak = demand.iter().copied().max().unwrap_or(0) as usize;
        let mut at_least = vec![0u64; peak + 2];
        for &d in demand {
            at_least[d as usize] += 1;
        }
        for k in (0..=peak).rev() {
            at_least[k] += at_least[k + 1];
        }
        at_least.pop();
        Profile {
            hours: demand.len() as u64,
            at_least,
        }
    }

    /// The smallest cheapest count. A unit whose saving is exactly zero is not committed:
    /// it cannot lower the window's cost, and out of sample it can only idle.
    fn cheapest(&self, reserved: HourlyRate, on_demand: HourlyRate) -> u32 {
        let cost = i128::from(self.hours) * i128::from(reserved.0.nanos());
        let pays = |k: usize| i128::from(self.at_least[k]) * i128::from(on_demand.0.nanos()) > cost;
        (1..self.at_least.len()).take_while(|&k| pays(k)).count() as u32
    }

    /// The largest count up to `most` whose utilization is at least `floor`. Utilization
    /// (`sum over j <= k of at_least[j]` over `k * hours`) is an average of a falling
    /// sequence, so it falls as `k` grows and the scan stops at the first count below.
    fn floored(&self, most: u32, floor: f64) -> u32 {
        let mut used = 0u64;
        let mut best = 0;
        for k in 1..=most as usize {
            used += self.at_least[k];
            if (used as f64) < floor * (k as u64 * self.hours) as f64 {
                break;
            }
            best = k as u32;
        }
        best
    }
}

/// The number of instances to commit to for hourly demand `demand` (whole instances).
pub fn choose_commitment(
    demand: &[u32],
    reserved: HourlyRate,
    on_demand: HourlyRate,
    sizing: Sizing,
) -> u32 {
    let profile = Profile::new(demand);
    let cheapest = profile.cheapest(reserved, on_demand);
    match sizing {
        Sizing::Cheapest => cheapest,
        Sizing::UtilizationFloor(floor) => profile.floored(cheapest, floor),
    }
}

/// What a commitment of `committed` instances does over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowCost {
    pub committed: u32,
    pub hours: usize,
    /// Committed and on-demand cost together.
    pub cost: Money,
    pub committed_cost: Money,
    pub on_demand_cost: Money,
    /// Committed instance-hours that served demand.
    pub used_instance_hours: u64,
    /// Instance-hours above the commitment, run on demand.
    pub spill_instance_hours: u64,
    /// `used_instance_hours` over the committed instance-hours; `None` with nothing
    /// committed.
    pub utilization: Option<f64>,
    /// The most instances on demand in any hour: what autoscaling must reach.
    pub on_demand_peak: u32,
}

/// Scores `committed` instances at `reserved` on `demand`, the rest on demand.
pub fn window_cost(
    demand: &[u32],
    committed: u32,
    reserved: HourlyRate,
    on_demand: HourlyRate,
) -> WindowCost {
    let (mut used, mut spill, mut spill_peak) = (0u64, 0u64, 0u32);
    for &d in demand {
        used += u64::from(d.min(committed));
        let over = d.saturating_sub(committed);
        spill += u64::from(over);
        spill_peak = spill_peak.max(over);
    }
    let committed_hours = u64::from(committed) * demand.len() as u64;
    let committed_cost = cost_of_instance_hours(reserved, committed_hours);
    let on_demand_cost = cost_of_instance_hours(on_demand, spill);
    WindowCost {
        committed,
        hours: demand.len(),
        cost: committed_cost + on_demand_cost,
        committed_cost,
        on_demand_cost,
        used_instance_hours: used,
        spill_instance_hours: spill,
        utilization: (committed_hours > 0).then(|| used as f64 / committed_hours as f64),
        on_demand_peak: spill_peak,
    }
}

/// One way to buy a window's capacity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CommitOption {
    /// `on_demand` for all on demand, else the term committed to.
    pub capacity: Capacity,
    /// Instances committed to (0 for all on demand).
    pub count: u32,
    /// Price of a committed instance-hour (the on-demand price for all on demand).
    pub rate: HourlyRate,
    /// The same commitment as a savings-plan-style dollar commitment, in $ per hour at the
    /// reserved discount: for one instance type it is `count * rate`. (Across several
    /// types a savings plan's dollars move between them; this planner sees one type.)
    pub commitment_per_hour: Money,
    pub window_cost: Money,
    /// `window_cost` over 730 hours.
    pub monthly_cost: Money,
    /// Against all on demand over the window.
    pub saving: Money,
    /// `saving` over the all-on-demand cost.
    pub saving_share: Option<f64>,
    pub utilization: Option<f64>,
    pub on_demand_peak: u32,
    /// Instances on demand in each hour.
    pub spill: Vec<u32>,
}

/// A term the plan does not recommend, and why (the CLI prints `reason`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refusal {
    pub capacity: Capacity,
    pub reason: String,
}

/// Counts per capacity type of the recommended mix: the cheapest allowed term at its
/// count, the other term at 0, and the on-demand peak beside it. (A 3-year price below the
/// 1-year one makes any unit worth a 1-year term worth a 3-year one, so the cheapest mix
/// never holds both.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// `None` where the term is refused.
    pub reserved_1y: Option<u32>,
    pub reserved_3y: Option<u32>,
    pub on_demand_peak: u32,
}

/// Every option for one window: all on demand, and each term not refused.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CommitPlan {
    pub hours: usize,
    pub days: f64,
    /// The most instances any hour needs.
    pub peak: u32,
    pub on_demand: CommitOption,
    pub reserved_1y: Option<CommitOption>,
    pub reserved_3y: Option<CommitOption>,
    pub refused: Vec<Refusal>,
}

impl CommitPlan {
    /// The cheapest option over the window (all on demand on a tie).
    pub fn best(&self) -> &CommitOption {
        [&self.reserved_3y, &self.reserved_1y]
            .into_iter()
            .flatten()
            .fold(&self.on_demand, |best, o| {
                if o.window_cost < best.window_cost {
                    o
                } else {
                    best
                }
            })
    }

    pub fn counts(&self) -> Counts {
        let best = self.best();
        let count = |option: &Option<CommitOption>| {
            option.as_ref().map(|o| {
                if o.capacity == best.capacity {
                    o.count
                } else {
                    0
                }
            })
        };
        Counts {
            reserved_1y: count(&self.reserved_1y),
            reserved_3y: count(&self.reserved_3y),
            on_demand_peak: best.on_demand_peak,
        }
    }
}

/// Plans every term for `demand` at `prices`, sizing each commitment by `sizing`. A term is
/// refused, with a reason, where the price file has no price for it or the demand is
/// shorter than the term's least history (`MIN_DAYS_1Y`, `MIN_DAYS_3Y`).
pub fn plan_commitments(
    demand: &HourlyDemand,
    prices: &CommitPrices,
    sizing: Sizing,
) -> CommitPlan {
    let hourly = demand.instances();
    let all_on_demand = window_cost(&hourly, 0, prices.on_demand, prices.on_demand);
    let option = |capacity: Capacity, rate: HourlyRate, count: u32| {
        let w = window_cost(&hourly, count, rate, prices.on_demand);
        let saving = all_on_demand.cost - w.cost;
        CommitOption {
            capacity,
            count,
            rate,
            commitment_per_hour: cost_of_instance_hours(rate, u64::from(count)),
            window_cost: w.cost,
            monthly_cost: monthly(w.cost, w.hours),
            saving,
            saving_share: share(saving, all_on_demand.cost),
            utilization: w.utilization,
            on_demand_peak: w.on_demand_peak,
            spill: hourly.iter().map(|&d| d.saturating_sub(count)).collect(),
        }
    };
    let mut refused = Vec::new();
    let mut term = |capacity: Capacity, rate: Option<HourlyRate>, min_days: f64, name: &str| {
        let Some(rate) = rate else {
            refused.push(Refusal {
                capacity,
                reason: format!(
                    "no {name} reserved price for this instance type: a price file can add one \
                     (`{}` or a discount)",
                    capacity_key(capacity)
                ),
            });
            return None;
        };
        if demand.days() < min_days {
            refused.push(Refusal {
                capacity,
                reason: format!(
                    "a {name} term needs at least {min_days} days of demand history; this \
                     demand covers {:.1} days",
                    demand.days()
                ),
            });
            return None;
        }
        let count = choose_commitment(&hourly, rate, prices.on_demand, sizing);
        Some(option(capacity, rate, count))
    };
    let reserved_1y = term(
        Capacity::Reserved1y,
        prices.reserved_1y,
        MIN_DAYS_1Y,
        "1-year",
    );
    let reserved_3y = term(
        Capacity::Reserved3y,
        prices.reserved_3y,
        MIN_DAYS_3Y,
        "3-year",
    );
    CommitPlan {
        hours: hourly.len(),
        days: demand.days(),
        peak: hourly.iter().copied().max().unwrap_or(0),
        on_demand: option(Capacity::OnDemand, prices.on_demand, 0),
        reserved_1y,
        reserved_3y,
        refused,
    }
}

/// A window's cost per 730-hour month.
fn monthly(cost: Money, hours: usize) -> Money {
    cost.mul_div(i128::from(HOURS_PER_MONTH), hours.max(1) as i128)
        .unwrap_or(Money::from_nanos(i64::MAX))
}

fn capacity_key(capacity: Capacity) -> &'static str {
    match capacity {
        Capacity::OnDemand => "on_demand",
        Capacity::Spot => "spot",
        Capacity::Reserved1y => "reserved_1y",
        Capacity::Reserved3y => "reserved_3y",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::Millis;
    use crate::plan::TestRng;

    fn rate(s: &str) -> HourlyRate {
        HourlyRate(s.parse().unwrap())
    }

    fn brute_force(demand: &[u32], reserved: HourlyRate, on_demand: HourlyRate) -> Money {
        let peak = demand.iter().copied().max().unwrap_or(0);
        (0..=peak + 2)
            .map(|k| window_cost(demand, k, reserved, on_demand).cost)
            .min()
            .unwrap()
    }

    #[test]
    fn a_cost_by_hand() {
        // Demand 1, 3, 2 with 2 committed at $1/h, on demand $2/h: 2 x 3 h x $1 = $6
        // committed, one instance-hour over (hour 2) at $2: $8. Used: 1 + 2 + 2 = 5 of 6.
        let w = window_cost(&[1, 3, 2], 2, rate("1"), rate("2"));
        assert_eq!(w.cost, "8".parse().unwrap());
        assert_eq!(w.committed_cost, "6".parse().unwrap());
        assert_eq!(w.spill_instance_hours, 1);
        assert_eq!(w.on_demand_peak, 1);
        assert_eq!(w.utilization, Some(5.0 / 6.0));
        assert_eq!(
            window_cost(&[1, 3, 2], 0, rate("1"), rate("2")).utilization,
            None
        );
    }

    #[test]
    fn the_newsvendor_quantile_by_hand() {
        // Reserved at 60% of on demand: commit unit k while more than 60% of hours reach k.
        // Ten hours, demand 0..=9: 7 hours reach 3 (70%), 6 reach 4 (60%, saves nothing).
        let demand: Vec<u32> = (0..10).collect();
        let k = choose_commitment(&demand, rate("0.6"), rate("1"), Sizing::Cheapest);
        assert_eq!(k, 3);
        assert_eq!(
            window_cost(&demand, 3, rate("0.6"), rate("1")).cost,
            window_cost(&demand, 4, rate("0.6"), rate("1")).cost,
            "unit 4 saves exactly nothing, and is left out"
        );
    }

    #[test]
    fn the_optimum_matches_a_brute_force_search() {
        let mut rng = TestRng(17);
        for case in 0..400 {
            let hours = 1 + rng.below(300) as usize;
            let level = rng.below(40);
            let swing = 1 + rng.below(30);
            // Fractional demand, rounded up to whole instances as `HourlyDemand` does.
            let values: Vec<f64> = (0..hours)
                .map(|_| (level + rng.below(swing)) as f64 * (0.5 + rng.below(100) as f64 / 99.0))
                .collect();
            let demand = HourlyDemand::from_hourly(0, values).unwrap().instances();
            let on_demand = HourlyRate(Money::from_cents(50 + rng.below(500) as i64));
            let reserved = HourlyRate(on_demand.0.scale(rng.below(120) as f64 / 100.0));
            let k = choose_commitment(&demand, reserved, on_demand, Sizing::Cheapest);
            let best = brute_force(&demand, reserved, on_demand);
            assert_eq!(
                window_cost(&demand, k, reserved, on_demand).cost,
                best,
                "case {case}: k = {k} on {hours} hours"
            );
            // The smallest of the cheapest counts: one fewer costs more.
            if k > 0 {
                assert!(window_cost(&demand, k - 1, reserved, on_demand).cost > best);
            }
        }
    }

    #[test]
    fn edge_prices() {
        let demand = [2, 5, 3];
        // Reserved no cheaper than on demand: commit nothing.
        assert_eq!(
            choose_commitment(&demand, rate("1"), rate("1"), Sizing::Cheapest),
            0
        );
        // Free commitments cover the peak.
        assert_eq!(
            choose_commitment(&demand, rate("0"), rate("1"), Sizing::Cheapest),
            5
        );
        assert_eq!(
            choose_commitment(&[], rate("0.5"), rate("1"), Sizing::Cheapest),
            0
        );
        assert_eq!(
            choose_commitment(&[0, 0], rate("0"), rate("1"), Sizing::Cheapest),
            0
        );
    }

    #[test]
    fn a_utilization_floor_commits_less_and_idles_less() {
        // Demand 0..=9 at a deep discount: the cheapest count is 9 (utilization 5/9).
        let demand: Vec<u32> = (0..10).collect();
        let (r, od) = (rate("0.05"), rate("1"));
        assert_eq!(choose_commitment(&demand, r, od, Sizing::Cheapest), 9);
        let k = choose_commitment(&demand, r, od, Sizing::UtilizationFloor(0.9));
        // One instance is busy 9 of 10 hours (0.9); two are busy (9 + 8) of 20 (0.85).
        assert_eq!(k, 1);
        let u = window_cost(&demand, k, r, od).utilization.unwrap();
        assert!(u >= 0.9);
        // A floor never adds instances the cheapest count would not buy.
        assert_eq!(
            choose_commitment(&demand, rate("0.95"), od, Sizing::UtilizationFloor(0.0)),
            choose_commitment(&demand, rate("0.95"), od, Sizing::Cheapest)
        );
    }

    fn days(d: usize, hourly: impl Fn(usize) -> f64) -> HourlyDemand {
        let start: Millis = 1_404_172_800_000;
        HourlyDemand::from_hourly(start, (0..d * 24).map(hourly).collect()).unwrap()
    }

    fn prices() -> CommitPrices {
        CommitPrices {
            on_demand: rate("3"),
            reserved_1y: Some(rate("1.95")),
            reserved_3y: Some(rate("1.2")),
        }
    }

    #[test]
    fn a_plan_by_hand() {
        // 120 days: 10 instances round the clock, 20 for 8 hours a day. On demand: 1 -
        // 1.95/3 = 35% off needs 65% of hours to reach a unit; 1/3 of hours reach 11..=20,
        // so 1y and 3y (60% off: 40%) both commit 10.
        let d = days(120, |h| if h % 24 < 8 { 20.0 } else { 10.0 });
        let plan = plan_commitments(&d, &prices(), Sizing::Cheapest);
        assert_eq!(plan.peak, 20);
        assert!(plan.refused.is_empty());
        let hours = 120 * 24;
        let on_demand: Money = "3"
            .parse::<Money>()
            .unwrap()
            .mul_div(hours * 40 / 3, 1)
            .unwrap();
        assert_eq!(plan.on_demand.window_cost, on_demand);
        let three = plan.reserved_3y.as_ref().unwrap();
        assert_eq!(three.count, 10);
        assert_eq!(three.utilization, Some(1.0));
        assert_eq!(three.on_demand_peak, 10);
        assert_eq!(three.commitment_per_hour, "12".parse().unwrap());
        // 10 x $1.2 + 10 x 1/3 x $3 = $22 an hour, against $40 all on demand.
        assert_eq!(three.monthly_cost, "16060".parse().unwrap());
        assert_eq!(three.saving_share, Some(18.0 / 40.0));
        assert_eq!(three.spill.len(), hours as usize);
        assert_eq!(&three.spill[..9], &[10, 10, 10, 10, 10, 10, 10, 10, 0]);
        assert_eq!(plan.best().capacity, Capacity::Reserved3y);
        assert_eq!(
            plan.counts(),
            Counts {
                reserved_1y: Some(0),
                reserved_3y: Some(10),
                on_demand_peak: 10
            }
        );
    }

    #[test]
    fn short_history_refuses_the_long_term_with_a_reason() {
        let d = days(30, |_| 4.0);
        let plan = plan_commitments(&d, &prices(), Sizing::Cheapest);
        assert_eq!(plan.reserved_1y.as_ref().map(|o| o.count), Some(4));
        assert!(plan.reserved_3y.is_none());
        assert_eq!(
            plan.refused,
            vec![Refusal {
                capacity: Capacity::Reserved3y,
                reason: "a 3-year term needs at least 90 days of demand history; this demand \
                         covers 30.0 days"
                    .into()
            }]
        );
        assert_eq!(plan.counts().reserved_3y, None);
        assert_eq!(plan.counts().reserved_1y, Some(4));
        // Two weeks on the dot is enough for a 1-year term; a day less is not.
        assert!(
            plan_commitments(&days(14, |_| 4.0), &prices(), Sizing::Cheapest)
                .reserved_1y
                .is_some()
        );
        let short = plan_commitments(&days(13, |_| 4.0), &prices(), Sizing::Cheapest);
        assert!(short.reserved_1y.is_none());
        assert_eq!(short.best().capacity, Capacity::OnDemand);
        assert_eq!(short.counts().on_demand_peak, 4);
    }

    #[test]
    fn a_missing_reserved_price_is_said_and_planned_without() {
        let no_reserved = CommitPrices {
            on_demand: rate("3"),
            reserved_1y: None,
            reserved_3y: None,
        };
        let plan = plan_commitments(&days(100, |_| 4.0), &no_reserved, Sizing::Cheapest);
        assert_eq!(plan.refused.len(), 2);
        assert!(
            plan.refused[0]
                .reason
                .starts_with("no 1-year reserved price")
        );
        assert!(plan.refused[1].reason.contains("`reserved_3y`"));
        assert_eq!(plan.best().capacity, Capacity::OnDemand);
        assert_eq!(plan.on_demand.saving, Money::ZERO);
    }

    #[test]
    fn spill_hours_are_whole_hours() {
        // A half-hour peak is a whole instance-hour on demand.
        let d = HourlyDemand::from_hourly(0, vec![1.5; 24 * 20]).unwrap();
        let plan = plan_commitments(&d, &prices(), Sizing::Cheapest);
        assert_eq!(plan.peak, 2);
        assert_eq!(plan.reserved_1y.unwrap().count, 2);
    }
}
