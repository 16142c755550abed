//! `frugal eval-cache`: the semantic cache measured on labelled question pairs. The guard's
//! threshold is chosen on the tuning split; the held-out split reports what it keeps.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use frugal_semantic::eval::{self, Point, Scored};
use frugal_semantic::{Embedder, FlatIndex, Guard};

use crate::cli::EvalCacheArgs;
use crate::progress::Bar;
use crate::table;
use frugal_cost::present::chart::{self, Chart, Mark, Series};
use frugal_cost::present::pct1;

pub fn run(args: &EvalCacheArgs) -> Result<()> {
    if !(0.0..=1.0).contains(&args.max_wrong) || !(0.0..1.0).contains(&args.held_out) {
        bail!("--max-wrong and --held-out are shares between 0 and 1");
    }
    let embedder = Embedder::load(&args.embedder).with_context(|| {
        format!(
            "cannot load the embedder from {} (scripts/fetch-models.sh minilm)",
            args.embedder.display()
        )
    })?;
    let mut pairs = eval::read_pairs(&args.pairs)?;
    if let Some(limit) = args.limit.filter(|&l| l > 0 && l < pairs.len()) {
        let step = pairs.len() / limit;
        pairs = pairs.into_iter().step_by(step).take(limit).collect();
    }
    let bar = Bar::count("embedding pairs");
    frugal_cost::Progress::start(&bar, pairs.len() as u64);
    let scored = eval::score_pairs(&embedder, &pairs, &|| {
        frugal_cost::Progress::advance(&bar, 1)
    })?;
    frugal_cost::Progress::finish(&bar);
    let (mut tune, mut held) = (Vec::new(), Vec::new());
    for (p, s) in pairs.iter().zip(scored) {
        if eval::is_held_out(p, args.held_out) {
            held.push(s);
        } else {
            tune.push(s);
        }
    }
    let count = |v: &[Scored]| {
        (
            v.iter().filter(|s| s.label).count(),
            v.iter().filter(|s| !s.label).count(),
        )
    };
    let (td, tn) = count(&tune);
    let (hd, hn) = count(&held);

    let plain = Guard {
        threshold: 0.0,
        vetoes: false,
    };
    let guarded = Guard {
        threshold: 0.0,
        vetoes: true,
    };
    let grid: Vec<f32> = [0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98].to_vec();
    let plain_pts = eval::sweep(plain, &held, &grid);
    let guarded_pts = eval::sweep(guarded, &held, &grid);
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} pairs: tuning {td} duplicates + {tn} others, held-out {hd} + {hn}\n",
        pairs.len()
    )?;
    writeln!(
        out,
        "Held-out split: share of duplicates served (hit) and of other pairs served (wrong)"
    )?;
    let mut t = table::new(&[
        "cosine >=>",
        "plain hit>",
        "plain wrong>",
        "guarded hit>",
        "guarded wrong>",
    ]);
    for (p, g) in plain_pts.iter().zip(&guarded_pts) {
        t.add_row(vec![
            format!("{:.2}", p.threshold),
            pct1(p.hit_rate),
            pct1(p.wrong_rate),
            pct1(g.hit_rate),
            pct1(g.wrong_rate),
        ]);
    }
    writeln!(out, "{t}\n")?;

    let mut t = table::new(&[
        "rule",
        "threshold (tuning)>",
        "tuning hit>",
        "tuning wrong>",
        "held-out hit>",
        "held-out wrong>",
    ]);
    let mut chosen = Vec::new();
    for (name, g) in [("plain cosine", plain), ("guarded", guarded)] {
        let g = Guard {
            threshold: eval::pick_threshold(g, &tune, args.max_wrong),
            ..g
        };
        let (a, b) = (eval::measure(&g, &tune), eval::measure(&g, &held));
        t.add_row(vec![
            name.to_owned(),
            format!("{:.4}", g.threshold),
            pct1(a.hit_rate),
            pct1(a.wrong_rate),
            pct1(b.hit_rate),
            pct1(b.wrong_rate),
        ]);
        chosen.push((name, g, b));
    }
    writeln!(
        out,
        "Lowest threshold with <= {} wrong hits on the tuning split",
        pct1(args.max_wrong)
    )?;
    writeln!(out, "{t}\n")?;

    let at = chosen
        .last()
        .map_or(Guard::default().threshold, |c| c.1.threshold);
    let mut t = table::new(&["veto", "duplicates turned away>", "others turned away>"]);
    for (v, dup, other) in eval::veto_counts(&held, 0.80) {
        t.add_row(vec![
            v.name().to_owned(),
            dup.to_string(),
            other.to_string(),
        ]);
    }
    writeln!(out, "Vetoes among held-out pairs at cosine >= 0.80")?;
    writeln!(out, "{t}\n")?;

    let cost = own_cost(&embedder, &pairs)?;
    writeln!(
        out,
        "Cost of a lookup (one thread): embed p50 {:.2} ms, p99 {:.2} ms over {} questions; \
         search of {} entries {:.3} ms; {} bytes per entry for the vector",
        cost.embed_p50_ms,
        cost.embed_p99_ms,
        cost.samples,
        cost.entries,
        cost.search_ms,
        cost.bytes_per_entry
    )?;
    writeln!(
        out,
        "Default threshold in this build: {:.4}; chosen here: {at:.4}",
        Guard::default().threshold
    )?;
    if let Some(path) = &args.html {
        let fine: Vec<f32> = (0..=60).map(|i| 0.70 + i as f32 * 0.005).collect();
        let curve = |g: Guard| -> Vec<(f64, f64)> {
            eval::sweep(g, &held, &fine)
                .iter()
                .map(|p| (p.wrong_rate * 100.0, p.hit_rate * 100.0))
                .collect()
        };
        let marks = chosen
            .iter()
            .map(|(name, g, p)| Mark {
                label: format!("{name} at {:.4}", g.threshold),
                x: p.wrong_rate * 100.0,
                y: p.hit_rate * 100.0,
            })
            .collect();
        let chart = Chart {
            title: "Semantic cache on QQP pairs (held-out split)".into(),
            x_label: "wrong hits, % of other pairs".into(),
            y_label: "hits, % of duplicates".into(),
            x_range: (0.0, 20.0),
            y_range: (0.0, 100.0),
            series: vec![
                Series {
                    name: "plain cosine".into(),
                    colour: "#999999",
                    points: curve(plain),
                },
                Series {
                    name: "guarded".into(),
                    colour: "#1f77b4",
                    points: curve(guarded),
                },
            ],
            marks,
        };
        let caption = format!(
            "Cosine thresholds 0.70 to 1.00; {hd} duplicate and {hn} other held-out pairs. Marked: the thresholds chosen on the tuning split for <= {} wrong hits.",
            pct1(args.max_wrong)
        );
        std::fs::write(
            path,
            chart::page("frugal eval-cache", &[(&chart, &caption)]),
        )
        .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let points = |pts: &[Point]| -> Vec<serde_json::Value> {
            pts.iter()
                .map(|p| serde_json::json!({"threshold": p.threshold, "hit": p.hit_rate, "wrong": p.wrong_rate}))
                .collect()
        };
        let v = serde_json::json!({
            "pairs": pairs.len(),
            "held_out": {"duplicates": hd, "others": hn},
            "plain": points(&plain_pts),
            "guarded": points(&guarded_pts),
            "chosen": chosen.iter().map(|(n, g, p)| serde_json::json!({"rule": n, "threshold": g.threshold, "held_hit": p.hit_rate, "held_wrong": p.wrong_rate})).collect::<Vec<_>>(),
            "embed_p50_ms": cost.embed_p50_ms,
            "embed_p99_ms": cost.embed_p99_ms,
            "search_ms": cost.search_ms,
            "search_entries": cost.entries,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

struct OwnCost {
    embed_p50_ms: f64,
    embed_p99_ms: f64,
    samples: usize,
    search_ms: f64,
    entries: usize,
    bytes_per_entry: usize,
}

/// Embedding latency of single questions on this thread, and a flat search over an index
/// holding the embedded questions repeated to 10,000 entries.
fn own_cost(e: &Embedder, pairs: &[eval::Pair]) -> Result<OwnCost> {
    let texts: Vec<&str> = pairs.iter().take(300).map(|p| p.text_b.as_str()).collect();
    let mut times = Vec::with_capacity(texts.len());
    let mut vectors = Vec::with_capacity(texts.len());
    for t in &texts {
        let start = Instant::now();
        vectors.push(e.embed(t)?);
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        times
            .get(((times.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let entries = 10_000;
    let mut index = FlatIndex::new(e.dim());
    for i in 0..entries {
        if let Some(v) = vectors.get(i % vectors.len().max(1)) {
            index.add(i as u64, v);
        }
    }
    let start = Instant::now();
    for v in &vectors {
        std::hint::black_box(index.search(v, 4));
    }
    Ok(OwnCost {
        embed_p50_ms: quantile(0.5),
        embed_p99_ms: quantile(0.99),
        samples: times.len(),
        search_ms: start.elapsed().as_secs_f64() * 1e3 / vectors.len().max(1) as f64,
        entries: index.len(),
        bytes_per_entry: index.bytes_per_entry(),
    })
}
