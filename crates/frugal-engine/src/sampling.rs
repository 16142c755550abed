//! Choosing the next token: greedy, temperature, top-k, top-p, seeded, with logprobs.
//!
//! Logprobs are those of the model's own distribution (log-softmax of the raw logits),
//! whatever the sampling settings: they are a confidence signal (the cascade router reads
//! them), not a record of how the token was drawn.

/// Settings of one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 keeps every token.
    pub top_p: f32,
    /// 0 keeps every token.
    pub top_k: usize,
    /// The same seed and prompt give the same tokens.
    pub seed: Option<u64>,
    /// Alternatives to report per token with their logprobs.
    pub top_logprobs: usize,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            top_logprobs: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
    /// The most likely tokens with their logprobs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// SplitMix64: tiny, fast, and reproducible across platforms, which is all a sampler's
/// seed needs.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let seed = params.seed.unwrap_or_else(|| {
            // Unseeded requests still differ from each other: take the clock's nanoseconds.
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0x5EED, |d| d.as_nanos() as u64)
        });
        Sampler {
            params,
            rng: Rng(seed),
        }
    }

    pub fn sample(&mut self, logits: &[f32]) -> Sampled {
        let p = self.params;
        let (max_i, max) =
            logits
                .iter()
                .copied()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (i, v)| {
                    if v > best.1 { (i, v) } else { best }
                });
        let log_z = max + logits.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
        let logprob = |i: usize| logits[i] - log_z;
        let token = if p.temperature <= 0.0 || p.top_k == 1 {
            max_i
        } else {
            self.draw(logits, max)
        };
        let top = if p.top_logprobs > 0 {
            top_n(logits, p.top_logprobs)
                .into_iter()
                .map(|i| (i as u32, logprob(i)))
                .collect()
        } else {
            Vec::new()
        };
        Sampled {
            token: token as u32,
            logprob: logprob(token),
            top,
        }
    }

    fn draw(&mut self, logits: &[f32], max: f32) -> usize {
        let p = self.params;
        let t = p.temperature;
        let mut probs: Vec<(f32, usize)> = logits
            .iter()
            .enumerate()
            .map(|(i, v)| (((v - max) / t).exp(), i))
            .collect();
        let sum: f32 = probs.iter().map(|(p, _)| p).sum();
        probs.iter_mut().for_each(|(v, _)| *v /= sum);
        if p.top_p < 1.0 {
            // Tokens below (1 - top_p) / vocab together hold less than 1 - top_p, so the
            // nucleus lies among the rest: drop them before sorting 50k entries.
            let floor = (1.0 - p.top_p) / probs.len() as f32;
            probs.retain(|(v, _)| *v >= floor);
        }
        probs.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        if p.top_k > 0 {
            probs.truncate(p.top_k);
        }
        if p.top_p < 1.0 {
            let mut mass = 0.0;
            let keep = probs
                .iter()
                .position(|(v, _)| {
                    mass += v;
                    mass >= p.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        let total: f32 = probs.iter().map(|(v, _)| v).sum();
        let mut target = self.rng.next_f64() as f32 * total;
        for &(v, i) in &probs {
            target -= v;
            if target <= 0.0 {
                return i;
            }
        }
        probs.last().map_or(0, |&(_, i)| i)
    }
}

/// Indices of the `n` largest values, largest first.
fn top_n(values: &[f32], n: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    let n = n.min(idx.len());
    if n == 0 {
        return Vec::new();
    }
    idx.select_nth_unstable_by(n - 1, |&a, &b| values[b].total_cmp(&values[a]));
    idx.truncate(n);
    idx.sort_unstable_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, -1.0, 0.5]
    }

    #[test]
    fn greedy_takes_the_largest_and_reports_its_logprob() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            top_logprobs: 2,
            ..SamplingParams::default()
        });
        let out = s.sample(&logits());
        assert_eq!(out.token, 1);
        let z: f32 = logits().iter().map(|v| v.exp()).sum();
        assert!((out.logprob - (3.0f32.exp() / z).ln()).abs() < 1e-5);
        assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn the_same_seed_gives_the_same_tokens() {
        let params = SamplingParams {
            temperature: 1.5,
            seed: Some(42),
            ..SamplingParams::default()
        };
        let run = || {
            let mut s = Sampler::new(params);
            (0..50)
                .map(|_| s.sample(&logits()).token)
                .collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        assert!(a.iter().any(|&t| t != 1), "a hot temperature explores");
    }

    #[test]
    fn top_k_and_top_p_bound_the_choices() {
        let mut k2 = Sampler::new(SamplingParams {
            top_k: 2,
            seed: Some(1),
            ..SamplingParams::default()
        });
        assert!((0..200).all(|_| [1, 2].contains(&k2.sample(&logits()).token)));
        // Probabilities ~ [0.09, 0.63, 0.23, 0.01, 0.05]: a nucleus of 0.6 is token 1 alone.
        let mut p = Sampler::new(SamplingParams {
            top_p: 0.6,
            seed: Some(1),
            ..SamplingParams::default()
        });
        assert!((0..200).all(|_| p.sample(&logits()).token == 1));
    }

    #[test]
    fn draws_follow_the_distribution() {
        let mut s = Sampler::new(SamplingParams {
            seed: Some(7),
            ..SamplingParams::default()
        });
        let mut counts = [0usize; 5];
        for _ in 0..20_000 {
            counts[s.sample(&logits()).token as usize] += 1;
        }
        let z: f32 = logits().iter().map(|v| v.exp()).sum();
        for (i, &c) in counts.iter().enumerate() {
            let want = logits()[i].exp() / z;
            let got = c as f32 / 20_000.0;
            assert!((got - want).abs() < 0.02, "token {i}: {got} vs {want}");
        }
    }
}
