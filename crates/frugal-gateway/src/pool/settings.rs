//! A pool's settings from its `[[serve.pool]]` entry, checked: every bound, duration and
//! template is validated before anything starts, with errors naming the pool and the key.

use std::path::PathBuf;
use std::time::Duration;

use frugal_cloud::price::{Pricing, Request};
use frugal_cost::Catalog;
use frugal_cost::money::HourlyRate;

use crate::assemble::ConfigError;
use crate::config::{PoolBackend, PoolRouting, RawPool};
use frugal_engine::speculate::Speculate;

/// Knative's KPA defaults: demand averaged over 60 s, a 6 s panic window entered at 200% of
/// capacity. See docs/pools.md for why these, against KEDA's and Ray Serve's.
pub const STABLE_WINDOW: Duration = Duration::from_secs(60);
pub const PANIC_WINDOW: Duration = Duration::from_secs(6);
pub const PANIC_THRESHOLD: f64 = 2.0;
pub const SCALE_TO_ZERO_AFTER: Duration = Duration::from_secs(300);
pub const COLD_START_TIMEOUT: Duration = Duration::from_secs(120);
pub const DRAIN_GRACE: Duration = Duration::from_secs(30);
pub const TICK: Duration = Duration::from_secs(1);

/// How a pool's replicas come to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// frugal's engine in this process, loading `model` on each start.
    Local { model: PathBuf },
    /// A process per replica from `command` (`{port}`, `{model}`, `{replica}` filled in),
    /// logging to a file per replica in `log_dir`.
    Process {
        command: Vec<String>,
        model: Option<PathBuf>,
        log_dir: Option<PathBuf>,
    },
    /// One URL whose replicas something else scales (a Kubernetes Service under KEDA).
    External { url: String },
}

/// Set (to `true`) on a `process` replica's environment when the gateway's prefix cache is
/// off: `frugal serve` reads it as `--no-prefix-cache`; other servers ignore it.
pub const NO_PREFIX_CACHE_ENV: &str = "FRUGAL_NO_PREFIX_CACHE";

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    pub kind: Kind,
    /// Readiness probe path (`/health`, or `/v1/models`).
    pub health: String,
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub target_in_flight: u32,
    /// A replica's hard limit: with every ready replica at it, requests are held.
    pub max_in_flight: u32,
    pub scale_to_zero_after: Duration,
    pub cold_start_timeout: Duration,
    pub stable_window: Duration,
    pub panic_window: Duration,
    pub panic_threshold: f64,
    pub drain_grace: Duration,
    pub tick: Duration,
    pub max_queue: usize,
    /// How a request picks its replica (see [`super::prefix`]).
    pub routing: PoolRouting,
    /// A replica's hourly price, and its instance type where the catalog priced it.
    pub rate: Option<HourlyRate>,
    pub instance_type: Option<String>,
    /// Whole-request limit on a replica.
    pub timeout: Duration,
    /// The container image `frugal deploy kubernetes` runs a replica from.
    pub image: Option<String>,
    /// Replicas reuse cached prompt prefixes (`[serve] prefix_cache`): `local` ones in
    /// their engine, `process` ones told by `FRUGAL_NO_PREFIX_CACHE` when it is off.
    pub prefix_cache: bool,
    /// How `local` replicas' engines draft tokens to verify (`[serve] speculate`).
    pub speculate: Speculate,
}

impl PoolConfig {
    /// A pool of `kind` with every other setting at its default.
    pub fn new(name: &str, kind: Kind) -> PoolConfig {
        PoolConfig {
            name: name.to_owned(),
            kind,
            health: "/health".into(),
            min_replicas: 0,
            max_replicas: 4,
            target_in_flight: 8,
            max_in_flight: 16,
            scale_to_zero_after: SCALE_TO_ZERO_AFTER,
            cold_start_timeout: COLD_START_TIMEOUT,
            stable_window: STABLE_WINDOW,
            panic_window: PANIC_WINDOW,
            panic_threshold: PANIC_THRESHOLD,
            drain_grace: DRAIN_GRACE,
            tick: TICK,
            max_queue: 256,
            routing: PoolRouting::Prefix,
            rate: None,
            instance_type: None,
            timeout: Duration::from_secs(120),
            image: None,
            prefix_cache: true,
            speculate: Speculate::None,
        }
    }
}

/// A duration as written in `frugal.toml`: `"500ms"`, `"15s"`, `"5m"`, `"1h"`.
pub fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("`{text}` is not a duration like \"500ms\", \"15s\", \"5m\" ({e})"))
}

/// A pool from its entry; `catalog` prices `instance`.
pub fn pool(raw: &RawPool, catalog: &Catalog) -> Result<PoolConfig, ConfigError> {
    let what = || format!("pool `{}`", raw.name);
    let bad = |message: String| ConfigError::Invalid {
        what: what(),
        message,
    };
    let not_for = |key: &str, kind: &str| bad(format!("`{key}` is not a setting of a {kind} pool"));
    let kind = match raw.backend {
        PoolBackend::Local => {
            if raw.command.is_some() {
                return Err(not_for("command", "local"));
            }
            if raw.url.is_some() {
                return Err(not_for("url", "local"));
            }
            let model = raw.model.clone().ok_or_else(|| {
                bad("a local pool needs `model`, the GGUF file each replica loads".into())
            })?;
            Kind::Local { model }
        }
        PoolBackend::Process => {
            if raw.url.is_some() {
                return Err(not_for("url", "process"));
            }
            let text = raw.command.as_deref().ok_or_else(|| {
                bad(
                    "a process pool needs `command`, e.g. \"llama-server -m M --port {port}\""
                        .into(),
                )
            })?;
            let command = split_command(text).map_err(bad)?;
            if !command.iter().any(|a| a.contains("{port}")) {
                return Err(bad(format!(
                    "`command` must contain {{port}}, the port each replica listens on: {text}"
                )));
            }
            if raw.model.is_none() && command.iter().any(|a| a.contains("{model}")) {
                return Err(bad(
                    "`command` uses {model} and the pool names no `model`".into()
                ));
            }
            Kind::Process {
                command,
                model: raw.model.clone(),
                log_dir: raw.log_dir.clone(),
            }
        }
        PoolBackend::External => {
            if raw.command.is_some() {
                return Err(not_for("command", "external"));
            }
            let url = raw.url.as_deref().ok_or_else(|| {
                bad("an external pool needs `url`, e.g. \"http://qwen:8080/v1\"".into())
            })?;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(bad(format!(
                    "`url` must be http:// or https://, not {}",
                    crate::redis_conn::redact_url(url)
                )));
            }
            Kind::External {
                url: url.trim_end_matches('/').to_owned(),
            }
        }
    };
    let mut c = PoolConfig::new(&raw.name, kind);
    if let Some(h) = &raw.health {
        if !h.starts_with('/') {
            return Err(bad(format!(
                "`health` is a path starting with /, not `{h}`"
            )));
        }
        c.health.clone_from(h);
    }
    c.min_replicas = raw.min_replicas.unwrap_or(c.min_replicas);
    c.max_replicas = raw
        .max_replicas
        .unwrap_or(c.max_replicas.max(c.min_replicas));
    if c.max_replicas == 0 {
        return Err(bad("max_replicas must be at least 1".into()));
    }
    if c.max_replicas < c.min_replicas {
        return Err(bad(format!(
            "max_replicas ({}) is below min_replicas ({})",
            c.max_replicas, c.min_replicas
        )));
    }
    c.target_in_flight = raw.target_in_flight.unwrap_or(c.target_in_flight);
    if c.target_in_flight == 0 {
        return Err(bad("target_in_flight must be at least 1".into()));
    }
    c.max_in_flight = raw
        .max_in_flight
        .unwrap_or(c.target_in_flight.saturating_mul(2));
    if c.max_in_flight < c.target_in_flight {
        return Err(bad(format!(
            "max_in_flight ({}) is below target_in_flight ({})",
            c.max_in_flight, c.target_in_flight
        )));
    }
    let dur = |key: &str, v: &Option<String>, default: Duration| -> Result<Duration, ConfigError> {
        v.as_deref()
            .map_or(Ok(default), duration)
            .map_err(|e| bad(format!("{key}: {e}")))
    };
    c.scale_to_zero_after = dur(
        "scale_to_zero_after",
        &raw.scale_to_zero_after,
        c.scale_to_zero_after,
    )?;
    c.cold_start_timeout = dur(
        "cold_start_timeout",
        &raw.cold_start_timeout,
        c.cold_start_timeout,
    )?;
    c.stable_window = dur("stable_window", &raw.stable_window, c.stable_window)?;
    c.panic_window = dur("panic_window", &raw.panic_window, c.panic_window)?;
    c.drain_grace = dur("drain_grace", &raw.drain_grace, c.drain_grace)?;
    c.tick = dur("tick", &raw.tick, c.tick)?;
    if c.tick.is_zero() || c.tick > Duration::from_secs(1) {
        return Err(bad("tick must be above 0 and at most 1s".into()));
    }
    if c.cold_start_timeout.is_zero() {
        return Err(bad("cold_start_timeout must be above 0".into()));
    }
    if c.panic_window.is_zero() || c.panic_window > c.stable_window {
        return Err(bad(format!(
            "panic_window ({:?}) must be above 0 and at most stable_window ({:?})",
            c.panic_window, c.stable_window
        )));
    }
    if let Some(t) = raw.panic_threshold {
        if !(t.is_finite() && t > 1.0) {
            return Err(bad(format!(
                "panic_threshold is demand over capacity, above 1.0 (2.0 is 200%), not {t}"
            )));
        }
        c.panic_threshold = t;
    }
    c.max_queue = raw.max_queue.unwrap_or(c.max_queue);
    if c.max_queue == 0 {
        // A request at zero must be held to wake the pool.
        return Err(bad("max_queue must be at least 1".into()));
    }
    c.routing = raw.routing.unwrap_or(c.routing);
    if let Some(t) = raw.timeout_s {
        c.timeout = Duration::from_secs(t);
    }
    let hourly = Request::on_demand(raw.price_per_hour.as_deref(), raw.instance.as_deref());
    let priced = Pricing::given(catalog, &hourly).map_err(|source| ConfigError::Price {
        what: what(),
        source,
    })?;
    if let Some(p) = priced {
        c.rate = Some(p.rate);
        c.instance_type = p.instance_type;
    }
    c.image.clone_from(&raw.image);
    Ok(c)
}

/// A command line split into arguments as a POSIX shell splits words and quotes, without
/// running a shell: no globbing, no expansion.
pub fn split_command(text: &str) -> Result<Vec<String>, String> {
    match shlex::split(text) {
        Some(args) if !args.is_empty() => Ok(args),
        Some(_) => Err("`command` is empty".into()),
        None => Err(format!(
            "`command` has an unclosed quote or ends in \\: {text}"
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;

    fn raw(text: &str) -> RawPool {
        toml::from_str(&format!("name = \"p\"\n{text}")).unwrap_or_else(|e| panic!("{e}"))
    }

    fn checked(text: &str) -> Result<PoolConfig, String> {
        pool(&raw(text), &Catalog::builtin().unwrap()).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_knatives_and_durations_read_as_written() {
        let c = checked(
            "backend = \"process\"\ncommand = \"llama-server -m 'my model.gguf' --port {port}\"",
        )
        .unwrap();
        let Kind::Process { command, .. } = &c.kind else {
            panic!("{:?}", c.kind)
        };
        assert_eq!(
            command,
            &["llama-server", "-m", "my model.gguf", "--port", "{port}"]
        );
        assert_eq!(
            (c.stable_window, c.panic_window, c.panic_threshold),
            (STABLE_WINDOW, PANIC_WINDOW, 2.0)
        );
        assert_eq!(
            (
                c.min_replicas,
                c.max_replicas,
                c.target_in_flight,
                c.max_in_flight
            ),
            (0, 4, 8, 16)
        );
        assert_eq!(c.routing, PoolRouting::Prefix);
        let c =
            checked("backend = \"process\"\ncommand = \"x {port}\"\nrouting = \"least_in_flight\"")
                .unwrap();
        assert_eq!(c.routing, PoolRouting::LeastInFlight);
        let c = checked(
            "backend = \"external\"\nurl = \"http://qwen:8080/v1/\"\nscale_to_zero_after = \"90s\"\ncold_start_timeout = \"1m\"\ntick = \"250ms\"\nprice_per_hour = \"1.01\"",
        )
        .unwrap();
        assert_eq!(
            c.kind,
            Kind::External {
                url: "http://qwen:8080/v1".into()
            }
        );
        assert_eq!(c.scale_to_zero_after, Duration::from_secs(90));
        assert_eq!(c.cold_start_timeout, Duration::from_secs(60));
        assert_eq!(c.tick, Duration::from_millis(250));
        assert_eq!(c.rate.map(|r| r.0), Some("1.01".parse().unwrap()));
    }

    #[test]
    fn each_bad_setting_names_its_key() {
        for (text, says) in [
            (
                "backend = \"process\"\ncommand = \"x {port}\"\ntick = \"5s\"",
                "tick must be above 0 and at most 1s",
            ),
            (
                "backend = \"process\"\ncommand = \"x {port}\"\npanic_window = \"2m\"",
                "panic_window",
            ),
            (
                "backend = \"process\"\ncommand = \"x {port}\"\npanic_threshold = 0.5",
                "panic_threshold",
            ),
            (
                "backend = \"process\"\ncommand = \"x {port}\"\ntarget_in_flight = 0",
                "target_in_flight must be at least 1",
            ),
            (
                "backend = \"process\"\ncommand = \"x {port}\"\ntarget_in_flight = 8\nmax_in_flight = 4",
                "max_in_flight (4) is below target_in_flight (8)",
            ),
            (
                "backend = \"process\"\ncommand = \"x '{port}\"",
                "unclosed quote",
            ),
            (
                "backend = \"process\"\ncommand = \"x {model} {port}\"",
                "uses {model}",
            ),
            (
                "backend = \"process\"\ncommand = \"x {port}\"\nurl = \"http://a\"",
                "`url` is not a setting of a process pool",
            ),
            (
                "backend = \"external\"\nurl = \"ftp://a\"",
                "must be http:// or https://",
            ),
            (
                "backend = \"local\"\nmodel = \"m.gguf\"\ncommand = \"x\"",
                "`command` is not a setting of a local pool",
            ),
            (
                "backend = \"process\"\ncommand = \"x {port}\"\nmax_replicas = 0",
                "max_replicas must be at least 1",
            ),
            (
                "backend = \"process\"\ncommand = \"x {port}\"\ninstance = \"no-such-instance\"",
                "pool `p`",
            ),
        ] {
            let err = checked(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
