//! `frugal eval-route`: loads the two tiers (or an earlier run's answers), has
//! `frugal_gateway::cascade::eval` answer the questions and replay the cascade, and prints the
//! tables, the route to configure, and the HTML and JSON files asked for.

use std::io::Write;

use anyhow::{Context, Result, bail};
use frugal_cost::Progress;
use frugal_cost::present::chart::{self, Chart, Mark, Series};
use frugal_cost::present::pct1 as pct;
use frugal_cost::report::wilson;
use frugal_engine::model::LoadOptions;
use frugal_gateway::assemble::load_embedder;
use frugal_gateway::cascade::eval::{
    Bound, FOLDS, Outcome, Replay, SKIP_K, Shadowed, Signal, Sweep, Tier, best, curve,
    fixed_routes, frontier, read_answers, read_question_files, shadowed, tier_name,
};
use frugal_gateway::cascade::learned::RouterFile;

use crate::cli::{BoundFor, EvalRouteArgs};
use crate::progress::Bar;
use crate::table;

/// The bound a choice on `tuning` questions is held to, in words.
fn bound_words(bound: Bound, tuning: usize, percentile: Option<f64>, candidates: usize) -> String {
    let Some(p) = percentile else {
        return format!("as measured, unbounded ({candidates} candidates)");
    };
    let what = match bound.fresh {
        Some(n) => format!("on a fresh half of {n} questions"),
        None => "over all questions like these".into(),
    };
    let each = if bound.family_wise {
        format!(
            "below the {:.0}th, so that all {candidates} candidates keep their bounds at once",
            (1.0 - bound.confidence) * 100.0
        )
    } else {
        format!("each of {candidates} candidates alone")
    };
    format!(
        "{what}, by a {} lower bound (each candidate's quality at the {:.2}th percentile of {} bootstrap resamples of {} of the {tuning} tuning questions: {each})",
        pct(bound.confidence),
        p * 100.0,
        bound.resamples,
        bound.resample_size(tuning),
    )
}

pub fn run(args: &EvalRouteArgs) -> Result<()> {
    let questions = read_question_files(&args.questions)?;
    if questions.is_empty() {
        let files: Vec<String> = args
            .questions
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        bail!("{} hold no questions", files.join(", "));
    }
    let (small, large, small_answers, large_answers) = match &args.answers {
        Some(path) => {
            let saved = read_answers(path, &questions)?;
            let [small, large] = saved
                .tiers
                .unwrap_or_else(|| [tier_name(&args.small), tier_name(&args.large)]);
            (small, large, saved.small, saved.large)
        }
        None => {
            let small = Tier::load(&args.small, LoadOptions::default())?;
            let large = Tier::load(&args.large, LoadOptions::default())?;
            let bar = Bar::count("answering");
            bar.start(2 * questions.len() as u64);
            // One tier at a time, so neither engine's threads compete with the other's.
            let small_answers = small.answer_all(&questions, args.max_tokens, &bar)?;
            let large_answers = large.answer_all(&questions, args.max_tokens, &bar)?;
            bar.finish();
            (small.name, large.name, small_answers, large_answers)
        }
    };
    let mut replay = Replay::new(&questions, small_answers, large_answers, args.held_out);
    let embedder = load_embedder(&args.embedder, "")?;
    let vectors = replay.embed(&embedder)?;
    replay.vote(&vectors);
    let mut learned = Replay {
        rows: replay.rows.clone(),
    };
    let router = learned.learn(&vectors);
    if let Some(path) = &args.router {
        let labels = replay.tuning().into_iter().map(|r| r.small.correct);
        let file = RouterFile::linear(router, embedder.dim(), labels);
        std::fs::write(path, serde_json::to_string(&file)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
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
        &format!("{} correct>", small),
        &format!("{} correct>", large),
    ]);
    for (kind, k) in replay.by_kind() {
        t.add_row(vec![
            kind.to_string(),
            k.questions.to_string(),
            k.small_right.to_string(),
            k.large_right.to_string(),
        ]);
    }
    let (small_secs, large_secs) = replay.seconds();
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
        small,
        usd(small_secs) * 1000.0 / rows.len() as f64,
        large,
        usd(large_secs) * 1000.0 / rows.len() as f64,
        small_secs / large_secs.max(f64::MIN_POSITIVE)
    )?;

    let mut t = table::new(&[
        "signal",
        "skip below>",
        "threshold>",
        "tuning quality>",
        "tuning lower bound>",
        "tuning cost>",
        "held-out skipped>",
        "held-out small share>",
        "held-out quality>",
        "held-out cost cut>",
    ]);
    let bound = Bound {
        confidence: args.confidence,
        resamples: args.resamples,
        family_wise: !args.pointwise,
        fresh: (args.bound == BoundFor::HeldOut && !held.is_empty()).then_some(held.len()),
    };
    let sweep = replay.sweep(args.min_quality, bound);
    let bounded = bound_words(bound, tune.len(), sweep.percentile, sweep.candidates);
    let choices = &sweep.choices;
    for c in choices {
        t.add_row(vec![
            c.signal.name(),
            if c.chosen.skip_below > 0.0 {
                format!("{:.3}", c.chosen.skip_below)
            } else {
                "-".into()
            },
            format!("{:.3}", c.chosen.threshold),
            pct(c.chosen.quality),
            pct(c.lower),
            pct(c.chosen.cost),
            pct(c.held.skipped),
            pct(c.held.small_share),
            pct(c.held.quality),
            pct(1.0 - c.held.cost),
        ]);
    }
    writeln!(
        out,
        "Cascade {} -> {}: the cheapest threshold on the tuning split keeping >= {} of the large tier's accuracy {bounded}, without and with the skip rule ({SKIP_K} nearest tuning questions vote)",
        small,
        large,
        pct(args.min_quality)
    )?;
    writeln!(out, "{t}\n")?;
    if sweep.unresolved {
        writeln!(
            out,
            "note: at {} confidence over {} candidates the bound is below the lowest of {} resamples; it is taken there, looser than asked (raise --resamples)\n",
            pct(args.confidence),
            sweep.candidates,
            args.resamples
        )?;
    }
    routers(&mut out, &replay, &learned, &sweep, args.min_quality, bound)?;
    let Some(best) = best(choices) else {
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
        "chosen: {} >= {:.3}{rule}: tuning quality {} (lower bound {} at {} confidence); held-out quality {} of the large tier's at {} of its cost ({} cut)",
        signal.name(),
        chosen.threshold,
        pct(chosen.quality),
        pct(best.lower),
        pct(args.confidence),
        pct(h.quality),
        pct(h.cost),
        pct(1.0 - h.cost)
    )?;
    let shadow = shadowed(&held, signal, chosen.threshold, skip, &embedder);
    shadow_line(&mut out, &shadow)?;
    if let Signal::Quantile(q) = signal {
        let examples = args.skip_examples.as_ref().filter(|_| skip > 0.0);
        writeln!(
            out,
            "\nAs a route in frugal.toml (the large tier an upstream of that name):\n[[serve.route]]\nname = \"auto\"\ntiers = [\"{}\", \"{}\"]\nquantile = {q}\nthreshold = {:.3}",
            small, large, chosen.threshold
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
            title: format!("Cascade {} -> {} (held-out split)", small, large),
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
                    label: format!(
                        "chosen on tuning: t = {:.3} (tuning quality >= {} at {})",
                        chosen.threshold,
                        pct(best.lower),
                        pct(args.confidence)
                    ),
                    x: h.cost * 100.0,
                    y: h.quality * 100.0,
                },
            ],
        };
        let caption = format!(
            "{} held-out questions; each point is one threshold t; the small tier is paid on every question it is tried on. The threshold is the cheapest on the {} tuning questions keeping >= {} of the large tier's accuracy {bounded}: tuning quality {}, lower bound {}; held-out quality {}, cost cut {}.",
            held.len(),
            tune.len(),
            pct(args.min_quality),
            pct(chosen.quality),
            pct(best.lower),
            pct(h.quality),
            pct(1.0 - h.cost),
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
        let mut chosen_json = serde_json::to_value(chosen)?;
        chosen_json["quality_lower"] = serde_json::json!(best.lower);
        let every: Vec<serde_json::Value> = choices
            .iter()
            .map(|c| serde_json::json!({"signal": c.signal.name(), "chosen": c.chosen, "quality_lower": c.lower, "held_out": c.held}))
            .collect();
        let bound_for = match args.bound {
            BoundFor::HeldOut => "held-out",
            BoundFor::Population => "population",
        };
        let bound_json = serde_json::json!({"min_quality": args.min_quality, "confidence": args.confidence, "for": bound_for, "resamples": args.resamples, "resample_size": bound.resample_size(tune.len()), "family_wise": bound.family_wise, "percentile": sweep.percentile, "unresolved": sweep.unresolved, "candidates": sweep.candidates});
        let v = serde_json::json!({"signal": signal.name(), "chosen": chosen_json, "held_out": h, "held_out_cost_cut": 1.0 - h.cost, "curve": curve, "bound": bound_json, "choices": every, "tiers": [small, large], "shadowed": shadow, "answers": answers});
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// What `frugal serve`'s shadows of the chosen route would measure on the held-out half,
/// judged by the same rule: the online figure (`frugal report`, "Quality kept") to hold it
/// against.
fn shadow_line(out: &mut impl Write, s: &Shadowed) -> Result<()> {
    let Some((share, low, high)) = wilson(s.agreed as u64, s.accepted as u64) else {
        return Ok(writeln!(
            out,
            "shadows would measure nothing: the chosen route serves no held-out question the small tier's answer"
        )?);
    };
    writeln!(
        out,
        "shadows of this route (`shadow_rate`) would find on the held-out half: {} of the {} accepted cheap answers agree with the large tier's ({}, 95% {}-{}; {} judged by embedding), and by the checks {} are no worse ({})",
        s.agreed,
        s.accepted,
        pct(share),
        pct(low),
        pct(high),
        s.by_embedding,
        s.no_worse,
        pct(s.no_worse as f64 / s.accepted as f64)
    )?;
    Ok(())
}

/// Each router on the held-out half beside all large, all small and the oracle: the kNN
/// skip rule and the learned one, each with the cascade's threshold chosen on the tuning
/// half as above.
fn routers(
    out: &mut impl Write,
    knn: &Replay,
    learned: &Replay,
    knn_sweep: &Sweep,
    min_quality: f64,
    bound: Bound,
) -> Result<()> {
    let held = knn.held();
    let mut t = table::new(&[
        "router",
        "tuning cost>",
        "held-out quality>",
        "held-out cost cut>",
        "small tier only>",
        "both tiers paid>",
        "large tier only>",
    ]);
    for f in fixed_routes(&held) {
        let large_only = if f.name == "all large" {
            1.0
        } else {
            1.0 - f.small_share
        };
        t.add_row(vec![
            f.name.into(),
            "-".into(),
            pct(f.quality),
            pct(1.0 - f.cost),
            pct(f.small_share),
            pct(0.0),
            pct(large_only),
        ]);
    }
    let learned_sweep = learned.sweep(min_quality, bound);
    for (name, sweep) in [
        ("kNN skip rule + cascade", knn_sweep),
        ("learned router + cascade", &learned_sweep),
    ] {
        let Some(c) = best(&sweep.choices) else {
            continue;
        };
        let h = c.held;
        t.add_row(vec![
            format!(
                "{name} ({}, skip below {:.3})",
                c.signal.name(),
                c.chosen.skip_below
            ),
            pct(c.chosen.cost),
            pct(h.quality),
            pct(1.0 - h.cost),
            pct(h.small_share),
            pct((1.0 - h.skipped - h.small_share).max(0.0)),
            pct(h.skipped),
        ]);
    }
    writeln!(
        out,
        "Routers on the held-out half (the learned router: logistic regression on the question's embedding and length, cross-fitted over {FOLDS} folds of the tuning half; each router's skip share and threshold chosen on the tuning half with the bound above)\n{t}\n"
    )?;
    Ok(())
}
