//! The API's one error type, in OpenAI's error shape.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{message}")]
    InvalidParam {
        param: &'static str,
        message: String,
    },
    #[error("the model `{0}` does not exist")]
    UnknownModel(String),
    /// No such object (a file, a batch) for this client.
    #[error("{message}")]
    NotFound {
        param: Option<&'static str>,
        message: String,
    },
    /// A path served, asked with a method it does not take.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The object is not in a state that allows the request (cancelling a finished batch).
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    ContextLength(String),
    #[error("{0}")]
    Overloaded(String),
    #[error("{0}")]
    Internal(String),
    /// No API key, or not a valid one.
    #[error("{0}")]
    Unauthorized(String),
    /// A tenant's budget is spent until `retry_after_s` from now.
    #[error("{message}")]
    Budget { message: String, retry_after_s: u64 },
    /// Nothing can serve the request now (a pool could not start a replica in time).
    #[error("{message}")]
    Unavailable { message: String, retry_after_s: u64 },
    /// A bound on what a client may hold is reached (batches at once, bytes stored); `code`
    /// names which.
    #[error("{message}")]
    Quota { message: String, code: &'static str },
    /// An upstream failed (502, 504), refused (429), or refused the request (its 4xx).
    #[error("{message}")]
    Upstream { status: u16, message: String },
}

impl ApiError {
    fn parts(
        &self,
    ) -> (
        StatusCode,
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
    ) {
        match self {
            ApiError::BadRequest(_) => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", None, None)
            }
            ApiError::InvalidParam { param, .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some(param),
                None,
            ),
            ApiError::UnknownModel(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model"),
                Some("model_not_found"),
            ),
            ApiError::NotFound { param, .. } => {
                (StatusCode::NOT_FOUND, "invalid_request_error", *param, None)
            }
            ApiError::MethodNotAllowed(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                None,
                None,
            ),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "invalid_request_error", None, None),
            ApiError::TooLarge(_) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                None,
                Some("file_too_large"),
            ),
            ApiError::ContextLength(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("messages"),
                Some("context_length_exceeded"),
            ),
            ApiError::Overloaded(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "overloaded_error",
                None,
                Some("overloaded"),
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                None,
            ),
            ApiError::Unauthorized(_) => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                None,
                Some("invalid_api_key"),
            ),
            ApiError::Budget { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "insufficient_quota",
                None,
                Some("budget_exceeded"),
            ),
            ApiError::Unavailable { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                Some("unavailable"),
            ),
            ApiError::Quota { code, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "insufficient_quota",
                None,
                Some(code),
            ),
            ApiError::Upstream { status, .. } => {
                let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY);
                let kind = if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS {
                    "invalid_request_error"
                } else {
                    "upstream_error"
                };
                (status, kind, None, None)
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, kind, param, code) = self.parts();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        } else {
            tracing::debug!(error = %self, "request refused");
        }
        let body = serde_json::json!({
            "error": { "message": self.to_string(), "type": kind, "param": param, "code": code }
        });
        let mut response = (status, Json(body)).into_response();
        // A spent budget comes back when its period turns, a pool when a replica may be
        // ready; overload clears in a moment.
        let after = match &self {
            ApiError::Budget { retry_after_s, .. }
            | ApiError::Unavailable { retry_after_s, .. } => {
                Some(HeaderValue::from(*retry_after_s))
            }
            _ => (status == StatusCode::TOO_MANY_REQUESTS).then(|| HeaderValue::from_static("1")),
        };
        if let Some(after) = after {
            response.headers_mut().insert(header::RETRY_AFTER, after);
        }
        response
    }
}
