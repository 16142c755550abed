//! GCP: a preemptible or spot VM's preemption, long-polled from the metadata server.

use std::time::{Duration, SystemTime};

use tracing::info;

use super::http::{Http, Reply, normalize_base, parse_url};
use super::{Action, Cloud, GCP_PREEMPTION_GRACE, Notice, NoticeError, NoticeSource};

const GCP_FLAVOR_HEADER: &str = "Metadata-Flavor";
const GCP_FLAVOR: &str = "Google";
pub(super) const GCP_ROOT_PATH: &str = "/computeMetadata/v1/";
const GCP_PREEMPTED_PATH: &str = "/computeMetadata/v1/instance/preempted";

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

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[cfg(test)]
pub(super) mod tests {
    use super::*;

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use axum::Router;
    use axum::extract::{Query, State};
    use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::get;
    use tokio::sync::watch;

    use frugal_testkit::loopback::serve;

    use crate::notice::tests::{Params, header, near};

    // -- GCP metadata server mock -------------------------------------------

    pub(crate) struct GcpMock {
        preempted: watch::Sender<bool>,
        omit_flavor: Mutex<bool>,
        queries: Mutex<Vec<HashMap<String, String>>>,
    }

    pub(crate) type GcpState = Arc<GcpMock>;

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

    pub(crate) async fn gcp_mock() -> (String, GcpState) {
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
}
