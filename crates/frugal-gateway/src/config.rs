//! `[serve]` of `frugal.toml` as written: strict raw structs (an unknown key is an error
//! naming its dotted path), which [`assemble`](crate::assemble) validates into what a
//! gateway runs on.
//!
//! Paths are taken as given: the binary resolves them against the config file's folder,
//! and lays the command line's flags over these fields, before assembly. They serialize too:
//! `frugal deploy kubernetes` writes the gateway's `[serve]` back out with its pools rewritten
//! ([`pool::kube`](crate::deploy)).

use std::path::PathBuf;

use frugal_engine::speculate::Speculate;
use serde::{Deserialize, Serialize};

/// `[serve] speculate` when it is not set.
pub const DEFAULT_SPECULATE: Speculate = Speculate::Ngram;

/// `[serve]`: the gateway, its caches, upstreams, routes and keys, and the local model's
/// settings (which the binary reads: `model`, `name`, `host`, `port`, the machine's price,
/// the batch and queue bounds, `workload`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawServe {
    pub model: Option<PathBuf>,
    pub name: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub price_per_hour: Option<String>,
    pub instance: Option<String>,
    pub max_batch: Option<usize>,
    pub max_queue: Option<usize>,
    /// The engine reuses the KV of prompt prefixes it has seen (system prompts, earlier
    /// turns) [default: true]; pools' replicas follow it.
    pub prefix_cache: Option<bool>,
    /// How the engine drafts tokens to verify in its decode steps: `ngram` (prompt lookup)
    /// or `none` [default: [`DEFAULT_SPECULATE`]]; pools' `local` replicas follow it.
    pub speculate: Option<Speculate>,
    pub workload: Option<String>,
    pub cache: Option<bool>,
    /// Megabytes the exact cache holds at most [default: 256].
    pub cache_mb: Option<u64>,
    /// Seconds a cached answer lives [default: 3600].
    pub cache_ttl: Option<u64>,
    /// A Redis URL: the exact cache shared with other replicas.
    pub cache_redis: Option<String>,
    /// A Redis URL: the tenants' budgets shared with other replicas (reservations held
    /// there, so N replicas cannot spend N budgets). May be the cache's Redis.
    pub budget_redis: Option<String>,
    pub semantic_cache: Option<bool>,
    /// Batch jobs' lines use the semantic cache too [default: false, the exact cache only:
    /// an offline job has time to have each answer made for it].
    pub batch_semantic_cache: Option<bool>,
    /// Unfinished batches at once at most; past it, `POST /v1/batches` answers 429
    /// [default: 16].
    pub batch_max_active: Option<usize>,
    /// Megabytes of Batch API files each tenant (with no keys, everyone) may keep; past it,
    /// `POST /v1/files` answers 429 [default: 10240].
    pub batch_upload_quota_mb: Option<u64>,
    /// The semantic cache's least cosine: with the verifier, where its candidates start
    /// [default: 0.7]; without it, the guard's threshold [default: 0.9525].
    pub semantic_threshold: Option<f32>,
    /// The threshold for pairs whose content words all align [default: the built-in one, or
    /// as far below `semantic_threshold` as the built-in ones are apart].
    pub semantic_aligned_threshold: Option<f32>,
    /// Questions the semantic cache holds at most [default: 10,000].
    pub semantic_entries: Option<usize>,
    /// The share of served semantic hits that may be wrong: the error budget the paraphrase
    /// verifier's calibrated probabilities are spent against [default: 0.02].
    pub semantic_max_error: Option<f64>,
    /// The paraphrase verifier's file, or "none" for the guard alone at its thresholds
    /// [default: the one frugal ships, data/semantic-cache/verifier.safetensors].
    pub semantic_verifier: Option<String>,
    /// The local model's cache is one for every tenant [default: false, one per tenant].
    pub shared_cache: Option<bool>,
    /// The embedding model's folder [default: the first found of the places searched].
    pub embedder: Option<PathBuf>,
    /// The share of answers a cheap lever served (a cascade's cheap tier, a semantic hit)
    /// asked again of the reference path in the background and compared, in [0, 1]
    /// [default: 0, off].
    pub shadow_rate: Option<f64>,
    /// Append each routing shadow's question and verdict to this file as a skip example
    /// (JSON lines of {"prompt", "ok"}), for `frugal route train --from` to refit a route's
    /// router on what the shadows measured. It holds users' questions: opt-in [default: off].
    pub shadow_examples: Option<PathBuf>,
    /// OpenAI-compatible servers served beside the local model.
    #[serde(default)]
    pub upstream: Vec<RawUpstream>,
    /// A reload (SIGHUP) may remove every key, opening the API [default: false: such a
    /// reload is refused and the keys stay].
    pub allow_open: Option<bool>,
    /// API keys; with none, the API is open.
    #[serde(default)]
    pub key: Vec<RawKey>,
    /// Cascade routes (e.g. `model: "auto"`).
    #[serde(default)]
    pub route: Vec<RawRoute>,
    /// Pools of replicas that grow with demand and shrink to zero when idle.
    #[serde(default)]
    pub pool: Vec<RawPool>,
}

/// `[[serve.pool]]`: a model served by replicas that the gateway starts and stops with
/// demand (or, `external`, that something else scales from the demand it publishes).
/// Durations are written as `"500ms"`, `"15s"`, `"5m"`, `"1h"`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPool {
    /// The model name clients ask for.
    pub name: String,
    /// `local` (frugal's engine in this process), `process` (a command per replica) or
    /// `external` (one URL whose replicas something else scales).
    pub backend: PoolBackend,
    /// `process`: the command line of one replica, with `{port}` (and `{model}`,
    /// `{replica}`) filled in; run without a shell, in its own process group.
    pub command: Option<String>,
    /// `local`: the GGUF file each replica loads; `process`: what `{model}` stands for.
    pub model: Option<PathBuf>,
    /// `external`: the base URL (e.g. a Kubernetes Service's `http://qwen:8080/v1`).
    pub url: Option<String>,
    /// Readiness probe path on a replica [default: `/health`].
    pub health: Option<String>,
    /// Replicas kept however idle [default: 0].
    pub min_replicas: Option<u32>,
    /// Replicas at most [default: 4].
    pub max_replicas: Option<u32>,
    /// Requests in flight per replica that the autoscaler aims at [default: 8].
    pub target_in_flight: Option<u32>,
    /// Requests in flight on one replica at most; past it on every replica, requests wait
    /// in the activator's queue [default: twice `target_in_flight`].
    pub max_in_flight: Option<u32>,
    /// Idle time after which the last replica stops [default: "5m"].
    pub scale_to_zero_after: Option<String>,
    /// How long a replica may take to become ready [default: "120s"].
    pub cold_start_timeout: Option<String>,
    /// Demand averaged over this window sizes the pool, and it shrinks only after the
    /// window [default: "60s"].
    pub stable_window: Option<String>,
    /// The short window used while demand exceeds `panic_threshold` times capacity
    /// [default: "6s"].
    pub panic_window: Option<String>,
    /// Demand over capacity that enters panic mode [default: 2.0, i.e. 200%].
    pub panic_threshold: Option<f64>,
    /// How long a stopping replica may finish its requests before it is killed
    /// [default: "30s"].
    pub drain_grace: Option<String>,
    /// How often the autoscaler decides [default: "1s"].
    pub tick: Option<String>,
    /// Requests held at most while the pool has no free replica; past it, 429 [default: 256].
    pub max_queue: Option<usize>,
    /// How a request picks its replica: `prefix` (the one most likely to hold its prompt's
    /// prefix, within a load bound) or `least_in_flight` [default: `prefix`].
    pub routing: Option<PoolRouting>,
    /// A replica's price: its instance type, priced on demand from the catalog...
    pub instance: Option<String>,
    /// ...or USD per hour.
    pub price_per_hour: Option<String>,
    /// Whole-request limit on a replica [default: 120].
    pub timeout_s: Option<u64>,
    /// `process`: the folder of the replicas' log files [default: `frugal-pools/` beside the
    /// ledger].
    pub log_dir: Option<PathBuf>,
    /// `frugal deploy kubernetes`: the container image of a replica.
    pub image: Option<String>,
    /// The semantic cache's least cosine for this pool [default: `[serve]`'s].
    pub semantic_threshold: Option<f32>,
    /// The share of this pool's semantic hits that may be wrong [default: `[serve]`'s].
    pub semantic_max_error: Option<f64>,
    /// One cache for every tenant on this pool [default: false].
    pub shared_cache: Option<bool>,
}

/// How a pool picks a replica for a request (`routing`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolRouting {
    #[default]
    Prefix,
    LeastInFlight,
}

/// What runs a pool's replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolBackend {
    Local,
    Process,
    External,
}

/// `[[serve.route]]`: a cascade, cheapest tier first.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: String,
    pub tiers: Vec<String>,
    /// Quantile of the token logprobs taken as the confidence [default: 0, the minimum].
    pub quantile: Option<f64>,
    /// Accept a tier's answer at or above this confidence (a logprob, <= 0).
    pub threshold: f32,
    /// JSON lines of prompts labelled by whether the cheap tier answered them right
    /// (`frugal eval-route --skip-examples FILE` writes them).
    pub skip_examples: Option<PathBuf>,
    /// Skip the cheap tier when fewer than this share of the nearest examples were
    /// answered right [default: 0.5].
    pub skip_below: Option<f32>,
    /// Nearest examples that vote [default: 8].
    pub skip_k: Option<usize>,
    /// A learned router (`frugal route train` writes it) instead of `skip_examples`: the
    /// cheap tier is skipped when its chance of being right is below `skip_below`.
    pub router: Option<PathBuf>,
    /// The semantic cache's least cosine for this route [default: `[serve]`'s].
    pub semantic_threshold: Option<f32>,
    /// The share of this route's semantic hits that may be wrong [default: `[serve]`'s].
    pub semantic_max_error: Option<f64>,
    /// One cache for every tenant on this route [default: false].
    pub shared_cache: Option<bool>,
    /// The share of this route's accepted cheap answers checked on its last tier
    /// [default: `[serve]`'s].
    pub shadow_rate: Option<f64>,
}

/// `[[serve.key]]`: one API key, by its hash (`frugal keys new` prints the entry).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    /// Whose key: it names the cache namespace and the budgets.
    pub tenant: String,
    /// Hex SHA-256 of the key.
    pub sha256: String,
    pub daily_usd: Option<String>,
    pub monthly_usd: Option<String>,
}

/// `[[serve.upstream]]`: one OpenAI-compatible server, by the name clients use for it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub name: String,
    /// Base URL, e.g. `https://api.openai.com/v1`.
    pub url: String,
    /// The upstream's name for the model [default: `name`].
    pub model: Option<String>,
    /// Environment variable holding the API key (sent as a bearer token); the binary reads
    /// it and hands assembly its value.
    pub api_key_env: Option<String>,
    /// The `[[model]]` of the price files that prices its tokens [default: `model`].
    pub price: Option<String>,
    /// A self-hosted server: USD per hour of its machine, which its calls share...
    pub price_per_hour: Option<String>,
    /// ...or the machine's instance type, priced on demand from the catalog.
    pub instance: Option<String>,
    pub timeout_s: Option<u64>,
    pub retries: Option<u32>,
    /// The most tokens the model answers with: what a request without `max_tokens` holds
    /// of a tenant's budget [default: 4,096].
    pub max_output_tokens: Option<u64>,
    /// The semantic cache's least cosine for this model [default: `[serve]`'s].
    pub semantic_threshold: Option<f32>,
    /// The share of this model's semantic hits that may be wrong [default: `[serve]`'s].
    pub semantic_max_error: Option<f64>,
    /// One cache for every tenant on this model [default: false].
    pub shared_cache: Option<bool>,
}
