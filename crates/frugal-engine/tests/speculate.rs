//! Speculative decoding by prompt lookup gives exactly the tokens (and logprobs) of plain
//! decoding, greedy and seeded, on both model files; it ends an answer at a stop token or at
//! max_tokens inside a draft as plain decoding does; and its refused drafts leave the
//! prefix cache's shared blocks as they were.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use frugal_engine::gguf::Gguf;
use frugal_engine::model::{LoadOptions, Model};
use frugal_engine::prompt::encode_chat;
use frugal_engine::sampling::SamplingParams;
use frugal_engine::scheduler::{Engine, Event, FinishReason, Priority, Request, SchedulerConfig};
use frugal_engine::speculate::Speculate;
use frugal_engine::template::{ChatTemplate, Message};
use frugal_engine::tokenizer::Tokenizer;

fn small() -> PathBuf {
    frugal_testkit::test_model(frugal_engine::DEFAULT_MODEL)
}

fn large() -> PathBuf {
    frugal_testkit::model(frugal_engine::LARGE_MODEL)
}

/// A model file's engines, one plain and one speculating, and its chat prompts.
struct Pair {
    plain: Engine,
    spec: Engine,
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

impl Pair {
    fn load(path: &PathBuf, prefix_cache: bool) -> Pair {
        let g = Gguf::open(path).unwrap();
        let engine = |speculate| {
            let model = Model::from_gguf(&g, LoadOptions::default()).unwrap();
            let config = SchedulerConfig {
                speculate,
                prefix_cache,
                ..SchedulerConfig::default()
            };
            Engine::start(model, config).unwrap()
        };
        Pair {
            plain: engine(Speculate::None),
            spec: engine(Speculate::Ngram),
            tokenizer: Tokenizer::from_gguf(&g).unwrap(),
            template: ChatTemplate::from_gguf(&g).unwrap(),
        }
    }

    fn chat(&self, user: &str) -> Vec<u32> {
        encode_chat(
            &self.tokenizer,
            &self.template,
            &[Message::user(user)],
            true,
        )
        .unwrap()
    }

    fn accepted(&self) -> u64 {
        self.spec.stats().accepted_tokens.load(Ordering::Relaxed)
    }
}

/// A request's tokens, each token's logprob and top alternatives as bits (equal bits: equal
/// logits), and how it ended.
#[derive(Debug, PartialEq)]
struct Answer {
    tokens: Vec<u32>,
    bits: Vec<Vec<u32>>,
    reason: FinishReason,
    completion_tokens: usize,
}

fn request(prompt: Vec<u32>, max_tokens: usize, sampling: SamplingParams) -> Request {
    Request {
        prompt,
        max_tokens,
        sampling: SamplingParams {
            top_logprobs: 3,
            ..sampling
        },
        stop_tokens: Vec::new(),
        ignore_eos: false,
        priority: Priority::Interactive,
    }
}

/// Every request submitted at once (they share steps), then each answer.
fn answer_all(e: &Engine, requests: &[Request]) -> Vec<Answer> {
    let rxs: Vec<_> = requests
        .iter()
        .map(|r| e.submit(r.clone()).unwrap())
        .collect();
    rxs.into_iter()
        .map(|mut rx| {
            let (mut tokens, mut bits) = (Vec::new(), Vec::new());
            while let Some(ev) = rx.blocking_recv() {
                match ev {
                    Event::Admitted { .. } => {}
                    Event::Token(s, _) => {
                        tokens.push(s.token);
                        let top = s.top.iter().map(|(_, p)| p.to_bits());
                        bits.push([s.logprob.to_bits()].into_iter().chain(top).collect());
                    }
                    Event::Done {
                        reason,
                        completion_tokens,
                        ..
                    } => {
                        return Answer {
                            tokens,
                            bits,
                            reason,
                            completion_tokens,
                        };
                    }
                    Event::Failed(e) => panic!("failed: {e}"),
                }
            }
            panic!("no Done event")
        })
        .collect()
}

const GREEDY: SamplingParams = SamplingParams {
    temperature: 0.0,
    top_p: 1.0,
    top_k: 0,
    seed: None,
    top_logprobs: 0,
};

const SEEDED: SamplingParams = SamplingParams {
    temperature: 0.8,
    top_p: 0.95,
    top_k: 0,
    seed: Some(11),
    top_logprobs: 0,
};

/// A passage to copy from (the shipped prompts' first kind of task), and a free question.
const PASSAGE: &str = "Compute instances come in four families: general purpose (n2, 2 to 64 \
vCPUs, 4 GiB of memory per vCPU), compute optimized (c2, 2 GiB per vCPU), memory optimized \
(m2, 8 GiB per vCPU) and GPU instances (g1, with one to eight GPUs). Object storage costs two \
cents per GiB and month; managed databases run PostgreSQL or MySQL.";

fn prompts(p: &Pair) -> Vec<Vec<u32>> {
    [
        format!("Repeat this text word for word.\n\n{PASSAGE}"),
        format!("List the instance families in this text, one per line.\n\n{PASSAGE}"),
        "Rename `n` to `count` in this function and return it whole.\n\n```python\ndef \
         fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n```"
            .to_owned(),
        "Why is the sky blue?".to_owned(),
    ]
    .iter()
    .map(|u| p.chat(u))
    .collect()
}

/// Greedy and seeded, alone and batched with the other prompts: the same tokens and the
/// same logprob bits with drafts as without, and drafts were accepted.
fn same_outputs(path: &PathBuf, max_tokens: usize) {
    let p = Pair::load(path, true);
    for sampling in [GREEDY, SEEDED] {
        let requests: Vec<Request> = prompts(&p)
            .into_iter()
            .map(|t| request(t, max_tokens, sampling))
            .collect();
        let want = answer_all(&p.plain, &requests);
        let before = p.accepted();
        assert_eq!(
            answer_all(&p.spec, &requests),
            want,
            "{sampling:?}, batched"
        );
        for (r, w) in requests.iter().zip(&want) {
            assert_eq!(&answer_all(&p.spec, std::slice::from_ref(r))[0], w);
        }
        assert!(
            p.accepted() > before,
            "no draft was accepted ({sampling:?})"
        );
    }
}

#[test]
fn speculation_gives_the_tokens_of_plain_decoding_on_the_small_model() {
    same_outputs(&small(), 48);
}

#[test]
fn speculation_gives_the_tokens_of_plain_decoding_on_the_large_model() {
    same_outputs(&large(), 24);
}

/// The answer copies the passage, so drafts run long: a stop token inside one ends the
/// answer before it (it is never sent), and max_tokens inside one ends it there.
#[test]
fn a_stop_token_or_max_tokens_inside_a_draft_ends_the_answer_there() {
    let p = Pair::load(&small(), false);
    let prompt = prompts(&p).swap_remove(0);
    let full = answer_all(&p.plain, &[request(prompt.clone(), 40, GREEDY)]).remove(0);
    // A token of the passage first said well into the answer.
    let at = (10..full.tokens.len())
        .find(|&i| prompt.contains(&full.tokens[i]) && !full.tokens[..i].contains(&full.tokens[i]))
        .expect("a passage token first said after the tenth");
    let stopped = Request {
        stop_tokens: vec![full.tokens[at]],
        ..request(prompt.clone(), 40, GREEDY)
    };
    let before = p.accepted();
    let got = answer_all(&p.spec, std::slice::from_ref(&stopped)).remove(0);
    assert_eq!(got, answer_all(&p.plain, &[stopped]).remove(0));
    assert_eq!(got.tokens, full.tokens[..at]);
    assert_eq!(
        (got.reason, got.completion_tokens),
        (FinishReason::Stop, at)
    );
    assert!(p.accepted() > before, "the copy was drafted");
    for max_tokens in [1, 2, 7, 13] {
        let got = answer_all(&p.spec, &[request(prompt.clone(), max_tokens, GREEDY)]).remove(0);
        assert_eq!(got.tokens, full.tokens[..max_tokens]);
        assert_eq!(
            (got.reason, got.completion_tokens),
            (FinishReason::Length, max_tokens)
        );
    }
}

/// Turns of a conversation reuse the blocks of earlier ones while drafts are written past
/// them and cut back: every turn, and the first asked again, answers as plain decoding
/// without the prefix cache does.
#[test]
fn refused_drafts_leave_the_prefix_caches_blocks_as_they_were() {
    let cached = Pair::load(&small(), true);
    let fresh = Pair::load(&small(), false);
    let first = prompts(&cached).swap_remove(1);
    let run = |e: &Engine| {
        let one = answer_all(e, &[request(first.clone(), 32, GREEDY)]).remove(0);
        let second = [
            first.clone(),
            one.tokens.clone(),
            cached.chat("Now list them in reverse order."),
        ]
        .concat();
        let two = answer_all(e, &[request(second, 32, GREEDY)]).remove(0);
        let again = answer_all(e, &[request(first.clone(), 32, GREEDY)]).remove(0);
        [one, two, again]
    };
    assert_eq!(run(&cached.spec), run(&fresh.plain));
    let st = cached.spec.stats();
    assert!(st.prefix_hit_tokens.load(Ordering::Relaxed) > 0);
    assert!(st.drafted_tokens.load(Ordering::Relaxed) > st.accepted_tokens.load(Ordering::Relaxed));
}
