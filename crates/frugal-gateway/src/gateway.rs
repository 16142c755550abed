//! A gateway from `[serve]` ([`RawServe`]): each entry checked ([`crate::assemble`]), the
//! pools built, and the whole into the [`Parts`] a gateway serves.
//!
//! What needs the process stays with the caller: the environment (an upstream's
//! `api_key_env` is looked up through [`Inputs::env`]), the local model and its engine, the
//! meter, the shared cache's connection (it needs the runtime) and printing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use frugal_cost::Catalog;

use crate::admit::budget::SharedBudgets;
use crate::admit::keys::{KeyConfig, Keys};
use crate::assemble::{
    ConfigError, cache_config, find_embedder, find_verifier, has_embedder, invalid, keys, policies,
    route, route_name, semantic_config, shadow_rate, upstream,
};
use crate::backend::Local;
use crate::backend::embed;
use crate::backend::upstream::Upstream;
use crate::cache::exact::{CacheConfig, CachePolicy, ExactCache};
use crate::cache::semantic::SemanticCache;
use crate::cache::shared::SharedCache;
use crate::cascade::route::RouteConfig;
use crate::config::RawServe;
use crate::meter::Meter;
use crate::pool::Pool;
use crate::pool::settings::pool as pool_settings;
use crate::request::shadow::draw::{Examples, Shadows};
use crate::request::state::Parts;

/// What assembly takes besides `[serve]`, resolved by the caller.
pub struct Inputs<'a> {
    /// Prices upstreams: their tokens' `[[model]]` or their machine's instance type.
    pub catalog: &'a Catalog,
    /// The local model's served name; `None`: a gateway to its upstreams alone.
    pub local: Option<&'a str>,
    /// An environment variable's value (for `api_key_env`): libraries do not read the
    /// environment, the binary does and answers here.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// Where to look for the embedder when `[serve] embedder` names none, in order (e.g.
    /// `models/minilm`, then the user's data folder's).
    pub embedder_search: &'a [PathBuf],
    /// Where process pools' replicas log, unless a pool names its own `log_dir`.
    pub pool_logs: &'a Path,
    /// The paraphrase verifier read when `[serve] semantic_verifier` names none; `None` or
    /// not there: the guard alone decides.
    pub verifier: Option<&'a Path>,
}

/// A gateway's parts from `[serve]`, checked; [`Assembly::into_parts`] adds what the caller
/// runs (the local model, the meter, the shared cache's connection).
pub struct Assembly {
    pub upstreams: Vec<Upstream>,
    pub routes: Vec<RouteConfig>,
    pub policies: HashMap<String, CachePolicy>,
    pub keys: Vec<KeyConfig>,
    /// A Redis URL where the tenants' budgets are shared with other replicas.
    pub budget_redis: Option<String>,
    /// `None`: the exact cache (and so the semantic cache) is off.
    pub cache: Option<CacheConfig>,
    pub semantic: Option<SemanticCache>,
    /// The semantic cache was wanted but no embedder was named or found where searched,
    /// so it is off: the caller says so.
    pub no_embedder: bool,
    /// The embedder `/v1/embeddings` answers with beside a local model: the one loaded,
    /// else the folder where one was found (loaded on the first request).
    pub embeddings: Option<embed::Source>,
    /// A Redis URL for the exact cache's shared level (with the exact cache on), to connect
    /// to with the cache's TTL.
    pub shared_cache: Option<String>,
    /// Pools of replicas, not yet started.
    pub pools: Vec<Arc<Pool>>,
    pub batch_semantic: bool,
    /// `[serve] batch_max_active`.
    pub batch_max_active: usize,
    /// `[serve] batch_upload_quota_mb`, in bytes.
    pub batch_upload_quota: u64,
    /// `[serve] shadow_rate`.
    pub shadow_rate: f64,
    /// `[serve] shadow_examples`, open to append to.
    pub shadow_examples: Option<Examples>,
}

impl Assembly {
    /// `budgets`: the connection for `budget_redis`.
    pub fn into_parts(
        self,
        local: Option<Local>,
        meter: Option<Meter>,
        shared: Option<SharedCache>,
        budgets: Option<Arc<SharedBudgets>>,
    ) -> Parts {
        Parts {
            local,
            embedder: self.embeddings,
            meter,
            cache: self.cache.map(ExactCache::new),
            semantic: self.semantic,
            shared,
            upstreams: self.upstreams,
            routes: self.routes,
            policies: self.policies,
            keys: Keys::with_budgets(&self.keys, budgets),
            backends: Vec::new(),
            pools: self.pools,
            batch_semantic: self.batch_semantic,
            batches: None,
            shadows: Shadows::new(self.shadow_rate, seed()).with_examples(self.shadow_examples),
        }
    }
}

/// Checks `[serve]` and builds what it describes; the embedder is loaded (and the skip
/// examples embedded) only when the semantic cache or a route's skip rule needs it.
pub fn assemble(raw: &RawServe, inputs: &Inputs<'_>) -> Result<Assembly, ConfigError> {
    if inputs.local.is_none() {
        if raw.upstream.is_empty() && raw.pool.is_empty() {
            return Err(ConfigError::Serve(
                "--no-model serves the [[serve.upstream]] servers and [[serve.pool]] pools, and frugal.toml names none"
                    .into(),
            ));
        }
        if let Some(r) = raw.route.first() {
            return Err(invalid(
                route_name(r),
                "a cascade starts at the local model; drop --no-model or the route",
            ));
        }
    }
    let local = inputs.local.unwrap_or_default();
    let upstreams = raw
        .upstream
        .iter()
        .map(|u| upstream(u, inputs.catalog, inputs.env))
        .collect::<Result<Vec<_>, _>>()?;
    let pools = pools(raw, inputs)?;
    let cache = raw.cache.unwrap_or(true).then(|| cache_config(raw));
    let mut semantic_config = semantic_config(raw)?;
    let wants_semantic = cache.is_some() && raw.semantic_cache.unwrap_or(true);
    // One embedder for the semantic cache and the routes' skip rules.
    let embedder = if wants_semantic
        || raw
            .route
            .iter()
            .any(|r| r.skip_examples.is_some() || r.router.is_some())
    {
        find_embedder(raw.embedder.as_deref(), inputs.embedder_search)?
    } else {
        None
    };
    if let Some((dir, _)) = embedder.as_ref().filter(|_| wants_semantic) {
        semantic_config.verifier =
            find_verifier(raw.semantic_verifier.as_deref(), inputs.verifier, dir)?;
        // The floor chosen with the verifier's calibration, unless the config sets one.
        if let Some(v) = &semantic_config.verifier
            && raw.semantic_threshold.is_none()
        {
            semantic_config.floor = v.floor;
        }
    }
    let embedder = embedder.map(|(_, e)| e);
    let semantic = embedder
        .as_ref()
        .filter(|_| wants_semantic)
        .map(|e| SemanticCache::new(e.clone(), semantic_config));
    // Beside a local model, which prices its machine time; a gateway alone embeds with its
    // upstreams.
    let embeddings = match &embedder {
        _ if inputs.local.is_none() => None,
        Some(e) => Some(embed::Source::Loaded(e.clone())),
        None => match &raw.embedder {
            Some(named) => Some(named).filter(|d| has_embedder(d)),
            None => inputs.embedder_search.iter().find(|d| has_embedder(d)),
        }
        .map(|d| embed::Source::At(d.clone())),
    };
    let keys = keys(raw)?;
    if raw.budget_redis.is_some() && keys.is_empty() {
        return Err(invalid(
            "serve.budget_redis".into(),
            "shares the budgets of [[serve.key]] tenants, and none is configured",
        ));
    }
    let policies = policies(raw, local)?;
    // What a route's last tier may be besides the local model.
    let served: Vec<&str> = upstreams
        .iter()
        .map(|u| u.config.name.as_str())
        .chain(pools.iter().map(|p| p.config.name.as_str()))
        .collect();
    let routes = raw
        .route
        .iter()
        .map(|r| route(r, local, &served, embedder.as_ref(), inputs.embedder_search))
        .collect::<Result<Vec<_>, _>>()?;
    let shadow_rate = raw
        .shadow_rate
        .map(shadow_rate)
        .transpose()
        .map_err(ConfigError::Serve)?
        .unwrap_or(0.0);
    let shadow_examples = raw
        .shadow_examples
        .as_deref()
        .map(|path| {
            Examples::open(path).map_err(|e| {
                invalid(
                    "serve.shadow_examples".into(),
                    format!("cannot open {} to append to: {e}", path.display()),
                )
            })
        })
        .transpose()?;
    Ok(Assembly {
        shadow_rate,
        shadow_examples,
        upstreams,
        routes,
        policies,
        keys,
        budget_redis: raw.budget_redis.clone(),
        no_embedder: wants_semantic && embedder.is_none(),
        embeddings,
        shared_cache: raw.cache_redis.clone().filter(|_| cache.is_some()),
        cache,
        semantic,
        pools,
        batch_semantic: raw.batch_semantic_cache.unwrap_or(false),
        batch_max_active: raw
            .batch_max_active
            .unwrap_or(crate::batch::service::DEFAULT_MAX_ACTIVE),
        batch_upload_quota: raw
            .batch_upload_quota_mb
            .map_or(crate::batch::service::DEFAULT_UPLOAD_QUOTA, |mb| {
                mb.saturating_mul(1 << 20)
            }),
    })
}

/// A seed for the shadows' draws: this start's own.
fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The pools, checked: a name is served once, whatever serves it.
fn pools(raw: &RawServe, inputs: &Inputs<'_>) -> Result<Vec<Arc<Pool>>, ConfigError> {
    let mut names: Vec<&str> = inputs.local.into_iter().collect();
    names.extend(raw.upstream.iter().map(|u| u.name.as_str()));
    names.extend(raw.route.iter().map(|r| r.name.as_str()));
    raw.pool
        .iter()
        .map(|p| {
            if names.contains(&p.name.as_str()) {
                return Err(invalid(
                    format!("pool `{}`", p.name),
                    "another model, upstream, route or pool is served under this name",
                ));
            }
            names.push(&p.name);
            let mut config = pool_settings(p, inputs.catalog)?;
            config.prefix_cache = raw.prefix_cache.unwrap_or(true);
            config.speculate = raw.speculate.unwrap_or(crate::config::DEFAULT_SPECULATE);
            Pool::new(config, inputs.pool_logs.to_owned())
                .map_err(|e| invalid(format!("pool `{}`", p.name), e.to_string()))
        })
        .collect()
}
