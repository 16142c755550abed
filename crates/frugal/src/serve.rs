//! `frugal serve`: load the model, start the engine and the meter, listen until Ctrl-C or
//! SIGTERM, then drain.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use frugal_cost::money::HourlyRate;
use frugal_cost::{Capacity, Catalog, Money};
use frugal_engine::gguf::Gguf;
use frugal_engine::model::{LoadOptions, Model};
use frugal_engine::quant::WeightType;
use frugal_engine::scheduler::{Batching, Engine, SchedulerConfig};
use frugal_engine::template::ChatTemplate;
use frugal_engine::tokenizer::Tokenizer;
use frugal_gateway::cache::{CacheConfig, CachePolicy, ExactCache};
use frugal_gateway::keys::{KeyConfig, Keys};
use frugal_gateway::meter::{Machine, Meter, MeterConfig};
use frugal_gateway::route::{RouteConfig, Skip, SkipExample};
use frugal_gateway::semantic::{SemanticCache, SemanticConfig};
use frugal_gateway::shared::SharedCache;
use frugal_gateway::upstream::{Pricing, Upstream, UpstreamConfig};
use frugal_gateway::{AppState, Local, Parts};
use frugal_semantic::Embedder;

use crate::cli::{BatchingArg, QuantArg, ServeArgs};
use crate::config::{Config, RawKey, RawRoute, RawServe, RawUpstream};

pub fn run(config: &Config, catalog: &Catalog, args: &ServeArgs) -> Result<()> {
    // Flags beat `[serve]` in frugal.toml, which beats the defaults.
    let file = &config.serve;
    let price_per_hour = args
        .price_per_hour
        .as_deref()
        .or(file.price_per_hour.as_deref());
    let instance = args.instance.as_deref().or(file.instance.as_deref());
    let host = args
        .host
        .as_deref()
        .or(file.host.as_deref())
        .unwrap_or("127.0.0.1");
    let port = args.port.or(file.port).unwrap_or(8080);
    let workload = args
        .workload
        .clone()
        .or_else(|| file.workload.clone())
        .unwrap_or_else(|| "serve".into());
    // Only a local model runs on this machine (a gateway's costs nothing here), and only a
    // meter records what it costs.
    let this_machine = (!args.no_model && !args.no_meter).then(|| {
        let mut bases = frugal_train::notice::Bases::default();
        if let Some(url) = &args.metadata_url {
            (bases.aws, bases.gcp, bases.azure) = (url.clone(), url.clone(), url.clone());
        }
        bases
    });
    let (rate, instance_type) =
        machine_rate(catalog, price_per_hour, instance, this_machine.as_ref())?;
    let local = if args.no_model {
        if file.upstream.is_empty() {
            bail!("--no-model serves the [[serve.upstream]] servers, and frugal.toml names none");
        }
        if let Some(r) = file.route.first() {
            bail!(
                "route `{}`: a cascade starts at the local model; drop --no-model or the route",
                r.name
            );
        }
        None
    } else {
        Some(start_local(args, file, rate, instance_type)?)
    };
    let name = local
        .as_ref()
        .map_or_else(String::new, |l| l.machine.model.clone());
    let upstreams = file
        .upstream
        .iter()
        .map(|u| upstream(u, catalog))
        .collect::<Result<Vec<_>>>()?;
    let meter = if args.no_meter {
        None
    } else {
        if let Some(dir) = config.ledger.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        Some(Meter::start(MeterConfig {
            ledger: config.ledger.clone(),
            workload,
            capacity: Some(Capacity::OnDemand),
            machines: local
                .iter()
                .map(|l| l.machine.clone())
                .chain(upstreams.iter().filter_map(Upstream::machine))
                .collect(),
        })?)
    };
    let cache = (!args.no_cache && file.cache.unwrap_or(true)).then(|| {
        let defaults = CacheConfig::default();
        ExactCache::new(CacheConfig {
            max_bytes: args
                .cache_mb
                .or(file.cache_mb)
                .map_or(defaults.max_bytes, |mb| mb << 20),
            ttl: args
                .cache_ttl
                .or(file.cache_ttl)
                .map_or(defaults.ttl, std::time::Duration::from_secs),
        })
    });
    let wants_semantic =
        cache.is_some() && !args.no_semantic_cache && file.semantic_cache.unwrap_or(true);
    // One embedder for the semantic cache and the routes' skip rules.
    let embedder = if wants_semantic || file.route.iter().any(|r| r.skip_examples.is_some()) {
        Some(load_embedder(args, file)?)
    } else {
        None
    };
    let semantic = match &embedder {
        Some(e) if wants_semantic => Some(semantic_cache(e.clone(), args, file)?),
        _ => None,
    };
    let keys = file.key.iter().map(key).collect::<Result<Vec<_>>>()?;
    let policies = policies(file, &name)?;
    let routes = file
        .route
        .iter()
        .map(|r| route(r, &name, &upstreams, embedder.as_ref()))
        .collect::<Result<Vec<_>>>()?;
    // Beside a local model the engine's threads take the cores and two async workers carry
    // the HTTP; a gateway alone uses them all.
    let workers = if local.is_some() {
        2
    } else {
        std::thread::available_parallelism().map_or(2, usize::from)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let shared = match args.cache_redis.as_deref().or(file.cache_redis.as_deref()) {
        Some(url) if cache.is_some() => {
            let ttl = args
                .cache_ttl
                .or(file.cache_ttl)
                .map_or(CacheConfig::default().ttl, std::time::Duration::from_secs);
            Some(
                runtime
                    .block_on(SharedCache::connect(url, ttl))
                    .map_err(|e| anyhow::anyhow!("cannot reach the shared cache: {e}"))?,
            )
        }
        _ => None,
    };
    let keys = Keys::new(&keys);
    if meter.is_some() {
        // Budgets count what the ledger already has for this day and month.
        let ledger = frugal_cost::Ledger::open(&config.ledger)?;
        keys.preload(chrono::Utc::now(), |start| {
            ledger.tenant_spend(start.timestamp_millis())
        })?;
    }
    let what = if let Some(l) = &local {
        format!("{name} (machine at {}/h)", l.machine.rate.0)
    } else {
        format!("a gateway to {} upstream(s)", upstreams.len())
    };
    let state = AppState::new(Parts {
        local,
        meter,
        cache,
        semantic,
        shared,
        upstreams,
        routes,
        policies,
        keys,
        backends: Vec::new(),
    });
    let drain = std::time::Duration::from_secs(args.drain_timeout.unwrap_or(30));
    let meter = state.meter();
    let served = runtime.block_on(async {
        let addr = format!("{host}:{port}");
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        if let Some(addr) = &args.metrics_addr {
            let metrics = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--metrics-addr)"))?;
            frugal_gateway::serve_metrics(metrics, state.clone());
        }
        writeln!(
            std::io::stderr(),
            "frugal serve: {what} on http://{local}/v1; Ctrl-C to stop"
        )?;
        let app = frugal_gateway::router(state);
        frugal_gateway::serve(listener, app, shutdown_signal(), drain).await?;
        Ok::<_, anyhow::Error>(())
    });
    // HTTP is drained; what was cut off settles as its tasks are dropped with the runtime,
    // then the meter writes every settled row before the process exits.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    if let Some(meter) = meter {
        meter.close();
    }
    served
}

/// Loads the local model and starts its engine, priced at `rate`.
fn start_local(
    args: &ServeArgs,
    file: &RawServe,
    rate: HourlyRate,
    instance_type: Option<String>,
) -> Result<Local> {
    let model_path = args
        .model
        .clone()
        .or_else(|| file.model.clone())
        .unwrap_or_else(|| frugal_engine::DEFAULT_MODEL.into());
    if !model_path.exists() {
        bail!(
            "no model at {}: run `make models` (or scripts/fetch-models.sh) for the default, or pass --model FILE.gguf",
            model_path.display()
        );
    }
    let started = std::time::Instant::now();
    let options = LoadOptions {
        requantize: args.quant.map(|q| match q {
            QuantArg::Q8_0 => WeightType::Q8_0,
            QuantArg::Q4_0 => WeightType::Q4_0,
        }),
        threads: args.threads,
    };
    let (model, tokenizer, template) = load_model(&model_path, options)?;
    let name = args
        .name
        .clone()
        .or_else(|| file.name.clone())
        .unwrap_or_else(|| {
            model_path
                .file_stem()
                .map_or("model".into(), |s| s.to_string_lossy().into_owned())
        });
    tracing::info!(
        model = %name,
        weights_mb = model.weight_bytes() / 1_000_000,
        secs = started.elapsed().as_secs_f64(),
        "model loaded"
    );
    let ctx = model.config.ctx_len;
    let engine = Engine::start(
        model,
        SchedulerConfig {
            batching: match args.batching {
                BatchingArg::Continuous => Batching::Continuous,
                BatchingArg::Static => Batching::Static,
                BatchingArg::Drain => Batching::Drain,
            },
            max_batch: args.max_batch.or(file.max_batch).unwrap_or(16),
            max_queue: args.max_queue.or(file.max_queue).unwrap_or(256),
            kv_positions: ctx.max(4096) * 4,
            ..SchedulerConfig::default()
        },
    )?;
    let machine = Machine {
        model: name,
        rate,
        instance_type,
    };
    Ok(Local::new(engine, tokenizer, template, machine))
}

/// A GGUF file's weights, tokenizer and chat template.
pub fn load_model(
    path: &std::path::Path,
    options: LoadOptions,
) -> Result<(Model, Tokenizer, ChatTemplate)> {
    let gguf = Gguf::open(path).with_context(|| format!("cannot load {}", path.display()))?;
    let tokenizer = Tokenizer::from_gguf(&gguf).context("cannot build the tokenizer")?;
    let template = ChatTemplate::from_gguf(&gguf).context("cannot read the chat template")?;
    let model = Model::from_gguf(&gguf, options)
        .with_context(|| format!("cannot load {}", path.display()))?;
    Ok((model, tokenizer, template))
}

/// The machine's hourly price: given, from the catalog, or, for this machine (`this_machine`:
/// the metadata services to ask), its instance type's from the cloud's metadata or the
/// cheapest catalog instance as big as it, said at start; else nothing (costs read $0).
pub fn machine_rate(
    catalog: &Catalog,
    price_per_hour: Option<&str>,
    instance: Option<&str>,
    this_machine: Option<&frugal_train::notice::Bases>,
) -> Result<(HourlyRate, Option<String>)> {
    if let Some(text) = price_per_hour {
        let price: Money = text
            .parse()
            .map_err(|e| anyhow::anyhow!("--price-per-hour: {e}"))?;
        if price.is_negative() {
            bail!("--price-per-hour: a price cannot be negative");
        }
        return Ok((HourlyRate(price), None));
    }
    if let Some(instance) = instance {
        let offer = catalog.instance(instance, None)?;
        return Ok((offer.on_demand, Some(offer.instance_type.clone())));
    }
    let Some(bases) = this_machine else {
        return Ok((HourlyRate(Money::ZERO), None));
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let found = runtime.block_on(frugal_train::machine::this_machine_rate(
        catalog,
        bases,
        frugal_train::machine::DETECT_TIMEOUT,
    ));
    // A name lookup of a metadata host may still be running: don't wait for it.
    runtime.shutdown_background();
    writeln!(
        std::io::stderr(),
        "frugal serve: pricing this machine at ${}/h: {}; --price-per-hour overrides it",
        found.rate.0.to_string_places(3),
        found.reason
    )?;
    Ok((found.rate, found.instance_type))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down: finishing requests in flight");
}

/// An upstream from its `[[serve.upstream]]` entry, priced from the catalog.
fn upstream(raw: &RawUpstream, catalog: &Catalog) -> Result<Upstream> {
    let mut config = UpstreamConfig::new(&raw.name, &raw.url);
    if let Some(m) = &raw.model {
        config.model.clone_from(m);
    }
    if let Some(var) = &raw.api_key_env {
        config.api_key = Some(std::env::var(var).with_context(|| {
            format!(
                "upstream `{}`: the environment variable {var} (api_key_env) is not set",
                raw.name
            )
        })?);
    }
    config.pricing = if raw.price_per_hour.is_some() || raw.instance.is_some() {
        if raw.price.is_some() {
            bail!(
                "upstream `{}`: price (per token) and price_per_hour or instance (per hour) exclude each other",
                raw.name
            );
        }
        let (rate, instance_type) = machine_rate(
            catalog,
            raw.price_per_hour.as_deref(),
            raw.instance.as_deref(),
            None,
        )
        .with_context(|| format!("upstream `{}`", raw.name))?;
        Some(Pricing::Hourly {
            rate,
            instance_type,
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
        config.timeout = std::time::Duration::from_secs(t);
    }
    if let Some(r) = raw.retries {
        config.retries = r;
    }
    Upstream::new(config).map_err(|e| anyhow::anyhow!("upstream `{}`: {e}", raw.name))
}

/// Each served name's cache policy: the local model's from `[serve]`, then each upstream's
/// and route's own.
fn policies(file: &RawServe, local: &str) -> Result<HashMap<String, CachePolicy>> {
    let entries = std::iter::once((local, file.shared_cache, None))
        .chain(
            file.upstream
                .iter()
                .map(|u| (u.name.as_str(), u.shared_cache, u.semantic_threshold)),
        )
        .chain(
            file.route
                .iter()
                .map(|r| (r.name.as_str(), r.shared_cache, r.semantic_threshold)),
        );
    entries
        .map(|(name, shared, threshold)| {
            let policy = CachePolicy {
                shared: shared.unwrap_or(false),
                semantic_threshold: threshold
                    .map(cosine_threshold)
                    .transpose()
                    .map_err(|e| anyhow::anyhow!("`{name}`: {e}"))?,
            };
            Ok((name.to_owned(), policy))
        })
        .collect()
}

/// A cascade from its `[[serve.route]]` entry: every tier but the last must be the local
/// model (its answers carry the logprobs the confidence is read from), the last the local
/// model or an upstream.
fn route(
    raw: &RawRoute,
    local: &str,
    upstreams: &[Upstream],
    embedder: Option<&Arc<Embedder>>,
) -> Result<RouteConfig> {
    let what = format!("route `{}`", raw.name);
    let Some((last, first)) = raw.tiers.split_last() else {
        bail!("{what}: tiers is empty; list the models cheapest first");
    };
    if raw.name == local || upstreams.iter().any(|u| u.config.name == raw.name) {
        bail!("{what}: the name is already a model's; pick another (e.g. \"auto\")");
    }
    if let Some(t) = first.iter().find(|t| *t != local) {
        bail!(
            "{what}: tier `{t}` must be the local model `{local}`: only its answers carry the logprobs a cascade judges (the last tier may be an upstream)"
        );
    }
    if last != local && !upstreams.iter().any(|u| &u.config.name == last) {
        bail!("{what}: the last tier `{last}` is neither the local model nor a [[serve.upstream]]");
    }
    let quantile = raw.quantile.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&quantile) || raw.threshold > 0.0 || raw.threshold.is_nan() {
        bail!("{what}: quantile must be in [0, 1] and threshold a logprob <= 0");
    }
    let skip = match (&raw.skip_examples, embedder) {
        (Some(path), Some(embedder)) => {
            if last == local {
                bail!("{what}: skip_examples needs an upstream last tier to skip to");
            }
            let below = raw.skip_below.unwrap_or(0.5);
            if !(0.0..=1.0).contains(&below) {
                bail!("{what}: skip_below is a share in [0, 1], not {below}");
            }
            let examples = read_skip_examples(path).with_context(|| what.clone())?;
            let skip = Skip::new(embedder.clone(), &examples, raw.skip_k.unwrap_or(8), below)
                .with_context(|| format!("{what}: cannot embed the skip examples"))?;
            tracing::info!(route = %raw.name, examples = examples.len(), below, "skip rule loaded");
            Some(Arc::new(skip))
        }
        _ => None,
    };
    Ok(RouteConfig {
        name: raw.name.clone(),
        tiers: raw.tiers.clone(),
        quantile,
        threshold: raw.threshold,
        skip,
    })
}

/// A skip rule's examples: JSON lines of `{"prompt": ..., "ok": true|false}`.
pub fn read_skip_examples(path: &Path) -> Result<Vec<SkipExample>> {
    let examples: Vec<SkipExample> =
        crate::eval_route::read_json_lines(path, r#"{"prompt": TEXT, "ok": BOOL}"#)?;
    if examples.is_empty() {
        bail!("{} holds no examples", path.display());
    }
    Ok(examples)
}

/// A key from its `[[serve.key]]` entry.
fn key(raw: &RawKey) -> Result<KeyConfig> {
    let hex = raw.sha256.trim();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "serve.key of tenant `{}`: sha256 must be 64 hex digits (`frugal keys new` prints it)",
            raw.tenant
        );
    }
    let usd = |field: &str, v: &Option<String>| -> Result<Option<Money>> {
        v.as_deref()
            .map(|s| {
                s.parse::<Money>()
                    .with_context(|| format!("serve.key of tenant `{}`: {field}", raw.tenant))
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

/// The embedding model; a missing one is an error that says how to fetch it or turn the
/// semantic cache off.
fn load_embedder(args: &ServeArgs, file: &RawServe) -> Result<Arc<Embedder>> {
    let dir = args
        .embedder
        .clone()
        .or_else(|| file.embedder.clone())
        .unwrap_or_else(|| frugal_semantic::DEFAULT_EMBEDDER.into());
    embedder_at(&dir, ", or --no-semantic-cache")
}

/// The embedding model in `dir`; `or` ends the advice of the missing-model error.
pub fn embedder_at(dir: &Path, or: &str) -> Result<Arc<Embedder>> {
    if !dir.join("model.safetensors").exists() {
        bail!(
            "no embedding model in {}: run `scripts/fetch-models.sh minilm`, pass --embedder DIR{or}",
            dir.display()
        );
    }
    let embedder = Embedder::load(dir)
        .with_context(|| format!("cannot load the embedder from {}", dir.display()))?;
    Ok(Arc::new(embedder))
}

fn semantic_cache(
    embedder: Arc<Embedder>,
    args: &ServeArgs,
    file: &RawServe,
) -> Result<SemanticCache> {
    let mut config = SemanticConfig::default();
    if let Some(t) = args.semantic_threshold.or(file.semantic_threshold) {
        config.guard.threshold = cosine_threshold(t)?;
    }
    if let Some(ttl) = args.cache_ttl.or(file.cache_ttl) {
        config.ttl = std::time::Duration::from_secs(ttl);
    }
    if let Some(n) = file.semantic_entries {
        if n == 0 {
            bail!("semantic_entries must be at least 1; `semantic_cache = false` turns it off");
        }
        config.max_entries = n;
    }
    Ok(SemanticCache::new(embedder, config))
}

/// A semantic threshold, checked: a cosine in [0, 1].
fn cosine_threshold(t: f32) -> Result<f32> {
    if !(0.0..=1.0).contains(&t) {
        bail!("semantic_threshold must be a cosine between 0 and 1, not {t}");
    }
    Ok(t)
}
