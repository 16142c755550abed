//! Whether two answers to one question agree: the rule a shadow's quality sample is judged
//! by online (`frugal serve`) and offline (`frugal eval-route`), so that the two figures
//! measure the same thing.

use frugal_cost::{Agreement, Verdict};

use crate::embed::{Embedder, cosine};

/// The least cosine of the two answers' embeddings that counts as agreement, when the
/// embedder is loaded: a proxy for "the same answer", stated beside each sample's method.
pub const EMBEDDING_AGREES: f32 = 0.9;

/// The verdict on two answers: exactly the same once [`normalised`]; else, with an
/// embedder, whether their embeddings' cosine reaches [`EMBEDDING_AGREES`]. Embedding takes
/// CPU: async callers run this off their executor's threads.
pub fn agree(embedder: Option<&Embedder>, served: &str, reference: &str) -> Verdict {
    let exact = Verdict {
        agreed: normalised(served) == normalised(reference),
        method: Agreement::Exact,
    };
    let Some(embedder) = embedder.filter(|_| !exact.agreed) else {
        return exact;
    };
    let close = || -> Option<f32> {
        Some(cosine(
            &embedder.embed(served).ok()?,
            &embedder.embed(reference).ok()?,
        ))
    };
    match close() {
        Some(c) => Verdict {
            agreed: c >= EMBEDDING_AGREES,
            method: Agreement::Embedding,
        },
        None => exact,
    }
}

/// Text as compared exactly: lower case, punctuation dropped, whitespace runs as one space.
pub fn normalised(text: &str) -> String {
    let kept: String = text
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .flat_map(char::to_lowercase)
        .collect();
    kept.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn answers_are_compared_without_case_whitespace_or_punctuation() {
        assert_eq!(normalised("  The answer is: 42!\n"), "the answer is 42");
        assert_eq!(normalised("Paris."), normalised("paris"));
        assert_ne!(normalised("Paris"), normalised("Rome"));
    }

    #[test]
    fn exact_agreement_needs_no_embedder_and_a_difference_without_one_disagrees() {
        let same = agree(None, "Paris.", "paris");
        assert_eq!((same.agreed, same.method), (true, Agreement::Exact));
        let other = agree(None, "Paris", "Rome");
        assert_eq!((other.agreed, other.method), (false, Agreement::Exact));
    }

    /// With the embedder, answers that differ in words are judged by their cosine.
    #[test]
    fn different_words_are_judged_by_their_embeddings_cosine() {
        let e = crate::embed::tests::embedder();
        let (a, b) = (
            "The capital of France is Paris.",
            "Paris is France's capital city.",
        );
        let c = cosine(&e.embed(a).unwrap(), &e.embed(b).unwrap());
        let close = agree(Some(e), a, b);
        assert_eq!(
            (close.agreed, close.method),
            (c >= EMBEDDING_AGREES, Agreement::Embedding)
        );
        let far = agree(Some(e), a, "Bake the bread for an hour.");
        assert_eq!((far.agreed, far.method), (false, Agreement::Embedding));
        let same = agree(Some(e), "Paris!", "paris");
        assert_eq!((same.agreed, same.method), (true, Agreement::Exact));
    }
}
