//! Commitments scored out of sample: rolling windows, each commitment chosen on the history
//! before a test window and scored on the test window itself.
//!
//! Our rule fits on the `fit` window just before each test window. The cloud vendors'
//! recommenders (AWS Cost Explorer's reservation and Savings Plans recommendations, Azure's
//! reservation recommendations) simulate a 7-, 30- or 60-day lookback hour by hour and
//! recommend the quantity that would have saved most over it: the cheapest count over the
//! lookback, scored here on the same test windows. With a 30-day fit and the cheapest sizing
//! the 30-day lookback is our rule exactly; the 7- and 60-day ones differ. Each window is
//! measured against its hindsight optimum (the cheapest count chosen on the test window
//! itself) and against all on demand.

use std::time::Duration;

use serde::Serialize;

use super::commit::{Sizing, choose_commitment, window_cost};
use super::demand::HourlyDemand;
use super::{HOUR_MS, share};
use crate::event::Capacity;
use crate::money::{HourlyRate, Millis, Money};

/// The lookbacks the vendors' recommenders offer, in days.
pub const VENDOR_LOOKBACK_DAYS: [u32; 3] = [7, 30, 60];

#[derive(Debug, thiserror::Error)]
pub enum BacktestError {
    #[error("the {name} window must be a whole number of hours, at least one; got {seconds} s")]
    Window { name: &'static str, seconds: u64 },
    #[error("the fit window ({fit_hours} h) is longer than the demand ({data_hours} h)")]
    FitTooLong { fit_hours: usize, data_hours: usize },
    #[error(
        "no whole test window of {test_hours} h follows the {fit_hours} h fit window: the \
         demand covers {data_hours} h"
    )]
    NoTestWindow {
        fit_hours: usize,
        test_hours: usize,
        data_hours: usize,
    },
}

impl BacktestConfig {
    /// Refuses windows that `data_hours` of demand cannot hold: a fit window longer than
    /// the data, or no whole test window after it.
    pub fn fits(&self, data_hours: usize) -> Result<(), BacktestError> {
        let (fit_hours, test_hours) = (self.fit_hours, self.test_hours);
        if fit_hours > data_hours {
            return Err(BacktestError::FitTooLong {
                fit_hours,
                data_hours,
            });
        }
        if fit_hours + test_hours > data_hours {
            return Err(BacktestError::NoTestWindow {
                fit_hours,
                test_hours,
                data_hours,
            });
        }
        Ok(())
    }
}

/// The windows to roll and how our rule sizes its commitment.
#[derive(Debug, Clone, PartialEq)]
pub struct BacktestConfig {
    pub fit_hours: usize,
    /// Also the step from one test window to the next, so test windows tile the demand.
    pub test_hours: usize,
    pub sizing: Sizing,
    /// The vendors' lookbacks to score beside ours.
    pub lookback_days: Vec<u32>,
}

impl BacktestConfig {
    /// Windows from durations (`--fit 30d --test 30d`), the cheapest sizing and the
    /// vendors' 7/30/60-day lookbacks.
    pub fn new(fit: Duration, test: Duration) -> Result<BacktestConfig, BacktestError> {
        Ok(BacktestConfig {
            fit_hours: whole_hours("fit", fit)?,
            test_hours: whole_hours("test", test)?,
            sizing: Sizing::Cheapest,
            lookback_days: VENDOR_LOOKBACK_DAYS.to_vec(),
        })
    }
}

/// Fit and test windows, in hours, that `data_hours` of demand holds: 30 days each where
/// it covers 60 days, else its halves in whole days (whole hours under two days); `None`
/// under two hours.
pub fn suggested_windows(data_hours: usize) -> Option<(usize, usize)> {
    const MONTH: usize = 30 * 24;
    let half = data_hours / 2;
    match half {
        0 => None,
        h if h >= MONTH => Some((MONTH, MONTH)),
        h if h >= 24 => Some((h / 24 * 24, h / 24 * 24)),
        h => Some((h, h)),
    }
}

fn whole_hours(name: &'static str, d: Duration) -> Result<usize, BacktestError> {
    let seconds = d.as_secs();
    if d.subsec_nanos() != 0 || seconds == 0 || !seconds.is_multiple_of(3600) {
        return Err(BacktestError::Window { name, seconds });
    }
    Ok((seconds / 3600) as usize)
}

/// How a rule picks a commitment from the history before a test window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Rule {
    /// Ours: `sizing` on the `hours` before the window.
    Fit { hours: usize, sizing: Sizing },
    /// The vendors': the cheapest count over the `days` before the window.
    Lookback { days: u32 },
}

/// One test window under one rule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowScore {
    pub test_start_ms: Millis,
    pub test_hours: usize,
    /// Hours the count was chosen on: a lookback reaching before the demand's first hour is
    /// cut there.
    pub history_hours: usize,
    /// Committed instances chosen on the history.
    pub count: u32,
    pub cost: Money,
    /// The cheapest count for the test window, chosen on the test window itself.
    pub optimum_count: u32,
    pub optimum_cost: Money,
    /// The optimum's own utilization: the cheapest commitment idles in every hour below it.
    pub optimum_utilization: Option<f64>,
    pub on_demand_cost: Money,
    /// Realized saving against all on demand.
    pub saving: Money,
    pub saving_share: Option<f64>,
    /// `(cost - optimum_cost) / on_demand_cost * 100`: points of the all-on-demand bill
    /// lost to not knowing the test window; `None` for a window without demand.
    pub regret: Option<f64>,
    /// Used committed instance-hours over committed instance-hours in the test window.
    pub utilization: Option<f64>,
}

/// One rule over every test window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleResult {
    pub rule: Rule,
    pub windows: Vec<WindowScore>,
    pub mean_regret: Option<f64>,
    pub max_regret: Option<f64>,
    /// Used over committed instance-hours across all test windows.
    pub utilization: Option<f64>,
    /// Realized saving across all test windows.
    pub saving: Money,
    pub saving_share: Option<f64>,
}

/// The backtest of one term: ours beside each vendor lookback, on the same windows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Backtest {
    pub capacity: Capacity,
    pub reserved: HourlyRate,
    pub on_demand: HourlyRate,
    pub fit_hours: usize,
    pub test_hours: usize,
    pub ours: RuleResult,
    pub lookbacks: Vec<RuleResult>,
}

/// Rolls `config`'s windows over `demand` for a commitment at `reserved` (the term named by
/// `capacity`) against `on_demand`. Test windows start after the first fit window and step
/// by the test window; a last part shorter than a test window is left out.
pub fn backtest(
    demand: &HourlyDemand,
    capacity: Capacity,
    reserved: HourlyRate,
    on_demand: HourlyRate,
    config: &BacktestConfig,
) -> Result<Backtest, BacktestError> {
    config.fits(demand.len())?;
    let hourly = demand.instances();
    let (fit, test, data_hours) = (config.fit_hours, config.test_hours, hourly.len());
    let starts: Vec<usize> = (fit..=data_hours - test).step_by(test).collect();
    let run = |rule: Rule| {
        let (history, sizing) = match rule {
            Rule::Fit { hours, sizing } => (hours, sizing),
            Rule::Lookback { days } => (days as usize * 24, Sizing::Cheapest),
        };
        let windows = starts
            .iter()
            .map(|&start| {
                let from = start.saturating_sub(history);
                let count = choose_commitment(&hourly[from..start], reserved, on_demand, sizing);
                let window = &hourly[start..start + test];
                let mut score = score(window, count, reserved, on_demand);
                score.test_start_ms = demand.start_ms() + start as Millis * HOUR_MS;
                score.history_hours = start - from;
                score
            })
            .collect();
        summarize(rule, windows)
    };
    Ok(Backtest {
        capacity,
        reserved,
        on_demand,
        fit_hours: fit,
        test_hours: test,
        ours: run(Rule::Fit {
            hours: fit,
            sizing: config.sizing,
        }),
        lookbacks: config
            .lookback_days
            .iter()
            .map(|&days| run(Rule::Lookback { days }))
            .collect(),
    })
}

/// `count` committed on `window`, against the window's own optimum and all on demand.
fn score(window: &[u32], count: u32, reserved: HourlyRate, on_demand: HourlyRate) -> WindowScore {
    let chosen = window_cost(window, count, reserved, on_demand);
    let best = choose_commitment(window, reserved, on_demand, Sizing::Cheapest);
    let optimum = window_cost(window, best, reserved, on_demand);
    let all_on_demand = window_cost(window, 0, reserved, on_demand).cost;
    let saving = all_on_demand - chosen.cost;
    WindowScore {
        test_start_ms: 0,
        test_hours: window.len(),
        history_hours: 0,
        count,
        cost: chosen.cost,
        optimum_count: best,
        optimum_cost: optimum.cost,
        optimum_utilization: optimum.utilization,
        on_demand_cost: all_on_demand,
        saving,
        saving_share: share(saving, all_on_demand),
        regret: share(chosen.cost - optimum.cost, all_on_demand).map(|s| s * 100.0),
        utilization: chosen.utilization,
    }
}

fn summarize(rule: Rule, windows: Vec<WindowScore>) -> RuleResult {
    let regrets: Vec<f64> = windows.iter().filter_map(|w| w.regret).collect();
    let (mut used, mut committed) = (0.0, 0.0);
    for w in &windows {
        let bought = f64::from(w.count) * w.test_hours as f64;
        committed += bought;
        used += w.utilization.unwrap_or(0.0) * bought;
    }
    let saving: Money = windows.iter().map(|w| w.saving).sum();
    let on_demand: Money = windows.iter().map(|w| w.on_demand_cost).sum();
    RuleResult {
        rule,
        mean_regret: (!regrets.is_empty())
            .then(|| regrets.iter().sum::<f64>() / regrets.len() as f64),
        max_regret: regrets.iter().copied().reduce(f64::max),
        utilization: (committed > 0.0).then(|| used / committed),
        saving,
        saving_share: share(saving, on_demand),
        windows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, PriceSource};
    use crate::plan::DemandOptions;

    const DAY: usize = 24;

    fn rate(s: &str) -> HourlyRate {
        HourlyRate(s.parse().unwrap())
    }

    fn days(n: u64) -> Duration {
        Duration::from_secs(n * 86_400)
    }

    fn series(hourly: Vec<f64>) -> HourlyDemand {
        HourlyDemand::from_hourly(1_404_172_800_000, hourly).unwrap()
    }

    #[test]
    fn suggested_windows_fit_the_demand() {
        assert_eq!(suggested_windows(24 * 365), Some((720, 720)));
        assert_eq!(suggested_windows(168), Some((72, 72)), "the sample week");
        assert_eq!(suggested_windows(15 * 24), Some((168, 168)));
        assert_eq!(suggested_windows(30), Some((15, 15)));
        assert_eq!(suggested_windows(1), None);
        for hours in 2..2000 {
            let (fit, test) = suggested_windows(hours).unwrap();
            let config = BacktestConfig {
                fit_hours: fit,
                test_hours: test,
                ..BacktestConfig::new(Duration::from_secs(3600), Duration::from_secs(3600)).unwrap()
            };
            assert!(config.fits(hours).is_ok(), "{hours}");
        }
    }

    #[test]
    fn windows_must_be_whole_hours() {
        assert!(BacktestConfig::new(days(30), days(30)).is_ok());
        let err = BacktestConfig::new(Duration::from_secs(5400), days(1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the fit window must be a whole number of hours, at least one; got 5400 s"
        );
        assert!(BacktestConfig::new(days(1), Duration::ZERO).is_err());
        assert!(BacktestConfig::new(days(1), Duration::from_millis(3_600_500)).is_err());
    }

    #[test]
    fn a_fit_window_longer_than_the_data_is_refused() {
        let d = series(vec![3.0; 20 * DAY]);
        let config = BacktestConfig::new(days(30), days(30)).unwrap();
        let err = backtest(&d, Capacity::Reserved1y, rate("2"), rate("3"), &config).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the fit window (720 h) is longer than the demand (480 h)"
        );
        let config = BacktestConfig::new(days(15), days(10)).unwrap();
        let err = backtest(&d, Capacity::Reserved1y, rate("2"), rate("3"), &config).unwrap_err();
        assert!(matches!(err, BacktestError::NoTestWindow { .. }), "{err}");
    }

    #[test]
    fn a_step_change_is_scored_against_hindsight_by_hand() {
        // 10 days at 4 instances, then 10 days at 2. Fit 5 days, test 5 days: windows start
        // on days 5, 10 and 15. The window from day 10 was fitted on 4 and sees 2.
        let hourly: Vec<f64> = (0..20 * DAY)
            .map(|h| if h < 10 * DAY { 4.0 } else { 2.0 })
            .collect();
        let mut config = BacktestConfig::new(days(5), days(5)).unwrap();
        config.lookback_days = vec![7];
        let (r, od) = (rate("2"), rate("3"));
        let bt = backtest(&series(hourly), Capacity::Reserved1y, r, od, &config).unwrap();
        let w = &bt.ours.windows;
        assert_eq!(w.len(), 3);
        assert_eq!(w.iter().map(|w| w.count).collect::<Vec<_>>(), [4, 4, 2]);
        assert_eq!(
            w.iter().map(|w| w.optimum_count).collect::<Vec<_>>(),
            [4, 2, 2]
        );
        // Window 2: 4 x $2 x 120 h = $960 against 2 x $2 x 120 h = $480; all on demand
        // 2 x $3 x 120 h = $720: regret (960 - 480) / 720 = 66.7 points, utilization 1/2,
        // and a loss of $240 against on demand.
        assert_eq!(w[1].cost, "960".parse().unwrap());
        assert_eq!(w[1].optimum_cost, "480".parse().unwrap());
        assert_eq!(w[1].on_demand_cost, "720".parse().unwrap());
        assert!((w[1].regret.unwrap() - 200.0 / 3.0).abs() < 1e-9);
        assert_eq!(w[1].utilization, Some(0.5));
        assert_eq!(w[1].saving, "-240".parse().unwrap());
        assert_eq!(w[0].regret, Some(0.0));
        assert_eq!(
            w[1].test_start_ms - w[0].test_start_ms,
            5 * DAY as Millis * HOUR_MS
        );
        assert_eq!(bt.ours.max_regret, w[1].regret);
        // Committed 4 + 4 + 2 instances for 120 h each, busy 4 + 2 + 2.
        assert!((bt.ours.utilization.unwrap() - 0.8).abs() < 1e-12);
        // The 7-day lookback sees 5 days of history before day 5, then straddles the step.
        let seven = &bt.lookbacks[0];
        assert_eq!(seven.rule, Rule::Lookback { days: 7 });
        assert_eq!(seven.windows[0].history_hours, 5 * DAY);
        assert_eq!(seven.windows[1].history_hours, 7 * DAY);
        // Before day 15: 5 days at 2 and 2 days at 4 -> units 3 and 4 reach 2/7 of hours.
        assert_eq!(seven.windows[2].count, 2);
    }

    #[test]
    fn the_30_day_lookback_is_our_30_day_fit() {
        // A weekly cycle with a trend over 150 days.
        let hourly: Vec<f64> = (0..150 * DAY)
            .map(|h| 10.0 + (h / DAY % 7) as f64 + (h % DAY) as f64 / 4.0 + h as f64 / 500.0)
            .collect();
        let config = BacktestConfig::new(days(30), days(30)).unwrap();
        let bt = backtest(
            &series(hourly),
            Capacity::Reserved1y,
            rate("1.9"),
            rate("3"),
            &config,
        )
        .unwrap();
        assert_eq!(bt.ours.windows.len(), 4);
        let thirty = bt
            .lookbacks
            .iter()
            .find(|l| l.rule == Rule::Lookback { days: 30 })
            .unwrap();
        assert_eq!(thirty.windows, bt.ours.windows);
        for w in &bt.ours.windows {
            let regret = w.regret.unwrap();
            assert!(regret.is_finite() && regret >= 0.0);
            assert!(w.cost >= w.optimum_cost);
        }
    }

    #[test]
    fn a_window_without_demand_has_no_regret() {
        let hourly: Vec<f64> = (0..4 * DAY)
            .map(|h| if h < 2 * DAY { 1.0 } else { 0.0 })
            .collect();
        let config = BacktestConfig::new(days(2), days(2)).unwrap();
        let bt = backtest(
            &series(hourly),
            Capacity::Reserved1y,
            rate("1"),
            rate("3"),
            &config,
        )
        .unwrap();
        assert_eq!(bt.ours.windows[0].regret, None);
        assert_eq!(bt.ours.windows[0].utilization, Some(0.0));
        assert_eq!(bt.ours.mean_regret, None);
    }

    fn print(result: &RuleResult) {
        let name = match result.rule {
            Rule::Fit {
                sizing: Sizing::Cheapest,
                ..
            } => "ours, cheapest".to_owned(),
            Rule::Fit {
                sizing: Sizing::UtilizationFloor(f),
                ..
            } => {
                format!("ours, utilization >= {:.0}%", f * 100.0)
            }
            Rule::Lookback { days } => format!("{days}-day lookback"),
        };
        let cells: Vec<String> = result
            .windows
            .iter()
            .map(|w| {
                let start = chrono::DateTime::from_timestamp_millis(w.test_start_ms).unwrap();
                format!(
                    "{} k={:>2} (opt {:>2}, util {:>4.1}%) regret {:>5.2} util {:>5.1}% saving {:>4.1}%",
                    start.format("%Y-%m-%d"),
                    w.count,
                    w.optimum_count,
                    w.optimum_utilization.unwrap() * 100.0,
                    w.regret.unwrap(),
                    w.utilization.unwrap_or(0.0) * 100.0,
                    w.saving_share.unwrap() * 100.0,
                )
            })
            .collect();
        println!(
            "{name}: mean regret {:.2} points (max {:.2}), utilization {:.1}%, saving {:.1}%\n  {}",
            result.mean_regret.unwrap(),
            result.max_regret.unwrap(),
            result.utilization.unwrap() * 100.0,
            result.saving_share.unwrap() * 100.0,
            cells.join("\n  ")
        );
    }

    /// The backtest: seven months of NYC taxi demand as GPU instances, rolling 30-day
    /// fit and 30-day test windows. Scale: one p3.2xlarge per 1,000 passengers in a
    /// half-hour bucket (value x 0.001, rounded up per hour), so the busiest hour needs 40
    /// instances. Prices: the built-in catalog's p3.2xlarge on demand ($3.06/h) with the
    /// 35% 1-year discount examples/prices.toml assumes (no reserved prices ship with the
    /// catalog).
    #[test]
    fn nyc_taxi_rolling_30_day_backtest() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/demand-traces/nyc_taxi.csv");
        let demand = HourlyDemand::read_csv(&path, &DemandOptions::new(0.001)).unwrap();
        assert_eq!(demand.instances().iter().max(), Some(&40));
        let mut catalog = Catalog::builtin().unwrap();
        catalog
            .extend_from_toml("reserved_1y_discount = 0.35", PriceSource::Builtin)
            .unwrap();
        let offer = catalog.instance("p3.2xlarge", None).unwrap();
        let (reserved, on_demand) = (offer.reserved_1y.unwrap(), offer.on_demand);
        assert_eq!(reserved, rate("1.989"));
        let mut config = BacktestConfig::new(days(30), days(30)).unwrap();
        let exact = backtest(&demand, Capacity::Reserved1y, reserved, on_demand, &config).unwrap();
        config.sizing = Sizing::UtilizationFloor(0.95);
        config.lookback_days.clear();
        let floored =
            backtest(&demand, Capacity::Reserved1y, reserved, on_demand, &config).unwrap();
        for result in [&exact.ours, &floored.ours]
            .into_iter()
            .chain(&exact.lookbacks)
        {
            print(result);
            assert_eq!(result.windows.len(), 6);
            assert!(
                result
                    .windows
                    .iter()
                    .all(|w| w.regret.is_some_and(f64::is_finite))
            );
        }
        // The cheapest count fitted on the previous month is within 2 points of hindsight
        // in every held-out month.
        assert!(exact.ours.max_regret.unwrap() < 2.0);
        // A utilization floor buys a busier commitment with part of the saving.
        assert!(floored.ours.utilization.unwrap() > exact.ours.utilization.unwrap() + 0.05);
        assert!(floored.ours.saving < exact.ours.saving);
    }
}
