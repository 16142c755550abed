//! The HTTP surface: the router and its handlers, `serve` with its drain, and the open
//! metrics listener. A handler admits the request (key and budgets), parses it into a
//! [`Job`] and hands it to the backend or cascade it names ([`render::answer`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::json;

use crate::admit::keys::Keys;
use crate::batch::BatchLine;
use crate::batch::service::Host;
use crate::cascade;
use crate::http::api;
use crate::http::embeddings::EmbeddingJob;
use crate::http::error::ApiError;
use crate::http::render;
use crate::http::validate::Job;
use crate::metrics::{self, Gauges};
use crate::pool;
use crate::request::pipeline::Ask;
use crate::request::state::{AppState, Target};

pub fn router(state: AppState) -> Router {
    let max_upload = state.max_upload();
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/pools/{name}/scale", get(pool_scale))
        .merge(crate::batch::api::routes(max_upload))
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .with_state(state)
}

/// A path frugal does not serve, in OpenAI's error shape (as OpenAI answers one).
async fn no_route(method: Method, uri: Uri) -> Response {
    ApiError::NotFound {
        param: None,
        message: format!("no route for {method} {}", uri.path()),
    }
    .into_response()
}

/// A path served, asked with a method it does not take.
async fn no_method(method: Method, uri: Uri) -> Response {
    ApiError::MethodNotAllowed(format!("{} does not take {method}", uri.path())).into_response()
}

/// Serves `/metrics` alone, open, on a listener of its own (`--metrics-addr`, meant for
/// loopback or a scrape network), where a Prometheus scraper needs no API key.
pub fn serve_metrics(listener: tokio::net::TcpListener, state: AppState) {
    let app = Router::new()
        .route("/metrics", get(open_metrics))
        .route("/v1/pools/{name}/scale", get(open_pool_scale))
        .with_state(state);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("the metrics listener stopped: {e}");
        }
    });
}

/// Serves until `shutdown` resolves, then lets requests in flight finish for up to `drain`;
/// what is still running then is cut off (and billed as cancelled when its task is dropped).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm holds each
    // one back until the previous is acknowledged.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
    });
    let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        let _ = stopping.send(());
    };
    // The accept loop runs on a worker, not in the caller's `block_on`: there every
    // connection cost two cross-thread wakeups (the I/O driver waking the blocked thread,
    // which then handed the connection to a worker).
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    let mut task = tokio::spawn(server.into_future());
    tokio::select! {
        done = &mut task => done.map_err(std::io::Error::other)?,
        () = async {
            if stopped.await.is_ok() {
                tokio::time::sleep(drain).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            task.abort();
            tracing::warn!(?drain, "requests still in flight after the drain were cut off");
            Ok(())
        }
    }
}

async fn health() -> &'static str {
    "ok"
}

async fn chat(
    State(s): State<AppState>,
    line: Option<Extension<BatchLine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    s.handle(&headers, line.map(|l| l.0), || Job::chat(&body))
        .await
}

async fn embeddings(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let checked = s.admit(&headers).and_then(|tenant| {
        let job = EmbeddingJob::parse(&body)?;
        let target = s.embedding_target(job.model())?;
        Ok((tenant, job, target))
    });
    let (tenant, job, target) = match checked {
        Ok(c) => c,
        Err(e) => return s.reject(e),
    };
    match crate::request::embed::run(&s, tenant, &job, &target, &headers).await {
        Ok(e) => render::embedded(e),
        Err(e) => e.into_response(),
    }
}

async fn completions(
    State(s): State<AppState>,
    line: Option<Extension<BatchLine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    s.handle(&headers, line.map(|l| l.0), || Job::completion(&body))
        .await
}

/// With keys configured, only a client with a valid key may list what is served or read
/// the metrics (they name models, routes and spend).
fn unauthorized(s: &AppState, headers: &HeaderMap) -> Option<Response> {
    s.inner
        .keys
        .authenticate(headers)
        .err()
        .map(|e| s.reject(e))
}

async fn models(State(s): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(r) = unauthorized(&s, &headers) {
        return r;
    }
    let mut names: Vec<&String> = s
        .inner
        .upstreams
        .keys()
        .chain(s.inner.backends.keys())
        .chain(s.inner.routes.keys())
        .collect();
    names.sort();
    let local = s.inner.local.as_ref().map(|l| &l.machine.model);
    let embedder = s
        .inner
        .embedder
        .as_ref()
        .map(|_| crate::backend::embed::NAME.to_owned());
    let data: Vec<api::Model> = local
        .into_iter()
        .chain(names)
        .chain(embedder.as_ref())
        .map(|id| api::Model {
            id: id.clone(),
            object: "model",
            created: s.inner.started,
            owned_by: "frugal",
        })
        .collect();
    Json(json!({ "object": "list", "data": data })).into_response()
}

async fn metrics(State(s): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(r) = unauthorized(&s, &headers) {
        return r;
    }
    open_metrics(State(s)).await
}

/// A pool's demand and replicas, in the shape KEDA's `metrics-api` scaler reads
/// (`valueLocation: demand`).
async fn pool_scale(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: axum::extract::Path<String>,
) -> Response {
    if let Some(r) = unauthorized(&s, &headers) {
        return r;
    }
    open_pool_scale(State(s), name).await
}

async fn open_pool_scale(
    State(s): State<AppState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    match s.pool(&name) {
        Some(p) => Json(p.status()).into_response(),
        None => ApiError::UnknownModel(name).into_response(),
    }
}

async fn open_metrics(State(s): State<AppState>) -> Response {
    let gauges = s.inner.local.as_ref().map(|l| {
        let st = l.engine.stats();
        Gauges {
            waiting: st.waiting.load(Ordering::Relaxed),
            running: st.running.load(Ordering::Relaxed),
            batch: st.last_batch.load(Ordering::Relaxed),
            kv_reserved: st.kv_reserved.load(Ordering::Relaxed),
            prompt_tokens: st.prompt_tokens.load(Ordering::Relaxed),
            generated_tokens: st.generated_tokens.load(Ordering::Relaxed),
            padding_tokens: st.padding_tokens.load(Ordering::Relaxed),
            steps: st.steps.load(Ordering::Relaxed),
            busy_seconds: st.busy_us.load(Ordering::Relaxed) as f64 / 1e6,
            waiting_batch: st.waiting_batch.load(Ordering::Relaxed),
            preempted: st.preempted.load(Ordering::Relaxed),
            recomputed_tokens: st.recomputed_tokens.load(Ordering::Relaxed),
            prefix_lookups: st.prefix_lookups.load(Ordering::Relaxed),
            prefix_hits: st.prefix_hits.load(Ordering::Relaxed),
            prefix_hit_tokens: st.prefix_hit_tokens.load(Ordering::Relaxed),
            prefix_evictions: st.prefix_evictions.load(Ordering::Relaxed),
            drafted_tokens: st.drafted_tokens.load(Ordering::Relaxed),
            accepted_tokens: st.accepted_tokens.load(Ordering::Relaxed),
            kv_blocks: [
                st.kv_blocks_used.load(Ordering::Relaxed),
                st.kv_blocks_cached.load(Ordering::Relaxed),
                st.kv_blocks_free.load(Ordering::Relaxed),
            ],
            kernel: (
                l.kernels.kernel.name(),
                l.kernels.prefetch.name(),
                l.kernels.threads,
                l.kernels.source.name(),
            ),
        }
    });
    let mut text = s.inner.metrics.render(gauges.as_ref());
    pool::render_metrics(s.inner.pools.values(), &mut text);
    if let Some(semantic) = &s.inner.semantic {
        metrics::Metrics::render_semantic_budgets(&mut text, &semantic.budgets());
    }
    if let Some(meter) = &s.inner.meter {
        meter.health().render(&mut text);
    }
    match s.inner.keys.shared() {
        Some(b) => metrics::Metrics::render_budgets(
            &mut text,
            b.is_shared(),
            b.fallbacks.load(Ordering::Relaxed),
            (b.unsettled(), b.unreleased()),
        ),
        None => s
            .inner
            .metrics
            .render_catch_up(&mut text, chrono::Utc::now().timestamp_millis()),
    }
    if let Some(shared) = &s.inner.shared {
        use std::fmt::Write;
        let _ = write!(
            text,
            "# HELP frugal_shared_cache_total Shared (Redis) cache hits and failed calls.\n# TYPE frugal_shared_cache_total counter\nfrugal_shared_cache_total{{result=\"hit\"}} {}\nfrugal_shared_cache_total{{result=\"error\"}} {}\n",
            shared.hits.load(Ordering::Relaxed),
            shared.errors.load(Ordering::Relaxed)
        );
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

impl AppState {
    /// Checks the key (a batch line carries its job's tenant instead) and budgets, parses
    /// the request with `parse`, and answers it.
    async fn handle(
        &self,
        headers: &HeaderMap,
        line: Option<BatchLine>,
        parse: impl FnOnce() -> Result<Job, ApiError>,
    ) -> Response {
        let admitted = match &line {
            Some(l) => l.tenant.as_ref().map_or(Ok(None), |t| {
                t.admit(chrono::Utc::now()).map(|()| Some(t.clone()))
            }),
            None => self.admit(headers),
        };
        let tenant = match admitted {
            Ok(t) => t,
            Err(e) => return self.reject(e),
        };
        let job = match parse() {
            Ok(mut j) => {
                j.batch = line.map(|l| l.job);
                Arc::new(j)
            }
            Err(e) => return self.reject(e),
        };
        let ask = Ask {
            tenant,
            headers,
            policy: None,
            shadow_rate: None,
            shadow: None,
        };
        match self.target(&job) {
            Ok(Target::Backend(backend)) => render::answer(self, backend, job, &ask).await,
            Ok(Target::Cascade(route)) => cascade::run::run(self, route, job, ask).await,
            Err(e) => self.reject(e),
        }
    }

    fn reject(&self, e: ApiError) -> Response {
        self.inner
            .metrics
            .requests_rejected
            .fetch_add(1, Ordering::Relaxed);
        e.into_response()
    }
}

impl Host for AppState {
    fn router(&self) -> Router {
        router(self.clone())
    }

    fn keys(&self) -> &Keys {
        &self.inner.keys
    }
}
