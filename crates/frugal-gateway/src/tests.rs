//! The pipeline driven in-process (`Router::oneshot`) against a fake backend: every exit
//! settles the bill once, with a real meter writing a real SQLite ledger.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tower::ServiceExt;

use frugal_cost::ledger::{Row, Window};
use frugal_cost::{Kind as EventKind, Ledger, Money, Outcome};

use crate::admit::keys::{KeyConfig, KeySet, Keys, hash_key};
use crate::backend::{Backend, Output, Plan, Priced, Work};
use crate::batch::service::BatchConfig;
use crate::cache::exact::{CacheConfig, ExactCache};
use crate::http::error::ApiError;
use crate::http::validate::Job;
use crate::meter::{Meter, MeterConfig};
use crate::{AppState, Parts};

/// A nano-dollar per token, a dollar per million.
const PER_TOKEN: i64 = 1_000;

#[derive(Clone, Copy)]
enum Act {
    /// A whole answer.
    Whole,
    /// A stream of `n` content chunks, `gap` apart, then usage and [DONE].
    Stream { n: usize, gap: Duration },
    /// Fails after the call was made.
    Fail,
    /// Panics mid-call.
    Panic,
}

struct Fake {
    name: String,
    act: Act,
    calls: AtomicUsize,
    /// Held before answering: requests in flight together.
    delay: Duration,
}

impl Fake {
    fn new(name: &str, act: Act) -> Arc<Fake> {
        Arc::new(Fake {
            name: name.into(),
            act,
            calls: AtomicUsize::new(0),
            delay: Duration::ZERO,
        })
    }
}

fn chunk(text: &str, finish: Option<&str>) -> String {
    json!({ "object": "chat.completion.chunk", "choices": [{ "index": 0, "delta": { "content": text }, "finish_reason": finish }] }).to_string()
}

impl Backend for Fake {
    fn name(&self) -> &str {
        &self.name
    }

    fn prepare(&self, job: &Job) -> Result<Plan, ApiError> {
        let tokens = job.prompt_bytes() + job.max_tokens().unwrap_or(100);
        Ok(Plan {
            worst_case: Money::from_nanos(tokens as i64 * PER_TOKEN),
            prompt_tokens: None,
            engine: None,
        })
    }

    fn produce<'a>(
        &'a self,
        _job: &'a Job,
        _plan: Plan,
        _work: &'a mut Work,
    ) -> BoxFuture<'a, Result<Output, ApiError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(self.delay).await;
            match self.act {
                Act::Whole => Ok(Output::Json(json!({
                    "object": "chat.completion",
                    "choices": [{ "index": 0, "message": { "role": "assistant", "content": "Paris." }, "finish_reason": "stop" }],
                    "usage": { "prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12 },
                }))),
                Act::Stream { n, gap } => {
                    let events = futures_util::stream::iter(0..n + 2).then(move |i| async move {
                        tokio::time::sleep(gap).await;
                        Ok(if i < n {
                            chunk("tok ", (i + 1 == n).then_some("stop"))
                        } else if i == n {
                            json!({ "choices": [], "usage": { "prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n } }).to_string()
                        } else {
                            "[DONE]".to_owned()
                        })
                    });
                    Ok(Output::Events(Box::pin(events)))
                }
                Act::Fail => Err(ApiError::Upstream {
                    status: 502,
                    message: "upstream `fake` answered 500".into(),
                }),
                Act::Panic => panic!("the backend broke"),
            }
        })
    }

    fn price(&self, work: &Work) -> Priced {
        let tokens = work.prompt_tokens + work.completion_tokens;
        Priced {
            cost: Money::from_nanos(tokens as i64 * PER_TOKEN),
            ..Priced::default()
        }
    }
}

struct Gateway {
    state: AppState,
    meter: Meter,
    _dir: tempfile::TempDir,
    ledger: std::path::PathBuf,
}

fn gateway(backends: Vec<Arc<dyn Backend>>, keys: &[KeyConfig], cache: bool) -> Gateway {
    gateway_with(backends, keys, cache, None)
}

/// With the Batch API kept in `batches` (not started).
fn gateway_with(
    backends: Vec<Arc<dyn Backend>>,
    keys: &[KeyConfig],
    cache: bool,
    batches: Option<BatchConfig>,
) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.sqlite");
    let meter = Meter::start(MeterConfig {
        ledger: ledger.clone().into(),
        workload: "test".into(),
        capacity: None,
        machines: Vec::new(),
        pools: Vec::new(),
        spool: None,
    })
    .unwrap();
    let state = AppState::new(Parts {
        meter: Some(meter.clone()),
        cache: cache.then(|| ExactCache::new(CacheConfig::default())),
        backends,
        keys: Keys::new(keys),
        policies: HashMap::new(),
        batches,
        ..Parts::default()
    });
    Gateway {
        state,
        meter,
        _dir: dir,
        ledger,
    }
}

impl Gateway {
    async fn call(&self, path: &str, body: Value, key: Option<&str>) -> axum::response::Response {
        let mut req = Request::post(path).header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        crate::http::router::router(self.state.clone())
            .oneshot(req.body(Body::from(body.to_string())).unwrap())
            .await
            .unwrap()
    }

    async fn get(&self, path: &str, key: Option<&str>) -> StatusCode {
        let mut req = Request::get(path);
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        crate::http::router::router(self.state.clone())
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap()
            .status()
    }

    /// Closes the meter and reads what it wrote.
    fn rows(self) -> Vec<Row> {
        self.rows_named().0
    }

    /// The inference rows, and the names their ids stand for.
    fn rows_named(self) -> (Vec<Row>, frugal_cost::ledger::Names) {
        self.meter.close();
        let mut rows = Vec::new();
        let ledger = Ledger::open(&self.ledger).unwrap();
        ledger.scan(Window::default(), |r| rows.push(*r)).unwrap();
        rows.retain(|r| r.kind == EventKind::Inference);
        (rows, ledger.names().unwrap())
    }
}

fn ask(model: &str, extra: Value) -> Value {
    let mut v = json!({ "model": model, "messages": [{ "role": "user", "content": "What is the capital of France?" }], "temperature": 0 });
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    v
}

async fn text(r: axum::response::Response) -> String {
    let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn header<'a>(r: &'a axum::response::Response, name: &str) -> &'a str {
    r.headers().get(name).map_or("", |v| v.to_str().unwrap())
}

#[tokio::test]
async fn an_answer_is_billed_once_and_a_cache_hit_saves_it() {
    let fake = Fake::new("fake", Act::Whole);
    let g = gateway(vec![fake.clone()], &[], true);
    let r = g
        .call("/v1/chat/completions", ask("fake", json!({})), None)
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-frugal-cost-usd"), "0.000012000");
    assert_eq!(header(&r, "x-frugal-cache"), "miss");
    let v: Value = serde_json::from_str(&text(r).await).unwrap();
    assert_eq!(v["usage"]["cost_usd"], json!(0.000012));
    assert_eq!(v["frugal"]["cost_usd"], "0.000012000");
    let again = g
        .call("/v1/chat/completions", ask("fake", json!({})), None)
        .await;
    assert_eq!(header(&again, "x-frugal-cache"), "hit-exact");
    assert_eq!(header(&again, "x-frugal-cost-usd"), "0.000000000");
    assert_eq!(header(&again, "x-frugal-saved-usd"), "0.000012000");
    assert_eq!(fake.calls.load(Ordering::Relaxed), 1);
    let rows = g.rows();
    assert_eq!(rows.len(), 2, "one row per request");
    assert_eq!(
        rows.iter().map(|r| r.cost).sum::<Money>(),
        Money::from_nanos(12_000)
    );
    assert_eq!(rows.iter().map(|r| r.requests).sum::<u64>(), 2);
}

#[tokio::test]
async fn a_stream_carries_its_cost_on_the_last_chunk() {
    let fake = Fake::new(
        "fake",
        Act::Stream {
            n: 3,
            gap: Duration::ZERO,
        },
    );
    let g = gateway(vec![fake], &[], false);
    for include_usage in [false, true] {
        let body = ask(
            "fake",
            json!({ "stream": true, "stream_options": { "include_usage": include_usage } }),
        );
        let r = g.call("/v1/chat/completions", body, None).await;
        assert_eq!(r.status(), 200);
        let body = text(r).await;
        let data: Vec<&str> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
        let last: Value = serde_json::from_str(data[data.len() - 2]).unwrap();
        // 10 prompt and 3 completion tokens at a nano-dollar each.
        assert_eq!(last["frugal"]["cost_usd"], "0.000013000", "{body}");
        assert_eq!(
            last["usage"]["cost_usd"].as_f64().is_some(),
            include_usage,
            "{body}"
        );
        let text: String = data
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(text, "tok tok tok ");
    }
    let rows = g.rows();
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .all(|r| r.outcome.is_none() && r.output_tokens == 3)
    );
}

#[tokio::test]
async fn a_client_that_leaves_a_stream_is_billed_for_what_was_produced() {
    let fake = Fake::new(
        "fake",
        Act::Stream {
            n: 1000,
            gap: Duration::from_millis(5),
        },
    );
    let key = "fk-tenant";
    let keys = [KeyConfig {
        tenant: "acme".into(),
        sha256: hash_key(key),
        daily: Some(Money::from_cents(100)),
        monthly: None,
    }];
    let g = gateway(vec![fake], &keys, false);
    let r = g
        .call(
            "/v1/chat/completions",
            ask("fake", json!({ "stream": true })),
            Some(key),
        )
        .await;
    assert_eq!(r.status(), 200);
    let mut body = r.into_body().into_data_stream();
    let mut seen = 0;
    while seen < 5 {
        let frame = body.next().await.unwrap().unwrap();
        seen += String::from_utf8_lossy(&frame).matches("tok ").count();
    }
    drop(body);
    let rows = g.rows();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row.outcome, Some(Outcome::Cancelled));
    assert!((5..20).contains(&row.output_tokens), "{row:?}");
    assert!(row.input_tokens > 0, "the prompt is estimated: {row:?}");
    assert!(row.cost > Money::ZERO);
}

#[tokio::test]
async fn a_failed_call_is_on_record_and_a_refusal_is_not() {
    let g = gateway(vec![Fake::new("fake", Act::Fail)], &[], true);
    let r = g
        .call("/v1/chat/completions", ask("fake", json!({})), None)
        .await;
    assert_eq!(r.status(), 502);
    let r = g
        .call(
            "/v1/chat/completions",
            ask("fake", json!({ "max_tokens": 0 })),
            None,
        )
        .await;
    assert_eq!(r.status(), 400);
    let r = g
        .call("/v1/chat/completions", ask("nope", json!({})), None)
        .await;
    assert_eq!(r.status(), 404);
    let rows = g.rows();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].outcome, Some(Outcome::Failed));
    assert_eq!(rows[0].requests, 0);
    assert!(
        rows[0].input_tokens > 0,
        "what the call was sent is estimated"
    );
}

#[tokio::test]
async fn a_panic_in_the_backend_still_settles_the_bill() {
    let g = gateway(vec![Fake::new("fake", Act::Panic)], &[], false);
    let app = crate::http::router::router(g.state.clone());
    let req = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(ask("fake", json!({})).to_string()))
        .unwrap();
    let task = tokio::spawn(async move { app.oneshot(req).await });
    assert!(task.await.unwrap_err().is_panic());
    let rows = g.rows();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, Some(Outcome::Cancelled));
}

#[tokio::test]
async fn metrics_and_models_need_a_key_when_keys_are_configured() {
    let key = "fk-k";
    let keys = [KeyConfig {
        tenant: "t".into(),
        sha256: hash_key(key),
        daily: None,
        monthly: None,
    }];
    let g = gateway(vec![Fake::new("fake", Act::Whole)], &keys, false);
    assert_eq!(g.get("/metrics", None).await, StatusCode::UNAUTHORIZED);
    assert_eq!(
        g.get("/metrics", Some("fk-wrong")).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(g.get("/v1/models", None).await, StatusCode::UNAUTHORIZED);
    assert_eq!(g.get("/metrics", Some(key)).await, StatusCode::OK);
    assert_eq!(g.get("/v1/models", Some(key)).await, StatusCode::OK);
    assert_eq!(g.get("/health", None).await, StatusCode::OK);
    let open = gateway(vec![Fake::new("fake", Act::Whole)], &[], false);
    assert_eq!(open.get("/metrics", None).await, StatusCode::OK);
}

#[tokio::test]
async fn a_budget_overshoots_by_at_most_one_reservation() {
    // Each request may cost up to (prompt bytes + 5,000 tokens) x $1/M, about half a cent;
    // the daily budget is one cent. Twenty arrive at once.
    let fake = Arc::new(Fake {
        name: "fake".into(),
        act: Act::Whole,
        calls: AtomicUsize::new(0),
        delay: Duration::from_millis(50),
    });
    let key = "fk-b";
    let keys = [KeyConfig {
        tenant: "b".into(),
        sha256: hash_key(key),
        daily: Some(Money::from_cents(1)),
        monthly: None,
    }];
    let g = Arc::new(gateway(vec![fake.clone()], &keys, false));
    let calls = (0..20).map(|_| {
        let g = g.clone();
        tokio::spawn(async move {
            let body = ask("fake", json!({ "max_tokens": 5000, "temperature": 1 }));
            g.call("/v1/chat/completions", body, Some(key))
                .await
                .status()
        })
    });
    let statuses: Vec<StatusCode> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(ok + refused, 20);
    // Two reservations fit under a cent (the second overshoots by at most itself); the
    // rest wait for those to settle at their real, smaller cost.
    assert_eq!(ok, 2, "{statuses:?}");
    assert_eq!(fake.calls.load(Ordering::Relaxed), 2);
    let g = Arc::into_inner(g).unwrap();
    let spent: Money = g.rows().iter().map(|r| r.cost).sum();
    assert_eq!(spent, Money::from_nanos(2 * 12_000));
}

mod batch_api;

mod batch_runs {
    use super::*;
    use crate::batch::input::{self, Limits};
    use crate::batch::run::{Ended, Progress, RunConfig, run};
    use crate::batch::store::{Options, Paths, Store};

    /// A batch input of `n` chat lines; `model(i)` names each line's model.
    fn write_input(
        dir: &std::path::Path,
        n: usize,
        model: impl Fn(usize) -> &'static str,
    ) -> std::path::PathBuf {
        let path = dir.join("in.jsonl");
        let text: String = (0..n)
            .map(|i| {
                let body = ask(model(i), json!({ "max_tokens": 4 }));
                format!(
                    "{}\n",
                    json!({ "custom_id": format!("r{i}"), "method": "POST", "url": "/v1/chat/completions", "body": body })
                )
            })
            .collect();
        std::fs::write(&path, text).unwrap();
        path
    }

    fn ids(path: &std::path::Path) -> Vec<String> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["custom_id"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    fn config() -> RunConfig {
        RunConfig {
            concurrency: 4,
            max_attempts: 3,
            backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            model: None,
            tenant: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_line_once_retries_for_what_may_pass_and_refusals_to_the_error_file() {
        let good = Fake::new("fake", Act::Whole);
        let down = Fake::new("down", Act::Fail);
        let g = gateway(vec![good.clone(), down.clone()], &[], false);
        let dir = tempfile::tempdir().unwrap();
        let model = |i: usize| match i {
            5 => "nowhere",
            i if i % 10 == 9 => "down",
            _ => "fake",
        };
        let input_path = write_input(dir.path(), 40, model);
        let input = input::read(&input_path, &Limits::default()).unwrap();
        let paths = Paths::beside(&dir.path().join("out.jsonl"));
        let store =
            Arc::new(Store::open(&paths, &input_path, &input, &Options::default()).unwrap());
        let progress = Arc::new(Progress::default());
        let app = crate::http::router::router(g.state.clone());
        let ended = run(
            app,
            store.clone(),
            &input,
            &config(),
            progress.clone(),
            std::future::pending(),
        )
        .await
        .unwrap();
        assert_eq!(ended, Ended::Finished);
        let counts = store.counts().unwrap();
        assert_eq!((counts.total, counts.completed, counts.failed), (40, 35, 5));
        let mut out = ids(&paths.output);
        out.sort();
        out.dedup();
        assert_eq!(out.len(), 35, "each answered line once");
        let errors = std::fs::read_to_string(&paths.errors).unwrap();
        let errors: Vec<Value> = errors
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(errors.len(), 5);
        let status = |id: &str| {
            errors.iter().find(|e| e["custom_id"] == id).unwrap()["response"]["status_code"]
                .as_u64()
        };
        // An unknown model is the client's mistake: written at once, not retried.
        assert_eq!(status("r5"), Some(404));
        assert_eq!(status("r9"), Some(502));
        assert_eq!(good.calls.load(Ordering::Relaxed), 35);
        assert_eq!(
            down.calls.load(Ordering::Relaxed),
            4 * 3,
            "three tries each"
        );
        assert_eq!(progress.retries.load(Ordering::Relaxed), 4 * 2);
        // Every call went to the ledger once: 35 answers, 12 failed tries, each under the
        // workload `batch` with the job as its run.
        let (rows, names) = g.rows_named();
        assert_eq!(rows.len(), 35 + 12);
        let job = store.job().id.clone();
        assert!(job.starts_with("batch_") && job.len() == 30, "{job}");
        for r in &rows {
            assert_eq!(names.get(r.workload), "batch");
            assert_eq!(r.run.map(|id| names.get(id)), Some(job.as_str()));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_run_resumes_with_the_lines_left_and_writes_each_once() {
        let slow = Arc::new(Fake {
            name: "fake".into(),
            act: Act::Whole,
            calls: AtomicUsize::new(0),
            delay: Duration::from_millis(20),
        });
        let g = gateway(vec![slow.clone()], &[], false);
        let dir = tempfile::tempdir().unwrap();
        let input_path = write_input(dir.path(), 30, |_| "fake");
        let input = input::read(&input_path, &Limits::default()).unwrap();
        let paths = Paths::beside(&dir.path().join("out.jsonl"));
        let open =
            || Arc::new(Store::open(&paths, &input_path, &input, &Options::default()).unwrap());
        let store = open();
        let mut c = config();
        c.concurrency = 2;
        let stop = tokio::time::sleep(Duration::from_millis(100));
        let app = crate::http::router::router(g.state.clone());
        let ended = run(
            app.clone(),
            store.clone(),
            &input,
            &c,
            Arc::new(Progress::default()),
            stop,
        )
        .await
        .unwrap();
        assert_eq!(ended, Ended::Stopped);
        let first = store.counts().unwrap().completed;
        assert!(first > 0 && first < 30, "{first}");
        drop(store);
        let store = open();
        assert_eq!(store.pending().unwrap().len(), 30 - first);
        let ended = run(
            app,
            store.clone(),
            &input,
            &c,
            Arc::new(Progress::default()),
            std::future::pending(),
        )
        .await
        .unwrap();
        assert_eq!(ended, Ended::Finished);
        let mut out = ids(&paths.output);
        assert_eq!(out.len(), 30);
        out.sort();
        out.dedup();
        assert_eq!(out.len(), 30, "no line twice");
        assert_eq!(slow.calls.load(Ordering::Relaxed), 30, "no line run twice");
    }
}
