//! Capacity planning for one instance type: how many instances to commit to for one or
//! three years and how much to leave to on demand, from real demand and backtested on the
//! months the choice was not fitted on; and what interruptible work costs on spot.
//!
//! - `demand`: hourly demand in whole instances, from a `timestamp,value` CSV or a series
//!   the caller already holds (the ledger's busy time).
//! - `commit`: the exact cheapest commitment for a window (the newsvendor rule) and what
//!   each term costs, saves, leaves idle and spills to on demand.
//! - `backtest`: rolling fit/test windows scored against the hindsight optimum of each test
//!   window and against the cloud vendors' lookback rule.
//! - `size`: the instance type that serves a million tokens cheapest within a latency SLO,
//!   and whether scaling a pool to zero between requests pays.
//! - `spot`: preemption traces, the Young/Daly checkpoint interval, replays of a run on a
//!   trace, and the "Can't Be Late" deadline policy.
//!
//! Dollar figures are exact `Money`; hours, shares and event rates are floats.

pub mod backtest;
pub mod commit;
pub mod demand;
pub mod html;
pub mod size;
pub mod spot;
pub mod whole;

pub use backtest::{
    Backtest, BacktestConfig, BacktestError, Rule, RuleResult, VENDOR_LOOKBACK_DAYS, WindowScore,
    backtest, suggested_windows,
};
pub use commit::{
    CommitOption, CommitPlan, CommitPrices, Counts, MIN_DAYS_1Y, MIN_DAYS_3Y, Refusal, Sizing,
    WindowCost, choose_commitment, plan_commitments, window_cost,
};
pub use demand::{DemandError, DemandOptions, Gaps, HourlyDemand};
pub use size::{
    ColdStart, DEFAULT_COLD_START, DEFAULT_MAX_WAITING_SHARE, Measured, RightSizing, SizeError,
    Slo, ZeroPlan, ZeroPolicy, ledger_arrivals, ledger_cold_start, ledger_scale_to_zero,
    right_size, scale_to_zero,
};
pub use spot::{
    DeadlinePlan, IntervalCost, Job, Policy, Replay, SpotError, SpotPrices, SpotTrace,
    TraceReading, TraceStats, plan_deadline, replay, sweep_intervals, young_daly_interval,
};

pub use whole::{LedgerDemand, Plan, PlanError, Recommended, SpotAsk, SpotPlan, ledger_demand};

use crate::money::{HourlyRate, Millis, Money};

pub(crate) const HOUR_MS: Millis = 3_600_000;
/// Hours in the month that monthly figures are quoted for: 8,760 hours a year over 12, as
/// the clouds' own monthly prices count it.
pub const HOURS_PER_MONTH: u32 = 730;

/// What `hours` of one instance cost at `rate`, to the millisecond.
fn cost_of_hours(rate: HourlyRate, hours: f64) -> Money {
    let ms = (hours * HOUR_MS as f64).round();
    // A saturated sum is the crate's convention for figures past ±9.2 billion dollars.
    rate.cost(ms as i64, 1)
        .unwrap_or(Money::from_nanos(i64::MAX))
}

/// What `instance_hours` whole instance-hours cost at `rate`.
fn cost_of_instance_hours(rate: HourlyRate, instance_hours: u64) -> Money {
    rate.0
        .mul_div(i128::from(instance_hours), 1)
        .unwrap_or(Money::from_nanos(i64::MAX))
}

/// `part / whole` as a float, `None` when `whole` is zero.
fn share(part: Money, whole: Money) -> Option<f64> {
    (whole != Money::ZERO).then(|| part.as_f64() / whole.as_f64())
}

/// splitmix64: seeded draws for the planners' randomized tests.
#[cfg(test)]
pub(crate) struct TestRng(pub u64);

#[cfg(test)]
impl TestRng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in (0, 1].
    pub(crate) fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod fuzz;
