//! frugal-gateway: the OpenAI-compatible HTTP API over frugal's engine.
//!
//! `POST /v1/chat/completions` and `POST /v1/completions` (both with SSE streaming and the
//! final usage chunk), `GET /v1/models`, `/health` and Prometheus `/metrics`. Every
//! request's tokens and engine time go to the ledger through the meter, and every response
//! says what it cost in `x-frugal-cost-usd`.

pub mod api;
pub mod cache;
pub mod error;
pub mod keys;
pub mod loadgen;
pub mod meter;
pub mod metrics;
pub mod route;
pub mod semantic;
pub mod shared;
mod text;
pub mod upstream;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{Value, json};

use frugal_engine::sampling::SamplingParams;
use frugal_engine::scheduler::{Engine, EngineTime, Event, FinishReason, Request, SubmitError};
use frugal_engine::template::{ChatTemplate, Message};
use frugal_engine::tokenizer::Tokenizer;

use crate::api::{ChatRequest, Common, CompletionRequest, Usage};
use crate::cache::{Answer, CachePolicy, Claim, ExactCache, Leader, Lookup, Probe};
use crate::error::ApiError;
use crate::keys::{Keys, Tenant};
use crate::meter::Meter;
use crate::metrics::{Gauges, Metrics};
use crate::route::RouteConfig;
use crate::semantic::SemanticCache;
use crate::shared::SharedCache;
use crate::text::{Piece, TextStream};
use crate::upstream::{Reply, Upstream};

/// Largest `max_tokens` a request gets when it names none.
const DEFAULT_MAX_TOKENS: usize = 512;
/// `top_logprobs` at most, as OpenAI allows.
const MAX_TOP_LOGPROBS: i64 = 20;

/// Everything a handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    /// None: a gateway for its upstreams only.
    local: Option<Local>,
    /// The local model's name, as clients use it.
    model: String,
    meter: Option<Meter>,
    cache: Option<ExactCache>,
    semantic: Option<SemanticCache>,
    /// The exact cache shared with other replicas.
    shared: Option<Arc<SharedCache>>,
    /// OpenAI-compatible servers behind the gateway, by the name clients use.
    upstreams: HashMap<String, Arc<Upstream>>,
    /// Cascade routes, by the name clients use.
    routes: HashMap<String, Arc<RouteConfig>>,
    /// How each served name uses the caches; a name without one keeps the defaults.
    policies: HashMap<String, CachePolicy>,
    keys: Keys,
    metrics: Metrics,
    started: i64,
}

/// The model the gateway runs itself.
pub struct Local {
    pub engine: Engine,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    stop_tokens: Vec<u32>,
}

impl Local {
    pub fn new(engine: Engine, tokenizer: Tokenizer, template: ChatTemplate) -> Local {
        Local {
            engine,
            stop_tokens: tokenizer.end_of_generation().to_vec(),
            tokenizer: Arc::new(tokenizer),
            template,
        }
    }
}

/// What a gateway is made of.
pub struct Parts {
    /// None: only the upstreams are served.
    pub local: Option<Local>,
    /// The local model's name, as clients use it.
    pub model: String,
    pub meter: Option<Meter>,
    pub cache: Option<ExactCache>,
    /// Needs `cache`: its entries share the exact cache's answers and rules.
    pub semantic: Option<SemanticCache>,
    /// Needs `cache`: the exact cache's second level, shared with other replicas.
    pub shared: Option<SharedCache>,
    pub upstreams: Vec<Upstream>,
    /// Every tier but the last is the local model (its answers carry logprobs); the last
    /// is the local model or an upstream.
    pub routes: Vec<RouteConfig>,
    /// Cache policies by served name (the local model, an upstream or a route); a route's
    /// holds for every tier it calls.
    pub policies: HashMap<String, CachePolicy>,
    /// No keys: the API is open.
    pub keys: Keys,
}

impl AppState {
    pub fn new(p: Parts) -> AppState {
        AppState {
            inner: Arc::new(Inner {
                local: p.local,
                model: p.model,
                meter: p.meter,
                semantic: p.cache.as_ref().and(p.semantic),
                shared: p.cache.as_ref().and(p.shared).map(Arc::new),
                cache: p.cache,
                upstreams: p
                    .upstreams
                    .into_iter()
                    .map(|u| (u.config.name.clone(), Arc::new(u)))
                    .collect(),
                routes: p
                    .routes
                    .into_iter()
                    .map(|r| (r.name.clone(), Arc::new(r)))
                    .collect(),
                policies: p.policies,
                keys: p.keys,
                metrics: Metrics::default(),
                started: now_s(),
            }),
        }
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Serves until `shutdown` resolves, then lets requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm holds each
    // one back until the previous is acknowledged.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
    });
    // The accept loop runs on a worker, not in the caller's `block_on`: there every
    // connection cost two cross-thread wakeups (the I/O driver waking the blocked thread,
    // which then handed the connection to a worker).
    let server = axum::serve(listener, router(state)).with_graceful_shutdown(shutdown);
    tokio::spawn(server.into_future())
        .await
        .map_err(std::io::Error::other)?
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

async fn health() -> &'static str {
    "ok"
}

async fn models(State(s): State<AppState>) -> Json<Value> {
    let mut names: Vec<&String> = s
        .inner
        .upstreams
        .keys()
        .chain(s.inner.routes.keys())
        .collect();
    names.sort();
    let local = s.inner.local.as_ref().map(|_| &s.inner.model);
    let data: Vec<api::Model> = local
        .into_iter()
        .chain(names)
        .map(|id| api::Model {
            id: id.clone(),
            object: "model",
            created: s.inner.started,
            owned_by: "frugal",
        })
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
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
        }
    });
    let mut text = s.inner.metrics.render(gauges.as_ref());
    if let Some(shared) = &s.inner.shared {
        use std::fmt::Write;
        let _ = write!(
            text,
            "# HELP frugal_shared_cache_total Shared (Redis) cache hits and failed calls.\n# TYPE frugal_shared_cache_total counter\nfrugal_shared_cache_total{{result=\"hit\"}} {}\nfrugal_shared_cache_total{{result=\"error\"}} {}\n",
            shared.hits.load(Ordering::Relaxed),
            shared.errors.load(Ordering::Relaxed)
        );
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// The body as JSON (the cache key reads it) and as the endpoint's request type.
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<(Value, T), ApiError> {
    let invalid = |e: serde_json::Error| ApiError::BadRequest(format!("invalid request body: {e}"));
    let value: Value = serde_json::from_slice(body).map_err(invalid)?;
    let typed = T::deserialize(&value).map_err(invalid)?;
    Ok((value, typed))
}

/// Where a validated request goes.
enum Route {
    /// The local engine, with the prompt rendered and the logprobs wanted.
    Local {
        body: Value,
        prompt: String,
        top: Option<usize>,
        common: Common,
        /// The cascade route the request named, which starts at the local model.
        cascade: Option<Arc<RouteConfig>>,
    },
    Upstream {
        up: Arc<Upstream>,
        body: Value,
        common: Common,
    },
}

async fn chat(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    s.handle(Kind::Chat, &headers, || {
        let (value, req): (Value, ChatRequest) = parse(&body)?;
        if let Some(up) = s.upstream(&req.common) {
            return Ok(Route::Upstream {
                up,
                body: value,
                common: req.common,
            });
        }
        if req.messages.is_empty() {
            return Err(ApiError::InvalidParam {
                param: "messages",
                message: "messages must not be empty".into(),
            });
        }
        let messages = req
            .messages
            .iter()
            .map(|m| {
                Ok(Message {
                    role: m.role.clone(),
                    content: m.text()?,
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let prompt = s
            .local(&req.common)?
            .template
            .render(&messages, true)
            .map_err(|e| ApiError::BadRequest(format!("cannot apply the chat template: {e}")))?;
        let top = match (req.logprobs, req.top_logprobs) {
            (false, Some(_)) => {
                return Err(ApiError::InvalidParam {
                    param: "top_logprobs",
                    message: "top_logprobs needs logprobs: true".into(),
                });
            }
            (false, None) => None,
            (true, n) => Some(check_top(n.unwrap_or(0), "top_logprobs")?),
        };
        let cascade = s.cascade_route(&req.common, top)?;
        Ok(Route::Local {
            body: value,
            prompt,
            top,
            common: req.common,
            cascade,
        })
    })
    .await
}

async fn completions(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    s.handle(Kind::Text, &headers, || {
        let (value, req): (Value, CompletionRequest) = parse(&body)?;
        if let Some(up) = s.upstream(&req.common) {
            return Ok(Route::Upstream {
                up,
                body: value,
                common: req.common,
            });
        }
        s.local(&req.common)?;
        let mut prompts = req.prompt.into_vec();
        if prompts.len() != 1 {
            return Err(ApiError::InvalidParam {
                param: "prompt",
                message: "give one prompt per request".into(),
            });
        }
        let top = req.logprobs.map(|n| check_top(n, "logprobs")).transpose()?;
        let cascade = s.cascade_route(&req.common, top)?;
        Ok(Route::Local {
            body: value,
            prompt: prompts.remove(0),
            top,
            common: req.common,
            cascade,
        })
    })
    .await
}

fn check_top(n: i64, param: &'static str) -> Result<usize, ApiError> {
    if (0..=MAX_TOP_LOGPROBS).contains(&n) {
        Ok(n as usize)
    } else {
        Err(ApiError::InvalidParam {
            param,
            message: format!("{param} must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

impl Kind {
    /// The endpoint below `/v1`.
    fn path(self) -> &'static str {
        match self {
            Kind::Chat => "chat/completions",
            Kind::Text => "completions",
        }
    }

    /// A response id in OpenAI's style, unique enough per server.
    fn response_id(self, started: (Instant, SystemTime)) -> String {
        let prefix = match self {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        };
        let epoch = started
            .1
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{prefix}-{:x}", started.0.elapsed().as_nanos() ^ epoch)
    }

    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }
}

impl AppState {
    /// The cache's answer, or the right (or duty) to produce it: a miss leads its key, and
    /// a request identical to one being answered waits for that answer.
    /// `model`: the served name the answer is credited to.
    async fn consult(&self, lookup: &Lookup, model: &str) -> (CacheUse, Option<Arc<Answer>>) {
        let (Lookup::Key { key, read, probe }, Some(cache)) = (lookup, &self.inner.cache) else {
            return (CacheUse::Bypass, None);
        };
        let m = &self.inner.metrics;
        let hit = |answer: Arc<Answer>, how: HitKind| {
            let (count, lever) = match how {
                HitKind::Exact => (&m.cache_hits, frugal_cost::Lever::Cache),
                HitKind::Semantic => (&m.semantic_hits, frugal_cost::Lever::SemanticCache),
            };
            count.fetch_add(1, Ordering::Relaxed);
            m.add_saving(lever, model, answer.cost);
            (CacheUse::Hit(answer.cost, how), Some(answer))
        };
        if *read && let Some(answer) = cache.get(key) {
            return hit(answer, HitKind::Exact);
        }
        if *read
            && let Some(shared) = &self.inner.shared
            && let Some(answer) = shared.get(key).await
        {
            let answer = Arc::new(answer);
            cache.insert(key.clone(), answer.clone());
            return hit(answer, HitKind::Exact);
        }
        let mut fill = None;
        if let (Some(sem), Some(probe)) = (&self.inner.semantic, probe)
            && let Some(v) = sem.embed(&probe.text).await
        {
            let t = Instant::now();
            let found = sem
                .find(&probe.space, &probe.text, &v, probe.threshold)
                .filter(|_| *read);
            m.semantic_lookup.observe(t.elapsed().as_secs_f64());
            if let Some(found) = found {
                return hit(found.answer, HitKind::Semantic);
            }
            fill = Some((probe.clone(), v));
        }
        let miss = |leader| {
            m.cache_misses.fetch_add(1, Ordering::Relaxed);
            (CacheUse::Miss(leader, fill), None)
        };
        match cache.claim(key) {
            Claim::Leader(leader) => miss(Some(leader)),
            // `no-cache` must not be handed another request's answer: it runs at once.
            Claim::Follower(_) if !*read => miss(None),
            Claim::Follower(pending) => match cache::wait(pending).await {
                Some(answer) => hit(answer, HitKind::Exact),
                // The first one failed: answer this one alone.
                None => miss(None),
            },
        }
    }

    /// Checks the key and budgets, validates the request with `route`, and answers it.
    async fn handle(
        &self,
        kind: Kind,
        headers: &HeaderMap,
        route: impl FnOnce() -> Result<Route, ApiError>,
    ) -> Response {
        let tenant = match self.admit(headers) {
            Ok(t) => t,
            Err(e) => return self.reject(e),
        };
        match route() {
            Ok(Route::Local {
                body,
                prompt,
                top,
                common,
                cascade: Some(route),
            }) => {
                self.cascade(kind, &prompt, top, common, body, route, headers, tenant)
                    .await
            }
            Ok(Route::Local {
                body,
                prompt,
                top,
                common,
                cascade: None,
            }) => {
                let model = &self.inner.model;
                let policy = self.policy(model);
                let lookup = self.lookup(&body, kind, model, tenant.as_deref(), headers, policy);
                self.generate(kind, &prompt, top, common, lookup, tenant)
                    .await
            }
            Ok(Route::Upstream { up, body, common }) => {
                let policy = self.policy(&up.config.name);
                self.call(up, kind, body, &common, headers, tenant, policy)
                    .await
            }
            Err(e) => self.reject(e),
        }
    }

    fn policy(&self, name: &str) -> CachePolicy {
        self.inner.policies.get(name).copied().unwrap_or_default()
    }

    /// The local model, if the request may be answered by it: it names it, "default" or
    /// nothing, or a cascade route (which starts at it).
    fn local(&self, c: &Common) -> Result<&Local, ApiError> {
        let named = c.model.as_deref();
        let ok = match named {
            None | Some("default") => true,
            Some(m) => m == self.inner.model || self.inner.routes.contains_key(m),
        };
        match &self.inner.local {
            Some(local) if ok => Ok(local),
            _ => Err(ApiError::UnknownModel(
                named.unwrap_or("default").to_owned(),
            )),
        }
    }

    /// The upstream a request names, if it names one.
    fn upstream(&self, c: &Common) -> Option<Arc<Upstream>> {
        self.inner.upstreams.get(c.model.as_deref()?).cloned()
    }

    /// The cascade route a request names, if it names one. Its first tier's answer is
    /// judged before it is sent, so a stream of it cannot carry logprobs.
    fn cascade_route(
        &self,
        c: &Common,
        top: Option<usize>,
    ) -> Result<Option<Arc<RouteConfig>>, ApiError> {
        let Some(route) = c.model.as_deref().and_then(|m| self.inner.routes.get(m)) else {
            return Ok(None);
        };
        if c.stream && top.is_some() {
            return Err(ApiError::InvalidParam {
                param: "logprobs",
                message: format!(
                    "route {} does not stream logprobs; ask without stream",
                    route.name
                ),
            });
        }
        Ok(Some(route.clone()))
    }

    /// A cascade's cheap tier answered: the saving is what its last tier (an upstream
    /// priced per token) would have charged for the same tokens, less what the answer cost.
    fn record_routing_saving(
        &self,
        route: &RouteConfig,
        kind: Kind,
        answer: &Value,
        cost: Option<frugal_cost::Money>,
        started: SystemTime,
    ) {
        let Some(meter) = &self.inner.meter else {
            return;
        };
        let dearest = route.tiers.last().and_then(|t| self.inner.upstreams.get(t));
        let Some((_, _, usage)) = answer_parts(answer, kind) else {
            return;
        };
        let Some(avoided) = dearest.and_then(|up| up.token_cost(&usage)) else {
            return;
        };
        let saved = avoided - cost.unwrap_or(frugal_cost::Money::ZERO);
        if saved > frugal_cost::Money::ZERO {
            self.inner
                .metrics
                .add_saving(frugal_cost::Lever::Routing, &route.name, saved);
            meter.record_saving(meter::Saving {
                started,
                model: route.name.clone(),
                saved,
            });
        }
    }

    /// A cascade: the local model answers first (through its cache and meter, with
    /// logprobs); the answer stands when its confidence clears the route's threshold, else
    /// the request goes to the route's last tier. `x-frugal-route` names the tiers tried.
    #[allow(clippy::too_many_arguments)]
    async fn cascade(
        &self,
        kind: Kind,
        prompt: &str,
        top: Option<usize>,
        c: Common,
        body: Value,
        route: Arc<RouteConfig>,
        headers: &HeaderMap,
        tenant: Option<Arc<Tenant>>,
    ) -> Response {
        let local_name = self.inner.model.clone();
        let last = route.tiers.last().filter(|t| **t != local_name);
        let policy = self.policy(&route.name);
        // Requests like those the cheap tier failed go straight to the last tier.
        if let (Some(skip), Some(last)) = (&route.skip, last)
            && let Some(text) = cache::question_text(&body)
            && skip.skips(&text).await
        {
            let chain = format!("skip>{last}");
            self.inner.metrics.count_route(&route.name, &chain);
            let response = self
                .to_tier(last, kind, body, c, headers, tenant, policy)
                .await;
            return with_route(response, &chain);
        }
        let mut first = c.clone();
        first.model = None;
        first.stream = false;
        let mut first_body = body.clone();
        first_body["model"] = Value::String(local_name.clone());
        let lookup = self.lookup(
            &first_body,
            kind,
            &local_name,
            tenant.as_deref(),
            headers,
            policy,
        );
        let started = (Instant::now(), SystemTime::now());
        let reply = self
            .generate(
                kind,
                prompt,
                Some(top.unwrap_or(0)),
                first,
                lookup,
                tenant.clone(),
            )
            .await;
        let (parts, reply) = reply.into_parts();
        let bytes = axum::body::to_bytes(reply, usize::MAX)
            .await
            .unwrap_or_default();
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !parts.status.is_success() {
            return with_route(Response::from_parts(parts, bytes.into()), &local_name);
        }
        let logprobs = token_logprobs(&answer, kind);
        let conf = route::confidence(&logprobs, route.quantile);
        let m = &self.inner.metrics;
        match last.filter(|_| conf < route.threshold) {
            None => {
                m.count_route(&route.name, &local_name);
                let cost = header_money(&parts.headers, "x-frugal-cost-usd");
                self.record_routing_saving(&route, kind, &answer, cost, started.1);
                let mut response = if c.stream {
                    let Some((text, reason, usage)) = answer_parts(&answer, kind) else {
                        return ApiError::Internal("the first tier's answer is unreadable".into())
                            .into_response();
                    };
                    let settled = Answer {
                        chunks: vec![cache::Chunk {
                            text,
                            logprobs: Vec::new(),
                        }],
                        finish_reason: reason,
                        usage,
                        cost: cost.unwrap_or(frugal_cost::Money::ZERO),
                    };
                    let ctx = Ctx {
                        state: self.clone(),
                        kind,
                        model: local_name.clone(),
                        id: kind.response_id(started),
                        started,
                        cache: CacheUse::Bypass,
                        recorded: Vec::new(),
                        tenant: None,
                        settled: Some(cost.unwrap_or(frugal_cost::Money::ZERO)),
                    };
                    ctx.respond(Source::Replay(Replay::new(&settled, false)), &c)
                        .await
                } else {
                    let mut answer = answer;
                    if top.is_none()
                        && let Some(choice) = answer["choices"].get_mut(0)
                    {
                        choice["logprobs"] = Value::Null;
                    }
                    Json(answer).into_response()
                };
                for name in ["x-frugal-cost-usd", "x-frugal-cache", "x-frugal-saved-usd"] {
                    if let Some(v) = parts.headers.get(name) {
                        response.headers_mut().insert(name, v.clone());
                    }
                }
                with_route(response, &local_name)
            }
            Some(next) => {
                m.count_route(&route.name, next);
                let mut response = self
                    .to_tier(next, kind, body, c, headers, tenant, policy)
                    .await;
                // What the request cost in all: both tiers.
                let spent = header_money(&parts.headers, "x-frugal-cost-usd");
                let total = header_money(response.headers(), "x-frugal-cost-usd")
                    .zip(spent)
                    .map(|(a, b)| a + b);
                if let Some(v) =
                    total.and_then(|t| HeaderValue::from_str(&t.to_string_places(9)).ok())
                {
                    response.headers_mut().insert("x-frugal-cost-usd", v);
                }
                with_route(response, &format!("{local_name}>{next}"))
            }
        }
    }

    /// A cascade's request sent on to its upstream tier `next`.
    #[allow(clippy::too_many_arguments)]
    async fn to_tier(
        &self,
        next: &str,
        kind: Kind,
        mut body: Value,
        mut c: Common,
        headers: &HeaderMap,
        tenant: Option<Arc<Tenant>>,
        policy: CachePolicy,
    ) -> Response {
        let Some(up) = self.inner.upstreams.get(next).cloned() else {
            return ApiError::Internal(format!("no upstream {next}")).into_response();
        };
        body["model"] = Value::String(next.to_owned());
        c.model = Some(next.to_owned());
        self.call(up, kind, body, &c, headers, tenant, policy).await
    }

    /// The request's tenant (when keys are configured), if its key is valid and its
    /// budgets have room.
    fn admit(&self, headers: &HeaderMap) -> Result<Option<Arc<Tenant>>, ApiError> {
        let tenant = self.inner.keys.authenticate(headers)?;
        if let Some(t) = &tenant {
            t.admit(chrono::Utc::now())?;
        }
        Ok(tenant)
    }

    /// How a request meets the cache: entries are namespaced by tenant unless the policy
    /// shares them.
    fn lookup(
        &self,
        body: &Value,
        kind: Kind,
        model: &str,
        tenant: Option<&Tenant>,
        headers: &HeaderMap,
        policy: CachePolicy,
    ) -> Lookup {
        if self.inner.cache.is_none() {
            return Lookup::Bypass;
        }
        let control = headers
            .get(header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok());
        let namespace = match tenant {
            Some(t) if !policy.shared => t.name.as_str(),
            _ => "",
        };
        let mut lookup = cache::lookup(body, kind.path(), model, namespace, control);
        if let Lookup::Key {
            probe: Some(probe), ..
        } = &mut lookup
        {
            probe.threshold = policy.semantic_threshold;
        }
        lookup
    }

    fn reject(&self, e: ApiError) -> Response {
        self.inner
            .metrics
            .requests_rejected
            .fetch_add(1, Ordering::Relaxed);
        e.into_response()
    }

    /// Validates the common fields into an engine request.
    fn request(
        &self,
        prompt: &str,
        top: Option<usize>,
        c: &Common,
    ) -> Result<(Request, Vec<String>, &Local), ApiError> {
        let local = self.local(c)?;
        if c.n.is_some_and(|n| n != 1) {
            return Err(ApiError::InvalidParam {
                param: "n",
                message: "only n = 1 is supported".into(),
            });
        }
        for (name, v) in [
            ("presence_penalty", c.presence_penalty),
            ("frequency_penalty", c.frequency_penalty),
        ] {
            if v.is_some_and(|v| v != 0.0) {
                return Err(ApiError::InvalidParam {
                    param: if name == "presence_penalty" {
                        "presence_penalty"
                    } else {
                        "frequency_penalty"
                    },
                    message: format!("{name} is not supported; leave it at 0"),
                });
            }
        }
        let tok = &local.tokenizer;
        let mut tokens = tok
            .encode(prompt)
            .map_err(|e| ApiError::BadRequest(format!("cannot tokenize the prompt: {e}")))?;
        if let Some(bos) = tok.bos().filter(|_| tok.add_bos_token()) {
            tokens.insert(0, bos);
        }
        let ctx = local.engine.context_len();
        if tokens.len() >= ctx {
            return Err(ApiError::ContextLength(format!(
                "the prompt is {} tokens; this model's context holds {ctx} tokens",
                tokens.len()
            )));
        }
        let room = ctx - tokens.len();
        let max_tokens = match c.max_completion_tokens.or(c.max_tokens) {
            None => room.min(DEFAULT_MAX_TOKENS),
            Some(n) if n < 1 => {
                return Err(ApiError::InvalidParam {
                    param: "max_tokens",
                    message: format!("max_tokens must be at least 1, got {n}"),
                });
            }
            Some(n) if n as u64 > room as u64 => {
                return Err(ApiError::ContextLength(format!(
                    "max_tokens {n} plus the prompt's {} tokens exceeds the context of {ctx} tokens (at most {room} for this prompt)",
                    tokens.len()
                )));
            }
            Some(n) => n as usize,
        };
        let temperature = c.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::InvalidParam {
                param: "temperature",
                message: format!("temperature must be between 0 and 2, got {temperature}"),
            });
        }
        let top_p = c.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::InvalidParam {
                param: "top_p",
                message: format!("top_p must be in (0, 1], got {top_p}"),
            });
        }
        let top_k = match c.top_k {
            Some(k) if k < 0 => {
                return Err(ApiError::InvalidParam {
                    param: "top_k",
                    message: format!("top_k must be >= 0, got {k}"),
                });
            }
            k => k.unwrap_or(0) as usize,
        };
        let stops = c
            .stop
            .clone()
            .map(api::OneOrMany::into_vec)
            .unwrap_or_default();
        if stops.len() > 4 || stops.iter().any(String::is_empty) {
            return Err(ApiError::InvalidParam {
                param: "stop",
                message: "stop takes up to 4 non-empty sequences".into(),
            });
        }
        let request = Request {
            prompt: tokens,
            max_tokens,
            sampling: SamplingParams {
                temperature,
                top_p,
                top_k,
                seed: c.seed.map(|s| s as u64),
                top_logprobs: top.unwrap_or(0),
            },
            stop_tokens: local.stop_tokens.clone(),
            ignore_eos: c.ignore_eos,
        };
        Ok((request, stops, local))
    }

    async fn generate(
        &self,
        kind: Kind,
        prompt: &str,
        top: Option<usize>,
        c: Common,
        lookup: Lookup,
        tenant: Option<Arc<Tenant>>,
    ) -> Response {
        let started = (Instant::now(), SystemTime::now());
        // Validated before the cache is read: a hit must not answer what a miss refuses.
        let (request, stops, local) = match self.request(prompt, top, &c) {
            Ok(r) => r,
            Err(e) => return self.reject(e),
        };
        let id = kind.response_id(started);
        let (cache_use, hit) = self.consult(&lookup, &self.inner.model).await;
        let mut ctx = Ctx {
            state: self.clone(),
            kind,
            model: self.inner.model.clone(),
            id,
            started,
            cache: cache_use,
            recorded: Vec::new(),
            tenant,
            settled: None,
        };
        let source = if let Some(answer) = hit {
            Source::Replay(Replay::new(&answer, top.is_some()))
        } else {
            let prompt_tokens = request.prompt.len();
            let rx = match local.engine.submit(request) {
                Ok(rx) => rx,
                Err(e @ SubmitError::Overloaded(_)) => {
                    return self.reject(ApiError::Overloaded(e.to_string()));
                }
                Err(e @ SubmitError::TooLong { .. }) => {
                    return self.reject(ApiError::ContextLength(e.to_string()));
                }
                Err(e) => return self.reject(ApiError::BadRequest(e.to_string())),
            };
            ctx.recorded.reserve(64);
            Source::Live(Box::new(TextStream::new(
                rx,
                local.tokenizer.clone(),
                stops,
                top.is_some(),
                prompt_tokens,
            )))
        };
        ctx.respond(source, &c).await
    }

    /// One request to an upstream: from the cache if it can be, else passed through, and
    /// metered and cached once it has completed.
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        up: Arc<Upstream>,
        kind: Kind,
        body: Value,
        c: &Common,
        headers: &HeaderMap,
        tenant: Option<Arc<Tenant>>,
        policy: CachePolicy,
    ) -> Response {
        let started = (Instant::now(), SystemTime::now());
        let lookup = self.lookup(
            &body,
            kind,
            &up.config.name,
            tenant.as_deref(),
            headers,
            policy,
        );
        let mut ctx = Ctx {
            state: self.clone(),
            kind,
            model: up.config.name.clone(),
            id: String::new(),
            started,
            cache: CacheUse::Bypass,
            recorded: Vec::new(),
            tenant,
            settled: None,
        };
        // Logprobs are not parsed from upstreams, so such answers are not kept.
        let lookup = if body["logprobs"].as_bool().unwrap_or(false) {
            Lookup::Bypass
        } else {
            lookup
        };
        let (cache_use, hit) = self.consult(&lookup, &up.config.name).await;
        ctx.cache = cache_use;
        if let Some(answer) = hit {
            ctx.id = kind.response_id(started);
            return ctx
                .respond(Source::Replay(Replay::new(&answer, false)), c)
                .await;
        }
        let ticket = up.occupy();
        match up.send(kind.path(), body, c.stream).await {
            Err(e) => {
                ctx.fail_call(&up, None, ticket.finish());
                e.into_response()
            }
            Ok(Reply::Json(v)) => {
                let (usage, cached) = upstream::usage_of(&v).unwrap_or_default();
                let share = ticket.finish();
                let cost = up.cost(&usage, cached, share);
                if let Some((text, reason)) = plain_answer(&v, kind) {
                    ctx.record(&text, &[]);
                    ctx.finish_call(reason, usage, cached, cost, share);
                } else {
                    ctx.recorded.clear();
                    ctx.cache = CacheUse::Bypass;
                    ctx.finish_call(FinishReason::Stop, usage, cached, cost, share);
                }
                let mut response = Json(v).into_response();
                response.headers_mut().extend(ctx.headers(cost));
                response
            }
            Ok(Reply::Stream(resp)) => {
                let include_usage = c.stream_options.as_ref().is_some_and(|o| o.include_usage);
                let headers = ctx.headers(None);
                let mut response = ctx
                    .pass_stream(up, ticket, resp, include_usage)
                    .into_response();
                response.headers_mut().extend(headers);
                response
            }
        }
    }
}

/// The chosen tokens' logprobs of a one-choice answer, in either endpoint's shape.
fn token_logprobs(v: &Value, kind: Kind) -> Vec<f32> {
    let lp = &v["choices"][0]["logprobs"];
    let values: Vec<&Value> = match kind {
        Kind::Chat => lp["content"]
            .as_array()
            .map(|a| a.iter().map(|e| &e["logprob"]).collect())
            .unwrap_or_default(),
        Kind::Text => lp["token_logprobs"]
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
    };
    values
        .into_iter()
        .filter_map(Value::as_f64)
        .map(|x| x as f32)
        .collect()
}

/// Text, finish reason and usage of one of our own one-choice answers.
fn answer_parts(v: &Value, kind: Kind) -> Option<(String, FinishReason, Usage)> {
    let (text, reason) = plain_answer(v, kind)?;
    let u = &v["usage"];
    let count = |k: &str| u[k].as_u64().unwrap_or(0) as usize;
    let usage = Usage {
        prompt_tokens: count("prompt_tokens"),
        completion_tokens: count("completion_tokens"),
        total_tokens: count("total_tokens"),
    };
    Some((text, reason, usage))
}

fn header_money(h: &HeaderMap, name: &str) -> Option<frugal_cost::Money> {
    h.get(name)?.to_str().ok()?.parse().ok()
}

/// The text and finish reason of a one-choice answer of plain text (no tool calls), which
/// the cache can replay.
fn plain_answer(v: &Value, kind: Kind) -> Option<(String, FinishReason)> {
    let choices = v["choices"].as_array().filter(|c| c.len() == 1)?;
    let choice = &choices[0];
    let text = match kind {
        Kind::Chat => {
            let m = &choice["message"];
            if m.get("tool_calls").is_some_and(|t| !t.is_null()) {
                return None;
            }
            m["content"].as_str()?
        }
        Kind::Text => choice["text"].as_str()?,
    };
    let reason = match choice["finish_reason"].as_str()? {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        _ => return None,
    };
    Some((text.to_owned(), reason))
}

/// How a request met the caches.
enum CacheUse {
    /// Served from a cache, saving what the answer first cost.
    Hit(frugal_cost::Money, HitKind),
    /// Not found: the answer is stored (and handed to identical requests waiting for it)
    /// when it completes, if this request leads its key; and kept in the semantic cache
    /// under the probe and its embedding.
    Miss(Option<Leader>, Option<(Probe, Vec<f32>)>),
    Bypass,
}

#[derive(Clone, Copy)]
enum HitKind {
    Exact,
    Semantic,
}

/// `r` with `x-frugal-route` naming the tiers a cascade tried.
fn with_route(mut r: Response, chain: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(chain) {
        r.headers_mut().insert("x-frugal-route", v);
    }
    r
}

/// Where a response's pieces come from: the engine, or a cached answer.
enum Source {
    Live(Box<TextStream>),
    Replay(Replay),
}

impl Source {
    async fn next(&mut self) -> Piece {
        match self {
            Source::Live(t) => t.next().await,
            Source::Replay(r) => r.next(),
        }
    }

    fn wants_logprobs(&self) -> bool {
        match self {
            Source::Live(t) => t.wants_logprobs(),
            Source::Replay(r) => r.logprobs,
        }
    }
}

/// A cached answer's pieces in their first chunking, then its end; free of engine time.
struct Replay {
    pieces: std::collections::VecDeque<Piece>,
    logprobs: bool,
}

impl Replay {
    fn new(answer: &Answer, logprobs: bool) -> Replay {
        let mut pieces: std::collections::VecDeque<Piece> = answer
            .chunks
            .iter()
            .map(|c| Piece::Text {
                text: c.text.clone(),
                logprobs: c.logprobs.clone(),
            })
            .collect();
        pieces.push_back(Piece::Done {
            reason: answer.finish_reason,
            usage: answer.usage,
            engine: EngineTime::default(),
            first_token: None,
        });
        Replay { pieces, logprobs }
    }

    fn next(&mut self) -> Piece {
        self.pieces
            .pop_front()
            .unwrap_or_else(|| Piece::Failed("the cached answer has ended".into()))
    }
}

/// One request's identity while it is answered.
struct Ctx {
    state: AppState,
    kind: Kind,
    /// The model's name as clients use it.
    model: String,
    id: String,
    started: (Instant, SystemTime),
    cache: CacheUse,
    /// The answer's chunks so far, kept when it is to be cached.
    recorded: Vec<cache::Chunk>,
    /// Whose budget pays.
    tenant: Option<Arc<Tenant>>,
    /// Already metered and paid for by the call that produced it (a cascade tier's answer,
    /// replayed): what it cost.
    settled: Option<frugal_cost::Money>,
}

impl Ctx {
    fn count_failure(&self) {
        self.state
            .inner
            .metrics
            .requests_failed
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps a piece of the answer if it will be cached.
    fn record(&mut self, text: &str, logprobs: &[api::TokenLogprob]) {
        if matches!(self.cache, CacheUse::Miss(Some(_), _)) {
            self.recorded.push(cache::Chunk {
                text: text.to_owned(),
                logprobs: logprobs.to_vec(),
            });
        }
    }

    /// Response headers: what the request cost, and how it met the cache.
    fn headers(&self, cost: Option<frugal_cost::Money>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = cost.and_then(|c| HeaderValue::from_str(&c.to_string_places(9)).ok()) {
            h.insert("x-frugal-cost-usd", v);
        }
        if let CacheUse::Hit(saved, _) = self.cache
            && let Ok(v) = HeaderValue::from_str(&saved.to_string_places(9))
        {
            h.insert("x-frugal-saved-usd", v);
        }
        let cache = match self.cache {
            CacheUse::Hit(_, HitKind::Exact) => "hit-exact",
            CacheUse::Hit(_, HitKind::Semantic) => "hit-semantic",
            CacheUse::Miss(..) => "miss",
            CacheUse::Bypass => "bypass",
        };
        h.insert("x-frugal-cache", HeaderValue::from_static(cache));
        h
    }

    fn finish(
        &mut self,
        reason: FinishReason,
        usage: Usage,
        engine: EngineTime,
        first: Option<std::time::Duration>,
    ) -> Option<frugal_cost::Money> {
        let cost = self.account(usage, engine, first);
        self.store(reason, usage, cost);
        cost
    }

    /// Charges the tenant, and keeps the recorded answer if the request missed the cache.
    fn store(&mut self, reason: FinishReason, usage: Usage, cost: Option<frugal_cost::Money>) {
        if let (Some(t), Some(c), None) = (&self.tenant, cost, self.settled) {
            t.spend(c, chrono::Utc::now());
        }
        let inner = &self.state.inner;
        if let (CacheUse::Miss(leader, fill), Some(cache)) = (&mut self.cache, &inner.cache)
            && let Some(leader) = leader.take()
        {
            let key = leader.key().clone();
            let answer = leader.fulfil(
                cache,
                Answer {
                    chunks: std::mem::take(&mut self.recorded),
                    finish_reason: reason,
                    usage,
                    cost: cost.unwrap_or(frugal_cost::Money::ZERO),
                },
            );
            if let Some(shared) = &inner.shared {
                shared.put(&key, &answer);
            }
            if let (Some((probe, v)), Some(sem)) = (fill.take(), &inner.semantic) {
                sem.insert(probe.space, probe.text, &v, answer);
            }
        }
    }

    /// Counts a request that succeeded; its whole time.
    fn count_ok(&self) -> std::time::Duration {
        let m = &self.state.inner.metrics;
        m.requests_ok.fetch_add(1, Ordering::Relaxed);
        let total = self.started.0.elapsed();
        m.latency.observe(total.as_secs_f64());
        total
    }

    /// What a cache hit saved, for the ledger.
    fn saved(&self) -> Option<(frugal_cost::Money, frugal_cost::Lever)> {
        match self.cache {
            CacheUse::Hit(saved, HitKind::Exact) => Some((saved, frugal_cost::Lever::Cache)),
            CacheUse::Hit(saved, HitKind::Semantic) => {
                Some((saved, frugal_cost::Lever::SemanticCache))
            }
            _ => None,
        }
    }

    /// Writes this request to the ledger as a call priced by its tokens (an upstream's).
    fn record_call(
        &self,
        usage: Usage,
        cached: u64,
        cost: frugal_cost::Money,
        failed: bool,
        share: std::time::Duration,
    ) {
        self.state.inner.metrics.add_spend(&self.model, cost);
        if let Some(meter) = &self.state.inner.meter {
            meter.record_call(meter::Call {
                started: self.started.1,
                duration: self.started.0.elapsed(),
                model: self.model.clone(),
                prompt_tokens: usage.prompt_tokens as u64,
                cached_tokens: cached,
                completion_tokens: usage.completion_tokens as u64,
                cost,
                failed,
                share: Some(share),
                saved: self.saved(),
                tenant: self.tenant.as_ref().map(|t| t.name.clone()),
            });
        }
    }

    /// Metrics and the ledger for a finished request; its cost, when metered.
    fn account(
        &self,
        usage: Usage,
        engine: EngineTime,
        first: Option<std::time::Duration>,
    ) -> Option<frugal_cost::Money> {
        if self.settled.is_some() {
            return self.settled;
        }
        let s = &self.state.inner;
        let total = self.count_ok();
        if let Some(first) = first {
            s.metrics.ttft.observe(first.as_secs_f64());
            if usage.completion_tokens > 1 {
                let rest = total.saturating_sub(first).as_secs_f64();
                s.metrics
                    .tpot
                    .observe(rest / (usage.completion_tokens - 1) as f64);
            }
        }
        let meter = s.meter.as_ref()?;
        if self.model != s.model {
            // An upstream's answer from the cache: no call, no cost.
            self.record_call(
                usage,
                0,
                frugal_cost::Money::ZERO,
                false,
                std::time::Duration::ZERO,
            );
            return Some(frugal_cost::Money::ZERO);
        }
        // A request the engine served in a batch saved what its steps alone would have
        // cost beyond its share.
        let batched = meter.cost(engine.saved());
        if batched > frugal_cost::Money::ZERO {
            s.metrics
                .add_saving(frugal_cost::Lever::Batching, &self.model, batched);
        }
        let saved = self.saved().or_else(|| {
            (batched > frugal_cost::Money::ZERO).then_some((batched, frugal_cost::Lever::Batching))
        });
        meter.record(meter::Usage {
            started: self.started.1,
            prompt_tokens: usage.prompt_tokens as u64,
            completion_tokens: usage.completion_tokens as u64,
            engine: engine.shared,
            saved,
            tenant: self.tenant.as_ref().map(|t| t.name.clone()),
        });
        let cost = meter.cost(engine.shared);
        s.metrics.add_spend(&self.model, cost);
        Some(cost)
    }

    /// Metrics, the ledger and the cache for a completed upstream call.
    fn finish_call(
        &mut self,
        reason: FinishReason,
        usage: Usage,
        cached: u64,
        cost: Option<frugal_cost::Money>,
        share: std::time::Duration,
    ) {
        self.count_ok();
        self.record_call(
            usage,
            cached,
            cost.unwrap_or(frugal_cost::Money::ZERO),
            false,
            share,
        );
        self.store(reason, usage, cost);
    }

    /// A failed upstream call: counted, and a ledger row (with the usage seen, if any) so
    /// the failure is on record.
    fn fail_call(&self, up: &Upstream, usage: Option<(Usage, u64)>, share: std::time::Duration) {
        self.count_failure();
        let (usage, cached) = usage.unwrap_or_default();
        let cost = up
            .cost(&usage, cached, share)
            .unwrap_or(frugal_cost::Money::ZERO);
        self.record_call(usage, cached, cost, true, share);
    }

    async fn respond(self, source: Source, c: &Common) -> Response {
        if c.stream {
            let usage = c.stream_options.as_ref().is_some_and(|o| o.include_usage);
            let headers = self.headers(None);
            let mut response = self.stream(source, usage).into_response();
            response.headers_mut().extend(headers);
            response
        } else {
            self.complete(source).await
        }
    }

    /// An upstream's stream, passed through event by event while the answer, its finish
    /// and its usage are gathered for the ledger and the cache.
    fn pass_stream(
        self,
        up: Arc<Upstream>,
        ticket: upstream::Ticket,
        resp: reqwest::Response,
        include_usage: bool,
    ) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
        struct Pass {
            ctx: Ctx,
            up: Arc<Upstream>,
            /// Taken when the call ends; a client gone mid-stream drops it unbilled.
            ticket: Option<upstream::Ticket>,
            events: std::pin::Pin<Box<dyn Stream<Item = Result<String, String>> + Send>>,
            usage: Option<(Usage, u64)>,
            reason: Option<FinishReason>,
            plain: bool,
            done: bool,
        }
        impl Pass {
            fn end(&mut self) {
                self.done = true;
                if !self.plain || self.reason.is_none() {
                    self.ctx.cache = CacheUse::Bypass;
                }
                let (usage, cached) = self.usage.unwrap_or_default();
                let share = self.share();
                let cost = self.up.cost(&usage, cached, share);
                let reason = self.reason.unwrap_or(FinishReason::Stop);
                self.ctx.finish_call(reason, usage, cached, cost, share);
            }

            fn share(&mut self) -> std::time::Duration {
                self.ticket
                    .take()
                    .map_or(std::time::Duration::ZERO, upstream::Ticket::finish)
            }

            fn fail(&mut self, message: String) -> Vec<SseEvent> {
                self.done = true;
                let share = self.share();
                self.ctx.fail_call(&self.up, self.usage, share);
                tracing::warn!(upstream = %self.up.config.name, error = %message, "stream failed");
                let body = json!({ "error": { "message": message, "type": "upstream_error" } });
                vec![
                    SseEvent::default().data(body.to_string()),
                    SseEvent::default().data("[DONE]"),
                ]
            }

            /// Reads one upstream payload; whether to pass it on.
            fn take(&mut self, v: &Value, include_usage: bool) -> bool {
                if let Some(u) = upstream::usage_of(v) {
                    self.usage = Some(u);
                }
                let choices = v["choices"].as_array().map_or(&[][..], Vec::as_slice);
                if choices.len() > 1 {
                    self.plain = false;
                }
                if let Some(c) = choices.first() {
                    let text = match self.ctx.kind {
                        Kind::Chat => &c["delta"]["content"],
                        Kind::Text => &c["text"],
                    };
                    if let Some(t) = text.as_str() {
                        self.ctx.record(t, &[]);
                    }
                    if c["delta"].get("tool_calls").is_some_and(|t| !t.is_null()) {
                        self.plain = false;
                    }
                    match c["finish_reason"].as_str() {
                        Some("stop") => self.reason = Some(FinishReason::Stop),
                        Some("length") => self.reason = Some(FinishReason::Length),
                        Some(_) => self.plain = false,
                        None => {}
                    }
                }
                // The usage-only chunk goes to clients that asked for it.
                !choices.is_empty() || include_usage
            }
        }
        let pass = Pass {
            ctx: self,
            up,
            ticket: Some(ticket),
            events: Box::pin(upstream::sse_events(resp)),
            usage: None,
            reason: None,
            plain: true,
            done: false,
        };
        let events = stream::unfold(pass, move |mut p| async move {
            if p.done {
                return None;
            }
            loop {
                let events = match p.events.next().await {
                    Some(Ok(data)) if data == "[DONE]" => {
                        p.end();
                        vec![SseEvent::default().data("[DONE]")]
                    }
                    Some(Ok(data)) => match serde_json::from_str::<Value>(&data) {
                        Ok(v) if p.take(&v, include_usage) => vec![SseEvent::default().data(data)],
                        Ok(_) => continue,
                        Err(e) => p.fail(format!(
                            "upstream `{}` sent malformed JSON in its stream: {e}",
                            p.up.config.name
                        )),
                    },
                    Some(Err(e)) => p.fail(format!("upstream `{}`: {e}", p.up.config.name)),
                    None => return None,
                };
                return Some((events, p));
            }
        })
        .flat_map(|events| stream::iter(events.into_iter().map(Ok)));
        Sse::new(events).keep_alive(KeepAlive::default())
    }

    fn choice(
        &self,
        text: &str,
        logprobs: Option<Value>,
        finish: Option<&str>,
        chunk: bool,
    ) -> Value {
        match (self.kind, chunk) {
            (Kind::Chat, false) => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            (Kind::Chat, true) => json!({
                "index": 0,
                "delta": if finish.is_some() && text.is_empty() { json!({}) } else { json!({ "role": "assistant", "content": text }) },
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            (Kind::Text, _) => json!({
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        }
    }

    fn body(&self, choices: Vec<Value>, usage: Option<Usage>, chunk: bool) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.kind.object(chunk),
            "created": self.started.1.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = json!(u);
        }
        v
    }

    fn logprobs(&self, entries: Vec<api::TokenLogprob>) -> Option<Value> {
        match self.kind {
            Kind::Chat => Some(json!({ "content": entries })),
            Kind::Text => Some(json!({
                "tokens": entries.iter().map(|e| e.token.clone()).collect::<Vec<_>>(),
                "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
                "top_logprobs": entries
                    .iter()
                    .map(|e| {
                        e.top_logprobs
                            .iter()
                            .map(|t| (t.token.clone(), json!(t.logprob)))
                            .collect::<serde_json::Map<_, _>>()
                    })
                    .collect::<Vec<_>>(),
            })),
        }
    }

    async fn complete(mut self, mut text: Source) -> Response {
        let mut out = String::new();
        let mut entries = Vec::new();
        let (reason, usage, engine, first) = loop {
            match text.next().await {
                Piece::Text { text: t, logprobs } => {
                    self.record(&t, &logprobs);
                    out.push_str(&t);
                    entries.extend(logprobs);
                }
                Piece::Done {
                    reason,
                    usage,
                    engine,
                    first_token,
                } => break (reason, usage, engine, first_token),
                Piece::Failed(e) => {
                    self.count_failure();
                    return ApiError::Internal(e).into_response();
                }
            }
        };
        let cost = self.finish(reason, usage, engine, first);
        let logprobs = text
            .wants_logprobs()
            .then(|| self.logprobs(entries))
            .flatten();
        let choice = self.choice(&out, logprobs, Some(finish_name(reason)), false);
        let mut response = Json(self.body(vec![choice], Some(usage), false)).into_response();
        response.headers_mut().extend(self.headers(cost));
        response
    }

    fn stream(
        self,
        text: Source,
        include_usage: bool,
    ) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
        // States: streaming text, then the finish chunk, then usage, then [DONE].
        let events = stream::unfold(
            (self, text, false),
            move |(mut ctx, mut text, done)| async move {
                if done {
                    return None;
                }
                let events: Vec<SseEvent> = match text.next().await {
                    Piece::Text { text: t, logprobs } => {
                        ctx.record(&t, &logprobs);
                        let lp = (!logprobs.is_empty())
                            .then(|| ctx.logprobs(logprobs))
                            .flatten();
                        let chunk = ctx.body(vec![ctx.choice(&t, lp, None, true)], None, true);
                        return Some((
                            vec![SseEvent::default().data(chunk.to_string())],
                            (ctx, text, false),
                        ));
                    }
                    Piece::Done {
                        reason,
                        usage,
                        engine,
                        first_token,
                    } => {
                        ctx.finish(reason, usage, engine, first_token);
                        let mut out = vec![
                            SseEvent::default().data(
                                ctx.body(
                                    vec![ctx.choice("", None, Some(finish_name(reason)), true)],
                                    None,
                                    true,
                                )
                                .to_string(),
                            ),
                        ];
                        if include_usage {
                            out.push(
                                SseEvent::default()
                                    .data(ctx.body(Vec::new(), Some(usage), true).to_string()),
                            );
                        }
                        out.push(SseEvent::default().data("[DONE]"));
                        out
                    }
                    Piece::Failed(e) => {
                        ctx.count_failure();
                        let body = json!({ "error": { "message": e, "type": "server_error" } });
                        vec![
                            SseEvent::default().data(body.to_string()),
                            SseEvent::default().data("[DONE]"),
                        ]
                    }
                };
                Some((events, (ctx, text, true)))
            },
        )
        .flat_map(|events| stream::iter(events.into_iter().map(Ok)));
        Sse::new(events).keep_alive(KeepAlive::default())
    }
}

fn finish_name(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// Engine events, for the text layer.
pub(crate) type Events = tokio::sync::mpsc::UnboundedReceiver<Event>;
