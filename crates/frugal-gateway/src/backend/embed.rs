//! The local embedding model behind `POST /v1/embeddings`: the semantic cache's
//! all-MiniLM-L6-v2, shared with the cache where it has loaded it, else loaded from its
//! folder on the first request (a server that is never asked for embeddings never pays for
//! loading it). It runs off the async threads on the machine that runs the local model, and
//! a request is priced by the machine time it took, as the engine's requests are.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use frugal_cost::Money;
use frugal_cost::money::HourlyRate;
use frugal_semantic::Embedder;

use crate::backend::upstream::{Pricing, Upstream};
use crate::backend::{Backend, Output, Plan, Priced, Work};
use crate::http::error::ApiError;
use crate::http::validate::Job;

/// The name clients ask for the local embedder by, and the ledger records.
pub const NAME: &str = "all-MiniLM-L6-v2";
/// Its name on Hugging Face, which reaches it too.
const HUB_NAME: &str = "sentence-transformers/all-MiniLM-L6-v2";

/// Where the embedder comes from.
pub enum Source {
    /// Loaded already (the semantic cache's).
    Loaded(Arc<Embedder>),
    /// Its folder, loaded on the first request.
    At(PathBuf),
}

pub struct LocalEmbedder {
    dir: Option<PathBuf>,
    embedder: tokio::sync::OnceCell<Arc<Embedder>>,
    /// The hourly price of the machine it runs on (the local model's).
    rate: HourlyRate,
    /// Recent cost per token in nano-dollars (a moving average), for the worst case of a
    /// request before it runs.
    per_token: AtomicI64,
}

/// Texts embedded: a vector each, the tokens read, and the machine time it took.
pub struct Embedded {
    pub vectors: Vec<Vec<f32>>,
    pub tokens: u64,
    pub took: Duration,
}

impl LocalEmbedder {
    pub fn new(source: Source, rate: HourlyRate) -> LocalEmbedder {
        let (dir, embedder) = match source {
            Source::Loaded(e) => (None, tokio::sync::OnceCell::new_with(Some(e))),
            Source::At(dir) => (Some(dir), tokio::sync::OnceCell::new()),
        };
        LocalEmbedder {
            dir,
            embedder,
            rate,
            per_token: AtomicI64::new(0),
        }
    }

    /// Whether a request naming `name` is for the local embedder.
    pub fn answers_to(name: &str) -> bool {
        name == NAME || name == HUB_NAME
    }

    /// The width of its vectors.
    pub const DIMENSIONS: usize = 384;

    /// The most `texts` can cost: each at most a token per byte (and [CLS], [SEP]), up to
    /// the embedder's limit, at twice the recent cost per token.
    pub fn worst_case(&self, texts: &[String]) -> Money {
        let tokens: usize = texts
            .iter()
            .map(|t| (t.len() + 2).min(frugal_semantic::embed::MAX_TOKENS))
            .sum();
        let per_token = self.per_token.load(Ordering::Relaxed).max(0);
        Money::from_nanos(per_token.saturating_mul(tokens as i64).saturating_mul(2))
    }

    /// The embedder, loaded on first use (off the async threads).
    pub(crate) async fn embedder(&self) -> Result<Arc<Embedder>, ApiError> {
        self.embedder
            .get_or_try_init(|| async {
                let Some(dir) = self.dir.clone() else {
                    return Err(ApiError::Internal("the embedder is not loaded".into()));
                };
                let loaded = tokio::task::spawn_blocking(move || {
                    crate::assemble::load_embedder(&dir, "")
                        .map_err(|e| ApiError::Internal(frugal_cost::causes::with_causes(&e)))
                })
                .await;
                loaded
                    .map_err(|e| ApiError::Internal(format!("loading the embedder stopped: {e}")))?
            })
            .await
            .cloned()
    }

    /// Embeds `texts` in order, off the async threads. A text longer than the embedder's
    /// 256 tokens is embedded from its first 256, as sentence-transformers does.
    pub async fn embed(&self, texts: Vec<String>) -> Result<Embedded, ApiError> {
        let embedder = self.embedder().await?;
        let run = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let mut tokens = 0;
            let vectors = texts
                .iter()
                .map(|t| {
                    tokens += embedder.tokens(t)?.len() as u64;
                    embedder.embed(t)
                })
                .collect::<Result<Vec<_>, _>>();
            vectors.map(|vectors| Embedded {
                vectors,
                tokens,
                took: started.elapsed(),
            })
        });
        match run.await {
            Ok(Ok(embedded)) => Ok(embedded),
            Ok(Err(e)) => Err(ApiError::Internal(format!("cannot embed the input: {e}"))),
            Err(e) => Err(ApiError::Internal(format!("embedding stopped: {e}"))),
        }
    }
}

impl Backend for LocalEmbedder {
    fn name(&self) -> &str {
        NAME
    }

    /// It answers `/v1/embeddings` alone.
    fn prepare(&self, _job: &Job) -> Result<Plan, ApiError> {
        Err(only_embeddings())
    }

    fn produce<'a>(
        &'a self,
        _job: &'a Job,
        _plan: Plan,
        _work: &'a mut Work,
    ) -> BoxFuture<'a, Result<Output, ApiError>> {
        Box::pin(async { Err(only_embeddings()) })
    }

    /// Its time on the machine, as the engine's requests are priced.
    fn price(&self, work: &Work) -> Priced {
        let cost = self.rate.cost_of(work.share).unwrap_or(Money::ZERO);
        if work.prompt_tokens > 0 {
            let now = cost.nanos() / work.prompt_tokens as i64;
            let old = self.per_token.load(Ordering::Relaxed);
            let avg = if old == 0 { now } else { (old * 7 + now) / 8 };
            self.per_token.store(avg, Ordering::Relaxed);
        }
        Priced {
            cost,
            busy: Some(work.share),
            batching_saved: Money::ZERO,
        }
    }
}

/// A text request that names the embedder.
pub(crate) fn only_embeddings() -> ApiError {
    ApiError::InvalidParam {
        param: "model",
        message: format!("`{NAME}` is an embedding model: ask POST /v1/embeddings"),
    }
}

/// The most an upstream's embeddings of `bytes` of input can cost: every byte a token at
/// its input price, or, on a machine paid by the hour, its timeout on each try.
pub(crate) fn upstream_worst_case(upstream: &Upstream, bytes: u64) -> Money {
    let c = &upstream.config;
    match &c.pricing {
        Some(Pricing::Tokens(price)) => price.saturating_cost(bytes, 0, 0),
        Some(Pricing::Hourly { rate, .. }) => {
            Plan::hourly(Some(*rate), c.timeout, c.retries.saturating_add(1)).worst_case
        }
        None => Money::ZERO,
    }
}
