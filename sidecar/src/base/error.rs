//! Errors, each with a stable label (used as the `reason` metric label and in bodies).

use std::net::IpAddr;

use axum::http::StatusCode;

/// Why an OTLP export request was refused as a whole.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The payload did not decode (bad protobuf, bad JSON, bad gzip). Not retryable: the
    /// sender should drop it. HTTP 400, gRPC `INVALID_ARGUMENT`.
    #[error("malformed OTLP payload: {0}")]
    Malformed(String),
    /// The payload (after decompression) is bigger than `--max-body-bytes`. Not retryable.
    /// HTTP 413 (over gRPC, tonic enforces the limit itself and answers `OUT_OF_RANGE`).
    #[error("payload larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// Neither `application/x-protobuf` nor `application/json`. HTTP 415.
    #[error("unsupported content type {0:?}: send application/x-protobuf or application/json")]
    UnsupportedMediaType(String),
    /// A `Content-Encoding` other than gzip or identity. HTTP 415.
    #[error("unsupported content encoding {0:?}: send gzip or no encoding")]
    UnsupportedEncoding(String),
    /// The ingest queue is full. Retryable: HTTP 503 with `Retry-After`, gRPC `UNAVAILABLE`
    /// with a `RetryInfo` detail. Nothing of the request was kept.
    #[error("ingest queue full, retry later")]
    Overloaded,
    /// The sender's address is not in `--allow-otlp-from`. HTTP 403, gRPC `PERMISSION_DENIED`.
    #[error("source address {0:?} is not allowed to send OTLP here")]
    Forbidden(Option<IpAddr>),
}

impl IngestError {
    /// The stable label (`reason` of `slotlight_sidecar_requests_rejected_total`).
    pub fn label(&self) -> &'static str {
        match self {
            IngestError::Malformed(_) => "malformed",
            IngestError::TooLarge { .. } => "too_large",
            IngestError::UnsupportedMediaType(_) | IngestError::UnsupportedEncoding(_) => {
                "unsupported_media_type"
            }
            IngestError::Overloaded => "overloaded",
            IngestError::Forbidden(_) => "forbidden",
        }
    }

    /// The HTTP status of the OTLP/HTTP answer.
    pub fn http_status(&self) -> StatusCode {
        match self {
            IngestError::Malformed(_) => StatusCode::BAD_REQUEST,
            IngestError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            IngestError::UnsupportedMediaType(_) | IngestError::UnsupportedEncoding(_) => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            IngestError::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            IngestError::Forbidden(_) => StatusCode::FORBIDDEN,
        }
    }

    /// The gRPC code of the OTLP/gRPC answer.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            IngestError::Malformed(_) => tonic::Code::InvalidArgument,
            IngestError::TooLarge { .. } => tonic::Code::ResourceExhausted,
            IngestError::UnsupportedMediaType(_) | IngestError::UnsupportedEncoding(_) => {
                tonic::Code::InvalidArgument
            }
            IngestError::Overloaded => tonic::Code::Unavailable,
            IngestError::Forbidden(_) => tonic::Code::PermissionDenied,
        }
    }

    /// The google.rpc `Code` number used in an OTLP/HTTP error body.
    pub fn rpc_code(&self) -> i32 {
        self.grpc_code() as i32
    }
}

/// Why a view request was refused (`/v1/turns`, `/v1/turns/stream`). The body has the shape
/// of the engine's API errors: `{"error": {"message", "type", "param"}}`, `type` being
/// [`ViewError::label`] and `param` the query parameter at fault (null when unknown).
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// The query string is malformed, or a parameter has the wrong type (`limit=banana`), or a
    /// filter is present with an empty value (`session_id=`, which no turn has). Fix the query;
    /// retrying it unchanged gets the same answer. HTTP 400.
    #[error("{message}")]
    InvalidQuery {
        /// The parameter at fault, when known.
        param: Option<&'static str>,
        /// What is wrong.
        message: String,
    },
    /// The turn store could not answer (a damaged or unreadable file; the log has the
    /// SQLite error). Retrying may help once the file is repaired. HTTP 500.
    #[error("{0}")]
    Store(String),
    /// No such thing (`/v1/sessions/{id}` of a session no turn record names). HTTP 404.
    #[error("{0}")]
    NotFound(String),
}

impl ViewError {
    /// The stable label (`type` in the body).
    pub fn label(&self) -> &'static str {
        match self {
            ViewError::InvalidQuery { .. } => "invalid_query",
            ViewError::Store(_) => "store_unavailable",
            ViewError::NotFound(_) => "not_found",
        }
    }

    /// The HTTP status.
    pub fn http_status(&self) -> StatusCode {
        match self {
            ViewError::InvalidQuery { .. } => StatusCode::BAD_REQUEST,
            ViewError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ViewError::NotFound(_) => StatusCode::NOT_FOUND,
        }
    }

    /// The query parameter at fault, when known.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            ViewError::InvalidQuery { param, .. } => *param,
            ViewError::Store(_) | ViewError::NotFound(_) => None,
        }
    }
}

impl axum::response::IntoResponse for ViewError {
    fn into_response(self) -> axum::response::Response {
        let body = serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": self.label(),
                "param": self.param(),
            }
        });
        (
            self.http_status(),
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    }
}

/// Why one engine span was rejected (label of `slotlight_sidecar_spans_rejected_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanReject {
    /// A required attribute is absent.
    MissingAttribute = 0,
    /// A required attribute has the wrong type or an unknown value.
    InvalidAttribute = 1,
    /// The trace id is not 16 bytes, or all zero.
    InvalidId = 2,
    /// The engine's resource has no `service.instance.id`.
    MissingInstance = 3,
}

impl SpanReject {
    /// Every reason, in label order.
    pub const ALL: [SpanReject; 4] = [
        SpanReject::MissingAttribute,
        SpanReject::InvalidAttribute,
        SpanReject::InvalidId,
        SpanReject::MissingInstance,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            SpanReject::MissingAttribute => "missing_attribute",
            SpanReject::InvalidAttribute => "invalid_attribute",
            SpanReject::InvalidId => "invalid_id",
            SpanReject::MissingInstance => "missing_instance",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_statuses() {
        let cases = [
            (IngestError::Malformed("x".into()), 400, "malformed"),
            (IngestError::TooLarge { limit: 1 }, 413, "too_large"),
            (
                IngestError::UnsupportedMediaType("text/plain".into()),
                415,
                "unsupported_media_type",
            ),
            (
                IngestError::UnsupportedEncoding("br".into()),
                415,
                "unsupported_media_type",
            ),
            (IngestError::Overloaded, 503, "overloaded"),
            (IngestError::Forbidden(None), 403, "forbidden"),
        ];
        for (e, status, label) in cases {
            assert_eq!(e.http_status().as_u16(), status, "{e}");
            assert_eq!(e.label(), label);
        }
        assert_eq!(
            IngestError::Overloaded.grpc_code(),
            tonic::Code::Unavailable
        );
    }

    #[tokio::test]
    async fn view_errors_answer_in_the_api_error_shape() {
        use axum::response::IntoResponse;
        let e = ViewError::InvalidQuery {
            param: Some("session_id"),
            message: "session_id must not be empty".into(),
        };
        let resp = e.into_response();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            resp.headers()[axum::http::header::CONTENT_TYPE],
            "application/json"
        );
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .expect("body");
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["error"]["type"], "invalid_query");
        assert_eq!(v["error"]["param"], "session_id");
        assert_eq!(v["error"]["message"], "session_id must not be empty");
    }
}
