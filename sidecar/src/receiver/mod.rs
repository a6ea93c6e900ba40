//! OTLP receivers: decode, validate, count, hand over, map errors to a status. No state.
//!
//! Both transports end in [`Ingest::accept`], which converts the request into typed spans
//! ([`crate::assembly::spans::convert`]), takes room in the bounded ingest queue (counted in
//! spans, so one huge export cannot hold the queue hostage), sends the batch to the assembly
//! task without waiting, updates the counters and span metrics, and offers the request to the
//! forwarder. A full queue refuses the whole request (retryable), so a sender that retries
//! loses nothing.

pub mod grpc;
pub mod http;

use std::sync::Arc;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use tokio::sync::{Semaphore, mpsc};

use crate::assembly::Batch;
use crate::assembly::spans::convert;
use crate::error::IngestError;
use crate::forward::Forwarder;
use crate::metrics::Metrics;
use crate::net::AllowList;

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

    /// Counts a refused request (and its spans, when the queue was full).
    pub fn reject(&self, e: &IngestError) {
        self.inner.metrics.count_request_rejected(e);
        tracing::debug!(reason = e.label(), error = %e, "Receiver.Rejected");
    }

    /// Accepts one decoded export request. `raw` is its protobuf encoding when the receiver
    /// already has it (saves re-encoding for the forwarder).
    pub fn accept(
        &self,
        req: ExportTraceServiceRequest,
        raw: Option<Bytes>,
    ) -> Result<ExportTraceServiceResponse, IngestError> {
        let inner = &*self.inner;
        let conv = convert(&req);
        if !conv.spans.is_empty() {
            let n = u32::try_from(conv.spans.len())
                .unwrap_or(u32::MAX)
                .min(inner.max_room);
            let overloaded = |e: IngestError| {
                inner.metrics.count_dropped(conv.received);
                self.reject(&e);
                e
            };
            let permit = inner
                .room
                .clone()
                .try_acquire_many_owned(n)
                .map_err(|_| overloaded(IngestError::Overloaded))?;
            let slot = inner
                .tx
                .try_reserve()
                .map_err(|_| overloaded(IngestError::Overloaded))?;
            let rejected = conv.rejected;
            let (received, ignored) = (conv.received, conv.ignored);
            let msg = conv.first_rejection.clone();
            slot.send(Batch {
                spans: conv.spans,
                permit: Some(permit),
            });
            return Ok(self.finish(req, raw, received, ignored, &rejected, msg));
        }
        let rejected = conv.rejected;
        Ok(self.finish(
            req,
            raw,
            conv.received,
            conv.ignored,
            &rejected,
            conv.first_rejection,
        ))
    }

    fn finish(
        &self,
        req: ExportTraceServiceRequest,
        raw: Option<Bytes>,
        received: u64,
        ignored: u64,
        rejected: &[u64; 4],
        msg: Option<String>,
    ) -> ExportTraceServiceResponse {
        let inner = &*self.inner;
        inner.metrics.count_accepted(received, ignored, rejected);
        inner.metrics.observe_spans(&req);
        if let Some(f) = &inner.forwarder {
            f.offer(|| raw.unwrap_or_else(|| Bytes::from(req.encode_to_vec())));
        }
        let n_rejected: u64 = rejected.iter().sum();
        ExportTraceServiceResponse {
            partial_success: (n_rejected > 0).then(|| ExportTracePartialSuccess {
                rejected_spans: i64::try_from(n_rejected).unwrap_or(i64::MAX),
                error_message: format!(
                    "{n_rejected} slotlight-engine span(s) rejected; first: {}",
                    msg.unwrap_or_default()
                ),
            }),
        }
    }
}
