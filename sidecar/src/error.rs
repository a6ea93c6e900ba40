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

/// Why the sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not bind.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// `--forward-otlp` is not a URL this build can send to.
    #[error("--forward-otlp {url:?}: {why}")]
    ForwardUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
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
}
