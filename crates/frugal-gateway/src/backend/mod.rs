//! Backends: what produces an answer. The local engine and upstream servers ([`upstream`])
//! implement [`Backend`]; the pipeline ([`crate::request::pipeline`]) runs any of them the
//! same way (consult the caches, produce, settle), so a new kind of backend (a pool of
//! replicas) plugs in here without a path of its own. [`text`] turns engine tokens into
//! response text; [`embed`] is the local embedding model behind `/v1/embeddings`.

pub mod embed;
pub mod model_ref;
pub mod text;
pub mod upstream;

use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use futures_util::future::BoxFuture;
use serde_json::Value;

use frugal_cost::Money;
use frugal_cost::catalog::ModelPrice;
use frugal_cost::money::HourlyRate;
use frugal_engine::gguf::Gguf;
use frugal_engine::model::{
    Calibrate, Calibration, Config as ModelConfig, KvType, LoadOptions, Model, ModelError,
};
use frugal_engine::scheduler::{Engine, EngineTime, SchedulerConfig, SubmitError};
use frugal_engine::template::ChatTemplate;
use frugal_engine::tokenizer::Tokenizer;

use crate::backend::text::{Source, TextStream};
use crate::backend::upstream::{Pricing, Reply, Ticket, Upstream};
use crate::http::error::ApiError;
use crate::http::validate::{self, EngineRun, Job};
use crate::meter::Machine;

pub trait Backend: Send + Sync {
    /// The name clients ask for and the ledger records.
    fn name(&self) -> &str;

    /// Checks `job` for this backend: what it will run, and the most it can cost.
    fn prepare(&self, job: &Job) -> Result<Plan, ApiError>;

    /// `prepare` takes CPU worth moving off the async threads (tokenizing a prompt).
    fn prepare_is_heavy(&self) -> bool {
        false
    }

    /// Starts producing the answer. What the work holds (a machine paid by the hour) is put
    /// on `work` before anything else, so it is billed however the request ends.
    fn produce<'a>(
        &'a self,
        job: &'a Job,
        plan: Plan,
        work: &'a mut Work,
    ) -> BoxFuture<'a, Result<Output, ApiError>>;

    /// What `work` cost. Called once per settled request.
    fn price(&self, work: &Work) -> Priced;

    /// What reusing `work.cached_tokens` prompt tokens saved (the lever `prefix_cache`):
    /// nothing where the backend cannot tell. Called once per settled request, after
    /// `price`.
    fn prefix_saving(&self, _work: &Work) -> Money {
        Money::ZERO
    }
}

/// A job checked by its backend.
pub struct Plan {
    /// The most the request can cost: what a tenant's budget holds back until it settles.
    pub worst_case: Money,
    /// Prompt tokens, where the backend counts them before it runs.
    pub prompt_tokens: Option<u64>,
    pub(crate) engine: Option<EngineRun>,
}

impl Plan {
    /// A plan that only bounds the cost (the backend counts no tokens before it runs).
    pub(crate) fn costing(worst_case: Money) -> Plan {
        Plan {
            worst_case,
            prompt_tokens: None,
            engine: None,
        }
    }

    /// The plan of a call to a machine paid by the hour: it cannot hold the machine longer
    /// than `timeout` on each of its `tries`, so that time at `rate` is its worst case
    /// (saturating: a timeout past the range holds the most there is, not $0).
    pub(crate) fn hourly(rate: Option<HourlyRate>, timeout: Duration, tries: u32) -> Plan {
        let micros = timeout.as_micros().saturating_mul(u128::from(tries));
        let micros = i128::try_from(micros).unwrap_or(i128::MAX);
        Plan::costing(rate.map_or(Money::ZERO, |r| {
            r.0.saturating_mul_div(micros, 3_600_000_000)
        }))
    }
}

/// What a request has spent so far; the pipeline settles it once.
#[derive(Default)]
pub struct Work {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// The local engine's time, and its share until the first token (the prefill).
    pub engine: EngineTime,
    pub prefill: Duration,
    /// An hourly machine held since the call began; the pipeline ends the hold and puts
    /// the call's share of the machine in `share`.
    pub hold: Option<Ticket>,
    pub share: Duration,
    /// Time a pool's activator held the request before a replica took it.
    pub wait: Duration,
}

/// A price: what the work cost, the machine time it used (on a machine paid by the hour),
/// and what batching saved it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Priced {
    pub cost: Money,
    pub busy: Option<Duration>,
    pub batching_saved: Money,
}

/// What a backend produces.
pub enum Output {
    /// Pieces of text the gateway renders (the engine's, or a cached answer's).
    Pieces(Source),
    /// An upstream's whole answer.
    Json(Value),
    /// An upstream's stream: the `data:` payloads as they arrive.
    Events(Pin<Box<dyn Stream<Item = Result<String, String>> + Send>>),
}

/// The model the gateway runs itself.
pub struct Local {
    pub engine: Engine,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    stop_tokens: Vec<u32>,
    /// Its name and hourly price.
    pub machine: Machine,
    /// Other names that reach it (the file's own name, when it is served under the name of
    /// a re-quantization); it is listed and billed under `machine.model` alone.
    pub aliases: Vec<String>,
    /// The kernels it runs on and how they were chosen (measured at start, or cached).
    pub kernels: Calibration,
    /// Recent cost per token in nano-dollars (a moving average), for the worst case of a
    /// request before it runs: the engine is priced by time, not by token.
    per_token: AtomicI64,
    /// The engine's recent prefill time per computed prompt token, which prices the
    /// prefill a prefix-cache hit spared.
    prefill: Mutex<PrefillRate>,
}

/// Prefill seconds and the prompt tokens they computed, both decayed by each new request,
/// so their ratio is a moving average weighted by tokens: a turn that computed a few
/// tokens past a long cached prefix (whose step costs are mostly fixed) moves it little.
#[derive(Debug, Default, Clone, Copy)]
struct PrefillRate {
    secs: f64,
    tokens: f64,
}

impl PrefillRate {
    fn add(&mut self, prefill: Duration, tokens: u64) {
        if tokens == 0 || prefill.is_zero() {
            return;
        }
        self.secs = self.secs * 0.875 + prefill.as_secs_f64();
        self.tokens = self.tokens * 0.875 + tokens as f64;
    }

    /// Engine time `tokens` prompt tokens take to prefill, by the recent rate.
    fn time(&self, tokens: u64) -> Duration {
        if self.tokens <= 0.0 {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(self.secs / self.tokens * tokens as f64).unwrap_or_default()
    }
}

impl Local {
    pub fn new(
        engine: Engine,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        machine: Machine,
        kernels: Calibration,
    ) -> Local {
        Local {
            engine,
            stop_tokens: tokenizer.end_of_generation().to_vec(),
            tokenizer: Arc::new(tokenizer),
            template,
            machine,
            aliases: Vec::new(),
            kernels,
            per_token: AtomicI64::new(0),
            prefill: Mutex::new(PrefillRate::default()),
        }
    }

    /// Loads the GGUF file at `path` and starts its engine, served as `machine.model`, with
    /// the scheduler `scheduler` sizes for the loaded model.
    pub fn load(
        path: &std::path::Path,
        options: LoadOptions,
        scheduler: impl FnOnce(&ModelConfig) -> SchedulerConfig,
        machine: Machine,
    ) -> Result<Local, LoadError> {
        if !path.exists() {
            return Err(LoadError::Missing(path.to_owned()));
        }
        let started = std::time::Instant::now();
        let (model, tokenizer, template) =
            load_parts(path, options).map_err(|source| LoadError::Load {
                path: path.to_owned(),
                source,
            })?;
        tracing::info!(
            model = %machine.model,
            weights_mb = model.weight_bytes() / 1_000_000,
            secs = started.elapsed().as_secs_f64(),
            "model loaded"
        );
        // Before the engine's first step fixes the process's kernel.
        let kernels = model.calibrate(&Calibrate::from_env());
        let scheduler = scheduler(&model.config);
        let engine = Engine::start(model, scheduler).map_err(LoadError::Engine)?;
        Ok(Local::new(engine, tokenizer, template, machine, kernels))
    }

    /// Whether a request naming `name` is for this model.
    pub fn answers_to(&self, name: &str) -> bool {
        name == self.machine.model || self.aliases.iter().any(|a| a == name)
    }

    /// Validates `job` into what the engine runs.
    pub fn engine_request(&self, job: &Job) -> Result<EngineRun, ApiError> {
        validate::engine_request(
            &self.tokenizer,
            &self.template,
            &self.stop_tokens,
            self.engine.context_len(),
            job,
        )
    }
}

/// Why the local model did not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "no model at {}: run `make models` (or scripts/fetch-models.sh) for the default, or pass --model FILE.gguf",
        .0.display()
    )]
    Missing(std::path::PathBuf),
    #[error("cannot load {}", .path.display())]
    Load {
        path: std::path::PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Engine(ModelError),
}

/// KV positions for `frugal serve`'s engine: the memory of four full contexts (at least
/// 4,096 positions each) in f32, so an 8-bit cache holds that many more positions in the
/// same bytes.
pub fn four_contexts(c: &ModelConfig) -> usize {
    c.ctx_len.max(4096) * 4 * KvType::F32.bytes_per_position(c) / c.kv.bytes_per_position(c).max(1)
}

/// A GGUF file's weights, tokenizer and chat template.
pub fn load_parts(
    path: &std::path::Path,
    options: LoadOptions,
) -> Result<(Model, Tokenizer, ChatTemplate), Box<dyn std::error::Error + Send + Sync>> {
    let gguf = Gguf::open(path)?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let template = ChatTemplate::from_gguf(&gguf)?;
    let model = Model::from_gguf(&gguf, options)?;
    Ok((model, tokenizer, template))
}

impl Backend for Local {
    fn name(&self) -> &str {
        &self.machine.model
    }

    fn prepare(&self, job: &Job) -> Result<Plan, ApiError> {
        let run = self.engine_request(job)?;
        let tokens = (run.request.prompt.len() + run.request.max_tokens) as i64;
        // Twice the recent average per token: decode is dearer per token than prefill, and
        // a batch may be slower than the recent ones.
        let per_token = self.per_token.load(Ordering::Relaxed).max(0);
        Ok(Plan {
            worst_case: Money::from_nanos(per_token.saturating_mul(tokens).saturating_mul(2)),
            prompt_tokens: Some(run.request.prompt.len() as u64),
            engine: Some(run),
        })
    }

    fn prepare_is_heavy(&self) -> bool {
        true
    }

    fn produce<'a>(
        &'a self,
        job: &'a Job,
        plan: Plan,
        _work: &'a mut Work,
    ) -> BoxFuture<'a, Result<Output, ApiError>> {
        Box::pin(async move {
            let Some(EngineRun { request, stops }) = plan.engine else {
                return Err(ApiError::Internal(
                    "the job was not prepared for the engine".into(),
                ));
            };
            let prompt_tokens = request.prompt.len();
            let rx = self.engine.submit(request).map_err(|e| match e {
                SubmitError::Overloaded(_) => ApiError::Overloaded(e.to_string()),
                SubmitError::TooLong { .. } => ApiError::ContextLength(e.to_string()),
                SubmitError::EmptyPrompt => ApiError::BadRequest(e.to_string()),
                SubmitError::Stopped => ApiError::Internal(e.to_string()),
            })?;
            Ok(Output::Pieces(Source::Live(Box::new(TextStream::new(
                rx,
                self.tokenizer.clone(),
                stops,
                job.top.is_some(),
                prompt_tokens,
            )))))
        })
    }

    fn price(&self, work: &Work) -> Priced {
        let cost = self.machine.cost(work.engine.shared);
        let tokens = work.prompt_tokens + work.completion_tokens;
        if tokens > 0 {
            let now = cost.nanos() / tokens as i64;
            let old = self.per_token.load(Ordering::Relaxed);
            let avg = if old == 0 { now } else { (old * 7 + now) / 8 };
            self.per_token.store(avg, Ordering::Relaxed);
        }
        // The prompt tokens this request computed took its time to the first token.
        let computed = work.prompt_tokens.saturating_sub(work.cached_tokens);
        self.prefill_rate().add(work.prefill, computed);
        Priced {
            cost,
            busy: Some(work.engine.shared),
            batching_saved: self.machine.cost(work.engine.saved()),
        }
    }

    /// The engine time prefilling the cached tokens would have taken at the engine's
    /// recent prefill rate, at the machine's price: what the bill (engine time actually
    /// spent) did not include. The cached tokens sit at the start of the prompt, where
    /// attention is cheapest, so the rate (over whole prompts) errs high by that.
    fn prefix_saving(&self, work: &Work) -> Money {
        if work.cached_tokens == 0 {
            return Money::ZERO;
        }
        self.machine
            .cost(self.prefill_rate().time(work.cached_tokens))
    }
}

impl Local {
    fn prefill_rate(&self) -> std::sync::MutexGuard<'_, PrefillRate> {
        self.prefill.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The most a call priced per token can cost: every prompt byte a token, every alternative
/// its whole `max_tokens` (or the model's `max_output` where it names none), saturating: an
/// absurd `max_tokens` holds the most there is, never $0.
pub(crate) fn token_worst_case(price: &ModelPrice, job: &Job, max_output: u64) -> Money {
    let output = job
        .n()
        .saturating_mul(job.max_tokens().unwrap_or(max_output));
    price.saturating_cost(job.prompt_bytes(), 0, output)
}

impl Upstream {
    /// Sends `job` as the client asked it (whole or streamed), once or with retries as
    /// configured.
    pub(crate) async fn call(&self, job: &Job) -> Result<Output, ApiError> {
        let reply = self
            .send(job.kind.path(), job.body.clone(), job.common.stream)
            .await?;
        Ok(match reply {
            Reply::Json(v) => Output::Json(v),
            Reply::Stream(resp) => Output::Events(Box::pin(crate::backend::upstream::sse_events(
                resp,
                self.max_event(),
            ))),
        })
    }
}

impl Backend for Upstream {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn prepare(&self, job: &Job) -> Result<Plan, ApiError> {
        Ok(match &self.config.pricing {
            Some(Pricing::Tokens(price)) => {
                Plan::costing(token_worst_case(price, job, self.config.max_output_tokens))
            }
            Some(Pricing::Hourly { rate, .. }) => Plan::hourly(
                Some(*rate),
                self.config.timeout,
                self.config.retries.saturating_add(1),
            ),
            None => Plan::costing(Money::ZERO),
        })
    }

    fn produce<'a>(
        &'a self,
        job: &'a Job,
        _plan: Plan,
        work: &'a mut Work,
    ) -> BoxFuture<'a, Result<Output, ApiError>> {
        Box::pin(async move {
            work.hold = Some(self.occupy());
            self.call(job).await
        })
    }

    fn price(&self, work: &Work) -> Priced {
        let usage = crate::http::api::Usage {
            prompt_tokens: work.prompt_tokens as usize,
            completion_tokens: work.completion_tokens as usize,
            total_tokens: (work.prompt_tokens + work.completion_tokens) as usize,
            cached_tokens: work.cached_tokens as usize,
        };
        Priced {
            cost: self
                .cost(&usage, work.cached_tokens, work.share)
                .unwrap_or(Money::ZERO),
            busy: self.machine().map(|_| work.share),
            batching_saved: Money::ZERO,
        }
    }

    /// The provider's cached-input discount on the tokens its usage says were cached
    /// (none on an hourly machine: its bill is its time, which the reuse already cut).
    fn prefix_saving(&self, work: &Work) -> Money {
        let Some(Pricing::Tokens(price)) = &self.config.pricing else {
            return Money::ZERO;
        };
        let (input, output) = (work.prompt_tokens, work.completion_tokens);
        let full = price.saturating_cost(input, 0, output);
        let paid = price.saturating_cost(input, work.cached_tokens, output);
        (full - paid).max(Money::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_rate_is_weighted_by_the_tokens_computed() {
        let mut rate = PrefillRate::default();
        assert_eq!(rate.time(100), Duration::ZERO, "nothing measured yet");
        rate.add(Duration::from_millis(100), 100);
        assert_eq!(rate.time(50), Duration::from_millis(50));
        // A turn that computed one token past a cached prefix, whose step was mostly fixed
        // costs: an average per request would make every token 5.5 ms.
        rate.add(Duration::from_millis(10), 1);
        let t = rate.time(100);
        assert!(
            t > Duration::from_millis(100) && t < Duration::from_millis(120),
            "{t:?}"
        );
    }
}
