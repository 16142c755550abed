//! The HTTP the sources share: a client that never goes through a proxy, with short
//! limits, and errors that name the URL and quote the answer.

use std::fmt;
use std::time::Duration;

use reqwest::header::HeaderMap;

use super::{CONNECT_TIMEOUT, Cloud, DEFAULT_TIMEOUT, NoticeError};

/// How much of a response body an error message quotes.
const BODY_EXCERPT: usize = 200;

#[derive(Debug, Clone)]
pub(crate) struct Http {
    pub(crate) client: reqwest::Client,
    pub(crate) timeout: Duration,
}

pub(crate) struct Reply {
    pub(crate) status: u16,
    headers: HeaderMap,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn status_error(&self, method: &'static str, url: &str) -> NoticeError {
        NoticeError::Status {
            method,
            url: url.to_string(),
            status: self.status,
            body: excerpt(&self.body),
        }
    }

    pub(crate) fn parse_error(&self, url: &str, reason: impl fmt::Display) -> NoticeError {
        NoticeError::Parse {
            url: url.to_string(),
            reason: reason.to_string(),
            body: excerpt(&self.body),
        }
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Http {
    pub(crate) fn new(cloud: Cloud) -> Result<Self, NoticeError> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(DEFAULT_TIMEOUT)
            .build()
            .map_err(|e| NoticeError::Client {
                cloud,
                reason: error_chain(&e),
            })?;
        Ok(Self {
            client,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Sends `req` with `timeout` as its whole-request limit and reads the body.
    pub(crate) async fn fetch(
        &self,
        method: &'static str,
        url: &str,
        req: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Reply, NoticeError> {
        let request_error = |e: reqwest::Error| {
            let what = if e.is_timeout() {
                format!("timed out after {timeout:?}")
            } else if e.is_connect() {
                "cannot connect".to_string()
            } else {
                "request failed".to_string()
            };
            NoticeError::Request {
                method,
                url: url.to_string(),
                reason: format!("{what}: {}", error_chain(&e)),
            }
        };
        let resp = req.timeout(timeout).send().await.map_err(request_error)?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.text().await.map_err(request_error)?;
        Ok(Reply {
            status,
            headers,
            body,
        })
    }
}

/// The error's sources joined with `": "` (reqwest's own message only repeats
/// the URL; the cause, e.g. "Connection refused", is further down the chain).
fn error_chain(err: &reqwest::Error) -> String {
    let mut parts = Vec::new();
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        parts.push(e.to_string());
        source = e.source();
    }
    if parts.is_empty() {
        err.to_string()
    } else {
        parts.join(": ")
    }
}

pub(crate) fn excerpt(body: &str) -> String {
    let t = body.trim();
    if t.len() <= BODY_EXCERPT {
        return t.to_string();
    }
    let mut end = BODY_EXCERPT;
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &t[..end])
}

/// Validates a base URL (`http://host[:port][/prefix]`) and strips trailing `/`.
pub(crate) fn normalize_base(base: &str) -> Result<String, NoticeError> {
    let trimmed = base.trim().trim_end_matches('/');
    let bad = |reason: String| NoticeError::BadUrl {
        url: base.to_string(),
        reason,
    };
    let url = reqwest::Url::parse(trimmed).map_err(|e| bad(e.to_string()))?;
    if url.scheme() != "http" {
        return Err(bad(format!(
            "scheme {:?}: metadata endpoints are plain http",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host".to_string()));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("a base URL takes no query or fragment".to_string()));
    }
    Ok(trimmed.to_string())
}

pub(crate) fn parse_url(url: &str) -> Result<reqwest::Url, NoticeError> {
    reqwest::Url::parse(url).map_err(|e| NoticeError::BadUrl {
        url: url.to_string(),
        reason: e.to_string(),
    })
}
