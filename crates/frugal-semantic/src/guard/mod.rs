//! Whether a near neighbour asks the same question.
//!
//! Cosine similarity alone cannot tell "How do I convert dollars to rupees?" from "How do I
//! convert rupees to dollars?" (0.986 with MiniLM), nor "the cheapest flight to Rome" from
//! "the most expensive flight to Rome". So above the similarity threshold the guard reads
//! *what differs*: it aligns the two questions' words and vetoes the pair when
//!
//! - numbers, units, dates or code identifiers differ ("five" = "5", "%" = "percent");
//! - a negation, or a modal of another force (must / may / should), is on one side only;
//! - a quantity or degree word differs ("some" / "all", "slightly" / "severely");
//! - a content word is replaced by one that is not a synonym or a derived form of it:
//!   WordNet names the relation (an antonym, a sibling of one category), a word WordNet does
//!   not know is a name; for a replacement WordNet calls unrelated, broader or narrower,
//!   the embedder itself compares the two spans ("pick" / "choose" are close, "temperature"
//!   / "melting point" are not), and a low similarity vetoes it;
//! - the same content words stand in another order around a relation ("A depends on B" /
//!   "B depends on A", "from A to B" / "from B to A", "A beats B" / "B beats A").
//!
//! What remains is served above the threshold. A pair whose content words all align (the
//! same, synonyms or derived forms; only function words, contractions, politeness or the
//! order of the frame differ) is less often another question at the same similarity, so it
//! has a threshold of its own (`aligned_threshold`); both are chosen on the tuning halves by
//! `frugal eval-cache`.

mod compare;
mod veto;
mod words;

pub use compare::Explain;
pub use veto::Veto;

use crate::embed::Embedder;
use crate::lexicon::Lexicon;

/// The default similarity thresholds: chosen together on a 0.0025 grid as the pair that
/// serves most QQP tuning duplicates with at most 1% wrong hits there, and on the near-miss
/// set's tuning half at most 1% overall and 3% of any kind (`frugal eval-cache`; the
/// held-out halves' figures are in BENCHMARKS.md).
pub const DEFAULT_THRESHOLD: f32 = 0.9525;
pub const DEFAULT_ALIGNED_THRESHOLD: f32 = 0.9475;

/// The semantic cache's acceptance rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Guard {
    /// Serve a cached answer only at or above this cosine similarity.
    pub threshold: f32,
    /// The threshold for a pair whose content words all align.
    pub aligned_threshold: f32,
    /// Apply the vetoes (off only to measure the plain-cosine baseline).
    pub vetoes: bool,
}

impl Default for Guard {
    fn default() -> Guard {
        Guard {
            threshold: DEFAULT_THRESHOLD,
            aligned_threshold: DEFAULT_ALIGNED_THRESHOLD,
            vetoes: true,
        }
    }
}

/// What the guard decided about one pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The same question: serve the cached answer.
    Same,
    /// Below the similarity threshold.
    TooFar,
    /// Similar enough, but vetoed.
    Veto(Veto),
}

impl Guard {
    /// The verdict on serving `cached`'s answer for `query` at this `cosine`. With an
    /// embedder, replaced spans WordNet cannot relate are compared by meaning; without one
    /// they are vetoed.
    pub fn judge(
        &self,
        query: &str,
        cached: &str,
        cosine: f32,
        embedder: Option<&Embedder>,
    ) -> Verdict {
        if !self.vetoes {
            return if cosine >= self.threshold {
                Verdict::Same
            } else {
                Verdict::TooFar
            };
        }
        if cosine < self.threshold.min(self.aligned_threshold) {
            return Verdict::TooFar;
        }
        let x = explain(query, cached, embedder);
        match x.veto {
            Some(v) => Verdict::Veto(v),
            None if cosine >= self.threshold_for(x.aligned()) => Verdict::Same,
            None => Verdict::TooFar,
        }
    }

    /// This guard with its threshold at `t`, the aligned pairs' threshold as far below it
    /// as it was (a route's or a config's own threshold moves both).
    pub fn at(self, t: f32) -> Guard {
        Guard {
            threshold: t,
            aligned_threshold: (t - (self.threshold - self.aligned_threshold)).max(0.0),
            ..self
        }
    }

    /// The threshold for a pair the vetoes let through.
    pub fn threshold_for(&self, aligned: bool) -> f32 {
        if aligned && self.vetoes {
            self.aligned_threshold
        } else {
            self.threshold
        }
    }
}

/// The first veto that applies to this pair, whatever its similarity.
pub fn veto(a: &str, b: &str, embedder: Option<&Embedder>) -> Option<Veto> {
    explain(a, b, embedder).veto
}

/// What the guard reads in this pair: the veto, the replaced words, the spans' similarity.
pub fn explain(a: &str, b: &str, embedder: Option<&Embedder>) -> Explain {
    compare::explain(a, b, Lexicon::get(), embedder)
}

#[cfg(test)]
mod tests;
