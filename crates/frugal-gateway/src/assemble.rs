//! `[serve]` ([`RawServe`]) checked entry by entry: its upstreams (priced from the catalog),
//! cascade routes with their skip rules, keys, cache policies, the exact and semantic
//! caches' settings and the embedder, with errors that name the entry or key at fault.
//! [`crate::gateway`] puts the entries together.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use frugal_cloud::price::{self, PriceError, Request};
use frugal_cost::money::ParseMoneyError;
use frugal_cost::{Catalog, Money};
use frugal_semantic::{EmbedError, Embedder, Verifier};
use thiserror::Error;

use crate::admit::keys::{KeyConfig, KeySet};
use crate::backend::upstream::{Pricing, Upstream, UpstreamConfig};
use crate::cache::exact::{CacheConfig, CachePolicy};
use crate::cache::semantic::SemanticConfig;
use crate::cascade::learned::{RouterFile, RouterFileError};
use crate::cascade::route::{RouteConfig, Rule, Skip, SkipExample};
use crate::config::{RawKey, RawRoute, RawServe, RawUpstream};
use crate::jsonl::JsonLinesError;

/// Nearest skip examples that vote, unless a route says otherwise.
pub const DEFAULT_SKIP_K: usize = 8;

#[derive(Debug, Error)]
pub enum ConfigError {
    /// An entry's setting is wrong; `what` names the entry (route `auto`, upstream `gpt`,
    /// serve.key of tenant `acme`).
    #[error("{what}: {message}")]
    Invalid { what: String, message: String },
    /// A `[serve]` setting of its own is wrong.
    #[error("{0}")]
    Serve(String),
    #[error("{what}: {field}")]
    Money {
        what: String,
        field: &'static str,
        #[source]
        source: ParseMoneyError,
    },
    #[error("{what}")]
    Price {
        what: String,
        #[source]
        source: PriceError,
    },
    #[error("{what}")]
    SkipExamples {
        what: String,
        #[source]
        source: SkipExamplesError,
    },
    #[error("{what}: cannot read its router")]
    Router {
        what: String,
        #[source]
        source: RouterFileError,
    },
    #[error("{what}: cannot embed the skip examples")]
    EmbedSkipExamples {
        what: String,
        #[source]
        source: EmbedError,
    },
    #[error(transparent)]
    Embedder(#[from] EmbedderError),
}

#[derive(Debug, Error)]
pub enum SkipExamplesError {
    #[error(transparent)]
    Read(#[from] JsonLinesError),
    #[error("{} holds no examples", .0.display())]
    Empty(PathBuf),
}

#[derive(Debug, Error)]
pub enum EmbedderError {
    /// `also` ends the advice (", or --no-semantic-cache" where turning the cache off is
    /// the other way out).
    #[error(
        "no embedding model in {}: run `scripts/fetch-models.sh minilm`, pass --embedder DIR{also}",
        dir.display()
    )]
    Missing { dir: PathBuf, also: &'static str },
    #[error("cannot load the embedder from {}", dir.display())]
    Load {
        dir: PathBuf,
        #[source]
        source: EmbedError,
    },
}

pub(crate) fn invalid(what: String, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        what,
        message: message.into(),
    }
}

pub(crate) fn route_name(r: &RawRoute) -> String {
    format!("route `{}`", r.name)
}

/// The exact cache's bounds: `cache_mb` and `cache_ttl`, else the defaults.
pub fn cache_config(raw: &RawServe) -> CacheConfig {
    let defaults = CacheConfig::default();
    CacheConfig {
        max_bytes: raw.cache_mb.map_or(defaults.max_bytes, |mb| mb << 20),
        ttl: raw.cache_ttl.map_or(defaults.ttl, Duration::from_secs),
    }
}

/// The semantic cache's settings: `semantic_threshold`, `semantic_aligned_threshold`,
/// `semantic_entries`, `semantic_max_error`, `cache_ttl` (the verifier is loaded apart).
pub fn semantic_config(raw: &RawServe) -> Result<SemanticConfig, ConfigError> {
    let mut config = SemanticConfig::default();
    if let Some(t) = raw.semantic_threshold {
        let t = cosine_threshold(t).map_err(ConfigError::Serve)?;
        // The aligned pairs' threshold moves with it unless set too.
        config.guard = config.guard.at(t);
        config.floor = t;
    }
    if let Some(e) = raw.semantic_max_error {
        config.max_error = max_error(e).map_err(ConfigError::Serve)?;
    }
    if let Some(t) = raw.semantic_aligned_threshold {
        config.guard.aligned_threshold = cosine_threshold(t).map_err(ConfigError::Serve)?;
    }
    if let Some(ttl) = raw.cache_ttl {
        config.ttl = Duration::from_secs(ttl);
    }
    if let Some(n) = raw.semantic_entries {
        if n == 0 {
            return Err(ConfigError::Serve(
                "semantic_entries must be at least 1; `semantic_cache = false` turns it off".into(),
            ));
        }
        config.max_entries = n;
    }
    Ok(config)
}

/// An error budget's bound, checked: a share in [0, 1).
fn max_error(e: f64) -> Result<f64, String> {
    if !(0.0..1.0).contains(&e) {
        return Err(format!(
            "semantic_max_error must be a share of served hits in [0, 1), such as 0.01, not {e}"
        ));
    }
    Ok(e)
}

/// A `shadow_rate`, checked: a share in [0, 1].
pub fn shadow_rate(rate: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&rate) {
        Ok(rate)
    } else {
        Err(format!(
            "shadow_rate must be a share of cheap answers in [0, 1], such as 0.02, not {rate}"
        ))
    }
}

/// A semantic threshold, checked: a cosine in [0, 1].
fn cosine_threshold(t: f32) -> Result<f32, String> {
    if !(0.0..=1.0).contains(&t) {
        return Err(format!(
            "semantic_threshold must be a cosine between 0 and 1, not {t}"
        ));
    }
    Ok(t)
}

/// An upstream from its `[[serve.upstream]]` entry, priced from the catalog; `env` answers
/// its `api_key_env`.
pub fn upstream(
    raw: &RawUpstream,
    catalog: &Catalog,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Upstream, ConfigError> {
    let what = || format!("upstream `{}`", raw.name);
    let mut config = UpstreamConfig::new(&raw.name, &raw.url);
    if let Some(m) = &raw.model {
        config.model.clone_from(m);
    }
    if let Some(var) = &raw.api_key_env {
        config.api_key = Some(env(var).ok_or_else(|| {
            invalid(
                what(),
                format!("the environment variable {var} (api_key_env) is not set"),
            )
        })?);
    }
    config.pricing = if raw.price_per_hour.is_some() || raw.instance.is_some() {
        if raw.price.is_some() {
            return Err(invalid(
                what(),
                "price (per token) and price_per_hour or instance (per hour) exclude each other",
            ));
        }
        let hourly = Request::on_demand(raw.price_per_hour.as_deref(), raw.instance.as_deref());
        price::Pricing::given(catalog, &hourly)
            .map_err(|source| ConfigError::Price {
                what: what(),
                source,
            })?
            .map(|p| Pricing::Hourly {
                rate: p.rate,
                instance_type: p.instance_type,
            })
    } else {
        let price = raw.price.as_deref().unwrap_or(&config.model);
        let found = catalog.model(price).ok().cloned();
        if found.is_none() {
            tracing::warn!(
                upstream = %raw.name,
                price,
                "no [[model]] price for this upstream in the price files: its calls are recorded at $0"
            );
        }
        found.map(Pricing::Tokens)
    };
    if let Some(t) = raw.timeout_s {
        config.timeout = Duration::from_secs(t);
    }
    if let Some(r) = raw.retries {
        config.retries = r;
    }
    if let Some(n) = raw.max_output_tokens {
        config.max_output_tokens = n.max(1);
    }
    Upstream::new(config).map_err(|e| invalid(what(), e.to_string()))
}

/// Each served name's cache policy: the local model's from `[serve]`, then each upstream's
/// and route's own.
pub fn policies(raw: &RawServe, local: &str) -> Result<HashMap<String, CachePolicy>, ConfigError> {
    let entries = std::iter::once((local, raw.shared_cache, None, None))
        .chain(raw.upstream.iter().map(|u| {
            let n = u.name.as_str();
            (
                n,
                u.shared_cache,
                u.semantic_threshold,
                u.semantic_max_error,
            )
        }))
        .chain(raw.route.iter().map(|r| {
            let n = r.name.as_str();
            (
                n,
                r.shared_cache,
                r.semantic_threshold,
                r.semantic_max_error,
            )
        }))
        .chain(raw.pool.iter().map(|p| {
            let n = p.name.as_str();
            (
                n,
                p.shared_cache,
                p.semantic_threshold,
                p.semantic_max_error,
            )
        }));
    entries
        .map(|(name, shared, threshold, bound)| {
            let at = |e| invalid(format!("`{name}`"), e);
            let policy = CachePolicy {
                shared: shared.unwrap_or(false),
                semantic_threshold: threshold.map(cosine_threshold).transpose().map_err(at)?,
                semantic_max_error: bound.map(max_error).transpose().map_err(at)?,
            };
            Ok((name.to_owned(), policy))
        })
        .collect()
}

/// A cascade from its `[[serve.route]]` entry: every tier but the last must be the local
/// model (its answers carry the logprobs the confidence is read from), the last the local
/// model or one of `served` (an upstream or a pool). A skip rule needs `embedder`; `searched` is where one was looked
/// for, named when none was found.
pub fn route(
    raw: &RawRoute,
    local: &str,
    served: &[&str],
    embedder: Option<&Arc<Embedder>>,
    searched: &[PathBuf],
) -> Result<RouteConfig, ConfigError> {
    let what = route_name(raw);
    let Some((last, first)) = raw.tiers.split_last() else {
        return Err(invalid(
            what,
            "tiers is empty; list the models cheapest first",
        ));
    };
    if raw.name == local || served.contains(&raw.name.as_str()) {
        return Err(invalid(
            what,
            "the name is already a model's; pick another (e.g. \"auto\")",
        ));
    }
    if let Some(t) = first.iter().find(|t| *t != local) {
        return Err(invalid(
            what,
            format!(
                "tier `{t}` must be the local model `{local}`: only its answers carry the logprobs a cascade judges (the last tier may be an upstream)"
            ),
        ));
    }
    if last != local && !served.contains(&last.as_str()) {
        return Err(invalid(
            what,
            format!(
                "the last tier `{last}` is neither the local model nor a [[serve.upstream]] or [[serve.pool]]"
            ),
        ));
    }
    let quantile = raw.quantile.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&quantile) || raw.threshold > 0.0 || raw.threshold.is_nan() {
        return Err(invalid(
            what,
            "quantile must be in [0, 1] and threshold a logprob <= 0",
        ));
    }
    let rule = match (&raw.skip_examples, &raw.router) {
        (None, None) => None,
        (Some(_), Some(_)) => {
            return Err(invalid(
                what,
                "skip_examples and router are two skip rules: name one",
            ));
        }
        (Some(examples), None) => Some(SkipSource::Examples(examples)),
        (None, Some(router)) => Some(SkipSource::Router(router)),
    };
    let skip = if let Some(rule) = rule {
        if last == local {
            return Err(invalid(
                what,
                "a skip rule (skip_examples or router) needs an upstream last tier to skip to",
            ));
        }
        let below = raw.skip_below.unwrap_or(0.5);
        if !(0.0..=1.0).contains(&below) {
            return Err(invalid(
                what,
                format!("skip_below is a share in [0, 1], not {below}"),
            ));
        }
        let Some(embedder) = embedder else {
            let searched: Vec<String> = searched.iter().map(|d| d.display().to_string()).collect();
            return Err(invalid(
                what,
                format!(
                    "a skip rule needs the embedding model, and none is in {}: run `scripts/fetch-models.sh minilm` or pass --embedder DIR",
                    searched.join(" or ")
                ),
            ));
        };
        let skip = match rule {
            SkipSource::Examples(path) => {
                let examples =
                    read_skip_examples(path).map_err(|source| ConfigError::SkipExamples {
                        what: what.clone(),
                        source,
                    })?;
                let k = raw.skip_k.unwrap_or(DEFAULT_SKIP_K);
                Skip::new(embedder.clone(), &examples, k, below).map_err(|source| {
                    ConfigError::EmbedSkipExamples {
                        what: what.clone(),
                        source,
                    }
                })?
            }
            SkipSource::Router(path) => {
                let file = RouterFile::read(path).map_err(|source| ConfigError::Router {
                    what: what.clone(),
                    source,
                })?;
                if file.dim != embedder.dim() {
                    return Err(invalid(
                        what,
                        format!(
                            "router {} was trained on a {}-wide embedding, the embedder gives {}",
                            path.display(),
                            file.dim,
                            embedder.dim()
                        ),
                    ));
                }
                Skip {
                    rule: Rule::Learned {
                        router: file.router,
                        below,
                    },
                    embedder: embedder.clone(),
                }
            }
        };
        tracing::info!(route = %raw.name, below, "skip rule loaded");
        Some(Arc::new(skip))
    } else {
        None
    };
    Ok(RouteConfig {
        name: raw.name.clone(),
        tiers: raw.tiers.clone(),
        quantile,
        threshold: raw.threshold,
        skip,
        shadow_rate: raw
            .shadow_rate
            .map(shadow_rate)
            .transpose()
            .map_err(|m| invalid(what, m))?,
    })
}

/// Where a route's skip rule comes from.
enum SkipSource<'a> {
    Examples(&'a Path),
    Router(&'a Path),
}

/// A skip rule's examples: JSON lines of `{"prompt": ..., "ok": true|false}`.
pub fn read_skip_examples(path: &Path) -> Result<Vec<SkipExample>, SkipExamplesError> {
    let examples: Vec<SkipExample> = crate::jsonl::read(path, r#"{"prompt": TEXT, "ok": BOOL}"#)?;
    if examples.is_empty() {
        return Err(SkipExamplesError::Empty(path.to_owned()));
    }
    Ok(examples)
}

/// `[[serve.key]]`, checked: what [`assemble`] uses.
pub fn keys(raw: &RawServe) -> Result<Vec<KeyConfig>, ConfigError> {
    raw.key.iter().map(key).collect()
}

/// `[[serve.key]]` and `allow_open`, checked: what a reload swaps in.
pub fn key_set(raw: &RawServe) -> Result<KeySet, ConfigError> {
    Ok(KeySet {
        keys: keys(raw)?,
        allow_open: raw.allow_open.unwrap_or(false),
    })
}

/// A key from its `[[serve.key]]` entry: the hash must be hex SHA-256, the budgets dollars.
pub fn key(raw: &RawKey) -> Result<KeyConfig, ConfigError> {
    let what = || format!("serve.key of tenant `{}`", raw.tenant);
    let hex = raw.sha256.trim();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid(
            what(),
            "sha256 must be 64 hex digits (`frugal keys new` prints it)",
        ));
    }
    let usd = |field: &'static str, v: &Option<String>| -> Result<Option<Money>, ConfigError> {
        v.as_deref()
            .map(|s| {
                s.parse::<Money>().map_err(|source| ConfigError::Money {
                    what: what(),
                    field,
                    source,
                })
            })
            .transpose()
    };
    Ok(KeyConfig {
        tenant: raw.tenant.clone(),
        sha256: hex.to_ascii_lowercase(),
        daily: usd("daily_usd", &raw.daily_usd)?,
        monthly: usd("monthly_usd", &raw.monthly_usd)?,
    })
}

/// The embedder `named` (which must be there), else the first of `search` that holds one,
/// else none; with the folder it was loaded from.
pub fn find_embedder(
    named: Option<&Path>,
    search: &[PathBuf],
) -> Result<Option<(PathBuf, Arc<Embedder>)>, EmbedderError> {
    if let Some(dir) = named {
        return load_embedder(dir, ", or --no-semantic-cache").map(|e| Some((dir.to_owned(), e)));
    }
    search
        .iter()
        .find(|d| has_embedder(d))
        .map(|d| load_embedder(d, "").map(|e| (d.clone(), e)))
        .transpose()
}

/// The paraphrase verifier `[serve] semantic_verifier` names ("none": the guard alone), else
/// `default` (the one frugal ships) when it is there; on the embedder in `base`.
pub fn find_verifier(
    named: Option<&str>,
    default: Option<&Path>,
    base: &Path,
) -> Result<Option<Arc<Verifier>>, ConfigError> {
    let path = match named {
        Some("none") => return Ok(None),
        Some(p) => PathBuf::from(p),
        None => match default.filter(|d| d.exists()) {
            Some(d) => d.to_owned(),
            None => return Ok(None),
        },
    };
    Verifier::load(base, &path)
        .map(|v| Some(Arc::new(v)))
        .map_err(|e| {
            invalid(
                "serve.semantic_verifier".into(),
                format!("{e}; semantic_verifier = \"none\" serves with the guard alone"),
            )
        })
}

/// Whether `dir` holds an embedding model's weights.
pub fn has_embedder(dir: &Path) -> bool {
    dir.join("model.safetensors").exists()
}

/// The embedding model in `dir`; `also` ends the advice of the missing-model error.
pub fn load_embedder(dir: &Path, also: &'static str) -> Result<Arc<Embedder>, EmbedderError> {
    if !has_embedder(dir) {
        return Err(EmbedderError::Missing {
            dir: dir.to_owned(),
            also,
        });
    }
    let embedder = Embedder::load(dir).map_err(|source| EmbedderError::Load {
        dir: dir.to_owned(),
        source,
    })?;
    Ok(Arc::new(embedder))
}

#[cfg(test)]
mod tests {
    use frugal_cost::causes::with_causes;

    use super::*;
    use crate::gateway::{Assembly, Inputs, assemble};

    fn catalog() -> Catalog {
        let prices = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/prices.toml");
        Catalog::load(&[prices]).unwrap()
    }

    /// `[serve]` from TOML, as `frugal.toml` holds it (without the `[serve]` header).
    fn raw(text: &str) -> RawServe {
        toml::from_str(text).unwrap()
    }

    fn env(var: &str) -> Option<String> {
        (var == "MOCK_KEY").then(|| "sk-mock".to_owned())
    }

    fn build(raw: &RawServe, local: Option<&str>) -> Result<Assembly, ConfigError> {
        let catalog = catalog();
        assemble(
            raw,
            &Inputs {
                catalog: &catalog,
                local,
                env: &env,
                embedder_search: &[],
                pool_logs: Path::new("."),
                verifier: None,
            },
        )
    }

    /// The message assembling `text` (with the semantic cache off, so no embedder is
    /// needed) fails with, beside a local model named `small`.
    fn refused(text: &str) -> String {
        let mut raw = raw(text);
        raw.semantic_cache.get_or_insert(false);
        match build(&raw, Some("small")) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => with_causes(&e),
        }
    }

    const MOCK: &str = "[[upstream]]\nname = \"mock\"\nurl = \"http://127.0.0.1:9/v1\"\n";

    #[test]
    fn unknown_keys_are_refused_by_their_dotted_path() {
        for (text, path, field) in [
            ("cahce = true\n", "cahce", "cahce"),
            (
                &format!("{MOCK}api_key = \"sk\"\n") as &str,
                "upstream[0].api_key",
                "api_key",
            ),
            (
                "[[route]]\nname = \"auto\"\ntiers = [\"a\"]\nthreshold = -1.0\nskip = 3\n",
                "route[0].skip",
                "skip",
            ),
            (
                "[[key]]\ntenant = \"t\"\nsha256 = \"x\"\ndaily = \"1\"\n",
                "key[0].daily",
                "daily",
            ),
        ] {
            let de = toml::Deserializer::parse(text).unwrap();
            let err = serde_path_to_error::deserialize::<_, RawServe>(de).unwrap_err();
            assert_eq!(err.path().to_string(), path, "{text}");
            assert!(
                err.inner()
                    .to_string()
                    .contains(&format!("unknown field `{field}`")),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn upstreams_are_priced_by_the_token_or_the_hour_not_both() {
        let a = build(
            &raw(&format!(
                "semantic_cache = false\n{MOCK}model = \"gpt-4o-mini\"\napi_key_env = \"MOCK_KEY\"\n\n[[upstream]]\nname = \"own\"\nurl = \"http://127.0.0.1:9/v1\"\nprice_per_hour = \"2.5\"\n"
            )),
            Some("small"),
        )
        .unwrap();
        let [mock, own] = &a.upstreams[..] else {
            panic!("two upstreams")
        };
        assert_eq!(mock.config.api_key.as_deref(), Some("sk-mock"));
        assert!(matches!(mock.config.pricing, Some(Pricing::Tokens(_))));
        assert!(matches!(
            &own.config.pricing,
            Some(Pricing::Hourly { rate, instance_type: None }) if rate.0 == "2.5".parse().unwrap()
        ));
        assert!(
            own.machine().is_some(),
            "an hourly upstream's machine is metered"
        );

        for (extra, want) in [
            (
                "price = \"gpt-4o-mini\"\nprice_per_hour = \"2.0\"\n",
                "upstream `mock`: price (per token) and price_per_hour or instance (per hour) exclude each other",
            ),
            (
                "price_per_hour = \"-1\"\n",
                "upstream `mock`: price_per_hour: a price cannot be negative",
            ),
            (
                "price_per_hour = \"two\"\n",
                "upstream `mock`: price_per_hour: `two` is not a decimal number",
            ),
            ("instance = \"no-such-machine\"\n", "no-such-machine"),
            (
                "api_key_env = \"UNSET_KEY\"\n",
                "upstream `mock`: the environment variable UNSET_KEY (api_key_env) is not set",
            ),
        ] {
            let err = refused(&format!("{MOCK}{extra}"));
            assert!(err.contains(want), "{extra}: {err}");
        }
    }

    #[test]
    fn thresholds_and_bounds_are_checked() {
        for (text, want) in [
            (
                "semantic_threshold = 1.5\n".to_owned(),
                "semantic_threshold must be a cosine between 0 and 1, not 1.5",
            ),
            (
                "semantic_entries = 0\n".to_owned(),
                "semantic_entries must be at least 1; `semantic_cache = false` turns it off",
            ),
            (
                format!("{MOCK}semantic_threshold = -0.1\n"),
                "`mock`: semantic_threshold must be a cosine between 0 and 1, not -0.1",
            ),
            (
                "[[route]]\nname = \"auto\"\ntiers = [\"small\", \"small\"]\nthreshold = -1.0\nsemantic_threshold = 2.0\n"
                    .to_owned(),
                "`auto`: semantic_threshold must be a cosine",
            ),
            (
                "[[route]]\nname = \"auto\"\ntiers = [\"small\", \"small\"]\nthreshold = 0.5\n"
                    .to_owned(),
                "route `auto`: quantile must be in [0, 1] and threshold a logprob <= 0",
            ),
            (
                "[[route]]\nname = \"auto\"\ntiers = [\"small\", \"small\"]\nthreshold = -1.0\nquantile = 1.5\n"
                    .to_owned(),
                "route `auto`: quantile must be in [0, 1]",
            ),
        ] {
            let err = refused(&text);
            assert!(err.contains(want), "{text}: {err}");
        }
        // The caches' settings and the policies, when right.
        let a = build(
            &raw(&format!(
                "semantic_cache = false\ncache_mb = 8\ncache_ttl = 60\nshared_cache = true\ncache_redis = \"redis://127.0.0.1:6379/\"\n{MOCK}semantic_threshold = 0.9\n"
            )),
            Some("small"),
        )
        .unwrap();
        let cache = a.cache.as_ref().unwrap();
        assert_eq!(
            (cache.max_bytes, cache.ttl),
            (8 << 20, Duration::from_secs(60))
        );
        assert_eq!(a.shared_cache.as_deref(), Some("redis://127.0.0.1:6379/"));
        assert!(a.policies["small"].shared);
        assert_eq!(a.policies["mock"].semantic_threshold, Some(0.9));
        assert!(a.semantic.is_none() && !a.no_embedder);
        // With the exact cache off there is nothing to share.
        let a = build(
            &raw("cache = false\ncache_redis = \"redis://127.0.0.1:6379/\"\n"),
            Some("small"),
        )
        .unwrap();
        assert!(a.cache.is_none() && a.shared_cache.is_none() && !a.no_embedder);
    }

    #[test]
    fn route_tiers_start_at_the_local_model_and_end_at_a_known_one() {
        let route = |tiers: &str, extra: &str| {
            format!(
                "{MOCK}\n[[route]]\nname = \"auto\"\ntiers = {tiers}\nthreshold = -1.0\n{extra}"
            )
        };
        for (text, want) in [
            (
                route("[]", ""),
                "route `auto`: tiers is empty; list the models cheapest first",
            ),
            (
                route("[\"mock\", \"small\"]", ""),
                "route `auto`: tier `mock` must be the local model `small`",
            ),
            (
                route("[\"small\", \"nowhere\"]", ""),
                "route `auto`: the last tier `nowhere` is neither the local model nor a [[serve.upstream]] or [[serve.pool]]",
            ),
            (
                format!(
                    "{MOCK}\n[[route]]\nname = \"mock\"\ntiers = [\"small\", \"mock\"]\nthreshold = -1.0\n"
                ),
                "route `mock`: the name is already a model's",
            ),
            (
                route("[\"small\", \"small\"]", "skip_examples = \"skip.jsonl\"\n"),
                "route `auto`: a skip rule (skip_examples or router) needs an upstream last tier to skip to",
            ),
            (
                route(
                    "[\"small\", \"mock\"]",
                    "skip_examples = \"skip.jsonl\"\nskip_below = 2.0\n",
                ),
                "route `auto`: skip_below is a share in [0, 1], not 2",
            ),
            (
                route("[\"small\", \"mock\"]", "skip_examples = \"skip.jsonl\"\n"),
                "route `auto`: a skip rule needs the embedding model, and none is in",
            ),
        ] {
            let err = refused(&text);
            assert!(err.contains(want), "{text}: {err}");
        }
        let a = build(
            &raw(&format!(
                "semantic_cache = false\n{}",
                route("[\"small\", \"mock\"]", "quantile = 0.25\n")
            )),
            Some("small"),
        )
        .unwrap();
        let [r] = &a.routes[..] else {
            panic!("one route")
        };
        assert_eq!((r.quantile, r.threshold), (0.25, -1.0));
        assert_eq!(r.tiers, ["small", "mock"]);
        assert!(r.skip.is_none());
        // A gateway without a local model has no cascade to start, and serves upstreams.
        let no_model = |text: &str| match build(&raw(text), None) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => with_causes(&e),
        };
        assert!(
            no_model(&route("[\"small\", \"mock\"]", ""))
                .contains("route `auto`: a cascade starts at the local model")
        );
        assert!(no_model("").contains("--no-model serves the [[serve.upstream]] servers"));
    }

    #[test]
    fn skip_examples_are_read_strictly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("skip.jsonl");
        std::fs::write(&path, "{\"prompt\": 3}\n").unwrap();
        let err = with_causes(&read_skip_examples(&path).unwrap_err());
        assert!(
            err.contains("skip.jsonl line 1: expected {\"prompt\": TEXT, \"ok\": BOOL}"),
            "{err}"
        );
        std::fs::write(&path, "\n").unwrap();
        let err = with_causes(&read_skip_examples(&path).unwrap_err());
        assert!(err.ends_with("skip.jsonl holds no examples"), "{err}");
        std::fs::write(
            &path,
            "{\"prompt\": \"What is 1 plus 2?\", \"ok\": false}\n",
        )
        .unwrap();
        assert_eq!(read_skip_examples(&path).unwrap().len(), 1);
        let err = with_causes(&read_skip_examples(&dir.path().join("none.jsonl")).unwrap_err());
        assert!(err.starts_with("cannot read "), "{err}");
    }

    #[test]
    fn keys_hold_a_hex_sha256_and_dollar_budgets() {
        let hash = crate::admit::keys::hash_key("sk-test");
        let key = |sha256: &str, extra: &str| {
            format!(
                "semantic_cache = false\n[[key]]\ntenant = \"acme\"\nsha256 = \"{sha256}\"\n{extra}"
            )
        };
        let good = raw(&key(&hash.to_uppercase(), "daily_usd = \"1.50\"\n"));
        let k = super::key(&good.key[0]).unwrap();
        assert_eq!(k.sha256, hash, "stored lowercase");
        assert_eq!(k.daily, Some("1.50".parse().unwrap()));
        assert_eq!(k.monthly, None);
        assert!(build(&good, Some("small")).is_ok());
        for (text, want) in [
            (
                key(&hash[..63], ""),
                "serve.key of tenant `acme`: sha256 must be 64 hex digits (`frugal keys new` prints it)",
            ),
            (
                key(&format!("{}g", &hash[..63]), ""),
                "sha256 must be 64 hex digits",
            ),
            (
                key(&hash, "monthly_usd = \"lots\"\n"),
                "serve.key of tenant `acme`: monthly_usd: `lots` is not a decimal number",
            ),
            (
                "budget_redis = \"redis://127.0.0.1:6379/\"\n".into(),
                "serve.budget_redis: shares the budgets of [[serve.key]] tenants, and none is configured",
            ),
        ] {
            let err = refused(&text);
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn an_embedder_not_found_turns_the_semantic_cache_off_but_a_named_one_must_be_there() {
        let dir = tempfile::tempdir().unwrap();
        let nowhere = dir.path().join("minilm");
        let catalog = catalog();
        let inputs = |search| Inputs {
            catalog: &catalog,
            local: Some("small"),
            env: &env,
            embedder_search: search,
            pool_logs: Path::new("."),
            verifier: None,
        };
        let a = assemble(&raw(""), &inputs(std::slice::from_ref(&nowhere))).unwrap();
        assert!(a.no_embedder && a.semantic.is_none() && a.cache.is_some());
        let named = raw(&format!("embedder = \"{}\"\n", nowhere.display()));
        let err = with_causes(&assemble(&named, &inputs(&[])).err().unwrap());
        assert!(
            err.contains(&format!("no embedding model in {}", nowhere.display()))
                && err.contains("--no-semantic-cache"),
            "{err}"
        );
        // The search takes the first folder that holds one.
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(frugal_semantic::DEFAULT_EMBEDDER);
        assert!(has_embedder(&repo), "run scripts/fetch-models.sh minilm");
        let a = assemble(&raw(""), &inputs(&[nowhere.clone(), repo])).unwrap();
        assert!(!a.no_embedder && a.semantic.is_some());
    }
}
