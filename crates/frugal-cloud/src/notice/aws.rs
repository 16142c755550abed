//! AWS: IMDSv2 spot interruption notices and rebalance recommendations.

use std::fmt;
use std::time::{Duration, Instant, SystemTime};

use serde::Deserialize;
use tracing::{debug, warn};

use super::http::{Http, excerpt, normalize_base};
use super::{
    AWS_INTERRUPTION_NOTICE, AWS_TOKEN_TTL, Action, Cloud, Notice, NoticeError, NoticeSource,
};

const AWS_TOKEN_PATH: &str = "/latest/api/token";
const AWS_TOKEN_TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";
const AWS_TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
const AWS_INSTANCE_ACTION_PATH: &str = "/latest/meta-data/spot/instance-action";
const AWS_REBALANCE_PATH: &str = "/latest/meta-data/events/recommendations/rebalance";

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
    pub(super) async fn token(&mut self) -> Result<String, NoticeError> {
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

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[cfg(test)]
pub(super) mod tests {
    use super::*;

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::{get, put};

    use frugal_testkit::loopback::serve;

    use crate::notice::tests::{epoch, header};

    // -- AWS IMDSv2 mock ----------------------------------------------------

    #[derive(Default)]
    pub(crate) struct AwsMock {
        /// Valid tokens and when each expires.
        tokens: HashMap<String, Instant>,
        minted: u32,
        ttl_requests: Vec<String>,
        unauthorized: u32,
        instance_action: Option<String>,
        rebalance: Option<String>,
    }

    pub(crate) type AwsState = Arc<Mutex<AwsMock>>;

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

    pub(crate) async fn aws_mock() -> (String, AwsState) {
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
}
