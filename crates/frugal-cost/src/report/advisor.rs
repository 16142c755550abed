//! The training advisor's levers, from what `frugal train`'s watchdog measured on each
//! segment: runs that compute in FP32 or TF32 on accelerators with a faster precision, and
//! runs whose input pipeline stalls their steps; and each run's MFU for its report line.

use std::collections::HashMap;

use super::lever::Lever;
use crate::catalog::{Catalog, Faster};
use crate::event::Precision;
use crate::ledger::{Ledger, LedgerError, TrainingSegment, Window};
use crate::money::{Millis, Money};
use crate::present::{pct, pct1};

/// The most MFU a run is believed to reach at a faster precision's peak: beyond it, a
/// speedup is not credited.
pub const MFU_CEILING: f64 = 0.5;
/// A run waiting on data less than this share of its steps is left out: every loader
/// waits a little.
pub const MIN_STALL: f64 = 0.05;

/// What the advisor found over a report's window.
#[derive(Debug, Default)]
pub(super) struct Advice {
    pub levers: Vec<Lever>,
    /// Per run (its id, or its workload without one).
    pub runs: HashMap<String, RunAdvice>,
}

/// One run's figures over its advised segments in the window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunAdvice {
    /// MFU over the segments that know it, weighted by their time.
    pub mfu: Option<f64>,
    /// The precision it spent most time in.
    pub precision: Option<Precision>,
    /// Share of its step time spent waiting on data, weighted by cost.
    pub data_stall: Option<f64>,
}

/// The saving of moving one segment's compute to a faster precision: its compute share of
/// the cost, less that share divided by the peak's rise, but no faster than the run
/// reaching [`MFU_CEILING`] of the new peak. `mfu` is over the whole step (waits included);
/// without it the saving is the uncapped upper bound.
pub fn precision_saving(cost: Money, faster: &Faster, mfu: Option<f64>, compute: f64) -> Money {
    let compute = compute.clamp(0.0, 1.0);
    let ratio = faster.ratio();
    if compute <= 0.0 || ratio <= 1.0 {
        return Money::ZERO;
    }
    // The compute share's time at the new peak: divided by the ratio, unless that would
    // mean an MFU above the ceiling (the work needs mfu / ceiling of the old peak's time).
    let floor = mfu.map_or(0.0, |m| m.max(0.0) / MFU_CEILING / ratio);
    let after = (compute / ratio).max(floor).min(compute);
    cost.scale(compute - after)
}

/// One run's sums.
#[derive(Default)]
struct RunAcc {
    cost: Money,
    /// Time-weighted MFU: sum of mfu · ms, and the ms.
    mfu_ms: f64,
    mfu_weight: f64,
    precision_ms: HashMap<Precision, Millis>,
    stall_cost: Money,
    /// Cost of the segments that report a data stall.
    stall_base: Money,
    saving: Money,
    /// The faster precision of its largest saving, where it ran, and that segment's figures.
    lever: Option<PrecisionCase>,
}

#[derive(Clone)]
struct PrecisionCase {
    faster: Faster,
    on: String,
    saving: Money,
    mfu: Option<f64>,
    compute: f64,
}

/// Reads the advised training segments in `window` and turns them into levers.
pub(super) fn advise(
    ledger: &Ledger,
    catalog: &Catalog,
    window: Window,
) -> Result<Advice, LedgerError> {
    let (since, until) = {
        let w = window.whole_hours();
        (
            w.since_ms.unwrap_or(Millis::MIN),
            w.until_ms.unwrap_or(Millis::MAX),
        )
    };
    let mut runs: HashMap<String, RunAcc> = HashMap::new();
    ledger.training_segments(window, |s| {
        let name = s.run.clone().unwrap_or_else(|| s.workload.clone());
        add(runs.entry(name).or_default(), catalog, s, since, until);
    })?;
    let mut advice = Advice::default();
    advice.levers.extend(precision_lever(&runs));
    advice.levers.extend(stall_lever(&runs));
    advice.runs = runs
        .into_iter()
        .map(|(name, acc)| {
            let figures = RunAdvice {
                mfu: (acc.mfu_weight > 0.0).then(|| acc.mfu_ms / acc.mfu_weight),
                precision: acc
                    .precision_ms
                    .iter()
                    .max_by_key(|(p, ms)| (**ms, std::cmp::Reverse(**p)))
                    .map(|(p, _)| *p),
                data_stall: (acc.stall_base > Money::ZERO)
                    .then(|| acc.stall_cost.as_f64() / acc.stall_base.as_f64()),
            };
            (name, figures)
        })
        .collect();
    Ok(advice)
}

/// Adds the part of segment `s` inside `[since, until)` to its run.
fn add(acc: &mut RunAcc, catalog: &Catalog, s: &TrainingSegment, since: Millis, until: Millis) {
    let end = s.ts_ms.saturating_add(s.duration_ms.max(0));
    let inside = end.min(until).saturating_sub(s.ts_ms.max(since)).max(0);
    let cost = if s.duration_ms > 0 {
        s.cost
            .mul_div(i128::from(inside), i128::from(s.duration_ms))
            .unwrap_or(Money::ZERO)
    } else {
        s.cost
    };
    acc.cost += cost;
    if let Some(m) = s.mfu.filter(|m| m.is_finite()) {
        let weight = inside.max(1) as f64;
        acc.mfu_ms += m * weight;
        acc.mfu_weight += weight;
    }
    if let Some(p) = s.precision {
        *acc.precision_ms.entry(p).or_default() += inside;
    }
    if let Some(stall) = s.data_stall {
        acc.stall_cost += cost.scale(stall.clamp(0.0, 1.0));
        acc.stall_base += cost;
    }
    let Some((faster, on)) = faster_precision(catalog, s) else {
        return;
    };
    let compute = 1.0 - s.data_stall.unwrap_or(0.0) - s.sync_stall.unwrap_or(0.0);
    let saving = precision_saving(cost, &faster, s.mfu, compute);
    acc.saving += saving;
    if acc.lever.as_ref().is_none_or(|c| saving > c.saving) {
        acc.lever = Some(PrecisionCase {
            faster,
            on,
            saving,
            mfu: s.mfu,
            compute: compute.clamp(0.0, 1.0),
        });
    }
}

/// The faster precision the segment's accelerator has, and "8 x A100".
fn faster_precision(catalog: &Catalog, s: &TrainingSegment) -> Option<(Faster, String)> {
    let offer = catalog
        .instance(s.instance_type.as_deref()?, s.region.as_deref())
        .ok()?;
    let peaks = catalog.peaks(offer.accelerator.as_deref()?)?;
    let faster = peaks.faster_than(s.precision?)?;
    let on = if offer.accelerator_count == 1.0 {
        peaks.accelerator.clone()
    } else {
        format!("{} x {}", offer.accelerator_count, peaks.accelerator)
    };
    Some((faster, on))
}

/// The runs with the most at stake first (by name on a tie), with what is at stake.
fn ranked(
    runs: &HashMap<String, RunAcc>,
    stake: impl Fn(&RunAcc) -> Money,
) -> Vec<(&str, &RunAcc, Money)> {
    let mut out: Vec<_> = runs
        .iter()
        .map(|(name, acc)| (name.as_str(), acc, stake(acc)))
        .filter(|(_, _, m)| *m > Money::ZERO)
        .collect();
    out.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(b.0)));
    out
}

/// "; 2 more runs: $1.20".
fn others(rest: &[(&str, &RunAcc, Money)]) -> String {
    match rest.len() {
        0 => String::new(),
        n => format!(
            "; {n} more run{}: {}",
            if n == 1 { "" } else { "s" },
            rest.iter().map(|r| r.2).sum::<Money>()
        ),
    }
}

fn precision_lever(runs: &HashMap<String, RunAcc>) -> Option<Lever> {
    let ranked = ranked(runs, |acc| acc.saving);
    let (name, acc, saving) = *ranked.first()?;
    let case = acc.lever.as_ref()?;
    let f = &case.faster;
    let mut basis = format!(
        "run `{name}` computes in {} on {}: {} autocast raises the peak {:.0}x ({} -> {} TFLOPS); ",
        f.from.label(),
        case.on,
        f.to.label(),
        f.ratio(),
        f.from_tflops,
        f.to_tflops
    );
    match case.mfu {
        Some(m) => basis.push_str(&format!(
            "at its MFU of {} that is about {saving} of its {}{}; assumes its compute ({} of \
             each step) keeps its MFU at the new peak, never above {}; memory-bound kernels \
             gain less",
            pct1(m),
            acc.cost,
            others(&ranked[1..]),
            pct(case.compute),
            pct(MFU_CEILING)
        )),
        None => basis.push_str(&format!(
            "its trainer reports no FLOPs, so its MFU is unknown: at most {saving} of its {}{}, \
             its compute ({} of each step) sped up by the whole rise",
            acc.cost,
            others(&ranked[1..]),
            pct(case.compute)
        )),
    }
    Some(Lever {
        lever: "train in a faster precision",
        dollars: ranked.iter().map(|r| r.2).sum(),
        basis,
        action: "torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16) around the forward \
                 pass and loss (FP16: with a GradScaler), or at least \
                 torch.backends.cuda.matmul.allow_tf32 = True; docs/training.md shows the lines"
            .into(),
    })
}

fn stall_lever(runs: &HashMap<String, RunAcc>) -> Option<Lever> {
    let share = |acc: &RunAcc| {
        (acc.stall_base > Money::ZERO).then(|| acc.stall_cost.as_f64() / acc.stall_base.as_f64())
    };
    let ranked = ranked(runs, |acc| {
        if share(acc).is_some_and(|s| s >= MIN_STALL) {
            acc.stall_cost
        } else {
            Money::ZERO
        }
    });
    let (name, acc, stalled) = *ranked.first()?;
    Some(Lever {
        lever: "keep the input pipeline ahead",
        dollars: ranked.iter().map(|r| r.2).sum(),
        basis: format!(
            "input pipeline stalls {} of each step of run `{name}`: more loader workers / \
             prefetch; {stalled} of its {} paid the accelerators to wait{}; assumes loading \
             can overlap compute",
            pct(share(acc).unwrap_or(0.0)),
            acc.stall_base,
            others(&ranked[1..])
        ),
        action: "DataLoader(num_workers=N, pin_memory=True, prefetch_factor=4, \
                 persistent_workers=True), or pre-tokenized, cached data; docs/training.md \
                 shows the lines"
            .into(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::event::{Event, Kind};
    use crate::report::Report;

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    fn a100_fp32() -> Faster {
        let c = Catalog::builtin().unwrap();
        c.peaks("A100")
            .unwrap()
            .faster_than(Precision::Fp32)
            .unwrap()
    }

    /// On an hour: windows count whole hours.
    const T0: Millis = 1_792_998_000_000;
    const HOUR: Millis = 3_600_000;

    /// A two-hour segment of run `run` on `instance`, as `frugal train` records it.
    fn segment(run: &str, instance: &str, cost: &str, precision: Precision) -> Event {
        let mut e = Event::new(T0, Kind::Training, "lm", m(cost));
        e.duration_ms = 2 * HOUR;
        e.run_id = Some(run.into());
        e.instance_type = Some(instance.into());
        e.precision = Some(precision);
        e
    }

    fn report(events: &[Event], window: Window) -> Report {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        ledger.append("t", events).unwrap();
        Report::build(&ledger, &Catalog::builtin().unwrap(), window).unwrap()
    }

    #[test]
    fn levers_of_an_fp32_run_and_a_starved_one_by_hand() {
        // $100 on 8 A100s in FP32 at 3% MFU, 30% of each step waiting on data and 10% on
        // syncs: 60% computes, and at BF16 it takes 1/16 of its time: $56.25 saved.
        let mut fp32 = segment("fp32", "p4d.24xlarge", "100", Precision::Fp32);
        (fp32.mfu, fp32.data_stall, fp32.sync_stall) = (Some(0.03), Some(0.3), Some(0.1));
        // $50 of BF16 on an A10G waiting on data 40% of each step: $20 of waiting.
        let mut starved = segment("starved", "g5.xlarge", "50", Precision::Bf16);
        starved.data_stall = Some(0.4);
        // A loader that waits 2%: not worth a lever.
        let mut quiet = segment("quiet", "g5.xlarge", "10", Precision::Bf16);
        quiet.data_stall = Some(0.02);
        let r = report(&[fp32, starved, quiet], Window::default());
        let lever = |name: &str| r.levers.iter().find(|l| l.lever == name).unwrap();
        let precision = lever("train in a faster precision");
        assert_eq!(precision.dollars, m("56.25"));
        assert!(
            precision.basis.starts_with(
                "run `fp32` computes in FP32 on 8 x A100: BF16 autocast raises the peak 16x \
                 (19.5 -> 312 TFLOPS); at its MFU of 3.0% that is about $56.25 of its $100.00; \
                 assumes its compute (60% of each step)"
            ),
            "{}",
            precision.basis
        );
        // $30 of the FP32 run's waiting, and the A10G run's $20.
        let stall = lever("keep the input pipeline ahead");
        assert_eq!(stall.dollars, m("50"));
        assert!(
            stall.basis.starts_with(
                "input pipeline stalls 30% of each step of run `fp32`: more loader workers / \
                 prefetch; $30.00 of its $100.00 paid the accelerators to wait; 1 more run: $20.00"
            ),
            "{}",
            stall.basis
        );
        // Ranked by dollars with the others.
        let dollars: Vec<Money> = r.levers.iter().map(|l| l.dollars).collect();
        assert!(dollars.windows(2).all(|w| w[0] >= w[1]), "{dollars:?}");
        let run = r.training.iter().find(|l| l.run == "fp32").unwrap();
        assert_eq!(
            (run.mfu, run.precision, run.data_stall),
            (Some(0.03), Some(Precision::Fp32), Some(0.3))
        );
    }

    #[test]
    fn a_window_counts_the_part_of_a_segment_inside_it() {
        let mut fp32 = segment("fp32", "p4d.24xlarge", "100", Precision::Fp32);
        (fp32.mfu, fp32.data_stall) = (Some(0.03), Some(0.4));
        let second_hour = Window {
            since_ms: Some(T0 + HOUR),
            until_ms: None,
        };
        let r = report(&[fp32.clone()], second_hour);
        let dollars: Vec<(&str, Money)> = r.levers.iter().map(|l| (l.lever, l.dollars)).collect();
        // Half of it: $50, 60% computing: $50 · 0.6 · 15/16 = $28.125; $20 of waiting.
        assert!(
            dollars.contains(&("train in a faster precision", m("28.125"))),
            "{dollars:?}"
        );
        assert!(
            dollars.contains(&("keep the input pipeline ahead", m("20"))),
            "{dollars:?}"
        );
        // Without FLOPs the saving is the upper bound, and says so.
        fp32.mfu = None;
        let r = report(&[fp32], Window::default());
        let basis = &r
            .levers
            .iter()
            .find(|l| l.dollars == m("56.25"))
            .unwrap()
            .basis;
        assert!(
            basis.contains("its MFU is unknown: at most $56.25"),
            "{basis}"
        );
    }

    #[test]
    fn precision_saving_by_hand() {
        let f = a100_fp32();
        // $100, 60% of it computing, MFU 3% of the FP32 peak: at BF16 the compute takes
        // 1/16 of its time (an MFU of 0.03 / 0.6 = 5% of the new peak, under the ceiling):
        // $100 · 0.6 · (1 - 1/16) = $56.25.
        assert_eq!(precision_saving(m("100"), &f, Some(0.03), 0.6), m("56.25"));
        // Unknown MFU: the same, uncapped.
        assert_eq!(precision_saving(m("100"), &f, None, 0.6), m("56.25"));
        // MFU 80% of the FP32 peak, all compute: at 16x it would be 80% of the BF16 peak,
        // beyond belief; at 50% the work takes 0.8 / 0.5 / 16 = 10% of the time: $90.
        assert_eq!(precision_saving(m("100"), &f, Some(0.8), 1.0), m("90"));
        // Nothing computes, or nothing is faster: nothing saved.
        assert_eq!(precision_saving(m("100"), &f, Some(0.03), 0.0), Money::ZERO);
        let same = Faster {
            to_tflops: f.from_tflops,
            ..f
        };
        assert_eq!(precision_saving(m("100"), &same, None, 1.0), Money::ZERO);
    }
}
