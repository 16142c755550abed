//! `frugal serve`: lay the flags over `[serve]`, have the gateway library assemble and check
//! the rest, load the model, start the engine and the meter, listen until Ctrl-C or
//! SIGTERM, then drain.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use frugal_cloud::notice::Bases;
use frugal_cloud::price::{self, Pricing, Request, ThisMachine};
use frugal_cost::Catalog;
use frugal_cost::money::HourlyRate;
use frugal_engine::eval::quality::AsRun;
use frugal_engine::model::{KvType, LoadOptions, Model};
use frugal_engine::scheduler::{Batching, SchedulerConfig};
use frugal_engine::template::ChatTemplate;
use frugal_engine::tokenizer::Tokenizer;
use frugal_gateway::Local;
use frugal_gateway::backend::four_contexts;
use frugal_gateway::config::RawServe;
use frugal_gateway::gateway::{Inputs, assemble};
use frugal_gateway::meter::Machine;
use frugal_gateway::server::{Gateway, KeysReload, Metering, Setup, shutdown_signal};

use crate::cli::{BatchingArg, QuantArg, ServeArgs};
use crate::config::Config;

/// The gateway of the config and flags, not yet listening: flags over `[serve]`, the
/// configuration checked, the model loaded and its engine started, the meter opened. `paid`
/// prices the machine that runs the local model when the caller knows (a batch job on spot);
/// else `frugal serve`'s rules price it on demand.
pub fn build(
    config: &Config,
    catalog: &Catalog,
    args: &ServeArgs,
    paid: Option<Pricing>,
) -> Result<Gateway> {
    // Flags beat `[serve]` in frugal.toml, which beats the defaults.
    let mut serve = with_flags(&config.serve, args);
    let replica = std::env::var(frugal_gateway::pool::REPLICA_ENV).ok();
    if let Some(replica) = &replica
        && !serve.pool.is_empty()
    {
        // A replica that reads the gateway's frugal.toml must not start pools of its own.
        writeln!(
            std::io::stderr(),
            "frugal serve: replica {replica} of a pool: the [[serve.pool]] entries of the config are not started here"
        )?;
        serve.pool.clear();
    }
    let workload = serve.workload.clone().unwrap_or_else(|| "serve".into());
    let paid = match paid {
        Some(p) => p,
        None => {
            // Only a local model runs on this machine (a gateway's costs nothing here).
            // Priced with --no-meter too: each answer still says what it cost
            // (`x-frugal-cost-usd`), only the ledger row is skipped.
            let bases = Bases::at(args.metadata_url.as_deref());
            let this_machine = if args.no_model {
                ThisMachine::Nothing
            } else {
                ThisMachine::Ask(&bases)
            };
            machine_pricing(
                catalog,
                serve.price_per_hour.as_deref(),
                serve.instance.as_deref(),
                this_machine,
            )?
        }
    };
    // The local model's file and served name, known before it loads so that the
    // configuration is checked first.
    let model = if args.no_model {
        None
    } else {
        // With none named, the default model here, else in the data folder.
        let path = match serve.model.clone() {
            Some(path) => path,
            None => crate::data::Data::new(config.data_home.as_deref()).default_model()?,
        };
        // Named for the way it runs (`...Q4_1+q4_0` with --quant q4_0) unless told a name;
        // the file's own name still reaches it.
        let stem = path
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned());
        let name = serve.name.clone().unwrap_or_else(|| {
            as_run(&path, args)
                .served_name()
                .unwrap_or_else(|| stem.clone())
        });
        let alias = (serve.name.is_none() && name != stem).then_some(stem);
        Some((path, name, alias))
    };
    let search = embedder_search(config.data_home.as_deref());
    // Process pools' replicas log beside the ledger unless a pool says where.
    let pool_logs = config.beside_ledger().join("frugal-pools");
    // The verifier frugal ships, installed from the binary when not found in place.
    let verifier = crate::data::Data::new(config.data_home.as_deref())
        .locate(Path::new(frugal_semantic::verify::DEFAULT_VERIFIER))?;
    let assembly = assemble(
        &serve,
        &Inputs {
            catalog,
            local: model.as_ref().map(|(_, name, _)| name.as_str()),
            env: &|var| std::env::var(var).ok(),
            embedder_search: &search,
            pool_logs: &pool_logs,
            verifier: Some(&verifier),
        },
    )?;
    if assembly.no_embedder {
        let searched: Vec<String> = search.iter().map(|d| d.display().to_string()).collect();
        writeln!(
            std::io::stderr(),
            "frugal serve: no embedding model in {}, so the semantic cache is off; `scripts/fetch-models.sh minilm` fetches it, --embedder DIR names one",
            searched.join(" or ")
        )?;
    }
    let capacity = paid.capacity;
    let local = match model {
        Some((path, name, alias)) => {
            let mut local = start_local(args, &serve, &path, name, paid)?;
            local.aliases.extend(alias);
            say_quality(&path, args, config.data_home.as_deref())?;
            Some(local)
        }
        None => None,
    };
    let setup = Setup {
        workload,
        metering: (!args.no_meter).then(|| Metering {
            ledger: config.ledger.clone(),
            spool: config.spool(),
            capacity,
        }),
        // The Batch API's files and batches live beside the ledger, as the pools' logs do
        // (opened by `frugal serve` only, at start_batches).
        batches: replica
            .is_none()
            .then(|| pool_logs.with_file_name("frugal-batches")),
    };
    Ok(Gateway::build(assembly, local, setup)?)
}

pub fn run(config: &Config, catalog: &Catalog, args: &ServeArgs) -> Result<()> {
    let gateway = build(config, catalog, args, None)?;
    let serve = with_flags(&config.serve, args);
    let host = serve.host.as_deref().unwrap_or("127.0.0.1");
    let port = serve.port.unwrap_or(8080);
    let drain = std::time::Duration::from_secs(args.drain_timeout.unwrap_or(30));
    let served = gateway.runtime.block_on(async {
        let addr = format!("{host}:{port}");
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        if let Some(addr) = &args.metrics_addr {
            let metrics = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--metrics-addr)"))?;
            frugal_gateway::serve_metrics(metrics, gateway.state.clone());
        }
        // Registered before the address is said: SIGHUP's default would end the process.
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("cannot listen for SIGHUP")?;
        writeln!(
            std::io::stderr(),
            "frugal serve: {} on http://{local}/v1; Ctrl-C to stop",
            gateway.what
        )?;
        let file = config.file.clone();
        let keys = KeysReload {
            read: Box::new(move || match &file {
                Some(path) => read_keys(path).map_err(|e| format!("{e:#}")),
                None => Err("no config file was read at start (pass --config FILE)".into()),
            }),
            told: Box::new(|reloaded| {
                let said = match reloaded {
                    Ok(changes) => format!("frugal serve: keys reloaded: {changes}"),
                    Err(why) => format!(
                        "frugal serve: config reload refused, the keys stay as they were: {why}"
                    ),
                };
                let _ = writeln!(std::io::stderr(), "{said}");
            }),
        };
        gateway
            .serve(listener, hangup, keys, shutdown_signal(), drain)
            .await?;
        Ok::<_, anyhow::Error>(())
    });
    // Replicas stop (and their last spans are written) whether or not serving failed.
    gateway.close();
    served
}

/// The checked `[[serve.key]]` entries and `allow_open` of the config file at `path`.
fn read_keys(path: &Path) -> Result<frugal_gateway::admit::keys::KeySet> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    let raw = crate::config::parse(&text, path)?;
    Ok(frugal_gateway::assemble::key_set(&raw.serve)?)
}

/// `[serve]` with the command line's flags laid over it: a flag given wins over the file.
fn with_flags(file: &RawServe, args: &ServeArgs) -> RawServe {
    let mut s = file.clone();
    s.model = args.model.clone().or(s.model);
    s.name = args.name.clone().or(s.name);
    s.host = args.host.clone().or(s.host);
    s.port = args.port.or(s.port);
    s.price_per_hour = args.price_per_hour.clone().or(s.price_per_hour);
    s.instance = args.instance.clone().or(s.instance);
    s.max_batch = args.max_batch.or(s.max_batch);
    s.max_queue = args.max_queue.or(s.max_queue);
    if args.no_prefix_cache {
        s.prefix_cache = Some(false);
    }
    s.speculate = args.speculate.or(s.speculate);
    s.workload = args.workload.clone().or(s.workload);
    if args.no_cache {
        s.cache = Some(false);
    }
    s.cache_mb = args.cache_mb.or(s.cache_mb);
    s.cache_ttl = args.cache_ttl.or(s.cache_ttl);
    s.cache_redis = args.cache_redis.clone().or(s.cache_redis);
    s.budget_redis = args.budget_redis.clone().or(s.budget_redis);
    if args.no_semantic_cache {
        s.semantic_cache = Some(false);
    }
    s.semantic_threshold = args.semantic_threshold.or(s.semantic_threshold);
    s.semantic_max_error = args.semantic_max_error.or(s.semantic_max_error);
    s.semantic_verifier = args.semantic_verifier.clone().or(s.semantic_verifier);
    s.shadow_rate = args.shadow_rate.or(s.shadow_rate);
    s.embedder = args.embedder.clone().or(s.embedder);
    s
}

/// Where the embedder is looked for when none is named: `./models/minilm` (a checkout's,
/// where `make models` puts it), then the user's data folder's
/// (`~/.local/share/frugal/models/minilm`, where `FRUGAL_MODELS=~/.local/share/frugal/models
/// scripts/fetch-models.sh minilm` puts it), so `frugal serve` finds it from any folder.
pub fn embedder_search(data_home: Option<&Path>) -> Vec<PathBuf> {
    let default = PathBuf::from(frugal_semantic::DEFAULT_EMBEDDER);
    let mut dirs = vec![default.clone()];
    dirs.extend(data_home.map(|home| home.join("frugal").join(default)));
    dirs
}

/// The model file at `path` as the flags run it: re-quantized to `--quant`, with `--kv`.
fn as_run<'a>(path: &'a Path, args: &ServeArgs) -> AsRun<'a> {
    let kv = args.kv.kv_type();
    AsRun {
        path,
        quant: args.quant.map(|q| q.weight_type().name()),
        kv: (kv != KvType::F32).then(|| kv.name()),
    }
}

/// Says what `frugal eval` last measured of the model file as `--quant` runs it, or, when it
/// re-quantizes, that nothing measured it: a saving is never served without its cost in
/// quality in sight.
fn say_quality(path: &Path, args: &ServeArgs, data_home: Option<&Path>) -> Result<()> {
    let Some(store) = frugal_engine::eval::quality::store(None, data_home) else {
        return Ok(());
    };
    let run = as_run(path, args);
    let found = run.latest(&store);
    let (what, flags) = (run.words(), run.flags());
    let mut err = std::io::stderr().lock();
    if found.is_empty() && !flags.is_empty() {
        writeln!(
            err,
            "frugal serve: no held-out evaluation of {what}: `frugal eval ppl --model {}{flags} --text data/eval/shakespeare-heldout.txt` measures what it keeps",
            path.display(),
        )?;
    }
    for r in found {
        let gate = match r.gate {
            Some(true) => ", gate passed",
            Some(false) => ", GATE FAILED",
            None => "",
        };
        writeln!(
            err,
            "frugal serve: {what}, last evaluated {} ({} on {}{gate}): {}",
            r.at, r.kind, r.data, r.summary
        )?;
    }
    Ok(())
}

/// Loads the local model at `path` and starts its engine, served as `name` and priced as
/// `paid`.
fn start_local(
    args: &ServeArgs,
    serve: &RawServe,
    path: &Path,
    name: String,
    paid: Pricing,
) -> Result<Local> {
    let options = LoadOptions {
        requantize: args.quant.map(QuantArg::weight_type),
        threads: args.threads,
        kv: args.kv.kv_type(),
    };
    let scheduler = |c: &_| SchedulerConfig {
        batching: match args.batching {
            BatchingArg::Continuous => Batching::Continuous,
            BatchingArg::Static => Batching::Static,
            BatchingArg::Drain => Batching::Drain,
        },
        max_batch: serve.max_batch.unwrap_or(16),
        max_queue: serve.max_queue.unwrap_or(256),
        kv_positions: four_contexts(c),
        prefix_cache: serve.prefix_cache.unwrap_or(true),
        speculate: serve
            .speculate
            .unwrap_or(frugal_gateway::config::DEFAULT_SPECULATE),
        ..SchedulerConfig::default()
    };
    let machine = Machine {
        model: name,
        rate: paid.rate,
        on_demand: paid.on_demand_apart(),
        instance_type: paid.instance_type,
    };
    Ok(Local::load(path, options, scheduler, machine)?)
}

/// A GGUF file's weights, tokenizer and chat template.
pub fn load_model(path: &Path, options: LoadOptions) -> Result<(Model, Tokenizer, ChatTemplate)> {
    frugal_gateway::backend::load_parts(path, options)
        .map_err(|e| anyhow::anyhow!(e))
        .with_context(|| format!("cannot load {}", path.display()))
}

/// The machine's hourly price on demand: given, from the catalog, or, for this machine
/// (`this_machine`), its instance type's from the cloud's metadata or the nearest catalog
/// CPU instance as big as it; frugal-cloud resolves it, and its line is `said`.
pub fn machine_rate(
    catalog: &Catalog,
    price_per_hour: Option<&str>,
    instance: Option<&str>,
    this_machine: ThisMachine<'_>,
) -> Result<(HourlyRate, Option<String>, String)> {
    let resolved = resolve_on_demand(catalog, price_per_hour, instance, this_machine)?;
    let p = resolved.pricing;
    Ok((p.rate, p.instance_type, resolved.said))
}

fn resolve_on_demand(
    catalog: &Catalog,
    price_per_hour: Option<&str>,
    instance: Option<&str>,
    this_machine: ThisMachine<'_>,
) -> Result<price::Resolved> {
    let request = Request {
        price_field: "--price-per-hour",
        ..Request::on_demand(price_per_hour, instance)
    };
    Ok(price::resolve(catalog, &request, this_machine)?)
}

/// [`machine_rate`]'s pricing, its line said at start.
fn machine_pricing(
    catalog: &Catalog,
    price_per_hour: Option<&str>,
    instance: Option<&str>,
    this_machine: ThisMachine<'_>,
) -> Result<Pricing> {
    let resolved = resolve_on_demand(catalog, price_per_hour, instance, this_machine)?;
    // Nothing to price (no local model, or no meter): nothing to say.
    if resolved.found != price::Found::Nothing {
        writeln!(std::io::stderr(), "frugal serve: {}", resolved.said)?;
    }
    Ok(resolved.pricing)
}
