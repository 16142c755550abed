//! Replays a search on a full-budget ranking: every configuration of a space run to the end
//! once, with its metric at each rung and its time per step (a "tabular benchmark", as
//! HPOBench and LCBench do). ASHA (this crate's scheduler, on simulated parallel slots)
//! and random search at the same compute then run over it for many seeds in milliseconds,
//! and each choice is judged by its full-budget metric. A promoted trial resumes exactly
//! (the example trainer is bit-for-bit resumable), so a rung's result in the table is what
//! the real search sees.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::asha::{Asha, AshaConfig, Job, Mode};

/// One configuration run to the end.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub name: String,
    /// The metric at each rung, in rung order.
    pub metrics: Vec<f64>,
    /// Seconds per unit of resource (a step).
    pub seconds_per_unit: f64,
}

/// A full-budget ranking: rows of one space, at the same rungs.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub rungs: Vec<u64>,
    pub rows: Vec<Row>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TableError {
    #[error("line {line}: {reason}")]
    Bad { line: usize, reason: String },
}

impl Table {
    /// Reads CSV with a header: `config`, any parameter columns, `<metric>@<resource>` for
    /// each rung, and `step_s`.
    pub fn from_csv(text: &str) -> Result<Table, TableError> {
        let bad = |line: usize, reason: String| TableError::Bad { line, reason };
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let (_, header) = lines.next().ok_or_else(|| bad(1, "no header".into()))?;
        let cols: Vec<&str> = header.split(',').map(str::trim).collect();
        let mut rung_cols = Vec::new();
        for (i, c) in cols.iter().enumerate() {
            if let Some((_, r)) = c.rsplit_once('@') {
                let r: u64 = r
                    .parse()
                    .map_err(|_| bad(1, format!("column {c}: `{r}` is not a resource")))?;
                rung_cols.push((i, r));
            }
        }
        let find = |name: &str| {
            cols.iter()
                .position(|c| *c == name)
                .ok_or_else(|| bad(1, format!("no `{name}` column")))
        };
        let (name_col, time_col) = (find("config")?, find("step_s")?);
        if rung_cols.is_empty() {
            return Err(bad(1, "no `<metric>@<resource>` column".into()));
        }
        let mut rows = Vec::new();
        for (n, line) in lines {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if f.len() != cols.len() {
                return Err(bad(
                    n + 1,
                    format!("{} fields, the header has {}", f.len(), cols.len()),
                ));
            }
            let num = |i: usize| {
                f[i].parse::<f64>()
                    .map_err(|_| bad(n + 1, format!("{}: `{}` is not a number", cols[i], f[i])))
            };
            rows.push(Row {
                name: f[name_col].to_owned(),
                metrics: rung_cols
                    .iter()
                    .map(|&(i, _)| num(i))
                    .collect::<Result<_, _>>()?,
                seconds_per_unit: num(time_col)?,
            });
        }
        Ok(Table {
            rungs: rung_cols.iter().map(|&(_, r)| r).collect(),
            rows,
        })
    }

    /// The full-budget metric of each row, best first: `(row, metric)`.
    pub fn ranking(&self, mode: Mode) -> Vec<(usize, f64)> {
        let mut r: Vec<(usize, f64)> = self
            .rows
            .iter()
            .enumerate()
            .map(|(i, row)| (i, row.metrics.last().copied().unwrap_or(f64::NAN)))
            .collect();
        r.sort_by(|a, b| better(mode, a.1, b.1));
        r
    }

    /// 1-based rank of `row` in the full-budget ranking.
    pub fn rank(&self, mode: Mode, row: usize) -> usize {
        self.ranking(mode)
            .iter()
            .position(|&(i, _)| i == row)
            .map_or(self.rows.len(), |p| p + 1)
    }
}

fn better(mode: Mode, a: f64, b: f64) -> std::cmp::Ordering {
    let key = |x: f64| if x.is_nan() { f64::INFINITY } else { x };
    match mode {
        Mode::Min => key(a).total_cmp(&key(b)),
        Mode::Max => key(-a).total_cmp(&key(-b)),
    }
}

/// What one search chose and what it used.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The row chosen.
    pub row: usize,
    /// Its full-budget metric.
    pub metric: f64,
    /// Resource used, all trials together.
    pub resource: u64,
    /// Busy slot time over the slots' time until the last trial ended.
    pub utilization: f64,
}

/// ASHA over the table's rows in `order` (trial k is row `order[k]`), on `slots` parallel
/// slots in simulated time: each job takes its resource times its row's seconds per unit.
/// With `speculate`, a slot that would wait promotes ahead of its turn what fits
/// ([`Asha::speculate`]).
pub fn asha(
    table: &Table,
    config: &AshaConfig,
    order: &[usize],
    slots: usize,
    speculate: bool,
) -> Choice {
    let mut asha = Asha::new(AshaConfig {
        max_trials: Some(u32::try_from(order.len()).unwrap_or(u32::MAX)),
        ..config.clone()
    });
    let rungs = asha.rungs().to_vec();
    // Running jobs by end time (nanoseconds): (end, trial, rung, started).
    let mut running: BinaryHeap<Reverse<(u64, u32, usize, u64)>> = BinaryHeap::new();
    let (mut now, mut busy) = (0u64, 0u64);
    let duration = |trial: u32, from: u64, to: u64| {
        let row = &table.rows[order[trial as usize]];
        ((to - from) as f64 * row.seconds_per_unit * 1e9) as u64
    };
    loop {
        while running.len() < slots {
            let mut job = asha.next_job();
            if job == Job::Wait && speculate {
                // Ahead of its turn, only if it ends before the running jobs do.
                let last = running.iter().map(|r| r.0.0).max().unwrap_or(now);
                let fits = |t: u32, k: usize| now + duration(t, rungs[k], rungs[k + 1]) <= last;
                job = asha.speculate(fits).unwrap_or(Job::Wait);
            }
            let Some((trial, rung)) = job.target() else {
                break;
            };
            let from = match job {
                Job::Promote { from_rung, .. } => rungs[from_rung],
                _ => 0,
            };
            let ns = duration(trial, from, rungs[rung]);
            running.push(Reverse((now + ns, trial, rung, now)));
        }
        let Some(Reverse((end, trial, rung, started))) = running.pop() else {
            break;
        };
        now = end;
        busy += end - started;
        let metric = table.rows[order[trial as usize]].metrics[rung];
        // A report the scheduler expects cannot fail.
        let _ = asha.report(trial, rung, metric);
    }
    let (trial, _) = asha.best().unwrap_or((0, f64::NAN));
    let row = order.get(trial as usize).copied().unwrap_or(0);
    Choice {
        row,
        metric: table.rows[row].metrics.last().copied().unwrap_or(f64::NAN),
        resource: asha.resource_used(),
        utilization: if now == 0 {
            0.0
        } else {
            busy as f64 / (slots as f64 * now as f64)
        },
    }
}

/// Random search: the first `k` rows of `order`, each run to the end; the best is chosen.
pub fn random(table: &Table, mode: Mode, order: &[usize], k: usize) -> Choice {
    let max = table.rungs.last().copied().unwrap_or(0);
    let picked = &order[..k.clamp(1, order.len())];
    let row = picked
        .iter()
        .copied()
        .min_by(|&a, &b| {
            let m = |i: usize| table.rows[i].metrics.last().copied().unwrap_or(f64::NAN);
            better(mode, m(a), m(b))
        })
        .unwrap_or(0);
    Choice {
        row,
        metric: table.rows[row].metrics.last().copied().unwrap_or(f64::NAN),
        resource: max * picked.len() as u64,
        utilization: 1.0,
    }
}

/// A seeded permutation of `0..n` (Fisher-Yates over SplitMix64): the same on every host.
pub fn shuffle(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn table(n: usize) -> Table {
        // Row i's loss falls with the resource and ends at 1 + |i - 7| / 10: row 7 is best,
        // and early results rank rows as the final ones do, with noise.
        let rows = (0..n)
            .map(|i| {
                let end = 1.0 + (i as f64 - 7.0).abs() / 10.0;
                let wobble = if i % 3 == 0 { 0.05 } else { 0.0 };
                Row {
                    name: format!("c{i}"),
                    metrics: vec![end + 1.0 + wobble, end + 0.3, end],
                    seconds_per_unit: 0.001 * (1 + i % 4) as f64,
                }
            })
            .collect();
        Table {
            rungs: vec![100, 400, 1600],
            rows,
        }
    }

    fn config() -> AshaConfig {
        crate::tune::asha::test_config(Mode::Min, None)
    }

    #[test]
    fn reads_a_ranking_and_refuses_a_broken_one() {
        let t = Table::from_csv(
            "config,lr,eval_loss@100,eval_loss@1600,step_s\nc0,0.1,3.0,2.0,0.002\nc1,0.2,2.5,2.1,0.001\n",
        )
        .unwrap();
        assert_eq!(t.rungs, [100, 1600]);
        assert_eq!(t.rows[1].metrics, [2.5, 2.1]);
        assert_eq!(t.ranking(Mode::Min)[0].0, 0);
        assert_eq!(t.rank(Mode::Max, 0), 2);
        let err = Table::from_csv("config,a@100,step_s\nc0,x,1\n").unwrap_err();
        assert_eq!(err.to_string(), "line 2: a@100: `x` is not a number");
        assert!(Table::from_csv("config,step_s\nc0,1\n").is_err());
    }

    #[test]
    fn asha_finds_the_best_with_a_fraction_of_the_compute() {
        let t = table(64);
        let order = shuffle(64, 3);
        let c = asha(&t, &config(), &order, 4, false);
        assert_eq!(c.row, 7, "{c:?}");
        // Synchronous halving would take 64 trials to 100, 16 to 400 and 4 to 1600; the
        // asynchronous promotions of the first results add a few.
        let halving = 64 * 100 + 16 * 300 + 4 * 1200;
        assert!(c.resource >= halving && c.resource < 64 * 1600 / 4, "{c:?}");
        assert!(c.utilization > 0.75 && c.utilization <= 1.0, "{c:?}");
        let r = random(&t, Mode::Min, &order, 10);
        assert_eq!(r.resource, 16_000);
        assert!(r.metric >= c.metric);
    }

    #[test]
    fn shuffles_are_permutations_fixed_by_the_seed() {
        let a = shuffle(64, 1);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..64).collect::<Vec<_>>());
        assert_eq!(a, shuffle(64, 1));
        assert_ne!(a, shuffle(64, 2));
    }
}
