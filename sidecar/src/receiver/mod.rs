//! OTLP receivers: decode, validate, count, hand over, map errors to a status. No state.
//!
//! Spans feed the views. Metrics (`/v1/metrics`, the gRPC `MetricsService`) are accepted so
//! that one OTLP endpoint serves an engine exporting both signals: they are decoded (a payload
//! that does not decode is refused like a span payload), their data points counted, and the
//! request offered to the forwarder unchanged; no view is built from them.
//!
//! Both transports end in [`Ingest::accept`], which reads the encoded request into typed
//! spans without copying it ([`decode::convert`]), takes room in the bounded ingest queue (counted in
//! spans, so one huge export cannot hold the queue hostage), sends the batch to the assembly
//! task without waiting, updates the counters and span metrics, and offers the request's
//! bytes, unchanged, to the forwarder. A full queue refuses the whole request (retryable), so a sender that retries
//! loses nothing.

pub mod allow;
pub mod decode;
pub mod forward;
pub mod grpc;
pub mod http;
pub mod otlp;
pub mod raw;
pub mod signal;

use std::sync::Arc;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use prost::Message;
use tokio::sync::{Semaphore, mpsc};

use crate::assembly::Batch;
use crate::base::error::IngestError;
use crate::metrics::Metrics;
use crate::metrics::spanmetrics::SpanBatch;
pub use allow::AllowList;
use decode::convert;
use forward::Forwarder;
pub use signal::Signal;

/// The log records of a logs export request.
pub fn log_records(req: &ExportLogsServiceRequest) -> u64 {
    let n: usize = req
        .resource_logs
        .iter()
        .flat_map(|r| &r.scope_logs)
        .map(|s| s.log_records.len())
        .sum();
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The data points of a metrics export request.
pub fn metric_points(req: &ExportMetricsServiceRequest) -> u64 {
    let points = |d: &Option<Data>| match d {
        Some(Data::Gauge(g)) => g.data_points.len(),
        Some(Data::Sum(s)) => s.data_points.len(),
        Some(Data::Histogram(h)) => h.data_points.len(),
        Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
        Some(Data::Summary(s)) => s.data_points.len(),
        None => 0,
    };
    req.resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .map(|m| points(&m.data) as u64)
        .sum()
}

/// The receivers' shared handle.
#[derive(Debug, Clone)]
pub struct Ingest {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::Sender<Batch>,
    room: Arc<Semaphore>,
    max_room: u32,
    metrics: Arc<Metrics>,
    forwarder: Option<Forwarder>,
    allow: AllowList,
    max_body: usize,
}

impl Ingest {
    /// A handle sending to `tx`, with room for `queue_spans` spans in flight.
    pub fn new(
        tx: mpsc::Sender<Batch>,
        queue_spans: usize,
        metrics: Arc<Metrics>,
        forwarder: Option<Forwarder>,
        allow: AllowList,
        max_body: usize,
    ) -> Self {
        let max_room = u32::try_from(queue_spans.clamp(1, 1 << 30)).unwrap_or(1 << 30);
        Ingest {
            inner: Arc::new(Inner {
                tx,
                room: Arc::new(Semaphore::new(max_room as usize)),
                max_room,
                metrics,
                forwarder,
                allow,
                max_body,
            }),
        }
    }

    /// The payload limit after decompression.
    pub fn max_body(&self) -> usize {
        self.inner.max_body
    }

    /// The source filter.
    pub fn allow(&self) -> &AllowList {
        &self.inner.allow
    }

    /// Counts a refused request.
    pub fn reject(&self, e: &IngestError) {
        self.inner.metrics.count_request_rejected(e);
        tracing::debug!(reason = e.label(), error = %e, "Receiver.Rejected");
    }

    /// Accepts one export request, protobuf-encoded (decompressed, within the size limit).
    /// Errors are not counted here: the caller counts them with [`Ingest::reject`].
    pub fn accept(&self, body: Bytes) -> Result<ExportTraceServiceResponse, IngestError> {
        let inner = &*self.inner;
        let mut stats = SpanBatch::default();
        let conv = convert(&body, &mut stats).map_err(|e| IngestError::Malformed(e.to_string()))?;
        if !conv.spans.is_empty() {
            let n = u32::try_from(conv.spans.len())
                .unwrap_or(u32::MAX)
                .min(inner.max_room);
            let overloaded = || {
                inner.metrics.count_dropped(conv.received);
                IngestError::Overloaded
            };
            let permit = inner
                .room
                .clone()
                .try_acquire_many_owned(n)
                .map_err(|_| overloaded())?;
            let slot = inner.tx.try_reserve().map_err(|_| overloaded())?;
            slot.send(Batch {
                spans: conv.spans,
                permit: Some(permit),
            });
        }
        let metrics = &inner.metrics;
        metrics.count_accepted(conv.received, conv.ignored, &conv.rejected);
        metrics.merge_spans(stats);
        if let Some(f) = &inner.forwarder {
            f.offer(Signal::Traces, || body.clone());
        }
        let n_rejected: u64 = conv.rejected.iter().sum();
        Ok(ExportTraceServiceResponse {
            partial_success: (n_rejected > 0).then(|| ExportTracePartialSuccess {
                rejected_spans: i64::try_from(n_rejected).unwrap_or(i64::MAX),
                error_message: format!(
                    "{n_rejected} slotlight-engine span(s) rejected; first: {}",
                    conv.first_rejection.unwrap_or_default()
                ),
            }),
        })
    }
}

impl Ingest {
    /// Accepts one metrics export request, protobuf-encoded: it must decode; its data points
    /// are counted and the request, unchanged, offered to the forwarder.
    pub fn accept_metrics(&self, body: Bytes) -> Result<ExportMetricsServiceResponse, IngestError> {
        let req = ExportMetricsServiceRequest::decode(body.clone())
            .map_err(|e| IngestError::Malformed(e.to_string()))?;
        self.inner.metrics.count_metric_points(metric_points(&req));
        if let Some(f) = &self.inner.forwarder {
            f.offer(Signal::Metrics, || body);
        }
        Ok(ExportMetricsServiceResponse {
            partial_success: None,
        })
    }

    /// Accepts one logs export request, protobuf-encoded: it must decode; its records are
    /// counted and the request, unchanged, offered to the forwarder.
    pub fn accept_logs(&self, body: Bytes) -> Result<ExportLogsServiceResponse, IngestError> {
        let req = ExportLogsServiceRequest::decode(body.clone())
            .map_err(|e| IngestError::Malformed(e.to_string()))?;
        self.inner.metrics.count_log_records(log_records(&req));
        if let Some(f) = &self.inner.forwarder {
            f.offer(Signal::Logs, || body);
        }
        Ok(ExportLogsServiceResponse {
            partial_success: None,
        })
    }

    /// Accepts one export request of `signal`; returns the encoded response.
    pub fn accept_signal(&self, signal: Signal, body: Bytes) -> Result<Response, IngestError> {
        Ok(match signal {
            Signal::Traces => Response::Traces(self.accept(body)?),
            Signal::Metrics => Response::Metrics(self.accept_metrics(body)?),
            Signal::Logs => Response::Logs(self.accept_logs(body)?),
        })
    }
}

/// An export response of either signal.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// To a trace export.
    Traces(ExportTraceServiceResponse),
    /// To a metrics export.
    Metrics(ExportMetricsServiceResponse),
    /// To a logs export.
    Logs(ExportLogsServiceResponse),
}

impl Response {
    /// The protobuf encoding.
    pub fn encode_to_vec(&self) -> Vec<u8> {
        match self {
            Response::Traces(r) => r.encode_to_vec(),
            Response::Metrics(r) => r.encode_to_vec(),
            Response::Logs(r) => r.encode_to_vec(),
        }
    }

    /// The OTLP/JSON encoding.
    pub fn to_json(&self) -> Vec<u8> {
        let r = match self {
            Response::Traces(r) => serde_json::to_vec(r),
            Response::Metrics(r) => serde_json::to_vec(r),
            Response::Logs(r) => serde_json::to_vec(r),
        };
        r.unwrap_or_else(|_| b"{}".to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::synth;

    fn ingest(room: usize) -> (Ingest, mpsc::Receiver<Batch>, Arc<Metrics>) {
        let (tx, rx) = mpsc::channel(8);
        let metrics = Arc::new(Metrics::new(16));
        let i = Ingest::new(
            tx,
            room,
            metrics.clone(),
            None,
            AllowList::default(),
            1 << 20,
        );
        (i, rx, metrics)
    }

    fn three_spans(id: &str) -> Bytes {
        let spans = synth::whole_request(id, 1, 1_000, Some(0), 1, 1);
        Bytes::from(prost::Message::encode_to_vec(&synth::export(
            "e",
            spans[..3].to_vec(),
        )))
    }

    #[test]
    fn full_queue_refuses_whole_requests_until_drained() {
        let (i, mut rx, metrics) = ingest(5);
        i.accept(three_spans("a")).expect("room for 3");
        match i.accept(three_spans("b")) {
            Err(IngestError::Overloaded) => {}
            other => panic!("expected Overloaded, got {other:?}"),
        }
        let batch = rx.try_recv().expect("first batch queued");
        assert_eq!(batch.spans.len(), 3);
        assert!(
            rx.try_recv().is_err(),
            "nothing of the refused request was queued"
        );
        drop(batch); // the assembly applied it: its room comes back
        i.accept(three_spans("b")).expect("room again");
        let text = metrics.render(&Default::default(), false);
        assert!(text.contains(&format!(
            "{} 3\n",
            slotlight_otel::metric::SIDECAR_SPANS_DROPPED
        )));
        assert!(text.contains(&format!(
            "{} 6\n",
            slotlight_otel::metric::SIDECAR_SPANS_RECEIVED
        )));
    }

    #[tokio::test]
    async fn http_overload_is_503_with_retry_after() {
        let (i, _rx, _) = ingest(3);
        i.accept(three_spans("a")).expect("fills the queue");
        let app = http::router(i);
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(
                l,
                app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
            )
            .await;
        });
        let resp = reqwest::Client::new()
            .post(format!("http://{addr}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .body(three_spans("b"))
            .send()
            .await
            .expect("POST");
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()["retry-after"], "1");
        let body = resp.bytes().await.expect("body");
        let st = <tonic_types::Status as prost::Message>::decode(body).expect("Status body");
        assert_eq!(st.code, tonic::Code::Unavailable as i32);
    }

    #[test]
    fn grpc_overload_carries_retry_info() {
        use tonic_types::StatusExt;
        let st = grpc::to_status(&IngestError::Overloaded);
        assert_eq!(st.code(), tonic::Code::Unavailable);
        let info = st.get_details_retry_info().expect("RetryInfo");
        assert_eq!(info.retry_delay, Some(std::time::Duration::from_secs(1)));
        assert_eq!(
            grpc::to_status(&IngestError::Malformed("x".into())).code(),
            tonic::Code::InvalidArgument
        );
    }
}
