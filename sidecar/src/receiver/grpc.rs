//! OTLP/gRPC: the `TraceService/Export`, `MetricsService/Export` and `LogsService/Export`
//! methods, gzip accepted.
//!
//! The service is written against tonic's server machinery with a pass-through codec, so the
//! request reaches [`Ingest::accept`] as the bytes tonic received (decompressed, within
//! `--max-body-bytes`; a gzip bomb is cut off while inflating) and is read without copying.
//! Answers follow OTLP's retry rules: a message that does not decode is `INVALID_ARGUMENT`, an
//! oversized one `RESOURCE_EXHAUSTED` without `RetryInfo` (both final; tonic's own answer to
//! an oversized message, `OUT_OF_RANGE`, would make exporters retry it, so it is rewritten),
//! and a full ingest queue `UNAVAILABLE` with a `RetryInfo` detail, which exporters retry.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use prost::Message;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::{self, HeaderValue};
use tonic::codegen::{BoxFuture, Context, Poll, Service, StdError};
use tonic::server::NamedService;
use tonic_types::{ErrorDetails, StatusExt};

use super::http::RETRY_AFTER_S;
use super::{Ingest, Response, Signal};
use crate::base::error::IngestError;
use crate::metrics::Metrics;

/// What a gRPC service receives: its signal (whose service and method it serves).
pub trait GrpcSignal: Send + Sync + 'static {
    /// The signal.
    const SIGNAL: Signal;
}

/// Spans: `TraceService`.
#[derive(Debug, Clone, Copy)]
pub struct Traces;

impl GrpcSignal for Traces {
    const SIGNAL: Signal = Signal::Traces;
}

/// Metrics: `MetricsService`.
#[derive(Debug, Clone, Copy)]
pub struct MetricsSignal;

impl GrpcSignal for MetricsSignal {
    const SIGNAL: Signal = Signal::Metrics;
}

/// Log records: `LogsService`.
#[derive(Debug, Clone, Copy)]
pub struct LogsSignal;

impl GrpcSignal for LogsSignal {
    const SIGNAL: Signal = Signal::Logs;
}

/// A gRPC OTLP service of one signal.
#[derive(Debug)]
pub struct Receiver<S> {
    ingest: Ingest,
    metrics: Arc<Metrics>,
    signal: PhantomData<S>,
}

impl<S> Clone for Receiver<S> {
    fn clone(&self) -> Self {
        Receiver {
            ingest: self.ingest.clone(),
            metrics: Arc::clone(&self.metrics),
            signal: PhantomData,
        }
    }
}

/// The gRPC trace service.
pub type GrpcReceiver = Receiver<Traces>;

/// The gRPC metrics service.
pub type GrpcMetricsReceiver = Receiver<MetricsSignal>;

/// The gRPC `LogsService`.
pub type GrpcLogsReceiver = Receiver<LogsSignal>;

impl<S: GrpcSignal> Receiver<S> {
    /// The service, ready for `tonic::transport::Server::add_service`.
    pub fn service(ingest: Ingest, metrics: Arc<Metrics>) -> Self {
        Receiver {
            ingest,
            metrics,
            signal: PhantomData,
        }
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

impl<S: GrpcSignal> NamedService for Receiver<S> {
    const NAME: &'static str = S::SIGNAL.grpc_service();
}

/// Request: the message's bytes as received; response: the export response.
#[derive(Debug, Clone, Copy, Default)]
struct PassThrough;

#[derive(Debug, Clone, Copy, Default)]
struct BytesDecoder;

#[derive(Debug, Clone, Copy, Default)]
struct ResponseEncoder;

impl Codec for PassThrough {
    type Encode = Response;
    type Decode = Bytes;
    type Encoder = ResponseEncoder;
    type Decoder = BytesDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ResponseEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesDecoder
    }
}

impl Decoder for BytesDecoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Encoder for ResponseEncoder {
    type Item = Response;
    type Error = tonic::Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        let r = match &item {
            Response::Traces(r) => r.encode(dst),
            Response::Metrics(r) => r.encode(dst),
            Response::Logs(r) => r.encode(dst),
        };
        r.map_err(|e| tonic::Status::internal(format!("encoding the response: {e}")))
    }
}

/// The unary handler.
#[derive(Debug, Clone)]
struct Export<S>(Receiver<S>);

impl<S: GrpcSignal> tonic::server::UnaryService<Bytes> for Export<S> {
    type Response = Response;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let rx = self.0.clone();
        Box::pin(async move {
            let peer = request.remote_addr().map(|a| a.ip());
            let result = if rx.ingest.allow().allows(peer) {
                rx.ingest.accept_signal(S::SIGNAL, request.into_inner())
            } else {
                Err(IngestError::Forbidden(peer))
            };
            result.map(tonic::Response::new).map_err(|e| {
                rx.ingest.reject(&e);
                to_status(&e)
            })
        })
    }
}

impl<S: GrpcSignal, B> Service<http::Request<B>> for Receiver<S>
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != S::SIGNAL.grpc_method() {
            return Box::pin(async move {
                let mut resp = http::Response::new(tonic::body::Body::default());
                let h = resp.headers_mut();
                h.insert(
                    tonic::Status::GRPC_STATUS,
                    HeaderValue::from(tonic::Code::Unimplemented as i32),
                );
                h.insert(
                    http::header::CONTENT_TYPE,
                    tonic::metadata::GRPC_CONTENT_TYPE,
                );
                Ok(resp)
            });
        }
        let svc = self.clone();
        let limit = svc.ingest.max_body();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(PassThrough)
                .accept_compressed(CompressionEncoding::Gzip)
                .send_compressed(CompressionEncoding::Gzip)
                .max_decoding_message_size(limit);
            let metrics = svc.metrics.clone();
            let mut resp = grpc.unary(Export(svc), req).await;
            rewrite_size_status(resp.headers_mut(), limit, &metrics);
            Ok(resp)
        })
    }
}

/// tonic refuses an oversized message itself (before the handler), as `OUT_OF_RANGE`
/// (declared length) or `RESOURCE_EXHAUSTED` (while inflating); both become a counted,
/// final `RESOURCE_EXHAUSTED`.
fn rewrite_size_status(h: &mut http::HeaderMap, limit: usize, metrics: &Metrics) {
    let code = h
        .get(tonic::Status::GRPC_STATUS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(tonic::Code::from);
    if matches!(
        code,
        Some(tonic::Code::OutOfRange) | Some(tonic::Code::ResourceExhausted)
    ) {
        let message = h
            .get(tonic::Status::GRPC_MESSAGE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if message.contains("too%20large") || message.contains("size%20limit") {
            metrics.count_request_rejected(&IngestError::TooLarge { limit });
            h.insert(
                tonic::Status::GRPC_STATUS,
                HeaderValue::from(tonic::Code::ResourceExhausted as i32),
            );
        }
    }
}
