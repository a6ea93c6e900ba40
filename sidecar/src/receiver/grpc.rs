//! OTLP/gRPC: the `TraceService/Export` method (gzip accepted).
//!
//! tonic enforces `--max-body-bytes` on the decompressed message (`RESOURCE_EXHAUSTED`) and
//! answers a message that does not decode itself; a full ingest queue is `UNAVAILABLE` with a
//! `RetryInfo` detail, which OTLP exporters retry.

use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tonic::codec::CompressionEncoding;
use tonic_types::{ErrorDetails, StatusExt};

use super::Ingest;
use super::http::RETRY_AFTER_S;
use crate::error::IngestError;

/// The gRPC trace service.
#[derive(Debug, Clone)]
pub struct GrpcReceiver {
    ingest: Ingest,
}

impl GrpcReceiver {
    /// The tonic service, with gzip and the size limit set.
    pub fn service(ingest: Ingest) -> TraceServiceServer<GrpcReceiver> {
        let max = ingest.max_body();
        TraceServiceServer::new(GrpcReceiver { ingest })
            .accept_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(max)
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
