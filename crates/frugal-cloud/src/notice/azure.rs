//! Azure: a spot VM's eviction through Scheduled Events, acknowledged once per event.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use tracing::{debug, info, warn};

use super::http::{Http, normalize_base};
use super::{
    AZURE_API_VERSION, AZURE_IMDS_API_VERSION, Action, Cloud, Notice, NoticeError, NoticeSource,
};

const AZURE_HEADER: &str = "Metadata";
const AZURE_EVENTS_PATH: &str = "/metadata/scheduledevents";
const AZURE_NAME_PATH: &str = "/metadata/instance/compute/name";

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
pub(super) struct AzureDocument {
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

    pub(super) async fn document(&self) -> Result<AzureDocument, NoticeError> {
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

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[cfg(test)]
pub(super) mod tests {
    use super::*;

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::extract::{Query, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::get;
    use serde_json::{Value, json};

    use frugal_testkit::loopback::serve;

    use crate::notice::tests::{Params, epoch, header, near};

    // -- Azure Scheduled Events mock ----------------------------------------

    #[derive(Default)]
    pub(crate) struct AzureMock {
        incarnation: u64,
        events: Vec<Value>,
        posts: Vec<Value>,
        /// What `compute/name` answers; `None`: 404.
        vm_name: Option<String>,
        name_reads: u32,
    }

    pub(crate) type AzureState = Arc<Mutex<AzureMock>>;

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
    pub(crate) async fn azure_mock() -> (String, AzureState) {
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
}
