//! Shadows: a sampled share (`shadow_rate`) of the answers a cheap lever served (a
//! cascade's cheap tier accepted, a semantic hit) is asked again of the reference path (the
//! route's last tier, the model without its caches) in the background, and the two answers
//! compared: a quality sample in the ledger beside the lever's saving. The client's answer
//! never waits for its shadow; at most [`draw::IN_FLIGHT`] run at once, and one drawn beyond that
//! is dropped and counted. The shadow's call is billed through its own `Bill`, so it
//! reaches the ledger once on every exit, as no request of a user's and no saving.

use std::sync::Arc;
use std::time::SystemTime;

use axum::http::{HeaderMap, HeaderValue, header};

use frugal_cost::{Agreement, Verdict};
use frugal_semantic::Embedder;

use crate::meter::Sample;
use crate::request::pipeline::{self, Ask, Body};
use crate::request::state::AppState;

pub mod draw;

pub use draw::{Drawn, Served};

/// The least cosine of the two answers' embeddings that counts as agreement, when the
/// embedder is loaded: a proxy for "the same answer", stated beside each sample's method.
pub const EMBEDDING_AGREES: f32 = 0.9;

impl AppState {
    /// Shadows the answer `served` describes with chance `rate`, in the background;
    /// `served` is built only when drawn.
    pub(crate) fn shadow(&self, rate: f64, served: impl FnOnce() -> Option<Served>) {
        spawn(
            self,
            self.inner.shadows.pick(rate, &self.inner.metrics, served),
        );
    }
}

/// Runs a drawn shadow in the background, holding its slot until it is done (a semantic
/// hit's: the one `pipeline::start` drew, started by its caller).
pub fn spawn(state: &AppState, drawn: Option<Drawn>) {
    let Some(Drawn { served, slot }) = drawn else {
        return;
    };
    let state = state.clone();
    tokio::spawn(async move {
        run(&state, served).await;
        drop(slot);
    });
}

/// Asks the reference path, compares and records the sample.
async fn run(state: &AppState, served: Served) {
    let mut job = (*served.job).clone();
    job.common.model = Some(served.reference.name().to_owned());
    job.common.stream = false;
    job.body["model"] = serde_json::Value::String(served.reference.name().to_owned());
    job.body["stream"] = serde_json::Value::Bool(false);
    job.shadow = true;
    let job = Arc::new(job);
    // Neither read nor kept by the caches: a reference answer, freshly made.
    let mut headers = HeaderMap::new();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let ask = Ask {
        tenant: None,
        headers: &headers,
        policy: None,
        shadow_rate: None,
        shadow: Some(served.of.clone()),
    };
    let finished = match pipeline::start(state, served.reference.clone(), &job, &ask).await {
        Ok(started) => pipeline::finish(started).await,
        Err(e) => Err(e),
    };
    let finished = match finished {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!(model = %served.of.model, error = %e, "a shadow's call failed; billed, no sample");
            return;
        }
    };
    let Some(reference) = answer_text(&finished.body, job.kind) else {
        return;
    };
    let embedder = state.inner.semantic.as_ref().map(|s| s.embedder().clone());
    let verdict = compare(embedder, served.text, reference).await;
    let of = served.of;
    state
        .inner
        .metrics
        .count_shadow(of.lever, &of.model, verdict.agreed);
    if let Some(meter) = &state.inner.meter {
        meter.record_sample(Sample {
            started: SystemTime::now(),
            of,
            verdict,
        });
    }
}

/// A finished answer's text, where it is one plain text.
fn answer_text(body: &Body, kind: crate::http::validate::Kind) -> Option<String> {
    match body {
        Body::Text { text, .. } => Some(text.clone()),
        Body::Raw(v) => pipeline::plain_answer(v, kind).map(|(text, _)| text),
    }
}

/// The verdict on two answers: exactly the same once normalised; else, with an embedder,
/// whether their embeddings' cosine reaches [`EMBEDDING_AGREES`].
async fn compare(embedder: Option<Arc<Embedder>>, served: String, reference: String) -> Verdict {
    let exact = Verdict {
        agreed: normalised(&served) == normalised(&reference),
        method: Agreement::Exact,
    };
    let Some(embedder) = embedder.filter(|_| !exact.agreed) else {
        return exact;
    };
    // The embedding takes CPU: off the async threads.
    let cosine = tokio::task::spawn_blocking(move || {
        let a = embedder.embed(&served).ok()?;
        let b = embedder.embed(&reference).ok()?;
        Some(frugal_semantic::embed::cosine(&a, &b))
    })
    .await
    .ok()
    .flatten();
    match cosine {
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
    use super::*;

    #[test]
    fn answers_are_compared_without_case_whitespace_or_punctuation() {
        assert_eq!(normalised("  The answer is: 42!\n"), "the answer is 42");
        assert_eq!(normalised("Paris."), normalised("paris"));
        assert_ne!(normalised("Paris"), normalised("Rome"));
    }

    #[tokio::test]
    async fn exact_agreement_needs_no_embedder_and_a_difference_without_one_disagrees() {
        let same = compare(None, "Paris.".into(), "paris".into()).await;
        assert_eq!((same.agreed, same.method), (true, Agreement::Exact));
        let other = compare(None, "Paris".into(), "Rome".into()).await;
        assert_eq!((other.agreed, other.method), (false, Agreement::Exact));
    }

    /// With the embedder, answers that differ in words are judged by their cosine.
    #[tokio::test]
    async fn different_words_are_judged_by_their_embeddings_cosine() {
        let e = crate::cache::semantic::tests::embedder();
        let (a, b) = (
            "The capital of France is Paris.",
            "Paris is France's capital city.",
        );
        let cosine = frugal_semantic::embed::cosine(&e.embed(a).unwrap(), &e.embed(b).unwrap());
        let close = compare(Some(e.clone()), a.into(), b.into()).await;
        assert_eq!(
            (close.agreed, close.method),
            (cosine >= EMBEDDING_AGREES, Agreement::Embedding)
        );
        let far = compare(
            Some(e.clone()),
            a.into(),
            "Bake the bread for an hour.".into(),
        )
        .await;
        assert_eq!((far.agreed, far.method), (false, Agreement::Embedding));
        let same = compare(Some(e), "Paris!".into(), "paris".into()).await;
        assert_eq!((same.agreed, same.method), (true, Agreement::Exact));
    }
}
