//! Starting, probing and stopping one replica of each kind.
//!
//! A `process` replica is a child in its own process group (so SIGTERM and SIGKILL reach
//! whatever it forks), its output appended to a log file of its own, ready once its health
//! path answers 2xx. It is SIGKILLed by the kernel if the gateway dies, `kill -9` included
//! (a parent-death signal: see [`die_with_parent`]). A `local` replica is an engine loaded in this process. An `external`
//! pool has one endpoint that something else scales; it is ready while its health path
//! answers.

use frugal_cost::causes::with_causes;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use frugal_cost::Money;
use frugal_cost::money::HourlyRate;
use frugal_engine::model::LoadOptions;
use frugal_engine::scheduler::SchedulerConfig;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::sync::watch;

use crate::backend::Local;
use crate::backend::upstream::{Clock, Upstream, UpstreamConfig};
use crate::meter::Machine;

use super::settings::NO_PREFIX_CACHE_ENV;
use super::{Kind, PoolConfig};

/// How often a starting replica's health path is asked.
const PROBE_EVERY: Duration = Duration::from_millis(100);
/// One probe's limit: a health path that hangs is a probe that failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// After SIGKILL, how long to wait for the exit to be seen.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// A replica that is ready: where its requests go, and the clock that shares its time.
pub(crate) struct Serving {
    pub id: u32,
    pub target: Target,
    pub clock: Arc<Mutex<Clock>>,
    pub process: Option<Process>,
    /// Its origin, where its own `/metrics` is: none for an engine in this process.
    pub url: Option<String>,
}

impl Serving {
    /// Requests on this replica now.
    pub fn in_flight(&self) -> u32 {
        self.clock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .in_flight
    }
}

pub(crate) enum Target {
    /// An OpenAI-compatible server: a process replica, or an external pool's endpoint.
    Http(Box<Upstream>),
    /// frugal's own engine in this process.
    Local(Arc<Local>),
}

/// A replica's process: its group, its log, and its exit once seen.
pub(crate) struct Process {
    pub pid: Pid,
    pub log: PathBuf,
    exited: watch::Receiver<Option<ExitStatus>>,
}

impl Process {
    /// Resolves when the process has exited, with its status (`None`: unknown).
    pub async fn exited(&self) -> Option<ExitStatus> {
        let mut rx = self.exited.clone();
        let seen = rx.wait_for(Option::is_some).await;
        seen.ok().and_then(|s| *s)
    }

    pub(crate) fn has_exited(&self) -> bool {
        self.exited.borrow().is_some()
    }

    /// To the whole group, whether or not its leader is still there: a worker it forked
    /// may be. (A group's id is not reused while any member lives, so this reaches no one
    /// else; once all are gone it is ESRCH.)
    fn signal(&self, sig: Signal) {
        if let Err(e) = nix::sys::signal::killpg(self.pid, sig) {
            tracing::debug!(pid = %self.pid, ?sig, "killpg: {e}");
        }
    }

    /// SIGTERM to the group; SIGKILL if its leader is still there after `grace`, and to
    /// the group in any case, for members that outlived their leader.
    pub async fn stop(&self, grace: Duration) {
        self.signal(Signal::SIGTERM);
        if tokio::time::timeout(grace, self.exited()).await.is_err() {
            tracing::warn!(pid = %self.pid, ?grace, "replica did not stop after SIGTERM; killing it");
        }
        self.signal(Signal::SIGKILL);
        let _ = tokio::time::timeout(KILL_WAIT, self.exited()).await;
    }
}

impl Drop for Process {
    /// A replica never outlives the handle that owns it (a gateway that panics included;
    /// one that is SIGKILLed takes its replicas along by their parent-death signal).
    fn drop(&mut self) {
        // Only while the leader lives: long after its exit, its id could name a new group.
        if !self.has_exited() {
            self.signal(Signal::SIGKILL);
        }
    }
}

/// Starts replica `id` of `pool` and waits until it is ready, within the pool's
/// `cold_start_timeout`. The error says why, in words for the log and a 503.
pub(crate) async fn start(
    pool: &PoolConfig,
    id: u32,
    log_dir: &Path,
    probe: &reqwest::Client,
) -> Result<Serving, String> {
    let deadline = Instant::now() + pool.cold_start_timeout;
    match &pool.kind {
        Kind::Process { command, model, .. } => {
            start_process(
                pool,
                id,
                command,
                model.as_deref(),
                log_dir,
                probe,
                deadline,
            )
            .await
        }
        Kind::Local { model } => start_local(pool, id, model).await,
        Kind::External { url } => {
            let health = format!("{}{}", origin(url), pool.health);
            wait_ready(probe, &health, deadline, None).await?;
            Ok(Serving {
                id,
                target: Target::Http(Box::new(http_target(pool, id, url)?)),
                clock: Clock::shared(),
                process: None,
                url: Some(origin(url).to_owned()),
            })
        }
    }
}

/// `http://host:port` of a URL (`http://host:port/v1` -> `http://host:port`).
fn origin(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    match url[after..].find('/') {
        Some(i) => &url[..after + i],
        None => url,
    }
}

/// Requests to a replica are sent once: a failure is retried on another replica by the
/// pool, which knows which one failed. The model name is left out: a replica serves one
/// model under whatever name its own command gave it.
fn http_target(pool: &PoolConfig, id: u32, url: &str) -> Result<Upstream, String> {
    let mut c = UpstreamConfig::new(&format!("{}/{id}", pool.name), url);
    c.model = String::new();
    c.retries = 0;
    c.timeout = pool.timeout;
    c.connect_timeout = Duration::from_secs(2);
    Upstream::new(c).map_err(|e| e.to_string())
}

async fn start_process(
    pool: &PoolConfig,
    id: u32,
    command: &[String],
    model: Option<&Path>,
    log_dir: &Path,
    probe: &reqwest::Client,
    deadline: Instant,
) -> Result<Serving, String> {
    let port = free_port()?;
    let model = model.map(|m| m.display().to_string()).unwrap_or_default();
    let args: Vec<String> = command
        .iter()
        .map(|a| {
            a.replace("{port}", &port.to_string())
                .replace("{model}", &model)
                .replace("{replica}", &id.to_string())
        })
        .collect();
    std::fs::create_dir_all(log_dir)
        .map_err(|e| format!("cannot create the log folder {}: {e}", log_dir.display()))?;
    let log = log_dir.join(format!("{}-{id}.log", file_safe(&pool.name)));
    let out = std::fs::File::options()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    let mut command = tokio::process::Command::new(&args[0]);
    command
        .args(&args[1..])
        .env(super::REPLICA_ENV, format!("{}/{id}", pool.name))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    if !pool.prefix_cache {
        command.env(NO_PREFIX_CACHE_ENV, "true");
    }
    die_with_parent(&mut command);
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", args[0]))?;
    let pid = child
        .id()
        .map(|p| Pid::from_raw(p as i32))
        .ok_or("the replica exited as it started")?;
    let (tx, exited) = watch::channel(None);
    tokio::spawn(async move {
        let status = child.wait().await.ok();
        let _ = tx.send(Some(status.unwrap_or_else(failed_status)));
    });
    let process = Process { pid, log, exited };
    tracing::info!(pool = %pool.name, replica = id, %pid, port, "starting a replica");
    let health = format!("http://127.0.0.1:{port}{}", pool.health);
    if let Err(e) = wait_ready(probe, &health, deadline, Some(&process)).await {
        // Dropping `process` kills the group.
        return Err(format!("{e}; its log: {}", process.log.display()));
    }
    Ok(Serving {
        id,
        target: Target::Http(Box::new(http_target(
            pool,
            id,
            &format!("http://127.0.0.1:{port}/v1"),
        )?)),
        clock: Clock::shared(),
        process: Some(process),
        url: Some(format!("http://127.0.0.1:{port}")),
    })
}

/// Has the kernel SIGKILL the child when the gateway dies, however it dies: a gateway
/// that is SIGKILLed runs no Drop, and its replicas (in groups of their own, out of reach
/// of a signal to the gateway's group) would serve on, holding their GPU and port.
///
/// The signal comes when the *thread* that forked the child exits, not the process. The
/// replicas are spawned from the runtime's async tasks, so from its worker threads (or the
/// thread blocked on it), which live as long as the runtime and so as the gateway; never
/// from `spawn_blocking`, whose threads exit when idle. What the replica forks in turn is
/// in its group: a gateway that stops or panics reaches it by `killpg`, but the kernel's
/// signal reaches the replica only, so the workers of a replica that forks must watch
/// their own parent to go with it. SIGKILL, not SIGTERM: a replica that hangs on SIGTERM
/// would outlive the gateway that was to escalate.
#[allow(unsafe_code)]
fn die_with_parent(command: &mut tokio::process::Command) {
    let gateway = nix::unistd::getpid();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are sound: prctl(2) and getppid(2) are system calls, and
    // the errors are made from raw codes, with no allocation.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
                .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
            // The gateway died before the signal was asked for: none will come.
            if nix::unistd::getppid() != gateway {
                return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// A status for a child whose wait itself failed: it is gone either way.
fn failed_status() -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    ExitStatus::from_raw(0xff00)
}

/// A port free now. Another process may take it before the replica binds it; the replica
/// then exits and the start is retried on another port.
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Polls `health` until it answers 2xx, the process exits, or `deadline` passes.
async fn wait_ready(
    probe: &reqwest::Client,
    health: &str,
    deadline: Instant,
    process: Option<&Process>,
) -> Result<(), String> {
    let mut last = String::from("no answer yet");
    loop {
        if let Some(p) = process
            && p.has_exited()
        {
            let status = p.exited().await;
            return Err(format!(
                "the replica exited before it was ready ({})",
                status.map_or("status unknown".into(), |s| s.to_string())
            ));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "not ready within cold_start_timeout (last probe of {}: {last})",
                crate::redis_conn::redact_url(health)
            ));
        }
        match probe
            .get(health)
            .timeout(PROBE_TIMEOUT.min(left))
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => last = format!("HTTP {}", r.status().as_u16()),
            Err(e) if e.is_timeout() => last = "timed out".into(),
            Err(e) if e.is_connect() => last = "connection refused".into(),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(PROBE_EVERY.min(left)).await;
    }
}

async fn start_local(pool: &PoolConfig, id: u32, model: &Path) -> Result<Serving, String> {
    let path = model.to_owned();
    let machine = Machine {
        model: pool.name.clone(),
        rate: pool.rate.unwrap_or(HourlyRate(Money::ZERO)),
        instance_type: pool.instance_type.clone(),
        on_demand: None,
    };
    let scheduler = SchedulerConfig {
        max_batch: (pool.target_in_flight as usize).clamp(1, 64),
        prefix_cache: pool.prefix_cache,
        speculate: pool.speculate,
        ..SchedulerConfig::default()
    };
    let load = tokio::task::spawn_blocking(move || {
        Local::load(&path, LoadOptions::default(), |_| scheduler, machine)
            .map_err(|e| with_causes(&e))
    });
    let local = match tokio::time::timeout(pool.cold_start_timeout, load).await {
        Ok(Ok(loaded)) => loaded?,
        Ok(Err(e)) => return Err(format!("loading stopped: {e}")),
        Err(_) => return Err("not loaded within cold_start_timeout".into()),
    };
    Ok(Serving {
        id,
        target: Target::Local(Arc::new(local)),
        clock: Clock::shared(),
        process: None,
        url: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_drops_the_path() {
        assert_eq!(origin("http://qwen:8080/v1"), "http://qwen:8080");
        assert_eq!(origin("https://a.b"), "https://a.b");
        assert_eq!(file_safe("qwen/2.5 x"), "qwen_2.5_x");
    }
}
