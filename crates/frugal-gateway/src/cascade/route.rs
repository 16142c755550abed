//! Cascade routing: answer with the cheapest model whose answer is confident enough.
//!
//! A route lists models from cheapest to dearest. Each tier's answer is accepted when its
//! confidence clears the route's threshold, else the request goes to the next tier; the last
//! tier's answer is always accepted. Confidence is a low quantile of the answer's per-token
//! logprobs: one unsure token (a wrong digit, a wrong name) is what marks a wrong short
//! answer, and a quantile does not drift with answer length as the sequence mean does.
//!
//! A route may also skip its cheap tiers for requests like those they answered badly: a
//! [`SkipRule`] asks the nearest labelled prompts (by embedding) how often the cheap tier
//! got them right. Trying a tier that is sure to escalate pays for both.

use std::sync::Arc;

use frugal_semantic::{Embedder, FlatIndex};

use crate::cascade::learned::LinearRouter;
use serde::{Deserialize, Serialize};

/// A route: `name` is what clients put in `model`.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    /// Model names, cheapest first.
    pub tiers: Vec<String>,
    /// Which quantile of the token logprobs is the confidence (0: the least likely token).
    pub quantile: f64,
    /// Accept a tier's answer at or above this confidence (a logprob, <= 0).
    pub threshold: f32,
    /// Send requests like those the cheap tier failed straight to the last tier.
    pub skip: Option<Arc<Skip>>,
    /// The share of accepted cheap answers checked on the last tier; `None`: `[serve]`'s.
    pub shadow_rate: Option<f64>,
}

/// One labelled prompt of a skip rule's examples file (JSON lines, as `frugal eval-route
/// --skip-examples` writes them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkipExample {
    /// The request's final question.
    pub prompt: String,
    /// The cheap tier answered it right.
    pub ok: bool,
}

/// A skip rule with the embedder its examples were embedded with.
#[derive(Debug)]
pub struct Skip {
    pub rule: Rule,
    pub embedder: Arc<Embedder>,
}

/// How a route decides to skip its cheap tier before either runs.
#[derive(Debug)]
pub enum Rule {
    /// The nearest labelled prompts vote (`skip_examples`).
    Neighbours(SkipRule),
    /// A learned router's chance the cheap tier is right, below `below` (`router`).
    Learned { router: LinearRouter, below: f32 },
}

impl Skip {
    /// Embeds each example; an error names the example.
    pub fn new(
        embedder: Arc<Embedder>,
        examples: &[SkipExample],
        k: usize,
        below: f32,
    ) -> Result<Skip, frugal_semantic::EmbedError> {
        let vectors = examples
            .iter()
            .map(|e| Ok((embedder.embed(&e.prompt)?, e.ok)))
            .collect::<Result<Vec<_>, frugal_semantic::EmbedError>>()?;
        let rule = Rule::Neighbours(SkipRule::new(embedder.dim(), vectors, k, below));
        Ok(Skip { rule, embedder })
    }

    /// Whether `text` skips the cheap tier; a text that cannot be embedded does not.
    pub async fn skips(&self, text: &str) -> bool {
        crate::cache::semantic::embed_off_thread(&self.embedder, text, "route skip rule")
            .await
            .is_some_and(|v| match &self.rule {
                Rule::Neighbours(rule) => rule.skips(&v),
                Rule::Learned { router, below } => router.probability(&v, text.len()) < *below,
            })
    }
}

/// A k-nearest-neighbour vote over labelled prompts: did the cheap tier answer them right?
#[derive(Debug)]
pub struct SkipRule {
    index: FlatIndex,
    /// By example id: the cheap tier's answer was right.
    good: Vec<bool>,
    k: usize,
    /// Skip when fewer than this share of the neighbours were answered right.
    below: f32,
}

impl SkipRule {
    /// `examples`: embeddings (unit length, `dim` wide) and whether the cheap tier got each
    /// right.
    pub fn new(
        dim: usize,
        examples: impl IntoIterator<Item = (Vec<f32>, bool)>,
        k: usize,
        below: f32,
    ) -> SkipRule {
        let mut index = FlatIndex::new(dim);
        let mut good = Vec::new();
        for (v, ok) in examples {
            index.add(good.len() as u64, &v);
            good.push(ok);
        }
        SkipRule {
            index,
            good,
            k: k.max(1),
            below,
        }
    }

    pub fn len(&self) -> usize {
        self.good.len()
    }

    pub fn is_empty(&self) -> bool {
        self.good.is_empty()
    }

    /// Share of the `k` nearest examples the cheap tier answered right; 1 with no examples.
    pub fn share(&self, v: &[f32]) -> f32 {
        let near = self.index.search(v, self.k);
        if near.is_empty() {
            return 1.0;
        }
        let good = near
            .iter()
            .filter(|n| self.good.get(n.id as usize).copied().unwrap_or(true))
            .count();
        good as f32 / near.len() as f32
    }

    pub fn skips(&self, v: &[f32]) -> bool {
        self.share(v) < self.below
    }
}

/// The `quantile` (0..=1, nearest rank) of `logprobs`; an empty answer has confidence 0
/// (certain), as there is nothing to doubt.
pub fn confidence(logprobs: &[f32], quantile: f64) -> f32 {
    if logprobs.is_empty() {
        return 0.0;
    }
    let mut sorted = logprobs.to_vec();
    sorted.sort_by(f32::total_cmp);
    let q = quantile.clamp(0.0, 1.0);
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidence_is_a_quantile_of_the_token_logprobs() {
        let lp = [-0.01, -2.5, -0.2, -0.05, -0.9];
        assert_eq!(confidence(&lp, 0.0), -2.5);
        assert_eq!(confidence(&lp, 0.25), -0.9);
        assert_eq!(confidence(&lp, 0.5), -0.2);
        assert_eq!(confidence(&lp, 1.0), -0.01);
        assert_eq!(confidence(&lp, 7.0), -0.01, "clamped");
        assert_eq!(confidence(&[], 0.0), 0.0);
    }

    fn unit(v: [f32; 3]) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    #[test]
    fn the_nearest_examples_vote_on_skipping_the_cheap_tier() {
        // Two clusters: arithmetic the cheap tier fails, capitals it answers.
        let examples = [
            (unit([1.0, 0.1, 0.0]), false),
            (unit([1.0, 0.0, 0.1]), false),
            (unit([1.0, 0.1, 0.1]), true),
            (unit([0.0, 1.0, 0.1]), true),
            (unit([0.1, 1.0, 0.0]), true),
            (unit([0.0, 1.0, 0.0]), true),
        ];
        let rule = SkipRule::new(3, examples, 3, 0.5);
        assert_eq!(rule.len(), 6);
        let sum = unit([1.0, 0.05, 0.05]);
        assert!((rule.share(&sum) - 1.0 / 3.0).abs() < 1e-6);
        assert!(rule.skips(&sum));
        assert_eq!(rule.share(&unit([0.0, 1.0, 0.05])), 1.0);
        assert!(!rule.skips(&unit([0.0, 1.0, 0.05])));
        // At a lower bar, one right answer in three is enough to try the cheap tier.
        let lenient = SkipRule::new(3, [(unit([1.0, 0.0, 0.0]), false)], 3, 0.0);
        assert!(!lenient.skips(&sum));
        let empty = SkipRule::new(3, [], 3, 0.5);
        assert!(
            empty.is_empty() && !empty.skips(&sum),
            "no examples, no skipping"
        );
    }

    #[test]
    fn length_does_not_move_the_minimum_as_it_moves_the_mean() {
        // The same one doubtful token, in a short and a long answer of sure tokens.
        let short = [-0.01, -1.5];
        let long: Vec<f32> = std::iter::repeat_n(-0.01, 30).chain([-1.5]).collect();
        assert_eq!(confidence(&short, 0.0), confidence(&long, 0.0));
        let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean(&short) < 5.0 * mean(&long));
    }
}
