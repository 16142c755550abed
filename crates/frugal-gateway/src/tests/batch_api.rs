//! The Files and Batches API over the router, against fake backends: upload, create, poll,
//! read the output; validation, cancel, expiry, a restart, tenants, bad requests.

use std::time::Instant;

use super::*;
use crate::batch::run::RunConfig;

const FINAL: [&str; 4] = ["completed", "failed", "expired", "cancelled"];

fn config(dir: &std::path::Path) -> BatchConfig {
    let mut c = BatchConfig::new(dir.to_owned());
    c.run = RunConfig {
        concurrency: 4,
        max_attempts: 3,
        backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        ..RunConfig::default()
    };
    c
}

/// A gateway with the Batch API in `dir`, started.
fn start(backends: Vec<Arc<dyn Backend>>, keys: &[KeyConfig], c: BatchConfig) -> Gateway {
    let g = gateway_with(backends, keys, false, Some(c));
    g.state.start_batches();
    g
}

fn slow(delay_ms: u64) -> Arc<Fake> {
    Arc::new(Fake {
        name: "fake".into(),
        act: Act::Whole,
        calls: AtomicUsize::new(0),
        delay: Duration::from_millis(delay_ms),
    })
}

/// `n` chat lines for `/v1/chat/completions`; `model(i)` names each line's model.
fn lines(n: usize, model: impl Fn(usize) -> &'static str) -> String {
    (0..n)
        .map(|i| {
            let body = ask(model(i), json!({ "max_tokens": 4 }));
            format!(
                "{}\n",
                json!({ "custom_id": format!("r{i}"), "method": "POST", "url": "/v1/chat/completions", "body": body })
            )
        })
        .collect()
}

const BOUNDARY: &str = "frugal-test-boundary";

/// A multipart form as the OpenAI client sends it: `(name, filename, bytes)` per field.
fn form(fields: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, filename, bytes) in fields {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        let disposition = match filename {
            Some(f) => format!(
                "Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            ),
            None => format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n"),
        };
        body.extend_from_slice(disposition.as_bytes());
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

impl Gateway {
    async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
        key: Option<&str>,
    ) -> (StatusCode, Vec<u8>) {
        let mut req = Request::builder().method(method).uri(path);
        if !content_type.is_empty() {
            req = req.header("content-type", content_type);
        }
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let r = crate::http::router::router(self.state.clone())
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = r.status();
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, bytes.to_vec())
    }

    async fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        key: Option<&str>,
    ) -> (StatusCode, Value) {
        let (ct, body) = match body {
            Some(b) => ("application/json", b.to_string().into_bytes()),
            None => ("", Vec::new()),
        };
        let (status, bytes) = self.send(method, path, ct, body, key).await;
        let v = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)));
        (status, v)
    }

    async fn upload(&self, text: &str, purpose: &str, key: Option<&str>) -> (StatusCode, Value) {
        let body = form(&[
            ("purpose", None, purpose.as_bytes()),
            ("file", Some("in.jsonl"), text.as_bytes()),
        ]);
        let ct = format!("multipart/form-data; boundary={BOUNDARY}");
        let (status, bytes) = self.send("POST", "/v1/files", &ct, body, key).await;
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    async fn create(&self, file: &str, key: Option<&str>) -> (StatusCode, Value) {
        let body = json!({ "input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h" });
        self.api("POST", "/v1/batches", Some(body), key).await
    }

    /// Uploads `text` and creates a chat batch of it: the batch.
    async fn submit(&self, text: &str, key: Option<&str>) -> Value {
        let (status, file) = self.upload(text, "batch", key).await;
        assert_eq!(status, 200, "{file}");
        let (status, batch) = self.create(file["id"].as_str().unwrap(), key).await;
        assert_eq!(status, 200, "{batch}");
        batch
    }

    async fn batch(&self, id: &str, key: Option<&str>) -> Value {
        let (status, b) = self
            .api("GET", &format!("/v1/batches/{id}"), None, key)
            .await;
        assert_eq!(status, 200, "{b}");
        b
    }

    /// Polls the batch until `done` holds (30 s at most).
    async fn until(&self, id: &str, key: Option<&str>, done: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let b = self.batch(id, key).await;
            if done(&b) {
                return b;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{b}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn finished(&self, id: &str, key: Option<&str>) -> Value {
        self.until(id, key, |b| FINAL.contains(&b["status"].as_str().unwrap()))
            .await
    }

    /// The file's content, one JSON value a line.
    async fn content(&self, id: &Value, key: Option<&str>) -> Vec<Value> {
        let path = format!("/v1/files/{}/content", id.as_str().unwrap());
        let (status, bytes) = self.send("GET", &path, "", Vec::new(), key).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The custom_ids of result lines, sorted, each once.
fn unique_ids(results: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = results
        .iter()
        .map(|r| r["custom_id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "a custom_id is written twice");
    ids
}

/// A key of `tenant` without budgets.
fn key(tenant: &str, key: &str) -> KeyConfig {
    KeyConfig {
        tenant: tenant.into(),
        sha256: hash_key(key),
        daily: None,
        monthly: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_runs_through_the_api_and_its_files_hold_each_line_once() {
    let fake = Fake::new("fake", Act::Whole);
    let dir = tempfile::tempdir().unwrap();
    let g = start(vec![fake.clone()], &[], config(dir.path()));
    // Line 8 names a model no one serves: the endpoint refuses it, so it goes to the error
    // file as OpenAI writes a refusal.
    let text = lines(20, |i| if i == 7 { "nowhere" } else { "fake" });
    let (status, file) = g.upload(&text, "batch", None).await;
    assert_eq!(status, 200, "{file}");
    assert!(file["id"].as_str().unwrap().starts_with("file-"), "{file}");
    assert_eq!(
        (&file["object"], &file["purpose"], &file["status"]),
        (&json!("file"), &json!("batch"), &json!("processed"))
    );
    assert_eq!(file["bytes"], text.len());
    assert_eq!(file["filename"], "in.jsonl");
    let body = json!({
        "input_file_id": file["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h", "metadata": { "job": "nightly" },
    });
    let (status, created) = g.api("POST", "/v1/batches", Some(body), None).await;
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_str().unwrap();
    assert!(id.starts_with("batch_") && id.len() == 30, "{id}");
    assert_eq!(created["status"], "validating");
    assert_eq!(created["object"], "batch");
    assert_eq!(created["metadata"], json!({ "job": "nightly" }));
    assert_eq!(
        created["expires_at"].as_i64().unwrap() - created["created_at"].as_i64().unwrap(),
        24 * 3600
    );

    let done = g.finished(id, None).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["request_counts"],
        json!({ "total": 20, "completed": 19, "failed": 1 })
    );
    for at in ["in_progress_at", "finalizing_at", "completed_at"] {
        assert!(done[at].as_i64().is_some(), "{at}: {done}");
    }
    for at in ["failed_at", "expired_at", "cancelling_at", "cancelled_at"] {
        assert!(done[at].is_null(), "{at}: {done}");
    }
    assert!(done["errors"].is_null(), "{done}");

    let output = g.content(&done["output_file_id"], None).await;
    let ids = unique_ids(&output);
    assert_eq!(ids.len(), 19);
    assert!(!ids.contains(&"r7".to_owned()));
    let first = &output[0];
    assert!(first["id"].as_str().unwrap().starts_with("batch_req_"));
    assert_eq!(first["response"]["status_code"], 200);
    assert_eq!(
        first["response"]["body"]["choices"][0]["message"]["content"],
        "Paris."
    );
    assert!(first["error"].is_null());
    let errors = g.content(&done["error_file_id"], None).await;
    assert_eq!(unique_ids(&errors), ["r7"]);
    assert_eq!(errors[0]["response"]["status_code"], 404);
    assert_eq!(fake.calls.load(Ordering::Relaxed), 19);

    // The results are files too, listed newest first.
    let (status, out) = g
        .api(
            "GET",
            &format!("/v1/files/{}", done["output_file_id"].as_str().unwrap()),
            None,
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(out["purpose"], "batch_output");
    assert_eq!(out["filename"], format!("{id}_output.jsonl"));
    let (_, listed) = g
        .api("GET", "/v1/files?purpose=batch_output", None, None)
        .await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 2, "{listed}");
    let (_, all) = g.api("GET", "/v1/files?limit=1", None, None).await;
    assert_eq!(all["has_more"], true, "{all}");
    let (_, batches) = g.api("GET", "/v1/batches", None, None).await;
    assert_eq!(batches["object"], "list");
    assert_eq!(batches["data"][0]["id"], id);
    assert_eq!(
        (
            &batches["first_id"],
            &batches["last_id"],
            &batches["has_more"]
        ),
        (&json!(id), &json!(id), &json!(false))
    );

    // An input file is not deleted under a batch that reads it; a finished one's is.
    let (status, deleted) = g
        .api(
            "DELETE",
            &format!("/v1/files/{}", file["id"].as_str().unwrap()),
            None,
            None,
        )
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["deleted"], true);

    // Each line went to the ledger under the workload `batch`, the batch as its run.
    g.state.stop_batches().await;
    let (rows, names) = g.rows_named();
    assert_eq!(rows.len(), 19);
    for r in &rows {
        assert_eq!(names.get(r.workload), "batch");
        assert_eq!(r.run.map(|run| names.get(run)), Some(id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_input_fails_the_batch_with_every_problem_and_runs_nothing() {
    let fake = Fake::new("fake", Act::Whole);
    let dir = tempfile::tempdir().unwrap();
    let g = start(vec![fake.clone()], &[], config(dir.path()));
    let line = |id: &str, url: &str| {
        json!({ "custom_id": id, "method": "POST", "url": url, "body": ask("fake", json!({})) })
            .to_string()
    };
    let text = [
        line("a", "/v1/chat/completions"),
        line("b", "/v1/chat/completions"),
        line("a", "/v1/chat/completions"),
        "{not json".to_owned(),
        line("c", "/v1/completions"),
    ]
    .join("\n");
    let batch = g.submit(&text, None).await;
    let done = g.finished(batch["id"].as_str().unwrap(), None).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert!(done["failed_at"].as_i64().is_some(), "{done}");
    assert!(done["in_progress_at"].is_null(), "{done}");
    assert!(done["output_file_id"].is_null() && done["error_file_id"].is_null());
    assert_eq!(
        done["request_counts"],
        json!({ "total": 0, "completed": 0, "failed": 0 })
    );
    let errors = &done["errors"];
    assert_eq!(errors["object"], "list");
    let found: Vec<(&str, u64)> = errors["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["code"].as_str().unwrap(), e["line"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        found,
        [
            ("duplicate_custom_id", 3),
            ("invalid_json_line", 4),
            ("invalid_url", 5)
        ]
    );
    // The duplicate names the line it repeats.
    let duplicate = errors["data"][0]["message"].as_str().unwrap();
    assert!(duplicate.contains("line 1"), "{duplicate}");
    assert_eq!(fake.calls.load(Ordering::Relaxed), 0, "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_batch_stops_taking_lines_and_keeps_what_was_done() {
    let fake = slow(30);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.run.concurrency = 2;
    let g = start(vec![fake.clone()], &[], c);
    let batch = g.submit(&lines(100, |_| "fake"), None).await;
    let id = batch["id"].as_str().unwrap();
    g.until(id, None, |b| {
        b["request_counts"]["completed"].as_u64() >= Some(4)
    })
    .await;
    let (status, cancelling) = g
        .api("POST", &format!("/v1/batches/{id}/cancel"), None, None)
        .await;
    assert_eq!(status, 200, "{cancelling}");
    assert!(
        ["cancelling", "cancelled"].contains(&cancelling["status"].as_str().unwrap()),
        "{cancelling}"
    );
    assert!(cancelling["cancelling_at"].as_i64().is_some());
    let done = g.finished(id, None).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(done["cancelled_at"].as_i64().is_some());
    let completed = done["request_counts"]["completed"].as_u64().unwrap() as usize;
    assert!((4..100).contains(&completed), "{done}");
    assert_eq!(done["request_counts"]["total"], 100);
    let output = g.content(&done["output_file_id"], None).await;
    assert_eq!(unique_ids(&output).len(), completed);
    assert!(done["error_file_id"].is_null(), "{done}");
    assert_eq!(
        fake.calls.load(Ordering::Relaxed),
        completed,
        "no line after the cancel"
    );
    let (status, again) = g
        .api("POST", &format!("/v1/batches/{id}/cancel"), None, None)
        .await;
    assert_eq!(status, 409, "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_left_when_the_window_closes_expire() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.completion_window = Duration::from_secs(2);
    c.run.concurrency = 1;
    let g = start(vec![slow(100)], &[], c);
    let batch = g.submit(&lines(60, |_| "fake"), None).await;
    let done = g.finished(batch["id"].as_str().unwrap(), None).await;
    assert_eq!(done["status"], "expired", "{done}");
    assert!(done["expired_at"].as_i64().is_some(), "{done}");
    let counts = &done["request_counts"];
    let failed = counts["failed"].as_u64().unwrap();
    assert!(failed > 0, "{done}");
    assert_eq!(
        counts["completed"].as_u64().unwrap() + failed,
        60,
        "every line is answered or expired: {done}"
    );
    let errors = g.content(&done["error_file_id"], None).await;
    assert_eq!(errors.len() as u64, failed);
    assert!(
        errors
            .iter()
            .all(|e| e["error"]["code"] == "batch_expired" && e["response"].is_null())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_left_by_a_stopped_server_resumes_and_writes_each_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.run.concurrency = 2;
    let first = slow(20);
    let g = start(vec![first.clone()], &[], c.clone());
    let batch = g.submit(&lines(40, |_| "fake"), None).await;
    let id = batch["id"].as_str().unwrap().to_owned();
    g.until(&id, None, |b| {
        b["request_counts"]["completed"].as_u64() >= Some(3)
    })
    .await;
    g.state.stop_batches().await;
    let left = g.batch(&id, None).await;
    assert_eq!(
        left["status"], "in_progress",
        "a shutdown fails nothing: {left}"
    );
    let before = first.calls.load(Ordering::Relaxed);
    assert!(before < 40, "{before}");
    drop(g);

    let second = slow(1);
    let g = start(vec![second.clone()], &[], c);
    let done = g.finished(&id, None).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["request_counts"]["completed"], 40);
    let output = g.content(&done["output_file_id"], None).await;
    assert_eq!(unique_ids(&output).len(), 40);
    assert_eq!(
        before + second.calls.load(Ordering::Relaxed),
        40,
        "no line ran twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_batches_belong_to_the_tenant_that_made_them() {
    let keys = [key("a", "fk-a"), key("b", "fk-b")];
    let dir = tempfile::tempdir().unwrap();
    let g = start(
        vec![Fake::new("fake", Act::Whole)],
        &keys,
        config(dir.path()),
    );
    let (status, _) = g.upload(&lines(2, |_| "fake"), "batch", None).await;
    assert_eq!(status, 401, "a key is needed");
    let batch = g.submit(&lines(3, |_| "fake"), Some("fk-a")).await;
    let id = batch["id"].as_str().unwrap();
    let file = batch["input_file_id"].as_str().unwrap();
    let done = g.finished(id, Some("fk-a")).await;
    assert_eq!(done["status"], "completed", "{done}");
    let output = done["output_file_id"].as_str().unwrap();
    for path in [
        format!("/v1/batches/{id}"),
        format!("/v1/files/{file}"),
        format!("/v1/files/{output}"),
        format!("/v1/files/{output}/content"),
    ] {
        let (status, _) = g.send("GET", &path, "", Vec::new(), Some("fk-b")).await;
        assert_eq!(status, 404, "{path}");
    }
    let (status, _) = g.create(file, Some("fk-b")).await;
    assert_eq!(status, 404, "another tenant's file is not found");
    let (status, _) = g
        .api(
            "POST",
            &format!("/v1/batches/{id}/cancel"),
            None,
            Some("fk-b"),
        )
        .await;
    assert_eq!(status, 404);
    let (_, theirs) = g.api("GET", "/v1/batches", None, Some("fk-b")).await;
    assert_eq!(theirs["data"], json!([]));
    let (_, files) = g.api("GET", "/v1/files", None, Some("fk-b")).await;
    assert_eq!(files["data"], json!([]));
    let (_, ours) = g.api("GET", "/v1/batches", None, Some("fk-a")).await;
    assert_eq!(ours["data"][0]["id"], id);
    // Issue 31: the keys dropped (a reload that allows it) open the API, but what the
    // tenants made stays theirs: no key sees none of it.
    let open = KeySet {
        keys: Vec::new(),
        allow_open: true,
    };
    g.state
        .reload_keys(Ok(open), |_| Ok::<_, String>(Vec::new()))
        .unwrap();
    let (_, all) = g.api("GET", "/v1/batches", None, None).await;
    assert_eq!(all["data"], json!([]), "{all}");
    let (_, files) = g.api("GET", "/v1/files", None, None).await;
    assert_eq!(files["data"], json!([]), "{files}");
    for path in [
        format!("/v1/batches/{id}"),
        format!("/v1/files/{output}"),
        format!("/v1/files/{output}/content"),
    ] {
        let (status, _) = g.send("GET", &path, "", Vec::new(), None).await;
        assert_eq!(status, 404, "{path}");
    }
    let (status, _) = g
        .send("DELETE", &format!("/v1/files/{file}"), "", Vec::new(), None)
        .await;
    assert_eq!(status, 404);
    // The lines spent the budget of the tenant that made the batch.
    g.state.stop_batches().await;
    g.meter.close();
    let spend = Ledger::open(&g.ledger).unwrap().tenant_spend(0).unwrap();
    assert_eq!(spend.len(), 1, "{spend:?}");
    assert_eq!(spend[0].0, "a");
    assert_eq!(spend[0].1, Money::from_nanos(3 * 12_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_as_openai_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.max_file_bytes = 4096;
    let g = start(vec![Fake::new("fake", Act::Whole)], &[], c);
    let text = lines(2, |_| "fake");
    let expect = |(status, v): (StatusCode, Value), want: u16, param: Option<&str>| {
        assert_eq!(status.as_u16(), want, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{v}");
        }
    };
    expect(
        g.upload(&text, "fine-tune", None).await,
        400,
        Some("purpose"),
    );
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    let no_file = form(&[("purpose", None, b"batch")]);
    let (status, body) = g.send("POST", "/v1/files", &ct, no_file, None).await;
    expect(
        (status, serde_json::from_slice(&body).unwrap()),
        400,
        Some("file"),
    );
    let (status, body) = g
        .send(
            "POST",
            "/v1/files",
            "application/json",
            b"{}".to_vec(),
            None,
        )
        .await;
    expect((status, serde_json::from_slice(&body).unwrap()), 400, None);
    expect(g.upload(&"x".repeat(5000), "batch", None).await, 413, None);

    let (_, file) = g.upload(&text, "batch", None).await;
    let file = file["id"].as_str().unwrap();
    let create = |body: Value| g.api("POST", "/v1/batches", Some(body), None);
    expect(
        create(json!({ "input_file_id": "file-nope", "endpoint": "/v1/chat/completions", "completion_window": "24h" })).await,
        404,
        Some("input_file_id"),
    );
    expect(
        create(json!({ "input_file_id": file, "endpoint": "/v1/embeddings", "completion_window": "24h" })).await,
        400,
        Some("endpoint"),
    );
    expect(
        create(json!({ "input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "48h" })).await,
        400,
        Some("completion_window"),
    );
    expect(
        create(json!({ "endpoint": "/v1/chat/completions", "completion_window": "24h" })).await,
        400,
        Some("input_file_id"),
    );
    expect(
        create(json!({ "input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h", "metadata": { "n": 1 } })).await,
        400,
        Some("metadata"),
    );
    let (status, body) = g
        .send(
            "POST",
            "/v1/batches",
            "application/json",
            b"{".to_vec(),
            None,
        )
        .await;
    expect((status, serde_json::from_slice(&body).unwrap()), 400, None);
    expect(
        g.api("GET", "/v1/batches/batch_nope", None, None).await,
        404,
        None,
    );
    expect(
        g.api("POST", "/v1/batches/batch_nope/cancel", None, None)
            .await,
        404,
        None,
    );
    expect(
        g.api("GET", "/v1/files/file-nope", None, None).await,
        404,
        None,
    );
    expect(
        g.api("GET", "/v1/batches?limit=0", None, None).await,
        400,
        Some("limit"),
    );

    // A batch's output is no batch's input.
    let batch = g.submit(&text, None).await;
    let done = g.finished(batch["id"].as_str().unwrap(), None).await;
    let output = done["output_file_id"].as_str().unwrap();
    expect(
        create(json!({ "input_file_id": output, "endpoint": "/v1/chat/completions", "completion_window": "24h" })).await,
        400,
        Some("input_file_id"),
    );
}

#[tokio::test]
async fn a_second_server_on_the_same_directory_serves_without_the_batch_api() {
    let dir = tempfile::tempdir().unwrap();
    let first = start(vec![Fake::new("fake", Act::Whole)], &[], config(dir.path()));
    let second = start(vec![Fake::new("fake", Act::Whole)], &[], config(dir.path()));
    let (status, _) = first.api("GET", "/v1/batches", None, None).await;
    assert_eq!(status, 200);
    let (status, v) = second.api("GET", "/v1/batches", None, None).await;
    assert_eq!(status, 404, "{v}");
    let why = v["error"]["message"].as_str().unwrap();
    assert!(why.contains("in use by another frugal serve"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_tenant_lost_its_keys_fails_at_the_restart_and_keeps_its_results() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.run.concurrency = 1;
    let g = start(vec![slow(20)], &[key("a", "fk-a")], c.clone());
    let batch = g.submit(&lines(40, |_| "fake"), Some("fk-a")).await;
    let id = batch["id"].as_str().unwrap().to_owned();
    g.until(&id, Some("fk-a"), |b| {
        b["request_counts"]["completed"].as_u64() >= Some(2)
    })
    .await;
    g.state.stop_batches().await;
    drop(g);

    // Its lines would spend no one's budget: it stops, its results kept.
    let fake = slow(1);
    let g = start(vec![fake.clone()], &[key("b", "fk-b")], c);
    let batches = g.state.batches().unwrap().clone();
    let started = Instant::now();
    let done = loop {
        let b = batches.batch(&id, Some("a".into())).await.unwrap().unwrap();
        if b.status == crate::batch::store::JobStatus::Failed {
            break b;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{b:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(fake.calls.load(Ordering::Relaxed), 0);
    assert_eq!(done.errors.unwrap()["data"][0]["code"], "invalid_api_key");
    assert!(
        done.request_counts.completed >= 2,
        "{:?}",
        done.request_counts
    );
    assert!(done.output_file_id.is_some());
}

/// Issue 31, item 2: a file of bad lines kept every error (110 MB for a million) and took
/// the server down; now the batch fails with the first errors and their count, and stays
/// failed through a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_input_fails_with_its_first_errors_counted_and_stays_failed() {
    let fake = Fake::new("fake", Act::Whole);
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let g = start(vec![fake.clone()], &[], c.clone());
    let bad = 10_000;
    let batch = g.submit(&"x\n".repeat(bad), None).await;
    let id = batch["id"].as_str().unwrap().to_owned();
    let done = g.finished(&id, None).await;
    assert_eq!(done["status"], "failed", "{done}");
    let max = crate::batch::input::MAX_ERRORS;
    let errors = &done["errors"];
    assert_eq!(errors["data"].as_array().unwrap().len(), max);
    assert_eq!(errors["total"], bad);
    assert_eq!(errors["data"][max - 1]["line"], max);
    g.state.stop_batches().await;
    drop(g);

    let g = start(vec![fake.clone()], &[], c);
    let again = g.batch(&id, None).await;
    assert_eq!(again["status"], "failed", "{again}");
    assert_eq!(again["errors"], done["errors"]);
    assert_eq!(again["failed_at"], done["failed_at"], "not validated again");
    assert_eq!(fake.calls.load(Ordering::Relaxed), 0);
}

/// Issue 31, item 2: a batch whose validation took the server down was validated again at
/// every start; after two it fails, and one that crashed once is still tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_validation_stopped_the_server_twice_fails() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let g = start(vec![Fake::new("fake", Act::Whole)], &[], c.clone());
    let once = g.submit(&lines(3, |_| "fake"), None).await;
    let twice = g.submit(&lines(3, |_| "fake"), None).await;
    for b in [&once, &twice] {
        g.finished(b["id"].as_str().unwrap(), None).await;
    }
    g.state.stop_batches().await;
    drop(g);
    // As a server killed while validating leaves them: validating, with the validations
    // it started counted.
    let db = rusqlite::Connection::open(dir.path().join("batches.sqlite")).unwrap();
    for (b, n) in [(&once, 1), (&twice, 2)] {
        db.execute(
            "UPDATE batches SET status = 'validating', validations = ?1 WHERE id = ?2",
            rusqlite::params![n, b["id"].as_str().unwrap()],
        )
        .unwrap();
    }
    drop(db);

    let g = start(vec![Fake::new("fake", Act::Whole)], &[], c);
    let once = g.finished(once["id"].as_str().unwrap(), None).await;
    assert_eq!(once["status"], "completed", "{once}");
    let twice = g.finished(twice["id"].as_str().unwrap(), None).await;
    assert_eq!(twice["status"], "failed", "{twice}");
    assert_eq!(twice["errors"]["data"][0]["code"], "validation_crashed");
}

/// Issue 31, item 2: batches at once were unbounded; past `max_active` unfinished ones a
/// new batch is refused with a 429 that says why, and taken once one has finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_past_the_bound_are_refused_until_one_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.max_active = 2;
    c.run.concurrency = 1;
    let g = start(vec![slow(20)], &[], c);
    let (_, file) = g.upload(&lines(10, |_| "fake"), "batch", None).await;
    let file = file["id"].as_str().unwrap();
    let (s1, first) = g.create(file, None).await;
    let (s2, _) = g.create(file, None).await;
    assert_eq!((s1.as_u16(), s2.as_u16()), (200, 200));
    let (status, refused) = g.create(file, None).await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"]["code"], "too_many_batches", "{refused}");
    let why = refused["error"]["message"].as_str().unwrap();
    assert!(why.contains("at most 2 unfinished batches"), "{why}");
    g.finished(first["id"].as_str().unwrap(), None).await;
    let (status, third) = g.create(file, None).await;
    assert_eq!(status, 200, "{third}");
}

/// Issue 31, item 2: uploads had no quota; past a tenant's, an upload is refused (429) and
/// nothing of it stays on disk, while another tenant still has room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_past_the_tenants_quota_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.upload_quota = 1000;
    let g = start(
        vec![Fake::new("fake", Act::Whole)],
        &[key("a", "fk-a"), key("b", "fk-b")],
        c,
    );
    let text = "y".repeat(600);
    let (status, kept) = g.upload(&text, "batch", Some("fk-a")).await;
    assert_eq!(status, 200, "{kept}");
    let (status, refused) = g.upload(&text, "batch", Some("fk-a")).await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"]["code"], "storage_quota_exceeded");
    let why = refused["error"]["message"].as_str().unwrap();
    assert!(
        why.contains("tenant `a`") && why.contains("1000 bytes"),
        "{why}"
    );
    let on_disk = std::fs::read_dir(dir.path().join("files")).unwrap().count();
    assert_eq!(on_disk, 1, "the refused upload left nothing");
    let (status, other) = g.upload(&text, "batch", Some("fk-b")).await;
    assert_eq!(status, 200, "{other}");
    let path = format!("/v1/files/{}", kept["id"].as_str().unwrap());
    let (status, _) = g.api("DELETE", &path, None, Some("fk-a")).await;
    assert_eq!(status, 200);
    let (status, again) = g.upload(&text, "batch", Some("fk-a")).await;
    assert_eq!(status, 200, "{again}");
}

/// A tmpfs of `mb` megabytes mounted on a new folder, unmounted when dropped; `None`
/// where this process may not mount (not root).
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(mb: u32) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        mounted.then_some(Tmpfs(dir))
    }

    /// Writes a file until the disk is full; the file's path.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let path = self.0.path().join("ballast");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .args(["-l"])
            .arg(self.0.path())
            .status();
    }
}

/// Issue 31, item 10: one failed write to the batch store (a disk full for a moment)
/// failed the batch for good and cut off its lines in flight. Now the batch pauses with
/// the results in hand, goes on when the disk has room, and writes each line once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_fills_mid_batch_pauses_the_batch_and_loses_no_line() {
    // CI machines can mount: there a failed mount fails the test rather than skipping it.
    let Some(disk) = Tmpfs::mount(24) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to mount a tmpfs for this test"
        );
        eprintln!("skipped: this test mounts a tmpfs, which needs root");
        return;
    };
    let mut c = config(disk.0.path());
    c.run.concurrency = 2;
    let fake = slow(20);
    let g = start(vec![fake.clone()], &[], c);
    let n = 60;
    let batch = g.submit(&lines(n, |_| "fake"), None).await;
    let id = batch["id"].as_str().unwrap().to_owned();
    g.until(&id, None, |b| {
        b["request_counts"]["completed"].as_u64() >= Some(5)
    })
    .await;
    let ballast = disk.fill();
    // Paused once nothing moves: the slack of the files' last pages taken, no result is
    // written and no line starts.
    let mut last = None;
    let full = loop {
        let b = g.batch(&id, None).await;
        let now = (
            b["request_counts"].clone(),
            fake.calls.load(Ordering::Relaxed),
        );
        if last.as_ref() == Some(&now) {
            break b;
        }
        last = Some(now);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(full["status"], "in_progress", "{full}");
    let done = full["request_counts"]["completed"].as_u64().unwrap() as usize;
    assert_eq!(
        fake.calls.load(Ordering::Relaxed),
        done + 2,
        "both places hold an answer, kept, and no line started: {full}"
    );
    let done_when_full = full["request_counts"]["completed"].as_u64().unwrap();
    assert!(done_when_full < n as u64, "{full}");

    std::fs::remove_file(ballast).unwrap();
    let done = g.finished(&id, None).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["request_counts"]["completed"], n);
    let output = g.content(&done["output_file_id"], None).await;
    assert_eq!(unique_ids(&output).len(), n, "no line lost or twice");
    assert_eq!(fake.calls.load(Ordering::Relaxed), n, "no line ran twice");
    eprintln!(
        "a disk full after {done_when_full} of {n} lines: {} lines done, 0 lost, 0 twice",
        output.len()
    );
    g.state.stop_batches().await;
}

/// The database of a server from before `validations` (schema 1) is taken as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_database_of_schema_1_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let g = start(vec![Fake::new("fake", Act::Whole)], &[], c.clone());
    let old = g.submit(&lines(2, |_| "fake"), None).await;
    g.finished(old["id"].as_str().unwrap(), None).await;
    g.state.stop_batches().await;
    drop(g);
    let db = rusqlite::Connection::open(dir.path().join("batches.sqlite")).unwrap();
    db.execute_batch("ALTER TABLE batches DROP COLUMN validations; PRAGMA user_version = 1;")
        .unwrap();
    drop(db);

    let g = start(vec![Fake::new("fake", Act::Whole)], &[], c);
    assert_eq!(
        g.batch(old["id"].as_str().unwrap(), None).await["status"],
        "completed"
    );
    let new = g.submit(&lines(2, |_| "fake"), None).await;
    let done = g.finished(new["id"].as_str().unwrap(), None).await;
    assert_eq!(done["status"], "completed", "{done}");
    let db = rusqlite::Connection::open(dir.path().join("batches.sqlite")).unwrap();
    let version: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 2);
}
