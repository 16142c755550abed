//! A gateway that runs: built from its checked [`Assembly`], its local model and its
//! ledger ([`Gateway::build`]), served on a listener until a signal ([`Gateway::serve`]),
//! and closed so that every settled row reaches the ledger ([`Gateway::close`]).
//!
//! `frugal serve` puts one on a port; `frugal batch run` sends its lines through its router
//! in process. What needs the process (flags, the environment, printing) stays with them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use frugal_cost::ledger::LedgerError;
use frugal_cost::money::HourlyRate;
use frugal_cost::{Capacity, Ledger, Location, Money};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::signal::unix::Signal;

use crate::admit::budget::SharedBudgets;
use crate::admit::keys::{Changes, KeySet};
use crate::backend::Local;
use crate::backend::upstream::Upstream;
use crate::batch::service::BatchConfig;
use crate::cache::shared::SharedCache;
use crate::gateway::Assembly;
use crate::meter::{Machine, Meter, MeterConfig, MeterError};
use crate::request::state::AppState;

#[derive(Debug, Error)]
pub enum BuildError {
    #[error("cannot create {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Meter(#[from] MeterError),
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("cannot reach the shared cache: {0}")]
    SharedCache(String),
    #[error("cannot reach the shared budgets: {0}")]
    SharedBudgets(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

#[derive(Debug, Error)]
pub enum ServeError {
    #[error("cannot start the budgets' ledger reader")]
    BudgetsReader(#[source] std::io::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Where and as what a gateway's usage is metered.
pub struct Metering {
    pub ledger: Location,
    /// Where rows wait while a PostgreSQL ledger is unreachable.
    pub spool: PathBuf,
    /// What the local model's machine is bought as.
    pub capacity: Capacity,
}

/// What a gateway is built with besides its assembly and local model.
pub struct Setup {
    /// The ledger's workload of what it serves.
    pub workload: String,
    /// `None`: nothing is metered (`--no-meter`).
    pub metering: Option<Metering>,
    /// Where the Batch API keeps its files and batches; `None`: no Batch API (a pool's
    /// replica serves its gateway's lines and takes none of its own).
    pub batches: Option<PathBuf>,
}

/// A gateway built, not yet listening.
pub struct Gateway {
    pub state: AppState,
    pub runtime: tokio::runtime::Runtime,
    pub workload: String,
    /// What it serves, in words.
    pub what: String,
    /// The ledger it meters into, where keys read their tenants' spend on a reload.
    ledger: Option<Location>,
    /// Budgets kept only in this process over a shared (PostgreSQL) ledger: they catch up
    /// with the other replicas' spend from it.
    catch_up: bool,
}

impl Gateway {
    /// Opens the meter, starts the runtime, connects the shared cache and budgets, and
    /// preloads the tenants' spend of the day and month from the ledger.
    pub fn build(
        assembly: Assembly,
        local: Option<Local>,
        setup: Setup,
    ) -> Result<Gateway, BuildError> {
        let what = match &local {
            Some(l) => format!(
                "{} (machine at {}/h; {})",
                l.machine.model, l.machine.rate.0, l.kernels
            ),
            None => format!(
                "a gateway to {} upstream(s) and {} pool(s)",
                assembly.upstreams.len(),
                assembly.pools.len()
            ),
        };
        let meter = match &setup.metering {
            Some(m) => Some(start_meter(m, &setup.workload, &assembly, local.as_ref())?),
            None => None,
        };
        // Beside a local model the engine's threads take the cores and two async workers
        // carry the HTTP; a gateway alone uses them all.
        let workers = if local.is_some() {
            2
        } else {
            std::thread::available_parallelism().map_or(2, usize::from)
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .map_err(BuildError::Runtime)?;
        let shared = match (&assembly.shared_cache, &assembly.cache) {
            (Some(url), Some(cache)) => Some(
                runtime
                    .block_on(SharedCache::connect(url, cache.ttl))
                    .map_err(BuildError::SharedCache)?,
            ),
            _ => None,
        };
        let budgets = match &assembly.budget_redis {
            Some(url) => Some(
                runtime
                    .block_on(SharedBudgets::connect(url))
                    .map_err(BuildError::SharedBudgets)?,
            ),
            None => None,
        };
        let ledger = setup.metering.map(|m| m.ledger);
        // Started with no keys too: a reload may add tenants with budgets (the catch-up
        // reads nothing while none has one).
        let catch_up =
            matches!(ledger, Some(Location::Postgres(_))) && assembly.budget_redis.is_none();
        let (max_active, upload_quota) = (assembly.batch_max_active, assembly.batch_upload_quota);
        let mut parts = assembly.into_parts(local, meter, shared, budgets);
        if let Some(location) = &ledger {
            // Budgets count what the ledger already has for this day and month.
            let ledger = Ledger::open(location)?;
            parts.keys.preload(chrono::Utc::now(), |start| {
                ledger.tenant_spend(start.timestamp_millis())
            })?;
        }
        parts.batches = setup.batches.map(|dir| BatchConfig {
            max_active,
            upload_quota,
            ..BatchConfig::new(dir)
        });
        Ok(Gateway {
            state: AppState::new(parts),
            runtime,
            workload: setup.workload,
            what,
            ledger,
            catch_up,
        })
    }

    /// Serves on `listener` until `shutdown`, with its pools and batches running; each
    /// `hangup` (SIGHUP) reloads the keys. Requests in flight get `drain` to finish; running
    /// batches then stop resumable.
    pub async fn serve(
        &self,
        listener: TcpListener,
        hangup: Signal,
        keys: KeysReload,
        shutdown: impl Future<Output = ()> + Send + 'static,
        drain: Duration,
    ) -> Result<(), ServeError> {
        let state = &self.state;
        state.start_pools(&self.workload);
        state.start_batches();
        if self.catch_up
            && let Some(location) = &self.ledger
        {
            catch_up_budgets(state.clone(), location.clone())?;
        }
        tokio::spawn(reload_on_hangup(
            hangup,
            state.clone(),
            Arc::new(keys),
            self.ledger.clone(),
        ));
        let app = crate::router(state.clone());
        let served = crate::serve(listener, app, shutdown, drain).await;
        // Shadows under way get the same drain to reach their samples; one cut off after it
        // settles as cancelled, billed, when the runtime drops it.
        state.inner.shadows.finish(drain).await;
        // Running batches stop resumable before the pools they may use.
        state.stop_batches().await;
        Ok(served?)
    }

    /// Stops the pools, settles into Redis the spend it has not taken yet, lets what was
    /// cut off settle as its tasks are dropped with the runtime, then has the meter write
    /// every settled row before the process exits.
    pub fn close(self) {
        let meter = self.state.meter();
        self.runtime.block_on(async {
            self.state.stop_pools().await;
            if let Some(budgets) = self.state.inner.keys.shared() {
                budgets.flush(BUDGETS_FLUSH).await;
            }
        });
        self.runtime.shutdown_timeout(Duration::from_secs(5));
        if let Some(meter) = meter {
            meter.close();
        }
    }
}

/// The meter of `assembly`'s machines (the local model's, self-hosted upstreams' and the
/// pools'), writing to `m`'s ledger.
fn start_meter(
    m: &Metering,
    workload: &str,
    assembly: &Assembly,
    local: Option<&Local>,
) -> Result<Meter, BuildError> {
    if let Some(dir) = m
        .ledger
        .path()
        .and_then(|p| p.parent())
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir).map_err(|source| BuildError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
    }
    // Every row goes through the journal of a PostgreSQL ledger: without it, no start.
    if let Location::Postgres(_) = m.ledger
        && let Some(dir) = m.spool.parent().filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir).map_err(|source| BuildError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
    }
    Ok(Meter::start(MeterConfig {
        spool: Some(m.spool.clone()),
        ledger: m.ledger.clone(),
        workload: workload.to_owned(),
        capacity: Some(m.capacity),
        pools: assembly
            .pools
            .iter()
            .map(|p| Machine {
                model: p.config.name.clone(),
                rate: p.config.rate.unwrap_or(HourlyRate(Money::ZERO)),
                instance_type: p.config.instance_type.clone(),
                on_demand: None,
            })
            .collect(),
        machines: local
            .map(|l| l.machine.clone())
            .into_iter()
            .chain(assembly.upstreams.iter().filter_map(Upstream::machine))
            .collect(),
    })?)
}

/// How long a gateway that stops waits for Redis to take the spend it has not settled
/// there (the ledger has it either way: a gateway that starts counts it).
const BUDGETS_FLUSH: Duration = Duration::from_secs(5);

/// How often budgets on a PostgreSQL ledger without Redis catch up with the spend the
/// other replicas wrote: between two catch-ups, N replicas can overshoot a budget by what
/// they spend in that time, besides the holds in flight (`budget_redis` bounds it by one
/// hold). Each catch-up sums the tenants' events of the month, on an index.
const CATCH_UP_EVERY: Duration = Duration::from_secs(5);

/// Keeps this gateway's budgets up with the other replicas' spend in a shared ledger, on a
/// thread of its own (the ledger's client blocks), for as long as the process runs.
fn catch_up_budgets(state: AppState, location: Location) -> Result<(), ServeError> {
    std::thread::Builder::new()
        .name("frugal-budgets".into())
        .spawn(move || {
            let mut ledger: Option<Ledger> = None;
            let mut failing = false;
            loop {
                std::thread::sleep(CATCH_UP_EVERY);
                let caught_up = ledger
                    .take()
                    .map_or_else(|| Ledger::open(&location), Ok)
                    .and_then(|l| {
                        let read = state.catch_up_budgets(|start| {
                            l.tenant_spend(start.timestamp_millis())
                        });
                        ledger = Some(l);
                        read
                    });
                match caught_up {
                    Err(e) if !failing => {
                        failing = true;
                        let e = frugal_cost::causes::with_causes(&e);
                        tracing::warn!(error = %e, "budgets cannot read the other replicas' spend from the ledger; counting this gateway's own until it answers");
                    }
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("budgets read the other replicas' spend from the ledger again");
                    }
                    _ => {}
                }
            }
        })
        .map(drop)
        .map_err(ServeError::BudgetsReader)
}

/// How a running gateway reloads its keys: the caller reads the config again and says
/// what came of it.
pub struct KeysReload {
    /// The checked `[[serve.key]]` entries and `allow_open`, read again.
    pub read: Box<dyn Fn() -> Result<KeySet, String> + Send + Sync>,
    /// Told what changed, or why the reload was refused (the keys then stay as they were).
    pub told: Box<dyn Fn(Result<Changes, String>) + Send + Sync>,
}

/// Swaps in the keys and budgets `keys` reads on each SIGHUP (the rest of `[serve]` takes a
/// restart); new tenants start from the ledger's spend when metered.
async fn reload_on_hangup(
    mut hangup: Signal,
    state: AppState,
    keys: Arc<KeysReload>,
    ledger: Option<Location>,
) {
    while hangup.recv().await.is_some() {
        let (state, keys, ledger) = (state.clone(), keys.clone(), ledger.clone());
        let reloaded = tokio::task::spawn_blocking(move || {
            (keys.told)(state.reload_keys((keys.read)(), |start| match &ledger {
                Some(l) => Ledger::open(l).and_then(|l| l.tenant_spend(start.timestamp_millis())),
                None => Ok(Vec::new()),
            }));
        });
        if let Err(e) = reloaded.await {
            tracing::error!("config reload stopped: {e}");
        }
    }
}

/// Ctrl-C or SIGTERM: the gateway finishes what is in flight and stops.
pub async fn shutdown_signal() {
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
