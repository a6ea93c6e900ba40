//! OTLP/JSON export requests, as the HTTP receiver reads them: serde into the protobuf types,
//! encoded once, then the same ingest path as protobuf (`slotlight_fuzz::sidecar::ingest`).
//!
//! Checked: nothing panics; a request that parses re-encodes to bytes the reader accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use slotlight_sidecar::metrics::spanmetrics::SpanBatch;
use slotlight_sidecar::receiver::decode::convert;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = serde_json::from_slice::<ExportTraceServiceRequest>(data) else {
        return;
    };
    let buf = req.encode_to_vec();
    let mut stats = SpanBatch::default();
    if let Err(e) = convert(&buf, &mut stats) {
        panic!("a prost-encoded request is refused by the reader: {e}");
    }
    slotlight_fuzz::sidecar::ingest(&buf);
});
