//! `frugal eval-route`: loads the two tiers, has `frugal_gateway::route_eval` answer the
//! questions and replay the cascade, and prints the tables, the route to configure, and the
//! HTML and JSON files asked for.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use frugal_cost::Progress;
use frugal_cost::present::chart::{self, Chart, Mark, Series};
use frugal_cost::present::pct1 as pct;
use frugal_engine::model::LoadOptions;
use frugal_engine::scheduler::{Engine, SchedulerConfig};
use frugal_gateway::assemble::load_embedder;
use frugal_gateway::route_eval::{
    Outcome, Replay, Row, SKIP_K, Signal, Tier, best, curve, frontier, read_questions,
};

use crate::cli::EvalRouteArgs;
use crate::progress::Bar;
use crate::table;

/// A model loaded for evaluation: one sequence at a time.
fn load_tier(path: &Path) -> Result<Tier> {
    let (model, tokenizer, template) = crate::serve::load_model(path, LoadOptions::default())?;
    let engine = Engine::start(
        model,
        SchedulerConfig {
            max_batch: 1,
            ..SchedulerConfig::default()
        },
    )?;
    let name = path
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().into_owned());
    Ok(Tier {
        name,
        engine,
        tokenizer,
        template,
    })
}

pub fn run(args: &EvalRouteArgs) -> Result<()> {
    let questions = read_questions(&args.questions)?;
    if questions.is_empty() {
        bail!("{} holds no questions", args.questions.display());
    }
    let small = load_tier(&args.small)?;
    let large = load_tier(&args.large)?;
    let bar = Bar::count("answering");
    bar.start(2 * questions.len() as u64);
    // One tier at a time, so neither engine's threads compete with the other's.
    let small_answers = small.answer_all(&questions, args.max_tokens, &bar)?;
    let large_answers = large.answer_all(&questions, args.max_tokens, &bar)?;
    bar.finish();
    let mut replay = Replay::new(&questions, small_answers, large_answers, args.held_out);
    let embedder = load_embedder(&args.embedder, "")?;
    replay.vote(&embedder)?;
    let rows = &replay.rows;
    let (held, tune) = (replay.held(), replay.tuning());
    if let Some(path) = &args.skip_examples {
        let mut text = String::new();
        for e in replay.skip_examples() {
            text.push_str(&serde_json::to_string(&e)?);
            text.push('\n');
        }
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    let usd = |secs: f64| secs * args.price_per_hour / 3600.0;

    let mut t = table::new(&[
        "kind",
        "questions>",
        &format!("{} correct>", small.name),
        &format!("{} correct>", large.name),
    ]);
    let mut kinds: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
    for r in rows {
        let k = kinds.entry(r.q.kind.as_str()).or_default();
        k.0 += 1;
        k.1 += usize::from(r.small.correct);
        k.2 += usize::from(r.large.correct);
    }
    for (kind, (n, s, l)) in &kinds {
        t.add_row(vec![
            kind.to_string(),
            n.to_string(),
            s.to_string(),
            l.to_string(),
        ]);
    }
    let total = |f: fn(&Row) -> f64| rows.iter().map(f).sum::<f64>();
    let (small_secs, large_secs) = (total(|r| r.small.seconds), total(|r| r.large.seconds));
    writeln!(
        out,
        "{} questions ({} tuning, {} held out)",
        rows.len(),
        tune.len(),
        held.len()
    )?;
    writeln!(out, "{t}")?;
    writeln!(
        out,
        "cost per 1k questions at ${}/h: {} ${:.4}, {} ${:.4} (small/large {:.2})\n",
        args.price_per_hour,
        small.name,
        usd(small_secs) * 1000.0 / rows.len() as f64,
        large.name,
        usd(large_secs) * 1000.0 / rows.len() as f64,
        small_secs / large_secs.max(f64::MIN_POSITIVE)
    )?;

    let mut t = table::new(&[
        "signal",
        "skip below>",
        "threshold>",
        "tuning quality>",
        "tuning cost>",
        "held-out skipped>",
        "held-out small share>",
        "held-out quality>",
        "held-out cost cut>",
    ]);
    let choices = replay.sweep(args.min_quality);
    for c in &choices {
        t.add_row(vec![
            c.signal.name(),
            if c.chosen.skip_below > 0.0 {
                format!("{:.3}", c.chosen.skip_below)
            } else {
                "-".into()
            },
            format!("{:.3}", c.chosen.threshold),
            pct(c.chosen.quality),
            pct(c.chosen.cost),
            pct(c.held.skipped),
            pct(c.held.small_share),
            pct(c.held.quality),
            pct(1.0 - c.held.cost),
        ]);
    }
    writeln!(
        out,
        "Cascade {} -> {}: the cheapest threshold on the tuning split keeping >= {} of the large tier's accuracy (by one standard error), without and with the skip rule ({SKIP_K} nearest tuning questions vote)",
        small.name,
        large.name,
        pct(args.min_quality)
    )?;
    writeln!(out, "{t}\n")?;
    let Some(best) = best(&choices) else {
        return Ok(());
    };
    let (signal, chosen, h) = (best.signal, best.chosen, best.held);
    let skip = chosen.skip_below;
    let mut t = table::new(&[
        "threshold>",
        "skipped>",
        "small share>",
        "accuracy>",
        "quality>",
        "cost>",
    ]);
    let curve: Vec<Outcome> = curve(&held, signal, &chosen);
    for o in &curve {
        t.add_row(vec![
            if o.threshold.is_infinite() {
                "all large".into()
            } else {
                format!("{:.3}", o.threshold)
            },
            pct(o.skipped),
            pct(o.small_share),
            pct(o.accuracy),
            pct(o.quality),
            pct(o.cost),
        ]);
    }
    let rule = if skip > 0.0 {
        format!(", skipping the small tier below a {skip:.3} share")
    } else {
        String::new()
    };
    writeln!(
        out,
        "Held-out curve, {}{rule} (chosen {:.3})",
        signal.name(),
        chosen.threshold
    )?;
    writeln!(out, "{t}")?;
    writeln!(
        out,
        "chosen: {} >= {:.3}{rule}: held-out quality {} of the large tier's at {} of its cost ({} cut)",
        signal.name(),
        chosen.threshold,
        pct(h.quality),
        pct(h.cost),
        pct(1.0 - h.cost)
    )?;
    if let Signal::Quantile(q) = signal {
        let examples = args.skip_examples.as_ref().filter(|_| skip > 0.0);
        writeln!(
            out,
            "\nAs a route in frugal.toml (the large tier an upstream of that name):\n[[serve.route]]\nname = \"auto\"\ntiers = [\"{}\", \"{}\"]\nquantile = {q}\nthreshold = {:.3}",
            small.name, large.name, chosen.threshold
        )?;
        match examples {
            Some(path) => writeln!(
                out,
                "skip_examples = \"{}\"\nskip_below = {skip:.3}\nskip_k = {SKIP_K}",
                path.display()
            )?,
            None if skip > 0.0 => writeln!(
                out,
                "# and a skip rule: rerun with --skip-examples FILE for its examples"
            )?,
            None => {}
        }
    }
    if let Some(path) = &args.html {
        let series = |below: f32, name: String, colour| Series {
            name,
            colour,
            points: frontier(&held, signal, below)
                .iter()
                .map(|o| (o.cost * 100.0, o.quality * 100.0))
                .collect(),
        };
        let mut lines = vec![series(
            0.0,
            format!("accept the small answer at {} >= t", signal.name()),
            "#1f77b4",
        )];
        if skip > 0.0 {
            lines.push(series(
                skip,
                format!("the same, skipping the small tier below a {skip:.3} share"),
                "#ff7f0e",
            ));
        }
        let chart = Chart {
            title: format!("Cascade {} -> {} (held-out split)", small.name, large.name),
            x_label: "cost, % of the large tier alone".into(),
            y_label: "quality, % of the large tier's accuracy".into(),
            x_range: (0.0, 160.0),
            y_range: (50.0, 110.0),
            series: lines,
            marks: vec![
                Mark {
                    label: "all to the large tier".into(),
                    x: 100.0,
                    y: 100.0,
                },
                Mark {
                    label: format!("chosen on tuning: t = {:.3}", chosen.threshold),
                    x: h.cost * 100.0,
                    y: h.quality * 100.0,
                },
            ],
        };
        let caption = format!(
            "{} held-out questions; each point is one threshold t; the small tier is paid on every question it is tried on.",
            held.len()
        );
        std::fs::write(
            path,
            chart::page("frugal eval-route", &[(&chart, &caption)]),
        )
        .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let answers: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({"id": r.q.id, "kind": r.q.kind, "held_out": r.held_out, "neighbours_right": r.share, "small": r.small, "large": r.large}))
            .collect();
        let v = serde_json::json!({"signal": signal.name(), "chosen": chosen, "held_out": h, "curve": curve, "answers": answers});
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
