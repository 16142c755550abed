//! The harness of the `frugal train` tests: the example trainer under the supervisor, a
//! loopback server playing each cloud's metadata endpoint, a local directory as the store,
//! and a fresh working directory standing in for a new machine.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    dead_code
)]

#[path = "../common/mod.rs"]
pub mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};

pub use frugal_testkit::wait_until;

/// A small model, paced so that a run lasts a few seconds and a notice lands mid-run.
pub const MODEL: &[&str] = &[
    "--steps",
    "400",
    "--batch",
    "16",
    "--hidden",
    "32",
    "--checkpoint-every",
    "100",
    "--step-delay-ms",
    "8",
];

/// What the metadata server says; the tests flip it.
#[derive(Default)]
struct Clouds {
    /// AWS instance-action and GCP preempted, while set: the deadline.
    notice: Option<SystemTime>,
    /// Azure StartRequests bodies received.
    acks: Vec<String>,
    /// The VM an Azure event names (`Resources`); `None`: this one, [`AZURE_VM`].
    azure_target: Option<String>,
    /// Scheduled Events documents served.
    azure_reads: u64,
    gcp_version: u64,
}

/// The name of the VM the Azure metadata says this is.
pub const AZURE_VM: &str = "vm-1";

#[derive(Clone)]
pub struct Metadata {
    state: Arc<Mutex<Clouds>>,
    changed: Arc<tokio::sync::Notify>,
    pub url: String,
    _runtime: Arc<tokio::runtime::Runtime>,
}

impl Metadata {
    pub fn start() -> Metadata {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let state = Arc::new(Mutex::new(Clouds::default()));
        let changed = Arc::new(tokio::sync::Notify::new());
        let shared = (state.clone(), changed.clone());
        let app = Router::new()
            .route("/latest/api/token", put(aws_token))
            .route("/latest/meta-data/spot/instance-action", get(aws_action))
            .route(
                "/latest/meta-data/events/recommendations/rebalance",
                get(|| async { StatusCode::NOT_FOUND }),
            )
            .route("/computeMetadata/v1/instance/preempted", get(gcp_preempted))
            .route(
                "/metadata/scheduledevents",
                get(azure_events).post(azure_ack),
            )
            .route("/metadata/instance/compute/name", get(azure_name))
            .with_state(shared);
        let url = runtime.block_on(frugal_testkit::loopback::serve(app));
        Metadata {
            state,
            changed,
            url,
            _runtime: Arc::new(runtime),
        }
    }

    /// Announces a preemption `left` from now.
    pub fn preempt(&self, left: Duration) {
        self.announce(None, left);
    }

    /// Announces, on Azure, the preemption of `vm` (another VM of the scale set) `left` from now.
    pub fn preempt_vm(&self, vm: &str, left: Duration) {
        self.announce(Some(vm.to_owned()), left);
    }

    fn announce(&self, azure_target: Option<String>, left: Duration) {
        let mut s = self.state.lock().unwrap();
        s.notice = Some(SystemTime::now() + left);
        s.azure_target = azure_target;
        s.gcp_version += 1;
        drop(s);
        self.changed.notify_waiters();
    }

    /// Scheduled Events documents served so far.
    pub fn azure_reads(&self) -> u64 {
        self.state.lock().unwrap().azure_reads
    }

    pub fn clear(&self) {
        let mut s = self.state.lock().unwrap();
        s.notice = None;
        s.azure_target = None;
        s.gcp_version += 1;
        drop(s);
        self.changed.notify_waiters();
    }

    /// `frugal train` flags for spot capacity watching `cloud`'s notices here.
    pub fn spot<'a>(&'a self, cloud: &'a str) -> Vec<&'a str> {
        vec!["--spot", "--notice", cloud, "--metadata-url", &self.url]
    }

    pub fn acks(&self) -> Vec<String> {
        self.state.lock().unwrap().acks.clone()
    }
}

type Shared = (Arc<Mutex<Clouds>>, Arc<tokio::sync::Notify>);

async fn aws_token(headers: HeaderMap) -> Response {
    if headers
        .get("x-aws-ec2-metadata-token-ttl-seconds")
        .is_none()
    {
        return StatusCode::BAD_REQUEST.into_response();
    }
    "token-1".into_response()
}

async fn aws_action(State((state, _)): State<Shared>, headers: HeaderMap) -> Response {
    if headers
        .get("x-aws-ec2-metadata-token")
        .is_none_or(|t| t != "token-1")
    {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    match state.lock().unwrap().notice {
        Some(at) => {
            let time = chrono::DateTime::<chrono::Utc>::from(at)
                .format("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            format!(r#"{{"action": "terminate", "time": "{time}"}}"#).into_response()
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn gcp_preempted(
    State((state, changed)): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    if headers.get("metadata-flavor").is_none_or(|v| v != "Google") {
        return StatusCode::FORBIDDEN.into_response();
    }
    let read = || {
        let s = state.lock().unwrap();
        (s.gcp_version, s.notice.is_some())
    };
    if q.get("wait_for_change").is_some_and(|v| v == "true") {
        let wait = q
            .get("timeout_sec")
            .and_then(|t| t.parse().ok())
            .unwrap_or(60);
        let last = q.get("last_etag").cloned();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait);
        while last.as_deref() == Some(read().0.to_string().as_str()) {
            let notified = changed.notified();
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
    }
    let (version, on) = read();
    (
        [
            ("metadata-flavor", "Google".to_owned()),
            ("etag", version.to_string()),
        ],
        if on { "TRUE" } else { "FALSE" },
    )
        .into_response()
}

async fn azure_events(State((state, _)): State<Shared>, headers: HeaderMap) -> Response {
    if headers.get("metadata").is_none_or(|v| v != "true") {
        return StatusCode::BAD_REQUEST.into_response();
    }
    let mut s = state.lock().unwrap();
    s.azure_reads += 1;
    let (vm, id) = match &s.azure_target {
        Some(vm) => (vm.clone(), format!("E-{vm}")),
        None => (AZURE_VM.to_owned(), "E-1".to_owned()),
    };
    let events = match s.notice {
        Some(at) => {
            let not_before = chrono::DateTime::<chrono::Utc>::from(at)
                .format("%a, %d %b %Y %H:%M:%S GMT")
                .to_string();
            format!(
                r#"[{{"EventId": "{id}", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                    "Resources": ["{vm}"], "EventStatus": "Scheduled", "NotBefore": "{not_before}",
                    "Description": "spot eviction", "EventSource": "Platform", "DurationInSeconds": -1}}]"#
            )
        }
        None => "[]".into(),
    };
    format!(r#"{{"DocumentIncarnation": 1, "Events": {events}}}"#).into_response()
}

async fn azure_name(headers: HeaderMap) -> Response {
    if headers.get("metadata").is_none_or(|v| v != "true") {
        return StatusCode::BAD_REQUEST.into_response();
    }
    AZURE_VM.into_response()
}

async fn azure_ack(State((state, _)): State<Shared>, body: String) -> StatusCode {
    state.lock().unwrap().acks.push(body);
    StatusCode::OK
}

/// A machine: its own working directory; the store and the ledger are shared.
pub struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    pub fn new() -> Machine {
        Machine {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `frugal train` with `flags`, running the example trainer with `trainer` args.
    pub fn train(&self, shared: &Shared2, flags: &[&str], trainer: &[&str]) -> Child {
        shared
            .train_in(self.path())
            .args([
                "--run",
                "r1",
                "--poll",
                "0.1",
                "--backoff",
                "0.1",
                "--no-gpu",
            ])
            .args(flags)
            .arg("--")
            .arg(frugal_testkit::example_trainer())
            .args(MODEL)
            .args(trainer)
            .spawn()
            .unwrap()
    }

    pub fn metrics(&self) -> PathBuf {
        self.path().join(".frugal/r1/metrics.jsonl")
    }

    /// The newest step the trainer reported here.
    pub fn step(&self) -> u64 {
        std::fs::read_to_string(self.metrics())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["step"].as_u64())
            .max()
            .unwrap_or(0)
    }

    /// Waits for the trainer under `child` to report `step`; fails at once if `child` ends.
    pub fn wait_for_step(&self, child: &mut Child, step: u64) {
        wait_until(
            Duration::from_secs(60),
            || {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("frugal train ended ({status}) before step {step}");
                }
                self.step() >= step
            },
            || format!("the trainer did not reach step {step} (at {})", self.step()),
        );
    }

    /// Waits until the trainer is writing a checkpoint (its `.tmp-STEP` folder is there):
    /// with `--checkpoint-every 0`, the one a stop asked for.
    pub fn wait_for_checkpoint_writing(&self) {
        let dir = self.path().join(".frugal/r1/checkpoints");
        wait_until(
            Duration::from_secs(30),
            || {
                std::fs::read_dir(&dir).is_ok_and(|entries| {
                    entries
                        .flatten()
                        .any(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
                })
            },
            || "the trainer never began a checkpoint".into(),
        );
    }

    pub fn model(&self) -> Vec<u8> {
        std::fs::read(self.path().join("model.bin")).unwrap()
    }
}

/// A segment in the ledger: outcome code, lost_ms, cost and list cost in nano-dollars, busy share.
pub type Row = (i64, i64, i64, Option<i64>, Option<f64>);

/// What outlives machines: the store and the ledger (a SQLite file, or a PostgreSQL
/// database).
pub struct Shared2 {
    _dir: tempfile::TempDir,
    pub store: PathBuf,
    pub ledger: String,
}

impl Shared2 {
    /// `frugal train` in `dir` on this ledger and store, its output piped; flags and the
    /// command follow.
    pub fn train_in(&self, dir: &Path) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_frugal"));
        cmd.current_dir(dir)
            .env("FRUGAL_LOG", "info")
            .arg("--ledger")
            .arg(&self.ledger)
            .arg("train")
            .arg("--store")
            .arg(&self.store)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    pub fn new() -> Shared2 {
        let dir = tempfile::tempdir().unwrap();
        Shared2 {
            store: dir.path().join("store"),
            ledger: dir.path().join("ledger.sqlite").display().to_string(),
            _dir: dir,
        }
    }

    /// The same, with the ledger a database of the test process's PostgreSQL server.
    pub fn on_postgres() -> Shared2 {
        Shared2 {
            ledger: frugal_testkit::postgres::database(),
            ..Shared2::new()
        }
    }

    /// Steps of the complete checkpoints in the store.
    pub fn stored(&self) -> Vec<u64> {
        let runs = self.store.join("runs/r1");
        let mut steps: Vec<u64> = std::fs::read_dir(&runs)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().join("MANIFEST.json").exists())
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        steps.sort_unstable();
        steps
    }

    pub fn report(&self, args: &[&str]) -> String {
        common::report(&self.ledger, args)
    }

    /// The ledger's segments, in time order, read through the ledger's own interface (either
    /// backend).
    pub fn segments(&self) -> Vec<Row> {
        let ledger = frugal_cost::Ledger::open(frugal_cost::Location::parse(&self.ledger)).unwrap();
        let mut rows = Vec::new();
        ledger
            .scan(frugal_cost::ledger::Window::default(), |r| {
                rows.push((
                    r.outcome.map_or(-1, |o| o.code()),
                    r.lost_ms,
                    r.cost.nanos(),
                    r.list_cost.map(|c| c.nanos()),
                    r.utilization,
                ));
            })
            .unwrap();
        rows
    }
}

pub fn finish(child: Child) -> Output {
    let out = child.wait_with_output().unwrap();
    eprintln!(
        "--- frugal train stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The model an uninterrupted, unsupervised run ends with.
pub fn reference() -> Vec<u8> {
    static REF: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    REF.get_or_init(|| {
        let m = Machine::new();
        let out = Command::new(frugal_testkit::example_trainer())
            .current_dir(m.path())
            .args(MODEL)
            .args(["--step-delay-ms", "0"])
            .env("FRUGAL_CHECKPOINT_DIR", m.path().join("ckpt"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        m.model()
    })
    .clone()
}

/// Checkpoint steps a run resumed from, read from its log.
pub fn resumed_from(log: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|l| l.split("resuming from checkpoint ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}
