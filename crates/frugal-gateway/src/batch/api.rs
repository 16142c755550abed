//! OpenAI's Files and Batches endpoints over [`Batches`], so that the official clients'
//! `files.create`, `batches.create`, `batches.retrieve`, `files.content` work unchanged:
//! `POST /v1/files` (multipart, purpose `batch`), `GET /v1/files`, `GET` and `DELETE
//! /v1/files/{id}`, `GET /v1/files/{id}/content`, `POST /v1/batches`, `GET /v1/batches`,
//! `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`.
//!
//! With API keys configured, a file or batch belongs to the tenant whose key created it:
//! another tenant is answered 404, as for an id that does not exist.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::multipart::{MultipartError, MultipartRejection};
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use frugal_cost::causes::with_causes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use super::error::BatchError;
use super::files::{Delete, UPLOAD_PURPOSE};
use super::input::Endpoint;
use super::service::{Batches, COMPLETION_WINDOW, Cancel, NewBatch};
use crate::http::error::ApiError;
use crate::request::state::AppState;

/// Room in an upload's body for the multipart envelope and the other fields.
const ENVELOPE: u64 = 1 << 20;
/// OpenAI's bounds on a list's `limit`, and its defaults.
const FILES_LIMIT: (usize, usize) = (10_000, 10_000);
const BATCHES_LIMIT: (usize, usize) = (100, 20);
/// OpenAI's bounds on metadata: pairs, key and value lengths.
const METADATA: (usize, usize, usize) = (16, 64, 512);

type Reply = Result<Response, ApiError>;

pub(crate) fn routes(max_upload: u64) -> Router<AppState> {
    let body_limit = usize::try_from(max_upload + ENVELOPE).unwrap_or(usize::MAX);
    Router::new()
        .route(
            "/v1/files",
            get(list_files)
                .post(upload)
                .layer(DefaultBodyLimit::max(body_limit)),
        )
        .route("/v1/files/{id}", get(get_file).delete(delete_file))
        .route("/v1/files/{id}/content", get(file_content))
        .route("/v1/batches", get(list_batches).post(create_batch))
        .route("/v1/batches/{id}", get(get_batch))
        .route("/v1/batches/{id}/cancel", post(cancel_batch))
}

/// The query of a list: OpenAI's cursor pagination.
#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    after: Option<String>,
    purpose: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CreateBatch {
    input_file_id: Option<String>,
    endpoint: Option<String>,
    completion_window: Option<String>,
    metadata: Option<Value>,
}

async fn upload(
    State(s): State<AppState>,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Reply {
    let (b, tenant) = open(&s, &headers)?;
    let mut multipart = multipart.map_err(|e| {
        ApiError::BadRequest(format!(
            "POST /v1/files takes multipart/form-data with `purpose` and `file`: {}",
            e.body_text()
        ))
    })?;
    let max = b.config().max_file_bytes;
    let quota = b.config().upload_quota;
    let stored = b.stored(tenant.clone()).await.map_err(internal)?;
    let (mut purpose, mut upload) = (None, None);
    while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
        match field.name() {
            Some("purpose") => {
                let p = field.text().await.map_err(multipart_error)?;
                if p != UPLOAD_PURPOSE {
                    return Err(ApiError::InvalidParam {
                        param: "purpose",
                        message: format!(
                            "Invalid value: '{p}'. This server keeps files for the Batch API: the supported value is '{UPLOAD_PURPOSE}'."
                        ),
                    });
                }
                purpose = Some(p);
            }
            Some("file") if upload.is_none() => {
                let filename = field.file_name().unwrap_or("upload.jsonl").to_owned();
                let mut file = b.begin_upload().await.map_err(internal)?;
                while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                    let bytes = file.bytes() + chunk.len() as u64;
                    if bytes > max {
                        return Err(too_large(max));
                    }
                    // Refused as it passes the quota, not once it is all on disk.
                    if stored + bytes > quota {
                        return Err(refused(BatchError::QuotaExceeded {
                            tenant,
                            stored,
                            quota,
                        }));
                    }
                    file.write(&chunk).await.map_err(internal)?;
                }
                upload = Some((file, filename));
            }
            Some("file") => {
                return Err(ApiError::BadRequest("an upload holds one `file`".into()));
            }
            _ => {}
        }
    }
    if purpose.is_none() {
        return Err(missing("purpose"));
    }
    let (file, filename) = upload.ok_or_else(|| missing("file"))?;
    let object = b
        .commit_upload(file, filename, tenant)
        .await
        .map_err(refused)?;
    Ok(Json(object).into_response())
}

async fn list_files(
    State(s): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Reply {
    let (b, tenant, q, limit) = listing(&s, &headers, query, FILES_LIMIT)?;
    let (files, more) = b
        .files(tenant, q.purpose, q.after, limit)
        .await
        .map_err(internal)?;
    Ok(page(files, more, |f| &f.id))
}

async fn get_file(State(s): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Reply {
    let (b, tenant) = open(&s, &headers)?;
    let file = b.file(&id, tenant).await.map_err(internal)?;
    Ok(Json(file.ok_or_else(|| no_file(&id, None))?).into_response())
}

async fn delete_file(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Reply {
    let (b, tenant) = open(&s, &headers)?;
    match b.delete_file(&id, tenant).await.map_err(internal)? {
        Delete::Deleted => {
            Ok(Json(json!({ "id": id, "object": "file", "deleted": true })).into_response())
        }
        Delete::NotFound => Err(no_file(&id, None)),
        Delete::InUse(batch) => Err(ApiError::Conflict(format!(
            "The file {id} is the input of {batch}, which is not finished; cancel it or wait for it."
        ))),
    }
}

/// The file's bytes, streamed from disk.
async fn file_content(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Reply {
    let (b, tenant) = open(&s, &headers)?;
    let (file, len) = b
        .file_content(&id, tenant)
        .await
        .map_err(internal)?
        .ok_or_else(|| no_file(&id, None))?;
    let chunks = futures_util::stream::try_unfold(file, |mut f| async move {
        let mut buf = vec![0; 64 << 10];
        let n = f.read(&mut buf).await?;
        if n == 0 {
            return Ok::<_, std::io::Error>(None);
        }
        buf.truncate(n);
        Ok(Some((Bytes::from(buf), f)))
    });
    let headers = [
        (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
        (header::CONTENT_LENGTH, len.to_string()),
    ];
    Ok((headers, Body::from_stream(chunks)).into_response())
}

async fn create_batch(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Reply {
    let (b, tenant) = open(&s, &headers)?;
    let request: CreateBatch = serde_json::from_slice(&body).map_err(|e| {
        ApiError::BadRequest(format!("The body of POST /v1/batches is not valid: {e}"))
    })?;
    let input_file_id = request
        .input_file_id
        .ok_or_else(|| missing("input_file_id"))?;
    let endpoint = request.endpoint.ok_or_else(|| missing("endpoint"))?;
    let window = request
        .completion_window
        .ok_or_else(|| missing("completion_window"))?;
    let endpoint = Endpoint::from_url(&endpoint).ok_or_else(|| ApiError::InvalidParam {
        param: "endpoint",
        message: format!(
            "Invalid value: '{endpoint}'. Supported values are: '{}' and '{}'.",
            Endpoint::Chat.url(),
            Endpoint::Completions.url()
        ),
    })?;
    if window != COMPLETION_WINDOW {
        return Err(ApiError::InvalidParam {
            param: "completion_window",
            message: format!(
                "Invalid value: '{window}'. Supported values are: '{COMPLETION_WINDOW}'."
            ),
        });
    }
    let metadata = metadata(request.metadata)?;
    let file = b
        .file(&input_file_id, tenant.clone())
        .await
        .map_err(internal)?
        .ok_or_else(|| no_file(&input_file_id, Some("input_file_id")))?;
    if file.purpose != UPLOAD_PURPOSE {
        return Err(ApiError::InvalidParam {
            param: "input_file_id",
            message: format!(
                "The file {input_file_id} has purpose '{}'; a batch's input must have purpose '{UPLOAD_PURPOSE}'.",
                file.purpose
            ),
        });
    }
    let new = NewBatch {
        input_file_id,
        endpoint,
        metadata,
        tenant,
    };
    let batch = b.create(&s, new).await.map_err(refused)?;
    Ok(Json(batch).into_response())
}

async fn get_batch(State(s): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Reply {
    let (b, tenant) = open(&s, &headers)?;
    let batch = b.batch(&id, tenant).await.map_err(internal)?;
    Ok(Json(batch.ok_or_else(|| no_batch(&id))?).into_response())
}

async fn list_batches(
    State(s): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Reply {
    let (b, tenant, q, limit) = listing(&s, &headers, query, BATCHES_LIMIT)?;
    let (batches, more) = b.batches(tenant, q.after, limit).await.map_err(internal)?;
    Ok(page(batches, more, |b| &b.id))
}

async fn cancel_batch(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Reply {
    let (b, tenant) = open(&s, &headers)?;
    match b.cancel(&id, tenant).await.map_err(internal)? {
        Cancel::Cancelling(batch) => Ok(Json(batch).into_response()),
        Cancel::NotFound => Err(no_batch(&id)),
        Cancel::Finished(status) => Err(ApiError::Conflict(format!(
            "Cannot cancel a batch with status '{}'.",
            status.as_str()
        ))),
    }
}

/// The Batch API, and whose objects the request may see (`None`: everyone's, an open API).
fn open(s: &AppState, headers: &HeaderMap) -> Result<(Arc<Batches>, Option<String>), ApiError> {
    let tenant = s.inner.keys.authenticate(headers)?.map(|t| t.name.clone());
    let batches = s.batches().cloned().map_err(|why| ApiError::NotFound {
        param: None,
        message: format!("The Batch API is off on this server: {why}."),
    })?;
    Ok((batches, tenant))
}

/// OpenAI's list object.
/// A list request opened: the Batch API and the tenant, the query, and its page size
/// checked against `bounds`.
fn listing(
    s: &AppState,
    headers: &HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
    bounds: (usize, usize),
) -> Result<(Arc<Batches>, Option<String>, ListQuery, usize), ApiError> {
    let (b, tenant) = open(s, headers)?;
    let Query(q) = query.map_err(bad_query)?;
    let limit = limit(q.limit, bounds)?;
    Ok((b, tenant, q, limit))
}

fn page<T: Serialize>(data: Vec<T>, has_more: bool, id: impl Fn(&T) -> &String) -> Response {
    let first = data.first().map(&id).cloned();
    let last = data.last().map(&id).cloned();
    Json(json!({
        "object": "list",
        "data": data,
        "first_id": first,
        "last_id": last,
        "has_more": has_more,
    }))
    .into_response()
}

fn limit(given: Option<usize>, (max, default): (usize, usize)) -> Result<usize, ApiError> {
    match given {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::InvalidParam {
            param: "limit",
            message: format!("Invalid value: {n}. `limit` must be between 1 and {max}."),
        }),
    }
}

/// Metadata as OpenAI takes it: up to 16 string values, keys of up to 64 characters and
/// values of up to 512.
fn metadata(given: Option<Value>) -> Result<Option<Value>, ApiError> {
    let (pairs, key_len, value_len) = METADATA;
    let invalid = |message: String| ApiError::InvalidParam {
        param: "metadata",
        message,
    };
    match given {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => {
            if m.len() > pairs {
                return Err(invalid(format!(
                    "Invalid 'metadata': at most {pairs} pairs, got {}.",
                    m.len()
                )));
            }
            for (k, v) in &m {
                let fits = k.chars().count() <= key_len
                    && v.as_str().is_some_and(|v| v.chars().count() <= value_len);
                if !fits {
                    return Err(invalid(format!(
                        "Invalid 'metadata' at '{k}': keys are strings of up to {key_len} characters, values strings of up to {value_len}."
                    )));
                }
            }
            Ok(Some(Value::Object(m)))
        }
        Some(_) => Err(invalid(
            "Invalid 'metadata': expected an object of strings.".into(),
        )),
    }
}

fn missing(param: &'static str) -> ApiError {
    ApiError::InvalidParam {
        param,
        message: format!("Missing required parameter: '{param}'."),
    }
}

fn no_file(id: &str, param: Option<&'static str>) -> ApiError {
    ApiError::NotFound {
        param,
        message: format!("No such File object: {id}"),
    }
}

fn no_batch(id: &str) -> ApiError {
    ApiError::NotFound {
        param: None,
        message: format!("No batch found with id '{id}'."),
    }
}

fn too_large(max: u64) -> ApiError {
    ApiError::TooLarge(format!(
        "The file is over {max} bytes, the most a batch input may hold."
    ))
}

fn multipart_error(e: MultipartError) -> ApiError {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::TooLarge(format!("The upload is too large: {}", e.body_text()))
    } else {
        ApiError::BadRequest(format!(
            "The upload is not valid multipart: {}",
            e.body_text()
        ))
    }
}

fn bad_query(e: QueryRejection) -> ApiError {
    ApiError::BadRequest(e.body_text())
}

/// A bound reached is the client's to hear (429); any other failure is [`internal`].
fn refused(e: BatchError) -> ApiError {
    let code = match &e {
        BatchError::TooManyBatches { .. } => "too_many_batches",
        BatchError::QuotaExceeded { .. } => "storage_quota_exceeded",
        _ => return internal(e),
    };
    ApiError::Quota {
        message: e.to_string(),
        code,
    }
}

/// The cause stays in the server's log; the client is told where to look.
fn internal(e: BatchError) -> ApiError {
    tracing::error!("the Batch API failed: {}", with_causes(&e));
    ApiError::Internal("the Batch API failed; the server's log says why".into())
}
