//! `frugal batch run`: a batch job in OpenAI's format through the gateway `frugal serve`
//! would build, in process, each line's result written once. The same command resumes a
//! job; with `--store` its state is copied to an object store, so another machine can
//! resume it. A SIGTERM or a spot notice stops taking lines, lets those in flight finish
//! until the deadline, copies the state to the store and exits 75.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use frugal_cost::money::HourlyRate;
use frugal_cost::present::{thousands, usd_unit};
use frugal_cost::{Catalog, Money};
use frugal_gateway::batch::input::{self, Input, Limits};
use frugal_gateway::batch::run::{Ended, Progress, RunConfig, run as run_lines};
use frugal_gateway::batch::store::{self, JobStatus, Options, Paths, Store};
use frugal_train::notice::{Notice, NoticeSource};
use frugal_train::store::CheckpointStore;

use crate::cli::{BatchRunArgs, ServeArgs};
use crate::config::Config;
use crate::serve::Paid;
use crate::train::{machine_pricing, notice_source, seconds};

/// Time kept back from a spot notice's deadline to copy the state to the store.
const UPLOAD_MARGIN: Duration = Duration::from_secs(15);
/// Snapshots kept in the store.
const KEEP: usize = 2;

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
    let on_demand = paid.as_ref().and_then(|p| Some((p.rate, p.on_demand?)));
    let gateway = crate::serve::build(config, catalog, &serve_args(args), paid)?;
    let runtime = &gateway.runtime;
    let checkpoints = match &args.store {
        Some(url) => Some(
            CheckpointStore::open(url, &format!("batch-{}", &input.sha256[..16]))
                .with_context(|| format!("cannot open the store {url}"))?,
        ),
        None => None,
    };
    let relocate = match &checkpoints {
        Some(c) if !paths.state.join("batch.sqlite").exists() => {
            runtime.block_on(restore(c, &paths))?
        }
        _ => false,
    };
    let options = Options {
        completion_window: args.completion_window,
        relocate,
        ..Options::default()
    };
    let store = Arc::new(Store::open(&paths, &args.input, &input, &options)?);
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
        checkpoints: checkpoints.as_ref(),
    };
    let result = runtime.block_on(async {
        gateway.state.start_pools(&gateway.workload);
        let app = frugal_gateway::router(gateway.state.clone());
        let ticker = tick(&bar, &store, &progress, started);
        tokio::select! {
            r = job.run(app, args) => r,
            () = ticker => unreachable!("the progress ticker never ends"),
        }
    });
    bar.finish();
    gateway.close();
    let (ended, why) = result?;
    let counts = store.counts()?;
    let stored = checkpoints
        .as_ref()
        .map(|c| format!(", copied to {}", c.describe()))
        .unwrap_or_default();
    print_summary(&store, &progress, started.elapsed(), on_demand)?;
    match ended {
        Ended::Finished => {
            store.set_status(JobStatus::Completed)?;
            Ok(())
        }
        Ended::Stopped => Err(Stopped {
            job: store.job().id.clone(),
            why: why.unwrap_or_else(|| "stopped".into()),
            done: counts.completed + counts.failed,
            total: counts.total,
            stored,
        }
        .into()),
    }
}

/// How this machine is paid for when the flags say (spot, an instance, a price); `None`:
/// as `frugal serve` prices it.
fn paid(catalog: &Catalog, args: &BatchRunArgs) -> Result<Option<Paid>> {
    if !args.machine.spot
        && args.machine.instance.is_none()
        && args.machine.price_per_hour.is_none()
    {
        return Ok(None);
    }
    let p = machine_pricing(catalog, &args.machine)?;
    Ok(Some(Paid {
        rate: p.rate,
        instance_type: p.instance_type,
        capacity: p.capacity,
        on_demand: p.on_demand.filter(|od| *od != p.rate),
    }))
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

/// Brings the newest copy of the job from the store into `paths`; true when there was one.
async fn restore(checkpoints: &CheckpointStore, paths: &Paths) -> Result<bool> {
    let scratch = scratch_dir(paths, "restore")?;
    let found = checkpoints
        .restore_newest(&scratch)
        .await
        .with_context(|| format!("cannot restore the job from {}", checkpoints.describe()))?;
    let Some((manifest, dir)) = found else {
        return Ok(false);
    };
    store::restore_snapshot(&dir, paths)?;
    let _ = std::fs::remove_dir_all(&scratch);
    writeln!(
        std::io::stderr(),
        "frugal batch: resuming from {} ({} lines finished there)",
        checkpoints.describe(),
        manifest.step
    )?;
    Ok(true)
}

/// A folder beside the job's state for snapshots on their way to or from the store.
fn scratch_dir(paths: &Paths, what: &str) -> Result<PathBuf> {
    let mut name = paths.state.as_os_str().to_owned();
    name.push(format!(".{what}"));
    let dir = PathBuf::from(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// The job under way, with what stops it and where its state is copied.
struct Job<'a> {
    paths: &'a Paths,
    store: Arc<Store>,
    input: &'a Input,
    config: &'a RunConfig,
    progress: Arc<Progress>,
    checkpoints: Option<&'a CheckpointStore>,
}

impl Job<'_> {
    /// Runs the lines until done or stopped, copying the state to the store every
    /// `--store-every` and at the end; says how it ended, and why it stopped.
    async fn run(&self, app: axum::Router, args: &BatchRunArgs) -> Result<(Ended, Option<String>)> {
        let poll = seconds("--poll", args.machine.poll)?;
        let source = notice_source(&args.machine).await?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(None::<(String, Duration)>);
        let watch = async move {
            let (why, left) = tokio::select! {
                () = frugal_gateway::server::shutdown_signal() => {
                    ("a stop signal".to_owned(), seconds("--grace", args.grace).unwrap_or_default())
                }
                notice = wait_for_notice(source, poll) => {
                    let left = notice.time_left().saturating_sub(UPLOAD_MARGIN);
                    (format!("a {} preemption notice, {} s left", notice.cloud, notice.time_left().as_secs()), left)
                }
            };
            let _ = stop_tx.send(Some((why, left)));
            std::future::pending::<()>().await;
        };
        let mut stopped = stop_rx.clone();
        let stop = async move {
            let _ = stopped.wait_for(Option::is_some).await;
        };
        let mut abandoned = stop_rx.clone();
        let deadline = async move {
            let left = match abandoned.wait_for(Option::is_some).await {
                Ok(v) => v.as_ref().map_or(Duration::ZERO, |(_, left)| *left),
                Err(_) => return std::future::pending().await,
            };
            tokio::time::sleep(left).await;
        };
        let lines = run_lines(
            app,
            self.store.clone(),
            self.input,
            self.config,
            self.progress.clone(),
            stop,
        );
        let ended = tokio::select! {
            r = lines => r?,
            // Lines still in flight at the deadline stay pending: they run again next time.
            () = deadline => Ended::Stopped,
            () = watch => unreachable!("the watch never ends"),
            () = self.copy_every(args.store_every) => unreachable!("the copier never ends"),
        };
        let why = stop_rx.borrow().as_ref().map(|(why, _)| why.clone());
        if let Err(e) = self.copy().await {
            // The job is whole here; only a move to another machine needs the copy.
            writeln!(
                std::io::stderr(),
                "frugal batch: {e:#}; the job's state is complete in {}",
                self.paths.state.display()
            )?;
        }
        Ok((ended, why))
    }

    /// Copies the state to the store each `every` while lines finish; a failed copy is
    /// said and tried again next time (the job goes on: only a move needs the copy).
    async fn copy_every(&self, every: Duration) {
        if self.checkpoints.is_none() {
            return std::future::pending().await;
        }
        let mut last = 0;
        loop {
            tokio::time::sleep(every.max(Duration::from_secs(1))).await;
            let finished = self.finished();
            if finished == last {
                continue;
            }
            match self.copy().await {
                Ok(()) => last = finished,
                Err(e) => tracing::warn!("the batch state was not copied to the store: {e:#}"),
            }
        }
    }

    fn finished(&self) -> usize {
        self.store.counts().map_or(0, |c| c.completed + c.failed)
    }

    /// Copies the state as it stands to the store, under the number of lines finished.
    async fn copy(&self) -> Result<()> {
        let Some(checkpoints) = self.checkpoints else {
            return Ok(());
        };
        let dir = scratch_dir(self.paths, "snapshot")?;
        let store = self.store.clone();
        let snap = dir.clone();
        tokio::task::spawn_blocking(move || store.snapshot(&snap))
            .await
            .context("the snapshot's thread stopped")??;
        checkpoints
            .upload(self.finished() as u64, &dir)
            .await
            .with_context(|| {
                format!("cannot copy the batch state to {}", checkpoints.describe())
            })?;
        if let Err(e) = checkpoints.prune(KEEP).await {
            tracing::warn!("old copies of the batch state were not removed: {e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}

/// The first preemption notice (never, without a source).
async fn wait_for_notice<S: NoticeSource>(source: Option<S>, poll: Duration) -> Notice {
    let Some(mut source) = source else {
        return std::future::pending().await;
    };
    loop {
        match source.check().await {
            Ok(Some(notice)) => {
                if let Err(e) = source.acknowledge(&notice).await {
                    tracing::warn!("the preemption notice was not acknowledged: {e}");
                }
                return notice;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("cannot read preemption notices: {e}"),
        }
        tokio::time::sleep(poll).await;
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
