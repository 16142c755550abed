//! frugal-semantic: the semantic cache's parts, without HTTP.
//!
//! `embed` turns a prompt into an all-MiniLM-L6-v2 sentence embedding, `index` finds the
//! nearest cached prompts (by a flat scan, `flat`, or a graph, `hnsw`), `guard` decides
//! whether a near neighbour really asks the same thing (the known failure of semantic caches:
//! near-identical text with another meaning), `lexicon` tells from WordNet how two words
//! relate (antonyms, synonyms, siblings, ...), `verify` reads a candidate and the question
//! together (a small cross-encoder) for the probability that one answer serves both,
//! `budget` turns those probabilities into hits within the user's bound on wrong ones, `eval`
//! measures the cache on labelled pairs and chooses the guard's thresholds, and `agree`
//! judges whether two answers agree (a shadow's quality sample, online and offline).

/// The embedder's folder, relative to the repository root; `scripts/fetch-models.sh` fetches it.
pub const DEFAULT_EMBEDDER: &str = "models/minilm";

/// Data files compiled in, by their path in the repository, so that the defaults that name
/// them work from any folder (the binary installs them into its data folder when the path
/// is not there): the pairs `frugal eval-cache` and `frugal eval embedder` measure on.
pub const BUNDLED: &[(&str, &[u8])] = &[
    (
        "data/semantic-cache/similiar_qqp_full.json.gz",
        include_bytes!("../../../data/semantic-cache/similiar_qqp_full.json.gz"),
    ),
    (
        NEAR_MISS[0],
        include_bytes!("../../../data/semantic-cache/nearmiss.json"),
    ),
    (
        NEAR_MISS[1],
        include_bytes!("../../../data/semantic-cache/reworded-paraphrases.json"),
    ),
    (
        NEAR_MISS[2],
        include_bytes!("../../../data/semantic-cache/reworded-nearmiss.json"),
    ),
    (
        verify::DEFAULT_VERIFIER,
        include_bytes!("../../../data/semantic-cache/verifier.safetensors"),
    ),
];

/// The near misses and paraphrases written by hand that `frugal eval-cache` reads when none
/// is named.
pub const NEAR_MISS: [&str; 3] = [
    "data/semantic-cache/nearmiss.json",
    "data/semantic-cache/reworded-paraphrases.json",
    "data/semantic-cache/reworded-nearmiss.json",
];

pub mod agree;
mod bert;
pub mod budget;
pub mod embed;
pub mod eval;
mod flat;
pub mod guard;
pub mod hnsw;
pub mod index;
pub mod lexicon;
#[doc(hidden)]
pub mod synthetic;
pub mod verify;

pub use embed::{EmbedError, Embedder, Encoding};
pub use guard::{Guard, Verdict, Veto};
pub use index::{FlatIndex, VectorIndex};
pub use verify::Verifier;
