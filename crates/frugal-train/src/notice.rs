//! Preemption notices from the clouds' instance metadata services.
//!
//! A training supervisor on a spot (AWS), preemptible/spot (GCP) or spot
//! (Azure) VM polls one [`NoticeSource`] to learn that the VM is about to be
//! taken away, checkpoints, and, on Azure, [acknowledges](NoticeSource::acknowledge)
//! the event so the platform may proceed early.
//!
//! Each source speaks its cloud's real protocol against a configurable base
//! URL (the real link-local endpoints by default, a mock server in tests):
//!
//! * [`Aws`]: IMDSv2 — a session token from `PUT /latest/api/token`, then
//!   `GET /latest/meta-data/spot/instance-action` (interruption) and
//!   `GET /latest/meta-data/events/recommendations/rebalance` (advisory).
//! * [`Gcp`]: `GET /computeMetadata/v1/instance/preempted`, long-polled with
//!   `wait_for_change`/`last_etag` so a preemption is seen as soon as it is set.
//! * [`Azure`]: Scheduled Events, `GET /metadata/scheduledevents`, and the
//!   `StartRequests` POST to acknowledge. The document lists events for every VM of the
//!   availability set or scale set, so only those naming this VM (its name read once from
//!   `GET /metadata/instance/compute/name`) are acted on and acknowledged.
//!
//! [`detect`] probes all three concurrently and returns the source of the
//! cloud that answers. Metadata requests never go through a proxy.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime};

use reqwest::header::HeaderMap;
use serde::Deserialize;
use tracing::{debug, info, warn};

/// The real AWS instance metadata endpoint (IMDS).
pub const AWS_BASE: &str = "http://169.254.169.254";
/// The real GCP metadata server.
pub const GCP_BASE: &str = "http://metadata.google.internal";
/// The real Azure instance metadata endpoint (IMDS, Scheduled Events).
pub const AZURE_BASE: &str = "http://169.254.169.254";

/// Default limit on one metadata request (connect, send, read the body).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Limit on establishing the TCP connection to a metadata endpoint.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// TTL asked for IMDSv2 session tokens (the maximum AWS allows, 6 hours).
pub const AWS_TOKEN_TTL: Duration = Duration::from_secs(21_600);
/// Notice AWS gives between an interruption notice and the interruption.
pub const AWS_INTERRUPTION_NOTICE: Duration = Duration::from_secs(120);
/// Time GCP gives a preempted VM between the preemption and the hard stop.
pub const GCP_PREEMPTION_GRACE: Duration = Duration::from_secs(30);
/// Default long-poll wait of a [`Gcp`] source (used by [`detect`]).
pub const GCP_DEFAULT_WAIT: Duration = Duration::from_secs(5);
/// Scheduled Events API version spoken by [`Azure`].
pub const AZURE_API_VERSION: &str = "2020-07-01";
/// Instance metadata API version [`Azure`] reads the VM's name with.
pub const AZURE_IMDS_API_VERSION: &str = "2021-02-01";

const AWS_TOKEN_PATH: &str = "/latest/api/token";
const AWS_TOKEN_TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";
const AWS_TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
const AWS_INSTANCE_ACTION_PATH: &str = "/latest/meta-data/spot/instance-action";
const AWS_REBALANCE_PATH: &str = "/latest/meta-data/events/recommendations/rebalance";
const GCP_FLAVOR_HEADER: &str = "Metadata-Flavor";
const GCP_FLAVOR: &str = "Google";
const GCP_ROOT_PATH: &str = "/computeMetadata/v1/";
const GCP_PREEMPTED_PATH: &str = "/computeMetadata/v1/instance/preempted";
const AZURE_HEADER: &str = "Metadata";
const AZURE_EVENTS_PATH: &str = "/metadata/scheduledevents";
const AZURE_NAME_PATH: &str = "/metadata/instance/compute/name";
/// How much of a response body an error message quotes.
const BODY_EXCERPT: usize = 200;

/// A cloud whose metadata service can announce a preemption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cloud {
    Aws,
    Gcp,
    Azure,
}

impl fmt::Display for Cloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cloud::Aws => "aws",
            Cloud::Gcp => "gcp",
            Cloud::Azure => "azure",
        })
    }
}

impl FromStr for Cloud {
    type Err = NoticeError;

    /// Parses `aws`, `gcp` or `azure`, ignoring ASCII case and surrounding space.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("aws") {
            Ok(Cloud::Aws)
        } else if t.eq_ignore_ascii_case("gcp") {
            Ok(Cloud::Gcp)
        } else if t.eq_ignore_ascii_case("azure") {
            Ok(Cloud::Azure)
        } else {
            Err(NoticeError::UnknownCloud(s.to_string()))
        }
    }
}

/// What the platform is about to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The VM goes away (terminated, stopped, hibernated, preempted) at the
    /// deadline: checkpoint and stop before it.
    Terminate,
    /// Advisory (AWS rebalance recommendation): the VM is at elevated risk of
    /// interruption. Checkpoint, keep running.
    Rebalance,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Terminate => "terminate",
            Action::Rebalance => "rebalance",
        })
    }
}

/// A preemption notice read from a metadata service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub cloud: Cloud,
    pub action: Action,
    /// When the platform acts. For [`Action::Rebalance`], which has no
    /// platform deadline, it is detection time + [`AWS_INTERRUPTION_NOTICE`]:
    /// the earliest the VM could be gone were an interruption notice to
    /// follow at once.
    pub deadline: SystemTime,
    /// Human-readable summary of what the platform said.
    pub detail: String,
    /// Azure Scheduled Events `EventId` (what [`NoticeSource::acknowledge`]
    /// sends back); `None` for the other clouds.
    pub event_id: Option<String>,
}

impl Notice {
    /// Time from now until the deadline (zero once it has passed).
    pub fn time_left(&self) -> Duration {
        self.deadline
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
    }
}

/// What went wrong talking to a metadata service. Messages name the URL.
#[derive(Debug, thiserror::Error)]
pub enum NoticeError {
    #[error("metadata base URL {url:?} is not usable: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("cannot build the HTTP client for {cloud} metadata: {reason}")]
    Client { cloud: Cloud, reason: String },
    #[error("{method} {url}: {reason}")]
    Request {
        method: &'static str,
        url: String,
        reason: String,
    },
    #[error("{method} {url}: unexpected HTTP {status}; body: {body:?}")]
    Status {
        method: &'static str,
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url}: cannot parse the answer: {reason}; body: {body:?}")]
    Parse {
        url: String,
        reason: String,
        body: String,
    },
    #[error("{url}: not a {cloud} metadata server: {reason}")]
    NotMetadata {
        cloud: Cloud,
        url: String,
        reason: String,
    },
    #[error("unknown cloud {0:?} (expected aws, gcp or azure)")]
    UnknownCloud(String),
}

/// A cloud's preemption notices, polled by the supervisor.
pub trait NoticeSource: Send {
    fn cloud(&self) -> Cloud;

    /// One poll: `Ok(None)` while there is no notice. Returns within about the
    /// source's poll wait (GCP long-polls; AWS and Azure answer at once).
    /// While a notice stands, every call returns it again.
    fn check(&mut self) -> impl Future<Output = Result<Option<Notice>, NoticeError>> + Send;

    /// Tell the platform we are ready (Azure: `StartRequests` POST, once per
    /// event); a no-op elsewhere.
    fn acknowledge(
        &mut self,
        notice: &Notice,
    ) -> impl Future<Output = Result<(), NoticeError>> + Send;
}

// ---------------------------------------------------------------------------
// HTTP plumbing shared by the sources.

#[derive(Debug, Clone)]
struct Http {
    client: reqwest::Client,
    timeout: Duration,
}

pub(crate) struct Reply {
    status: u16,
    headers: HeaderMap,
    pub(crate) body: String,
}

impl Reply {
    fn status_error(&self, method: &'static str, url: &str) -> NoticeError {
        NoticeError::Status {
            method,
            url: url.to_string(),
            status: self.status,
            body: excerpt(&self.body),
        }
    }

    fn parse_error(&self, url: &str, reason: impl fmt::Display) -> NoticeError {
        NoticeError::Parse {
            url: url.to_string(),
            reason: reason.to_string(),
            body: excerpt(&self.body),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Http {
    fn new(cloud: Cloud) -> Result<Self, NoticeError> {
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
    async fn fetch(
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

fn excerpt(body: &str) -> String {
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
fn normalize_base(base: &str) -> Result<String, NoticeError> {
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

fn parse_url(url: &str) -> Result<reqwest::Url, NoticeError> {
    reqwest::Url::parse(url).map_err(|e| NoticeError::BadUrl {
        url: url.to_string(),
        reason: e.to_string(),
    })
}

// ---------------------------------------------------------------------------
// AWS

/// AWS EC2 spot interruption notices and rebalance recommendations (IMDSv2).
pub struct Aws {
    http: Http,
    base: String,
    token_ttl: Duration,
    token: Option<AwsToken>,
}

struct AwsToken {
    value: String,
    refresh_at: Instant,
}

impl fmt::Debug for Aws {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The session token stays out of logs.
        f.debug_struct("Aws")
            .field("base", &self.base)
            .field("timeout", &self.http.timeout)
            .field("token_ttl", &self.token_ttl)
            .field("has_token", &self.token.is_some())
            .finish()
    }
}

#[derive(Deserialize)]
struct AwsInstanceAction {
    action: String,
    time: String,
}

#[derive(Deserialize)]
struct AwsRebalance {
    #[serde(rename = "noticeTime")]
    notice_time: String,
}

impl Aws {
    /// A source for the IMDS at `base_url` (normally [`AWS_BASE`]).
    pub fn new(base_url: &str) -> Result<Self, NoticeError> {
        Ok(Self {
            http: Http::new(Cloud::Aws)?,
            base: normalize_base(base_url)?,
            token_ttl: AWS_TOKEN_TTL,
            token: None,
        })
    }

    /// Per-request limit (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.http.timeout = timeout;
        self
    }

    /// TTL asked for session tokens, whole seconds in 1..=21600 (default
    /// [`AWS_TOKEN_TTL`]). Tokens are re-fetched a quarter of the TTL (at most
    /// a minute) before they expire, and at once on a 401.
    pub fn with_token_ttl(mut self, ttl: Duration) -> Self {
        self.token_ttl = Duration::from_secs(ttl.as_secs().clamp(1, AWS_TOKEN_TTL.as_secs()));
        self.token = None;
        self
    }

    /// A valid session token, fetching a new one when none is held or it is
    /// about to expire.
    async fn token(&mut self) -> Result<String, NoticeError> {
        if let Some(t) = &self.token
            && Instant::now() < t.refresh_at
        {
            return Ok(t.value.clone());
        }
        let url = format!("{}{AWS_TOKEN_PATH}", self.base);
        let fetched = Instant::now();
        let req = self
            .http
            .client
            .put(&url)
            .header(AWS_TOKEN_TTL_HEADER, self.token_ttl.as_secs().to_string());
        let reply = self.http.fetch("PUT", &url, req, self.http.timeout).await?;
        if reply.status != 200 {
            return Err(reply.status_error("PUT", &url));
        }
        let value = reply.body.trim().to_string();
        if value.is_empty() {
            return Err(reply.parse_error(&url, "empty token"));
        }
        let margin = (self.token_ttl / 4).min(Duration::from_secs(60));
        debug!(url = %url, ttl = ?self.token_ttl, "fetched an IMDSv2 session token");
        self.token = Some(AwsToken {
            value: value.clone(),
            refresh_at: fetched + self.token_ttl - margin,
        });
        Ok(value)
    }

    /// GETs `path` with the session token: the body on 200, `None` on 404.
    /// A 401 (token expired or revoked) drops the token and retries once.
    pub(crate) async fn get(
        &mut self,
        path: &str,
    ) -> Result<(String, Option<String>), NoticeError> {
        let url = format!("{}{path}", self.base);
        let mut retried = false;
        loop {
            let token = self.token().await?;
            let req = self.http.client.get(&url).header(AWS_TOKEN_HEADER, token);
            let reply = self.http.fetch("GET", &url, req, self.http.timeout).await?;
            match reply.status {
                200 => return Ok((url, Some(reply.body))),
                404 => return Ok((url, None)),
                401 if !retried => {
                    debug!(url = %url, "IMDS answered 401; re-fetching the session token");
                    self.token = None;
                    retried = true;
                }
                _ => return Err(reply.status_error("GET", &url)),
            }
        }
    }

    /// GETs `path`: `None` on a 404, else its JSON body as `T` with the RFC 3339 time that
    /// `time` picks from it (named, for the error).
    async fn get_timed<T: serde::de::DeserializeOwned>(
        &mut self,
        path: &str,
        time: impl Fn(&T) -> (&'static str, &str),
    ) -> Result<Option<(String, T, chrono::DateTime<chrono::FixedOffset>)>, NoticeError> {
        let (url, Some(body)) = self.get(path).await? else {
            return Ok(None);
        };
        let parse_error = |reason: String| NoticeError::Parse {
            url: url.clone(),
            reason,
            body: excerpt(&body),
        };
        let value: T = serde_json::from_str(&body).map_err(|e| parse_error(e.to_string()))?;
        let (field, text) = time(&value);
        let at = chrono::DateTime::parse_from_rfc3339(text.trim())
            .map_err(|e| parse_error(format!("{field} {text:?}: {e}")))?;
        Ok(Some((url, value, at)))
    }

    async fn instance_action(&mut self) -> Result<Option<Notice>, NoticeError> {
        let Some((url, ia, time)) = self
            .get_timed(AWS_INSTANCE_ACTION_PATH, |ia: &AwsInstanceAction| {
                ("time", ia.time.as_str())
            })
            .await?
        else {
            return Ok(None);
        };
        if !["terminate", "stop", "hibernate"]
            .iter()
            .any(|a| ia.action.eq_ignore_ascii_case(a))
        {
            // Still an interruption notice; treat it as one.
            warn!(url = %url, action = %ia.action, "unknown spot instance-action");
        }
        Ok(Some(Notice {
            cloud: Cloud::Aws,
            action: Action::Terminate,
            deadline: time.into(),
            detail: format!("spot instance-action: {} at {}", ia.action, ia.time),
            event_id: None,
        }))
    }

    async fn rebalance(&mut self) -> Result<Option<Notice>, NoticeError> {
        let Some((_, rb, _)) = self
            .get_timed(AWS_REBALANCE_PATH, |rb: &AwsRebalance| {
                ("noticeTime", rb.notice_time.as_str())
            })
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(Notice {
            cloud: Cloud::Aws,
            action: Action::Rebalance,
            deadline: SystemTime::now() + AWS_INTERRUPTION_NOTICE,
            detail: format!("rebalance recommendation since {}", rb.notice_time),
            event_id: None,
        }))
    }
}

impl NoticeSource for Aws {
    fn cloud(&self) -> Cloud {
        Cloud::Aws
    }

    /// Interruption notice first (it takes precedence), then the rebalance
    /// recommendation.
    async fn check(&mut self) -> Result<Option<Notice>, NoticeError> {
        if let Some(n) = self.instance_action().await? {
            return Ok(Some(n));
        }
        self.rebalance().await
    }

    async fn acknowledge(&mut self, _notice: &Notice) -> Result<(), NoticeError> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// GCP

/// GCP preemptible/spot VM preemption, long-polled from the metadata server.
#[derive(Debug)]
pub struct Gcp {
    http: Http,
    pub(crate) base: String,
    wait_secs: u64,
    /// Whether the current value has been read once (later calls long-poll).
    read_once: bool,
    etag: Option<String>,
    /// When `preempted` was first seen `TRUE` (the deadline counts from it).
    preempted_at: Option<SystemTime>,
}

impl Gcp {
    /// A GET with `Metadata-Flavor: Google` whose answer must be a genuine, successful one.
    pub(crate) async fn get_google(
        &self,
        url: &str,
        timeout: Duration,
    ) -> Result<Reply, NoticeError> {
        let req = self
            .http
            .client
            .get(url)
            .header(GCP_FLAVOR_HEADER, GCP_FLAVOR);
        let reply = self.http.fetch("GET", url, req, timeout).await?;
        require_google(&reply, url)?;
        if reply.status != 200 {
            return Err(reply.status_error("GET", url));
        }
        Ok(reply)
    }

    /// A source for the metadata server at `base_url` (normally
    /// [`GCP_BASE`]), long-polling for up to `wait` per [`check`](NoticeSource::check).
    pub fn new(base_url: &str, wait: Duration) -> Result<Self, NoticeError> {
        let mut gcp = Self {
            http: Http::new(Cloud::Gcp)?,
            base: normalize_base(base_url)?,
            wait_secs: 1,
            read_once: false,
            etag: None,
            preempted_at: None,
        };
        gcp.set_wait(wait);
        Ok(gcp)
    }

    /// Per-request limit beyond the long-poll wait (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.http.timeout = timeout;
        self
    }

    /// Long-poll wait (`timeout_sec`), rounded up to whole seconds, at least 1.
    pub fn set_wait(&mut self, wait: Duration) {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        self.wait_secs = secs.max(1);
    }

    /// The long-poll wait in effect.
    pub fn wait(&self) -> Duration {
        Duration::from_secs(self.wait_secs)
    }
}

/// Checks the `Metadata-Flavor: Google` response header that every genuine
/// GCP metadata answer carries.
fn require_google(reply: &Reply, url: &str) -> Result<(), NoticeError> {
    match reply.header(GCP_FLAVOR_HEADER) {
        Some(v) if v.trim() == GCP_FLAVOR => Ok(()),
        other => Err(NoticeError::NotMetadata {
            cloud: Cloud::Gcp,
            url: url.to_string(),
            reason: match other {
                Some(v) => format!(
                    "response header {GCP_FLAVOR_HEADER} is {v:?}, not {GCP_FLAVOR:?} (HTTP {})",
                    reply.status
                ),
                None => format!(
                    "response lacks the header {GCP_FLAVOR_HEADER}: {GCP_FLAVOR} (HTTP {})",
                    reply.status
                ),
            },
        }),
    }
}

impl NoticeSource for Gcp {
    fn cloud(&self) -> Cloud {
        Cloud::Gcp
    }

    /// The first call (and every call once preempted) reads the value at
    /// once; the others long-poll with `wait_for_change=true`, the configured
    /// `timeout_sec` and the last `ETag`, so they return as soon as the value
    /// changes, or after the wait with the unchanged value.
    async fn check(&mut self) -> Result<Option<Notice>, NoticeError> {
        let plain = format!("{}{GCP_PREEMPTED_PATH}", self.base);
        let long_poll = self.read_once && self.preempted_at.is_none();
        let (url, timeout) = if long_poll {
            let mut url = parse_url(&plain)?;
            {
                let mut q = url.query_pairs_mut();
                q.append_pair("wait_for_change", "true");
                q.append_pair("timeout_sec", &self.wait_secs.to_string());
                if let Some(etag) = &self.etag {
                    q.append_pair("last_etag", etag);
                }
            }
            (url.to_string(), self.wait() + self.http.timeout)
        } else {
            (plain, self.http.timeout)
        };
        let reply = self.get_google(&url, timeout).await?;
        let preempted = match reply.body.trim() {
            "TRUE" => true,
            "FALSE" => false,
            _ => return Err(reply.parse_error(&url, "expected TRUE or FALSE")),
        };
        self.read_once = true;
        self.etag = reply.header("etag").map(str::to_string);
        if !preempted {
            return Ok(None);
        }
        let at = *self.preempted_at.get_or_insert_with(|| {
            info!(url = %url, "GCP metadata reports the instance preempted");
            SystemTime::now()
        });
        Ok(Some(Notice {
            cloud: Cloud::Gcp,
            action: Action::Terminate,
            deadline: at + GCP_PREEMPTION_GRACE,
            detail: "instance/preempted is TRUE".to_string(),
            event_id: None,
        }))
    }

    async fn acknowledge(&mut self, _notice: &Notice) -> Result<(), NoticeError> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Azure

/// Azure spot VM eviction via Scheduled Events.
#[derive(Debug)]
pub struct Azure {
    http: Http,
    base: String,
    url: String,
    vm_name: VmName,
    /// Events [`check`](NoticeSource::check) returned: the only ones acknowledged.
    ours: HashSet<String>,
    acked: HashSet<String>,
}

/// Which VM's events count.
#[derive(Debug, Clone, PartialEq, Eq)]
enum VmName {
    /// Not read yet: the first [`check`](NoticeSource::check) reads it from IMDS.
    Unread,
    Known(String),
    /// IMDS would not say (logged once): every event counts.
    Unreadable,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AzureDocument {
    document_incarnation: u64,
    #[serde(default)]
    events: Vec<AzureEvent>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AzureEvent {
    event_id: String,
    event_type: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    event_status: String,
    #[serde(default)]
    not_before: String,
    #[serde(default)]
    description: String,
}

#[derive(serde::Serialize)]
struct AzureStartRequests<'a> {
    #[serde(rename = "StartRequests")]
    start_requests: [AzureStartRequest<'a>; 1],
}

#[derive(serde::Serialize)]
struct AzureStartRequest<'a> {
    #[serde(rename = "EventId")]
    event_id: &'a str,
}

impl Azure {
    /// A source for the IMDS at `base_url` (normally [`AZURE_BASE`]).
    ///
    /// Azure enables Scheduled Events on the first request, which may take
    /// up to two minutes to answer; until then [`check`](NoticeSource::check)
    /// may time out (raise the limit with [`with_timeout`](Self::with_timeout)).
    pub fn new(base_url: &str) -> Result<Self, NoticeError> {
        let base = normalize_base(base_url)?;
        Ok(Self {
            http: Http::new(Cloud::Azure)?,
            base: base.clone(),
            url: format!("{base}{AZURE_EVENTS_PATH}?api-version={AZURE_API_VERSION}"),
            vm_name: VmName::Unread,
            ours: HashSet::new(),
            acked: HashSet::new(),
        })
    }

    /// Per-request limit (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.http.timeout = timeout;
        self
    }

    /// This VM's name, instead of reading it from IMDS at the first check.
    /// Only events whose `Resources` name it count (ASCII case ignored, as
    /// Azure resource names are); events listing no resources still count.
    pub fn with_vm_name(mut self, name: impl Into<String>) -> Self {
        self.vm_name = VmName::Known(name.into());
        self
    }

    /// The VM name events are matched against, once read; `None` while every
    /// event counts (not read yet, or unreadable).
    pub fn vm_name(&self) -> Option<&str> {
        match &self.vm_name {
            VmName::Known(n) => Some(n),
            VmName::Unread | VmName::Unreadable => None,
        }
    }

    /// Reads this VM's name from IMDS, once. When IMDS will not say, it says
    /// so once and every event counts from then on: acting on another VM's
    /// eviction costs a needless checkpoint (and an early acknowledgement of
    /// that VM's event), missing our own costs the work since the last
    /// checkpoint, so a wrong guess errs on the side of acting.
    async fn learn_vm_name(&mut self) {
        if self.vm_name != VmName::Unread {
            return;
        }
        self.vm_name = match self.read_vm_name().await {
            Ok(name) => {
                info!(vm = %name, "acting on Azure scheduled events for this VM only");
                VmName::Known(name)
            }
            Err(e) => {
                warn!(
                    "cannot read this VM's name ({e}): acting on every Azure Preempt or \
                     Terminate event, whichever VM it names, as missing our own is worse"
                );
                VmName::Unreadable
            }
        };
    }

    async fn read_vm_name(&self) -> Result<String, NoticeError> {
        self.instance_text(AZURE_NAME_PATH).await
    }

    /// One word of the instance metadata, `GET {path}?api-version=..&format=text`
    /// (`path` under `/metadata/instance/`).
    pub(crate) async fn instance_text(&self, path: &str) -> Result<String, NoticeError> {
        let url = format!(
            "{}{path}?api-version={AZURE_IMDS_API_VERSION}&format=text",
            self.base
        );
        let req = self.http.client.get(&url).header(AZURE_HEADER, "true");
        let reply = self.http.fetch("GET", &url, req, self.http.timeout).await?;
        if reply.status != 200 {
            return Err(reply.status_error("GET", &url));
        }
        let word = reply.body.trim();
        if word.is_empty() || word.contains(char::is_whitespace) {
            return Err(reply.parse_error(&url, "expected one word"));
        }
        Ok(word.to_string())
    }

    async fn document(&self) -> Result<AzureDocument, NoticeError> {
        let req = self.http.client.get(&self.url).header(AZURE_HEADER, "true");
        let reply = self
            .http
            .fetch("GET", &self.url, req, self.http.timeout)
            .await?;
        if reply.status != 200 {
            return Err(reply.status_error("GET", &self.url));
        }
        serde_json::from_str(&reply.body).map_err(|e| reply.parse_error(&self.url, e))
    }

    fn concerns_us(&self, event: &AzureEvent) -> bool {
        match &self.vm_name {
            VmName::Unread | VmName::Unreadable => true,
            VmName::Known(name) => {
                event.resources.is_empty()
                    || event
                        .resources
                        .iter()
                        .any(|r| r.trim().eq_ignore_ascii_case(name.trim()))
            }
        }
    }
}

impl NoticeSource for Azure {
    fn cloud(&self) -> Cloud {
        Cloud::Azure
    }

    /// The `Preempt` or `Terminate` event for this VM (every VM when its name
    /// cannot be read, see [`with_vm_name`](Azure::with_vm_name)) with the
    /// earliest `NotBefore`. Other event types (Freeze, Reboot, Redeploy) are
    /// ignored. An empty `NotBefore` (started events) means now; an
    /// unparsable one is taken as now too (with a warning), so a real
    /// eviction is never missed over a date format.
    async fn check(&mut self) -> Result<Option<Notice>, NoticeError> {
        let doc = self.document().await?;
        self.learn_vm_name().await;
        let now = SystemTime::now();
        let mut best: Option<Notice> = None;
        for ev in &doc.events {
            let evicting = ["Preempt", "Terminate"]
                .iter()
                .any(|t| ev.event_type.eq_ignore_ascii_case(t));
            if !evicting || !self.concerns_us(ev) {
                continue;
            }
            let not_before = ev.not_before.trim();
            let deadline = if not_before.is_empty() {
                now
            } else {
                match chrono::DateTime::parse_from_rfc2822(not_before) {
                    Ok(t) => t.into(),
                    Err(e) => {
                        warn!(url = %self.url, event = %ev.event_id, not_before, error = %e,
                            "unparsable NotBefore; taking the deadline as now");
                        now
                    }
                }
            };
            if best.as_ref().is_some_and(|b| b.deadline <= deadline) {
                continue;
            }
            let mut detail = format!(
                "{} event {} ({}), not before {:?}, incarnation {}",
                ev.event_type, ev.event_id, ev.event_status, not_before, doc.document_incarnation
            );
            if !ev.description.trim().is_empty() {
                detail.push_str(": ");
                detail.push_str(ev.description.trim());
            }
            best = Some(Notice {
                cloud: Cloud::Azure,
                action: Action::Terminate,
                deadline,
                detail,
                event_id: Some(ev.event_id.clone()),
            });
        }
        if let Some(id) = best.as_ref().and_then(|n| n.event_id.as_ref()) {
            self.ours.insert(id.clone());
        }
        Ok(best)
    }

    /// POSTs `{"StartRequests": [{"EventId": ..}]}` for the notice's event,
    /// once per event: later calls for the same event, calls for notices of
    /// other clouds, and events [`check`](NoticeSource::check) did not return
    /// (another VM's) do nothing. A failed POST may be retried.
    async fn acknowledge(&mut self, notice: &Notice) -> Result<(), NoticeError> {
        let Some(id) = notice.event_id.as_deref() else {
            return Ok(());
        };
        if notice.cloud != Cloud::Azure || self.acked.contains(id) {
            return Ok(());
        }
        if !self.ours.contains(id) {
            debug!(
                event = id,
                "not acknowledging an event this source did not act on"
            );
            return Ok(());
        }
        let body = AzureStartRequests {
            start_requests: [AzureStartRequest { event_id: id }],
        };
        let req = self
            .http
            .client
            .post(&self.url)
            .header(AZURE_HEADER, "true")
            .json(&body);
        let reply = self
            .http
            .fetch("POST", &self.url, req, self.http.timeout)
            .await?;
        if !(200..300).contains(&reply.status) {
            return Err(reply.status_error("POST", &self.url));
        }
        info!(event = id, "acknowledged the Azure scheduled event");
        self.acked.insert(id.to_string());
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Any source, detection

/// One of the clouds' sources, chosen at run time (e.g. by [`detect`]).
#[derive(Debug)]
pub enum AnySource {
    Aws(Aws),
    Gcp(Gcp),
    Azure(Azure),
}

impl AnySource {
    /// Sets the GCP long-poll wait (the supervisor's poll period); the other
    /// clouds answer at once and ignore it.
    pub fn set_poll_wait(&mut self, wait: Duration) {
        if let AnySource::Gcp(g) = self {
            g.set_wait(wait);
        }
    }
}

impl From<Aws> for AnySource {
    fn from(s: Aws) -> Self {
        AnySource::Aws(s)
    }
}

impl From<Gcp> for AnySource {
    fn from(s: Gcp) -> Self {
        AnySource::Gcp(s)
    }
}

impl From<Azure> for AnySource {
    fn from(s: Azure) -> Self {
        AnySource::Azure(s)
    }
}

impl NoticeSource for AnySource {
    fn cloud(&self) -> Cloud {
        match self {
            AnySource::Aws(s) => s.cloud(),
            AnySource::Gcp(s) => s.cloud(),
            AnySource::Azure(s) => s.cloud(),
        }
    }

    async fn check(&mut self) -> Result<Option<Notice>, NoticeError> {
        match self {
            AnySource::Aws(s) => s.check().await,
            AnySource::Gcp(s) => s.check().await,
            AnySource::Azure(s) => s.check().await,
        }
    }

    async fn acknowledge(&mut self, notice: &Notice) -> Result<(), NoticeError> {
        match self {
            AnySource::Aws(s) => s.acknowledge(notice).await,
            AnySource::Gcp(s) => s.acknowledge(notice).await,
            AnySource::Azure(s) => s.acknowledge(notice).await,
        }
    }
}

/// Metadata base URLs that [`detect`] probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bases {
    pub aws: String,
    pub gcp: String,
    pub azure: String,
}

impl Default for Bases {
    /// The real endpoints.
    fn default() -> Self {
        Self {
            aws: AWS_BASE.to_string(),
            gcp: GCP_BASE.to_string(),
            azure: AZURE_BASE.to_string(),
        }
    }
}

/// Probes the three metadata services concurrently, each request limited to
/// `timeout`, and returns the source of the first that answers like its
/// cloud: AWS when the IMDSv2 token PUT succeeds, GCP when
/// `/computeMetadata/v1/` answers with `Metadata-Flavor: Google`, Azure when
/// Scheduled Events answers JSON with a `DocumentIncarnation`. `None` when
/// none does within `timeout`. The returned source has the default request
/// limit; a GCP one the wait [`GCP_DEFAULT_WAIT`] (see
/// [`AnySource::set_poll_wait`]).
pub async fn detect(bases: &Bases, timeout: Duration) -> Option<AnySource> {
    let mut probes = tokio::task::JoinSet::new();
    let aws = bases.aws.clone();
    probes.spawn(async move { probe_aws(&aws, timeout).await });
    let gcp = bases.gcp.clone();
    probes.spawn(async move { probe_gcp(&gcp, timeout).await });
    let azure = bases.azure.clone();
    probes.spawn(async move { probe_azure(&azure, timeout).await });
    let race = async {
        while let Some(done) = probes.join_next().await {
            match done {
                Ok(Ok(source)) => {
                    info!(cloud = %source.cloud(), "detected the cloud's metadata service");
                    return Some(source);
                }
                Ok(Err(e)) => debug!(error = %e, "metadata probe failed"),
                Err(e) => debug!(error = %e, "metadata probe task failed"),
            }
        }
        None
    };
    // Dropping the JoinSet aborts the probes still running.
    tokio::time::timeout(timeout, race).await.ok().flatten()
}

async fn probe_aws(base: &str, timeout: Duration) -> Result<AnySource, NoticeError> {
    let mut aws = Aws::new(base)?.with_timeout(timeout);
    aws.token().await?;
    Ok(AnySource::Aws(aws.with_timeout(DEFAULT_TIMEOUT)))
}

async fn probe_gcp(base: &str, timeout: Duration) -> Result<AnySource, NoticeError> {
    let gcp = Gcp::new(base, GCP_DEFAULT_WAIT)?;
    let url = format!("{}{GCP_ROOT_PATH}", gcp.base);
    gcp.get_google(&url, timeout).await?;
    Ok(AnySource::Gcp(gcp))
}

async fn probe_azure(base: &str, timeout: Duration) -> Result<AnySource, NoticeError> {
    let azure = Azure::new(base)?.with_timeout(timeout);
    azure.document().await?;
    Ok(AnySource::Azure(azure.with_timeout(DEFAULT_TIMEOUT)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::UNIX_EPOCH;

    use axum::Router;
    use axum::extract::{Query, State};
    use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::{get, put};
    use serde_json::{Value, json};
    use tokio::sync::watch;

    use frugal_testkit::loopback::{closed_port, serve, silent_port};

    type Params = Query<HashMap<String, String>>;

    fn header(headers: &HeaderMap, name: &str) -> Option<String> {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    fn epoch(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn near(t: SystemTime, expected: SystemTime, slack: Duration) -> bool {
        let d = match t.duration_since(expected) {
            Ok(d) => d,
            Err(e) => e.duration(),
        };
        d <= slack
    }

    // -- AWS IMDSv2 mock ----------------------------------------------------

    #[derive(Default)]
    struct AwsMock {
        /// Valid tokens and when each expires.
        tokens: HashMap<String, Instant>,
        minted: u32,
        ttl_requests: Vec<String>,
        unauthorized: u32,
        instance_action: Option<String>,
        rebalance: Option<String>,
    }

    type AwsState = Arc<Mutex<AwsMock>>;

    async fn aws_token(State(s): State<AwsState>, headers: HeaderMap) -> Response {
        let Some(ttl) = header(&headers, "x-aws-ec2-metadata-token-ttl-seconds") else {
            return (StatusCode::BAD_REQUEST, "Bad Request").into_response();
        };
        let mut m = s.lock().unwrap();
        m.ttl_requests.push(ttl.clone());
        let secs = match ttl.parse::<u64>() {
            Ok(n) if (1..=21_600).contains(&n) => n,
            _ => return (StatusCode::BAD_REQUEST, "Bad Request").into_response(),
        };
        m.minted += 1;
        let token = format!("AQAEA-token-{}", m.minted);
        m.tokens
            .insert(token.clone(), Instant::now() + Duration::from_secs(secs));
        token.into_response()
    }

    fn aws_answer(
        s: &AwsState,
        headers: &HeaderMap,
        pick: fn(&AwsMock) -> Option<String>,
    ) -> Response {
        let mut m = s.lock().unwrap();
        let valid = header(headers, "x-aws-ec2-metadata-token")
            .and_then(|t| m.tokens.get(&t).copied())
            .is_some_and(|expires| Instant::now() < expires);
        if !valid {
            m.unauthorized += 1;
            return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
        }
        match pick(&m) {
            Some(body) => body.into_response(),
            None => (
                StatusCode::NOT_FOUND,
                "<?xml version=\"1.0\" encoding=\"iso-8859-1\"?>\n<html><title>404 - Not Found</title></html>",
            )
                .into_response(),
        }
    }

    async fn aws_instance_action(State(s): State<AwsState>, headers: HeaderMap) -> Response {
        aws_answer(&s, &headers, |m| m.instance_action.clone())
    }

    async fn aws_rebalance(State(s): State<AwsState>, headers: HeaderMap) -> Response {
        aws_answer(&s, &headers, |m| m.rebalance.clone())
    }

    async fn aws_mock() -> (String, AwsState) {
        let state = AwsState::default();
        let router = Router::new()
            .route(AWS_TOKEN_PATH, put(aws_token))
            .route(AWS_INSTANCE_ACTION_PATH, get(aws_instance_action))
            .route(AWS_REBALANCE_PATH, get(aws_rebalance))
            .with_state(state.clone());
        (serve(router).await, state)
    }

    #[tokio::test]
    async fn aws_no_notice_then_terminate() {
        let (base, state) = aws_mock().await;
        let mut aws = Aws::new(&base).unwrap();
        assert_eq!(aws.cloud(), Cloud::Aws);
        assert_eq!(aws.check().await.unwrap(), None);

        state.lock().unwrap().instance_action =
            Some(r#"{"action": "terminate", "time": "2017-09-18T08:22:00Z"}"#.to_string());
        let n = aws.check().await.unwrap().unwrap();
        assert_eq!(n.cloud, Cloud::Aws);
        assert_eq!(n.action, Action::Terminate);
        assert_eq!(n.deadline, epoch(1_505_722_920));
        assert!(n.detail.contains("terminate"), "{}", n.detail);
        assert_eq!(n.event_id, None);
        aws.acknowledge(&n).await.unwrap();

        // stop and hibernate interrupt the instance just the same.
        state.lock().unwrap().instance_action =
            Some(r#"{"action": "stop", "time": "2017-09-18T08:22:00Z"}"#.to_string());
        assert_eq!(
            aws.check().await.unwrap().unwrap().action,
            Action::Terminate
        );

        let m = state.lock().unwrap();
        assert_eq!(m.minted, 1, "one token serves all polls");
        assert_eq!(m.ttl_requests, vec!["21600".to_string()]);
        assert_eq!(m.unauthorized, 0);
    }

    #[tokio::test]
    async fn aws_refreshes_a_revoked_token_on_401() {
        let (base, state) = aws_mock().await;
        let mut aws = Aws::new(&base).unwrap();
        assert_eq!(aws.check().await.unwrap(), None);
        state.lock().unwrap().tokens.clear(); // expired / revoked server-side
        assert_eq!(aws.check().await.unwrap(), None);
        let m = state.lock().unwrap();
        assert_eq!(m.unauthorized, 1);
        assert_eq!(m.minted, 2);
    }

    #[tokio::test]
    async fn aws_refreshes_the_token_before_its_ttl_ends() {
        let (base, state) = aws_mock().await;
        let mut aws = Aws::new(&base)
            .unwrap()
            .with_token_ttl(Duration::from_secs(1));
        assert_eq!(aws.check().await.unwrap(), None);
        tokio::time::sleep(Duration::from_millis(1_100)).await; // token now expired
        assert_eq!(aws.check().await.unwrap(), None);
        let m = state.lock().unwrap();
        assert_eq!(m.ttl_requests, vec!["1".to_string(), "1".to_string()]);
        assert_eq!(m.unauthorized, 0, "refreshed before use, not after a 401");
    }

    #[tokio::test]
    async fn aws_persistent_401_is_an_error() {
        // A server that rejects every token: one retry, then a clear error.
        let router = Router::new()
            .route(AWS_TOKEN_PATH, put(|| async { "tok" }))
            .route(
                AWS_INSTANCE_ACTION_PATH,
                get(|| async { (StatusCode::UNAUTHORIZED, "Unauthorized") }),
            );
        let base = serve(router).await;
        let err = Aws::new(&base).unwrap().check().await.unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, NoticeError::Status { status: 401, .. }),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("{base}{AWS_INSTANCE_ACTION_PATH}")),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn aws_rebalance_and_precedence() {
        let (base, state) = aws_mock().await;
        let mut aws = Aws::new(&base).unwrap();
        state.lock().unwrap().rebalance =
            Some(r#"{"noticeTime": "2020-11-05T08:22:00Z"}"#.to_string());
        let before = SystemTime::now();
        let n = aws.check().await.unwrap().unwrap();
        assert_eq!(n.action, Action::Rebalance);
        assert!(n.deadline >= before + AWS_INTERRUPTION_NOTICE);
        assert!(n.deadline <= SystemTime::now() + AWS_INTERRUPTION_NOTICE);
        assert!(n.detail.contains("2020-11-05T08:22:00Z"), "{}", n.detail);

        state.lock().unwrap().instance_action =
            Some(r#"{"action": "hibernate", "time": "2017-09-18T08:22:00Z"}"#.to_string());
        let n = aws.check().await.unwrap().unwrap();
        assert_eq!(n.action, Action::Terminate, "terminate wins over rebalance");
        assert_eq!(n.deadline, epoch(1_505_722_920));
    }

    #[tokio::test]
    async fn aws_malformed_json_names_the_url() {
        let (base, state) = aws_mock().await;
        let mut aws = Aws::new(&base).unwrap();
        state.lock().unwrap().instance_action = Some(r#"{"action": "terminate", "#.to_string());
        let err = aws.check().await.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, NoticeError::Parse { .. }), "{msg}");
        assert!(
            msg.contains(&format!("{base}{AWS_INSTANCE_ACTION_PATH}")),
            "{msg}"
        );
        assert!(msg.contains(r#"{\"action\": \"terminate\","#), "{msg}");

        state.lock().unwrap().instance_action =
            Some(r#"{"action": "terminate", "time": "soon"}"#.to_string());
        let msg = aws.check().await.unwrap_err().to_string();
        assert!(msg.contains("time \"soon\""), "{msg}");
    }

    // -- GCP metadata server mock -------------------------------------------

    struct GcpMock {
        preempted: watch::Sender<bool>,
        omit_flavor: Mutex<bool>,
        queries: Mutex<Vec<HashMap<String, String>>>,
    }

    type GcpState = Arc<GcpMock>;

    fn gcp_etag(preempted: bool) -> String {
        if preempted {
            "9a1c2f0e7d3b4a11"
        } else {
            "5e3a8d1cde7a3f1e"
        }
        .to_string()
    }

    fn gcp_reply(
        state: &GcpState,
        status: StatusCode,
        etag: Option<String>,
        body: &str,
    ) -> Response {
        let mut headers = HeaderMap::new();
        if !*state.omit_flavor.lock().unwrap() {
            headers.insert(
                HeaderName::from_static("metadata-flavor"),
                HeaderValue::from_static("Google"),
            );
        }
        if let Some(etag) = etag {
            headers.insert(
                axum::http::header::ETAG,
                HeaderValue::from_str(&etag).unwrap(),
            );
        }
        headers.insert(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/text"),
        );
        (status, headers, body.to_string()).into_response()
    }

    fn gcp_flavored(headers: &HeaderMap) -> bool {
        header(headers, "metadata-flavor").as_deref() == Some("Google")
    }

    async fn gcp_preempted(
        State(s): State<GcpState>,
        headers: HeaderMap,
        Query(q): Params,
    ) -> Response {
        if !gcp_flavored(&headers) {
            return gcp_reply(
                &s,
                StatusCode::FORBIDDEN,
                None,
                "Missing Metadata-Flavor:Google header.",
            );
        }
        s.queries.lock().unwrap().push(q.clone());
        let mut rx = s.preempted.subscribe();
        if q.get("wait_for_change").map(String::as_str) == Some("true") {
            let current = gcp_etag(*rx.borrow());
            // An out-of-date last_etag answers at once; otherwise wait for a
            // change or timeout_sec.
            if q.get("last_etag").is_none_or(|e| *e == current) {
                let secs = q
                    .get("timeout_sec")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(3600);
                let _ = tokio::time::timeout(Duration::from_secs(secs), rx.changed()).await;
            }
        }
        let value = *rx.borrow();
        let body = if value { "TRUE" } else { "FALSE" };
        gcp_reply(&s, StatusCode::OK, Some(gcp_etag(value)), body)
    }

    async fn gcp_root(State(s): State<GcpState>, headers: HeaderMap) -> Response {
        if !gcp_flavored(&headers) {
            return gcp_reply(
                &s,
                StatusCode::FORBIDDEN,
                None,
                "Missing Metadata-Flavor:Google header.",
            );
        }
        gcp_reply(&s, StatusCode::OK, None, "instance/\noslogin/\nproject/\n")
    }

    async fn gcp_mock() -> (String, GcpState) {
        let state = Arc::new(GcpMock {
            preempted: watch::Sender::new(false),
            omit_flavor: Mutex::new(false),
            queries: Mutex::new(Vec::new()),
        });
        let router = Router::new()
            .route(GCP_ROOT_PATH, get(gcp_root))
            .route(GCP_PREEMPTED_PATH, get(gcp_preempted))
            .with_state(state.clone());
        (serve(router).await, state)
    }

    #[tokio::test]
    async fn gcp_false_is_no_notice_and_long_poll_times_out() {
        let (base, state) = gcp_mock().await;
        let mut gcp = Gcp::new(&base, Duration::from_millis(300)).unwrap();
        assert_eq!(
            gcp.wait(),
            Duration::from_secs(1),
            "rounded up to a whole second"
        );
        assert_eq!(gcp.cloud(), Cloud::Gcp);
        assert_eq!(gcp.check().await.unwrap(), None); // plain read
        let t = Instant::now();
        assert_eq!(gcp.check().await.unwrap(), None); // long-poll, no change
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(900), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        let q = state.queries.lock().unwrap();
        assert_eq!(q.len(), 2);
        assert!(!q[0].contains_key("wait_for_change"), "{:?}", q[0]);
        assert_eq!(
            q[1].get("wait_for_change").map(String::as_str),
            Some("true")
        );
        assert_eq!(q[1].get("timeout_sec").map(String::as_str), Some("1"));
        assert_eq!(q[1].get("last_etag"), Some(&gcp_etag(false)));
    }

    #[tokio::test]
    async fn gcp_preemption_ends_a_waiting_long_poll() {
        let (base, state) = gcp_mock().await;
        let mut gcp = Gcp::new(&base, Duration::from_secs(5)).unwrap();
        assert_eq!(gcp.check().await.unwrap(), None);
        let waiting = tokio::spawn(async move {
            let t = Instant::now();
            let r = gcp.check().await;
            (r, t.elapsed(), SystemTime::now(), gcp)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        state.preempted.send_replace(true);
        let (r, took, seen, mut gcp) = waiting.await.unwrap();
        let n = r.unwrap().unwrap();
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert_eq!(n.cloud, Cloud::Gcp);
        assert_eq!(n.action, Action::Terminate);
        assert!(near(
            n.deadline,
            seen + GCP_PREEMPTION_GRACE,
            Duration::from_millis(100)
        ));
        {
            let q = state.queries.lock().unwrap();
            assert_eq!(q[1].get("timeout_sec").map(String::as_str), Some("5"));
            assert_eq!(q[1].get("last_etag"), Some(&gcp_etag(false)));
        }

        // Once preempted, later checks answer at once with the same deadline.
        let t = Instant::now();
        let again = gcp.check().await.unwrap().unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(again.deadline, n.deadline);
        gcp.acknowledge(&again).await.unwrap();
    }

    #[tokio::test]
    async fn gcp_rejects_an_answer_without_metadata_flavor() {
        let (base, state) = gcp_mock().await;
        *state.omit_flavor.lock().unwrap() = true;
        let mut gcp = Gcp::new(&base, Duration::from_secs(1)).unwrap();
        let err = gcp.check().await.unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                NoticeError::NotMetadata {
                    cloud: Cloud::Gcp,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(msg.contains("Metadata-Flavor"), "{msg}");
        assert!(
            msg.contains(&format!("{base}{GCP_PREEMPTED_PATH}")),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn gcp_garbage_body_is_a_parse_error() {
        let router = Router::new().route(
            GCP_PREEMPTED_PATH,
            get(|| async { ([("metadata-flavor", "Google")], "MAYBE") }),
        );
        let base = serve(router).await;
        let err = Gcp::new(&base, Duration::from_secs(1))
            .unwrap()
            .check()
            .await
            .unwrap_err();
        assert!(matches!(err, NoticeError::Parse { .. }), "{err}");
        assert!(err.to_string().contains("MAYBE"), "{err}");
    }

    // -- Azure Scheduled Events mock ----------------------------------------

    #[derive(Default)]
    struct AzureMock {
        incarnation: u64,
        events: Vec<Value>,
        posts: Vec<Value>,
        /// What `compute/name` answers; `None`: 404.
        vm_name: Option<String>,
        name_reads: u32,
    }

    type AzureState = Arc<Mutex<AzureMock>>;

    fn azure_checks(headers: &HeaderMap, q: &HashMap<String, String>) -> Option<Response> {
        if header(headers, "metadata").as_deref() != Some("true") {
            let e = json!({"error": "Bad request. Required metadata header not specified"});
            return Some((StatusCode::BAD_REQUEST, axum::Json(e)).into_response());
        }
        if !q.contains_key("api-version") {
            let e = json!({"error": "Bad request. api-version was not specified in the request"});
            return Some((StatusCode::BAD_REQUEST, axum::Json(e)).into_response());
        }
        None
    }

    async fn azure_get(
        State(s): State<AzureState>,
        headers: HeaderMap,
        Query(q): Params,
    ) -> Response {
        if let Some(r) = azure_checks(&headers, &q) {
            return r;
        }
        let m = s.lock().unwrap();
        axum::Json(json!({"DocumentIncarnation": m.incarnation, "Events": m.events}))
            .into_response()
    }

    async fn azure_post(
        State(s): State<AzureState>,
        headers: HeaderMap,
        Query(q): Params,
        axum::Json(body): axum::Json<Value>,
    ) -> Response {
        if let Some(r) = azure_checks(&headers, &q) {
            return r;
        }
        let mut m = s.lock().unwrap();
        m.posts.push(body.clone());
        let Some(requests) = body["StartRequests"].as_array() else {
            return StatusCode::BAD_REQUEST.into_response();
        };
        // Approved events start: status Started, NotBefore empty.
        for r in requests {
            let Some(ev) = m.events.iter_mut().find(|e| e["EventId"] == r["EventId"]) else {
                return StatusCode::BAD_REQUEST.into_response();
            };
            ev["EventStatus"] = json!("Started");
            ev["NotBefore"] = json!("");
        }
        m.incarnation += 1;
        StatusCode::OK.into_response()
    }

    async fn azure_name(
        State(s): State<AzureState>,
        headers: HeaderMap,
        Query(q): Params,
    ) -> Response {
        if let Some(r) = azure_checks(&headers, &q) {
            return r;
        }
        if q.get("format").map(String::as_str) != Some("text") {
            return StatusCode::BAD_REQUEST.into_response();
        }
        let mut m = s.lock().unwrap();
        m.name_reads += 1;
        match m.vm_name.clone() {
            Some(name) => name.into_response(),
            None => StatusCode::NOT_FOUND.into_response(),
        }
    }

    /// Scheduled Events and `compute/name` (this VM is `vm1`).
    async fn azure_mock() -> (String, AzureState) {
        let state = AzureState::default();
        {
            let mut m = state.lock().unwrap();
            m.incarnation = 1;
            m.vm_name = Some("vm1".to_string());
        }
        let router = Router::new()
            .route(AZURE_EVENTS_PATH, get(azure_get).post(azure_post))
            .route(AZURE_NAME_PATH, get(azure_name))
            .with_state(state.clone());
        (serve(router).await, state)
    }

    fn azure_event(id: &str, kind: &str, vm: &str) -> Value {
        json!({
            "EventId": id,
            "EventType": kind,
            "ResourceType": "VirtualMachine",
            "Resources": [vm],
            "EventStatus": "Scheduled",
            "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
            "Description": "Virtual machine is being evicted.",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        })
    }

    #[tokio::test]
    async fn azure_ignores_no_events_and_freeze() {
        let (base, state) = azure_mock().await;
        let mut azure = Azure::new(&base).unwrap();
        assert_eq!(azure.cloud(), Cloud::Azure);
        assert_eq!(azure.check().await.unwrap(), None);
        {
            let mut m = state.lock().unwrap();
            m.events.push(azure_event("F-1", "Freeze", "vm1"));
            m.events.push(azure_event("R-1", "Reboot", "vm1"));
            m.events.push(azure_event("D-1", "Redeploy", "vm1"));
            m.incarnation += 1;
        }
        assert_eq!(azure.check().await.unwrap(), None);
    }

    #[tokio::test]
    async fn azure_preempt_is_terminate_and_acked_once() {
        let (base, state) = azure_mock().await;
        let mut azure = Azure::new(&base).unwrap();
        {
            let mut m = state.lock().unwrap();
            m.events.push(azure_event("F-1", "Freeze", "vm1"));
            m.events.push(azure_event(
                "602d9444-d2cd-49c7-8624-8643e7171297",
                "Preempt",
                "vm1",
            ));
            m.incarnation += 1;
        }
        let n = azure.check().await.unwrap().unwrap();
        assert_eq!(n.cloud, Cloud::Azure);
        assert_eq!(n.action, Action::Terminate);
        assert_eq!(n.deadline, epoch(1_474_309_787));
        assert_eq!(
            n.event_id.as_deref(),
            Some("602d9444-d2cd-49c7-8624-8643e7171297")
        );
        assert!(n.detail.contains("Preempt"), "{}", n.detail);

        azure.acknowledge(&n).await.unwrap();
        azure.acknowledge(&n).await.unwrap();
        assert_eq!(
            state.lock().unwrap().posts,
            vec![json!({"StartRequests": [{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297"}]})]
        );

        // The approved event has started (empty NotBefore): deadline now; no re-ack.
        let started = azure.check().await.unwrap().unwrap();
        assert!(near(
            started.deadline,
            SystemTime::now(),
            Duration::from_secs(1)
        ));
        assert!(started.detail.contains("Started"), "{}", started.detail);
        azure.acknowledge(&started).await.unwrap();
        assert_eq!(state.lock().unwrap().posts.len(), 1);
    }

    #[tokio::test]
    async fn azure_terminate_counts_and_vm_name_filters() {
        let (base, state) = azure_mock().await;
        {
            let mut m = state.lock().unwrap();
            m.events.push(azure_event("T-other", "Terminate", "vm2"));
            m.incarnation += 1;
        }
        let mut mine = Azure::new(&base).unwrap().with_vm_name("VM1");
        assert_eq!(mine.check().await.unwrap(), None, "event for another VM");
        assert_eq!(
            state.lock().unwrap().name_reads,
            0,
            "a given name is not read"
        );

        state
            .lock()
            .unwrap()
            .events
            .push(azure_event("T-mine", "Terminate", "vm1"));
        let n = mine.check().await.unwrap().unwrap();
        assert_eq!(n.event_id.as_deref(), Some("T-mine"));
        assert_eq!(n.action, Action::Terminate);
    }

    #[tokio::test]
    async fn azure_acts_only_on_events_for_this_vm() {
        let (base, state) = azure_mock().await;
        let mut azure = Azure::new(&base).unwrap();
        assert_eq!(azure.vm_name(), None, "read at the first check");
        state
            .lock()
            .unwrap()
            .events
            .push(azure_event("P-other", "Preempt", "vm2"));
        assert_eq!(azure.check().await.unwrap(), None, "another VM's eviction");
        assert_eq!(azure.check().await.unwrap(), None);
        assert_eq!(azure.vm_name(), Some("vm1"));

        // Another VM's event is never acknowledged, even when asked to.
        let theirs = Notice {
            cloud: Cloud::Azure,
            action: Action::Terminate,
            deadline: SystemTime::now(),
            detail: String::new(),
            event_id: Some("P-other".to_string()),
        };
        azure.acknowledge(&theirs).await.unwrap();
        assert!(state.lock().unwrap().posts.is_empty());

        state
            .lock()
            .unwrap()
            .events
            .push(azure_event("P-mine", "Preempt", "VM1"));
        let n = azure.check().await.unwrap().unwrap();
        assert_eq!(n.event_id.as_deref(), Some("P-mine"));
        azure.acknowledge(&n).await.unwrap();
        let m = state.lock().unwrap();
        assert_eq!(
            m.posts,
            vec![json!({"StartRequests": [{"EventId": "P-mine"}]})]
        );
        assert_eq!(m.name_reads, 1, "the name is read once");
    }

    #[tokio::test]
    async fn azure_without_its_name_acts_on_every_event() {
        let (base, state) = azure_mock().await;
        {
            let mut m = state.lock().unwrap();
            m.vm_name = None; // compute/name answers 404
            m.events.push(azure_event("P-other", "Preempt", "vm2"));
        }
        let mut azure = Azure::new(&base).unwrap();
        let n = azure.check().await.unwrap().unwrap();
        assert_eq!(n.event_id.as_deref(), Some("P-other"));
        assert_eq!(azure.vm_name(), None);
        azure.acknowledge(&n).await.unwrap();
        assert_eq!(azure.check().await.unwrap().unwrap().event_id, n.event_id);
        let m = state.lock().unwrap();
        assert_eq!(m.posts.len(), 1);
        assert_eq!(m.name_reads, 1, "tried once, not at every check");
    }

    #[tokio::test]
    async fn azure_malformed_document_names_the_url() {
        let router = Router::new().route(AZURE_EVENTS_PATH, get(|| async { "{\"Events\": [" }));
        let base = serve(router).await;
        let err = Azure::new(&base).unwrap().check().await.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, NoticeError::Parse { .. }), "{msg}");
        assert!(
            msg.contains(&format!(
                "{base}{AZURE_EVENTS_PATH}?api-version={AZURE_API_VERSION}"
            )),
            "{msg}"
        );
    }

    // -- detect, errors -----------------------------------------------------

    fn same(base: &str) -> Bases {
        Bases {
            aws: base.to_string(),
            gcp: base.to_string(),
            azure: base.to_string(),
        }
    }

    #[tokio::test]
    async fn detect_picks_the_answering_cloud() {
        let t = Duration::from_secs(2);
        let (aws, _) = aws_mock().await;
        let (gcp, _) = gcp_mock().await;
        let (azure, _) = azure_mock().await;

        // Each mock answers only its own cloud's probe.
        let mut found = detect(&same(&aws), t).await.unwrap();
        assert!(matches!(found, AnySource::Aws(_)), "{found:?}");
        assert_eq!(
            found.check().await.unwrap(),
            None,
            "the detected source works"
        );
        let found = detect(&same(&gcp), t).await.unwrap();
        assert!(matches!(found, AnySource::Gcp(_)), "{found:?}");
        let mut found = detect(&same(&azure), t).await.unwrap();
        assert!(matches!(found, AnySource::Azure(_)), "{found:?}");
        assert_eq!(found.check().await.unwrap(), None);

        // The answering one wins over refusing and silent endpoints.
        let bases = Bases {
            aws: closed_port().await,
            gcp,
            azure: silent_port().await,
        };
        let started = Instant::now();
        let mut found = detect(&bases, t).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(found.cloud(), Cloud::Gcp);
        found.set_poll_wait(Duration::from_secs(1));
        assert_eq!(found.check().await.unwrap(), None);
    }

    #[tokio::test]
    async fn detect_none_within_the_timeout() {
        let timeout = Duration::from_millis(300);
        let started = Instant::now();
        assert!(detect(&same(&closed_port().await), timeout).await.is_none());
        let bases = Bases {
            aws: silent_port().await,
            gcp: silent_port().await,
            azure: closed_port().await,
        };
        assert!(detect(&bases, timeout).await.is_none());
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1_500), "{took:?}");
    }

    #[tokio::test]
    async fn unreachable_endpoints_are_clear_errors() {
        let base = closed_port().await;
        let checks = [
            Aws::new(&base).unwrap().check().await.unwrap_err(),
            Gcp::new(&base, Duration::from_secs(1))
                .unwrap()
                .check()
                .await
                .unwrap_err(),
            Azure::new(&base).unwrap().check().await.unwrap_err(),
        ];
        for err in checks {
            let msg = err.to_string();
            assert!(matches!(err, NoticeError::Request { .. }), "{msg}");
            assert!(msg.contains(&base), "{msg}");
            assert!(msg.contains("cannot connect"), "{msg}");
        }

        let silent = silent_port().await;
        let err = Aws::new(&silent)
            .unwrap()
            .with_timeout(Duration::from_millis(200))
            .check()
            .await
            .unwrap_err();
        assert!(err.to_string().contains("timed out"), "{err}");
    }

    #[test]
    fn bad_base_urls_are_rejected() {
        for bad in [
            "",
            "169.254.169.254",
            "https://169.254.169.254",
            "http://x/?a=1",
            "ftp://h",
        ] {
            let err = Aws::new(bad).unwrap_err();
            assert!(matches!(err, NoticeError::BadUrl { .. }), "{bad:?}: {err}");
        }
        assert!(Gcp::new("http://metadata.google.internal/", Duration::ZERO).is_ok());
        assert!(Azure::new(AZURE_BASE).is_ok());
        assert_eq!(Bases::default().gcp, GCP_BASE);
    }

    #[test]
    fn cloud_display_and_parse() {
        for c in [Cloud::Aws, Cloud::Gcp, Cloud::Azure] {
            assert_eq!(c.to_string().parse::<Cloud>().unwrap(), c);
        }
        assert_eq!(" AWS ".parse::<Cloud>().unwrap(), Cloud::Aws);
        assert_eq!(Cloud::Azure.to_string(), "azure");
        assert!(matches!(
            "ibm".parse::<Cloud>(),
            Err(NoticeError::UnknownCloud(_))
        ));
        assert_eq!(Action::Rebalance.to_string(), "rebalance");
    }
}
