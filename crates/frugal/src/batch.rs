//! `frugal batch run`: a batch job in OpenAI's format through the gateway `frugal serve`
//! would build, in process, each line's result written once. The same command resumes a
//! job; with `--store` its state is copied to an object store, so another machine can
//! resume it. A SIGTERM or a spot notice stops taking lines, lets those in flight finish
//! until the deadline, copies the state to the store and exits 75: the gateway's
//! `batch::spot` does it; this file turns the flags into its settings and prints.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use frugal_cloud::price::Pricing;
use frugal_cost::money::HourlyRate;
use frugal_cost::present::{thousands, usd, usd_unit};
use frugal_cost::{Catalog, Money};
use frugal_gateway::backend::model_ref::ModelRef;
use frugal_gateway::batch::input::{self, Limits};
use frugal_gateway::batch::run::{Ended, Progress, RunConfig};
use frugal_gateway::batch::spot::{self, Job, Stops};
use frugal_gateway::batch::store::{JobStatus, Options, Paths, Store};

use crate::cli::{BatchRunArgs, ServeArgs};
use crate::config::Config;
use crate::train::{machine_pricing, notice_source, seconds};

/// A job stopped before its end, its progress kept: main exits with
/// [`crate::train::EXIT_RESUMABLE`].
#[derive(Debug, thiserror::Error)]
#[error(
    "batch {job} stopped ({why}) with {done} of {total} lines finished and saved{stored}: run the same command to resume"
)]
pub struct Stopped {
    job: String,
    why: String,
    done: usize,
    total: usize,
    stored: String,
}

pub fn run(config: &Config, catalog: &Catalog, args: &BatchRunArgs) -> Result<()> {
    check(args)?;
    let input = input::read(&args.input, &Limits::default())?;
    let mut paths = Paths::beside(&args.output);
    if let Some(errors) = &args.errors {
        paths.errors.clone_from(errors);
    }
    if let Some(state) = &args.state {
        paths.state.clone_from(state);
    }
    let paid = paid(catalog, args)?;
    let on_demand = paid
        .as_ref()
        .and_then(|p| Some((p.rate, p.on_demand_apart()?)));
    let gateway = crate::serve::build(config, catalog, &serve_args(args), paid)?;
    let runtime = &gateway.runtime;
    let copies = match &args.store {
        Some(url) => Some(spot::open_copies(url, &input)?),
        None => None,
    };
    let options = Options {
        completion_window: args.completion_window,
        ..Options::default()
    };
    let opened = spot::open_job(&paths, &args.input, &input, copies.as_ref(), options);
    let (store, moved) = runtime.block_on(opened)?;
    if let (Some(finished), Some(c)) = (moved, &copies) {
        writeln!(
            std::io::stderr(),
            "frugal batch: resuming from {} ({finished} lines finished there)",
            c.describe(),
        )?;
    }
    let store = Arc::new(store);
    let total = store.counts()?.total;
    writeln!(
        std::io::stderr(),
        "frugal batch: {} ({total} lines, {} left) on {}",
        store.job().id,
        store.pending()?.len(),
        gateway.what
    )?;
    let progress = Arc::new(Progress::default());
    let bar = crate::progress::Bar::lines(total as u64);
    // `--model FILE.gguf` runs that file here, and every line asks for it by its served name.
    let model = match &args.model {
        Some(ModelRef::File(_)) => Some(gateway.state.local_name().to_owned()),
        Some(ModelRef::Served(name)) => Some(name.clone()),
        None => None,
    };
    let config = RunConfig {
        concurrency: args.concurrency.max(1),
        max_attempts: args.max_attempts.max(1),
        model,
        ..RunConfig::default()
    };
    let started = Instant::now();
    let job = Job {
        paths: &paths,
        store: store.clone(),
        input: &input,
        config: &config,
        progress: progress.clone(),
        copies: copies.as_ref(),
    };
    let result = runtime.block_on(async {
        gateway.state.start_pools(&gateway.workload);
        let app = frugal_gateway::router(gateway.state.clone());
        let ticker = tick(&bar, &store, &progress, started);
        let run = async {
            let stops = Stops {
                poll: seconds("--poll", args.machine.poll)?,
                notices: notice_source(&args.machine).await?,
                grace: seconds("--grace", args.grace).unwrap_or_default(),
                copy_every: args.store_every,
            };
            let mut outcome = job.run(app, stops).await?;
            if let Some(e) = outcome.copy_failed.take() {
                writeln!(
                    std::io::stderr(),
                    "frugal batch: {:#}; the job's state is complete in {}",
                    anyhow::Error::from(e),
                    paths.state.display()
                )?;
            }
            anyhow::Ok(outcome)
        };
        tokio::select! {
            r = run => r,
            () = ticker => unreachable!("the progress ticker never ends"),
        }
    });
    bar.finish();
    gateway.close();
    let outcome = result?;
    let counts = store.counts()?;
    let stored = copies
        .as_ref()
        .map(|c| format!(", copied to {}", c.describe()))
        .unwrap_or_default();
    let summary = Summary::of(&store, &progress, started.elapsed(), on_demand)?;
    if args.json {
        crate::table::print_json(&summary)?;
    } else {
        summary.print()?;
    }
    match outcome.ended {
        Ended::Finished => {
            store.set_status(JobStatus::Completed)?;
            Ok(())
        }
        Ended::Stopped => Err(Stopped {
            job: store.job().id.clone(),
            why: outcome.why.unwrap_or_else(|| "stopped".into()),
            done: counts.completed + counts.failed,
            total: counts.total,
            stored,
        }
        .into()),
    }
}

/// How this machine is paid for when the flags say (spot, an instance, a price); `None`:
/// as `frugal serve` prices it.
fn paid(catalog: &Catalog, args: &BatchRunArgs) -> Result<Option<Pricing>> {
    if !args.machine.spot
        && args.machine.instance.is_none()
        && args.machine.price_per_hour.is_none()
    {
        return Ok(None);
    }
    Ok(Some(machine_pricing("batch run", catalog, &args.machine)?))
}

/// The gateway `frugal serve` would build for these flags, its idle time recorded as batch.
fn serve_args(args: &BatchRunArgs) -> ServeArgs {
    let file = match &args.model {
        Some(ModelRef::File(path)) => Some(path.clone()),
        _ => None,
    };
    ServeArgs {
        model: file.or_else(|| args.model_file.clone()),
        no_model: args.no_model,
        embedder: args.embedder.clone(),
        no_semantic_cache: args.no_semantic_cache,
        threads: args.threads,
        max_batch: args.max_batch,
        metadata_url: args.machine.metadata_url.clone(),
        workload: Some(frugal_gateway::meter::BATCH_WORKLOAD.into()),
        no_meter: args.no_meter,
        ..ServeArgs::default()
    }
}

/// Redraws the progress bar until dropped.
async fn tick(bar: &crate::progress::Bar, store: &Store, progress: &Progress, started: Instant) {
    let mut every = tokio::time::interval(Duration::from_millis(250));
    loop {
        every.tick().await;
        let Ok(counts) = store.counts() else { continue };
        let secs = started.elapsed().as_secs_f64().max(1e-3);
        let tokens = progress.tokens.load(Ordering::Relaxed);
        bar.set(
            (counts.completed + counts.failed) as u64,
            format!(
                "{} failed, {} retries, {:.0} tok/s, {}",
                counts.failed,
                progress.retries.load(Ordering::Relaxed),
                tokens as f64 / secs,
                Money::from_nanos(progress.cost_nanos.load(Ordering::Relaxed))
            ),
        );
    }
}

/// What the job did in this run, and what it cost per line and per million tokens
/// (`--json` prints it as it is).
#[derive(serde::Serialize)]
struct Summary {
    job: String,
    lines: u64,
    finished: u64,
    failed: u64,
    /// Lines this run answered, done or failed.
    answered: u64,
    seconds: f64,
    tokens: u64,
    retries: u64,
    cost: Money,
    per_1k_lines: Option<Money>,
    per_1m_tokens: Option<Money>,
    /// The same machine time at the on-demand price, where the job ran below it.
    on_demand: Option<Money>,
    output: String,
    errors: String,
}

impl Summary {
    fn of(
        store: &Store,
        progress: &Progress,
        elapsed: Duration,
        on_demand: Option<(HourlyRate, HourlyRate)>,
    ) -> Result<Summary> {
        let counts = store.counts()?;
        let job = store.job();
        let cost = Money::from_nanos(progress.cost_nanos.load(Ordering::Relaxed));
        let tokens = progress.tokens.load(Ordering::Relaxed);
        let answered =
            progress.done.load(Ordering::Relaxed) + progress.failed.load(Ordering::Relaxed);
        let per = |n: u64, unit: u64| {
            (answered > 0)
                .then(|| cost.mul_div(i128::from(unit), i128::from(n.max(1))))
                .flatten()
        };
        let on_demand = match on_demand {
            Some((rate, od)) if rate.0 > Money::ZERO && answered > 0 => cost
                .mul_div(i128::from(od.0.nanos()), i128::from(rate.0.nanos()))
                .or(Some(cost)),
            _ => None,
        };
        Ok(Summary {
            job: job.id.to_string(),
            lines: counts.total as u64,
            finished: (counts.completed + counts.failed) as u64,
            failed: counts.failed as u64,
            answered,
            seconds: elapsed.as_secs_f64(),
            tokens,
            retries: progress.retries.load(Ordering::Relaxed),
            cost,
            per_1k_lines: per(answered, 1_000),
            per_1m_tokens: per(tokens, 1_000_000),
            on_demand,
            output: job.output_path.display().to_string(),
            errors: job.errors_path.display().to_string(),
        })
    }

    fn print(&self) -> Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "Batch {}: {} of {} lines finished ({} failed); this run answered {} in {:.1} s, {} tokens, {} retries",
            self.job,
            thousands(self.finished),
            thousands(self.lines),
            thousands(self.failed),
            thousands(self.answered),
            self.seconds,
            thousands(self.tokens),
            self.retries,
        )?;
        if self.answered > 0 {
            let unit = |m: Option<Money>| usd_unit(m.unwrap_or(Money::ZERO));
            write!(
                out,
                "cost {}: {} per 1k lines, {} per 1M tokens",
                usd(self.cost),
                unit(self.per_1k_lines),
                unit(self.per_1m_tokens),
            )?;
            match self.on_demand {
                Some(list) => writeln!(
                    out,
                    "; {} on demand (saved {})",
                    usd(list),
                    usd(list - self.cost)
                )?,
                None => writeln!(out)?,
            }
        }
        writeln!(out, "output {}, errors {}", self.output, self.errors)?;
        Ok(())
    }
}

/// Refuses flags that cannot run before anything loads.
fn check(args: &BatchRunArgs) -> Result<()> {
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if let Some(ModelRef::File(path)) = &args.model {
        if args.no_model {
            bail!(
                "--model {} is a model file to run here, and --no-model runs none",
                path.display()
            );
        }
        if let Some(file) = args.model_file.as_ref().filter(|f| *f != path) {
            bail!(
                "--model {} and --model-file {} name two model files: give one",
                path.display(),
                file.display()
            );
        }
    }
    if args.completion_window.is_zero() {
        bail!("--completion-window must be longer than zero");
    }
    Ok(())
}
