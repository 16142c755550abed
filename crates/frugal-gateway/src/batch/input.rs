//! A batch input file in OpenAI's format, read and validated whole before any line runs.
//!
//! Each non-blank line is `{"custom_id", "method": "POST", "url", "body"}`. Problems are
//! collected, each naming its line, in the batch object's `errors` shape
//! (`{"object": "list", "data": [{"code", "message", "param", "line"}], "total"}`), so one run
//! of the validator shows what must be fixed: the first [`MAX_ERRORS`] of them, and how many
//! there are in all. The file is read a line at a time and its valid lines are dropped at
//! the first problem, so a hostile file of a million bad lines costs the validator as much
//! memory as its longest line, not as its size. A body is checked by the gateway's own parser
//! ([`Job::chat`], [`Job::completion`]): a line the endpoint would refuse fails the batch
//! before anything is spent.
//!
//! Error codes are OpenAI's where its Batch API reports them for the same fault
//! (`invalid_json_line`, `missing_required_parameter`, `invalid_url`,
//! `duplicate_custom_id`, `streaming_unsupported`, `invalid_request` for a body the endpoint
//! refuses with `param` as `body.<field>`, `empty_file`, `too_many_tasks`), or the codes its
//! API uses elsewhere for the same kind of fault (`invalid_type`, `invalid_value`).
//! `file_too_large` is ours: OpenAI reports that limit in a message only.

use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use axum::body::Bytes;
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::http::error::ApiError;
use crate::http::validate::{Job, Kind};

/// Requests a batch may hold at most (OpenAI's limit).
pub const MAX_LINES: usize = 50_000;
/// Bytes a batch input file may hold at most: OpenAI's "200 MB", which its error message
/// gives as 209715200 bytes.
pub const MAX_BYTES: u64 = 200 * 1024 * 1024;

/// Problems kept at most (OpenAI's batch object lists errors, not every one of a file of
/// a million bad lines: that list was 110 MB); [`Errors::total`] counts them all.
pub const MAX_ERRORS: usize = 100;
/// Problems listed at most in an error's text.
const SHOWN: usize = 20;

/// The endpoints a batch line may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Endpoint {
    #[serde(rename = "/v1/chat/completions")]
    Chat,
    #[serde(rename = "/v1/completions")]
    Completions,
}

impl Endpoint {
    pub fn url(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }

    pub fn from_url(url: &str) -> Option<Endpoint> {
        [Endpoint::Chat, Endpoint::Completions]
            .into_iter()
            .find(|e| e.url() == url)
    }

    pub fn kind(self) -> Kind {
        match self {
            Endpoint::Chat => Kind::Chat,
            Endpoint::Completions => Kind::Text,
        }
    }

    /// The body parsed as this endpoint parses a request.
    pub fn job(self, body: &Bytes) -> Result<Job, ApiError> {
        match self {
            Endpoint::Chat => Job::chat(body),
            Endpoint::Completions => Job::completion(body),
        }
    }
}

/// What a batch input may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_lines: usize,
    pub max_bytes: u64,
    /// The one endpoint every line must name (a batch created for an endpoint, as
    /// `POST /v1/batches` is); `None` lets each line name either.
    pub endpoint: Option<Endpoint>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_lines: MAX_LINES,
            max_bytes: MAX_BYTES,
            endpoint: None,
        }
    }
}

/// One request of the batch.
#[derive(Debug, Clone)]
pub struct Line {
    /// 1-based, counting blank lines, as an editor shows it.
    pub number: usize,
    pub custom_id: String,
    pub url: Endpoint,
    pub body: Value,
    /// The body as JSON, what [`Endpoint::job`] reads.
    pub bytes: Bytes,
}

/// A valid batch input.
#[derive(Debug, Clone)]
pub struct Input {
    pub lines: Vec<Line>,
    /// Hex SHA-256 of the file's bytes: the job's identity.
    pub sha256: String,
    pub size: u64,
}

/// One problem, as OpenAI's batch object lists it in `errors.data`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchError {
    pub code: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub line: Option<usize>,
}

/// The batch object's `errors`: the first [`MAX_ERRORS`] problems found, in line order,
/// and how many were found in all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Errors {
    pub object: &'static str,
    pub data: Vec<BatchError>,
    pub total: usize,
}

impl Errors {
    fn new(data: Vec<BatchError>) -> Errors {
        Errors {
            object: "list",
            total: data.len(),
            data,
        }
    }

    /// Counts `e`, keeping it while fewer than [`MAX_ERRORS`] are kept.
    fn push(&mut self, e: BatchError) {
        self.total += 1;
        if self.data.len() < MAX_ERRORS {
            self.data.push(e);
        }
    }
}

impl fmt::Display for Errors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in self.data.iter().take(SHOWN) {
            match e.line {
                Some(n) => writeln!(f, "  line {n}: {} ({})", e.message, e.code)?,
                None => writeln!(f, "  {} ({})", e.message, e.code)?,
            }
        }
        let listed = self.data.len().min(SHOWN);
        if self.total > listed {
            writeln!(f, "  ... and {} more", self.total - listed)?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot read the batch input {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the batch input {} has {} problem(s); nothing ran:\n{errors}", path.display(), errors.total)]
    Invalid { path: PathBuf, errors: Errors },
}

/// Reads and validates the batch input at `path`, a line at a time.
pub fn read(path: &Path, limits: &Limits) -> Result<Input, InputError> {
    let read_err = |source| InputError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    // An oversized file is refused before it is read.
    let size = file.metadata().map_err(read_err)?.len();
    let invalid = |errors| InputError::Invalid {
        path: path.to_owned(),
        errors,
    };
    if size > limits.max_bytes {
        return Err(invalid(Errors::new(vec![too_large(size, limits)])));
    }
    match scan(BufReader::new(file), limits) {
        Ok(r) => r.map_err(invalid),
        Err(source) => Err(read_err(source)),
    }
}

/// Validates a batch input already in memory.
pub fn parse(data: &[u8], limits: &Limits) -> Result<Input, Errors> {
    // Reading from memory cannot fail.
    scan(data, limits).unwrap_or_else(|e| Err(Errors::new(vec![unreadable(&e)])))
}

/// Validates the lines `reader` gives; the outer error is one reading it.
fn scan(mut reader: impl BufRead, limits: &Limits) -> std::io::Result<Result<Input, Errors>> {
    let mut errors = Errors::new(Vec::new());
    let mut lines = Vec::new();
    // custom_ids by their hash: a line's id may be as long as the file.
    let mut seen: HashMap<[u8; 32], usize> = HashMap::new();
    let mut requests = 0;
    let mut hash = Sha256::new();
    let (mut size, mut number) = (0u64, 0usize);
    let mut raw = Vec::new();
    loop {
        raw.clear();
        let n = reader.read_until(b'\n', &mut raw)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        if size > limits.max_bytes {
            return Ok(Err(Errors::new(vec![too_large(size, limits)])));
        }
        hash.update(&raw);
        number += 1;
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        requests += 1;
        if requests == limits.max_lines + 1 {
            errors.push(BatchError {
                code: "too_many_tasks",
                message: format!(
                    "The input file has more than {} requests; split it into batches of at most {}.",
                    limits.max_lines, limits.max_lines
                ),
                param: None,
                line: Some(number),
            });
        }
        let request = check_line(&raw, number, limits, &mut seen, &mut errors);
        // A batch with a problem runs nothing: its lines need not be kept.
        if errors.total > 0 {
            lines = Vec::new();
        } else if let Some(line) = request {
            lines.push(line);
        }
    }
    if requests == 0 {
        errors.push(BatchError {
            code: "empty_file",
            message: "The input file has no requests.".into(),
            param: None,
            line: None,
        });
    }
    if errors.total > 0 {
        return Ok(Err(errors));
    }
    let sha256 = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(Ok(Input {
        lines,
        sha256,
        size,
    }))
}

/// Checks line `number`; its request when it is right. Each problem goes to `errors`.
fn check_line(
    raw: &[u8],
    number: usize,
    limits: &Limits,
    seen: &mut HashMap<[u8; 32], usize>,
    errors: &mut Errors,
) -> Option<Line> {
    let mut problem = |code, message: String, param: Option<&str>| {
        errors.push(BatchError {
            code,
            message,
            param: param.map(str::to_owned),
            line: Some(number),
        })
    };
    let Ok(value) = serde_json::from_slice::<Value>(raw) else {
        problem(
            "invalid_json_line",
            "This line is not parseable as valid JSON.".into(),
            None,
        );
        return None;
    };
    let Value::Object(fields) = value else {
        problem(
            "invalid_request",
            format!(
                "Each line must be a JSON object, not {}.",
                type_name(&value)
            ),
            None,
        );
        return None;
    };
    let (custom_id, request) = check_fields(fields, limits.endpoint, &mut problem);
    // A duplicate is named even when its line has other problems.
    let custom_id = custom_id?;
    let key: [u8; 32] = Sha256::digest(custom_id.as_bytes()).into();
    if let Some(first) = seen.get(&key) {
        problem(
            "duplicate_custom_id",
            format!(
                "The custom_id '{custom_id}' is a duplicate of line {first}'s; the custom_id must be unique for each request in a batch."
            ),
            Some("custom_id"),
        );
        return None;
    }
    // Past the most lines a batch holds, the batch has failed: the ids need not be kept.
    if seen.len() < limits.max_lines {
        seen.insert(key, number);
    }
    let Request { url, body, bytes } = request?;
    Some(Line {
        number,
        custom_id,
        url,
        body,
        bytes,
    })
}

fn unreadable(e: &std::io::Error) -> BatchError {
    BatchError {
        code: "file_not_found",
        message: format!("The input file cannot be read: {e}"),
        param: None,
        line: None,
    }
}

/// A line's request, when every field is right.
struct Request {
    url: Endpoint,
    body: Value,
    bytes: Bytes,
}

/// A line's fields: its custom_id when it is a string, and the request when every field is
/// right; each problem goes to `problem`.
fn check_fields(
    mut fields: Map<String, Value>,
    endpoint: Option<Endpoint>,
    problem: &mut impl FnMut(&'static str, String, Option<&str>),
) -> (Option<String>, Option<Request>) {
    let mut take = |name: &str, expected: &str, ok: fn(&Value) -> bool| match fields.remove(name) {
        None => {
            problem(
                "missing_required_parameter",
                format!("Missing required parameter: '{name}'."),
                Some(name),
            );
            None
        }
        Some(v) if !ok(&v) => {
            problem(
                "invalid_type",
                format!(
                    "Invalid type for '{name}': expected {expected}, but got {} instead.",
                    type_name(&v)
                ),
                Some(name),
            );
            None
        }
        Some(v) => Some(v),
    };
    let custom_id = take("custom_id", "a string", Value::is_string);
    let method = take("method", "a string", Value::is_string);
    let url = take("url", "a string", Value::is_string);
    let body = take("body", "an object", Value::is_object);
    let custom_id = custom_id.and_then(|v| v.as_str().map(str::to_owned));

    let method_ok = match method.as_ref().and_then(Value::as_str) {
        Some("POST") => true,
        Some(other) => {
            problem(
                "invalid_value",
                format!("Invalid value: '{other}'. Supported values are: 'POST'."),
                Some("method"),
            );
            false
        }
        None => false,
    };
    let url = url.as_ref().and_then(Value::as_str).and_then(|url| {
        let Some(found) = Endpoint::from_url(url) else {
            problem(
                "invalid_url",
                format!(
                    "Invalid value: '{url}'. Supported values are: '{}' and '{}'.",
                    Endpoint::Chat.url(),
                    Endpoint::Completions.url()
                ),
                Some("url"),
            );
            return None;
        };
        if endpoint.is_some_and(|e| e != found) {
            problem(
                "invalid_url",
                "The URL provided for this request does not match the batch endpoint.".into(),
                Some("url"),
            );
            return None;
        }
        Some(found)
    });
    let (Some(url), Some(body)) = (url, body) else {
        return (custom_id, None);
    };
    let bytes = Bytes::from(body.to_string());
    match url.job(&bytes) {
        Err(e) => {
            let param = match &e {
                ApiError::InvalidParam { param, .. } => format!("body.{param}"),
                _ => "body".to_owned(),
            };
            problem("invalid_request", e.to_string(), Some(&param));
            (custom_id, None)
        }
        // Each line's answer is one JSON object in the output file.
        Ok(job) if job.common.stream => {
            problem(
                "streaming_unsupported",
                "Streaming is not supported in the Batch API.".into(),
                Some("body.stream"),
            );
            (custom_id, None)
        }
        Ok(_) if !method_ok => (custom_id, None),
        Ok(_) => (custom_id, Some(Request { url, body, bytes })),
    }
}

fn too_large(size: u64, limits: &Limits) -> BatchError {
    BatchError {
        code: "file_too_large",
        message: format!(
            "The input file is {size} bytes, over the maximum of {} bytes.",
            limits.max_bytes
        ),
        param: None,
        line: None,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn chat(id: &str) -> String {
        format!(
            r#"{{"custom_id": "{id}", "method": "POST", "url": "/v1/chat/completions", "body": {{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 5}}}}"#
        )
    }

    fn errors(text: &str) -> Vec<BatchError> {
        parse(text.as_bytes(), &Limits::default()).unwrap_err().data
    }

    /// `(code, param, line)` of each problem.
    fn codes(text: &str) -> Vec<(&'static str, Option<String>, Option<usize>)> {
        errors(text)
            .into_iter()
            .map(|e| (e.code, e.param, e.line))
            .collect()
    }

    #[test]
    fn a_valid_file_reads_into_lines_with_its_hash() {
        let text = format!(
            "{}\n\n{}\n",
            chat("a"),
            r#"{"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": "once", "max_tokens": 3}}"#
        );
        let input = parse(text.as_bytes(), &Limits::default()).unwrap();
        let got: Vec<_> = input
            .lines
            .iter()
            .map(|l| (l.number, l.custom_id.as_str(), l.url))
            .collect();
        assert_eq!(
            got,
            [(1, "a", Endpoint::Chat), (3, "b", Endpoint::Completions)]
        );
        assert_eq!(input.lines[1].body["prompt"], "once");
        let job = input.lines[1].url.job(&input.lines[1].bytes).unwrap();
        assert_eq!(job.max_tokens(), Some(3));
        assert_eq!(input.size, text.len() as u64);
        assert_eq!(input.sha256.len(), 64);
        let again = parse(text.as_bytes(), &Limits::default()).unwrap();
        assert_eq!(again.sha256, input.sha256);
        let other = parse(chat("a").as_bytes(), &Limits::default()).unwrap();
        assert_ne!(other.sha256, input.sha256);
    }

    #[test]
    fn a_line_that_is_not_json_is_named() {
        let text = format!("{}\n{{\"custom_id\": \n", chat("a"));
        assert_eq!(codes(&text), [("invalid_json_line", None, Some(2))]);
        assert_eq!(
            errors(&text)[0].message,
            "This line is not parseable as valid JSON."
        );
    }

    #[test]
    fn a_line_that_is_not_an_object_is_named() {
        assert_eq!(
            codes("[1, 2]\n\"text\"\n"),
            [
                ("invalid_request", None, Some(1)),
                ("invalid_request", None, Some(2))
            ]
        );
    }

    #[test]
    fn missing_fields_are_each_named() {
        let text = [
            r#"{"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}"#,
            r#"{"custom_id": "b", "url": "/v1/completions", "body": {"prompt": "x"}}"#,
            r#"{"custom_id": "c", "method": "POST", "body": {"prompt": "x"}}"#,
            r#"{"custom_id": "d", "method": "POST", "url": "/v1/completions"}"#,
        ]
        .join("\n");
        let missing = |param: &str, line| {
            (
                "missing_required_parameter",
                Some(param.to_owned()),
                Some(line),
            )
        };
        assert_eq!(
            codes(&text),
            [
                missing("custom_id", 1),
                missing("method", 2),
                missing("url", 3),
                missing("body", 4)
            ]
        );
        assert_eq!(
            errors(&text)[0].message,
            "Missing required parameter: 'custom_id'."
        );
    }

    #[test]
    fn wrong_typed_fields_are_each_named() {
        let text = r#"{"custom_id": 7, "method": ["POST"], "url": null, "body": "hi"}"#;
        let wrong = |param: &str| ("invalid_type", Some(param.to_owned()), Some(1));
        assert_eq!(
            codes(text),
            [
                wrong("custom_id"),
                wrong("method"),
                wrong("url"),
                wrong("body")
            ]
        );
        assert_eq!(
            errors(text)[3].message,
            "Invalid type for 'body': expected an object, but got a string instead."
        );
    }

    #[test]
    fn a_method_other_than_post_is_refused() {
        let text = chat("a").replace("\"POST\"", "\"GET\"");
        assert_eq!(
            codes(&text),
            [("invalid_value", Some("method".into()), Some(1))]
        );
    }

    #[test]
    fn an_unsupported_url_is_refused() {
        let text = chat("a").replace("/v1/chat/completions", "/v1/embeddings");
        assert_eq!(codes(&text), [("invalid_url", Some("url".into()), Some(1))]);
        assert!(errors(&text)[0].message.contains("'/v1/embeddings'"));
    }

    #[test]
    fn a_url_other_than_the_batch_endpoint_is_refused() {
        let limits = Limits {
            endpoint: Some(Endpoint::Completions),
            ..Limits::default()
        };
        let e = parse(chat("a").as_bytes(), &limits).unwrap_err().data;
        assert_eq!(
            (e[0].code, e[0].line),
            ("invalid_url", Some(1)),
            "{:?}",
            e[0]
        );
        assert!(e[0].message.contains("does not match the batch endpoint"));
    }

    #[test]
    fn a_duplicate_custom_id_names_the_lines_of_both() {
        let text = [chat("a"), chat("b"), chat("a"), chat("a")].join("\n");
        let e = errors(&text);
        assert_eq!(
            codes(&text),
            [
                ("duplicate_custom_id", Some("custom_id".into()), Some(3)),
                ("duplicate_custom_id", Some("custom_id".into()), Some(4))
            ]
        );
        assert!(e[0].message.contains("'a'"), "{}", e[0].message);
        assert!(e[0].message.contains("line 1"), "{}", e[0].message);
        assert!(e[1].message.contains("line 1"), "{}", e[1].message);
    }

    #[test]
    fn a_duplicate_is_named_even_on_a_line_with_other_problems() {
        let text = format!("{}\n{}", chat("a"), chat("a").replace("POST", "PUT"));
        let got: Vec<_> = codes(&text).into_iter().map(|c| c.0).collect();
        assert_eq!(got, ["invalid_value", "duplicate_custom_id"]);
    }

    #[test]
    fn a_body_the_endpoint_refuses_is_named_with_its_parser_message() {
        let text = [
            chat("a").replace("\"max_tokens\": 5", "\"max_tokens\": 0"),
            r#"{"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": {"prompt": "x"}}"#.into(),
            chat("c").replace("\"max_tokens\": 5", "\"stream\": true"),
        ]
        .join("\n");
        let e = errors(&text);
        assert_eq!(
            codes(&text),
            [
                ("invalid_request", Some("body.max_tokens".into()), Some(1)),
                ("invalid_request", Some("body".into()), Some(2)),
                ("streaming_unsupported", Some("body.stream".into()), Some(3)),
            ]
        );
        assert_eq!(e[0].message, "max_tokens must be at least 1, got 0");
        assert!(e[1].message.contains("messages"), "{}", e[1].message);
    }

    #[test]
    fn every_problem_is_collected_not_only_the_first() {
        let text = [
            "nope".to_owned(),
            chat("a"),
            r#"{"custom_id": "b"}"#.into(),
            chat("a"),
        ]
        .join("\n");
        let lines: Vec<_> = codes(&text).into_iter().map(|c| c.2).collect();
        assert_eq!(
            lines,
            [Some(1), Some(3), Some(3), Some(3), Some(4)],
            "{text}"
        );
    }

    #[test]
    fn too_many_lines_is_refused_at_the_first_line_over() {
        let limits = Limits {
            max_lines: 3,
            ..Limits::default()
        };
        let text: Vec<String> = (0..5).map(|i| chat(&i.to_string())).collect();
        let e = parse(text[..3].join("\n").as_bytes(), &limits);
        assert!(e.is_ok());
        let e = parse(text.join("\n").as_bytes(), &limits).unwrap_err().data;
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].code, e[0].line), ("too_many_tasks", Some(4)));
        assert_eq!(Limits::default().max_lines, 50_000);
    }

    #[test]
    fn a_file_over_the_size_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(&path, chat("a")).unwrap();
        let limits = Limits {
            max_bytes: 10,
            ..Limits::default()
        };
        let Err(InputError::Invalid { errors, .. }) = read(&path, &limits) else {
            panic!("a file over the limit was read");
        };
        assert_eq!(errors.data[0].code, "file_too_large");
        assert_eq!(errors.data[0].line, None);
        assert_eq!(Limits::default().max_bytes, 209_715_200);
        assert!(read(&path, &Limits::default()).is_ok());
    }

    #[test]
    fn an_empty_file_is_refused() {
        assert_eq!(codes("\n  \n"), [("empty_file", None, None)]);
    }

    #[test]
    fn a_missing_file_is_a_read_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = read(&dir.path().join("nope.jsonl"), &Limits::default()).unwrap_err();
        assert!(matches!(err, InputError::Read { .. }), "{err}");
    }

    #[test]
    fn errors_serialize_as_openai_lists_them() {
        let e = parse(b"{\n", &Limits::default()).unwrap_err();
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"object": "list", "data": [{
                "code": "invalid_json_line",
                "message": "This line is not parseable as valid JSON.",
                "param": null,
                "line": 1
            }], "total": 1})
        );
        let text = (0..30).map(|_| "x").collect::<Vec<_>>().join("\n");
        let shown = parse(text.as_bytes(), &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(shown.starts_with("  line 1: This line"), "{shown}");
        assert!(shown.ends_with("... and 10 more\n"), "{shown}");
    }

    /// Issue 31, item 2: a file of a million bad lines kept every error (110 MB of them).
    #[test]
    fn errors_past_the_cap_are_counted_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        let text = format!("{}\n{}", chat("a"), "x\n".repeat(MAX_ERRORS * 10));
        std::fs::write(&path, &text).unwrap();
        let Err(InputError::Invalid { errors, .. }) = read(&path, &Limits::default()) else {
            panic!("a file of bad lines was read");
        };
        assert_eq!(errors.data.len(), MAX_ERRORS);
        assert_eq!(errors.total, MAX_ERRORS * 10);
        assert_eq!(errors.data[0].line, Some(2));
        assert_eq!(errors.data[MAX_ERRORS - 1].line, Some(MAX_ERRORS + 1));
        let shown = errors.to_string();
        assert!(
            shown.ends_with(&format!("... and {} more\n", MAX_ERRORS * 10 - 20)),
            "{shown}"
        );
    }

    #[test]
    fn a_file_of_thousands_of_lines_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        let text: String = (0..5_000).map(|i| chat(&format!("r{i}")) + "\n").collect();
        std::fs::write(&path, &text).unwrap();
        let input = read(&path, &Limits::default()).unwrap();
        assert_eq!(input.lines.len(), 5_000);
        assert_eq!(input.lines[4_999].number, 5_000);
    }
}
