//! A cascade's cost and quality on questions with checkable answers, replayed offline
//! (`frugal eval-route` prints it).
//!
//! Every question is answered by each tier alone (greedy, one at a time, so each answer's
//! engine time is its own), its prompt rendered and tokenized as the gateway does a chat
//! request ([`prompt_tokens`]); then the cascade is replayed for every confidence signal and
//! threshold: accept the small tier's answer at or above the threshold, else pay for the
//! large tier too. The threshold is chosen on the tuning split as the cheapest whose
//! quality keeps the target by a lower confidence bound ([`Bound`]: a bootstrap over the
//! tuning questions, every candidate bounded at once); the held-out split reports what it
//! keeps.
//!
//! With a skip rule, the questions nearest to each one (by embedding, tuning questions
//! only) vote on whether the small tier is worth trying: below a share of right answers
//! among them, the question goes straight to the large tier. The share to skip below is
//! chosen on the tuning split with the threshold (leave-one-out there).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use frugal_cost::{Agreement, Progress};
use frugal_engine::model::{LoadOptions, ModelError};
use frugal_engine::sampling::SamplingParams;
use frugal_engine::scheduler::{Engine, Event, Priority, Request, SchedulerConfig};
use frugal_engine::template::ChatTemplate;
use frugal_engine::tokenizer::Tokenizer;
use frugal_semantic::agree::agree;
use frugal_semantic::{EmbedError, Embedder};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::assemble::DEFAULT_SKIP_K;
use crate::backend::load_parts;
use crate::cascade::learned::LinearRouter;
use crate::cascade::route::{SkipExample, SkipRule, confidence};
use crate::http::api::{ChatMessage, Content};
use crate::http::validate::{Input, prompt_tokens};
use crate::jsonl::JsonLinesError;

/// Folds of the tuning questions the learned router is cross-fitted over.
pub const FOLDS: usize = 5;

/// The learned router's L2 penalty, per example.
const ROUTER_L2: f32 = 1e-3;

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
    #[error("{path}: {message}")]
    Answers { path: String, message: String },
    #[error("question id {id} is in both {first} and {second}: ids must be unique")]
    DuplicateId {
        id: u64,
        first: String,
        second: String,
    },
    #[error("cannot load {path}")]
    Load {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Start(#[from] ModelError),
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
    /// Multiple choice: `answers` holds the right option's letter, then its text.
    Choice,
}

/// JSON lines of questions; an error names the line.
pub fn read_questions(path: &Path) -> Result<Vec<Question>, EvalError> {
    Ok(crate::jsonl::read(
        path,
        "{id, kind, question, answers, check}",
    )?)
}

/// The questions of several files, in order; an id in two of them is an error (the split
/// and saved answers go by id).
pub fn read_question_files(paths: &[PathBuf]) -> Result<Vec<Question>, EvalError> {
    let mut seen: HashMap<u64, &Path> = HashMap::new();
    let mut out = Vec::new();
    for path in paths {
        for q in read_questions(path)? {
            if let Some(first) = seen.insert(q.id, path) {
                return Err(EvalError::DuplicateId {
                    id: q.id,
                    first: first.display().to_string(),
                    second: path.display().to_string(),
                });
            }
            out.push(q);
        }
    }
    Ok(out)
}

/// Whether `reply` gives one of the accepted answers.
pub fn is_correct(q: &Question, reply: &str) -> bool {
    let lower = reply.to_lowercase();
    match q.check {
        Check::Contains => q
            .answers
            .iter()
            .any(|a| contains_phrase(&lower, &a.to_lowercase())),
        Check::Choice => match chosen_letter(reply) {
            Some(letter) => q.answers.first().is_some_and(|a| a.starts_with(letter)),
            None => q
                .answers
                .get(1)
                .is_some_and(|text| contains_phrase(&lower, &text.to_lowercase())),
        },
        Check::LastNumber | Check::FirstNumber => {
            let digits = without_thousands_commas(&lower);
            let numbers: Vec<&str> = digits
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

/// "1,000" read as "1000": a comma between digits.
fn without_thousands_commas(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    chars
        .iter()
        .enumerate()
        .filter(|&(i, &c)| {
            !(c == ','
                && i > 0
                && chars[i - 1].is_ascii_digit()
                && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        })
        .map(|(_, &c)| c)
        .collect()
}

/// The option a reply names: the first capital A to E standing alone ("B", "(C)", "D.",
/// "Answer: A"), but not "A" as an article ("A cat ...": a space and a small letter after).
fn chosen_letter(reply: &str) -> Option<char> {
    let chars: Vec<char> = reply.chars().collect();
    (0..chars.len()).find_map(|i| {
        let c = chars[i];
        let alone = ('A'..='E').contains(&c)
            && !(i > 0 && chars[i - 1].is_alphanumeric())
            && !chars.get(i + 1).is_some_and(|n| n.is_alphanumeric());
        let article = chars.get(i + 1) == Some(&' ')
            && chars.get(i + 2).is_some_and(|n| n.is_lowercase())
            && !(i > 0 && chars[i - 1] == '(');
        (alone && !article).then_some(c)
    })
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answered {
    pub text: String,
    /// Whether `text` gives an accepted answer (checked again when read back).
    #[serde(default)]
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

/// A tier's name: its file's, less the extension.
pub fn tier_name(path: &Path) -> String {
    path.file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().into_owned())
}

impl Tier {
    /// The model at `path`, loaded with `options`, named after its file.
    pub fn load(path: &Path, options: LoadOptions) -> Result<Tier, EvalError> {
        let (model, tokenizer, template) =
            load_parts(path, options).map_err(|source| EvalError::Load {
                path: path.display().to_string(),
                source,
            })?;
        let engine = Engine::start(
            model,
            SchedulerConfig {
                max_batch: 1,
                ..SchedulerConfig::default()
            },
        )?;
        Ok(Tier {
            name: tier_name(path),
            engine,
            tokenizer,
            template,
        })
    }

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
            priority: Priority::Interactive,
        };
        let mut rx = self.engine.submit(request).map_err(|e| engine_error(&e))?;
        let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
        while let Some(e) = rx.blocking_recv() {
            match e {
                Event::Admitted { .. } => {}
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

/// Both tiers' answers saved by an earlier run, to replay the cascade again without the
/// models.
pub struct Saved {
    /// In the order of the questions asked for.
    pub small: Vec<Answered>,
    pub large: Vec<Answered>,
    /// The small and the large tier's names, where the file gives them.
    pub tiers: Option<[String; 2]>,
}

/// The `answers` of an earlier run's JSON (`frugal eval-route --json`), matched to
/// `questions` by id, each answer checked again against its question.
pub fn read_answers(path: &Path, questions: &[Question]) -> Result<Saved, EvalError> {
    #[derive(Deserialize)]
    struct Entry {
        id: u64,
        small: Answered,
        large: Answered,
    }
    #[derive(Deserialize)]
    struct File {
        answers: Vec<Entry>,
        #[serde(default)]
        tiers: Option<[String; 2]>,
    }
    let error = |message: String| EvalError::Answers {
        path: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    let file: File = serde_json::from_str(&text).map_err(|e| {
        error(format!(
            "expected an earlier run's --json output, with its answers ({e})"
        ))
    })?;
    let by_id: HashMap<u64, Entry> = file.answers.into_iter().map(|e| (e.id, e)).collect();
    let (mut small, mut large) = (Vec::new(), Vec::new());
    for q in questions {
        let e = by_id
            .get(&q.id)
            .ok_or_else(|| error(format!("no answers to question {}", q.id)))?;
        for (a, all) in [(&e.small, &mut small), (&e.large, &mut large)] {
            all.push(Answered {
                correct: is_correct(q, &a.text),
                ..a.clone()
            });
        }
    }
    Ok(Saved {
        small,
        large,
        tiers: file.tiers,
    })
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

    /// Each row's question embedded by `embedder`, in row order.
    pub fn embed(&self, embedder: &Embedder) -> Result<Vec<Vec<f32>>, EvalError> {
        self.rows
            .iter()
            .map(|r| embedder.embed(&user_text(r.q)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(EvalError::Embed)
    }

    /// The kNN skip rule: each row's share of right small answers among its [`SKIP_K`]
    /// nearest tuning questions (itself left out), by `vectors` ([`Replay::embed`]).
    pub fn vote(&mut self, vectors: &[Vec<f32>]) {
        let dim = vectors.first().map_or(0, Vec::len);
        let tuning: Vec<usize> = (0..self.rows.len())
            .filter(|&i| !self.rows[i].held_out)
            .collect();
        let shares: Vec<f32> = (0..self.rows.len())
            .map(|i| {
                let examples = tuning
                    .iter()
                    .filter(|&&j| j != i)
                    .map(|&j| (vectors[j].clone(), self.rows[j].small.correct));
                SkipRule::new(dim, examples, SKIP_K, 0.0).share(&vectors[i])
            })
            .collect();
        for (r, s) in self.rows.iter_mut().zip(shares) {
            r.share = s;
        }
    }

    /// The learned router ([`LinearRouter`]): each row's chance that the small tier is
    /// right. A tuning row's comes from a model fitted on the other [`FOLDS`] - 1 folds of
    /// the tuning questions (cross-fitting, so the search never sees a score fitted on its
    /// own answer); a held-out row's from one fitted on every tuning question, returned.
    pub fn learn(&mut self, vectors: &[Vec<f32>]) -> LinearRouter {
        let fold = |r: &Row| (r.q.id.wrapping_mul(0xD1B5_4A32_D192_ED03) >> 32) as usize % FOLDS;
        let fit = |keep: &dyn Fn(&Row) -> bool| {
            let examples: Vec<(&[f32], usize, bool)> = self
                .rows
                .iter()
                .zip(vectors)
                .filter(|(r, _)| !r.held_out && keep(r))
                .map(|(r, v)| (&v[..], user_text(r.q).len(), r.small.correct))
                .collect();
            LinearRouter::fit(&examples, ROUTER_L2)
        };
        let folds: Vec<LinearRouter> = (0..FOLDS).map(|k| fit(&|r| fold(r) != k)).collect();
        let all = fit(&|_| true);
        let shares: Vec<f32> = self
            .rows
            .iter()
            .zip(vectors)
            .map(|(r, v)| {
                let model = if r.held_out { &all } else { &folds[fold(r)] };
                model.probability(v, user_text(r.q).len())
            })
            .collect();
        for (r, s) in self.rows.iter_mut().zip(shares) {
            r.share = s;
        }
        all
    }

    /// Per kind of question, in name order: how many, and how many each tier got right.
    pub fn by_kind(&self) -> BTreeMap<&'a str, Tally> {
        let mut kinds: BTreeMap<&str, Tally> = BTreeMap::new();
        for r in &self.rows {
            let k = kinds.entry(r.q.kind.as_str()).or_default();
            k.questions += 1;
            k.small_right += usize::from(r.small.correct);
            k.large_right += usize::from(r.large.correct);
        }
        kinds
    }

    /// Engine seconds of every answer: the small tier's and the large tier's.
    pub fn seconds(&self) -> (f64, f64) {
        let total = |f: fn(&Row) -> f64| self.rows.iter().map(f).sum::<f64>();
        (total(|r| r.small.seconds), total(|r| r.large.seconds))
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
    /// below) chosen on the tuning split, the cheapest whose quality's lower bound (all
    /// candidates of every signal bounded together, as [`best`] picks among them) is at least
    /// `min_quality`, and what it does on the held-out one.
    pub fn sweep(&self, min_quality: f64, bound: Bound) -> Sweep {
        let (tune, held) = (self.tuning(), self.held());
        let skip_belows = skip_belows();
        let search = search(&tune, &SIGNALS, &skip_belows, bound);
        let choices = SIGNALS
            .iter()
            .flat_map(|&s| [&skip_belows[..1], &skip_belows[..]].map(move |b| (s, b)))
            .filter_map(|(signal, belows)| {
                let c = search.choose(signal, belows, min_quality)?;
                let (t, b) = (c.outcome.threshold, c.outcome.skip_below);
                Some(Choice {
                    signal,
                    chosen: c.outcome,
                    lower: c.lower,
                    held: outcome(&held, signal, t, b),
                })
            })
            .collect();
        Sweep {
            choices,
            candidates: search.candidates.len(),
            percentile: search.percentile,
            unresolved: search.unresolved,
        }
    }
}

/// Questions of one kind, and how many each tier answered right.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub questions: usize,
    pub small_right: usize,
    pub large_right: usize,
}

/// The ids of the questions that one of two models answered right and the other did not:
/// (right only with `theirs`, right only with `ours`), each in the questions' order.
pub fn flips(questions: &[Question], ours: &[bool], theirs: &[bool]) -> (Vec<u64>, Vec<u64>) {
    let (mut lost, mut gained) = (Vec::new(), Vec::new());
    for ((q, &o), &t) in questions.iter().zip(ours).zip(theirs) {
        if t && !o {
            lost.push(q.id);
        } else if o && !t {
            gained.push(q.id);
        }
    }
    (lost, gained)
}

/// [`Replay::sweep`]'s choices, and how their bounds were taken.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub choices: Vec<Choice>,
    /// Candidates tried on the tuning split, all signals and skip shares together.
    pub candidates: usize,
    /// The percentile of a candidate's resampled quality taken as its bound (`None`
    /// without resamples: the quality on the tuning split as it is).
    pub percentile: Option<f64>,
    /// As [`Search::unresolved`].
    pub unresolved: bool,
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
    /// The lower confidence bound of `chosen.quality`.
    pub lower: f64,
    pub held: Outcome,
}

/// A routing without a threshold, on the held-out rows: every question to one tier, or to
/// the one an oracle that knew the answers would pick (the small tier where it is right).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Fixed {
    pub name: &'static str,
    pub small_share: f64,
    /// Accuracy over the large tier's alone.
    pub quality: f64,
    /// Cost over the large tier's alone.
    pub cost: f64,
}

/// All large, all small, and the oracle over `rows`.
pub fn fixed_routes(rows: &[&Row]) -> [Fixed; 3] {
    let large_right = rows.iter().filter(|r| r.large.correct).count().max(1) as f64;
    let large_cost = rows
        .iter()
        .map(|r| r.large.seconds)
        .sum::<f64>()
        .max(f64::MIN_POSITIVE);
    let route = |name, small: &dyn Fn(&Row) -> bool| {
        let (mut n_small, mut right, mut cost) = (0usize, 0usize, 0f64);
        for r in rows {
            let a = if small(r) { &r.small } else { &r.large };
            n_small += usize::from(small(r));
            right += usize::from(a.correct);
            cost += a.seconds;
        }
        Fixed {
            name,
            small_share: n_small as f64 / rows.len().max(1) as f64,
            quality: right as f64 / large_right,
            cost: cost / large_cost,
        }
    };
    [
        route("all large", &|_| false),
        route("all small", &|_| true),
        route("oracle", &|r| r.small.correct || !r.large.correct),
    ]
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
    replay(
        rows,
        &values(rows, signal),
        threshold,
        skip_below,
        |_, _| {},
    )
}

/// Each row's confidence by `signal`.
fn values(rows: &[&Row], signal: Signal) -> Vec<f32> {
    rows.iter().map(|r| signal.of(&r.small.logprobs)).collect()
}

/// [`outcome`] with the rows' confidences given, telling `each` whether the cascade
/// answered each row (by index) right.
fn replay(
    rows: &[&Row],
    values: &[f32],
    threshold: f32,
    skip_below: f32,
    mut each: impl FnMut(usize, bool),
) -> Outcome {
    let (mut small, mut skipped, mut correct, mut cost) = (0usize, 0usize, 0usize, 0f64);
    let (mut large_correct, mut large_cost) = (0usize, 0f64);
    for (i, (r, &value)) in rows.iter().zip(values).enumerate() {
        large_correct += usize::from(r.large.correct);
        large_cost += r.large.seconds;
        let skip = skips(r, threshold, skip_below);
        skipped += usize::from(skip);
        if threshold.is_finite() && !skip {
            cost += r.small.seconds;
        }
        let right = if small_answers(r, value, threshold, skip_below) {
            small += 1;
            r.small.correct
        } else {
            cost += r.large.seconds;
            r.large.correct
        };
        correct += usize::from(right);
        each(i, right);
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

/// Whether the skip rule sends `r` straight to the large tier (never for the baseline, an
/// infinite threshold).
fn skips(r: &Row, threshold: f32, skip_below: f32) -> bool {
    threshold.is_finite() && r.share < skip_below
}

/// Whether the cascade serves `r` the small tier's answer, its confidence being `value`.
fn small_answers(r: &Row, value: f32, threshold: f32, skip_below: f32) -> bool {
    !skips(r, threshold, skip_below) && value >= threshold
}

/// What shadows of a cascade's accepted cheap answers would measure: of the rows it serves
/// the small tier's answer, how many agree with the large tier's by [`agree`] (the rule
/// `frugal serve` judges a shadow by), and how many the checks find no worse.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Shadowed {
    pub accepted: usize,
    pub agreed: usize,
    /// Judged by the embeddings' cosine (the two texts differ).
    pub by_embedding: usize,
    /// Right by the check, or the large tier wrong too.
    pub no_worse: usize,
}

/// [`Shadowed`] for the cascade at `threshold` and `skip_below` over `rows`.
pub fn shadowed(
    rows: &[&Row],
    signal: Signal,
    threshold: f32,
    skip_below: f32,
    embedder: &Embedder,
) -> Shadowed {
    let mut s = Shadowed::default();
    for r in rows {
        if !small_answers(r, signal.of(&r.small.logprobs), threshold, skip_below) {
            continue;
        }
        let v = agree(Some(embedder), &r.small.text, &r.large.text);
        s.accepted += 1;
        s.agreed += usize::from(v.agreed);
        s.by_embedding += usize::from(v.method == Agreement::Embedding);
        s.no_worse += usize::from(r.small.correct || !r.large.correct);
    }
    s
}

/// The cheapest threshold (and share to skip below, one of `skip_belows`) on `rows` whose
/// quality's lower bound is at least `min_quality`, `signal`'s candidates bounded together.
pub fn choose(
    rows: &[&Row],
    signal: Signal,
    min_quality: f64,
    skip_belows: &[f32],
    bound: Bound,
) -> Option<Candidate> {
    search(rows, &[signal], skip_belows, bound).choose(signal, skip_belows, min_quality)
}

/// Bootstrap resamples of the tuning questions, as `frugal eval-route` defaults to: enough
/// to resolve the low percentile that bounding thousands of candidates at once comes to
/// (the 0.06th on the cascade's 6,930, 6 resamples of 10,000; 1,000 cannot resolve it).
pub const RESAMPLES: usize = 10_000;

/// The resampling's seed: a fixed one, so that a run repeats its choice.
const SEED: u64 = 0x005E_ED0F_CA5C_ADE5;

/// How a candidate's quality on the tuning split is bounded below.
///
/// The tuning questions are resampled with replacement (`resamples` times, from a fixed
/// seed), each candidate's quality (the cascade's accuracy over the large tier's on the
/// same resample) computed on every resample, and a low percentile of them taken: for one
/// candidate alone, at `confidence` 0.95, the 5th (a one-sided 95% bound).
///
/// The search tries thousands of candidates (every distinct confidence of five signals on
/// the tuning split, times nine shares to skip below), and the cheapest of many that pass
/// only just is likely to pass by luck: each alone at the 5th percentile, the cheapest
/// passing kept 90% on the held-out half. So with `family_wise` the percentile is made
/// stricter, the same for every candidate, until on all but `1 - confidence` of the
/// resamples *every* candidate is at or above its bound at once (a bootstrap min-p
/// adjustment): whichever is chosen then keeps its bound at `confidence`. Candidates a
/// question or two apart move together and cost the level little, where a Bonferroni
/// split over thousands would leave almost none passing.
///
/// `frugal eval-route` bounds what its held-out split will measure (`fresh`), as that is
/// the check it reports, and a stricter bound than the quality's own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    pub confidence: f64,
    /// 0: no bound, each candidate's quality on the tuning split taken as it is.
    pub resamples: usize,
    pub family_wise: bool,
    /// `None`: bound the quality over all questions like the tuning ones (a confidence
    /// bound). `Some(n)`: bound the quality measured on a fresh sample of `n` questions
    /// (a prediction bound, as for the held-out split): that sample's own sampling error
    /// adds to the tuning split's, so each resample draws `t·n/(t+n)` of the `t` tuning
    /// questions, whose quality varies by both.
    pub fresh: Option<usize>,
}

impl Default for Bound {
    fn default() -> Bound {
        Bound {
            confidence: 0.95,
            resamples: RESAMPLES,
            family_wise: true,
            fresh: None,
        }
    }
}

impl Bound {
    /// Questions each resample of `n` tuning questions draws.
    pub fn resample_size(&self, n: usize) -> usize {
        match self.fresh {
            None => n,
            Some(f) => ((n * f) as f64 / (n + f).max(1) as f64).round().max(1.0) as usize,
        }
    }
}

/// A threshold (and share to skip below) tried on the tuning split.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    pub signal: Signal,
    pub outcome: Outcome,
    /// The lower confidence bound of `outcome.quality`, never above it.
    pub lower: f64,
}

/// Every candidate tried on the tuning split, each with its bound.
#[derive(Debug, Clone)]
pub struct Search {
    pub candidates: Vec<Candidate>,
    /// The percentile of each candidate's resampled quality taken as its bound (`None`
    /// without resamples).
    pub percentile: Option<f64>,
    /// The level asks for a lower percentile than the resamples resolve: the bounds are
    /// the lowest resample's, looser than asked (more resamples would tighten them).
    pub unresolved: bool,
}

impl Search {
    /// The cheapest of `signal`'s candidates, skipping below one of `skip_belows`, whose
    /// bound is at least `min_quality` (the first of equals); else the baseline. `None`
    /// only if `signal` was not searched.
    pub fn choose(
        &self,
        signal: Signal,
        skip_belows: &[f32],
        min_quality: f64,
    ) -> Option<Candidate> {
        let ours = || {
            self.candidates
                .iter()
                .filter(move |c| c.signal == signal && skip_belows.contains(&c.outcome.skip_below))
        };
        ours()
            .filter(|c| c.lower >= min_quality)
            .min_by(|a, b| a.outcome.cost.total_cmp(&b.outcome.cost))
            .or_else(|| ours().find(|c| c.outcome.threshold.is_infinite()))
            .copied()
    }
}

/// Every candidate on `rows`: each of `signals` at each distinct confidence of the rows
/// (and the baseline, an infinite threshold), skipping below each of `skip_belows`, each
/// with its quality's lower bound by `bound`.
pub fn search(rows: &[&Row], signals: &[Signal], skip_belows: &[f32], bound: Bound) -> Search {
    let mut candidates = Vec::new();
    // Per candidate, whether the cascade answers each row right.
    let mut rights: Vec<Vec<bool>> = Vec::new();
    for &signal in signals {
        let values = values(rows, signal);
        let mut thresholds = values.clone();
        thresholds.push(f32::INFINITY);
        thresholds.sort_by(f32::total_cmp);
        thresholds.dedup();
        for &b in skip_belows {
            for &t in &thresholds {
                let mut right = vec![false; rows.len()];
                let outcome = replay(rows, &values, t, b, |i, r| right[i] = r);
                candidates.push(Candidate {
                    signal,
                    outcome,
                    lower: outcome.quality,
                });
                rights.push(right);
            }
        }
    }
    let bootstrapped = (bound.resamples > 0 && !rows.is_empty()).then(|| {
        let large: Vec<bool> = rows.iter().map(|r| r.large.correct).collect();
        bootstrap(&mut candidates, &rights, &large, bound)
    });
    Search {
        candidates,
        percentile: bootstrapped.map(|(p, _)| p),
        unresolved: bootstrapped.is_some_and(|(_, u)| u),
    }
}

/// Lowers each candidate's bound to a percentile of its quality over `bound.resamples`
/// resamples of the rows (`rights` as [`search`] keeps them); returns the percentile, and
/// whether the level asked for a lower one than the resamples resolve.
fn bootstrap(
    candidates: &mut [Candidate],
    rights: &[Vec<bool>],
    large: &[bool],
    bound: Bound,
) -> (f64, bool) {
    let (n, b) = (large.len(), bound.resamples);
    // weights[i * b + r]: how many times resample r draws row i (row-major, so that the
    // sums over the resamples run along contiguous memory). ChaCha8 from a fixed seed:
    // the same draws on every machine.
    let mut weights = vec![0f32; n * b];
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    for r in 0..b {
        for _ in 0..bound.resample_size(n) {
            weights[rng.random_range(0..n) * b + r] += 1.0;
        }
    }
    let row = |i: usize| &weights[i * b..(i + 1) * b];
    // Right answers in each resample: the large tier's, and the cascade's at the
    // candidate in hand, kept from one candidate to the next (most differ from the one
    // before by a row or two, so that each costs a pass over the resamples or two).
    let mut base = vec![0f32; b];
    for i in (0..n).filter(|&i| large[i]) {
        for (s, w) in base.iter_mut().zip(row(i)) {
            *s += w;
        }
    }
    let mut right = large.to_vec();
    let mut num = base.clone();
    // Resamples allowed below the bound: 5% of them at a confidence of 0.95.
    let allowed = (((1.0 - bound.confidence) * b as f64).floor() as usize).min(b - 1);
    // Per candidate, its `allowed + 1` lowest qualities, sorted; per resample, the fewest
    // of any candidate's resamples at or below its own quality there, when that is at
    // most `allowed + 1`: taking every bound at that (0-based) index or above, the
    // resample falls below some candidate's.
    let keep = allowed + 1;
    let mut lowest_k = vec![0f32; rights.len() * keep];
    let mut lowest = vec![b; b];
    let (mut quality, mut scratch) = (vec![0f32; b], vec![0f32; b]);
    for (k, now) in rights.iter().enumerate() {
        for i in 0..n {
            if now[i] == right[i] {
                continue;
            }
            let d = if now[i] { 1.0 } else { -1.0 };
            for (x, w) in num.iter_mut().zip(row(i)) {
                *x += d * w;
            }
            right[i] = now[i];
        }
        for ((q, x), l) in quality.iter_mut().zip(&num).zip(&base) {
            *q = x / l.max(1.0);
        }
        scratch.copy_from_slice(&quality);
        scratch.select_nth_unstable_by(allowed, f32::total_cmp);
        let low = &mut lowest_k[k * keep..(k + 1) * keep];
        low.copy_from_slice(&scratch[..keep]);
        low.sort_unstable_by(f32::total_cmp);
        let cut = low[allowed];
        for (at, q) in lowest.iter_mut().zip(&quality).filter(|(_, q)| **q <= cut) {
            *at = (*at).min(low.partition_point(|x| x <= q));
        }
    }
    // Resamples that fall below some candidate's bound at index 1 and above, by index.
    let mut at = vec![0usize; b + 1];
    for &l in &lowest {
        at[l] += 1;
    }
    let index = if bound.family_wise {
        // The largest index at which at most `allowed` resamples fall below a bound.
        let (mut below, mut index) = (0, 0);
        for (j, &count) in at.iter().enumerate().take(keep).skip(1) {
            below += count;
            if below > allowed {
                break;
            }
            index = j;
        }
        index
    } else {
        allowed
    };
    for (c, low) in candidates.iter_mut().zip(lowest_k.chunks_exact(keep)) {
        c.lower = c.lower.min(f64::from(low[index]));
    }
    let unresolved = bound.family_wise && index == 0 && at[1] > allowed;
    (index as f64 / b as f64, unresolved)
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
        let eggs = q(&["1200"], Check::LastNumber);
        assert!(is_correct(&eggs, "She makes $1,200 a week."));
        assert!(!is_correct(&eggs, "1, 200"));
    }

    #[test]
    fn a_choice_is_the_letter_named_or_else_the_options_text() {
        let c = q(&["C", "department store"], Check::Choice);
        for right in [
            "C",
            "C. department store",
            "(C)",
            "Answer: C",
            "The answer is C.",
            "A department store",
        ] {
            assert!(is_correct(&c, right), "{right}");
        }
        for wrong in [
            "B",
            "B. library",
            "(A) bank",
            "A: bank",
            "ABC",
            "the library",
        ] {
            assert!(!is_correct(&c, wrong), "{wrong}");
        }
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
        let c = choose(&refs, Signal::Quantile(0.0), 1.0, &[0.0], Bound::default())
            .unwrap()
            .outcome;
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
        let c = choose(
            &refs,
            Signal::Quantile(0.0),
            1.0,
            &[0.0, 0.5],
            Bound::default(),
        )
        .unwrap()
        .outcome;
        // Skipping the second, any threshold that accepts the first costs the same.
        assert_eq!((c.skip_below, c.cost), (0.5, 5.0 / 8.0));
    }

    #[test]
    fn flips_are_the_questions_right_with_one_model_only() {
        let mut questions = vec![q(&["x"], Check::Contains); 4];
        for (id, q) in (0..).zip(&mut questions) {
            q.id = id;
        }
        let ours = [true, false, true, false];
        let theirs = [true, true, false, false];
        assert_eq!(flips(&questions, &ours, &theirs), (vec![1], vec![2]));
        assert_eq!(tier_name(Path::new("models/qwen-0.5b.gguf")), "qwen-0.5b");
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
        let tally = Tally {
            questions: 40,
            small_right: 20,
            large_right: 40,
        };
        assert_eq!(
            replay.by_kind().into_iter().collect::<Vec<_>>(),
            [("k", tally)]
        );
        assert_eq!(replay.seconds(), (40.0, 160.0));
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
        let choices = replay.sweep(0.95, Bound::default()).choices;
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

    /// `n` questions: the small tier right more often the surer it is, the large one right
    /// on 85%, the neighbours' votes noisy hints of the small tier's answer; from `seed`.
    fn synthetic(questions: &[Question], seed: u64) -> Vec<Row<'_>> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        questions
            .iter()
            .map(|q| {
                let sure: f32 = rng.random_range(0.0..1.0);
                let small_right = rng.random_range(0.0..1.0) < 0.2 + 0.75 * sure;
                let large_right = rng.random_range(0.0..1.0) < 0.85;
                let hint = if small_right { 0.6 } else { 0.3 };
                let share = (hint + rng.random_range(-0.3f32..0.3)).clamp(0.0, 1.0);
                Row {
                    q,
                    small: answered(small_right, vec![-0.01, -3.0 * (1.0 - sure)], 1.0),
                    large: answered(large_right, vec![-0.01], 4.0),
                    held_out: false,
                    share: (share * 8.0).round() / 8.0,
                }
            })
            .collect()
    }

    fn numbered(n: u64) -> Vec<Question> {
        (0..n)
            .map(|id| Question {
                id,
                ..q(&["x"], Check::Contains)
            })
            .collect()
    }

    const UNBOUNDED: Bound = Bound {
        confidence: 0.95,
        resamples: 0,
        family_wise: true,
        fresh: None,
    };

    #[test]
    fn the_bound_is_below_the_point_estimate() {
        let questions = numbered(150);
        let rows = synthetic(&questions, 7);
        let refs: Vec<&Row> = rows.iter().collect();
        let (signals, belows) = (&SIGNALS[..2], skip_belows());
        let bound = Bound {
            resamples: 2000,
            ..Bound::default()
        };
        let all = search(&refs, signals, &belows, bound);
        let alone = search(
            &refs,
            signals,
            &belows,
            Bound {
                family_wise: false,
                ..bound
            },
        );
        let (p_all, p_alone) = (all.percentile.unwrap(), alone.percentile.unwrap());
        assert_eq!(p_alone, 0.05, "each alone: the 5th percentile");
        assert!(p_all < p_alone, "all at once is stricter: {p_all}");
        for (a, b) in all.candidates.iter().zip(&alone.candidates) {
            let q = a.outcome.quality;
            assert!(a.lower <= b.lower && b.lower <= q, "{a:?} {b:?}");
            if a.outcome.threshold.is_infinite() {
                assert_eq!(a.lower, 1.0, "the baseline is the large tier: no error");
            }
        }
        // Candidates that trade answers with the large tier have some spread.
        assert!(
            all.candidates
                .iter()
                .any(|c| c.lower < c.outcome.quality - 0.05)
        );
        // The same seed, the same bounds.
        let again = search(&refs, signals, &belows, bound);
        assert!(
            all.candidates
                .iter()
                .zip(&again.candidates)
                .all(|(a, b)| a.lower == b.lower)
        );
        // Bounding a fresh sample's quality is looser than bounding the quality itself.
        let fresh = Bound {
            fresh: Some(150),
            ..bound
        };
        assert_eq!(fresh.resample_size(150), 75);
        let predicted = search(&refs, signals, &belows, fresh);
        let spread = |s: &Search| {
            s.candidates
                .iter()
                .map(|c| c.outcome.quality - c.lower)
                .sum::<f64>()
        };
        assert!(spread(&predicted) > spread(&all));
    }

    #[test]
    fn the_bound_chooses_no_cheaper_and_its_choice_meets_the_target() {
        let questions = numbered(120);
        let belows = skip_belows();
        let bound = Bound {
            resamples: 2000,
            ..Bound::default()
        };
        let bounds = [
            bound,
            Bound {
                family_wise: false,
                ..bound
            },
            Bound {
                fresh: Some(120),
                ..bound
            },
        ];
        let mut dearer = 0;
        for seed in 0..4 {
            let rows = synthetic(&questions, seed);
            let refs: Vec<&Row> = rows.iter().collect();
            for target in [0.8, 0.9, 0.95, 1.0] {
                for skips in [&belows[..1], &belows[..]] {
                    let signal = Signal::Quantile(0.0);
                    let plain = choose(&refs, signal, target, skips, UNBOUNDED).unwrap();
                    assert_eq!(plain.lower, plain.outcome.quality, "unbounded");
                    for bound in bounds {
                        let c = choose(&refs, signal, target, skips, bound).unwrap();
                        assert!(c.outcome.cost >= plain.outcome.cost, "{c:?} {plain:?}");
                        assert!(c.lower >= target, "{c:?}");
                        assert!(c.outcome.quality >= c.lower);
                        dearer += usize::from(c.outcome.cost > plain.outcome.cost);
                    }
                }
            }
        }
        assert!(dearer > 0, "the bound costs something somewhere");
    }

    #[test]
    fn saved_answers_are_read_back_and_checked_again() {
        let questions = numbered(3);
        // As `frugal eval-route --json` writes them (the large answers' `correct` left
        // out: it is checked again anyway).
        let entry = |id: u64, small: &str| {
            serde_json::json!({
                "id": id,
                "kind": "k",
                "held_out": false,
                "small": {"text": small, "correct": false, "logprobs": [-0.5], "seconds": 0.1},
                "large": {"text": "x", "logprobs": [-0.1], "seconds": 0.4},
            })
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eval-route.json");
        let write = |answers: Vec<_>| {
            let v = serde_json::json!({"answers": answers, "tiers": ["s", "l"]});
            std::fs::write(&path, v.to_string()).unwrap();
        };
        write(vec![entry(2, "y"), entry(0, "x"), entry(1, "the x")]);
        let saved = read_answers(&path, &questions).unwrap();
        assert_eq!(saved.tiers, Some(["s".to_string(), "l".to_string()]));
        let small: Vec<bool> = saved.small.iter().map(|a| a.correct).collect();
        assert_eq!(
            small,
            [true, true, false],
            "in the questions' order, rechecked"
        );
        assert!(saved.large.iter().all(|a| a.correct && a.seconds == 0.4));
        write(vec![entry(0, "x")]);
        let e = read_answers(&path, &questions).err().unwrap().to_string();
        assert!(e.contains("no answers to question 1"), "{e}");
    }
}
