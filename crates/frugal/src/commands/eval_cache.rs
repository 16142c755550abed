//! `frugal eval-cache`: the semantic cache measured on labelled question pairs: QQP's, and
//! the hand-written near misses and paraphrases of `data/semantic-cache/` per kind. The
//! guard's threshold is chosen on the tuning halves; the held-out halves report what it keeps,
//! and what the paraphrase verifier and the error budget behind it keep
//! (`eval_cache_verify`).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use frugal_semantic::eval::{
    self, Chosen, Figures, GUARDED, Limits, PLAIN, Point, SWEEP, Scored, Split,
};
use frugal_semantic::{Embedder, Guard, Verifier};

use super::eval_cache_verify as verify;
use crate::cli::EvalCacheArgs;
use crate::progress::Bar;
use crate::table;
use frugal_cost::present::chart::{self, Chart, Mark, Series};
use frugal_cost::present::pct1;

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
    let verifier = if args.verifier == Path::new("none") {
        None
    } else {
        let v = Verifier::load(&args.embedder, &args.verifier)
            .with_context(|| format!("cannot load the verifier {}", args.verifier.display()))?;
        Some(v)
    };
    let pairs = eval::sample(eval::read_pairs(&args.pairs)?, args.limit);
    let mut near_pairs = Vec::new();
    for p in &args.near_miss {
        near_pairs.extend(eval::read_pairs(p)?);
    }
    let bar = Bar::count(if verifier.is_some() {
        "embedding and verifying pairs"
    } else {
        "embedding pairs"
    });
    frugal_cost::Progress::start(&bar, (pairs.len() + near_pairs.len()) as u64);
    let tick = || frugal_cost::Progress::advance(&bar, 1);
    let scored = eval::score_pairs(&embedder, verifier.as_ref(), &pairs, &tick)?;
    let near_scored = eval::score_pairs(&embedder, verifier.as_ref(), &near_pairs, &tick)?;
    frugal_cost::Progress::finish(&bar);
    let qqp = Split::new(&pairs, scored, args.held_out);
    let near = Split::new(&near_pairs, near_scored, args.held_out);
    let held = &qqp.held.scored;
    let (td, tn) = eval::counts(&qqp.tune.scored);
    let (hd, hn) = eval::counts(held);

    let plain_pts = eval::sweep(PLAIN, held, &SWEEP);
    let guarded_pts = eval::sweep(GUARDED, held, &SWEEP);
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
    let limits = Limits {
        max_wrong: args.max_wrong,
        max_kind_wrong: args.max_kind_wrong,
    };
    let chosen = eval::choose(&qqp, &near, limits);
    for c in &chosen {
        let g = c.guard;
        t.add_row(vec![
            c.rule.to_owned(),
            format!("{:.4}", g.threshold),
            if g.vetoes {
                format!("{:.4}", g.aligned_threshold)
            } else {
                "-".into()
            },
            pct1(c.tuning.hit_rate),
            pct1(c.tuning.wrong_rate),
            pct1(c.held.hit_rate),
            pct1(c.held.wrong_rate),
        ]);
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
    let at = chosen.last().map_or(Guard::default(), |c| c.guard);

    let kinds = if near_pairs.is_empty() {
        Vec::new()
    } else {
        eval::kind_rows(&at, &near)
    };
    if !near_pairs.is_empty() {
        let name = args
            .near_miss
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
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
        for k in &kinds {
            t.add_row(vec![
                k.kind.clone(),
                if k.paraphrase {
                    "paraphrase"
                } else {
                    "near miss"
                }
                .to_string(),
                k.tuning_pairs.to_string(),
                pct1(k.tuning_hit),
                k.held_pairs.to_string(),
                pct1(k.held_hit),
                pct1(k.held_plain_hit),
            ]);
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
    let near_vetoes = eval::veto_counts(&near.held.scored, 0.0);
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
        let lines: String = eval::tuning_errors(&qqp, &near, &at)
            .into_iter()
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
    let cost = eval::own_cost(&embedder, &pairs, &at)?;
    let reading = eval::guard_cost(&embedder, &near_pairs);
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
    if let Some(((p50, p99), n)) = reading {
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
        "To serve with the guard alone at them (frugal.toml): under [serve], semantic_verifier = \
         \"none\", semantic_threshold = {:.4} and semantic_aligned_threshold = {:.4}; on one \
         upstream or route, semantic_threshold = {:.4} (its aligned threshold keeps the same \
         distance below)",
        at.threshold, at.aligned_threshold, at.threshold
    )?;
    let verified = match &verifier {
        Some(v) => verify::section(
            &mut out,
            &verify::Inputs {
                embedder: &embedder,
                verifier: v,
                pairs: &pairs,
                near_pairs: &near_pairs,
                qqp: &qqp,
                near: &near,
                chosen: &chosen,
                limits,
                max_error: args.max_error,
            },
        )?,
        None => None,
    };
    if args.calibrate
        && let Some(verify::Measured { rule, .. }) = &verified
    {
        Verifier::write_choice(&args.verifier, &rule.calibration, rule.floor)
            .with_context(|| format!("cannot write {}", args.verifier.display()))?;
        writeln!(
            out,
            "Wrote the calibration and the floor {:.2} into {}",
            rule.floor,
            args.verifier.display()
        )?;
    }
    if let Some(path) = &args.html {
        let bounds = verified.as_ref().map_or(&[][..], |m| &m.bounds[..]);
        write_html(
            path,
            (held, &near.held.scored),
            &chosen,
            bounds,
            args.max_wrong,
        )?;
    }
    if let Some(path) = &args.json {
        let mut v = Figures {
            pairs: pairs.len(),
            held_out: (hd, hn),
            plain: &plain_pts,
            guarded: &guarded_pts,
            chosen: &chosen,
            kinds: &kinds,
            cost: &cost,
        }
        .to_json();
        if let Some(m) = verified {
            v["verifier"] = m.figures;
        }
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

/// Plain cosine and the guard over `held` ([`eval::curve`]): the share of wrong pairs served
/// against the share of right ones; `budget`, the verifier's error budget at each bound, in %.
fn curves(axes: &Axes, held: &[Scored], budget: Vec<(f64, f64)>, marks: Vec<Mark>) -> Chart {
    let curve = |g: Guard| -> Vec<(f64, f64)> {
        eval::curve(g, held)
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
                points: curve(PLAIN),
            },
            Series {
                name: "guarded".into(),
                colour: "#1f77b4",
                points: curve(GUARDED),
            },
        ]
        .into_iter()
        .chain((!budget.is_empty()).then(|| Series {
            name: "verifier + budget".into(),
            colour: "#d62728",
            points: budget,
        }))
        .collect(),
        marks,
    }
}

fn write_html(
    path: &Path,
    (held, near_held): (&[Scored], &[Scored]),
    chosen: &[Chosen],
    bounds: &[verify::AtBound],
    max_wrong: f64,
) -> Result<()> {
    let budget = |x: fn(&verify::AtBound) -> f64, y: fn(&verify::AtBound) -> f64| {
        bounds
            .iter()
            .map(|b| (x(b) * 100.0, y(b) * 100.0))
            .collect()
    };
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
        budget(|b| b.qqp_others, |b| b.qqp_duplicates),
        chosen
            .iter()
            .map(|c| mark(c.rule, &c.guard, &c.held))
            .collect(),
    );
    let (hd, hn) = eval::counts(held);
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
            .map(|c| mark(c.rule, &c.guard, &eval::measure(&c.guard, near_held)))
            .collect();
        let near = curves(
            &Axes {
                title: "Near misses and paraphrases (held-out half)",
                x: "near misses served (wrong answers), %",
                y: "paraphrases served, %",
                x_max: 100.0,
            },
            near_held,
            budget(|b| b.near_misses, |b| b.paraphrases),
            marks,
        );
        let (para, miss) = eval::counts(near_held);
        charts.push((
            near,
            format!(
                "Cosine thresholds 0.70 to 1.00; {para} paraphrases and {miss} near misses of \
                 the hand-written files. Plain cosine cannot serve paraphrases without serving \
                 near misses; the guard's vetoes hold the near misses near 0, and the verifier's \
                 budget (red, one point per bound from 0.5% to 10%) serves more paraphrases at as few."
            ),
        ));
    }
    if let Some(top) = bounds.iter().map(|b| b.max_error).reduce(f64::max) {
        let x_max = top * 100.0;
        let estimate = Chart {
            title: "The error budget: its own estimate against the labels (held-out replay)".into(),
            x_label: "semantic_max_error, %".into(),
            y_label: "wrong share of served hits, %".into(),
            x_range: (0.0, x_max),
            y_range: (0.0, x_max * 1.5),
            series: vec![
                Series {
                    name: "the bound".into(),
                    colour: "#999999",
                    points: vec![(0.0, 0.0), (x_max, x_max)],
                },
                Series {
                    name: "the budget's estimate".into(),
                    colour: "#1f77b4",
                    points: budget(|b| b.max_error, |b| b.estimated),
                },
                Series {
                    name: "hand-written pairs, by their labels".into(),
                    colour: "#d62728",
                    points: budget(|b| b.max_error, |b| b.hand_written_actual),
                },
            ],
            marks: vec![],
        };
        charts.push((
            estimate,
            "One stream of the held-out QQP and hand-written pairs through the budget at each \
             bound. The hand-written labels are exact; QQP's (not drawn) mark many same-meaning \
             pairs as different."
                .into(),
        ));
    }
    let refs: Vec<(&Chart, &str)> = charts.iter().map(|(c, t)| (c, t.as_str())).collect();
    std::fs::write(path, chart::page("frugal eval-cache", &refs))
        .with_context(|| format!("cannot write {}", path.display()))
}
