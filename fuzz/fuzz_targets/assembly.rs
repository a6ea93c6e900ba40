//! The assembly state machine under hostile span sequences: requests whose spans arrive
//! duplicated, out of order, after their request span, for the wrong slot, with inconsistent
//! leg counts and indices, with timestamps anywhere in `i64`, across several instances and
//! with the clock jumping both ways, interleaved with ticks (eviction, legs-wait deadlines).
//! Spans are built directly as validated `EngineSpan`s (the OTLP targets cover decoding), with
//! small id spaces so that collisions are the rule.
//!
//! Checked: nothing panics; the number of requests in flight never passes `max_requests`;
//! each request id yields at most one turn record per instance until it is forgotten; every
//! view and the metrics render.
#![no_main]

use std::collections::HashSet;
use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use slotlight_sidecar::assembly::{Assembler, Outputs};
use slotlight_sidecar::metrics::Metrics;
use slotlight_sidecar::records::spans::{
    Body, DecodeSpan, EngineSpan, LegSpan, Path, PrefillSpan, QueueSpan, RequestSpan, SlotKey,
};
use slotlight_sidecar::records::usage::UsageTiming;

#[derive(Arbitrary, Debug)]
enum Kind {
    Queue,
    Prefill,
    Decode {
        leg_index: i64,
        leg_start: i64,
        carried: i64,
        window: Option<i64>,
        generated: i64,
        last_token: i64,
        request_start: i64,
        first_token: Option<i64>,
        drafts: Option<(i64, i64)>,
    },
    Leg {
        leg_index: i64,
        leg_start: i64,
        carried: Option<i64>,
        generated: Option<i64>,
    },
    Request {
        legs: Option<i64>,
        moved: Option<bool>,
        prefilled: Option<i64>,
        prefill_ms: Option<f64>,
        request_start: Option<i64>,
        first_token: Option<i64>,
        drafts: Option<(i64, i64)>,
    },
}

#[derive(Arbitrary, Debug)]
enum Op {
    Span {
        instance: u8,
        request: u8,
        session: Option<u8>,
        group: i8,
        slot: Option<i8>,
        start: i64,
        end: i64,
        error: bool,
        kind: Kind,
    },
    /// Sidecar clock moves (either way: it is the wall clock), then a tick.
    Tick { ms: i32 },
}

fuzz_target!(|ops: Vec<Op>| {
    let cfg = slotlight_fuzz::sidecar::small_config();
    let max = cfg.max_requests;
    let mut asm = Assembler::new(cfg);
    let metrics = Metrics::new(16);
    let mut out = Outputs::default();
    let mut now = slotlight_fuzz::sidecar::NOW_NS;
    let mut seen: HashSet<(Arc<str>, Arc<str>)> = HashSet::new();
    for op in ops.into_iter().take(512) {
        match op {
            Op::Span {
                instance,
                request,
                session,
                group,
                slot,
                start,
                end,
                error,
                kind,
            } => {
                let key = SlotKey {
                    group: i64::from(group % 3),
                    path: if slot.is_some() {
                        Path::Slot
                    } else {
                        Path::Solo
                    },
                    index: slot.map(i64::from),
                };
                let body = match kind {
                    Kind::Queue => Body::Queue(QueueSpan { key }),
                    Kind::Prefill => Body::Prefill(PrefillSpan::default()),
                    Kind::Decode {
                        leg_index,
                        leg_start,
                        carried,
                        window,
                        generated,
                        last_token,
                        request_start,
                        first_token,
                        drafts,
                    } => Body::Decode(DecodeSpan {
                        key,
                        leg_index: leg_index % 4,
                        leg_start_ns: leg_start,
                        tokens_carried: carried,
                        window_tokens: window,
                        window_steps: None,
                        drafted_tokens: drafts.map(|d| d.0),
                        accepted_tokens: drafts.map(|d| d.1),
                        tokens_generated: generated,
                        last_token_ns: last_token,
                        request_start_ns: request_start,
                        first_token_ns: first_token,
                    }),
                    Kind::Leg {
                        leg_index,
                        leg_start,
                        carried,
                        generated,
                    } => Body::Leg(Box::new(LegSpan {
                        key,
                        leg_index: leg_index % 4,
                        choice: 0,
                        leg_start_ns: leg_start,
                        tokens_carried: carried,
                        tokens_generated: generated,
                        batch_size_max: None,
                        batch_size_mean: None,
                        device_ms: None,
                        drafted_tokens: None,
                        accepted_tokens: None,
                        end_reason: None,
                    })),
                    Kind::Request {
                        legs,
                        moved,
                        prefilled,
                        prefill_ms,
                        request_start,
                        first_token,
                        drafts,
                    } => Body::Request(Box::new(RequestSpan {
                        name: "chat m".into(),
                        legs,
                        moved,
                        usage: UsageTiming {
                            prefilled_tokens: prefilled,
                            prefill_ms,
                            drafted_tokens: drafts.map(|d| d.0),
                            accepted_tokens: drafts.map(|d| d.1),
                            ..UsageTiming::default()
                        },
                        request_start_ns: request_start,
                        first_token_ns: first_token,
                        ..RequestSpan::default()
                    })),
                };
                // Span times come off the wire as u64 and are clamped into i64 >= 0.
                let span = EngineSpan {
                    instance: Arc::from(format!("i{}", instance % 3)),
                    service_version: None,
                    trace_id: [request | 1; 16],
                    start_ns: start.max(0),
                    end_ns: end.max(0),
                    error,
                    request_id: format!("r{}", request % 12).into(),
                    session_id: session.map(|s| format!("s{}", s % 4).into()),
                    body,
                };
                asm.apply(vec![span], now, &mut out);
            }
            Op::Tick { ms } => {
                now = now.saturating_add(i64::from(ms) * 1_000_000);
                asm.tick(now, &mut out);
            }
        }
        assert!(
            asm.in_flight() <= max,
            "{} requests in flight, max {max}",
            asm.in_flight()
        );
        for t in &out.turns {
            // A finished request is remembered (finished_memory = 16 > 12 ids per instance),
            // so a second record for the same id would be a duplicate turn.
            assert!(
                seen.insert((t.instance.clone(), t.request_id.clone())),
                "two turn records for {} on {}",
                t.request_id,
                t.instance
            );
        }
        // An instance the assembly forgot (idle past its TTL) forgets its finished ids too; the
        // same tick may have finished one of its requests first.
        let live: HashSet<Arc<str>> = asm
            .snapshot()
            .instances
            .iter()
            .map(|i| i.instance.clone())
            .collect();
        seen.retain(|(i, _)| live.contains(i));
        slotlight_fuzz::sidecar::finish(&asm, &mut out, &metrics, now);
    }
});
