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

use frugal_cost::{Lever, Verdict};
use frugal_semantic::Embedder;
use frugal_semantic::agree::agree;

use crate::cache::exact::question_text;
use crate::cascade::route::SkipExample;
use crate::meter::Sample;
use crate::request::pipeline::{self, Ask, Body};
use crate::request::state::AppState;

pub mod draw;

pub use draw::{Drawn, Served};

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
    // The local embedder (the semantic cache's, else loaded on first use, as for
    // /v1/embeddings); without one, the answers are compared exactly, as each sample says.
    let embedder = match &state.inner.embedder {
        Some(local) => local.embedder().await.ok(),
        None => None,
    };
    let verdict = compare(embedder, served.text, reference).await;
    let of = served.of;
    if let Some(examples) = &state.inner.shadows.examples
        && of.lever == Lever::Routing
        && let Some(prompt) = question_text(&job.body)
    {
        examples.append(&SkipExample {
            prompt,
            ok: verdict.agreed,
        });
    }
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

/// The verdict on two answers ([`agree`]): the exact comparison here, the embedding (when
/// the texts differ) off the async threads, the exact verdict kept if that fails.
async fn compare(embedder: Option<Arc<Embedder>>, served: String, reference: String) -> Verdict {
    let exact = agree(None, &served, &reference);
    if exact.agreed || embedder.is_none() {
        return exact;
    }
    tokio::task::spawn_blocking(move || agree(embedder.as_deref(), &served, &reference))
        .await
        .unwrap_or(exact)
}
