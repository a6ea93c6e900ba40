//! API errors, answered in the shape of the API the request came through: OpenAI's
//! `{"error": {"message", "type", "param", "code"}}`, or Anthropic's
//! `{"type": "error", "error": {"type", "message"}}` ([`ErrorShape`]). One [`ApiError`] holds
//! what went wrong; [`ApiError::render`] writes it either way.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use slotlight_otel::attr::value;

use crate::scheduler::{EngineError, SubmitError};

/// What went wrong, as a type: each kind has one stable `error.type` label, taken from the
/// telemetry contract (spans, log lines and the sidecar's metrics use it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or invalid; fix it before retrying.
    Validation,
    /// Prompt plus `max_tokens` exceed the context length.
    ContextLength,
    /// No such model (or route).
    NotFound,
    /// The body is over the size limit.
    TooLarge,
    /// The body did not arrive within the read timeout.
    Timeout,
    /// Missing or wrong API key.
    Unauthorized,
    /// The queue is full; retry after `Retry-After`.
    Overloaded,
    /// The server is shutting down; retry elsewhere.
    Shutdown,
    /// The KV cache cannot hold the request.
    KvCacheExhausted,
    /// A failure of the engine; not the client's fault.
    Internal,
}

impl ErrorKind {
    /// The `error.type` label.
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Validation => value::ERROR_VALIDATION,
            ErrorKind::ContextLength => value::ERROR_CONTEXT_LENGTH,
            ErrorKind::NotFound => value::ERROR_NOT_FOUND,
            ErrorKind::TooLarge => value::ERROR_TOO_LARGE,
            ErrorKind::Timeout => value::ERROR_TIMEOUT,
            ErrorKind::Unauthorized => value::ERROR_UNAUTHORIZED,
            ErrorKind::Overloaded => value::ERROR_OVERLOADED,
            ErrorKind::Shutdown => value::ERROR_SHUTDOWN,
            ErrorKind::KvCacheExhausted => value::ERROR_KV_CACHE_EXHAUSTED,
            ErrorKind::Internal => value::ERROR_INTERNAL,
        }
    }
}

/// The wire shape an error is answered in: the API of the route that answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorShape {
    /// OpenAI's `{"error": {"message", "type", "param", "code"}}` (chat completions,
    /// completions, Responses, and every route that is not Anthropic's).
    OpenAi,
    /// Anthropic's `{"type": "error", "error": {"type", "message"}}` (`/v1/messages*`), with
    /// Anthropic's error types and statuses (529 `overloaded_error` for a full queue).
    Anthropic,
}

impl ErrorShape {
    /// The shape of the errors of the route at `path`: Anthropic's for `/v1/messages` and
    /// what lies under it, OpenAI's for everything else.
    pub fn of_path(path: &str) -> Self {
        if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            ErrorShape::Anthropic
        } else {
            ErrorShape::OpenAi
        }
    }
}

/// An error answered to a client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// What kind of error (gives the `error.type` label).
    pub error: ErrorKind,
    /// The HTTP status the error is answered with.
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

impl ApiError {
    fn new(
        error: ErrorKind,
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            error,
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
            ErrorKind::Validation,
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
            ErrorKind::Unauthorized,
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            "missing or invalid API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`",
        )
    }

    /// 404: unknown model.
    pub fn model_not_found(model: &str, served: &str) -> Self {
        let mut e = Self::new(
            ErrorKind::NotFound,
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
            ErrorKind::NotFound,
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("not_found"),
            format!("no route for {path}"),
        )
    }

    /// 404 naming the request field whose id is unknown (`previous_response_id`).
    pub fn not_found_param(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(
            ErrorKind::NotFound,
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("not_found"),
            message,
        );
        e.param = Some(param.to_string());
        e
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            ErrorKind::TooLarge,
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("request_too_large"),
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// 408: the client did not send its whole body within the read timeout.
    pub fn request_timeout(deadline: std::time::Duration) -> Self {
        Self::new(
            ErrorKind::Timeout,
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
            ErrorKind::Overloaded,
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
            ErrorKind::Shutdown,
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            Some("shutting_down"),
            "the server is shutting down",
        );
        e.retry_after = Some(5);
        e
    }

    /// A 503 `server_error` for a part of the server that cannot be used now (the Responses
    /// store that could not be opened), while the rest serves.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            ErrorKind::Internal,
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("unavailable"),
            message,
        )
    }

    /// A 500 `server_error` for a failure that is the server's, not the caller's.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            ErrorKind::Internal,
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            Some("internal_error"),
            message,
        )
    }

    /// The stable label used for `error.type` on spans.
    pub fn label(&self) -> &'static str {
        self.error.label()
    }

    /// The body as JSON in OpenAI's shape (built as a value: it cannot fail to serialize).
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// Anthropic's error type for this error (`invalid_request_error`, `overloaded_error`, …).
    pub fn anthropic_type(&self) -> &'static str {
        match self.error {
            ErrorKind::Validation | ErrorKind::ContextLength => "invalid_request_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::TooLarge => "request_too_large",
            ErrorKind::Timeout => "timeout_error",
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::Overloaded => "overloaded_error",
            ErrorKind::Shutdown | ErrorKind::KvCacheExhausted | ErrorKind::Internal => "api_error",
        }
    }

    /// The HTTP status in `shape`: Anthropic answers a full queue with 529, the rest alike.
    pub fn status_in(&self, shape: ErrorShape) -> StatusCode {
        match (shape, self.error) {
            (ErrorShape::Anthropic, ErrorKind::Overloaded) => {
                StatusCode::from_u16(529).unwrap_or(self.status)
            }
            _ => self.status,
        }
    }

    /// The body as JSON in `shape`. Anthropic's shape has no `param`: its message names the
    /// field at fault (prefixed with it when it does not already).
    pub fn body_in(&self, shape: ErrorShape) -> serde_json::Value {
        match shape {
            ErrorShape::OpenAi => self.body(),
            ErrorShape::Anthropic => {
                let message = match &self.param {
                    Some(p) if !self.message.contains(p.as_str()) => {
                        format!("`{p}`: {}", self.message)
                    }
                    _ => self.message.clone(),
                };
                serde_json::json!({
                    "type": "error",
                    "error": {"type": self.anthropic_type(), "message": message},
                })
            }
        }
    }

    /// The whole response in `shape`: status, body, `Retry-After` when set, and the typed
    /// error itself as an extension (the outer layer of the generation routes reads its label
    /// back, instead of working it out from the status code).
    pub fn render(self, shape: ErrorShape) -> Response {
        let mut r = (self.status_in(shape), Json(self.body_in(shape))).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r.extensions_mut().insert(self);
        r
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
                a.error = ErrorKind::ContextLength;
                a
            }
            SubmitError::EmptyPrompt => ApiError::invalid_param("messages", e.to_string()),
        }
    }
}

impl From<&EngineError> for ApiError {
    fn from(e: &EngineError) -> Self {
        match e {
            EngineError::ShuttingDown => ApiError::shutting_down(),
            EngineError::KvCacheExhausted(_) => {
                let mut a = ApiError::internal(e.to_string());
                a.error = ErrorKind::KvCacheExhausted;
                a.code = Some("kv_cache_exhausted");
                a
            }
            EngineError::Step(_)
            | EngineError::Lost
            | EngineError::StructuredOutput(_)
            | EngineError::Decode(_) => ApiError::internal(e.to_string()),
        }
    }
}

/// An error answered in OpenAI's shape (every route but Anthropic's, which call
/// [`ApiError::render`] with [`ErrorShape::Anthropic`]).
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.render(ErrorShape::OpenAi)
    }
}
