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
//!
//! [`crate::watch::NoticeWatcher`] polls a source on its own task for every command that
//! runs on spot.

mod aws;
mod azure;
mod detect;
mod gcp;
mod http;

pub use aws::Aws;
pub use azure::Azure;
pub use detect::{AnySource, Bases, Choice, DETECT_TIMEOUT, choose, detect};
pub use gcp::Gcp;

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

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
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[cfg(test)]
pub(super) mod tests {
    //! What the clouds' tests share: reading a mock's request, and times.

    use super::*;

    use std::collections::HashMap;
    use std::time::UNIX_EPOCH;

    use axum::extract::Query;
    use axum::http::HeaderMap;

    pub(crate) type Params = Query<HashMap<String, String>>;

    pub(crate) fn header(headers: &HeaderMap, name: &str) -> Option<String> {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    pub(crate) fn epoch(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    pub(crate) fn near(t: SystemTime, expected: SystemTime, slack: Duration) -> bool {
        let d = match t.duration_since(expected) {
            Ok(d) => d,
            Err(e) => e.duration(),
        };
        d <= slack
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
