//! The gateway's state: what it serves (the local model, upstreams, routes), its caches,
//! keys and meter, and how a request's model name resolves to a backend.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::atomic::Ordering;

use axum::http::{HeaderMap, header};
use chrono::{DateTime, Utc};
use frugal_cost::Money;

use crate::admit::keys::{Changes, KeySet, Keys, Tenant};
use crate::backend::embed::{self, LocalEmbedder};
use crate::backend::upstream::Upstream;
use crate::backend::{Backend, Local};
use crate::batch::service::{BatchConfig, Batches};
use crate::cache::exact::{self as cache, CachePolicy, ExactCache, Lookup};
use crate::cache::semantic::SemanticCache;
use crate::cache::shared::SharedCache;
use crate::cascade::route::RouteConfig;
use crate::http::error::ApiError;
use crate::http::validate::Job;
use crate::meter::Meter;
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::request::shadow::draw::Shadows;
use frugal_cost::causes::with_causes;

/// Everything a handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// None: a gateway for its upstreams only.
    pub local: Option<Arc<Local>>,
    /// The local embedding model `/v1/embeddings` answers with, beside a local model.
    pub embedder: Option<Arc<LocalEmbedder>>,
    pub meter: Option<Meter>,
    pub cache: Option<ExactCache>,
    pub semantic: Option<Arc<SemanticCache>>,
    /// The exact cache shared with other replicas.
    pub shared: Option<Arc<SharedCache>>,
    /// OpenAI-compatible servers behind the gateway, by the name clients use.
    pub upstreams: HashMap<String, Arc<Upstream>>,
    /// Other backends, by the name clients use.
    pub backends: HashMap<String, Arc<dyn Backend>>,
    /// Pools of replicas (also among `backends`), by the name clients use.
    pub pools: HashMap<String, Arc<Pool>>,
    /// Cascade routes, by the name clients use.
    pub routes: HashMap<String, Arc<RouteConfig>>,
    /// How each served name uses the caches; a name without one keeps the defaults.
    pub policies: HashMap<String, CachePolicy>,
    pub keys: Keys,
    pub metrics: Metrics,
    pub shadows: Shadows,
    pub started: i64,
    /// Batch lines consult the semantic cache.
    pub batch_semantic: bool,
    /// Where the Batch API keeps its state; `None`: no Batch API.
    pub batch_config: Option<BatchConfig>,
    /// The Batch API once [`AppState::start_batches`] has opened its directory, or why
    /// it could not.
    pub batches: OnceLock<Result<Arc<Batches>, String>>,
}

/// What a gateway is made of.
#[derive(Default)]
pub struct Parts {
    /// None: only the upstreams are served.
    pub local: Option<Local>,
    /// The local embedding model, served beside `local` (and priced at its machine's rate).
    pub embedder: Option<embed::Source>,
    pub meter: Option<Meter>,
    pub cache: Option<ExactCache>,
    /// Needs `cache`: its entries share the exact cache's answers and rules.
    pub semantic: Option<SemanticCache>,
    /// Needs `cache`: the exact cache's second level, shared with other replicas.
    pub shared: Option<SharedCache>,
    pub upstreams: Vec<Upstream>,
    /// Backends of other kinds, served under their names like upstreams.
    pub backends: Vec<Arc<dyn Backend>>,
    /// Pools of replicas, served under their names like upstreams; their autoscalers run
    /// from [`AppState::start_pools`].
    pub pools: Vec<Arc<Pool>>,
    /// Every tier but the last is the local model (its answers carry logprobs); the last
    /// is the local model or an upstream.
    pub routes: Vec<RouteConfig>,
    /// Cache policies by served name (the local model, an upstream or a route); a route's
    /// holds for every tier it calls.
    pub policies: HashMap<String, CachePolicy>,
    /// No keys: the API is open.
    pub keys: Keys,
    /// Batch jobs' lines use the semantic cache (else the exact one only).
    pub batch_semantic: bool,
    /// The Batch API's data directory (files, batches) and how its batches run; opened by
    /// [`AppState::start_batches`].
    pub batches: Option<BatchConfig>,
    /// The sampling of cheap answers to check (`[serve] shadow_rate`).
    pub shadows: Shadows,
}

/// Where a request's model name leads.
pub(crate) enum Target {
    Backend(Arc<dyn Backend>),
    Cascade(Arc<RouteConfig>),
}

/// Where an embeddings request's model name leads.
pub(crate) enum EmbedTarget {
    Local(Arc<LocalEmbedder>),
    Upstream(Arc<Upstream>),
}

impl AppState {
    pub fn new(p: Parts) -> AppState {
        AppState {
            inner: Arc::new(Inner {
                embedder: p.local.as_ref().and_then(|l| {
                    let rate = l.machine.rate;
                    p.embedder.map(|e| Arc::new(LocalEmbedder::new(e, rate)))
                }),
                local: p.local.map(Arc::new),
                meter: p.meter,
                semantic: p.cache.as_ref().and(p.semantic).map(Arc::new),
                shared: p.cache.as_ref().and(p.shared).map(Arc::new),
                cache: p.cache,
                upstreams: p
                    .upstreams
                    .into_iter()
                    .map(|u| (u.config.name.clone(), Arc::new(u)))
                    .collect(),
                backends: p
                    .backends
                    .into_iter()
                    .chain(p.pools.iter().map(|p| Arc::clone(p) as Arc<dyn Backend>))
                    .map(|b| (b.name().to_owned(), b))
                    .collect(),
                pools: p
                    .pools
                    .into_iter()
                    .map(|p| (p.config.name.clone(), p))
                    .collect(),
                routes: p
                    .routes
                    .into_iter()
                    .map(|r| (r.name.clone(), Arc::new(r)))
                    .collect(),
                policies: p.policies,
                keys: p.keys,
                batch_semantic: p.batch_semantic,
                batch_config: p.batches,
                batches: OnceLock::new(),
                metrics: Metrics::default(),
                shadows: p.shadows,
                started: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64),
            }),
        }
    }

    /// Starts each pool's autoscaler (on the current runtime), after giving the pools the
    /// meter for their replicas' spans.
    pub fn start_pools(&self, workload: &str) {
        for pool in self.inner.pools.values() {
            if let Some(meter) = &self.inner.meter {
                pool.attach(meter.clone(), workload.to_owned());
            }
            tokio::spawn(pool.clone().run());
        }
    }

    /// Stops every pool's replicas (draining them) and writes their last spans.
    pub async fn stop_pools(&self) {
        let pools: Vec<_> = self.inner.pools.values().cloned().collect();
        futures_util::future::join_all(pools.iter().map(|p| p.shutdown())).await;
    }

    /// Opens the Batch API's directory and resumes the batches a stopped server left
    /// unfinished (on the current runtime). A directory that cannot be opened (another
    /// server holds it, it is not writable) leaves this server without the Batch API: it
    /// says why in its log and in each Batch API answer, and serves the rest.
    pub fn start_batches(&self) {
        let Some(config) = &self.inner.batch_config else {
            return;
        };
        let opened = Batches::open(config.clone()).map(Arc::new);
        if let Err(e) = &opened {
            tracing::warn!("{}; this server has no Batch API", with_causes(e));
        }
        let opened = opened.map_err(|e| with_causes(&e));
        if let Ok(batches) = self.inner.batches.get_or_init(|| opened) {
            match batches.resume(self) {
                Ok(0) => {}
                Ok(n) => tracing::info!(batches = n, "resuming unfinished batches"),
                Err(e) => {
                    tracing::error!("cannot resume the unfinished batches: {}", with_causes(&e))
                }
            }
        }
    }

    /// Stops the batches' tasks, leaving each batch to resume at the next start.
    pub async fn stop_batches(&self) {
        if let Some(Ok(b)) = self.inner.batches.get() {
            b.stop().await;
        }
    }

    /// The Batch API, or why this server has none.
    pub(crate) fn batches(&self) -> Result<&Arc<Batches>, &str> {
        match self.inner.batches.get() {
            Some(Ok(b)) => Ok(b),
            Some(Err(why)) => Err(why),
            None => Err("it was not started"),
        }
    }

    /// The largest upload the Batch API takes.
    pub(crate) fn max_upload(&self) -> u64 {
        self.inner
            .batch_config
            .as_ref()
            .map_or(crate::batch::input::MAX_BYTES, |c| c.max_file_bytes)
    }

    pub(crate) fn pool(&self, name: &str) -> Option<&Arc<Pool>> {
        self.inner.pools.get(name)
    }

    /// The meter, for the caller to close once serving has stopped.
    pub fn meter(&self) -> Option<Meter> {
        self.inner.meter.clone()
    }

    /// `e`, counted as a request refused before any work.
    pub(crate) fn rejected(&self, e: ApiError) -> ApiError {
        self.inner
            .metrics
            .requests_rejected
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        e
    }

    /// The local model's name as clients use it ("" without one).
    pub fn local_name(&self) -> &str {
        self.inner.local.as_ref().map_or("", |l| &l.machine.model)
    }

    pub(crate) fn local(&self) -> Option<Arc<dyn Backend>> {
        self.inner.local.clone().map(|l| -> Arc<dyn Backend> { l })
    }

    /// A backend other than the local model, by the name clients use.
    pub(crate) fn upstream(&self, name: &str) -> Option<Arc<dyn Backend>> {
        self.inner
            .upstreams
            .get(name)
            .cloned()
            .map(|u| -> Arc<dyn Backend> { u })
            .or_else(|| self.inner.backends.get(name).cloned())
    }

    /// The backend or route a request names: the local model by its name, "default" or no
    /// name; an upstream; a cascade route.
    pub(crate) fn target(&self, job: &Job) -> Result<Target, ApiError> {
        let unknown = || ApiError::UnknownModel(job.model().unwrap_or("default").to_owned());
        let Some(name) = job.model() else {
            return self.local().map(Target::Backend).ok_or_else(unknown);
        };
        if let Some(route) = self.inner.routes.get(name) {
            if job.common.stream && job.top.is_some() {
                // Its first tier's answer is judged before it is sent.
                return Err(ApiError::InvalidParam {
                    param: "logprobs",
                    message: format!(
                        "route {} does not stream logprobs; ask without stream",
                        route.name
                    ),
                });
            }
            return Ok(Target::Cascade(route.clone()));
        }
        if let Some(local) = self.inner.local.as_ref().filter(|l| l.answers_to(name)) {
            return Ok(Target::Backend(local.clone()));
        }
        self.upstream(name).map(Target::Backend).ok_or_else(|| {
            if self.inner.embedder.is_some() && LocalEmbedder::answers_to(name) {
                embed::only_embeddings()
            } else {
                unknown()
            }
        })
    }

    /// What answers an embeddings request naming `model`: an upstream by its name (which
    /// may or may not serve embeddings: it says), else the local embedder, by its name, no
    /// name, or any name no other model has when there are no upstreams (it is then the
    /// only embedding model).
    pub(crate) fn embedding_target(&self, model: Option<&str>) -> Result<EmbedTarget, ApiError> {
        let inner = &self.inner;
        if let Some(up) = model.and_then(|m| inner.upstreams.get(m)) {
            return Ok(EmbedTarget::Upstream(up.clone()));
        }
        let text_model = model.is_some_and(|m| {
            inner.backends.contains_key(m)
                || inner.routes.contains_key(m)
                || inner.local.as_ref().is_some_and(|l| l.answers_to(m))
        });
        if let (Some(m), true) = (model, text_model) {
            return Err(ApiError::InvalidParam {
                param: "model",
                message: match &inner.embedder {
                    Some(_) => format!("`{m}` does not serve embeddings; `{}` does", embed::NAME),
                    None => format!("`{m}` does not serve embeddings"),
                },
            });
        }
        let Some(local) = inner.embedder.clone() else {
            return Err(match model {
                Some(m) if !LocalEmbedder::answers_to(m) => ApiError::UnknownModel(m.to_owned()),
                _ => ApiError::NotFound {
                    param: Some("model"),
                    message: if inner.local.is_some() {
                        format!(
                            "no local embedding model: `scripts/fetch-models.sh minilm` fetches {}, --embedder DIR names its folder",
                            embed::NAME
                        )
                    } else {
                        "a gateway without a local model (--no-model) embeds with its upstreams: name one that serves embeddings".into()
                    },
                },
            });
        };
        match model {
            Some(m) if !LocalEmbedder::answers_to(m) && !inner.upstreams.is_empty() => {
                Err(ApiError::UnknownModel(m.to_owned()))
            }
            _ => Ok(EmbedTarget::Local(local)),
        }
    }

    pub(crate) fn policy(&self, name: &str) -> CachePolicy {
        self.inner.policies.get(name).copied().unwrap_or_default()
    }

    /// Brings each tenant's spend up to what `spent_since` (a ledger other gateways write
    /// too) says: budgets without Redis see the other replicas' spend, late.
    /// `/metrics` says whether it did (`frugal_budget_shared`) and how long ago.
    pub fn catch_up_budgets<E>(
        &self,
        spent_since: impl Fn(DateTime<Utc>) -> Result<Vec<(String, Money)>, E>,
    ) -> Result<(), E> {
        let now = Utc::now();
        let read = self.inner.keys.catch_up(now, spent_since);
        let m = &self.inner.metrics;
        m.catch_up_failing.store(read.is_err(), Ordering::Relaxed);
        if read.is_ok() {
            m.catch_up_at_ms
                .store(now.timestamp_millis(), Ordering::Relaxed);
        }
        read
    }

    /// Swaps in the keys and budgets of a re-read config (`Err`: why it was refused; the
    /// keys stay as they are), counted in `frugal_config_reloads_total`, and starts tenants
    /// new to this gateway from their spend this day and month by `spent_since` (the
    /// ledger's). What changed (or why not), for the caller to say. A config that would
    /// drop every key is refused unless it says `allow_open` (logged as an error, counted
    /// in `frugal_key_reloads_refused_total` too).
    pub fn reload_keys<E: std::fmt::Display>(
        &self,
        keys: Result<KeySet, String>,
        spent_since: impl Fn(DateTime<Utc>) -> Result<Vec<(String, Money)>, E>,
    ) -> Result<Changes, String> {
        let m = &self.inner.metrics;
        let keys = keys.inspect_err(|_| {
            m.reloads_failed.fetch_add(1, Ordering::Relaxed);
        })?;
        let changes = self.inner.keys.reload_set(&keys).map_err(|e| {
            m.reloads_failed.fetch_add(1, Ordering::Relaxed);
            m.reloads_refused_open.fetch_add(1, Ordering::Relaxed);
            tracing::error!("refused to open the API on a config reload: {e}");
            e.to_string()
        })?;
        m.reloads_ok.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = crate::admit::keys::preload(&changes.new_tenants, Utc::now(), spent_since) {
            tracing::warn!(
                "the new tenants' spend could not be read from the ledger, they start from $0: {e}"
            );
        }
        Ok(changes)
    }

    /// The request's tenant (when keys are configured), if its key is valid and its
    /// budgets have room.
    pub(crate) fn admit(&self, headers: &HeaderMap) -> Result<Option<Arc<Tenant>>, ApiError> {
        let tenant = self.inner.keys.authenticate(headers)?;
        if let Some(t) = &tenant {
            t.admit(chrono::Utc::now())?;
        }
        Ok(tenant)
    }

    /// How a request meets the cache, as `model` (the served name its answer is kept
    /// under): entries are namespaced by tenant unless the policy shares them.
    pub(crate) fn lookup(
        &self,
        job: &Job,
        model: &str,
        tenant: Option<&Tenant>,
        headers: &HeaderMap,
        policy: CachePolicy,
    ) -> Lookup {
        // Logprobs are not parsed from upstreams (or pools' servers), so such answers are
        // not kept.
        if (self.inner.upstreams.contains_key(model) || self.inner.pools.contains_key(model))
            && job.body["logprobs"].as_bool().unwrap_or(false)
        {
            return Lookup::Bypass;
        }
        let mut lookup =
            self.key_lookup(&job.body, job.kind.path(), model, tenant, headers, policy);
        if let Lookup::Key {
            probe: Some(probe), ..
        } = &mut lookup
        {
            probe.threshold = policy.semantic_threshold;
            probe.max_error = policy.semantic_max_error;
        }
        if job.batch.is_some()
            && !self.inner.batch_semantic
            && let Lookup::Key { probe, .. } = &mut lookup
        {
            *probe = None;
        }
        lookup
    }

    /// How a request to `endpoint` with `body` meets the exact cache, as `model`.
    pub(crate) fn key_lookup(
        &self,
        body: &serde_json::Value,
        endpoint: &str,
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
        cache::lookup(body, endpoint, model, namespace, control)
    }
}
