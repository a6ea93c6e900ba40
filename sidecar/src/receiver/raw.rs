//! OTLP/gRPC with pre-encoded bodies: the forwarder sends bytes it already has, and the
//! benchmark's load generator sends batches encoded once, without re-encoding each time.

use bytes::{Buf, BufMut, Bytes};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use super::signal::Signal;

/// A codec whose request is an already encoded `ExportTraceServiceRequest`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

/// Encoder half of [`RawCodec`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RawEncoder;

/// Decoder half of [`RawCodec`]: decodes the export response.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponseDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = RawEncoder;
    type Decoder = ResponseDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ResponseDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for ResponseDecoder {
    type Item = ExportTraceServiceResponse;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        let bytes = src.copy_to_bytes(src.remaining());
        ExportTraceServiceResponse::decode(bytes)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("bad export response: {e}")))
    }
}

/// A gRPC client that exports pre-encoded requests.
#[derive(Debug, Clone)]
pub struct RawExporter {
    grpc: tonic::client::Grpc<Channel>,
    gzip: bool,
}

impl RawExporter {
    /// A client over `channel`; `gzip` compresses each request.
    pub fn new(channel: Channel, gzip: bool) -> Self {
        let mut grpc = tonic::client::Grpc::new(channel);
        if gzip {
            grpc = grpc.send_compressed(tonic::codec::CompressionEncoding::Gzip);
        }
        grpc = grpc
            .max_decoding_message_size(1 << 20)
            .max_encoding_message_size(usize::MAX);
        RawExporter { grpc, gzip }
    }

    /// Whether requests are gzip-compressed.
    pub fn gzip(&self) -> bool {
        self.gzip
    }

    /// Sends one trace export request.
    pub async fn export(
        &mut self,
        body: Bytes,
    ) -> Result<ExportTraceServiceResponse, tonic::Status> {
        self.export_to(Signal::Traces.grpc_method(), body).await
    }

    /// Sends one export request to the method at `path` (a [`Signal::grpc_method`]). The metrics and logs services' responses have the trace response's
    /// wire shape (a partial success of a count and a message, fields 1 and 2), so one
    /// decoder reads both.
    pub async fn export_to(
        &mut self,
        path: &'static str,
        body: Bytes,
    ) -> Result<ExportTraceServiceResponse, tonic::Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("upstream not ready: {e}")))?;
        let path = PathAndQuery::from_static(path);
        self.grpc
            .unary(tonic::Request::new(body), path, RawCodec)
            .await
            .map(tonic::Response::into_inner)
    }
}
