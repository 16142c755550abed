//! A mock S3 server, just what object_store's S3 client uses, and the store through it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use sha2::{Digest, Sha256};

use super::manifest::hex;
use super::tests::{RUN, complete_steps, read_tree, write_checkpoint};
use super::{CheckpointStore, StoreError};

/// A multipart upload: the object, and its parts by number.
type Upload = (String, BTreeMap<u32, Bytes>);

#[derive(Default)]
struct MockS3 {
    /// "bucket/key" -> body.
    objects: Mutex<BTreeMap<String, Bytes>>,
    /// upload id -> (object, part number -> body).
    uploads: Mutex<HashMap<String, Upload>>,
    next_upload: AtomicUsize,
    /// Answer this many requests with 503 first...
    fail_next: AtomicUsize,
    /// ... only those with this method, if set.
    fail_only: Mutex<Option<Method>>,
    requests: AtomicUsize,
}

impl MockS3 {
    fn keys(&self) -> Vec<String> {
        self.objects.lock().unwrap().keys().cloned().collect()
    }
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

fn etag(body: &[u8]) -> String {
    format!("\"{}\"", &hex(&Sha256::digest(body))[..32])
}

fn respond(status: StatusCode, headers: &[(&str, String)], body: impl Into<Body>) -> Response {
    let mut builder = Response::builder().status(status);
    for (name, value) in headers {
        builder = builder.header(*name, value);
    }
    builder.body(body.into()).unwrap()
}

fn xml(body: String) -> Response {
    respond(
        StatusCode::OK,
        &[("content-type", "application/xml".to_string())],
        body,
    )
}

fn not_found() -> Response {
    respond(
        StatusCode::NOT_FOUND,
        &[],
        "<Error><Code>NoSuchKey</Code><Message>not found</Message></Error>",
    )
}

async fn mock_s3(State(s3): State<Arc<MockS3>>, method: Method, uri: Uri, body: Bytes) -> Response {
    s3.requests.fetch_add(1, Ordering::SeqCst);
    let targeted = s3
        .fail_only
        .lock()
        .unwrap()
        .as_ref()
        .is_none_or(|m| *m == method);
    if targeted
        && s3
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        return respond(StatusCode::SERVICE_UNAVAILABLE, &[], "busy");
    }
    let path = uri.path().trim_start_matches('/');
    let (bucket, key) = match path.split_once('/') {
        Some((bucket, key)) => (bucket.to_string(), decode(key)),
        None => (path.to_string(), String::new()),
    };
    let query: HashMap<String, String> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(kv), String::new()),
        })
        .collect();
    let full = format!("{bucket}/{key}");

    if key.is_empty() {
        return if method == Method::GET && query.get("list-type").map(String::as_str) == Some("2") {
            list(&s3, &bucket, &query)
        } else if method == Method::POST && query.contains_key("delete") {
            let text = String::from_utf8(body.to_vec()).unwrap();
            let mut deleted = String::new();
            let mut objects = s3.objects.lock().unwrap();
            for piece in text.split("<Key>").skip(1) {
                let key = xml_unescape(piece.split("</Key>").next().unwrap());
                objects.remove(&format!("{bucket}/{key}"));
                deleted.push_str(&format!(
                    "<Deleted><Key>{}</Key></Deleted>",
                    xml_escape(&key)
                ));
            }
            xml(format!("<DeleteResult>{deleted}</DeleteResult>"))
        } else {
            respond(StatusCode::NOT_IMPLEMENTED, &[], "bucket operation")
        };
    }

    match method {
        Method::PUT if query.contains_key("uploadId") => {
            let number: u32 = query["partNumber"].parse().unwrap();
            let mut uploads = s3.uploads.lock().unwrap();
            let Some((_, parts)) = uploads.get_mut(&query["uploadId"]) else {
                return not_found();
            };
            let tag = etag(&body);
            parts.insert(number, body);
            respond(StatusCode::OK, &[("etag", tag)], "")
        }
        Method::PUT => {
            let tag = etag(&body);
            s3.objects.lock().unwrap().insert(full, body);
            respond(StatusCode::OK, &[("etag", tag)], "")
        }
        Method::POST if query.contains_key("uploads") => {
            let id = format!("upload-{}", s3.next_upload.fetch_add(1, Ordering::SeqCst));
            s3.uploads
                .lock()
                .unwrap()
                .insert(id.clone(), (full, BTreeMap::new()));
            xml(format!(
                "<InitiateMultipartUploadResult><Bucket>{bucket}</Bucket><Key>{}</Key><UploadId>{id}</UploadId></InitiateMultipartUploadResult>",
                xml_escape(&key)
            ))
        }
        Method::POST if query.contains_key("uploadId") => {
            let Some((object, parts)) = s3.uploads.lock().unwrap().remove(&query["uploadId"])
            else {
                return not_found();
            };
            let whole: Vec<u8> = parts.values().flat_map(|p| p.iter().copied()).collect();
            let tag = etag(&whole);
            s3.objects
                .lock()
                .unwrap()
                .insert(object, Bytes::from(whole));
            xml(format!(
                "<CompleteMultipartUploadResult><Key>{}</Key><ETag>{}</ETag></CompleteMultipartUploadResult>",
                xml_escape(&key),
                xml_escape(&tag)
            ))
        }
        Method::DELETE if query.contains_key("uploadId") => {
            s3.uploads.lock().unwrap().remove(&query["uploadId"]);
            respond(StatusCode::NO_CONTENT, &[], "")
        }
        Method::DELETE => {
            s3.objects.lock().unwrap().remove(&full);
            respond(StatusCode::NO_CONTENT, &[], "")
        }
        Method::GET | Method::HEAD => {
            let Some(object) = s3.objects.lock().unwrap().get(&full).cloned() else {
                return not_found();
            };
            let headers = [
                ("content-length", object.len().to_string()),
                ("etag", etag(&object)),
                ("last-modified", "Mon, 01 Jan 2024 00:00:00 GMT".to_string()),
            ];
            let body = if method == Method::HEAD {
                Bytes::new()
            } else {
                object
            };
            respond(StatusCode::OK, &headers, body)
        }
        _ => respond(StatusCode::NOT_IMPLEMENTED, &[], "object operation"),
    }
}

fn list(s3: &MockS3, bucket: &str, query: &HashMap<String, String>) -> Response {
    let prefix = query.get("prefix").cloned().unwrap_or_default();
    let delimiter = query.get("delimiter").filter(|d| !d.is_empty());
    let mut contents = String::new();
    let mut prefixes = BTreeSet::new();
    for (full, body) in s3.objects.lock().unwrap().iter() {
        let Some(key) = full.strip_prefix(&format!("{bucket}/")) else {
            continue;
        };
        let Some(rest) = key.strip_prefix(prefix.as_str()) else {
            continue;
        };
        if let Some(d) = delimiter
            && let Some(at) = rest.find(d.as_str())
        {
            prefixes.insert(format!("{prefix}{}", &rest[..at + d.len()]));
            continue;
        }
        contents.push_str(&format!(
            "<Contents><Key>{}</Key><Size>{}</Size><LastModified>2024-01-01T00:00:00.000Z</LastModified><ETag>{}</ETag></Contents>",
            xml_escape(key),
            body.len(),
            xml_escape(&etag(body))
        ));
    }
    let prefixes: String = prefixes
        .iter()
        .map(|p| {
            format!(
                "<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>",
                xml_escape(p)
            )
        })
        .collect();
    xml(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>{bucket}</Name><Prefix>{}</Prefix><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated>{contents}{prefixes}</ListBucketResult>",
        xml_escape(&prefix)
    ))
}

async fn start_mock() -> (Arc<MockS3>, String) {
    let s3 = Arc::new(MockS3::default());
    let app = axum::Router::new()
        .fallback(mock_s3)
        .layer(DefaultBodyLimit::disable())
        .with_state(Arc::clone(&s3));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (s3, endpoint)
}

fn open_s3(endpoint: &str, max_retries: &str) -> CheckpointStore {
    CheckpointStore::open_with_options(
        "s3://bucket/team/ckpts",
        RUN,
        &[
            ("aws_endpoint", endpoint),
            ("aws_allow_http", "true"),
            ("aws_access_key_id", "test"),
            ("aws_secret_access_key", "test"),
            ("aws_region", "us-east-1"),
            ("aws_virtual_hosted_style_request", "false"),
            ("max_retries", max_retries),
            ("retry_init_backoff", "1ms"),
            ("retry_max_backoff", "5ms"),
            ("retry_timeout", "10s"),
        ],
    )
    .unwrap()
}

#[tokio::test]
async fn s3_round_trip_through_a_mock_server() {
    let (s3, endpoint) = start_mock().await;
    let store = open_s3(&endpoint, "2").with_multipart_sizes(4096, 5000);
    assert_eq!(store.describe(), "s3://bucket/team/ckpts/runs/run-1");
    assert!(store.complete().await.unwrap().is_empty());

    let tmp = tempfile::tempdir().unwrap();
    let ckpts = tmp.path().join("ckpt");
    let mut dirs = BTreeMap::new();
    for (i, step) in [10u64, 20, 30].into_iter().enumerate() {
        let dir = write_checkpoint(&ckpts, step, i as u8);
        store.upload(step, &dir).await.unwrap();
        dirs.insert(step, dir);
    }
    let keys = s3.keys();
    let manifest = "bucket/team/ckpts/runs/run-1/00000000000000000030/MANIFEST.json";
    assert!(keys.iter().any(|k| k == manifest), "{keys:?}");
    let nested = "bucket/team/ckpts/runs/run-1/00000000000000000030/files/opt/state.json";
    assert!(keys.iter().any(|k| k == nested), "{keys:?}");
    assert!(
        s3.next_upload.load(Ordering::SeqCst) >= 3,
        "no multipart upload"
    );
    assert!(s3.uploads.lock().unwrap().is_empty());

    let steps = complete_steps(&store).await;
    assert_eq!(steps, [30, 20, 10]);

    // 30 loses its manifest: not complete, 20 is restored.
    s3.objects.lock().unwrap().remove(manifest);
    let dest = tmp.path().join("restored");
    let (m, path) = store.restore_newest(&dest).await.unwrap().unwrap();
    assert_eq!(m.step, 20);
    assert_eq!(read_tree(&path), read_tree(&dirs[&20]));

    // 20's model is corrupted: 10 is restored.
    let model20 = "bucket/team/ckpts/runs/run-1/00000000000000000020/files/model.bin";
    s3.objects
        .lock()
        .unwrap()
        .insert(model20.into(), Bytes::from(vec![7u8; 10_000]));
    let (m, path) = store.restore_newest(&dest).await.unwrap().unwrap();
    assert_eq!(m.step, 10);
    assert_eq!(read_tree(&path), read_tree(&dirs[&10]));

    // Prune to one: 10 stays (the newest complete), 30 (incomplete, newer) stays.
    store.upload(20, &dirs[&20]).await.unwrap();
    assert_eq!(store.prune(1).await.unwrap(), 1);
    let steps = complete_steps(&store).await;
    assert_eq!(steps, [20]);
    let keys = s3.keys();
    assert!(
        !keys.iter().any(|k| k.contains("/00000000000000000010/")),
        "{keys:?}"
    );
    assert!(
        keys.iter()
            .any(|k| k.contains("/00000000000000000030/files/")),
        "{keys:?}"
    );
}

#[tokio::test]
async fn s3_errors_name_the_object_and_retries_ride_out_a_blip() {
    let (s3, endpoint) = start_mock().await;
    let store = open_s3(&endpoint, "1");
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_checkpoint(&tmp.path().join("ckpt"), 10, 1);

    // Everything fails: the first request (clearing an old manifest of the step) says so.
    s3.fail_next.store(1_000, Ordering::SeqCst);
    let err = store.upload(10, &dir).await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, StoreError::Object { .. }), "{message}");
    assert!(
        message.starts_with(
            "delete s3://bucket/team/ckpts/runs/run-1/00000000000000000010/MANIFEST.json failed: "
        ),
        "{message}"
    );
    assert!(message.contains("503"), "{message}");
    assert!(std::error::Error::source(&err).is_some());
    // One attempt: the request and its one retry.
    assert_eq!(s3.requests.load(Ordering::SeqCst), 2);

    // Uploads fail: the error names the file's object.
    *s3.fail_only.lock().unwrap() = Some(Method::PUT);
    let err = store.upload(10, &dir).await.unwrap_err();
    let message = err.to_string();
    let files = "s3://bucket/team/ckpts/runs/run-1/00000000000000000010/files/";
    assert!(
        message.starts_with(&format!("upload {files}model.bin failed: "))
            || message.starts_with(&format!("upload {files}opt/state.json failed: ")),
        "{message}"
    );
    assert!(message.contains("503"), "{message}");
    s3.fail_next.store(0, Ordering::SeqCst);
    *s3.fail_only.lock().unwrap() = None;
    assert!(store.complete().await.unwrap().is_empty());

    // A single 503 is retried by the client.
    s3.fail_next.store(1, Ordering::SeqCst);
    store.upload(10, &dir).await.unwrap();
    let steps = complete_steps(&store).await;
    assert_eq!(steps, [10]);
}
