//! OTLP/gRPC: the `TraceService/Export` method (gzip accepted).
//!
//! tonic enforces `--max-body-bytes` (a gzip bomb is cut off while inflating) and decodes the
//! message before the handler runs; [`OtlpStatus`] rewrites its answers to the codes OTLP
//! exporters treat as final: an oversized message is `RESOURCE_EXHAUSTED` without `RetryInfo`
//! (tonic says `OUT_OF_RANGE`, which OTLP retries) and one that does not decode is
//! `INVALID_ARGUMENT` (tonic says `INTERNAL`). A full ingest queue is `UNAVAILABLE` with a
//! `RetryInfo` detail, which exporters retry.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tonic::codec::CompressionEncoding;
use tonic::codegen::http::{self, HeaderValue};
use tonic::codegen::{BoxFuture, Context, Poll, Service};
use tonic::server::NamedService;
use tonic_types::{ErrorDetails, StatusExt};

use super::Ingest;
use super::http::RETRY_AFTER_S;
use crate::error::IngestError;
use crate::metrics::Metrics;

/// The gRPC trace service.
#[derive(Debug, Clone)]
pub struct GrpcReceiver {
    ingest: Ingest,
}

impl GrpcReceiver {
    /// The tonic service, with gzip and the size limit set.
    pub fn service(
        ingest: Ingest,
        metrics: Arc<Metrics>,
    ) -> OtlpStatus<TraceServiceServer<GrpcReceiver>> {
        let max = ingest.max_body();
        let inner = TraceServiceServer::new(GrpcReceiver { ingest })
            .accept_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(max);
        OtlpStatus {
            inner,
            metrics,
            limit: max,
        }
    }
}

/// Rewrites tonic's own decode errors to OTLP's non-retryable codes (see the module doc) and
/// counts them.
#[derive(Debug, Clone)]
pub struct OtlpStatus<S> {
    inner: S,
    metrics: Arc<Metrics>,
    limit: usize,
}

impl<S: NamedService> NamedService for OtlpStatus<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for OtlpStatus<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let fut = self.inner.call(req);
        let metrics = self.metrics.clone();
        let limit = self.limit;
        Box::pin(async move {
            let mut resp = fut.await?;
            let h = resp.headers_mut();
            let code = h
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok());
            let message = h
                .get("grpc-message")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_ascii_lowercase();
            let rewrite = match code.map(tonic::Code::from) {
                Some(tonic::Code::OutOfRange) | Some(tonic::Code::ResourceExhausted)
                    if message.contains("too%20large") || message.contains("size%20limit") =>
                {
                    Some(IngestError::TooLarge { limit })
                }
                Some(tonic::Code::Internal) if message.contains("decod") => Some(
                    IngestError::Malformed("the protobuf message does not decode".into()),
                ),
                _ => None,
            };
            if let Some(e) = rewrite {
                metrics.count_request_rejected(&e);
                let code = match e {
                    IngestError::TooLarge { .. } => tonic::Code::ResourceExhausted,
                    _ => tonic::Code::InvalidArgument,
                };
                h.insert("grpc-status", HeaderValue::from(code as i32));
            }
            Ok(resp)
        })
    }
}

/// The gRPC status for an ingest error.
pub fn to_status(e: &IngestError) -> tonic::Status {
    match e {
        IngestError::Overloaded => tonic::Status::with_error_details(
            e.grpc_code(),
            e.to_string(),
            ErrorDetails::with_retry_info(Some(Duration::from_secs(RETRY_AFTER_S))),
        ),
        _ => tonic::Status::new(e.grpc_code(), e.to_string()),
    }
}

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let peer = request.remote_addr().map(|a| a.ip());
        if !self.ingest.allow().allows(peer) {
            let e = IngestError::Forbidden(peer);
            self.ingest.reject(&e);
            return Err(to_status(&e));
        }
        self.ingest
            .accept(request.into_inner(), None)
            .map(tonic::Response::new)
            .map_err(|e| to_status(&e))
    }
}
