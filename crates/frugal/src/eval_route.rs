//! `frugal eval-route`: a cascade's cost and quality on questions with checkable answers.
//!
//! Every question is answered by each tier alone (greedy, one at a time, so each answer's
//! engine time is its own), then the cascade is replayed offline for every confidence
//! signal and threshold: accept the small tier's answer at or above the threshold, else pay
//! for the large tier too. The threshold is chosen on the tuning split as the cheapest that
//! keeps the quality target; the held-out split reports what it keeps.
//!
//! With a skip rule, the questions nearest to each one (by embedding, tuning questions
//! only) vote on whether the small tier is worth trying: below a share of right answers
//! among them, the question goes straight to the large tier. The share to skip below is
//! chosen on the tuning split with the threshold (leave-one-out there).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use frugal_engine::model::LoadOptions;
use frugal_engine::sampling::SamplingParams;
use frugal_engine::scheduler::{Engine, Event, Request, SchedulerConfig};
use frugal_engine::template::{ChatTemplate, Message};
use frugal_engine::tokenizer::Tokenizer;
use frugal_gateway::route::{SkipExample, SkipRule, confidence};
use serde::{Deserialize, Serialize};

use crate::cli::EvalRouteArgs;
use crate::progress::Bar;
use crate::table;
use frugal_cost::present::chart::{self, Chart, Mark, Series};
use frugal_cost::present::pct1 as pct;

/// One question of the task set.
#[derive(Debug, Clone, Deserialize)]
pub struct Question {
    pub id: u64,
    pub kind: String,
    pub question: String,
    pub answers: Vec<String>,
    pub check: Check,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    Contains,
    LastNumber,
    FirstNumber,
}

/// One tier's answer to one question.
#[derive(Debug, Clone, Serialize)]
struct Answered {
    text: String,
    correct: bool,
    logprobs: Vec<f32>,
    /// Engine seconds.
    seconds: f64,
}

/// Whether `reply` gives one of the accepted answers.
pub fn is_correct(q: &Question, reply: &str) -> bool {
    let lower = reply.to_lowercase();
    match q.check {
        Check::Contains => q
            .answers
            .iter()
            .any(|a| contains_phrase(&lower, &a.to_lowercase())),
        Check::LastNumber | Check::FirstNumber => {
            let numbers: Vec<&str> = lower
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .collect();
            let pick = if q.check == Check::LastNumber {
                numbers.last()
            } else {
                numbers.first()
            };
            pick.is_some_and(|n| q.answers.iter().any(|a| a == n))
        }
    }
}

/// `needle` in `hay` with no letter or digit right before or after it.
fn contains_phrase(hay: &str, needle: &str) -> bool {
    if needle.is_empty() {
        return false;
    }
    hay.match_indices(needle).any(|(i, _)| {
        let before = hay[..i].chars().next_back();
        let after = hay[i + needle.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

pub fn read_questions(path: &Path) -> Result<Vec<Question>> {
    read_json_lines(path, "{id, kind, question, answers, check}")
}

/// One JSON value per non-blank line; an error names the line and what was `expected`.
pub fn read_json_lines<T: serde::de::DeserializeOwned>(
    path: &Path,
    expected: &str,
) -> Result<Vec<T>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{} line {}: expected {expected}", path.display(), i + 1))
        })
        .collect()
}

/// A model loaded for evaluation: one sequence at a time.
struct Tier {
    name: String,
    engine: Engine,
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

impl Tier {
    fn load(path: &Path) -> Result<Tier> {
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

    fn answer(&self, q: &Question, max_tokens: usize) -> Result<Answered> {
        let prompt = self.template.render(
            &[Message {
                role: "user".into(),
                content: user_text(q),
            }],
            true,
        )?;
        let request = Request {
            prompt: self.tokenizer.encode(&prompt)?,
            max_tokens,
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            stop_tokens: self.tokenizer.end_of_generation().to_vec(),
            ignore_eos: false,
        };
        let mut rx = self.engine.submit(request)?;
        let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
        while let Some(e) = rx.blocking_recv() {
            match e {
                Event::Token(s, _) => {
                    tokens.push(s.token);
                    logprobs.push(s.logprob);
                }
                Event::Done { engine, .. } => {
                    let text = self.tokenizer.decode_skipping_control(&tokens)?;
                    return Ok(Answered {
                        correct: is_correct(q, &text),
                        text,
                        logprobs,
                        seconds: engine.shared.as_secs_f64(),
                    });
                }
                Event::Failed(e) => bail!("{}: {e}", self.name),
            }
        }
        bail!("{}: the engine ended without an answer", self.name)
    }
}

/// Both tiers' answers to one question.
struct Row<'a> {
    q: &'a Question,
    small: Answered,
    large: Answered,
    /// Share of the nearest tuning questions the small tier answered right.
    share: f32,
}

/// Nearest questions that vote in the skip rule, as `frugal serve` defaults to.
const SKIP_K: usize = 8;

/// What a tier is asked, and what the skip rule embeds: the request's final question.
fn user_text(q: &Question) -> String {
    format!("{} Answer briefly.", q.question)
}

/// A confidence signal: a quantile of the token logprobs, or (for comparison) their mean.
#[derive(Debug, Clone, Copy)]
enum Signal {
    Quantile(f64),
    Mean,
}

impl Signal {
    fn name(self) -> String {
        match self {
            Signal::Quantile(0.0) => "min logprob".into(),
            Signal::Quantile(q) => format!("q{:.0} logprob", q * 100.0),
            Signal::Mean => "mean logprob".into(),
        }
    }

    fn of(self, lp: &[f32]) -> f32 {
        match self {
            Signal::Quantile(q) => confidence(lp, q),
            Signal::Mean if lp.is_empty() => 0.0,
            Signal::Mean => lp.iter().sum::<f32>() / lp.len() as f32,
        }
    }
}

/// The cascade at one threshold: share answered by the small tier, quality, cost.
#[derive(Debug, Clone, Copy, Serialize)]
struct Outcome {
    threshold: f32,
    /// Questions whose neighbours' share of right small answers is below this skip the
    /// small tier (0: none do).
    skip_below: f32,
    /// Share of questions that skipped the small tier.
    skipped: f64,
    small_share: f64,
    /// Share of questions answered correctly.
    accuracy: f64,
    /// Accuracy over the large tier's alone.
    quality: f64,
    /// One standard error of `quality`, from the questions' count.
    quality_se: f64,
    /// Cost over the large tier's alone.
    cost: f64,
}

/// An infinite threshold is the baseline: everything to the large tier, the small one
/// never tried.
fn outcome(rows: &[&Row], signal: Signal, threshold: f32, skip_below: f32) -> Outcome {
    let (mut small, mut skipped, mut correct, mut cost) = (0usize, 0usize, 0usize, 0f64);
    let (mut large_correct, mut large_cost) = (0usize, 0f64);
    for r in rows {
        large_correct += usize::from(r.large.correct);
        large_cost += r.large.seconds;
        let skip = threshold.is_finite() && r.share < skip_below;
        skipped += usize::from(skip);
        if threshold.is_finite() && !skip {
            cost += r.small.seconds;
        }
        if !skip && signal.of(&r.small.logprobs) >= threshold {
            small += 1;
            correct += usize::from(r.small.correct);
        } else {
            cost += r.large.seconds;
            correct += usize::from(r.large.correct);
        }
    }
    let n = rows.len().max(1) as f64;
    Outcome {
        threshold,
        skip_below,
        skipped: skipped as f64 / n,
        small_share: small as f64 / n,
        accuracy: correct as f64 / n,
        quality: correct as f64 / large_correct.max(1) as f64,
        quality_se: {
            let (p, base) = (correct as f64 / n, large_correct.max(1) as f64 / n);
            (p * (1.0 - p) / n).sqrt() / base
        },
        cost: cost / large_cost.max(f64::MIN_POSITIVE),
    }
}

/// The cheapest threshold (and share to skip below, one of `skip_belows`) on `rows` whose
/// quality is at least `min_quality` by a standard error: the cheapest of many candidates
/// that only just pass on a split of a hundred or so questions is mostly luck, and fails
/// on the next split.
fn choose(rows: &[&Row], signal: Signal, min_quality: f64, skip_belows: &[f32]) -> Outcome {
    let mut candidates: Vec<f32> = rows.iter().map(|r| signal.of(&r.small.logprobs)).collect();
    candidates.push(f32::INFINITY);
    candidates.sort_by(f32::total_cmp);
    candidates.dedup();
    skip_belows
        .iter()
        .flat_map(|&b| candidates.iter().map(move |&t| (t, b)))
        .map(|(t, b)| outcome(rows, signal, t, b))
        .filter(|o| o.quality - o.quality_se >= min_quality)
        .min_by(|a, b| a.cost.total_cmp(&b.cost))
        .unwrap_or_else(|| outcome(rows, signal, f32::INFINITY, 0.0))
}

/// Each row's share of right small answers among its `SKIP_K` nearest tuning questions
/// (itself left out).
fn neighbour_shares(rows: &mut [Row], vectors: &[Vec<f32>], held: &[bool], dim: usize) {
    let tuning: Vec<usize> = (0..rows.len()).filter(|&i| !held[i]).collect();
    for i in 0..rows.len() {
        let examples = tuning
            .iter()
            .filter(|&&j| j != i)
            .map(|&j| (vectors[j].clone(), rows[j].small.correct));
        rows[i].share = SkipRule::new(dim, examples, SKIP_K, 0.0).share(&vectors[i]);
    }
}

/// Tuning or held-out, by a hash of the question's id (stable across runs and files).
fn held_out(q: &Question, share: f64) -> bool {
    let h = q.id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
    (h % 10_000) as f64 / 10_000.0 < share
}

pub fn run(args: &EvalRouteArgs) -> Result<()> {
    let questions = read_questions(&args.questions)?;
    if questions.is_empty() {
        bail!("{} holds no questions", args.questions.display());
    }
    let small = Tier::load(&args.small)?;
    let large = Tier::load(&args.large)?;
    let bar = Bar::count("answering");
    frugal_cost::Progress::start(&bar, 2 * questions.len() as u64);
    // One tier at a time, so neither engine's threads compete with the other's.
    let answers = |tier: &Tier| -> Result<Vec<Answered>> {
        questions
            .iter()
            .map(|q| {
                let a = tier.answer(q, args.max_tokens);
                frugal_cost::Progress::advance(&bar, 1);
                a
            })
            .collect()
    };
    let small_answers = answers(&small)?;
    let large_answers = answers(&large)?;
    let mut rows: Vec<Row> = questions
        .iter()
        .zip(small_answers.into_iter().zip(large_answers))
        .map(|(q, (small, large))| Row {
            q,
            small,
            large,
            share: 1.0,
        })
        .collect();
    frugal_cost::Progress::finish(&bar);
    let embedder = crate::serve::embedder_at(&args.embedder, "")?;
    let vectors = questions
        .iter()
        .map(|q| embedder.embed(&user_text(q)))
        .collect::<Result<Vec<_>, _>>()?;
    let is_held: Vec<bool> = questions
        .iter()
        .map(|q| held_out(q, args.held_out))
        .collect();
    neighbour_shares(&mut rows, &vectors, &is_held, embedder.dim());
    let (held, tune): (Vec<&Row>, Vec<&Row>) =
        rows.iter().partition(|r| held_out(r.q, args.held_out));
    if let Some(path) = &args.skip_examples {
        let mut text = String::new();
        for r in &tune {
            let e = SkipExample {
                prompt: user_text(r.q),
                ok: r.small.correct,
            };
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
    for r in &rows {
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

    let signals = [
        Signal::Quantile(0.0),
        Signal::Quantile(0.1),
        Signal::Quantile(0.25),
        Signal::Quantile(0.5),
        Signal::Mean,
    ];
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
    // Shares are multiples of 1/SKIP_K: every distinct rule is one of these.
    let skip_belows: Vec<f32> = (0..=SKIP_K).map(|i| i as f32 / SKIP_K as f32).collect();
    let mut best: Option<(Signal, Outcome, Outcome)> = None;
    for s in signals {
        for belows in [&skip_belows[..1], &skip_belows[..]] {
            let chosen = choose(&tune, s, args.min_quality, belows);
            let h = outcome(&held, s, chosen.threshold, chosen.skip_below);
            t.add_row(vec![
                s.name(),
                if chosen.skip_below > 0.0 {
                    format!("{:.3}", chosen.skip_below)
                } else {
                    "-".into()
                },
                format!("{:.3}", chosen.threshold),
                pct(chosen.quality),
                pct(chosen.cost),
                pct(h.skipped),
                pct(h.small_share),
                pct(h.quality),
                pct(1.0 - h.cost),
            ]);
            if best.as_ref().is_none_or(|b| chosen.cost < b.1.cost) {
                best = Some((s, chosen, h));
            }
        }
    }
    writeln!(
        out,
        "Cascade {} -> {}: the cheapest threshold on the tuning split keeping >= {} of the large tier's accuracy (by one standard error), without and with the skip rule ({SKIP_K} nearest tuning questions vote)",
        small.name,
        large.name,
        pct(args.min_quality)
    )?;
    writeln!(out, "{t}\n")?;
    let Some((signal, chosen, h)) = best else {
        return Ok(());
    };
    let skip = chosen.skip_below;
    let mut t = table::new(&[
        "threshold>",
        "skipped>",
        "small share>",
        "accuracy>",
        "quality>",
        "cost>",
    ]);
    let mut curve = Vec::new();
    let mut marks: Vec<f32> = held.iter().map(|r| signal.of(&r.small.logprobs)).collect();
    marks.sort_by(f32::total_cmp);
    let picks: Vec<f32> = (0..=10)
        .filter_map(|i| marks.get((marks.len().saturating_sub(1)) * i / 10).copied())
        .chain([f32::INFINITY, chosen.threshold])
        .collect();
    let mut picks = picks;
    picks.sort_by(f32::total_cmp);
    picks.dedup();
    for p in picks {
        let o = outcome(&held, signal, p, skip);
        t.add_row(vec![
            if p.is_infinite() {
                "all large".into()
            } else {
                format!("{p:.3}")
            },
            pct(o.skipped),
            pct(o.small_share),
            pct(o.accuracy),
            pct(o.quality),
            pct(o.cost),
        ]);
        curve.push(o);
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
        let series = |below: f32, name: String, colour| {
            let mut all: Vec<f32> = held.iter().map(|r| signal.of(&r.small.logprobs)).collect();
            all.sort_by(f32::total_cmp);
            all.dedup();
            let points = all
                .iter()
                .map(|&t| outcome(&held, signal, t, below))
                .map(|o| (o.cost * 100.0, o.quality * 100.0))
                .collect();
            Series {
                name,
                colour,
                points,
            }
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
            .map(|r| serde_json::json!({"id": r.q.id, "kind": r.q.kind, "held_out": held_out(r.q, args.held_out), "neighbours_right": r.share, "small": r.small, "large": r.large}))
            .collect();
        let v = serde_json::json!({"signal": signal.name(), "chosen": chosen, "held_out": h, "curve": curve, "answers": answers});
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(answers: &[&str], check: Check) -> Question {
        Question {
            id: 1,
            kind: "k".into(),
            question: "?".into(),
            answers: answers.iter().map(|s| s.to_string()).collect(),
            check,
        }
    }

    #[test]
    fn answers_are_checked_as_phrases_and_numbers() {
        let paris = q(&["Paris"], Check::Contains);
        assert!(is_correct(&paris, "The capital of France is Paris."));
        assert!(!is_correct(&paris, "Parisian cafes"));
        assert!(!is_correct(&paris, "Lyon"));
        let sum = q(&["68"], Check::LastNumber);
        assert!(is_correct(&sum, "23 + 45 = 68"));
        assert!(!is_correct(&sum, "68 is not it: 67"));
        let larger = q(&["74"], Check::FirstNumber);
        assert!(is_correct(&larger, "74 is larger than 47."));
        assert!(!is_correct(&larger, "47"));
        assert!(!is_correct(&larger, "no number"));
    }

    fn row(q: &Question, small: (bool, f32, f64), large: (bool, f64)) -> Row<'_> {
        let a = |correct, logprobs: Vec<f32>, seconds| Answered {
            text: String::new(),
            correct,
            logprobs,
            seconds,
        };
        Row {
            q,
            small: a(small.0, vec![-0.01, small.1], small.2),
            large: a(large.0, vec![-0.01], large.1),
            share: 1.0,
        }
    }

    #[test]
    fn the_cascade_pays_for_both_tiers_only_when_it_escalates() {
        let qs = q(&["x"], Check::Contains);
        let rows = [
            row(&qs, (true, -0.1, 1.0), (true, 4.0)),  // sure and right
            row(&qs, (false, -3.0, 1.0), (true, 4.0)), // unsure and wrong
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        let o = outcome(&refs, Signal::Quantile(0.0), -1.0, 0.0);
        assert_eq!(o.small_share, 0.5);
        assert_eq!(o.quality, 1.0);
        assert_eq!(o.cost, (1.0 + 1.0 + 4.0) / 8.0);
        let all_large = outcome(&refs, Signal::Quantile(0.0), f32::INFINITY, 0.0);
        assert_eq!((all_large.small_share, all_large.quality), (0.0, 1.0));
        assert_eq!(all_large.cost, 1.0, "the small tier is not tried");
        let c = choose(&refs, Signal::Quantile(0.0), 1.0, &[0.0]);
        assert_eq!(c.threshold, -0.1);
    }

    #[test]
    fn a_skipped_question_pays_only_for_the_large_tier() {
        let qs = q(&["x"], Check::Contains);
        let mut rows = [
            row(&qs, (true, -0.1, 1.0), (true, 4.0)),
            row(&qs, (false, -3.0, 1.0), (true, 4.0)),
        ];
        // The second one's neighbours were all answered wrong by the small tier.
        rows[1].share = 0.0;
        let refs: Vec<&Row> = rows.iter().collect();
        let o = outcome(&refs, Signal::Quantile(0.0), -1.0, 0.5);
        assert_eq!((o.skipped, o.small_share, o.quality), (0.5, 0.5, 1.0));
        assert_eq!(
            o.cost,
            (1.0 + 4.0) / 8.0,
            "no small attempt on the skipped one"
        );
        let c = choose(&refs, Signal::Quantile(0.0), 1.0, &[0.0, 0.5]);
        // Skipping the second, any threshold that accepts the first costs the same.
        assert_eq!((c.skip_below, c.cost), (0.5, 5.0 / 8.0));
    }
}
