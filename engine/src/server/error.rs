//! API errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::scheduler::SubmitError;

/// An error answered to a client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, …).
    pub kind: &'static str,
    /// The request field at fault, when known.
    pub param: Option<String>,
    /// A stable machine-readable code.
    pub code: Option<&'static str>,
    /// Seconds after which to retry (sets `Retry-After`).
    pub retry_after: Option<u64>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or invalid.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            message,
        )
    }

    /// 400 naming the offending field.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::invalid(message);
        e.param = Some(param.to_string());
        e
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            "missing or invalid API key: send `Authorization: Bearer <key>`",
        )
    }

    /// 404: unknown model.
    pub fn model_not_found(model: &str, served: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model_not_found"),
            format!("the model `{model}` does not exist; this server serves `{served}`"),
        );
        e.param = Some("model".into());
        e
    }

    /// 404: no such route.
    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("not_found"),
            format!("no route for {path}"),
        )
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("request_too_large"),
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// 408: the client did not send its whole body within the read timeout.
    pub fn request_timeout(deadline: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            Some("request_timeout"),
            format!(
                "the request body did not arrive within {} s",
                deadline.as_secs_f64()
            ),
        )
    }

    /// 429: the queue is full.
    pub fn overloaded(message: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "overloaded_error",
            Some("queue_full"),
            message,
        );
        e.retry_after = Some(1);
        e
    }

    /// 503: shutting down.
    pub fn shutting_down() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            Some("shutting_down"),
            "the server is shutting down",
        );
        e.retry_after = Some(5);
        e
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            Some("internal_error"),
            message,
        )
    }

    /// The stable label used for `error.type` on spans.
    pub fn label(&self) -> &'static str {
        match self.status {
            StatusCode::TOO_MANY_REQUESTS => "overloaded",
            StatusCode::SERVICE_UNAVAILABLE => "shutdown",
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::PAYLOAD_TOO_LARGE => "too_large",
            StatusCode::REQUEST_TIMEOUT => "timeout",
            s if s.is_server_error() => "internal",
            _ if self.code == Some("context_length_exceeded") => "context_length",
            _ => "validation",
        }
    }

    /// The body as JSON.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or_default()
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::QueueFull(_) => ApiError::overloaded(e.to_string()),
            SubmitError::ShuttingDown => ApiError::shutting_down(),
            SubmitError::ContextOverflow { .. } => {
                let mut a = ApiError::invalid_param("max_tokens", e.to_string());
                a.code = Some("context_length_exceeded");
                a
            }
            SubmitError::EmptyPrompt => ApiError::invalid_param("messages", e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
