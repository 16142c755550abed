//! `frugal deploy kubernetes`: a gateway and its pools as Kubernetes objects that KEDA scales.
//!
//! Each `local` or `process` pool becomes a Deployment of replicas, a Service in front of them
//! and a KEDA ScaledObject that sizes the Deployment from the demand the gateway publishes at
//! `/v1/pools/NAME/scale`. The gateway (`frugal serve --no-model`) gets a ConfigMap holding its
//! `frugal.toml`, in which those pools are `external` pools at their Services, a Deployment and
//! a Service. An `external` pool already points at something else: it stays as it is.
//!
//! Past one gateway replica (`Target::gateway_replicas`), the gateways must share what one
//! gateway keeps to itself: the ledger (a PostgreSQL URL, `[ledger] url`), tenants' budgets
//! (`[serve] budget_redis`) and pools' demand (read by KEDA from Prometheus, summed over the
//! gateways, instead of from one gateway); [`manifests`] refuses a setup that would split
//! them. A URL that carries credentials (the ledger's, a Redis one) never goes into a
//! manifest: the gateway reads it from its Secret, whose keys [`secret_keys`] lists.
//!
//! Objects are built as `serde_json::Value`s and written by [`yaml`]: no YAML crate is in the
//! build, and the subset written here (maps, lists, scalars, a block of text) is small.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use frugal_cost::Catalog;
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::assemble::ConfigError;
use crate::config::{PoolBackend, RawServe};
use crate::pool::settings::{self, Kind, PoolConfig};
use crate::redis_conn::{has_credentials, redact_url};

/// The gateway's Deployment, Service, ConfigMap and (for upstreams' API keys) Secret.
pub const GATEWAY: &str = "frugal-gateway";
/// Pools' objects are `frugal-pool-<name>`: the prefix keeps them apart from the gateway and
/// from the namespace's other objects, and starts them with a letter, as a Service needs.
const POOL_PREFIX: &str = "frugal-pool-";
/// What the gateway's API and every replica listen on.
const PORT: u16 = 8080;
/// `frugal serve --metrics-addr`: `/metrics` and `/v1/pools/NAME/scale` without a key.
const METRICS_PORT: u16 = 9090;
const CONFIG_DIR: &str = "/etc/frugal";
const LEDGER_DIR: &str = "/var/lib/frugal";
/// KEDA's default of 30 s would leave a request queued at a pool scaled to zero waiting up to
/// 30 s before a replica is even asked for; one small GET per pool every 5 s is cheap. (Past
/// one replica, the HPA's own sync period paces scaling, not this.)
const POLLING_INTERVAL_S: u64 = 5;
/// The HPA refuses a longer stabilization window.
const MAX_STABLE_WINDOW: Duration = Duration::from_secs(3600);

#[derive(Debug, Error)]
pub enum KubeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("pool `{pool}`: a process pool needs `image`, the container image its command runs in")]
    NoImage { pool: String },
    #[error("pool `{pool}`: its name has no letter or digit to name Kubernetes objects by")]
    Unnamed { pool: String },
    #[error("pools `{first}` and `{second}` both become the Kubernetes name `{name}`; rename one")]
    NameClash {
        first: String,
        second: String,
        name: String,
    },
    #[error("pool `{pool}`: stable_window is at most 1h on Kubernetes (the HPA's limit)")]
    StableWindow { pool: String },
    #[error(
        "namespace `{0}` is not a DNS-1123 label (at most 63 lowercase letters, digits and -, \
         starting and ending with a letter or digit)"
    )]
    Namespace(String),
    #[error("{replicas} gateway replicas need {what}; {fix}")]
    Replicas {
        replicas: u32,
        what: &'static str,
        fix: &'static str,
    },
    #[error("cannot write the gateway's frugal.toml")]
    ConfigJson(#[source] serde_json::Error),
    #[error("cannot write the gateway's frugal.toml")]
    ConfigToml(#[source] toml::ser::Error),
}

/// Where, and from what image, the objects run.
#[derive(Debug, Clone)]
pub struct Target {
    pub namespace: String,
    /// frugal's image: the gateway's, and a local pool's unless the pool names its own.
    pub image: String,
    /// The gateway Deployment's replicas.
    pub gateway_replicas: u32,
    /// A Prometheus server that scrapes the gateways (its URL as KEDA's operator reaches it):
    /// pools then scale on their demand summed over every gateway.
    pub prometheus: Option<String>,
    /// `[ledger] url`: a PostgreSQL ledger every gateway writes; `None` (or a SQLite file),
    /// a SQLite file in each gateway's pod.
    pub ledger: Option<String>,
}

/// A value the gateway reads from its Secret (named [`GATEWAY`]): the key, and what it
/// should hold as messages may show it (credentials masked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretKey {
    pub key: String,
    pub holds: String,
}

/// The environment variables through which `frugal serve` takes URLs that carry
/// credentials, instead of from `frugal.toml`.
pub const LEDGER_ENV: &str = "FRUGAL_LEDGER";
pub const CACHE_REDIS_ENV: &str = "FRUGAL_CACHE_REDIS";
pub const BUDGET_REDIS_ENV: &str = "FRUGAL_BUDGET_REDIS";

/// Whether the ledger's URL holds a password.
fn ledger_has_credentials(url: &str) -> bool {
    frugal_cost::Location::parse(url).has_credentials()
}

impl Target {
    /// The PostgreSQL ledger the gateways share, if the config names one.
    fn postgres_ledger(&self) -> Option<&str> {
        self.ledger.as_deref().filter(|l| {
            matches!(
                frugal_cost::Location::parse(l),
                frugal_cost::Location::Postgres(_)
            )
        })
    }
}

/// The Redis URLs of `[serve]` that carry credentials, with the variable each is read from.
fn secret_redis(serve: &RawServe) -> Vec<(&'static str, &str)> {
    [
        (CACHE_REDIS_ENV, serve.cache_redis.as_deref()),
        (BUDGET_REDIS_ENV, serve.budget_redis.as_deref()),
    ]
    .into_iter()
    .filter_map(|(var, url)| url.filter(|u| has_credentials(u)).map(|u| (var, u)))
    .collect()
}

/// What the gateway's Secret must hold: upstreams' API keys, and the URLs that carry
/// credentials. Sorted by key.
pub fn secret_keys(serve: &RawServe, target: &Target) -> Vec<SecretKey> {
    let mut keys: Vec<SecretKey> = serve
        .upstream
        .iter()
        .filter_map(|u| u.api_key_env.as_deref())
        .map(|var| SecretKey {
            key: var.to_owned(),
            holds: "the API key".to_owned(),
        })
        .collect();
    if let Some(url) = target
        .postgres_ledger()
        .filter(|u| ledger_has_credentials(u))
    {
        keys.push(SecretKey {
            key: LEDGER_ENV.to_owned(),
            holds: frugal_cost::Location::parse(url).redacted(),
        });
    }
    keys.extend(secret_redis(serve).into_iter().map(|(var, url)| SecretKey {
        key: var.to_owned(),
        holds: redact_url(url),
    }));
    keys.sort_by(|a, b| a.key.cmp(&b.key));
    keys.dedup_by(|a, b| a.key == b.key);
    keys
}

/// Refuses more than one gateway where the gateways would not share the ledger, budgets or
/// pools' demand.
fn check_replicas(
    serve: &RawServe,
    target: &Target,
    deployed_pools: bool,
) -> Result<(), KubeError> {
    let replicas = target.gateway_replicas;
    if replicas <= 1 {
        return Ok(());
    }
    let refuse = |what, fix| {
        Err(KubeError::Replicas {
            replicas,
            what,
            fix,
        })
    };
    if target.postgres_ledger().is_none() {
        return refuse(
            "one ledger",
            "set `[ledger] url = \"postgres://...\"` (a SQLite file per pod would hold a part of the bill each)",
        );
    }
    let budgets = serve
        .key
        .iter()
        .any(|k| k.daily_usd.is_some() || k.monthly_usd.is_some());
    if budgets && serve.budget_redis.is_none() {
        return refuse(
            "one budget per tenant",
            "set `[serve] budget_redis = \"redis://...\"` (each gateway alone would spend a whole budget)",
        );
    }
    if deployed_pools && target.prometheus.is_none() {
        return refuse(
            "pools scaled on their demand at every gateway",
            "pass --prometheus URL, a Prometheus that scrapes the gateways (KEDA would read one gateway's demand)",
        );
    }
    Ok(())
}

/// One file's objects: the gateway's, or one pool's.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// `<object name>.yaml`
    pub file: String,
    pub objects: Vec<Value>,
}

impl Manifest {
    pub fn kinds(&self) -> Vec<&str> {
        self.objects
            .iter()
            .filter_map(|o| o["kind"].as_str())
            .collect()
    }

    pub fn yaml(&self) -> String {
        yaml(&self.objects)
    }
}

/// The gateway's file first, then one per local or process pool. Every pool is checked as
/// `frugal serve` checks it (`catalog` prices `instance`), so what deploys also starts.
pub fn manifests(
    serve: &RawServe,
    catalog: &Catalog,
    target: &Target,
) -> Result<Vec<Manifest>, KubeError> {
    if !is_label(&target.namespace) {
        return Err(KubeError::Namespace(target.namespace.clone()));
    }
    let mut files = Vec::new();
    let mut services = HashMap::new();
    let mut pools_by_name: HashMap<String, &str> = HashMap::new();
    for (i, raw) in serve.pool.iter().enumerate() {
        let pool = settings::pool(raw, catalog)?;
        let Some(container) = container(&pool, &target.image)? else {
            continue;
        };
        let name = object_name(&pool.name).ok_or_else(|| KubeError::Unnamed {
            pool: pool.name.clone(),
        })?;
        if let Some(first) = pools_by_name.insert(name.clone(), &raw.name) {
            return Err(KubeError::NameClash {
                first: first.to_owned(),
                second: raw.name.clone(),
                name,
            });
        }
        if pool.stable_window > MAX_STABLE_WINDOW {
            return Err(KubeError::StableWindow { pool: pool.name });
        }
        files.push(Manifest {
            file: format!("{name}.yaml"),
            objects: pool_objects(&pool, &name, container, target),
        });
        services.insert(i, name);
    }
    check_replicas(serve, target, !services.is_empty())?;
    let config = gateway_config(serve, &services)?;
    files.insert(
        0,
        Manifest {
            file: format!("{GATEWAY}.yaml"),
            objects: gateway_objects(serve, &config, target),
        },
    );
    Ok(files)
}

/// A replica's container; none for an external pool.
fn container(pool: &PoolConfig, frugal_image: &str) -> Result<Option<Value>, KubeError> {
    let (image, command) = match &pool.kind {
        Kind::External { .. } => return Ok(None),
        Kind::Local { model } => {
            let model = model.to_string_lossy();
            let command = [
                "frugal",
                "serve",
                "--model",
                &*model,
                "--name",
                &pool.name,
                "--host",
                "0.0.0.0",
                "--port",
                "8080",
                // The gateway in front meters and caches the pool's calls already.
                "--no-meter",
                "--no-cache",
            ];
            let image = pool.image.as_deref().unwrap_or(frugal_image);
            (image, command.iter().map(|a| escape(a)).collect())
        }
        Kind::Process { command, model, .. } => {
            // `log_dir` is not used: a container's output is its log.
            let image = pool.image.as_deref().ok_or_else(|| KubeError::NoImage {
                pool: pool.name.clone(),
            })?;
            (image, fill(command, model.as_deref()))
        }
    };
    Ok(Some(json!({
        "name": "replica",
        "image": image,
        "command": command,
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "http", "containerPort": PORT}],
        "readinessProbe": {"httpGet": {"path": pool.health, "port": "http"}, "periodSeconds": 2},
    })))
}

/// A process pool's command with `{port}`, `{model}` and `{replica}` filled in. Kubernetes
/// expands `$(VAR)` in a command and reads `$$` as `$`, so the pool's own `$` are doubled and
/// `{replica}` is the pod's name through the downward API.
fn fill(command: &[String], model: Option<&Path>) -> Vec<String> {
    let model = model.map(|m| escape(&m.to_string_lossy()));
    command
        .iter()
        .map(|arg| {
            let arg = escape(arg)
                .replace("{port}", &PORT.to_string())
                .replace("{replica}", "$(POD_NAME)");
            match &model {
                Some(m) => arg.replace("{model}", m),
                None => arg,
            }
        })
        .collect()
}

fn escape(arg: &str) -> String {
    arg.replace('$', "$$")
}

fn pool_objects(pool: &PoolConfig, name: &str, container: Value, target: &Target) -> Vec<Value> {
    let namespace = &target.namespace;
    let mut meta = metadata(name, namespace, "pool");
    // The name clients ask for, which the object's name may have had to change.
    meta["annotations"] = json!({"frugal/pool": pool.name});
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        // No `replicas`: KEDA's HPA owns the count, and a value here would reset it on
        // every apply.
        "spec": {
            "selector": {"matchLabels": selector(name)},
            "template": {
                "metadata": {"labels": labels(name, "pool")},
                "spec": {
                    "terminationGracePeriodSeconds": seconds(pool.drain_grace),
                    "containers": [container],
                },
            },
        },
    });
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, namespace, "pool"),
        "spec": {
            "selector": selector(name),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http"}],
        },
    });
    let trigger = demand_trigger(pool, target);
    let scaled = json!({
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata(name, namespace, "pool"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "pollingInterval": POLLING_INTERVAL_S,
            // Only scaling to zero waits for this; between 1 and max the HPA's window rules.
            "cooldownPeriod": seconds(pool.scale_to_zero_after),
            "minReplicaCount": pool.min_replicas,
            "maxReplicaCount": pool.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {
                "stabilizationWindowSeconds": seconds(pool.stable_window),
            }}}},
            "triggers": [trigger],
        },
    });
    vec![deployment, service, scaled]
}

/// How KEDA reads a pool's demand (queued and in flight): from the one gateway, or from
/// Prometheus, summed over every gateway. Demand over replicas aims at target_in_flight each,
/// as the pool's own autoscaler does; any demand, queued requests included, wakes a pool at
/// zero.
fn demand_trigger(pool: &PoolConfig, target: &Target) -> Value {
    let target_value = pool.target_in_flight.to_string();
    match &target.prometheus {
        Some(server) => {
            let label = pool.name.replace('\\', "\\\\").replace('"', "\\\"");
            json!({
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": server,
                    "query": format!(
                        "sum(frugal_pool_queue{{pool=\"{label}\"}}) + sum(frugal_pool_in_flight{{pool=\"{label}\"}})"
                    ),
                    "threshold": target_value,
                    "activationThreshold": "0",
                },
            })
        }
        None => {
            // KEDA's operator, not a pod of this namespace, polls the gateway: its Service is
            // named with the namespace.
            let url = format!(
                "http://{GATEWAY}.{}.svc:{METRICS_PORT}/v1/pools/{}/scale",
                target.namespace,
                percent_encode(&pool.name)
            );
            json!({
                "type": "metrics-api",
                "metricType": "AverageValue",
                "metadata": {
                    "url": url,
                    "format": "json",
                    "valueLocation": "demand",
                    "targetValue": target_value,
                    "activationTargetValue": "0",
                },
            })
        }
    }
}

fn gateway_objects(serve: &RawServe, config: &str, target: &Target) -> Vec<Value> {
    let ns = &target.namespace;
    let config_map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(GATEWAY, ns, "gateway"),
        "data": {"frugal.toml": config},
    });
    let hash: String = Sha256::digest(config.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let from_secret = |var: &str| json!({"name": var, "valueFrom": {"secretKeyRef": {"name": GATEWAY, "key": var}}});
    let mut env = match target.postgres_ledger() {
        Some(url) if ledger_has_credentials(url) => vec![from_secret(LEDGER_ENV)],
        Some(url) => vec![json!({"name": LEDGER_ENV, "value": url})],
        None => vec![json!({"name": LEDGER_ENV, "value": format!("{LEDGER_DIR}/ledger.sqlite")})],
    };
    if target.postgres_ledger().is_some() {
        // The spool of ledger writes made while PostgreSQL is unreachable goes beside the
        // ledger, in frugal's data folder: the volume below.
        env.push(json!({"name": "XDG_DATA_HOME", "value": LEDGER_DIR.trim_end_matches("/frugal")}));
    }
    // Upstreams' API keys and URLs with credentials come from a Secret the operator creates,
    // never from these files.
    let secrets: BTreeSet<String> = secret_keys(serve, target)
        .into_iter()
        .map(|k| k.key)
        .filter(|k| k != LEDGER_ENV)
        .collect();
    env.extend(secrets.iter().map(|var| from_secret(var)));
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(GATEWAY, ns, "gateway"),
        "spec": {
            // Past one, `check_replicas` has made sure the gateways share a ledger, budgets
            // and pools' demand.
            "replicas": target.gateway_replicas,
            "selector": {"matchLabels": selector(GATEWAY)},
            "template": {
                "metadata": {
                    "labels": labels(GATEWAY, "gateway"),
                    // A changed config changes the pod template, so the gateway restarts on it.
                    // The scrape annotations are the convention Prometheus' Kubernetes
                    // discovery is usually set up with.
                    "annotations": {
                        "frugal/config-sha256": hash,
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": METRICS_PORT.to_string(),
                    },
                },
                "spec": {
                    "containers": [{
                        "name": "gateway",
                        "image": target.image,
                        "command": [
                            "frugal", "serve", "--no-model",
                            "--config", format!("{CONFIG_DIR}/frugal.toml"),
                            "--host", "0.0.0.0", "--port", PORT.to_string(),
                            "--metrics-addr", format!("0.0.0.0:{METRICS_PORT}"),
                        ],
                        "env": env,
                        "ports": [
                            {"name": "http", "containerPort": PORT},
                            {"name": "metrics", "containerPort": METRICS_PORT},
                        ],
                        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
                        "volumeMounts": [
                            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": true},
                            {"name": "ledger", "mountPath": LEDGER_DIR},
                        ],
                    }],
                    "volumes": [
                        {"name": "config", "configMap": {"name": GATEWAY}},
                        // A SQLite ledger, or a PostgreSQL ledger's spool, lasts as long as
                        // the pod; a PersistentVolumeClaim here keeps it.
                        {"name": "ledger", "emptyDir": {}},
                    ],
                },
            },
        },
    });
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(GATEWAY, ns, "gateway"),
        "spec": {
            "selector": selector(GATEWAY),
            "ports": [
                {"name": "http", "port": PORT, "targetPort": "http"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    });
    vec![config_map, deployment, service]
}

/// The gateway's `frugal.toml`: `[serve]` as written, each deployed pool an external pool at
/// its Service (same namespace, so the short name resolves), and without the local model,
/// which `--no-model` leaves out.
fn gateway_config(
    serve: &RawServe,
    services: &HashMap<usize, String>,
) -> Result<String, KubeError> {
    #[derive(Serialize)]
    struct File<'a> {
        serve: &'a RawServe,
    }
    // URLs with credentials: the gateway reads them from its Secret.
    let mut serve = serve.clone();
    for url in [&mut serve.cache_redis, &mut serve.budget_redis] {
        if url.as_deref().is_some_and(has_credentials) {
            *url = None;
        }
    }
    serve.model = None;
    serve.name = None;
    serve.host = None;
    serve.port = None;
    for (i, pool) in serve.pool.iter_mut().enumerate() {
        if let Some(service) = services.get(&i) {
            pool.backend = PoolBackend::External;
            pool.url = Some(format!("http://{service}:{PORT}/v1"));
            pool.command = None;
            pool.model = None;
            pool.log_dir = None;
            pool.image = None;
        }
    }
    // Through JSON text: it writes an f32 as its shortest form (0.95, not 0.949999988079071),
    // and its nulls are dropped below, as TOML has none.
    let text = serde_json::to_string(&File { serve: &serve }).map_err(KubeError::ConfigJson)?;
    let mut value: Value = serde_json::from_str(&text).map_err(KubeError::ConfigJson)?;
    prune(&mut value);
    let body = toml::to_string(&value).map_err(KubeError::ConfigToml)?;
    Ok(format!(
        "# Written by `frugal deploy kubernetes`: its pools run as Deployments that KEDA\n\
         # scales, external pools here.\n{body}"
    ))
}

/// Drops nulls and empty lists.
fn prune(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !(v.is_null() || v.as_array().is_some_and(Vec::is_empty)));
            map.values_mut().for_each(prune);
        }
        Value::Array(items) => items.iter_mut().for_each(prune),
        _ => {}
    }
}

fn metadata(name: &str, namespace: &str, component: &str) -> Value {
    json!({"name": name, "namespace": namespace, "labels": labels(name, component)})
}

fn labels(name: &str, component: &str) -> Value {
    json!({
        "app.kubernetes.io/name": "frugal",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
    })
}

fn selector(name: &str) -> Value {
    json!({"app.kubernetes.io/name": "frugal", "app.kubernetes.io/instance": name})
}

/// Whole seconds, rounded up, so that "500ms" is not 0.
fn seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `frugal-pool-` and the pool's name as a DNS-1123 label: lowercase, each run of other
/// characters one `-`, at most 63 long. None when the name has no letter or digit.
fn object_name(pool: &str) -> Option<String> {
    let mut name = String::from(POOL_PREFIX);
    let mut gap = false;
    for c in pool.chars() {
        if c.is_ascii_alphanumeric() {
            if gap && name.len() > POOL_PREFIX.len() {
                name.push('-');
            }
            gap = false;
            name.push(c.to_ascii_lowercase());
        } else {
            gap = true;
        }
    }
    if name.len() == POOL_PREFIX.len() {
        return None;
    }
    name.truncate(63);
    Some(name.trim_end_matches('-').to_owned())
}

fn is_label(s: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    s.len() <= 63
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// A URL path segment: every byte but the unreserved ones as `%XX`.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Objects as a YAML stream, a document each. Strings are double-quoted with escapes, so
/// that none reads as another type ("0", "on", "null"); text of several lines is a literal
/// block.
pub fn yaml(objects: &[Value]) -> String {
    let mut out = String::new();
    for object in objects {
        out.push_str("---\n");
        if is_block(object) {
            block(&mut out, object, 0, false);
        } else {
            out.push_str(&scalar(object));
            out.push('\n');
        }
    }
    out
}

fn is_block(v: &Value) -> bool {
    match v {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

/// A non-empty map or list at `indent`; `inline` when its first line follows a `- `.
fn block(out: &mut String, value: &Value, indent: usize, inline: bool) {
    let pad = |out: &mut String, i: usize| {
        if i > 0 || !inline {
            out.extend(std::iter::repeat_n(' ', indent));
        }
    };
    match value {
        Value::Object(map) => {
            // Keys in order, `name` first, as Kubernetes' own examples write a list's items.
            let named = map.get_key_value("name");
            let rest = map.iter().filter(|(k, _)| *k != "name");
            for (i, (k, v)) in named.into_iter().chain(rest).enumerate() {
                pad(out, i);
                out.push_str(&key(k));
                out.push(':');
                child(out, v, indent + 2, false);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                pad(out, i);
                out.push('-');
                child(out, v, indent + 2, true);
            }
        }
        _ => {}
    }
}

/// What follows `key:` or `-`.
fn child(out: &mut String, v: &Value, indent: usize, item: bool) {
    if is_block(v) {
        if item {
            out.push(' ');
            block(out, v, indent, true);
        } else {
            out.push('\n');
            block(out, v, indent, false);
        }
    } else if let Some(text) = v.as_str().filter(|t| literal(t)) {
        out.push_str(" |\n");
        for line in text.lines() {
            if !line.is_empty() {
                out.extend(std::iter::repeat_n(' ', indent));
                out.push_str(line);
            }
            out.push('\n');
        }
    } else {
        out.push(' ');
        out.push_str(&scalar(v));
        out.push('\n');
    }
}

/// Text a literal block (`|`, one final newline kept) holds as it is.
fn literal(text: &str) -> bool {
    text.ends_with('\n')
        && !text.ends_with("\n\n")
        && text
            .chars()
            .all(|c| c == '\n' || c == '\t' || (' '..='~').contains(&c) || printable(c))
        && !text.lines().any(|l| l.starts_with([' ', '\t']))
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => quoted(s),
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
        other => other.to_string(),
    }
}

fn key(k: &str) -> String {
    const WORDS: [&str; 9] = ["y", "n", "yes", "no", "on", "off", "true", "false", "null"];
    let plain = k.starts_with(|c: char| c.is_ascii_alphabetic())
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
        && !WORDS.contains(&k.to_ascii_lowercase().as_str());
    if plain { k.to_owned() } else { quoted(k) }
}

fn quoted(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\t' => q.push_str("\\t"),
            ' '..='~' => q.push(c),
            c if printable(c) => q.push(c),
            c => q.push_str(&format!("\\u{:04x}", u32::from(c))),
        }
    }
    q.push('"');
    q
}

/// Non-ASCII characters YAML takes as they are: not controls, and not the line and paragraph
/// separators or the byte-order mark, which some readers take for line breaks or strip.
fn printable(c: char) -> bool {
    matches!(u32::from(c), 0xA0..=0xD7FF | 0xE000..=0xFFFD | 0x10000..)
        && !matches!(c, '\u{2028}' | '\u{2029}' | '\u{FEFF}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RawPool;

    fn serve(toml_text: &str) -> RawServe {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            serve: RawServe,
        }
        toml::from_str::<File>(toml_text).unwrap().serve
    }

    const CONFIG: &str = r#"
        [serve]
        model = "local.gguf"
        semantic_threshold = 0.95

        [[serve.upstream]]
        name = "gpt"
        url = "https://api.openai.com/v1"
        api_key_env = "OPENAI_API_KEY"

        [[serve.pool]]
        name = "Qwen_2.5"
        backend = "process"
        command = "llama-server -m {model} --port {port} --slot-save-path /tmp/{replica} --alias '$HOME'"
        model = "/models/qwen.gguf"
        image = "ghcr.io/ggml-org/llama.cpp:server"
        log_dir = "logs"
        min_replicas = 1
        max_replicas = 6
        target_in_flight = 4
        scale_to_zero_after = "10m"
        stable_window = "90s"
        drain_grace = "500ms"
        health = "/v1/models"

        [[serve.pool]]
        name = "smol"
        backend = "local"
        model = "/models/smol.gguf"

        [[serve.pool]]
        name = "big"
        backend = "external"
        url = "http://vllm.other:8000/v1"
    "#;

    fn target() -> Target {
        Target {
            namespace: "ml".into(),
            image: "frugal:test".into(),
            gateway_replicas: 1,
            prometheus: None,
            ledger: None,
        }
    }

    fn env(files: &[Manifest]) -> Vec<Value> {
        find(files, "frugal-gateway.yaml", "Deployment")["spec"]["template"]["spec"]["containers"]
            [0]["env"]
            .as_array()
            .unwrap()
            .clone()
    }

    #[test]
    fn replicas_share_the_ledger_budgets_and_demand_and_credentials_stay_secret() {
        let config = CONFIG.replace(
            "semantic_threshold = 0.95\n",
            "semantic_threshold = 0.95\ncache_redis = \"redis://:hunter2@redis:6379/\"\n\
             budget_redis = \"redis://redis:6379/1\"\n\
             [[serve.key]]\ntenant = \"a\"\nsha256 = \"00\"\ndaily_usd = \"5\"\n",
        );
        let ledger = "postgres://frugal:s3cret@db.data:5432/ledger";
        let mut t = Target {
            gateway_replicas: 3,
            prometheus: Some("http://prometheus.monitoring:9090".into()),
            ledger: Some(ledger.into()),
            ..target()
        };
        let files = manifests(&serve(&config), &Catalog::default(), &t).unwrap();
        let all = files.iter().map(Manifest::yaml).collect::<String>();
        assert!(
            !all.contains("hunter2") && !all.contains("s3cret"),
            "no credential in a manifest:\n{all}"
        );
        let deployment = find(&files, "frugal-gateway.yaml", "Deployment");
        assert_eq!(deployment["spec"]["replicas"], 3);
        let vars = env(&files);
        let secret = |var: &str| {
            vars.iter()
                .any(|e| e["name"] == var && e["valueFrom"]["secretKeyRef"]["key"] == var)
        };
        assert!(secret(LEDGER_ENV) && secret(CACHE_REDIS_ENV) && secret("OPENAI_API_KEY"));
        assert!(
            vars.iter()
                .any(|e| e["name"] == "XDG_DATA_HOME" && e["value"] == "/var/lib")
        );
        let text = find(&files, "frugal-gateway.yaml", "ConfigMap")["data"]["frugal.toml"]
            .as_str()
            .unwrap();
        let raw = serve(text);
        assert_eq!(raw.cache_redis, None, "read from the Secret");
        assert_eq!(
            raw.budget_redis.as_deref(),
            Some("redis://redis:6379/1"),
            "no credential: kept"
        );
        let keys = secret_keys(&serve(&config), &t);
        assert_eq!(
            keys.iter()
                .map(|k| (k.key.as_str(), k.holds.as_str()))
                .collect::<Vec<_>>(),
            [
                (CACHE_REDIS_ENV, "redis://***@redis:6379/"),
                (LEDGER_ENV, "postgres://frugal:***@db.data:5432/ledger"),
                ("OPENAI_API_KEY", "the API key"),
            ]
        );
        let trigger =
            &find(&files, "frugal-pool-qwen-2-5.yaml", "ScaledObject")["spec"]["triggers"][0];
        assert_eq!(trigger["type"], "prometheus");
        assert_eq!(
            trigger["metadata"]["query"],
            "sum(frugal_pool_queue{pool=\"Qwen_2.5\"}) + sum(frugal_pool_in_flight{pool=\"Qwen_2.5\"})"
        );
        assert_eq!(trigger["metadata"]["threshold"], "4");

        // What would split the bill, the budgets or the demand is refused, saying what to set.
        let refused = |t: &Target, config: &str| {
            manifests(&serve(config), &Catalog::default(), t)
                .unwrap_err()
                .to_string()
        };
        t.prometheus = None;
        assert!(refused(&t, &config).contains("--prometheus"));
        t.prometheus = Some("http://p:9090".into());
        let no_budget_redis = config.replace("budget_redis = \"redis://redis:6379/1\"\n", "");
        assert!(refused(&t, &no_budget_redis).contains("budget_redis"));
        t.ledger = Some("ledger.sqlite".into());
        assert!(refused(&t, &config).contains("[ledger] url"));
        t.gateway_replicas = 1;
        let one = manifests(&serve(&no_budget_redis), &Catalog::default(), &t).unwrap();
        assert!(
            env(&one)
                .iter()
                .any(|e| e["name"] == LEDGER_ENV && e["value"] == "/var/lib/frugal/ledger.sqlite"),
            "one gateway keeps its SQLite ledger in the pod"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Issue 31: a password pasted unencoded (a base64 one holds `/`) reaches no
        /// manifest: the ledger's and Redis' URLs go to the Secret, never to a plain value.
        #[test]
        fn no_password_reaches_a_manifest(pw in frugal_testkit::secrets::url_password()) {
            let mut raw = serve(CONFIG);
            raw.cache_redis = Some(format!("redis://:{pw}@redis:6379/0"));
            raw.budget_redis = Some(format!("rediss://frugal:{pw}@redis:6379/1"));
            let t = Target {
                ledger: Some(format!("postgres://frugal:{pw}@db.data:5432/ledger")),
                ..target()
            };
            let files = manifests(&raw, &Catalog::default(), &t).unwrap();
            let all = files.iter().map(Manifest::yaml).collect::<String>();
            proptest::prop_assert!(!all.contains(&pw), "{pw} in\n{all}");
            let vars = env(&files);
            for var in [LEDGER_ENV, CACHE_REDIS_ENV, BUDGET_REDIS_ENV] {
                proptest::prop_assert!(
                    vars.iter().any(|e| e["name"] == var && e["valueFrom"]["secretKeyRef"]["key"] == var),
                    "{var} from the Secret"
                );
            }
            let keys = secret_keys(&raw, &t);
            proptest::prop_assert!(keys.iter().all(|k| !k.holds.contains(&pw)));
        }
    }

    fn build(text: &str) -> Result<Vec<Manifest>, KubeError> {
        manifests(&serve(text), &Catalog::default(), &target())
    }

    fn find<'a>(files: &'a [Manifest], file: &str, kind: &str) -> &'a Value {
        files
            .iter()
            .find(|m| m.file == file)
            .unwrap()
            .objects
            .iter()
            .find(|o| o["kind"] == kind)
            .unwrap()
    }

    #[test]
    fn pools_become_deployments_services_and_scaled_objects() {
        let files = build(CONFIG).unwrap();
        let names: Vec<_> = files.iter().map(|m| m.file.as_str()).collect();
        assert_eq!(
            names,
            [
                "frugal-gateway.yaml",
                "frugal-pool-qwen-2-5.yaml",
                "frugal-pool-smol.yaml"
            ]
        );
        assert_eq!(files[1].kinds(), ["Deployment", "Service", "ScaledObject"]);

        let so = &find(&files, "frugal-pool-qwen-2-5.yaml", "ScaledObject")["spec"];
        assert_eq!(so["scaleTargetRef"]["name"], "frugal-pool-qwen-2-5");
        assert_eq!(so["minReplicaCount"], 1);
        assert_eq!(so["maxReplicaCount"], 6);
        assert_eq!(so["cooldownPeriod"], 600);
        let window = &so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"];
        assert_eq!(window["stabilizationWindowSeconds"], 90);
        let trigger = &so["triggers"][0];
        assert_eq!(
            trigger["metadata"]["url"],
            "http://frugal-gateway.ml.svc:9090/v1/pools/Qwen_2.5/scale"
        );
        assert_eq!(trigger["metadata"]["targetValue"], "4");
        assert_eq!(trigger["metadata"]["valueLocation"], "demand");

        let pod =
            &find(&files, "frugal-pool-qwen-2-5.yaml", "Deployment")["spec"]["template"]["spec"];
        assert_eq!(pod["terminationGracePeriodSeconds"], 1);
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "ghcr.io/ggml-org/llama.cpp:server");
        assert_eq!(
            c["command"],
            json!([
                "llama-server",
                "-m",
                "/models/qwen.gguf",
                "--port",
                "8080",
                "--slot-save-path",
                "/tmp/$(POD_NAME)",
                "--alias",
                "$$HOME"
            ])
        );
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/v1/models");

        let local = &find(&files, "frugal-pool-smol.yaml", "Deployment")["spec"]["template"]["spec"]
            ["containers"][0];
        assert_eq!(local["image"], "frugal:test");
        assert_eq!(
            local["command"].as_array().unwrap()[..6],
            json!([
                "frugal",
                "serve",
                "--model",
                "/models/smol.gguf",
                "--name",
                "smol"
            ])
            .as_array()
            .unwrap()[..]
        );

        let gateway = &find(&files, "frugal-gateway.yaml", "Deployment")["spec"]["template"]["spec"]
            ["containers"][0];
        assert!(
            gateway["command"]
                .as_array()
                .unwrap()
                .contains(&json!("--no-model"))
        );
        assert!(
            gateway["env"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == "OPENAI_API_KEY")
        );
    }

    #[test]
    fn the_gateway_config_makes_deployed_pools_external() {
        let files = build(CONFIG).unwrap();
        let text = find(&files, "frugal-gateway.yaml", "ConfigMap")["data"]["frugal.toml"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(text.contains("semantic_threshold = 0.95\n"), "{text}");
        let raw = serve(&text);
        assert_eq!(raw.model, None);
        assert_eq!(raw.upstream.len(), 1);
        let pools: Vec<PoolConfig> = raw
            .pool
            .iter()
            .map(|p| settings::pool(p, &Catalog::default()).unwrap())
            .collect();
        let urls: Vec<_> = pools
            .iter()
            .map(|p| match &p.kind {
                Kind::External { url } => url.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            urls,
            [
                "http://frugal-pool-qwen-2-5:8080/v1",
                "http://frugal-pool-smol:8080/v1",
                "http://vllm.other:8000/v1"
            ]
        );
        assert_eq!((pools[0].min_replicas, pools[0].max_replicas), (1, 6));
        assert_eq!(pools[0].health, "/v1/models");
        let first: &RawPool = &raw.pool[0];
        assert!(first.image.is_none() && first.log_dir.is_none() && first.command.is_none());
    }

    #[test]
    fn bad_pools_are_named() {
        let no_image = CONFIG.replace("image = \"ghcr.io/ggml-org/llama.cpp:server\"\n", "");
        let err = build(&no_image).unwrap_err().to_string();
        assert!(
            err.contains("pool `Qwen_2.5`") && err.contains("`image`"),
            "{err}"
        );

        let clash = format!(
            "{CONFIG}\n[[serve.pool]]\nname = \"qwen-2.5\"\nbackend = \"local\"\nmodel = \"m.gguf\"\n"
        );
        let err = build(&clash).unwrap_err().to_string();
        assert!(
            err.contains("`Qwen_2.5` and `qwen-2.5`") && err.contains("frugal-pool-qwen-2-5"),
            "{err}"
        );

        let unnamed = "[[serve.pool]]\nname = \"__\"\nbackend = \"local\"\nmodel = \"m.gguf\"\n";
        let err = build(&format!("[serve]\n{unnamed}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("pool `__`"), "{err}");

        let long = CONFIG.replace("stable_window = \"90s\"", "stable_window = \"2h\"");
        assert!(matches!(build(&long), Err(KubeError::StableWindow { .. })));

        let err = manifests(
            &serve(CONFIG),
            &Catalog::default(),
            &Target {
                namespace: "ML".into(),
                ..target()
            },
        );
        assert!(matches!(err, Err(KubeError::Namespace(_))));
    }

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(object_name("Qwen_2.5").unwrap(), "frugal-pool-qwen-2-5");
        assert_eq!(object_name("--a--b--").unwrap(), "frugal-pool-a-b");
        assert_eq!(object_name("é"), None);
        let long = object_name(&"ab-".repeat(40)).unwrap();
        assert!(long.len() <= 63 && is_label(&long), "{long}");
        assert!(is_label("default") && !is_label("-a") && !is_label("a_b") && !is_label(""));
        assert_eq!(percent_encode("a/b c_d"), "a%2Fb%20c_d");
    }

    #[test]
    fn yaml_quotes_strings_and_keeps_text_as_a_block() {
        let v = json!({
            "a": {"on": "0", "list": [{"k": "v", "n": 1, "name": "x"}, "x: y # z", []], "empty": {}},
            "text": "line one\nline two\tafter a tab\n",
            "odd": "tab\there \"q\" \\ \u{2028} é",
        });
        assert_eq!(
            yaml(&[v]),
            "---\n\
             a:\n  empty: {}\n  list:\n    - name: \"x\"\n      k: \"v\"\n      \"n\": 1\n    - \"x: y # z\"\n    - []\n  \"on\": \"0\"\n\
             odd: \"tab\\there \\\"q\\\" \\\\ \\u2028 é\"\n\
             text: |\n  line one\n  line two\tafter a tab\n"
        );
        assert!(!literal(" indented\n") && !literal("no newline") && !literal("two\n\n"));
    }
}
