//! A cascade's cost and quality on questions with checkable answers, replayed offline
//! (`frugal eval-route` prints it).
//!
//! Every question is answered by each tier alone (greedy, one at a time, so each answer's
//! engine time is its own), its prompt rendered and tokenized as the gateway does a chat
//! request ([`prompt_tokens`]); then the cascade is replayed for every confidence signal and
//! threshold: accept the small tier's answer at or above the threshold, else pay for the
//! large tier too. The threshold is chosen on the tuning split as the cheapest that keeps
//! the quality target; the held-out split reports what it keeps.
//!
//! With a skip rule, the questions nearest to each one (by embedding, tuning questions
//! only) vote on whether the small tier is worth trying: below a share of right answers
//! among them, the question goes straight to the large tier. The share to skip below is
//! chosen on the tuning split with the threshold (leave-one-out there).

use std::path::Path;

use frugal_cost::Progress;
use frugal_engine::sampling::SamplingParams;
use frugal_engine::scheduler::{Engine, Event, Request};
use frugal_engine::template::ChatTemplate;
use frugal_engine::tokenizer::Tokenizer;
use frugal_semantic::{EmbedError, Embedder};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::api::{ChatMessage, Content};
use crate::assemble::DEFAULT_SKIP_K;
use crate::jsonl::JsonLinesError;
use crate::route::{SkipExample, SkipRule, confidence};
use crate::validate::{Input, prompt_tokens};

/// Nearest questions that vote in the skip rule, as `frugal serve` defaults to.
pub const SKIP_K: usize = DEFAULT_SKIP_K;

#[derive(Debug, Error)]
pub enum EvalError {
    #[error(transparent)]
    Questions(#[from] JsonLinesError),
    #[error("{tier}: {message}")]
    Prompt { tier: String, message: String },
    #[error("{tier}: {message}")]
    Engine { tier: String, message: String },
    #[error("{tier}: the engine ended without an answer")]
    NoAnswer { tier: String },
    #[error("cannot embed a question")]
    Embed(#[source] EmbedError),
}

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

/// JSON lines of questions; an error names the line.
pub fn read_questions(path: &Path) -> Result<Vec<Question>, EvalError> {
    Ok(crate::jsonl::read(
        path,
        "{id, kind, question, answers, check}",
    )?)
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

/// What a tier is asked, and what the skip rule embeds: the request's final question.
pub fn user_text(q: &Question) -> String {
    format!("{} Answer briefly.", q.question)
}

/// Tuning or held-out, by a hash of the question's id (stable across runs and files):
/// `share` of the questions are held out.
pub fn held_out(q: &Question, share: f64) -> bool {
    let h = q.id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
    (h % 10_000) as f64 / 10_000.0 < share
}

/// One tier's answer to one question.
#[derive(Debug, Clone, Serialize)]
pub struct Answered {
    pub text: String,
    pub correct: bool,
    pub logprobs: Vec<f32>,
    /// Engine seconds.
    pub seconds: f64,
}

/// A model to evaluate, its engine running one sequence at a time (`max_batch: 1`) so each
/// answer's engine time is its own.
pub struct Tier {
    pub name: String,
    pub engine: Engine,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

impl Tier {
    /// `q` asked as a one-message chat, answered greedily in `max_tokens` at most.
    pub fn answer(&self, q: &Question, max_tokens: usize) -> Result<Answered, EvalError> {
        let chat = Input::Chat(vec![ChatMessage {
            role: "user".into(),
            content: Some(Content::Text(user_text(q))),
        }]);
        let prompt = prompt_tokens(&self.tokenizer, &self.template, &chat).map_err(|e| {
            EvalError::Prompt {
                tier: self.name.clone(),
                message: e.to_string(),
            }
        })?;
        let engine_error = |e: &dyn std::fmt::Display| EvalError::Engine {
            tier: self.name.clone(),
            message: e.to_string(),
        };
        let request = Request {
            prompt,
            max_tokens,
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            stop_tokens: self.tokenizer.end_of_generation().to_vec(),
            ignore_eos: false,
        };
        let mut rx = self.engine.submit(request).map_err(|e| engine_error(&e))?;
        let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
        while let Some(e) = rx.blocking_recv() {
            match e {
                Event::Token(s, _) => {
                    tokens.push(s.token);
                    logprobs.push(s.logprob);
                }
                Event::Done { engine, .. } => {
                    let text = self
                        .tokenizer
                        .decode_skipping_control(&tokens)
                        .map_err(|e| engine_error(&e))?;
                    return Ok(Answered {
                        correct: is_correct(q, &text),
                        text,
                        logprobs,
                        seconds: engine.shared.as_secs_f64(),
                    });
                }
                Event::Failed(e) => return Err(engine_error(&e)),
            }
        }
        Err(EvalError::NoAnswer {
            tier: self.name.clone(),
        })
    }

    /// Every question's answer, in order, advancing `progress` by one for each.
    pub fn answer_all(
        &self,
        questions: &[Question],
        max_tokens: usize,
        progress: &dyn Progress,
    ) -> Result<Vec<Answered>, EvalError> {
        questions
            .iter()
            .map(|q| {
                let a = self.answer(q, max_tokens);
                progress.advance(1);
                a
            })
            .collect()
    }
}

/// Both tiers' answers to one question.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    pub q: &'a Question,
    pub small: Answered,
    pub large: Answered,
    /// In the held-out split (else tuning).
    pub held_out: bool,
    /// Share of the nearest tuning questions the small tier answered right.
    pub share: f32,
}

/// The questions with both tiers' answers, split into tuning and held-out questions.
pub struct Replay<'a> {
    pub rows: Vec<Row<'a>>,
}

impl<'a> Replay<'a> {
    /// `small` and `large` answer `questions`, in order; `held_share` of them are held out.
    pub fn new(
        questions: &'a [Question],
        small: Vec<Answered>,
        large: Vec<Answered>,
        held_share: f64,
    ) -> Replay<'a> {
        let rows = questions
            .iter()
            .zip(small.into_iter().zip(large))
            .map(|(q, (small, large))| Row {
                q,
                small,
                large,
                held_out: held_out(q, held_share),
                share: 1.0,
            })
            .collect();
        Replay { rows }
    }

    /// Each row's share of right small answers among its [`SKIP_K`] nearest tuning
    /// questions (itself left out), by `embedder`.
    pub fn vote(&mut self, embedder: &Embedder) -> Result<(), EvalError> {
        let vectors = self
            .rows
            .iter()
            .map(|r| embedder.embed(&user_text(r.q)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(EvalError::Embed)?;
        let tuning: Vec<usize> = (0..self.rows.len())
            .filter(|&i| !self.rows[i].held_out)
            .collect();
        let shares: Vec<f32> = (0..self.rows.len())
            .map(|i| {
                let examples = tuning
                    .iter()
                    .filter(|&&j| j != i)
                    .map(|&j| (vectors[j].clone(), self.rows[j].small.correct));
                SkipRule::new(embedder.dim(), examples, SKIP_K, 0.0).share(&vectors[i])
            })
            .collect();
        for (r, s) in self.rows.iter_mut().zip(shares) {
            r.share = s;
        }
        Ok(())
    }

    pub fn tuning(&self) -> Vec<&Row<'a>> {
        self.rows.iter().filter(|r| !r.held_out).collect()
    }

    pub fn held(&self) -> Vec<&Row<'a>> {
        self.rows.iter().filter(|r| r.held_out).collect()
    }

    /// The tuning questions, labelled by whether the small tier answered them right: a
    /// route's skip examples.
    pub fn skip_examples(&self) -> Vec<SkipExample> {
        self.tuning()
            .iter()
            .map(|r| SkipExample {
                prompt: user_text(r.q),
                ok: r.small.correct,
            })
            .collect()
    }

    /// For every signal, without and with the skip rule: the threshold (and share to skip
    /// below) chosen on the tuning split, and what it does on the held-out one.
    pub fn sweep(&self, min_quality: f64) -> Vec<Choice> {
        let (tune, held) = (self.tuning(), self.held());
        let skip_belows = skip_belows();
        SIGNALS
            .iter()
            .flat_map(|&s| [&skip_belows[..1], &skip_belows[..]].map(move |b| (s, b)))
            .map(|(signal, belows)| {
                let chosen = choose(&tune, signal, min_quality, belows);
                let h = outcome(&held, signal, chosen.threshold, chosen.skip_below);
                Choice {
                    signal,
                    chosen,
                    held: h,
                }
            })
            .collect()
    }
}

/// A confidence signal: a quantile of the token logprobs, or (for comparison) their mean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Signal {
    Quantile(f64),
    Mean,
}

/// The signals [`Replay::sweep`] tries.
pub const SIGNALS: [Signal; 5] = [
    Signal::Quantile(0.0),
    Signal::Quantile(0.1),
    Signal::Quantile(0.25),
    Signal::Quantile(0.5),
    Signal::Mean,
];

impl Signal {
    pub fn name(self) -> String {
        match self {
            Signal::Quantile(0.0) => "min logprob".into(),
            Signal::Quantile(q) => format!("q{:.0} logprob", q * 100.0),
            Signal::Mean => "mean logprob".into(),
        }
    }

    pub fn of(self, lp: &[f32]) -> f32 {
        match self {
            Signal::Quantile(q) => confidence(lp, q),
            Signal::Mean if lp.is_empty() => 0.0,
            Signal::Mean => lp.iter().sum::<f32>() / lp.len() as f32,
        }
    }
}

/// The cascade at one threshold: share answered by the small tier, quality, cost.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Outcome {
    pub threshold: f32,
    /// Questions whose neighbours' share of right small answers is below this skip the
    /// small tier (0: none do).
    pub skip_below: f32,
    /// Share of questions that skipped the small tier.
    pub skipped: f64,
    pub small_share: f64,
    /// Share of questions answered correctly.
    pub accuracy: f64,
    /// Accuracy over the large tier's alone.
    pub quality: f64,
    /// One standard error of `quality`, from the questions' count.
    pub quality_se: f64,
    /// Cost over the large tier's alone.
    pub cost: f64,
}

/// A signal's threshold chosen on the tuning split, and its outcome on the held-out one.
#[derive(Debug, Clone, Copy)]
pub struct Choice {
    pub signal: Signal,
    pub chosen: Outcome,
    pub held: Outcome,
}

/// The cheapest choice on the tuning split (the first of equals).
pub fn best(choices: &[Choice]) -> Option<Choice> {
    choices
        .iter()
        .fold(None, |best: Option<Choice>, c| match best {
            Some(b) if c.chosen.cost >= b.chosen.cost => Some(b),
            _ => Some(*c),
        })
}

/// Shares to skip below: multiples of 1/[`SKIP_K`], as every distinct rule is one of them.
pub fn skip_belows() -> Vec<f32> {
    (0..=SKIP_K).map(|i| i as f32 / SKIP_K as f32).collect()
}

/// The cascade over `rows` at `threshold`. An infinite threshold is the baseline:
/// everything to the large tier, the small one never tried.
pub fn outcome(rows: &[&Row], signal: Signal, threshold: f32, skip_below: f32) -> Outcome {
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
pub fn choose(rows: &[&Row], signal: Signal, min_quality: f64, skip_belows: &[f32]) -> Outcome {
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

/// The cascade on `rows` at eleven thresholds spread over their signal's values, the
/// baseline (an infinite threshold) and `chosen`'s, in ascending order.
pub fn curve(rows: &[&Row], signal: Signal, chosen: &Outcome) -> Vec<Outcome> {
    let mut marks: Vec<f32> = rows.iter().map(|r| signal.of(&r.small.logprobs)).collect();
    marks.sort_by(f32::total_cmp);
    let mut picks: Vec<f32> = (0..=10)
        .filter_map(|i| marks.get((marks.len().saturating_sub(1)) * i / 10).copied())
        .chain([f32::INFINITY, chosen.threshold])
        .collect();
    picks.sort_by(f32::total_cmp);
    picks.dedup();
    picks
        .into_iter()
        .map(|t| outcome(rows, signal, t, chosen.skip_below))
        .collect()
}

/// The cascade on `rows` at every distinct value of the signal, skipping below
/// `skip_below`: the cost/quality frontier a chart draws.
pub fn frontier(rows: &[&Row], signal: Signal, skip_below: f32) -> Vec<Outcome> {
    let mut all: Vec<f32> = rows.iter().map(|r| signal.of(&r.small.logprobs)).collect();
    all.sort_by(f32::total_cmp);
    all.dedup();
    all.iter()
        .map(|&t| outcome(rows, signal, t, skip_below))
        .collect()
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

    fn answered(correct: bool, logprobs: Vec<f32>, seconds: f64) -> Answered {
        Answered {
            text: String::new(),
            correct,
            logprobs,
            seconds,
        }
    }

    fn row(q: &Question, small: (bool, f32, f64), large: (bool, f64)) -> Row<'_> {
        Row {
            q,
            small: answered(small.0, vec![-0.01, small.1], small.2),
            large: answered(large.0, vec![-0.01], large.1),
            held_out: false,
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
        // The curve has the baseline and the chosen point.
        let curve = curve(&refs, Signal::Quantile(0.0), &c);
        assert!(curve.iter().any(|o| o.threshold.is_infinite()));
        assert!(curve.iter().any(|o| o.threshold == c.threshold));
        assert!(curve.windows(2).all(|w| w[0].threshold < w[1].threshold));
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

    #[test]
    fn the_sweep_chooses_on_tuning_and_reports_held_out() {
        let questions: Vec<Question> = (0..40)
            .map(|id| Question {
                id,
                ..q(&["x"], Check::Contains)
            })
            .collect();
        // The small tier is right and sure on even ids, wrong and unsure on odd ones.
        let small = (0..40)
            .map(|i| {
                let good = i % 2 == 0;
                answered(good, vec![if good { -0.1 } else { -3.0 }], 1.0)
            })
            .collect();
        let large = (0..40).map(|_| answered(true, vec![-0.1], 4.0)).collect();
        let replay = Replay::new(&questions, small, large, 0.5);
        let (tune, held) = (replay.tuning(), replay.held());
        assert_eq!(tune.len() + held.len(), 40);
        assert!(!tune.is_empty() && !held.is_empty(), "both splits are used");
        assert_eq!(replay.skip_examples().len(), tune.len());
        assert!(
            replay
                .skip_examples()
                .iter()
                .all(|e| e.prompt.ends_with("Answer briefly."))
        );
        let choices = replay.sweep(0.95);
        assert_eq!(choices.len(), 2 * SIGNALS.len());
        let best = best(&choices).unwrap();
        // Accepting the sure answers keeps all the quality at about 3/4 of the cost (the
        // small tier on every question, the large one on half).
        assert_eq!((best.chosen.quality, best.held.quality), (1.0, 1.0));
        assert!(best.chosen.cost < 0.9 && best.held.cost < 0.9, "{best:?}");
        assert_eq!(
            frontier(&held, best.signal, 0.0).len(),
            2,
            "two distinct confidences"
        );
    }
}
