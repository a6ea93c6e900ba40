//! The sidecar's ingest path after decoding, shared by the OTLP targets: what the receivers
//! and the assembly task do with one export request, then every view rendered.

use slotlight_sidecar::assembly::{Assembler, AssemblyConfig, Outputs};
use slotlight_sidecar::metrics::Metrics;
use slotlight_sidecar::metrics::spanmetrics::SpanBatch;
use slotlight_sidecar::receiver::decode::convert;

/// Small limits, so eviction and the caps are reached by small inputs.
pub fn small_config() -> AssemblyConfig {
    AssemblyConfig {
        max_requests: 8,
        request_ttl_ns: 5_000_000_000,
        legs_wait_ns: 1_000_000_000,
        instance_ttl_ns: 10_000_000_000,
        finished_memory: 16,
        session_idle_ns: 2_000_000_000,
    }
}

/// A wall clock near today's, as the assembly task reads it.
pub const NOW_NS: i64 = 1_750_000_000_000_000_000;

/// One encoded `ExportTraceServiceRequest` through the ingest path: the zero-copy reader and
/// validation (`convert`), the counters and span metrics, the assembly (apply, then ticks
/// that flush waiting records and evict), and every view: `/v1/slots` JSON, turn records as
/// JSON, `/metrics` in both formats.
pub fn ingest(buf: &[u8]) {
    let mut stats = SpanBatch::default();
    let Ok(conv) = convert(buf, &mut stats) else {
        return;
    };
    let metrics = Metrics::new(16);
    metrics.count_accepted(conv.received, conv.ignored, &conv.rejected);
    metrics.merge_spans(stats);
    let mut asm = Assembler::new(small_config());
    let mut out = Outputs::default();
    asm.apply(conv.spans, NOW_NS, &mut out);
    for dt in [0, 2_000_000_000, 20_000_000_000] {
        asm.tick(NOW_NS + dt, &mut out);
    }
    finish(&asm, &mut out, &metrics, NOW_NS + 20_000_000_000);
}

/// Renders every view of the assembly's state and the turns it produced.
pub fn finish(asm: &Assembler, out: &mut Outputs, metrics: &Metrics, now_ns: i64) {
    let snap = asm.snapshot();
    let _ = serde_json::to_vec(&snap.view(now_ns));
    for t in out.turns.drain(..) {
        metrics.observe_turn(&t);
        let _ = serde_json::to_vec(&t);
    }
    let _ = metrics.render(&snap, false);
    let _ = metrics.render(&snap, true);
}
