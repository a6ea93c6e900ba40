//! OTLP/protobuf export requests, as the gRPC and HTTP receivers hand them to `Ingest::accept`:
//! the zero-copy wire reader, span validation, span metrics, assembly and the views
//! (see `slotlight_fuzz::sidecar::ingest`). Parent span ids of any shape (duplicated, cyclic,
//! missing) ride along in the seeds: the sidecar keys requests by `slotlight.request.id` and
//! never follows parent links, so they must simply not matter.
//!
//! Checked: nothing panics; and the reader agrees with prost: a payload prost decodes is never
//! refused by the reader.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use slotlight_sidecar::metrics::spanmetrics::SpanBatch;
use slotlight_sidecar::receiver::decode::convert;

fuzz_target!(|data: &[u8]| {
    if ExportTraceServiceRequest::decode(data).is_ok() {
        let mut stats = SpanBatch::default();
        if let Err(e) = convert(data, &mut stats) {
            panic!("prost decodes the payload, the zero-copy reader refuses it: {e}");
        }
    }
    slotlight_fuzz::sidecar::ingest(data);
});
