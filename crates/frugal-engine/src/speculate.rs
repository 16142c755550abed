//! Speculative decoding without a draft model: prompt lookup (n-gram) drafting, as vLLM's
//! `ngram` method and llama.cpp's lookup decoding do it.
//!
//! Answers that summarize, extract from or edit a text given in the prompt copy long runs of
//! it. When the last few tokens of a sequence occurred before (in its prompt or its own
//! output), the tokens that followed them then are a cheap guess at what follows now. The
//! scheduler feeds the pending token and that guess in one forward step, the batch's other
//! sequences beside it; the sampler draws from each position's logits in turn and keeps a
//! drafted token only while it is the token drawn. So every token a client sees is the one
//! plain decoding would have drawn (the logits of a position do not depend on how many
//! positions a step computes), and an accepted draft saves a whole step.
//!
//! A drafted token that is refused still cost its share of the step, so the drafter adapts
//! per sequence: it estimates how likely a drafted token is to be accepted after a match of
//! each n-gram length, drafts as many tokens as pay for themselves at that rate, and after
//! a few steps of drafts all refused stops drafting for a while, twice as long each time.
//! What a drafted token costs is measured once per engine on its model ([`draft_cost`]): a
//! third of a step for SmolLM2-135M, a fourteenth for Qwen2.5-0.5B, whose longer step
//! streams more weights that the extra rows reuse.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::kv::KvCache;
use crate::model::{Chunk, Model};

/// How the engine drafts tokens to verify (`[serve] speculate`, written by [`Speculate::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Speculate {
    /// Plain decoding: one token per sequence and step.
    #[default]
    None,
    /// Prompt lookup: the tokens that followed the last occurrence of the sequence's last
    /// n-gram.
    Ngram,
}

impl Speculate {
    pub const ALL: [Speculate; 2] = [Speculate::None, Speculate::Ngram];

    pub fn name(self) -> &'static str {
        match self {
            Speculate::None => "none",
            Speculate::Ngram => "ngram",
        }
    }
}

impl std::str::FromStr for Speculate {
    type Err = String;

    fn from_str(s: &str) -> Result<Speculate, String> {
        Speculate::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("`{s}` is not a speculation method: ngram or none"))
    }
}

/// The longest n-gram looked up (the longest match is the likeliest to go on).
const MAX_N: usize = 3;
/// The shortest.
const MIN_N: usize = 1;
/// Drafted tokens per step at most: with the pending token, one pass of the matmul kernels
/// (`MAX_NB` = 8 rows); a ninth row takes a second pass.
pub const MAX_DRAFT: usize = 7;
/// What a drafted token adds to a decode step of one sequence, as a share of the step, until
/// [`draft_cost`] measured it: `cargo bench -p frugal-engine --bench speculate` measured 1.3,
/// 1.66, 2.23 and 2.7 steps for 1, 2, 4 and 7 drafted tokens (SmolLM2-135M on 2 idle
/// AVX-512 cores; a larger model, or a busier machine, streams its weights longer and pays
/// less for each drafted token).
pub const DRAFT_COST: f32 = 0.25;
/// [`draft_cost`]'s measurement: rounds, each a step of one token then one of one plus
/// `COST_DRAFT`, after a prompt of `COST_PROMPT` tokens.
const COST_ROUNDS: usize = 6;
const COST_DRAFT: usize = 4;
const COST_PROMPT: usize = 16;
/// The first estimate of a drafted token's chance, how far each verified token moves it,
/// and how far each match not worth drafting moves it back towards the first estimate (so
/// that drafting is tried again now and then).
const FIRST_ODDS: f32 = 0.5;
const LEARN: f32 = 0.25;
const RECOVER: f32 = 0.01;
/// Steps in a row whose drafts were all refused before drafting pauses.
const MISSES: u32 = 3;
/// The first pause, in steps, and the longest.
const FIRST_PAUSE: u32 = 8;
const LONGEST_PAUSE: u32 = 256;

/// Bits of a token in an n-gram's key: three tokens fill 63 bits. A vocabulary past 2^21
/// could make two n-grams share a key; that costs a refused draft, never a wrong token.
const TOKEN_BITS: u32 = 21;

/// One sequence's drafter: its tokens, where each n-gram last occurred, and how well its
/// drafts have done.
pub(crate) struct Drafter {
    /// The prompt and every token sampled since, the pending one last.
    tokens: Vec<u32>,
    /// For n = 1..=MAX_N: the n tokens before position p, as a key, to the latest such p.
    after: [HashMap<u64, u32>; MAX_N],
    /// Positions entered in `after` so far (each is entered once the token at it is known).
    indexed: usize,
    /// The last draft proposed.
    draft: Vec<u32>,
    /// Per n-gram length: the estimated chance that a token drafted after a match is
    /// accepted, given that those before it were.
    odds: [f32; MAX_N],
    /// The n-gram length the last draft matched.
    matched: usize,
    /// Steps in a row with every drafted token refused.
    misses: u32,
    /// Steps left without drafting, and the next pause.
    paused: u32,
    pause: u32,
    /// What a drafted token adds to a step, as a share of it.
    cost: f32,
}

fn key(ngram: &[u32]) -> u64 {
    ngram.iter().fold(0, |k, &t| {
        (k << TOKEN_BITS) | u64::from(t & ((1 << TOKEN_BITS) - 1))
    })
}

impl Drafter {
    /// A drafter for a sequence of `prompt`, a drafted token costing `cost` of a step (see
    /// [`draft_cost`]).
    pub fn new(prompt: &[u32], cost: f32) -> Drafter {
        Drafter {
            tokens: prompt.to_vec(),
            after: Default::default(),
            indexed: 0,
            draft: Vec::with_capacity(MAX_DRAFT),
            odds: [FIRST_ODDS; MAX_N],
            matched: 0,
            misses: 0,
            paused: 0,
            pause: FIRST_PAUSE,
            cost,
        }
    }

    /// A token the sequence now has (sampled, to be fed next).
    pub fn push(&mut self, token: u32) {
        self.tokens.push(token);
    }

    /// Up to `max` tokens to follow the sequence's tokens: what followed the latest earlier
    /// occurrence of its longest repeated suffix of at most [`MAX_N`] tokens (the latest: the
    /// nearest context is the likeliest to go on alike). Empty when none occurred before, or
    /// while drafting pauses. `batch` sequences decode in the step: a drafted token then
    /// slows all of them, so it must be `batch` times as likely to pay (on 2 cores, a row
    /// added to a step of 8 sequences measured 0.45-0.56 of one sequence's share of it,
    /// where the linear estimate says 0.5-0.8: it errs on the side of plain decoding).
    pub fn propose(&mut self, max: usize, batch: usize) -> &[u32] {
        if self.paused > 0 {
            self.paused -= 1;
            return &[];
        }
        let len = self.tokens.len();
        for p in self.indexed.max(1)..len {
            for n in 1..=MAX_N.min(p) {
                self.after[n - 1].insert(key(&self.tokens[p - n..p]), p as u32);
            }
        }
        self.indexed = len;
        self.draft.clear();
        let found = (MIN_N..=MAX_N.min(len)).rev().find_map(|n| {
            let p = self.after[n - 1].get(&key(&self.tokens[len - n..]))?;
            Some((n, *p))
        });
        if let Some((n, p)) = found {
            self.matched = n;
            let odds = &mut self.odds[n - 1];
            let worth = worth_drafting(*odds, self.cost * batch.max(1) as f32);
            if worth == 0 {
                *odds += RECOVER * (FIRST_ODDS - *odds);
            }
            let max = max.min(worth);
            // Copied forward as LZ77 copies: past the end, the draft repeats itself, so a
            // sequence caught in a loop drafts whole turns of it.
            for i in p as usize..p as usize + max {
                let t = self
                    .tokens
                    .get(i)
                    .copied()
                    .or_else(|| self.draft.get(i - len).copied());
                self.draft.extend(t);
            }
        }
        &self.draft
    }

    /// Of `drafted` tokens verified, the first `accepted` were kept: the estimate for the
    /// n-gram length matched, and whether drafting pauses.
    pub fn verified(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        if let Some(odds) = self.odds.get_mut(self.matched.wrapping_sub(1)) {
            let refused = (accepted < drafted).then_some(0.0);
            for kept in std::iter::repeat_n(1.0, accepted).chain(refused) {
                *odds += LEARN * (kept - *odds);
            }
        }
        if accepted > 0 {
            self.misses = 0;
            self.pause = FIRST_PAUSE;
            return;
        }
        self.misses += 1;
        if self.misses >= MISSES {
            self.misses = 0;
            self.paused = self.pause;
            self.pause = (self.pause * 2).min(LONGEST_PAUSE);
        }
    }
}

/// What a drafted token adds to a one-sequence decode step of `model` on this machine, as a
/// share of the step: the least times of [`COST_ROUNDS`] interleaved steps of one token and
/// of one plus [`COST_DRAFT`] on a throwaway cache (some tens of milliseconds, once per
/// engine). [`DRAFT_COST`] if a step fails.
pub fn draft_cost(model: &Model) -> f32 {
    let positions = COST_PROMPT + COST_ROUNDS * (2 + COST_DRAFT);
    let mut cache = KvCache::with_capacity(&model.config, positions);
    let prompt: Vec<u32> = (0..COST_PROMPT as u32).collect();
    let mut step = |tokens: &[u32]| {
        let started = Instant::now();
        let mut chunk = [Chunk {
            tokens,
            cache: &mut cache,
            logits: tokens.len(),
        }];
        model.forward(&mut chunk).ok().map(|_| started.elapsed())
    };
    if step(&prompt).is_none() {
        return DRAFT_COST;
    }
    let (mut one, mut drafted) = (Duration::MAX, Duration::MAX);
    for _ in 0..COST_ROUNDS {
        let (Some(a), Some(b)) = (step(&[1]), step(&[1; 1 + COST_DRAFT])) else {
            return DRAFT_COST;
        };
        (one, drafted) = (one.min(a), drafted.min(b));
    }
    let extra = drafted.saturating_sub(one).as_secs_f32() / COST_DRAFT as f32;
    (extra / one.as_secs_f32().max(1e-9)).clamp(0.02, 1.0)
}

/// Weight of the newest step in [`learn_cost`]'s moving average.
const COST_WEIGHT: f32 = 0.05;

/// `cost` moved towards what a step of one sequence with `drafts` drafted tokens that took
/// `elapsed` says a drafted token costs, against `solo`, the plain step's moving average:
/// the measurement at start was at a short context, and the machine's load moves.
pub fn learn_cost(cost: f32, solo: Duration, elapsed: Duration, drafts: usize) -> f32 {
    let plain = solo.as_secs_f32();
    if plain <= 0.0 || drafts == 0 {
        return cost;
    }
    let seen = (elapsed.as_secs_f32() - plain) / plain / drafts as f32;
    (cost + COST_WEIGHT * (seen.clamp(0.02, 1.0) - cost)).clamp(0.02, 1.0)
}

/// The draft length that makes the most tokens per unit of step time when each drafted
/// token is accepted with chance `odds` after the ones before it: 1 + p + ... + p^k tokens
/// for 1 + k * `cost` of a step; none when no draft beats plain decoding.
fn worth_drafting(odds: f32, cost: f32) -> usize {
    let (mut best, mut best_rate) = (0, 1.0);
    let (mut tokens, mut chance) = (1.0, 1.0);
    for k in 1..=MAX_DRAFT {
        chance *= odds;
        tokens += chance;
        let rate = tokens / (1.0 + k as f32 * cost);
        if rate > best_rate {
            (best, best_rate) = (k, rate);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_parse_by_name_and_an_unknown_one_is_refused() {
        assert_eq!("ngram".parse(), Ok(Speculate::Ngram));
        assert_eq!("none".parse(), Ok(Speculate::None));
        let err = "eagle".parse::<Speculate>().unwrap_err();
        assert!(err.contains("ngram or none"), "{err}");
    }

    /// A drafter of `prompt` sure of its drafts: as long as the bound lets them be.
    fn sure(prompt: &[u32]) -> Drafter {
        let mut d = Drafter::new(prompt, DRAFT_COST);
        d.odds = [1.0; MAX_N];
        d
    }

    #[test]
    fn the_longest_repeated_suffix_proposes_what_followed_its_latest_occurrence() {
        // "1 2 3 4 5 9 1 2 3": "4 5 9 1 2 3" followed the earlier "1 2 3", and after them
        // the draft repeats itself.
        let mut d = sure(&[1, 2, 3, 4, 5, 9, 1, 2]);
        d.push(3);
        assert_eq!(d.propose(8, 1), [4, 5, 9, 1, 2, 3, 4]);
        assert_eq!(d.propose(2, 1), [4, 5]);
        // The latest occurrence wins: "3" was followed by 4, then by 7.
        let mut d = sure(&[3, 4, 9, 3, 7, 5]);
        d.push(3);
        assert_eq!(d.propose(1, 1), [7]);
        // The longest suffix wins: "8 3" was followed by 4, "3" last by 7.
        let mut d = sure(&[8, 3, 4, 3, 7, 8]);
        d.push(3);
        assert_eq!(d.propose(1, 1), [4]);
        let mut d = sure(&[1, 2]);
        d.push(3);
        assert!(d.propose(8, 1).is_empty(), "nothing repeats");
    }

    #[test]
    fn the_index_grows_with_the_sequence() {
        let mut d = sure(&[5, 6, 7]);
        assert!(d.propose(4, 1).is_empty());
        for t in [8, 5, 6] {
            d.push(t);
            let _ = d.propose(4, 1);
        }
        assert_eq!(d.propose(4, 1), [7, 8, 5, 6]);
    }

    #[test]
    fn drafts_are_as_long_as_their_acceptance_pays_for() {
        let lengths = [0.05, 0.3, 0.6, 0.8, 0.9, 0.95].map(|p| worth_drafting(p, DRAFT_COST));
        assert_eq!(lengths, [0, 1, 2, 3, 6, MAX_DRAFT]);
        // A loop drafts whole turns of itself, as many tokens as the odds of its 3-gram
        // match are worth: one at first, more once drafts were accepted, fewer after some
        // were refused.
        let mut d = Drafter::new(&[1, 2, 1, 2, 1, 2, 1], DRAFT_COST);
        assert_eq!(d.propose(8, 1), [2]);
        d.verified(1, 1);
        assert_eq!(d.propose(8, 1), [2, 1]);
        d.verified(2, 2);
        assert_eq!(d.propose(8, 1), [2, 1, 2]);
        assert_eq!(d.propose(1, 1).len(), 1, "the caller's bound");
        d.verified(3, 1);
        assert_eq!(d.propose(8, 1).len(), 2);
        // The odds are kept per n-gram length: a 1-gram match starts afresh.
        let mut d = Drafter::new(&[7, 1, 2, 3, 4, 5], DRAFT_COST);
        d.push(7);
        assert_eq!(d.propose(8, 1), [1]);
    }

    #[test]
    fn refused_drafts_stop_drafting_for_longer_and_longer() {
        let mut d = Drafter::new(&[1, 2, 1, 2, 1, 2, 1], DRAFT_COST);
        for _ in 0..MISSES {
            assert_eq!(d.propose(8, 1).len(), 1);
            d.verified(1, 0);
        }
        for _ in 0..FIRST_PAUSE {
            assert!(d.propose(8, 1).is_empty(), "paused");
        }
        // The odds fell below what a drafted token costs: none until they recover.
        let waited = (0..1000).take_while(|_| d.propose(8, 1).is_empty()).count();
        assert!((5..1000).contains(&waited), "{waited}");
        for _ in 0..MISSES {
            d.verified(1, 0);
        }
        assert_eq!(d.paused, 2 * FIRST_PAUSE);
        d.paused = 0;
        d.verified(1, 1);
        assert_eq!(d.pause, FIRST_PAUSE, "a kept token resets the pause");
    }

    /// The cheaper a drafted token, the longer the drafts worth making at the same odds, and
    /// none pays when a drafted token costs a whole step at even odds.
    #[test]
    fn cheaper_drafted_tokens_make_longer_drafts_worth_it() {
        let lengths: Vec<usize> = [1.0, 0.25, 0.07, 0.02]
            .into_iter()
            .map(|cost| worth_drafting(0.7, cost))
            .collect();
        assert!(lengths.windows(2).all(|w| w[0] <= w[1]), "{lengths:?}");
        assert!(lengths[0] < lengths[3], "{lengths:?}");
        assert_eq!(worth_drafting(0.5, 1.0), 0);
        assert_eq!(worth_drafting(0.99, 0.02), MAX_DRAFT);
    }

    /// The measured cost is a share of a step within the bounds the drafter can use, and
    /// leaves no trace in the model.
    #[test]
    fn the_draft_cost_is_measured_on_the_model() {
        let g = crate::gguf::testutil::test_model();
        let model = Model::from_gguf(g, crate::model::LoadOptions::default()).unwrap();
        let cost = draft_cost(&model);
        assert!((0.02..=1.0).contains(&cost), "{cost}");
    }

    /// A drafted token slows every sequence of a batched step: at odds worth one drafted
    /// token alone, a step of 8 drafts none.
    #[test]
    fn a_batched_step_asks_more_of_a_draft() {
        let prompt = [1, 2, 1, 2, 1, 2, 1];
        assert_eq!(Drafter::new(&prompt, DRAFT_COST).propose(8, 1), [2]);
        assert!(Drafter::new(&prompt, DRAFT_COST).propose(8, 8).is_empty());
    }

    /// The cost follows the steps it sees, a little per step, within its bounds.
    #[test]
    fn the_cost_follows_the_steps() {
        let ms = Duration::from_millis;
        // Steps of 10 ms plain that take 14 ms with 2 drafts: 0.2 per drafted token.
        let mut cost = 0.5;
        for _ in 0..200 {
            cost = learn_cost(cost, ms(10), ms(14), 2);
        }
        assert!((cost - 0.2).abs() < 0.01, "{cost}");
        // Noise faster than a plain step, or a stall, stays within bounds.
        assert_eq!(learn_cost(0.02, ms(10), ms(5), 3), 0.02);
        assert!(learn_cost(0.2, ms(10), ms(1000), 1) < 0.25);
        assert_eq!(learn_cost(0.3, Duration::ZERO, ms(5), 1), 0.3);
    }
}
