//! Prefix-aware routing (`routing = "prefix"`): a request goes to the replica most likely
//! to hold its prompt's prefix in its KV cache, as llm-d's and vLLM production-stack's
//! routers send it.
//!
//! It works on the request's text, not on engine tokens, so it serves frugal replicas and
//! engines that cache prefixes themselves (vLLM, llama-server) alike. The prompt is
//! rendered (the messages in order, role and text) and each message cut into
//! [`CHUNK`]-byte chunks; each chunk's key hashes the key before it, so a key names the
//! whole prefix up to its chunk's end. Each replica remembers the keys it was sent (least recently used first
//! out, [`REMEMBERED`] at most): the request goes to the replica holding its longest
//! prefix, unless that replica is at `max_in_flight` or past `(1 + BALANCE)` times the mean
//! in flight (consistent hashing with bounded loads, Mirrokni et al. 2018), when the next
//! best takes it. A prefix no replica holds goes by rendezvous (highest-random-weight)
//! hashing of its first chunk over the ready replicas, so a replica that joins or leaves
//! moves only its share of them, and gateways that do not share memory agree.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use crate::http::api::Content;
use crate::http::validate::{Input, Job};

/// Bytes of rendered prompt under one key: about 64 tokens, four of vLLM's 16-token blocks.
pub const CHUNK: usize = 256;
/// Keys remembered per replica: 4,096 chunks are about 1 MiB of prompt text (~250k
/// tokens), the order of what a replica's KV cache holds.
pub const REMEMBERED: usize = 4096;
/// Bounded loads' epsilon: a replica past 1.25 times the mean in flight is skipped.
pub const BALANCE: f64 = 0.25;

/// How a request was routed, for `frugal_pool_prefix_routed_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// To the replica holding its longest prefix.
    Hit,
    /// No replica held any of it: by rendezvous hashing.
    Miss,
    /// A replica held it but was too loaded; another took it.
    Overflow,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Hit, Outcome::Miss, Outcome::Overflow];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Hit => "hit",
            Outcome::Miss => "miss",
            Outcome::Overflow => "overflow",
        }
    }
}

/// The request's prefix keys, first chunk first.
pub fn keys(job: &Job) -> Vec<u64> {
    let mut keys = Vec::new();
    let mut prev = 0;
    for segment in render(&job.input) {
        prev = chain(&segment, prev, &mut keys);
    }
    keys
}

/// The prompt as routing reads it, a segment per message (its role and text parts): a
/// chunk never spans two messages, so every key of a turn's prompt is a key of the next
/// turn's, its short last message included. (Cut across messages, a first turn shorter
/// than a chunk would share no key with the second.)
fn render(input: &Input) -> Vec<Vec<u8>> {
    match input {
        Input::Chat(messages) => messages
            .iter()
            .map(|m| {
                let mut out = m.role.as_bytes().to_vec();
                out.push(0x1f);
                match &m.content {
                    None => {}
                    Some(Content::Text(t)) => out.extend_from_slice(t.as_bytes()),
                    Some(Content::Parts(parts)) => {
                        for t in parts.iter().filter_map(|p| p.text.as_deref()) {
                            out.extend_from_slice(t.as_bytes());
                        }
                    }
                }
                out
            })
            .collect(),
        Input::Prompt(prompts) => prompts.iter().map(|p| p.as_bytes().to_vec()).collect(),
    }
}

/// Pushes the keys of `segment`'s chunks, chained on from `prev`; returns the last.
fn chain(segment: &[u8], mut prev: u64, keys: &mut Vec<u64>) -> u64 {
    for chunk in segment.chunks(CHUNK) {
        let mut h = DefaultHasher::new();
        prev.hash(&mut h);
        chunk.hash(&mut h);
        prev = h.finish();
        keys.push(prev);
    }
    prev
}

/// Rendezvous weight of replica `id` for a prefix whose first key is `first`.
fn weight(first: u64, id: u32) -> u64 {
    let mut h = DefaultHasher::new();
    (first, id).hash(&mut h);
    h.finish()
}

/// The keys one replica was sent, least recently used first out.
#[derive(Debug, Default)]
pub struct Served {
    clock: u64,
    at: HashMap<u64, u64>,
    by_age: BTreeMap<u64, u64>,
}

impl Served {
    /// How many of `keys`' chunks, from the first, this replica holds: its longest held
    /// key names the whole prefix up to it.
    pub fn held(&self, keys: &[u64]) -> usize {
        keys.iter()
            .rposition(|k| self.at.contains_key(k))
            .map_or(0, |i| i + 1)
    }

    /// Remembers `keys`, forgetting the least recently used past `cap`. The first chunk is
    /// stamped newest: a prefix's tail goes before its head, as engines evict blocks.
    pub fn remember(&mut self, keys: &[u64], cap: usize) {
        for &k in keys.iter().rev() {
            self.clock += 1;
            if let Some(old) = self.at.insert(k, self.clock) {
                self.by_age.remove(&old);
            }
            self.by_age.insert(self.clock, k);
        }
        while self.at.len() > cap {
            let Some((_, k)) = self.by_age.pop_first() else {
                break;
            };
            self.at.remove(&k);
        }
    }

    /// Keys remembered now.
    pub fn remembered(&self) -> usize {
        self.at.len()
    }
}

/// A ready replica as the picker sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    pub id: u32,
    pub in_flight: u32,
    /// Chunks of the request's prefix it holds ([`Served::held`]).
    pub held: usize,
}

/// The candidate (by index) for a request whose first key is `first`: the longest held
/// prefix first, rendezvous weight among equals, skipping any at `limit` or past the
/// bounded-load capacity. `None` when every candidate is at `limit`.
pub fn pick(cands: &[Candidate], first: u64, limit: u32) -> Option<(usize, Outcome)> {
    let total: u64 = cands.iter().map(|c| u64::from(c.in_flight)).sum();
    // With this request counted: ceil((1 + e) * (total + 1) / n). The least loaded
    // replica is always under it, so the bound alone never holds a request.
    let bound = ((1.0 + BALANCE) * (total + 1) as f64 / cands.len().max(1) as f64).ceil();
    let best = cands.iter().map(|c| c.held).max()?;
    let (at, c) = cands
        .iter()
        .enumerate()
        .filter(|(_, c)| c.in_flight < limit && f64::from(c.in_flight) < bound)
        .max_by_key(|(_, c)| (c.held, weight(first, c.id)))?;
    let outcome = if best == 0 {
        Outcome::Miss
    } else if c.held == best {
        Outcome::Hit
    } else {
        Outcome::Overflow
    };
    Some((at, outcome))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A hash chain over one text's chunks.
    fn keys_of(text: &[u8]) -> Vec<u64> {
        let mut keys = Vec::new();
        chain(text, 0, &mut keys);
        keys
    }

    fn idle(ids: &[u32]) -> Vec<Candidate> {
        ids.iter()
            .map(|&id| Candidate {
                id,
                in_flight: 0,
                held: 0,
            })
            .collect()
    }

    #[test]
    fn a_key_names_the_whole_prefix_before_it_and_a_later_turn_extends_the_chain() {
        let a = keys_of(&[b'a'; 3 * CHUNK]);
        let mut b_text = vec![b'b'; CHUNK];
        b_text.extend_from_slice(&[b'a'; 2 * CHUNK]);
        let b = keys_of(&b_text);
        // Same second and third chunks, different first: different keys throughout.
        assert_eq!(a.len(), 3);
        assert!(a.iter().all(|k| !b.contains(k)));
        let turn = |n: usize| {
            let messages: Vec<serde_json::Value> = (0..n)
                .map(|i| serde_json::json!({"role": "user", "content": format!("turn {i} {}", "x".repeat(300))}))
                .collect();
            let body = serde_json::json!({"model": "p", "messages": messages}).to_string();
            keys(&Job::chat(&body.into()).unwrap())
        };
        let (one, two, three) = (turn(1), turn(2), turn(3));
        // Every key of a turn, its short last chunk included, is a key of the next.
        assert_eq!((one.len(), two.len(), three.len()), (2, 4, 6));
        assert_eq!(two[..2], one[..]);
        assert_eq!(three[..4], two[..]);
        // A first message shorter than a chunk is a key of its own too.
        let short = |n: usize| {
            let messages: Vec<serde_json::Value> = (0..n)
                .map(|i| serde_json::json!({"role": "user", "content": format!("hi {i}")}))
                .collect();
            let body = serde_json::json!({"model": "p", "messages": messages}).to_string();
            keys(&Job::chat(&body.into()).unwrap())
        };
        assert_eq!(short(2)[..1], short(1)[..]);
    }

    #[test]
    fn the_longest_held_prefix_wins_and_the_oldest_keys_are_forgotten() {
        let k = keys_of(&[b'q'; 5 * CHUNK]);
        let mut short = Served::default();
        short.remember(&k[..2], REMEMBERED);
        let mut long = Served::default();
        long.remember(&k[..4], REMEMBERED);
        assert_eq!((short.held(&k), long.held(&k)), (2, 4));
        let mut cands = idle(&[1, 2, 3]);
        cands[0].held = short.held(&k);
        cands[2].held = long.held(&k);
        assert_eq!(pick(&cands, k[0], 16), Some((2, Outcome::Hit)));
        // Bounded: the tail goes first, the head stays.
        let mut s = Served::default();
        s.remember(&k, 3);
        assert_eq!(s.remembered(), 3);
        assert_eq!(s.held(&k[..3]), 3);
        assert_eq!(s.held(&k), 3);
    }

    #[test]
    fn a_replica_at_max_in_flight_or_past_the_load_bound_is_skipped_for_the_next_best() {
        let k = keys_of(&[b'z'; 4 * CHUNK])[0];
        let c = |id, in_flight, held| Candidate {
            id,
            in_flight,
            held,
        };
        // Loads 4, 2, 0: the mean with this request is 7/3, the bound ceil(2.92) = 3.
        let cands = [c(1, 4, 3), c(2, 2, 2), c(3, 0, 0)];
        assert_eq!(pick(&cands, k, 16), Some((1, Outcome::Overflow)));
        // Within the bound, the longest prefix wins however loaded.
        let cands = [c(1, 2, 3), c(2, 2, 2), c(3, 2, 0)];
        assert_eq!(pick(&cands, k, 16), Some((0, Outcome::Hit)));
        // At the hard limit: skipped, then nothing.
        assert_eq!(pick(&cands, k, 2), None);
        let cands = [c(1, 2, 3), c(2, 1, 0), c(3, 1, 0)];
        assert_eq!(pick(&cands, k, 2).map(|p| p.1), Some(Outcome::Overflow));
        // No replica is ever picked past the bound, over many loads.
        for loads in [[0, 0, 9], [5, 5, 5], [1, 7, 3], [0, 1, 2]] {
            let cands: Vec<_> = (0..3).map(|i| c(i as u32 + 1, loads[i], 3 - i)).collect();
            let (at, _) = pick(&cands, k, 100).unwrap();
            let mean = (loads.iter().sum::<u32>() + 1) as f64 / 3.0;
            assert!(
                f64::from(loads[at]) < ((1.0 + BALANCE) * mean).ceil(),
                "{loads:?} -> {at}"
            );
        }
    }

    #[test]
    fn a_replica_that_joins_or_leaves_moves_only_its_share_of_new_prefixes() {
        let firsts: Vec<u64> = (0..1000)
            .map(|i| keys_of(format!("conversation {i}: system prompt").as_bytes())[0])
            .collect();
        let place = |ids: &[u32]| -> Vec<u32> {
            let cands = idle(ids);
            firsts
                .iter()
                .map(|&f| {
                    let (at, outcome) = pick(&cands, f, 16).unwrap();
                    assert_eq!(outcome, Outcome::Miss);
                    cands[at].id
                })
                .collect()
        };
        let three = place(&[1, 2, 3]);
        let four = place(&[1, 2, 3, 4]);
        let moved: Vec<_> = (0..1000).filter(|&i| three[i] != four[i]).collect();
        // Every prefix that moved went to the new replica, and about a quarter moved.
        assert!(moved.iter().all(|&i| four[i] == 4));
        println!("3 -> 4 replicas: {} of 1000 prefixes moved", moved.len());
        assert!((200..=300).contains(&moved.len()), "{} moved", moved.len());
        // Spread evenly over three.
        for id in 1..=3 {
            let n = three.iter().filter(|&&r| r == id).count();
            assert!((280..=390).contains(&n), "replica {id}: {n}");
        }
        // Replica 2 leaves: only its prefixes move.
        let two_gone = place(&[1, 3]);
        for i in 0..1000 {
            if three[i] != 2 {
                assert_eq!(two_gone[i], three[i]);
            }
        }
    }
}
