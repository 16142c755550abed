//! The corpus, its batches and the random numbers behind them.
//!
//! Batches are stateless: the batch of step `s` comes from an RNG seeded from `(seed, s)`
//! alone, so a resumed run draws exactly the batches an uninterrupted one would, and a
//! checkpoint needs no data position or RNG state beyond the step number.

use std::path::Path;

use anyhow::{Context, Result, ensure};

use crate::hash::fnv1a64;
use crate::hparams::HParams;

/// Held-out positions in the fixed evaluation set.
const EVAL_POSITIONS: usize = 2048;
/// Stream ids keep the init, batch and eval RNGs apart for the same seed.
const BATCH_STREAM: u64 = 0xba7c;
const EVAL_STREAM: u64 = 0xe7a1;

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and good enough for sampling.
pub struct SplitMix64(u64);

/// SplitMix64's output function, a bijective 64-bit mixer.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl SplitMix64 {
    /// An RNG for `(seed, stream)`. Both are mixed, so neighbouring seeds or streams do not
    /// give overlapping sequences.
    pub fn stream(seed: u64, stream: u64) -> Self {
        Self(mix64(mix64(seed) ^ stream))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// Uniform in [0, 1), from the top 24 bits (exactly representable in f32).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u32 << 24) as f32
    }

    /// Uniform in [0, n) by multiply-high (Lemire); the bias is below 2^-40 for our n.
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// The data file as vocabulary indices, split 90/10 into train and held out.
pub struct Corpus {
    /// Sorted distinct bytes of the file: index → byte.
    pub vocab: Vec<u8>,
    pub train: Vec<u8>,
    pub held: Vec<u8>,
    /// FNV-1a 64 of the raw file.
    pub hash: u64,
}

impl Corpus {
    pub fn load(path: &Path, context: usize) -> Result<Self> {
        let bytes =
            std::fs::read(path).with_context(|| format!("reading data {}", path.display()))?;
        Self::from_bytes(&bytes, context).with_context(|| format!("data {}", path.display()))
    }

    pub fn from_bytes(bytes: &[u8], context: usize) -> Result<Self> {
        let mut seen = [false; 256];
        for &b in bytes {
            seen[usize::from(b)] = true;
        }
        let vocab: Vec<u8> = (0..=255u8).filter(|&b| seen[usize::from(b)]).collect();
        let mut index = [0u8; 256];
        for (i, &b) in vocab.iter().enumerate() {
            // At most 256 distinct bytes, so every index fits in a u8.
            index[usize::from(b)] = i as u8;
        }
        let tokens: Vec<u8> = bytes.iter().map(|&b| index[usize::from(b)]).collect();
        let split = tokens.len() * 9 / 10;
        let (train, held) = tokens.split_at(split);
        ensure!(
            held.len() > context,
            "{} bytes is too little text for a context of {context}",
            bytes.len()
        );
        Ok(Self {
            vocab,
            train: train.to_vec(),
            held: held.to_vec(),
            hash: fnv1a64(bytes),
        })
    }
}

/// Samples as `context` input indices each (`xs`, concatenated) and one target each (`ys`).
pub struct Batch {
    pub context: usize,
    pub xs: Vec<u8>,
    pub ys: Vec<u8>,
}

impl Batch {
    /// `n` samples at random positions of `tokens`.
    fn draw(tokens: &[u8], context: usize, n: usize, rng: &mut SplitMix64) -> Self {
        let mut b = Self {
            context,
            xs: Vec::with_capacity(n * context),
            ys: Vec::with_capacity(n),
        };
        for _ in 0..n {
            let p = rng.below(tokens.len() - context);
            b.xs.extend_from_slice(&tokens[p..p + context]);
            b.ys.push(tokens[p + context]);
        }
        b
    }

    pub fn len(&self) -> usize {
        self.ys.len()
    }

    pub fn sample(&self, i: usize) -> (&[u8], usize) {
        (
            &self.xs[i * self.context..][..self.context],
            usize::from(self.ys[i]),
        )
    }
}

/// The training batch of step `step` (0-based: the step about to be taken).
pub fn train_batch(corpus: &Corpus, hp: &HParams, step: u64) -> Batch {
    let mut rng = SplitMix64::stream(hp.seed, BATCH_STREAM ^ mix64(step));
    Batch::draw(&corpus.train, hp.context, hp.batch, &mut rng)
}

/// The fixed held-out evaluation set: the same positions for every run and seed.
pub fn eval_batch(corpus: &Corpus, context: usize) -> Batch {
    let mut rng = SplitMix64::stream(0, EVAL_STREAM);
    Batch::draw(&corpus.held, context, EVAL_POSITIONS, &mut rng)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_split_and_batches() {
        let c = Corpus::from_bytes(b"abcabcabcabcabcabcabcabcabcabcXYZ", 2).unwrap();
        assert_eq!(c.vocab, b"XYZabc");
        assert_eq!(c.train.len() + c.held.len(), 33);
        assert_eq!(c.train.len(), 29);
        let hp = HParams {
            vocab: 6,
            context: 2,
            embed: 1,
            hidden: 1,
            batch: 5,
            seed: 1,
            lr: 0.0,
            data_hash: c.hash,
        };
        let (a, b) = (train_batch(&c, &hp, 3), train_batch(&c, &hp, 3));
        assert_eq!((&a.xs, &a.ys), (&b.xs, &b.ys), "a step's batch is fixed");
        assert_ne!(a.xs, train_batch(&c, &hp, 4).xs);
        // Every sample is a real window of the training text.
        for i in 0..a.len() {
            let (x, y) = a.sample(i);
            let w = [x[0], x[1], y as u8];
            assert!(c.train.windows(3).any(|t| t == w));
        }
        assert!(Corpus::from_bytes(b"ab", 2).is_err());
    }
}
