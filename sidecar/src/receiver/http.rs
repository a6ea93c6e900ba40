//! OTLP/HTTP: `POST /v1/traces`, `POST /v1/metrics` and `POST /v1/logs`, protobuf or JSON, optionally gzip, any
//! transfer encoding.
//!
//! Follows the OTLP specification's HTTP rules: the answer uses the request's content type;
//! errors carry a `google.rpc.Status` body (protobuf, or JSON for JSON requests); 400 for a
//! payload that does not decode, 413 over `--max-body-bytes` (checked on the wire and again
//! while inflating, so a gzip bomb is cut off at the limit rather than inflated), 415 for an
//! unknown content type or encoding, 503 + `Retry-After` when the ingest queue is full, and a
//! partial success naming the rejected spans.

use std::io::Read;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

use super::{Ingest, Signal};
use crate::base::error::IngestError;

/// Seconds a sender is asked to wait when the queue is full.
pub const RETRY_AFTER_S: u64 = 1;

const PROTOBUF: &str = "application/x-protobuf";
const JSON: &str = "application/json";

/// The OTLP/HTTP routes.
pub fn router(ingest: Ingest) -> Router {
    Router::new()
        .route(Signal::Traces.http_path(), post(export_traces))
        .route(Signal::Metrics.http_path(), post(export_metrics))
        .route(Signal::Logs.http_path(), post(export_logs))
        .layer(DefaultBodyLimit::disable())
        .with_state(ingest)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    Protobuf,
    Json,
}

fn format_of(headers: &HeaderMap) -> Result<Format, IngestError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match mime.as_str() {
        PROTOBUF | "application/protobuf" => Ok(Format::Protobuf),
        JSON => Ok(Format::Json),
        _ => Err(IngestError::UnsupportedMediaType(ct.to_string())),
    }
}

async fn export_traces(
    State(ingest): State<Ingest>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    export(Signal::Traces, ingest, peer, headers, body).await
}

async fn export_metrics(
    State(ingest): State<Ingest>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    export(Signal::Metrics, ingest, peer, headers, body).await
}

async fn export_logs(
    State(ingest): State<Ingest>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    export(Signal::Logs, ingest, peer, headers, body).await
}

async fn export(
    signal: Signal,
    ingest: Ingest,
    peer: SocketAddr,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let fmt = format_of(&headers);
    let answer_fmt = *fmt.as_ref().unwrap_or(&Format::Protobuf);
    match handle(signal, &ingest, peer, &headers, fmt, body).await {
        Ok(resp) => resp,
        Err(e) => {
            ingest.reject(&e);
            error_response(&e, answer_fmt)
        }
    }
}

async fn handle(
    signal: Signal,
    ingest: &Ingest,
    peer: SocketAddr,
    headers: &HeaderMap,
    fmt: Result<Format, IngestError>,
    body: Body,
) -> Result<Response, IngestError> {
    if !ingest.allow().allows(Some(peer.ip())) {
        return Err(IngestError::Forbidden(Some(peer.ip())));
    }
    let fmt = fmt?;
    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
    {
        None => false,
        Some(e) if e.is_empty() || e == "identity" => false,
        Some(e) if e == "gzip" || e == "x-gzip" => true,
        Some(e) => return Err(IngestError::UnsupportedEncoding(e)),
    };
    let limit = ingest.max_body();
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(IngestError::TooLarge { limit });
    }
    let wire = read_capped(body, limit).await?;
    let payload = if gzip {
        Bytes::from(gunzip_capped(&wire, limit)?)
    } else {
        wire
    };
    let proto = match fmt {
        Format::Protobuf => payload,
        Format::Json => {
            // JSON is the slow path: decoded into owned messages, then encoded once so that
            // both formats share the zero-copy reader (and the forwarder sends protobuf).
            let malformed = |e: serde_json::Error| IngestError::Malformed(format!("JSON: {e}"));
            Bytes::from(match signal {
                Signal::Traces => serde_json::from_slice::<ExportTraceServiceRequest>(&payload)
                    .map_err(malformed)?
                    .encode_to_vec(),
                Signal::Metrics => serde_json::from_slice::<ExportMetricsServiceRequest>(&payload)
                    .map_err(malformed)?
                    .encode_to_vec(),
                Signal::Logs => serde_json::from_slice::<ExportLogsServiceRequest>(&payload)
                    .map_err(malformed)?
                    .encode_to_vec(),
            })
        }
    };
    let resp = ingest.accept_signal(signal, proto)?;
    Ok(match fmt {
        Format::Protobuf => {
            ([(header::CONTENT_TYPE, PROTOBUF)], resp.encode_to_vec()).into_response()
        }
        Format::Json => ([(header::CONTENT_TYPE, JSON)], resp.to_json()).into_response(),
    })
}

/// Reads a body of any transfer encoding, refusing it as soon as it passes `limit` bytes.
pub async fn read_capped(body: Body, limit: usize) -> Result<Bytes, IngestError> {
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| IngestError::Malformed(format!("reading body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(IngestError::TooLarge { limit });
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// Inflates gzip, stopping at `limit` bytes of output (a bomb costs at most `limit`).
pub fn gunzip_capped(data: &[u8], limit: usize) -> Result<Vec<u8>, IngestError> {
    let mut out = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    flate2::read::MultiGzDecoder::new(data)
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|e| IngestError::Malformed(format!("gzip: {e}")))?;
    if out.len() > limit {
        return Err(IngestError::TooLarge { limit });
    }
    Ok(out)
}

/// The `google.rpc.Status` answer for an error, in the request's format.
fn error_response(e: &IngestError, fmt: Format) -> Response {
    let status = e.http_status();
    let message = e.to_string();
    let mut resp = match fmt {
        Format::Protobuf => {
            let body = tonic_types::Status {
                code: e.rpc_code(),
                message,
                details: Vec::new(),
            }
            .encode_to_vec();
            (status, [(header::CONTENT_TYPE, PROTOBUF)], body).into_response()
        }
        Format::Json => {
            let body = serde_json::json!({ "code": e.rpc_code(), "message": message });
            (status, [(header::CONTENT_TYPE, JSON)], body.to_string()).into_response()
        }
    };
    if matches!(e, IngestError::Overloaded) {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
    }
    debug_assert!(status != StatusCode::OK);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).expect("gzip");
        e.finish().expect("gzip")
    }

    #[test]
    fn gzip_bomb_is_cut_off() {
        let bomb = gz(&vec![0u8; 8 << 20]);
        assert!(bomb.len() < 64 << 10);
        match gunzip_capped(&bomb, 1 << 20) {
            Err(IngestError::TooLarge { limit }) => assert_eq!(limit, 1 << 20),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert_eq!(gunzip_capped(&gz(b"hello"), 5).expect("fits"), b"hello");
        assert!(matches!(
            gunzip_capped(b"not gzip", 100),
            Err(IngestError::Malformed(_))
        ));
    }

    #[test]
    fn content_types() {
        let mut h = HeaderMap::new();
        assert!(matches!(
            format_of(&h),
            Err(IngestError::UnsupportedMediaType(_))
        ));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        assert_eq!(format_of(&h).expect("json"), Format::Json);
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("Application/X-Protobuf"),
        );
        assert_eq!(format_of(&h).expect("proto"), Format::Protobuf);
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert!(format_of(&h).is_err());
    }
}
