//! Command-line arguments, parsed into plain data.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use frugal_gateway::backend::model_ref::ModelRef;

/// frugal measures what ML compute costs per unit of work, and shows which levers cut it.
#[derive(Debug, Parser)]
#[command(name = "frugal", version, about, long_about = None, propagate_version = true, args_override_self = true)]
pub struct Cli {
    /// Config file [default: ./frugal.toml if present]
    #[arg(
        long,
        global = true,
        env = "FRUGAL_CONFIG",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub config: Option<PathBuf>,

    /// Usage ledger: a SQLite file, or a postgres:// URL [default: from config, else
    /// ~/.local/share/frugal/ledger.sqlite]
    #[arg(
        long,
        global = true,
        env = "FRUGAL_LEDGER",
        hide_env_values = true,
        value_name = "PATH|URL"
    )]
    pub ledger: Option<String>,

    /// Price file layered over the built-in catalog (repeatable)
    #[arg(long = "prices", global = true, value_name = "FILE")]
    pub price_files: Vec<PathBuf>,

    /// More logging (-v info, -vv debug); FRUGAL_LOG takes a tracing filter
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a GGUF model over an OpenAI-compatible API, metered into the ledger
    Serve(ServeArgs),
    /// Quantize a GGUF model's weights to another type (q8_0, q6_k, q5_k, q4_k, ...), with its
    /// tokenizer and chat template carried over: bytes before and after, fallbacks
    Quantize(QuantizeArgs),
    /// Load-test an OpenAI-compatible endpoint: throughput, TTFT/TPOT/latency, cost per unit
    Bench(BenchArgs),
    /// List instance and model prices from the catalog
    Prices(PricesArgs),
    /// Fill and inspect the usage ledger
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// Cost per training run, per 1,000 inferences and per million tokens; waste; levers
    Report(ReportArgs),
    /// API keys for `frugal serve`
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Measure the semantic cache on labelled question pairs: hit and wrong-hit rates over
    /// thresholds, chosen on a tuning split and reported on a held-out one
    EvalCache(EvalCacheArgs),
    /// Measure a small-to-large cascade on questions with checkable answers: each tier's
    /// accuracy and cost, and the cost/quality curve over confidence thresholds
    EvalRoute(EvalRouteArgs),
    /// Learned routers for cascade routes: `route train` fits one on labelled prompts
    #[command(subcommand)]
    Route(RouteCommand),
    /// Run a training command under a spot-safe supervisor: checkpoint before preemptions,
    /// resume from a store on any machine, restart after crashes, say why the GPU idles
    Train(TrainArgs),
    /// Write Kubernetes objects that run `frugal serve`'s gateway and pools, scaled by KEDA
    #[command(subcommand)]
    Deploy(DeployCommand),
    /// Batch inference in OpenAI's Batch format, exactly once through kills and preemptions
    #[command(subcommand)]
    Batch(BatchCommand),
    /// The capacity mix for a workload (reserved, on demand, spot) from its demand, backtested
    /// on the months it was not fitted on
    Plan(PlanArgs),
    /// Search hyperparameters with ASHA over any training command: trials stopped at rungs
    /// resume from their checkpoints when promoted, spot-safe and priced
    Tune(TuneArgs),
    /// What a quantization costs in quality, on held-out data: perplexity and KL divergence
    /// from a reference per token, or task accuracy and flips; a gate for CI
    #[command(subcommand)]
    Eval(EvalCommand),
    /// Scrape the /metrics of the servers in `[[watch.target]]` (vLLM, TGI, llama.cpp, frugal,
    /// DCGM) into the ledger: cost per 1,000 requests and per million tokens, and idle dollars
    Watch(WatchArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "Rows that are not whole blocks of --type (256 weights for the K types) fall back per tensor, as llama.cpp does: q4_k to q5_0, q5_k to q5_1, q6_k to q8_0. Norms and biases are copied as they are (F32)."
)]
pub struct QuantizeArgs {
    /// The model to quantize: a GGUF file of any type frugal reads
    #[arg(value_name = "IN.gguf")]
    pub input: PathBuf,
    /// Where to write the quantized model (written whole, or not at all)
    #[arg(value_name = "OUT.gguf")]
    pub output: PathBuf,
    /// Type of the weight matrices: q8_0, q6_k, q5_k, q4_k, q5_1, q5_0, q4_1, q4_0 or f16
    #[arg(long = "type", value_name = "TYPE", value_parser = parse_quant_type)]
    pub target: frugal_engine::quant::WeightType,
    /// Another type for the output projection (output.weight, or the token embedding when
    /// the model ties them), whose error the logits feel most: e.g. q8_0
    #[arg(long, value_name = "TYPE", value_parser = parse_quant_type)]
    pub keep_output: Option<frugal_engine::quant::WeightType>,
    /// Print the report as one JSON object on stdout: each tensor's types and bytes before and
    /// after, totals by type, and the tensors that fell back (docs/json.md)
    #[arg(long)]
    pub json: bool,
}

fn parse_quant_type(s: &str) -> Result<frugal_engine::quant::WeightType, String> {
    frugal_engine::quantize::target_from_name(s).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
#[command(after_help = "Targets: [[watch.target]] in frugal.toml (README.md)")]
pub struct WatchArgs {
    /// Time between scrapes
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub interval: std::time::Duration,
    /// Scrape every target once, bill the time since the last scrape (kept beside the
    /// ledger), and exit: for cron. Exits 1 when a target is a gap (down, slow, garbled)
    #[arg(long)]
    pub once: bool,
    /// With --once, exit 0 even when a target is a gap
    #[arg(long, requires = "once")]
    pub allow_gaps: bool,
    /// Seconds a scrape may take
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: std::time::Duration,
    /// Print each pass as one line of JSON on stdout (JSON Lines): per server its rates,
    /// busy share, $/h, unit costs, the interval's cost and idle so far in dollars
    /// (`cost_usd`), or its note (docs/json.md)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Demand as `timestamp,value` lines, a value being the instances of --instance needed
    /// (times --scale)
    #[arg(long, value_name = "FILE.csv", conflicts_with = "workload")]
    pub demand: Option<PathBuf>,
    /// Demand from the ledger: the machine time this workload's requests and training held
    /// each hour (calls to per-token APIs left out)
    #[arg(long, value_name = "NAME")]
    pub workload: Option<String>,
    /// With --workload: the ledger's demand from this time on, as `frugal report --since`
    /// reads it (RFC 3339, a date, or an age like 30d)
    #[arg(long, requires = "workload")]
    pub since: Option<String>,
    /// With --workload: the ledger's demand before this time, as `frugal report --until`
    #[arg(long, requires = "workload")]
    pub until: Option<String>,
    /// The instance type, priced from the catalog (reserved prices from a price file)
    #[arg(long, value_name = "TYPE")]
    pub instance: String,
    /// Region of the instance's price [default: the provider's usual one]
    #[arg(long)]
    pub region: Option<String>,
    /// Instances per unit of the demand file's value
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// What one value of the demand file counts (said beside the plan)
    #[arg(long, default_value = "instances")]
    pub unit: String,
    /// Backtest: choose on this much history (e.g. 30d) ...
    #[arg(long, value_parser = humantime::parse_duration)]
    pub fit: Option<std::time::Duration>,
    /// ... and score on the next this much, rolling [default: as --fit]
    #[arg(long, value_parser = humantime::parse_duration)]
    pub test: Option<std::time::Duration>,
    /// Fill hours missing from the demand with the hour before (else they are refused)
    #[arg(long)]
    pub fill_gaps: bool,
    /// Plan spot for an interruptible run of this much work (e.g. 24h)
    #[arg(long, value_parser = humantime::parse_duration)]
    pub work: Option<std::time::Duration>,
    /// The run must finish within this (e.g. 36h): whether spot alone does, and the
    /// uniform-progress policy's mix of spot and on demand
    #[arg(long, value_parser = humantime::parse_duration)]
    pub deadline: Option<std::time::Duration>,
    /// A preemption trace (SkyPilot's spot traces' format)
    #[arg(
        long,
        value_name = "FILE.json",
        default_value = "data/spot-traces/preemption/1-node/aws-04-22-2023/us-east-1c_v100_1.json"
    )]
    pub spot_trace: PathBuf,
    /// Time one checkpoint takes
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub checkpoint: std::time::Duration,
    /// Time a restart takes (a new machine, the checkpoint loaded)
    #[arg(long, default_value = "6m", value_parser = humantime::parse_duration)]
    pub restart: std::time::Duration,
    /// Right-size: a `frugal bench --json` run on an instance type (priced from the catalog),
    /// repeated for each type to compare per 1M tokens
    #[arg(long, value_name = "TYPE=FILE.json", value_parser = parse_bench)]
    pub bench: Vec<(String, PathBuf)>,
    /// The SLO the right size must meet: time to first token at the 99th percentile (e.g.
    /// 500ms) [default: no SLO]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub slo_ttft_p99: Option<std::time::Duration>,
    /// Scale to zero (with --workload): a replica's cold start [default: the median of the
    /// workload's replica starts in the ledger, else 30s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub cold_start: Option<std::time::Duration>,
    /// Scale to zero: how long an idle replica stays up after its last request
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    pub scale_to_zero_after: std::time::Duration,
    /// Scale to zero pays only while fewer than this share of requests wait for a cold start
    #[arg(long, value_name = "SHARE", value_parser = unit_interval,
          default_value_t = frugal_cost::plan::DEFAULT_MAX_WAITING_SHARE)]
    pub max_waiting_share: f64,
    /// Print the plan as JSON on stdout: the demand, the reservation, the spot options and their
    /// costs, money in dollars as decimal strings (`*_usd`) (docs/json.md)
    #[arg(long)]
    pub json: bool,
    /// Also write the plan as an HTML page with charts
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum BatchCommand {
    /// Run (or resume) a batch: every line of INPUT answered once in --output, failures in
    /// --errors; run the same command again to resume after a kill or a preemption
    Run(BatchRunArgs),
}

#[derive(Debug, Args)]
#[command(after_help = "The format, resuming, spot and stores: docs/batch.md")]
pub struct BatchRunArgs {
    /// The batch: JSONL lines {"custom_id", "method", "url", "body"} for /v1/chat/completions
    /// or /v1/completions
    #[arg(value_name = "INPUT.jsonl")]
    pub input: PathBuf,
    /// Answered lines, as OpenAI writes them
    #[arg(long, value_name = "OUT.jsonl")]
    pub output: PathBuf,
    /// Failed lines [default: OUT.errors.jsonl]
    #[arg(long, value_name = "ERR.jsonl")]
    pub errors: Option<PathBuf>,
    /// The job's durable progress [default: OUT.jsonl.frugal-batch/ beside the output]
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// The model every line asks for instead of its body's `model`: a GGUF file (a path to
    /// an existing file, or a name ending .gguf), run here as --model-file, or a served name
    /// (the local model, an upstream, a pool or a route)
    #[arg(long, value_name = "FILE.gguf|NAME", value_parser = parse_model_ref)]
    pub model: Option<ModelRef>,
    /// Lines in flight at once
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// The local model's GGUF file [default: --model's file, else [serve] model in
    /// frugal.toml, else the default model]
    #[arg(long, value_name = "FILE", conflicts_with = "no_model")]
    pub model_file: Option<PathBuf>,
    /// Run no model here: lines go to the [[serve.upstream]] servers and [[serve.pool]] pools
    #[arg(long)]
    pub no_model: bool,
    /// The semantic cache's embedding model folder (all-MiniLM-L6-v2) [default: models/minilm]
    #[arg(long, value_name = "DIR")]
    pub embedder: Option<PathBuf>,
    /// Turn the semantic cache off
    #[arg(long)]
    pub no_semantic_cache: bool,
    /// Kernel threads [default: one per core]
    #[arg(long)]
    pub threads: Option<usize>,
    /// Sequences the local engine decodes together at most [default: 16]
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// Tries of a line answered 429, 5xx or not at all, in all
    #[arg(long, default_value_t = 5)]
    pub max_attempts: u32,
    /// Unfinished lines fail as batch_expired this long after the job began (e.g. 24h, 90m)
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub completion_window: std::time::Duration,
    #[command(flatten)]
    pub machine: MachineArgs,
    /// Keep the job's state in a store, to resume on another machine: a directory, or a
    /// file://, s3://, gs:// or az:// URL (credentials from the usual AWS_*, GOOGLE_*, AZURE_*)
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// Time between copies of the job's state to --store (and one at every stop)
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub store_every: std::time::Duration,
    /// Seconds lines in flight may take to finish after SIGTERM or Ctrl-C, before they are
    /// left to run again on the next start
    #[arg(long, default_value_t = 20.0, value_name = "S")]
    pub grace: f64,
    /// Do not write usage to the ledger
    #[arg(long)]
    pub no_meter: bool,
    /// Print the run's summary as JSON on stdout instead of text: the job, lines finished
    /// and failed, this run's answers, tokens, retries and cost (`cost_usd`, dollars), per
    /// 1k lines and per 1M tokens (docs/json.md)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum DeployCommand {
    /// The gateway (ConfigMap, Deployment, Service), and per local or process pool a
    /// Deployment, a Service and a KEDA ScaledObject, as YAML files in --out
    Kubernetes(KubernetesArgs),
}

#[derive(Debug, Args)]
pub struct KubernetesArgs {
    /// Folder the files are written to (created if missing)
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Namespace of every object
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// frugal's container image: the gateway's, and a local pool's without an `image`
    #[arg(long, default_value = concat!("frugal:", env!("CARGO_PKG_VERSION")))]
    pub image: String,
    /// Gateway replicas. Past one they need a shared ledger (`[ledger] url =
    /// "postgres://..."`), shared budgets (`[serve] budget_redis`, where keys have budgets)
    /// and, with pools, --prometheus
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub gateway_replicas: u32,
    /// A Prometheus server that scrapes the gateways, as KEDA's operator reaches it: pools
    /// scale on their demand summed over every gateway
    #[arg(long, value_name = "URL")]
    pub prometheus: Option<String>,
}

/// Where preemption notices come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NoticeArg {
    /// Find the cloud's metadata endpoint (with --spot; otherwise none)
    Auto,
    Aws,
    Gcp,
    Azure,
    /// Only SIGTERM to the supervisor announces a stop
    None,
}

/// The machine a job runs on: how it is priced, and where its preemption notices come from
/// (`frugal train`, `frugal batch run`).
#[derive(Debug, Args)]
pub struct MachineArgs {
    /// The capacity is spot (priced so, and preemption notices are watched)
    #[arg(long)]
    pub spot: bool,
    /// Instance type, priced from the catalog (e.g. g5.xlarge)
    #[arg(long, value_name = "TYPE")]
    pub instance: Option<String>,
    /// Region of the instance's price [default: the provider's usual one]
    #[arg(long)]
    pub region: Option<String>,
    /// The machine's price per hour, instead of the catalog's
    #[arg(long, value_name = "USD")]
    pub price_per_hour: Option<String>,
    /// Where preemption notices come from
    #[arg(long, value_enum, default_value_t = NoticeArg::Auto)]
    pub notice: NoticeArg,
    /// Base URL of the metadata endpoint [default: the cloud's own]
    #[arg(long, value_name = "URL")]
    pub metadata_url: Option<String>,
    /// Seconds between notice polls
    #[arg(long, default_value_t = 5.0, value_name = "S")]
    pub poll: f64,
}

#[derive(Debug, Args)]
#[command(
    after_help = "The command's contract (environment, checkpoints, metrics): docs/training.md"
)]
pub struct TrainArgs {
    #[command(flatten)]
    pub machine: MachineArgs,
    /// The run's id, the same on every machine of one run [default: a hash of the command]
    #[arg(long, value_name = "ID")]
    pub run: Option<String>,
    /// Local checkpoint directory [default: .frugal/RUN/checkpoints]
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    #[command(flatten)]
    pub supervisor: SupervisorArgs,
    /// Restarts allowed, after crashes and preemptions together
    #[arg(long, default_value_t = 10)]
    pub max_restarts: u32,
    /// Seconds before the first restart after a crash; doubles each time, up to 5 minutes
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    pub backoff: f64,
    /// Print the run's summary as JSON on stdout when it ends, instead of the table: its
    /// segments (how each ended, steps, checkpoints, minutes, busy, MFU, cost) and totals
    /// (`cost_usd`, dollars); the command's own output comes before it (docs/json.md)
    #[arg(long)]
    pub json: bool,
    /// The training command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

/// How a supervised command is checkpointed and stopped (`frugal train`, `frugal tune`).
#[derive(Debug, Args)]
pub struct SupervisorArgs {
    /// Checkpoint store: a directory, or a file://, s3://, gs:// or az:// URL (credentials from
    /// the usual AWS_*, GOOGLE_*, AZURE_* variables) [default: checkpoints/ beside the ledger]
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// The signal that asks the command for a checkpoint now
    #[arg(long, default_value = "SIGUSR1", value_name = "SIG")]
    pub checkpoint_signal: String,
    /// Seconds between SIGTERM and SIGKILL when stopping the command
    #[arg(long, default_value_t = 10.0, value_name = "S")]
    pub stop_grace: f64,
    /// Seconds a stop (a SIGTERM or SIGINT, a tuner's rung) leaves for the checkpoint
    #[arg(long, default_value_t = 25.0, value_name = "S")]
    pub signal_deadline: f64,
    /// Checkpoints kept, in the store and locally
    #[arg(long, default_value_t = 3)]
    pub keep: usize,
    /// Seconds to keep retrying the last upload once the run has ended
    #[arg(long, default_value_t = 600.0, value_name = "S")]
    pub store_wait: f64,
    /// Do not look for GPUs (the CPU stands in for the accelerator)
    #[arg(long)]
    pub no_gpu: bool,
    /// The machine's peak TFLOPS at the precision the command computes in, for its model
    /// FLOPs utilization [default: the catalog's, for --instance's GPUs]
    #[arg(long, value_name = "X")]
    pub peak_tflops: Option<f64>,
}

#[derive(Debug, Args)]
#[command(
    after_help = "The search space's TOML and the summary's fields: docs/tune.md. \
The command's contract: docs/training.md"
)]
pub struct TuneArgs {
    /// The search space, metric, resource and rungs (TOML)
    #[arg(long, value_name = "FILE.toml")]
    pub space: PathBuf,
    /// Trials run at once, each on its own slot
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub parallel: u32,
    /// The tuner's state, and each trial's checkpoints, metrics and log [default: .frugal/tune/ID]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Print the search's summary as JSON on stdout instead of the table: trials, their
    /// params, rung results, steps and cost (`cost_usd`, dollars) (docs/json.md)
    #[arg(long)]
    pub json: bool,
    /// The search's id, in the ledger and the trials' run ids [default: a hash of the space
    /// and the command]
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
    /// Seeds the configurations sampled
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Launch each trial through this command, run by `sh -c`: `{command}` is the trial's
    /// command, `{env}` its variables as NAME=VALUE words, `{run}`, `{trial}`, `{slot}`
    /// (e.g. 'srun --gres=gpu:1 env {env} {command}')
    #[arg(long, value_name = "TEMPLATE")]
    pub launcher: Option<String>,
    /// CUDA_VISIBLE_DEVICES of each slot, comma-separated (`0,1,2,3`; `0+1,2+3` for two
    /// devices a slot)
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// When a slot would wait with nothing left to start, promote the next best trial ahead
    /// of its turn if it ends before the running ones (the slot is paid for either way)
    #[arg(long)]
    pub speculate: bool,
    /// Seconds a trial may go without reporting a step before it counts as hung
    #[arg(long, default_value_t = 1800.0, value_name = "S")]
    pub trial_timeout: f64,
    #[command(flatten)]
    pub machine: MachineArgs,
    #[command(flatten)]
    pub supervisor: SupervisorArgs,
    /// The training command, with `{name}` where a parameter's value goes
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct EvalRouteArgs {
    /// JSON lines of {id, kind, question, answers, check}; repeat for several files (ids
    /// unique across them) [default: data/cascade/questions.jsonl and public-questions.jsonl]
    #[arg(long, value_name = "FILE", default_values = ["data/cascade/questions.jsonl", "data/cascade/public-questions.jsonl"], hide_default_value = true)]
    pub questions: Vec<PathBuf>,
    /// The cheap tier (GGUF)
    #[arg(long, default_value = frugal_engine::DEFAULT_MODEL)]
    pub small: PathBuf,
    /// The dear tier (GGUF)
    #[arg(long, default_value = frugal_engine::LARGE_MODEL)]
    pub large: PathBuf,
    /// Tokens per answer at most
    #[arg(long, default_value_t = 24)]
    pub max_tokens: usize,
    /// Machine price, to turn engine time into dollars
    #[arg(long, value_name = "USD", default_value_t = 1.0)]
    pub price_per_hour: f64,
    /// Share of the large tier's accuracy the cascade must keep
    #[arg(long, default_value_t = 0.95)]
    pub min_quality: f64,
    /// One-sided confidence that the chosen threshold keeps --min-quality: its tuning
    /// quality must keep it by a lower bound at this level, from a bootstrap over the tuning
    /// questions with every candidate bounded at once
    #[arg(long, default_value_t = 0.95, value_parser = unit_interval)]
    pub confidence: f64,
    /// Bootstrap resamples of the tuning questions (fixed seed); 0 bounds nothing, the
    /// tuning quality taken as it is
    #[arg(long, default_value_t = frugal_gateway::cascade::eval::RESAMPLES)]
    pub resamples: usize,
    /// Bound each candidate alone, not every candidate at once (so that the many searched
    /// make one likelier to pass by luck): to compare
    #[arg(long)]
    pub pointwise: bool,
    /// What the bound is for: the quality measured on a fresh half as large as the held-out
    /// one (a prediction bound: that half's own sampling error counts too), or over all
    /// questions like these (a confidence bound, looser)
    #[arg(long, value_enum, default_value_t = BoundFor::HeldOut)]
    pub bound: BoundFor,
    /// Reuse the answers in an earlier run's --json output instead of running the models:
    /// they are checked again against --questions, split and voted on again, and the
    /// threshold chosen again, in seconds
    #[arg(long, value_name = "FILE")]
    pub answers: Option<PathBuf>,
    /// Share of questions held out (by a hash of the id)
    #[arg(long, default_value_t = 0.5)]
    pub held_out: f64,
    /// Also write every answer, the chosen point and the curve as JSON
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also write the held-out cost/quality curve as an HTML page with a chart
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Also write the tuning questions, labelled by whether the small tier answered them
    /// right, as a route's skip examples (`skip_examples` in frugal.toml)
    #[arg(long, value_name = "FILE")]
    pub skip_examples: Option<PathBuf>,
    /// The embedding model the skip rule votes with
    #[arg(long, value_name = "DIR", default_value = frugal_semantic::DEFAULT_EMBEDDER)]
    pub embedder: PathBuf,
    /// Also write the learned router fitted on the tuning questions, as `frugal route train`
    /// does (`router` on a `[[serve.route]]`)
    #[arg(long, value_name = "FILE")]
    pub router: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum RouteCommand {
    /// Fit a router on prompts labelled by whether the cheap tier answered them right: the
    /// chance it is right, from the prompt's embedding and length (logistic regression).
    /// A `[[serve.route]]` names the file as `router`, and skips the cheap tier below
    /// `skip_below`
    Train(RouteTrainArgs),
}

#[derive(Debug, Args)]
pub struct RouteTrainArgs {
    /// JSON lines of {"prompt": TEXT, "ok": BOOL}, as `frugal eval-route --skip-examples`
    /// and `frugal serve`'s `shadow_examples` write them; repeat to fit on several files
    #[arg(long, value_name = "FILE", required = true)]
    pub from: Vec<PathBuf>,
    /// Where to write the router (JSON)
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// The embedding model (the route's embedder must be the same)
    #[arg(long, value_name = "DIR", default_value = frugal_semantic::DEFAULT_EMBEDDER)]
    pub embedder: PathBuf,
}

#[derive(Debug, Args)]
pub struct EvalCacheArgs {
    /// JSON array of {text_a, text_b, label}, plain, gzip or tar.gz
    #[arg(long, default_value = "data/semantic-cache/similiar_qqp_full.json.gz")]
    pub pairs: PathBuf,
    /// The embedding model folder
    #[arg(long, default_value = frugal_semantic::DEFAULT_EMBEDDER)]
    pub embedder: PathBuf,
    /// Labelled near misses and paraphrases, each with a `kind`, reported per kind; repeat
    /// for several files [default: data/semantic-cache/nearmiss.json,
    /// reworded-paraphrases.json and reworded-nearmiss.json, compiled in]
    #[arg(long, value_name = "FILE")]
    pub near_miss: Vec<PathBuf>,
    /// The paraphrase verifier measured behind the guard ("none": the guard alone)
    #[arg(long, value_name = "FILE", default_value = frugal_semantic::verify::DEFAULT_VERIFIER)]
    pub verifier: PathBuf,
    /// The error budget replayed over the held-out halves: the share of served semantic hits
    /// that may be wrong (as `semantic_max_error`)
    #[arg(long, default_value_t = frugal_semantic::budget::DEFAULT_MAX_ERROR)]
    pub max_error: f64,
    /// Write the calibration and the cosine floor chosen here into the verifier's file (how
    /// a newly trained verifier gets them; `frugal serve` reads them from it)
    #[arg(long)]
    pub calibrate: bool,
    /// Use this many pairs, evenly spread over the file [default: all]
    #[arg(long)]
    pub limit: Option<usize>,
    /// Also write the tuning half's pairs the vetoes got wrong (near misses let through,
    /// paraphrases refused), with what the guard read in each, as JSON lines; the held-out
    /// half is never shown, so that it stays a test
    #[arg(long, value_name = "FILE")]
    pub tuning_errors: Option<PathBuf>,
    /// Wrong hits allowed of any one kind of near miss when choosing the threshold
    #[arg(long, default_value_t = 0.03)]
    pub max_kind_wrong: f64,
    /// Wrong hits allowed when choosing the threshold on the tuning split
    #[arg(long, default_value_t = 0.01)]
    pub max_wrong: f64,
    /// Share of pairs held out (chosen by a hash of each pair)
    #[arg(long, default_value_t = 0.5)]
    pub held_out: f64,
    /// Also write the curves and chosen points as JSON
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also write the held-out curves as an HTML page with a chart
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Make a key: prints it once, and the `[[serve.key]]` entry (its hash) to configure
    New(NewKeyArgs),
}

#[derive(Debug, Args)]
pub struct NewKeyArgs {
    /// Whose key: names its cache namespace and budgets
    pub tenant: String,
    /// Dollars the tenant may spend per UTC day
    #[arg(long, value_name = "USD")]
    pub daily_usd: Option<String>,
    /// Dollars the tenant may spend per UTC month
    #[arg(long, value_name = "USD")]
    pub monthly_usd: Option<String>,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct PricesArgs {
    #[command(subcommand)]
    pub action: Option<PricesCommand>,
    /// Only this provider (aws, gcp, azure, or one from a price file; with --models, the
    /// model's provider, e.g. openai)
    #[arg(long)]
    pub provider: Option<String>,
    /// Accelerator name contains this (case-insensitive), e.g. A100, h100, T4
    #[arg(long)]
    pub gpu: Option<String>,
    /// Instance type contains this (case-insensitive)
    #[arg(long)]
    pub instance: Option<String>,
    #[arg(long)]
    pub region: Option<String>,
    /// Only offers with a spot price at or below MAX_PRICE when --sort spot, else on-demand
    #[arg(long, value_name = "USD_PER_HOUR")]
    pub max_price: Option<f64>,
    #[arg(long, value_enum, default_value_t = PriceSort::PerGpu)]
    pub sort: PriceSort,
    /// Rows to show (0: all)
    #[arg(long, default_value_t = 30)]
    pub limit: usize,
    /// List per-token model prices instead of instances
    #[arg(long)]
    pub models: bool,
    /// With --models: the model's name contains this (case-insensitive), e.g. gpt-4o
    #[arg(long, requires = "models")]
    pub name: Option<String>,
    /// Print the instances (or, with --models, the model prices) as a JSON array on stdout,
    /// prices in dollars as decimal strings (`*_usd`) (docs/json.md)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum PricesCommand {
    /// Replace the built-in hosted-model prices with a newer copy of LiteLLM's table
    /// (model_prices_and_context_window.json), trimmed and kept in frugal's data folder
    Refresh(PricesRefreshArgs),
}

#[derive(Debug, Args)]
pub struct PricesRefreshArgs {
    /// LiteLLM's model_prices_and_context_window.json (or its _backup copy)
    #[arg(long, value_name = "FILE.json")]
    pub models: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PriceSort {
    /// On-demand price per accelerator-hour
    PerGpu,
    /// On-demand price per instance-hour
    OnDemand,
    /// Spot price per instance-hour
    Spot,
    /// Largest spot saving first
    Saving,
}

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Import usage from CSV, JSONL or a FOCUS billing export; all rows or none
    Import(ImportArgs),
    /// What the ledger holds
    Info(InfoArgs),
    /// Copy a SQLite ledger into another (a postgres:// URL); a rerun copies only what is
    /// missing
    Migrate(MigrateArgs),
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The SQLite ledger to copy
    #[arg(long, value_name = "FILE")]
    pub from: PathBuf,
    /// The ledger to copy into: a postgres:// URL (or a SQLite file)
    #[arg(long, value_name = "URL")]
    pub to: String,
    /// Events per transaction
    #[arg(long, default_value_t = 50_000)]
    pub batch: usize,
    /// Print what was copied as JSON on stdout: events copied and skipped, files, spans,
    /// cost (docs/json.md)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Files to import, each in its own transaction
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Format [default: jsonl for .jsonl/.ndjson/.json, focus for a CSV with FOCUS columns, else csv]
    #[arg(long, value_enum)]
    pub format: Option<ImportFormat>,
    /// Import the good rows of a file with bad ones, and list the bad ones
    #[arg(long)]
    pub skip_invalid: bool,
    /// Import a file, or rows, already imported (by default a file whose content, or any of
    /// whose rows, an earlier import stored is refused, so nothing is billed twice)
    #[arg(long)]
    pub allow_duplicates: bool,
    /// Print each file's import summary as a JSON array on stdout: rows imported, skipped,
    /// invalid (with their lines), duplicates, the file's SHA-256, cost (docs/json.md)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ImportFormat {
    Csv,
    Jsonl,
    Focus,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Also run SQLite's integrity check
    #[arg(long)]
    pub check: bool,
    /// Print what the ledger holds as JSON on stdout: path, schema, events, span, total cost
    /// (`total_cost_usd`), size, and the integrity check when asked (docs/json.md)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Start of the window: RFC 3339, a date, or an age like 7d, 24h, 30m (before now);
    /// windows take whole UTC hours, so this rounds down to the hour
    #[arg(long)]
    pub since: Option<String>,
    /// End of the window (exclusive), same forms as --since; rounds up to the hour
    #[arg(long)]
    pub until: Option<String>,
    /// Print the report as JSON on stdout: totals, spend by kind, unit costs per workload and
    /// model, batch jobs, training runs, pools, watched servers and levers; money in dollars
    /// as decimal strings (`total_usd`) beside the deprecated nano-dollars (docs/json.md)
    #[arg(long, conflicts_with = "html")]
    pub json: bool,
    /// Also write a self-contained HTML report with charts
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Flag a pool whose replicas were busy less than this share of their time
    #[arg(long, value_name = "SHARE", value_parser = unit_interval,
          default_value_t = frugal_cost::report::Options::default().pool_busy_below)]
    pub pool_busy_below: f64,
    /// Spend by tenant, model, workload or day (UTC): printed alone with its total; in
    /// --json as `spend`, in --html as a section
    #[arg(long, value_name = "tenant|model|workload|day", value_parser = parse_by)]
    pub by: Option<frugal_cost::report::By>,
}

/// `--by`'s groups.
fn parse_by(s: &str) -> Result<frugal_cost::report::By, String> {
    use frugal_cost::report::By;
    match s {
        "tenant" => Ok(By::Tenant),
        "model" => Ok(By::Model),
        "workload" => Ok(By::Workload),
        "day" => Ok(By::Day),
        "key" => Err("the ledger records each request's tenant, not its key: --by tenant".into()),
        _ => Err(format!("`{s}` is not one of tenant, model, workload, day")),
    }
}

#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// GGUF model file (llama or qwen2 family) [default: [serve] model in frugal.toml, else
    /// models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(long, conflicts_with = "no_model")]
    pub model: Option<PathBuf>,
    /// Run no model here: a gateway for the [[serve.upstream]] servers and [[serve.pool]] pools
    #[arg(long)]
    pub no_model: bool,
    /// Name clients use for the model [default: the file name without .gguf]
    #[arg(long)]
    pub name: Option<String>,
    /// Address to listen on [default: 127.0.0.1]
    #[arg(long)]
    pub host: Option<String>,
    /// Port [default: 8080; 0 picks a free one]
    #[arg(long)]
    pub port: Option<u16>,
    /// Re-quantize the weights at load time to run on the fast kernels
    #[arg(long, value_enum)]
    pub quant: Option<QuantArg>,
    /// The KV cache's type: q8_0 holds 3.8x the positions (long contexts, more sequences)
    /// in the same memory; `frugal eval ppl --kv q8_0` measures what it keeps
    #[arg(long, value_enum, default_value = "f32")]
    pub kv: KvArg,
    /// Kernel threads [default: one per core]
    #[arg(long)]
    pub threads: Option<usize>,
    /// Sequences decoded together at most [default: 16]
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// Requests waiting beyond the batch before new ones get 429 [default: 256]
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// Baselines for comparison: `static` admits a batch only when the last is gone and
    /// computes every slot until its longest request ends; `drain` lets finished requests leave
    #[arg(long, value_enum, default_value_t = BatchingArg::Continuous)]
    pub batching: BatchingArg,
    /// Prefill every prompt from its first token: no reuse of the KV of prefixes seen
    /// before (system prompts, earlier turns); pools' replicas follow
    #[arg(long, env = "FRUGAL_NO_PREFIX_CACHE")]
    pub no_prefix_cache: bool,
    /// Speculative decoding: `ngram` drafts the tokens that followed the answer's last few
    /// tokens where they occurred before (in the prompt: summaries, extractions, code edits)
    /// and verifies them in one step, the output unchanged; `none` decodes a token a step
    /// [default: [serve] speculate, else ngram]
    #[arg(long, value_name = "ngram|none")]
    pub speculate: Option<frugal_engine::speculate::Speculate>,
    /// Price of this machine per hour, for the ledger and x-frugal-cost-usd
    #[arg(long, value_name = "USD", conflicts_with = "instance")]
    pub price_per_hour: Option<String>,
    /// Price this machine as a catalog instance type (e.g. g5.xlarge)
    #[arg(long)]
    pub instance: Option<String>,
    /// Base URL of the cloud metadata endpoints that name this machine's instance type when
    /// neither price is given (tests point it at a fake one)
    #[arg(long, value_name = "URL", hide = true)]
    pub metadata_url: Option<String>,
    /// Workload name in the ledger [default: serve]
    #[arg(long)]
    pub workload: Option<String>,
    /// Do not write usage to the ledger
    #[arg(long)]
    pub no_meter: bool,
    /// Turn the exact cache off (on by default; it only holds deterministic requests:
    /// temperature 0 or a seed)
    #[arg(long)]
    pub no_cache: bool,
    /// Memory the exact cache may hold, in MB [default: 256]
    #[arg(long, value_name = "MB")]
    pub cache_mb: Option<u64>,
    /// Seconds a cached answer lives [default: 3600]
    #[arg(long, value_name = "SECONDS")]
    pub cache_ttl: Option<u64>,
    /// Share the exact cache with other replicas through this Redis server
    /// (e.g. redis://127.0.0.1:6379/)
    #[arg(
        long,
        env = "FRUGAL_CACHE_REDIS",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub cache_redis: Option<String>,
    /// Share tenants' budgets with other replicas through this Redis server: reservations
    /// held there, so N replicas cannot spend N budgets
    #[arg(
        long,
        env = "FRUGAL_BUDGET_REDIS",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub budget_redis: Option<String>,
    /// Turn the semantic cache off (on with the exact cache: a question asked in other
    /// words gets the cached answer when the vetoes and the paraphrase verifier accept the
    /// pair within the error budget)
    #[arg(long)]
    pub no_semantic_cache: bool,
    /// Cosine similarity a semantic candidate needs at least [default: 0.7 with the verifier;
    /// 0.9525 for the guard alone, chosen on QQP and near-miss tuning pairs]
    #[arg(long, value_name = "COSINE")]
    pub semantic_threshold: Option<f32>,
    /// The share of served semantic hits that may be wrong, spent against the verifier's
    /// calibrated probabilities [default: 0.02]
    #[arg(long, value_name = "SHARE")]
    pub semantic_max_error: Option<f64>,
    /// The paraphrase verifier's file, or `none` for the guard alone at its thresholds
    /// [default: the one frugal ships]
    #[arg(long, value_name = "FILE")]
    pub semantic_verifier: Option<String>,
    /// The share of answers a cheap lever served (a cascade's cheap tier, a semantic hit)
    /// asked again of the reference path in the background and compared, for the report's
    /// quality kept (as `shadow_rate`) [default: 0, off]
    #[arg(long, value_name = "SHARE")]
    pub shadow_rate: Option<f64>,
    /// The semantic cache's embedding model folder (all-MiniLM-L6-v2)
    /// [default: models/minilm]
    #[arg(long, value_name = "DIR")]
    pub embedder: Option<PathBuf>,
    /// Also serve /metrics, without a key, on this address (e.g. 127.0.0.1:9090); with
    /// keys configured, /metrics on the API port needs one
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// Seconds requests in flight may take to finish after Ctrl-C or SIGTERM [default: 30]
    #[arg(long, value_name = "SECONDS")]
    pub drain_timeout: Option<u64>,
}

/// A weight type to re-quantize to at load; each runs on its own integer kernel. A matrix
/// whose rows are no whole number of a K type's 256-weight blocks takes llama.cpp's
/// substitute (Q4_K: Q5_0, Q5_K: Q5_1, Q6_K: Q8_0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QuantArg {
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q6_k")]
    Q6K,
    #[value(name = "q5_k")]
    Q5K,
    #[value(name = "q5_1")]
    Q5_1,
    #[value(name = "q5_0")]
    Q5_0,
    #[value(name = "q4_k")]
    Q4K,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q4_0")]
    Q4_0,
}

impl QuantArg {
    pub fn weight_type(self) -> frugal_engine::quant::WeightType {
        use frugal_engine::quant::WeightType as W;
        match self {
            QuantArg::Q8_0 => W::Q8_0,
            QuantArg::Q6K => W::Q6_K,
            QuantArg::Q5K => W::Q5_K,
            QuantArg::Q5_1 => W::Q5_1,
            QuantArg::Q5_0 => W::Q5_0,
            QuantArg::Q4K => W::Q4_K,
            QuantArg::Q4_1 => W::Q4_1,
            QuantArg::Q4_0 => W::Q4_0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum KvArg {
    #[default]
    #[value(name = "f32")]
    F32,
    #[value(name = "q8_0")]
    Q8_0,
}

impl KvArg {
    pub fn kv_type(self) -> frugal_engine::model::KvType {
        match self {
            KvArg::F32 => frugal_engine::model::KvType::F32,
            KvArg::Q8_0 => frugal_engine::model::KvType::Q8_0,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Perplexity on a held-out text, and against a reference: KL divergence per token (mean,
    /// p99), top-1 agreement and Δp, as llama-perplexity measures them
    #[command(
        after_help = "Held-out texts: data/eval/ (PROVENANCE.md). Exit status 1 when a gate fails."
    )]
    Ppl(EvalPplArgs),
    /// Accuracy on questions with checkable answers, of the model and its reference, and the
    /// flips: questions right in one and wrong in the other
    Tasks(EvalTasksArgs),
    /// The semantic cache's embedder quantized against F32: cosine of each embedding to the
    /// exact one, and the ROC AUC of held-out QQP pairs with each
    Embedder(EvalEmbedderArgs),
}

#[derive(Debug, Args)]
pub struct EvalEmbedderArgs {
    /// The embedding model's folder (model.safetensors, tokenizer.json)
    #[arg(long, value_name = "DIR", default_value = frugal_semantic::DEFAULT_EMBEDDER)]
    pub embedder: PathBuf,
    /// The type measured [default: q8_0, what the cache runs]
    #[arg(long, value_enum, default_value = "q8_0")]
    pub quant: QuantArg,
    /// Labelled pairs (GPTCache's QQP file, or JSON [{text_a, text_b, label}])
    #[arg(long, default_value = "data/semantic-cache/similiar_qqp_full.json.gz")]
    pub pairs: PathBuf,
    /// Held-out pairs measured at most (the split eval-cache holds out)
    #[arg(long, default_value_t = 2000)]
    pub limit: usize,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// Fail (exit 1) when the mean cosine to the exact embeddings is below this
    #[arg(long, value_parser = unit_interval)]
    pub min_cosine: Option<f64>,
    /// Fail when the pairs' ROC AUC drops by more than this from the exact embedder's
    #[arg(long, value_parser = unit_interval)]
    pub max_auc_drop: Option<f64>,
}

/// The model evaluated, shared by `eval ppl` and `eval tasks`.
#[derive(Debug, Args)]
pub struct EvalModelArgs {
    /// The model evaluated (GGUF)
    #[arg(long, value_name = "Q.gguf")]
    pub model: PathBuf,
    /// Evaluate the model re-quantized at load to this type, as `frugal serve --quant` runs it
    /// (the reference is then the file itself, unless --reference names another)
    #[arg(long, value_enum)]
    pub quant: Option<QuantArg>,
    /// Evaluate the model with this KV cache, as `frugal serve --kv` runs it (the reference
    /// keeps an exact one; with q8_0 the reference is --model's file unless named)
    #[arg(long, value_enum, default_value = "f32")]
    pub kv: KvArg,
    /// Kernel threads [default: one per core]
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// Where the result is recorded for `frugal serve` to say at start [default:
    /// $XDG_DATA_HOME/frugal/evals.jsonl]
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct EvalPplArgs {
    #[command(flatten)]
    pub model: EvalModelArgs,
    /// The reference: a GGUF (its weights dequantized to F32, so it is exact), or a file
    /// written by --save-reference [default with --quant: --model's file]
    #[arg(long, value_name = "R.gguf|FILE")]
    pub reference: Option<PathBuf>,
    /// Held-out text
    #[arg(long, value_name = "FILE")]
    pub text: PathBuf,
    /// Tokens per chunk; the second half of each is scored
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Chunks at most [default: all the text holds]
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Save the reference's top-k log-probabilities per token to FILE, for later runs'
    /// --reference
    #[arg(long, value_name = "FILE")]
    pub save_reference: Option<PathBuf>,
    /// Log-probabilities saved per token (the KL divergence read from them is a lower bound:
    /// 128 read SmolLM2's 12% under the full one, 32 read it 28% under)
    #[arg(long, default_value_t = 128)]
    pub top_k: usize,
    /// Fail (exit 1) when the mean KL divergence is above this
    #[arg(long, value_name = "NATS")]
    pub max_kld: Option<f64>,
    /// Fail when the share of tokens with the reference's top token is below this
    #[arg(long, value_name = "SHARE", value_parser = unit_interval)]
    pub min_top1: Option<f64>,
    /// Fail when perplexity over the reference's is above this
    #[arg(long, value_name = "RATIO")]
    pub max_ppl_ratio: Option<f64>,
}

#[derive(Debug, Args)]
pub struct EvalTasksArgs {
    #[command(flatten)]
    pub model: EvalModelArgs,
    /// The reference model (GGUF), run as stored [default with --quant: --model's file]
    #[arg(long, value_name = "R.gguf")]
    pub reference: Option<PathBuf>,
    /// JSON lines of {id, kind, question, answers, check}
    #[arg(long, default_value = "data/cascade/questions.jsonl")]
    pub questions: PathBuf,
    /// Questions at most (the first N)
    #[arg(long)]
    pub limit: Option<usize>,
    /// Tokens per answer at most
    #[arg(long, default_value_t = 24)]
    pub max_tokens: usize,
    /// Fail (exit 1) when more questions than this flip (right in one, wrong in the other)
    #[arg(long)]
    pub max_flips: Option<usize>,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Base URL of the API
    #[arg(long, default_value = "http://127.0.0.1:8080/v1")]
    pub url: String,
    /// The model asked for: a served name, or a GGUF file (a path to an existing file, or a
    /// name ending .gguf), asked for by the name `frugal serve` gives it [default: the
    /// server's own]
    #[arg(long, value_name = "NAME|FILE.gguf", value_parser = parse_model_ref)]
    pub model: Option<ModelRef>,
    /// Concurrent clients sending back to back (ignored with --trace; with --conversations:
    /// conversations in flight)
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Requests in all (with --trace: trace rows used at most)
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// Prompt length in tokens (about one per word), without --trace
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens generated per request, without --trace (with --conversations: per answer)
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Replay a trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens), e.g.
    /// data/azure-llm-trace/AzureLLMInferenceTrace_conv.csv
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Replay a workload: JSON lines of {"at": seconds, "prompt": text, "max_tokens": n}, sent
    /// as chat turns at their times (not streamed, so no TTFT), e.g.
    /// data/workload/qqp-replay.jsonl
    #[arg(long, value_name = "FILE", conflicts_with = "trace")]
    pub workload: Option<PathBuf>,
    /// Replay multi-turn conversations: JSON lines of ShareGPT conversations ({"conversations":
    /// [{"from": "human", "value": text}, ..]}) or of {"prompt": text}, e.g. from
    /// scripts/fetch-sharegpt.sh. Each turn streams the conversation so far, the server's own
    /// answers appended, and the next user message; --concurrency conversations in flight, or
    /// each starting at --trace's arrival times. --requests: conversations at most
    #[arg(long, value_name = "FILE", conflicts_with = "workload")]
    pub conversations: Option<PathBuf>,
    /// Turns sent per conversation at most (with --conversations)
    #[arg(long, default_value_t = 4, requires = "conversations")]
    pub turns: usize,
    /// A system message ahead of every conversation, e.g. a long shared instruction block
    /// (with --conversations)
    #[arg(long, value_name = "FILE", requires = "conversations")]
    pub system_prompt: Option<PathBuf>,
    /// Write each replayed conversation as a JSON line: every message sent, the answers
    /// included, and each turn's figures (with --conversations)
    #[arg(long, value_name = "FILE", requires = "conversations")]
    pub transcript: Option<PathBuf>,
    /// Replay the trace (or workload) this many times faster
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Scale the trace's prompt lengths to the model (0.1: a tenth)
    #[arg(long, default_value_t = 0.1)]
    pub scale: f64,
    /// Scale the trace's output lengths [default: as --scale]
    #[arg(long)]
    pub output_scale: Option<f64>,
    /// Prompt length at most, in tokens (with --conversations: estimated at 4 characters a
    /// token; user messages are cut to their share and a conversation ends before a turn past it)
    #[arg(long, default_value_t = 512)]
    pub max_prompt: usize,
    #[arg(long, default_value_t = 256)]
    pub max_output: usize,
    /// Price of the machine under test per hour
    #[arg(long, value_name = "USD", conflicts_with = "instance")]
    pub price_per_hour: Option<String>,
    /// Price the machine under test as a catalog instance type
    #[arg(long)]
    pub instance: Option<String>,
    /// Seconds one request may take
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Make every prompt unique, so no cache answers (to measure what is behind it)
    #[arg(long)]
    pub distinct: bool,
    /// Print the load's summary as JSON on stdout: requests, latencies, throughput, and cost
    /// where priced (docs/json.md)
    #[arg(long)]
    pub json: bool,
}

/// What `frugal eval-route`'s lower bound is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BoundFor {
    /// The quality a fresh half as large as the held-out one measures
    HeldOut,
    /// The quality over all questions like these
    Population,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum BatchingArg {
    #[default]
    Continuous,
    Static,
    Drain,
}

/// `--model`: a GGUF file or a served name ([`ModelRef::parse`]).
fn parse_model_ref(s: &str) -> Result<ModelRef, String> {
    Ok(ModelRef::parse(s))
}

/// A share strictly between 0 and 1.
fn unit_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        Ok(_) => Err("must be above 0 and below 1".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// `TYPE=FILE.json` of `--bench`.
fn parse_bench(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((ty, file)) if !ty.is_empty() && !file.is_empty() => {
            Ok((ty.to_owned(), PathBuf::from(file)))
        }
        _ => Err(format!("`{s}` is not TYPE=FILE.json")),
    }
}
