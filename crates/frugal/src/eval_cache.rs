//! `frugal eval-cache`: the semantic cache measured on labelled question pairs: QQP's, and
//! the near misses and paraphrases of `data/semantic-cache/nearmiss.json` per kind. The
//! guard's threshold is chosen on the tuning halves; the held-out halves report what it keeps.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use frugal_semantic::eval::{self, KindRate, Pair, Point, Scored};
use frugal_semantic::{Embedder, FlatIndex, Guard, Verdict};

use crate::cli::EvalCacheArgs;
use crate::progress::Bar;
use crate::table;
use frugal_cost::present::chart::{self, Chart, Mark, Series};
use frugal_cost::present::pct1;

/// The near-miss set `eval-cache` reads when it exists and none is named.
const NEAR_MISS: &str = "data/semantic-cache/nearmiss.json";

/// One file's pairs, scored, split into tuning and held-out halves.
struct Split<'a> {
    tune: (Vec<&'a Pair>, Vec<Scored>),
    held: (Vec<&'a Pair>, Vec<Scored>),
}

impl<'a> Split<'a> {
    fn new(pairs: &'a [Pair], scored: Vec<Scored>, held_out: f64) -> Split<'a> {
        let mut s = Split {
            tune: (Vec::new(), Vec::new()),
            held: (Vec::new(), Vec::new()),
        };
        for (p, sc) in pairs.iter().zip(scored) {
            let half = if eval::is_held_out(p, held_out) {
                &mut s.held
            } else {
                &mut s.tune
            };
            half.0.push(p);
            half.1.push(sc);
        }
        s
    }
}

fn counts(v: &[Scored]) -> (usize, usize) {
    let dup = v.iter().filter(|s| s.label).count();
    (dup, v.len() - dup)
}

/// Whether `g` keeps the near misses of `rates` within the limits: overall and per kind.
fn near_misses_ok(rates: &[KindRate], max_wrong: f64, max_kind_wrong: f64) -> bool {
    let near: Vec<&KindRate> = rates.iter().filter(|r| !r.label).collect();
    let (pairs, hits) = near
        .iter()
        .fold((0, 0), |(p, h), r| (p + r.pairs, h + r.hits));
    hits as f64 <= max_wrong * pairs as f64 && near.iter().all(|r| r.rate() <= max_kind_wrong)
}

pub fn run(args: &EvalCacheArgs) -> Result<()> {
    if !(0.0..=1.0).contains(&args.max_wrong)
        || !(0.0..=1.0).contains(&args.max_kind_wrong)
        || !(0.0..1.0).contains(&args.held_out)
    {
        bail!("--max-wrong, --max-kind-wrong and --held-out are shares between 0 and 1");
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
    let near_path: Option<PathBuf> = args
        .near_miss
        .clone()
        .or_else(|| Path::new(NEAR_MISS).exists().then(|| NEAR_MISS.into()));
    let near_pairs = match &near_path {
        Some(p) => eval::read_pairs(p)?,
        None => Vec::new(),
    };
    let bar = Bar::count("embedding pairs");
    frugal_cost::Progress::start(&bar, (pairs.len() + near_pairs.len()) as u64);
    let tick = || frugal_cost::Progress::advance(&bar, 1);
    let scored = eval::score_pairs(&embedder, &pairs, &tick)?;
    let near_scored = eval::score_pairs(&embedder, &near_pairs, &tick)?;
    frugal_cost::Progress::finish(&bar);
    let qqp = Split::new(&pairs, scored, args.held_out);
    let near = Split::new(&near_pairs, near_scored, args.held_out);
    let (tune, held) = (&qqp.tune.1, &qqp.held.1);
    let (td, tn) = counts(tune);
    let (hd, hn) = counts(held);

    let plain = Guard {
        threshold: 0.0,
        aligned_threshold: 0.0,
        vetoes: false,
    };
    let guarded = Guard {
        vetoes: true,
        ..plain
    };
    let grid: Vec<f32> = [0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98].to_vec();
    let plain_pts = eval::sweep(plain, held, &grid);
    let guarded_pts = eval::sweep(guarded, held, &grid);
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
        "aligned pairs>",
        "tuning hit>",
        "tuning wrong>",
        "held-out hit>",
        "held-out wrong>",
    ]);
    // Within the wrong-hit limits on QQP's tuning half and, with vetoes, on the near
    // misses' tuning half overall and per kind.
    let within = |g: &Guard| {
        eval::measure(g, tune).wrong_rate <= args.max_wrong
            && (!g.vetoes
                || near_misses_ok(
                    &eval::by_kind(g, &near.tune.0, &near.tune.1),
                    args.max_wrong,
                    args.max_kind_wrong,
                ))
    };
    let mut chosen = Vec::new();
    for (name, g) in [("plain cosine", plain), ("guarded", guarded)] {
        let g = if g.vetoes {
            eval::best_thresholds(g, tune, within)
        } else {
            let threshold = eval::lowest_threshold(g, within);
            Guard {
                threshold,
                aligned_threshold: threshold,
                ..g
            }
        };
        let (a, b) = (eval::measure(&g, tune), eval::measure(&g, held));
        t.add_row(vec![
            name.to_owned(),
            format!("{:.4}", g.threshold),
            if g.vetoes {
                format!("{:.4}", g.aligned_threshold)
            } else {
                "-".into()
            },
            pct1(a.hit_rate),
            pct1(a.wrong_rate),
            pct1(b.hit_rate),
            pct1(b.wrong_rate),
        ]);
        chosen.push((name, g, b));
    }
    writeln!(
        out,
        "Thresholds with <= {} wrong hits on the tuning split (guarded: also on the near \
         misses' tuning half, and <= {} of any kind; its two thresholds, for all pairs and \
         for pairs whose content words all align, chosen together to serve the most tuning \
         duplicates)",
        pct1(args.max_wrong),
        pct1(args.max_kind_wrong)
    )?;
    writeln!(out, "{t}\n")?;
    let at = chosen.last().map_or(Guard::default(), |c| c.1);

    let mut kinds_json = Vec::new();
    if !near_pairs.is_empty() {
        let name = near_path
            .as_deref()
            .map_or_else(String::new, |p| p.display().to_string());
        let plain_at = Guard {
            vetoes: false,
            ..at
        };
        let rates = |g: &Guard, half: &(Vec<&Pair>, Vec<Scored>)| {
            eval::with_totals(eval::by_kind(g, &half.0, &half.1))
        };
        let (tune_rates, held_rates) = (rates(&at, &near.tune), rates(&at, &near.held));
        let plain_rates = rates(&plain_at, &near.held);
        writeln!(
            out,
            "{name}: hits per kind at the guarded threshold {:.4} (a near miss that hits \
             serves a wrong answer; a paraphrase that hits is a saving)",
            at.threshold
        )?;
        let mut t = table::new(&[
            "kind",
            "pairs",
            "tuning pairs>",
            "tuning hits>",
            "held-out pairs>",
            "held-out hits>",
            "plain cosine, held-out>",
        ]);
        // The same kind and label in another list (absent: no pairs).
        let find = |v: &[KindRate], h: &KindRate| {
            v.iter()
                .find(|r| r.kind == h.kind && r.label == h.label)
                .map_or((0, 0.0), |r| (r.pairs, r.rate()))
        };
        for h in &held_rates {
            let ((tune_pairs, tune_hit), (_, plain_hit)) =
                (find(&tune_rates, h), find(&plain_rates, h));
            t.add_row(vec![
                h.kind.clone(),
                if h.label { "paraphrase" } else { "near miss" }.to_string(),
                tune_pairs.to_string(),
                pct1(tune_hit),
                h.pairs.to_string(),
                pct1(h.rate()),
                pct1(plain_hit),
            ]);
            kinds_json.push(serde_json::json!({
                "kind": h.kind, "paraphrase": h.label,
                "tuning_pairs": tune_pairs, "tuning_hit": tune_hit,
                "held_pairs": h.pairs, "held_hit": h.rate(), "held_plain_hit": plain_hit,
            }));
        }
        writeln!(out, "{t}\n")?;
    }

    let mut t = table::new(&[
        "veto",
        "QQP duplicates turned away>",
        "QQP others turned away>",
        "near misses turned away>",
        "paraphrases turned away>",
    ]);
    let qqp_vetoes = eval::veto_counts(held, 0.80);
    let near_vetoes = eval::veto_counts(&near.held.1, 0.0);
    for ((v, dup, other), (_, para, miss)) in qqp_vetoes.iter().zip(&near_vetoes) {
        t.add_row(vec![
            v.name().to_owned(),
            dup.to_string(),
            other.to_string(),
            miss.to_string(),
            para.to_string(),
        ]);
    }
    writeln!(
        out,
        "Vetoes among held-out pairs (QQP at cosine >= 0.80; near-miss set at any cosine)"
    )?;
    writeln!(out, "{t}\n")?;

    if let Some(path) = &args.tuning_errors {
        // The near misses and paraphrases the vetoes alone (whatever the similarity) let
        // through or refuse, and QQP's pairs the guard serves though labelled different.
        let near_errors = near
            .tune
            .0
            .iter()
            .zip(&near.tune.1)
            .filter(|(_, s)| s.veto.is_none() != s.label);
        let qqp_errors = qqp
            .tune
            .0
            .iter()
            .zip(&qqp.tune.1)
            .filter(|(_, s)| !s.label && eval::hits(&at, s));
        let lines: String = near_errors
            .chain(qqp_errors)
            .map(|(p, s)| {
                let x = frugal_semantic::guard::explain(&p.text_b, &p.text_a, Some(&embedder));
                let line = serde_json::json!({
                    "kind": p.kind.as_deref().unwrap_or("qqp"), "label": s.label,
                    "asked": p.text_b, "cached": p.text_a, "cosine": s.cosine,
                    "veto": x.veto.map(|v| v.name()), "aligned": s.aligned,
                    "replaced": [x.replaced.0, x.replaced.1], "span_similarity": x.span_similarity,
                });
                format!("{line}\n")
            })
            .collect();
        std::fs::write(path, lines).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let cost = own_cost(&embedder, &pairs, &at)?;
    let reading = guard_cost(&embedder, &near_pairs);
    writeln!(
        out,
        "Cost of a lookup (one thread, {} questions, a flat index of {} entries, {} bytes per \
         vector): embed + search p50 {:.2} ms, p99 {:.2} ms; with the guard on the 4 nearest \
         p50 {:.2} ms, p99 {:.2} ms (the guard alone: p50 {:.3} ms, p99 {:.3} ms)",
        cost.samples,
        cost.entries,
        cost.bytes_per_entry,
        cost.search.0,
        cost.search.1,
        cost.lookup.0,
        cost.lookup.1,
        cost.guard.0,
        cost.guard.1,
    )?;
    if let Some((p50, p99, n)) = reading {
        writeln!(
            out,
            "The guard reading a pair it must judge (the {n} near-miss pairs, the embedder on \
             replaced spans): p50 {p50:.3} ms, p99 {p99:.3} ms"
        )?;
    }
    writeln!(
        out,
        "Default thresholds in this build: {:.4} (aligned {:.4}); chosen here: {:.4} (aligned {:.4})",
        Guard::default().threshold,
        Guard::default().aligned_threshold,
        at.threshold,
        at.aligned_threshold
    )?;
    writeln!(
        out,
        "To serve with them (frugal.toml): under [serve], semantic_threshold = {:.4} and \
         semantic_aligned_threshold = {:.4}; on one upstream or route, semantic_threshold = {:.4} \
         (its aligned threshold keeps the same distance below)",
        at.threshold, at.aligned_threshold, at.threshold
    )?;
    if let Some(path) = &args.html {
        write_html(
            path,
            (plain, guarded),
            (held, &near.held.1),
            &chosen,
            args.max_wrong,
        )?;
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
            "chosen": chosen.iter().map(|(n, g, p)| serde_json::json!({"rule": n, "threshold": g.threshold, "aligned_threshold": g.aligned_threshold, "held_hit": p.hit_rate, "held_wrong": p.wrong_rate})).collect::<Vec<_>>(),
            "kinds": kinds_json,
            "embed_p50_ms": cost.embed.0,
            "embed_p99_ms": cost.embed.1,
            "search_ms": cost.search_only_ms,
            "search_entries": cost.entries,
            "lookup_p50_ms": cost.lookup.0,
            "lookup_p99_ms": cost.lookup.1,
            "lookup_without_guard_p50_ms": cost.search.0,
            "lookup_without_guard_p99_ms": cost.search.1,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// What one chart of hit-against-wrong curves shows.
struct Axes<'a> {
    title: &'a str,
    x: &'a str,
    y: &'a str,
    x_max: f64,
}

/// Plain cosine and the guard over `held` at cosine thresholds 0.70 to 1.00: the share of
/// wrong pairs served against the share of right ones.
fn curves(axes: &Axes, held: &[Scored], plain: Guard, guarded: Guard, marks: Vec<Mark>) -> Chart {
    let fine: Vec<f32> = (0..=60).map(|i| 0.70 + i as f32 * 0.005).collect();
    let curve = |g: Guard| -> Vec<(f64, f64)> {
        eval::sweep(g, held, &fine)
            .iter()
            .map(|p| (p.wrong_rate * 100.0, p.hit_rate * 100.0))
            .collect()
    };
    Chart {
        title: axes.title.into(),
        x_label: axes.x.into(),
        y_label: axes.y.into(),
        x_range: (0.0, axes.x_max),
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
    }
}

fn write_html(
    path: &Path,
    (plain, guarded): (Guard, Guard),
    (held, near_held): (&[Scored], &[Scored]),
    chosen: &[(&str, Guard, Point)],
    max_wrong: f64,
) -> Result<()> {
    let mark = |name: &str, g: &Guard, p: &Point| Mark {
        label: format!("{name} at {:.4}", g.threshold),
        x: p.wrong_rate * 100.0,
        y: p.hit_rate * 100.0,
    };
    let qqp = curves(
        &Axes {
            title: "Semantic cache on QQP pairs (held-out split)",
            x: "wrong hits, % of other pairs",
            y: "hits, % of duplicates",
            x_max: 20.0,
        },
        held,
        plain,
        guarded,
        chosen.iter().map(|(n, g, p)| mark(n, g, p)).collect(),
    );
    let (hd, hn) = counts(held);
    let mut charts = vec![(
        qqp,
        format!(
            "Cosine thresholds 0.70 to 1.00; {hd} duplicate and {hn} other held-out pairs. \
             Marked: the thresholds chosen on the tuning split for <= {} wrong hits.",
            pct1(max_wrong)
        ),
    )];
    if !near_held.is_empty() {
        let marks = chosen
            .iter()
            .map(|(n, g, _)| mark(n, g, &eval::measure(g, near_held)))
            .collect();
        let near = curves(
            &Axes {
                title: "Near misses and paraphrases (held-out half)",
                x: "near misses served (wrong answers), %",
                y: "paraphrases served, %",
                x_max: 100.0,
            },
            near_held,
            plain,
            guarded,
            marks,
        );
        let (para, miss) = counts(near_held);
        charts.push((
            near,
            format!(
                "Cosine thresholds 0.70 to 1.00; {para} paraphrases and {miss} near misses of \
                 data/semantic-cache/nearmiss.json. Plain cosine cannot serve paraphrases \
                 without serving near misses; the guard's vetoes hold the near misses near 0."
            ),
        ));
    }
    let refs: Vec<(&Chart, &str)> = charts.iter().map(|(c, t)| (c, t.as_str())).collect();
    std::fs::write(path, chart::page("frugal eval-cache", &refs))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The guard's reading of each pair of `pairs` (as when it is similar enough to judge):
/// p50 and p99 in milliseconds, and how many.
fn guard_cost(e: &Embedder, pairs: &[Pair]) -> Option<(f64, f64, usize)> {
    let times: Vec<f64> = pairs
        .iter()
        .map(|p| {
            let start = Instant::now();
            std::hint::black_box(frugal_semantic::guard::explain(
                &p.text_b,
                &p.text_a,
                Some(e),
            ));
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let n = times.len();
    (n > 0).then(|| {
        let (p50, p99) = quantiles(times);
        (p50, p99, n)
    })
}

/// Quantiles (p50, p99) in milliseconds.
type Quantiles = (f64, f64);

struct OwnCost {
    embed: Quantiles,
    /// Embed + flat search.
    search: Quantiles,
    /// Embed + search + the guard on the nearest candidates (what the cache does).
    lookup: Quantiles,
    guard: Quantiles,
    search_only_ms: f64,
    samples: usize,
    entries: usize,
    bytes_per_entry: usize,
}

fn quantiles(mut ms: Vec<f64>) -> Quantiles {
    ms.sort_by(f64::total_cmp);
    let q = |q: f64| {
        ms.get(((ms.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    (q(0.5), q(0.99))
}

/// A whole lookup of single questions on this thread, as the cache runs it: embed, search
/// a flat index of 10,000 entries (the other side of each pair, repeated), and the guard on
/// the 4 nearest; timed in parts.
fn own_cost(e: &Embedder, pairs: &[Pair], guard: &Guard) -> Result<OwnCost> {
    let sample: Vec<&Pair> = pairs.iter().take(300).collect();
    let mut cached = FlatIndex::new(e.dim());
    let texts: Vec<&str> = sample.iter().map(|p| p.text_a.as_str()).collect();
    let vectors = texts
        .iter()
        .map(|t| e.embed(t))
        .collect::<Result<Vec<_>, _>>()?;
    let entries = 10_000;
    for i in 0..entries {
        if let Some(v) = vectors.get(i % vectors.len().max(1)) {
            cached.add(i as u64, v);
        }
    }
    let (mut embed, mut search, mut lookup, mut judged) = (vec![], vec![], vec![], vec![]);
    let mut search_total = 0.0;
    for p in &sample {
        let start = Instant::now();
        let v = e.embed(&p.text_b)?;
        let embedded = start.elapsed().as_secs_f64() * 1e3;
        let near = cached.search(&v, 4);
        let searched = start.elapsed().as_secs_f64() * 1e3;
        let g = Instant::now();
        for n in &near {
            let text = texts[n.id as usize % texts.len()];
            if guard.judge(&p.text_b, text, n.score, Some(e)) == Verdict::Same {
                break;
            }
        }
        let guard_ms = g.elapsed().as_secs_f64() * 1e3;
        embed.push(embedded);
        search.push(searched);
        search_total += searched - embedded;
        judged.push(guard_ms);
        lookup.push(searched + guard_ms);
    }
    Ok(OwnCost {
        embed: quantiles(embed),
        search: quantiles(search),
        lookup: quantiles(lookup),
        guard: quantiles(judged),
        search_only_ms: search_total / sample.len().max(1) as f64,
        samples: sample.len(),
        entries: cached.len(),
        bytes_per_entry: cached.bytes_per_entry(),
    })
}
