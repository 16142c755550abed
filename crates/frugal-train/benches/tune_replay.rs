//! ASHA against random search at equal compute, replayed on the example trainer's
//! full-budget ranking (data/tune/example-trainer-ranking.csv: 64 configurations, each
//! trained to the end once by `scripts/tune-ranking.sh`). For each seed the trials come in
//! another order; each search's choice is judged by its full-budget held-out loss.
//!
//! `cargo bench -p frugal-train --bench tune_replay [-- FILE.csv]`
#![allow(clippy::print_stdout)]

use frugal_train::tune::replay::{Table, asha, random, shuffle};
use frugal_train::tune::{AshaConfig, Mode};

const RANKING: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../data/tune/example-trainer-ranking.csv"
);
const SEEDS: u64 = 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` passes `--bench`; a path argument names another ranking.
    let path = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .unwrap_or_else(|| RANKING.to_owned());
    let table = Table::from_csv(&std::fs::read_to_string(&path)?)?;
    let mode = Mode::Min;
    let ranking = table.ranking(mode);
    let best = ranking[0].1;
    let n = table.rows.len();
    let max = *table.rungs.last().ok_or("no rungs")?;
    let config = AshaConfig {
        mode,
        min_resource: table.rungs[0],
        max_resource: max,
        reduction_factor: 4,
        max_trials: None,
    };
    let all = max * n as u64;
    println!(
        "{n} configurations, rungs {:?}; the best ends at {best:.4} ({})",
        table.rungs, table.rows[ranking[0].0].name
    );
    for (slots, speculate) in [(1, false), (2, false), (2, true), (4, false), (4, true)] {
        println!(
            "\n{slots} slots{}   ASHA: rank  loss    +%     compute  busy   | random, same compute: rank  loss    +%",
            if speculate { ", --speculate" } else { "" }
        );
        let (mut a_gap, mut r_gap, mut a_within, mut r_within, mut used, mut busy) =
            (0.0, 0.0, 0, 0, 0.0, 0.0);
        for seed in 0..SEEDS {
            let order = shuffle(n, seed);
            let a = asha(&table, &config, &order, slots, speculate);
            let k = ((a.resource as f64 / max as f64).round() as usize).max(1);
            let r = random(&table, mode, &shuffle(n, seed + 1000), k);
            let gap = |m: f64| 100.0 * (m / best - 1.0);
            println!(
                "seed {seed:>2}        {:>4}  {:.4} {:>5.2}%  {:>5.1}%  {:>4.0}%  |                        {:>4}  {:.4} {:>5.2}%",
                table.rank(mode, a.row),
                a.metric,
                gap(a.metric),
                100.0 * a.resource as f64 / all as f64,
                100.0 * a.utilization,
                table.rank(mode, r.row),
                r.metric,
                gap(r.metric)
            );
            a_gap += gap(a.metric);
            r_gap += gap(r.metric);
            a_within += usize::from(gap(a.metric) <= 1.0);
            r_within += usize::from(gap(r.metric) <= 1.0);
            used += a.resource as f64 / all as f64;
            busy += a.utilization;
        }
        let s = SEEDS as f64;
        println!(
            "mean: ASHA +{:.2}% from the best, within 1% in {a_within}/{SEEDS} seeds, {:.1}% of the compute, slots busy {:.0}%; random +{:.2}%, within 1% in {r_within}/{SEEDS}",
            a_gap / s,
            100.0 * used / s,
            100.0 * busy / s,
            r_gap / s
        );
    }
    Ok(())
}
