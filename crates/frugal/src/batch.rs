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
use frugal_cost::present::{thousands, usd_unit};
use frugal_cost::{Catalog, Money};
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
    let config = RunConfig {
        concurrency: args.concurrency.max(1),
        max_attempts: args.max_attempts.max(1),
        model: args.model.clone(),
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
    print_summary(&store, &progress, started.elapsed(), on_demand)?;
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
    ServeArgs {
        model: args.model_file.clone(),
        no_model: args.no_model,
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

/// What the job did in this run, and what it cost per line and per million tokens.
fn print_summary(
    store: &Store,
    progress: &Progress,
    elapsed: Duration,
    on_demand: Option<(HourlyRate, HourlyRate)>,
) -> Result<()> {
    let counts = store.counts()?;
    let job = store.job();
    let cost = Money::from_nanos(progress.cost_nanos.load(Ordering::Relaxed));
    let tokens = progress.tokens.load(Ordering::Relaxed);
    let answered = progress.done.load(Ordering::Relaxed) + progress.failed.load(Ordering::Relaxed);
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Batch {}: {} of {} lines finished ({} failed); this run answered {} in {:.1} s, {} tokens, {} retries",
        job.id,
        thousands((counts.completed + counts.failed) as u64),
        thousands(counts.total as u64),
        thousands(counts.failed as u64),
        thousands(answered),
        elapsed.as_secs_f64(),
        thousands(tokens),
        progress.retries.load(Ordering::Relaxed),
    )?;
    if answered > 0 {
        let per = |n: u64, unit: u64| cost.mul_div(i128::from(unit), i128::from(n.max(1)));
        write!(
            out,
            "cost {cost}: {} per 1k lines, {} per 1M tokens",
            usd_unit(per(answered, 1_000).unwrap_or(Money::ZERO)),
            usd_unit(per(tokens, 1_000_000).unwrap_or(Money::ZERO)),
        )?;
        match on_demand {
            Some((rate, od)) if rate.0 > Money::ZERO => {
                let list = cost
                    .mul_div(i128::from(od.0.nanos()), i128::from(rate.0.nanos()))
                    .unwrap_or(cost);
                writeln!(out, "; {list} on demand (saved {})", list - cost)?;
            }
            _ => writeln!(out)?,
        }
    }
    writeln!(
        out,
        "output {}, errors {}",
        job.output_path.display(),
        job.errors_path.display()
    )?;
    Ok(())
}

/// Refuses flags that cannot run before anything loads.
fn check(args: &BatchRunArgs) -> Result<()> {
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if args.completion_window.is_zero() {
        bail!("--completion-window must be longer than zero");
    }
    Ok(())
}
