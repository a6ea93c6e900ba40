//! Deterministic assembly tests: spans are built with [`crate::tools::synth`], validated with
//! [`crate::receiver::decode::convert`], and applied with an explicit clock.

use super::*;
use crate::receiver::decode::convert_request;
use crate::records::slots::RowState;
use crate::records::spans::Path;
use crate::records::turn::TurnStatus;
use crate::tools::synth::{self, Usage};
use opentelemetry_proto::tonic::trace::v1::Span;

const MS: i64 = 1_000_000;
const S: i64 = 1_000_000_000;
const T0: i64 = 1_700_000_000 * S;

fn engine(instance: &str, spans: Vec<Span>) -> Vec<EngineSpan> {
    let c = convert_request(&synth::export(instance, spans)).expect("decodes");
    assert_eq!(c.rejected_total(), 0, "{:?}", c.first_rejection);
    c.spans
}

fn asm() -> Assembler {
    Assembler::new(AssemblyConfig::default())
}

fn row<'a>(snap: &'a SlotsSnapshot, instance: &str, path: Path, index: Option<i64>) -> &'a Row {
    snap.instances
        .iter()
        .find(|i| &*i.instance == instance)
        .and_then(|i| {
            i.rows
                .iter()
                .find(|r| r.key.path == path && r.key.index == index)
        })
        .unwrap_or_else(|| panic!("no row {path:?} {index:?} in {instance}"))
}

/// The reported bug: a request decodes alone at 50 tok/s for 3 s, then moves into slot 0 when
/// a second request arrives. Its elapsed time keeps counting from its own start and its rate
/// stays 50 tok/s (not the whole reply divided by the time in the new leg).
#[test]
fn moved_request_keeps_its_start_and_rate() {
    let mut a = asm();
    let mut out = Outputs::default();
    let mut r = synth::Request::new("req-a", 1, T0);
    let admitted = T0 + 5 * MS;
    let first = admitted + 20 * MS;
    r.first_token_ns = Some(first);
    a.apply(
        engine("e1", vec![r.queue(None, admitted)]),
        T0 + 6 * MS,
        &mut out,
    );
    let snap = a.snapshot();
    assert_eq!(
        row(&snap, "e1", Path::Solo, None).view(T0 + 6 * MS).state,
        RowState::Prefill
    );

    // 3 s alone: windows of 250 ms at 50 tok/s (12.5 tokens each; counted as 1 + 50 t).
    let solo = r.leg(0, None, admitted, 0);
    let mut windows = Vec::new();
    for i in 0..12 {
        let start = first + i * 250 * MS;
        let end = start + 250 * MS;
        let generated = 1 + (end - first) * 50 / S;
        windows.push(r.decode(&solo, start, end, 12, generated));
    }
    let moved_at = first + 3 * S;
    a.apply(engine("e1", windows), moved_at, &mut out);
    let snap = a.snapshot();
    let v = row(&snap, "e1", Path::Solo, None).view(moved_at);
    assert_eq!(v.state, RowState::Decoding);
    assert_eq!(v.tokens_generated, Some(151));
    assert!((v.tok_s.expect("rate") - 50.0).abs() < 1e-9);

    // A second request arrives; the first moves into slot 0 carrying 151 tokens.
    let mut b = synth::Request::new("req-b", 2, moved_at);
    let solo_end = r.leg_span(&solo, moved_at, 151, "moved");
    let slot_leg = r.leg(1, Some(0), moved_at, 151);
    let w = r.decode(&slot_leg, moved_at, moved_at + 100 * MS, 5, 156);
    let now = moved_at + 100 * MS;
    a.apply(
        engine("e1", vec![b.queue(Some(1), moved_at + MS), solo_end, w]),
        now,
        &mut out,
    );
    let snap = a.snapshot();
    assert_eq!(
        row(&snap, "e1", Path::Solo, None).view(now).state,
        RowState::Idle,
        "the solo row is released by the move"
    );
    let v = row(&snap, "e1", Path::Slot, Some(0)).view(now);
    assert_eq!(v.request_id, Some("req-a"));
    assert_eq!(v.state, RowState::Decoding);
    let elapsed = v.elapsed_s.expect("elapsed");
    assert!(
        elapsed >= 3.1,
        "elapsed counts from the request's start: {elapsed}"
    );
    let rate = v.tok_s.expect("rate");
    assert!(
        (rate - 50.0).abs() < 0.5,
        "rate right after the move: {rate}"
    );
    assert!((v.in_slot_s.expect("in slot") - 0.1).abs() < 1e-9);
    assert!((v.leg_tok_s.expect("leg rate") - 50.0).abs() < 1e-9);
    assert_eq!(
        row(&snap, "e1", Path::Slot, Some(1)).view(now).state,
        RowState::Prefill
    );
    // The naive figure other engines show would be 156 tokens / 0.1 s.
    assert!(rate < 100.0);
}

/// A long prefill advances in the view, window by window, with its own rate; it is never
/// shown idle, not even while it re-prefills after a preemption, and a window that arrives
/// after the request finished changes nothing.
#[test]
fn a_prefill_advances_in_the_view_and_is_never_idle() {
    let mut a = asm();
    let mut out = Outputs::default();
    let mut r = synth::Request::new("req-p", 3, T0);
    let admitted = T0 + 5 * MS;
    a.apply(
        engine("e1", vec![r.queue(Some(0), admitted)]),
        admitted,
        &mut out,
    );
    let slot = |a: &Assembler, now| {
        let snap = a.snapshot();
        let v = row(&snap, "e1", Path::Slot, Some(0)).view(now);
        (
            v.state,
            v.prompt_progress.map(|p| (p.total, p.cache, p.processed)),
            v.prefill_tok_s,
            v.tokens_generated,
        )
    };
    assert_eq!(slot(&a, admitted), (RowState::Prefill, None, None, Some(0)));
    // 1,024 positions, 256 cached, computed 256 per 100 ms.
    let start = admitted + MS;
    let mut t = start;
    for (i, processed) in [512, 768].into_iter().enumerate() {
        let w = r.prefill_window(Some(0), start, t, t + 100 * MS, 1024, 256, processed, 256);
        t += 100 * MS;
        a.apply(engine("e1", vec![w]), t, &mut out);
        let (state, progress, rate, _) = slot(&a, t);
        assert_eq!(state, RowState::Prefill);
        assert_eq!(progress, Some((1024, 256, processed)));
        let rate = rate.expect("the prefill's own rate");
        assert!((rate - 2560.0).abs() < 1e-6, "window {i}: {rate}");
    }
    // The first token: decoding, no prefill figures.
    let first = t + 100 * MS;
    r.first_token_ns = Some(first);
    let leg = r.leg(0, Some(0), admitted, 0);
    let w = r.decode(&leg, first, first + 100 * MS, 10, 11);
    a.apply(engine("e1", vec![w]), first + 100 * MS, &mut out);
    let (state, progress, rate, generated) = slot(&a, first + 100 * MS);
    assert_eq!((state, progress, rate), (RowState::Decoding, None, None));
    assert_eq!(generated, Some(11));
    // Preempted: its leg ends, and it re-prefills 1,035 positions in the same slot.
    let cut = first + 200 * MS;
    let leg_end = r.leg_span(&leg, cut, 11, "preempted");
    let w = r.prefill_window(
        Some(0),
        cut + MS,
        cut + MS,
        cut + 51 * MS,
        1035,
        0,
        512,
        512,
    );
    a.apply(engine("e1", vec![leg_end, w]), cut + 51 * MS, &mut out);
    let (state, progress, _, generated) = slot(&a, cut + 51 * MS);
    assert_eq!(state, RowState::Prefill, "a re-prefill is not idle");
    assert_eq!(progress, Some((1035, 0, 512)));
    assert_eq!(
        generated,
        Some(11),
        "the reply so far stays with the request"
    );
    // It finishes; a late window does not bring the row back.
    let end = cut + 200 * MS;
    let root = r.root("m", end, &Usage::default());
    a.apply(engine("e1", vec![root]), end, &mut out);
    let late = r.prefill_window(
        Some(0),
        cut + MS,
        cut + 51 * MS,
        cut + 99 * MS,
        1035,
        0,
        1035,
        523,
    );
    let before = out.late_spans;
    a.apply(engine("e1", vec![late]), end + MS, &mut out);
    assert_eq!(slot(&a, end + MS).0, RowState::Idle);
    assert!(out.late_spans > before, "counted as late");
}

#[test]
fn two_instances_do_not_mix() {
    let mut a = asm();
    let mut out = Outputs::default();
    for (inst, per_window) in [("e1", 10), ("e2", 20)] {
        let spans = synth::whole_request("same-id", 7, T0, Some(0), 2, per_window);
        let n = spans.len();
        // Everything but the leg and the request span: still decoding.
        a.apply(engine(inst, spans[..n - 2].to_vec()), T0 + S, &mut out);
    }
    let snap = a.snapshot();
    assert_eq!(snap.instances.len(), 2);
    let t1 = row(&snap, "e1", Path::Slot, Some(0))
        .occupant
        .as_ref()
        .map(|o| o.tokens_generated);
    let t2 = row(&snap, "e2", Path::Slot, Some(0))
        .occupant
        .as_ref()
        .map(|o| o.tokens_generated);
    assert_eq!((t1, t2), (Some(21), Some(41)));
    assert!(out.turns.is_empty());
}

#[test]
fn root_clears_the_row_and_writes_the_turn() {
    let mut a = asm();
    let mut out = Outputs::default();
    let spans = synth::whole_request("r1", 3, T0, Some(2), 3, 10);
    let n = spans.len();
    a.apply(engine("e1", spans[..n - 1].to_vec()), T0 + S, &mut out);
    assert!(out.turns.is_empty());
    a.apply(engine("e1", spans[n - 1..].to_vec()), T0 + S, &mut out);
    assert_eq!(out.turns.len(), 1);
    let t = &out.turns[0];
    assert_eq!(&*t.request_id, "r1");
    assert_eq!(t.legs.len(), 1);
    assert_eq!(t.legs[0].slot, Some(2));
    assert_eq!(t.usage.completion_tokens, Some(31));
    assert!(t.legs_complete);
    let snap = a.snapshot();
    assert_eq!(
        row(&snap, "e1", Path::Slot, Some(2)).view(T0 + S).state,
        RowState::Idle
    );
    assert_eq!(a.in_flight(), 0);
    // A late window of the finished request does not bring the row back.
    let mut r = synth::Request::new("r1", 3, T0);
    let leg = r.leg(0, Some(2), T0, 0);
    a.apply(
        engine("e1", vec![r.decode(&leg, T0, T0 + MS, 1, 2)]),
        T0 + 2 * S,
        &mut out,
    );
    let snap = a.snapshot();
    assert_eq!(
        row(&snap, "e1", Path::Slot, Some(2)).view(T0).state,
        RowState::Idle
    );
    assert_eq!(a.in_flight(), 0);
}

#[test]
fn root_waits_for_missing_legs_then_gives_up() {
    let mut a = asm();
    let mut out = Outputs::default();
    let mut r = synth::Request::new("r2", 4, T0);
    r.first_token_ns = Some(T0 + 10 * MS);
    let l0 = r.leg(0, None, T0, 0);
    let l1 = r.leg(1, Some(0), T0 + S, 50);
    let usage = Usage {
        legs: 2,
        moved: true,
        ..Usage::default()
    };
    let leg0 = r.leg_span(&l0, T0 + S, 50, "moved");
    let leg1 = r.leg_span(&l1, T0 + 2 * S, 50, "finished");
    let root = r.root("m", T0 + 2 * S, &usage);
    // Root before the second leg: held back.
    a.apply(engine("e1", vec![leg0, root.clone()]), T0 + 2 * S, &mut out);
    assert!(out.turns.is_empty());
    a.apply(engine("e1", vec![leg1]), T0 + 2 * S + MS, &mut out);
    assert_eq!(out.turns.len(), 1);
    assert_eq!(out.turns[0].legs.len(), 2);
    assert!(out.turns[0].moved);

    // Another request whose second leg never comes: written after the wait.
    let mut r = synth::Request::new("r3", 5, T0);
    let l0 = r.leg(0, None, T0, 0);
    let leg0 = r.leg_span(&l0, T0 + S, 50, "moved");
    let root = r.root("m", T0 + 2 * S, &usage);
    out.turns.clear();
    a.apply(engine("e1", vec![leg0, root]), T0 + 3 * S, &mut out);
    a.tick(T0 + 3 * S + MS, &mut out);
    assert!(out.turns.is_empty());
    a.tick(
        T0 + 3 * S + AssemblyConfig::default().legs_wait_ns,
        &mut out,
    );
    assert_eq!(out.turns.len(), 1);
    assert!(!out.turns[0].legs_complete);
    assert_eq!(out.turns[0].legs_expected, Some(2));
}

#[test]
fn later_request_keeps_the_slot_against_late_windows() {
    let mut a = asm();
    let mut out = Outputs::default();
    let mut old = synth::Request::new("old", 8, T0);
    old.first_token_ns = Some(T0 + MS);
    let old_leg = old.leg(0, Some(0), T0, 0);
    let late = old.decode(&old_leg, T0, T0 + 2 * S, 10, 100);
    let mut new = synth::Request::new("new", 9, T0 + 3 * S);
    a.apply(
        engine("e1", vec![new.queue(Some(0), T0 + 3 * S + MS)]),
        T0 + 4 * S,
        &mut out,
    );
    a.apply(engine("e1", vec![late]), T0 + 4 * S, &mut out);
    let snap = a.snapshot();
    let v = row(&snap, "e1", Path::Slot, Some(0)).view(T0 + 4 * S);
    assert_eq!(v.request_id, Some("new"));
}

/// Regression (issue 12, item 8): a decode window that arrives after its own leg's span (the
/// exporter does not keep order) used to put the request back in the row that leg had left.
#[test]
fn a_window_after_its_own_leg_does_not_bring_the_row_back() {
    let mut a = asm();
    let mut out = Outputs::default();
    let mut r = synth::Request::new("r7", 7, T0);
    r.first_token_ns = Some(T0 + 10 * MS);
    let l0 = r.leg(0, Some(0), T0 + 5 * MS, 0);
    a.apply(
        engine("e1", vec![r.queue(Some(0), T0 + 5 * MS)]),
        T0 + S,
        &mut out,
    );
    // The leg ends (the request moved on); its last window comes after its span.
    let leg0 = r.leg_span(&l0, T0 + 2 * S, 40, "moved");
    let late = r.decode(&l0, T0 + S, T0 + 2 * S, 20, 40);
    a.apply(engine("e1", vec![leg0]), T0 + 2 * S, &mut out);
    a.apply(engine("e1", vec![late]), T0 + 2 * S + MS, &mut out);
    let snap = a.snapshot();
    assert_eq!(
        row(&snap, "e1", Path::Slot, Some(0)).view(T0 + 3 * S).state,
        RowState::Idle,
        "the ended leg's row stays empty"
    );
    assert_eq!(out.late_spans, 1, "the late window is counted");
    // A window of the request's next leg is applied as usual.
    let l1 = r.leg(1, Some(1), T0 + 2 * S, 40);
    let w = r.decode(&l1, T0 + 2 * S, T0 + 3 * S, 10, 50);
    a.apply(engine("e1", vec![w]), T0 + 3 * S, &mut out);
    let snap = a.snapshot();
    assert_eq!(
        row(&snap, "e1", Path::Slot, Some(1))
            .view(T0 + 3 * S)
            .request_id,
        Some("r7")
    );
    assert_eq!(out.late_spans, 1);
}

/// Regression (issue 12, item 8): a leg span received twice counted as two legs, so a request
/// span announcing two legs wrote its record before the second one came.
#[test]
fn a_leg_sent_twice_counts_once_toward_the_announced_legs() {
    let mut a = asm();
    let mut out = Outputs::default();
    let mut r = synth::Request::new("r8", 8, T0);
    r.first_token_ns = Some(T0 + 10 * MS);
    let l0 = r.leg(0, None, T0, 0);
    let l1 = r.leg(1, Some(0), T0 + S, 50);
    let usage = Usage {
        legs: 2,
        moved: true,
        ..Usage::default()
    };
    let leg0 = r.leg_span(&l0, T0 + S, 50, "moved");
    let leg1 = r.leg_span(&l1, T0 + 2 * S, 50, "finished");
    let root = r.root("m", T0 + 2 * S, &usage);
    a.apply(
        engine("e1", vec![leg0.clone(), leg0, root]),
        T0 + 2 * S,
        &mut out,
    );
    assert!(out.turns.is_empty(), "one distinct leg of two: wait");
    a.apply(engine("e1", vec![leg1]), T0 + 2 * S + MS, &mut out);
    assert_eq!(out.turns.len(), 1);
    assert_eq!(out.turns[0].legs.len(), 2);
    assert!(out.turns[0].legs_complete);
}

#[test]
fn capacity_and_ttl_evictions_are_counted() {
    let cfg = AssemblyConfig {
        max_requests: 3,
        request_ttl_ns: 10 * S,
        ..AssemblyConfig::default()
    };
    let mut a = Assembler::new(cfg);
    let mut out = Outputs::default();
    for i in 0..5u64 {
        let mut r = synth::Request::new(format!("q{i}"), 100 + i, T0);
        a.apply(engine("e1", vec![r.queue(Some(0), T0 + MS)]), T0, &mut out);
    }
    assert_eq!(out.evicted_capacity, 2);
    assert_eq!(a.in_flight(), 3);
    a.tick(T0 + 5 * S, &mut out);
    assert_eq!(out.evicted_ttl, 0);
    a.tick(T0 + 11 * S, &mut out);
    assert_eq!(out.evicted_ttl, 3);
    assert_eq!(a.in_flight(), 0);
    let snap = a.snapshot();
    assert_eq!(
        row(&snap, "e1", Path::Slot, Some(0)).view(T0).state,
        RowState::Idle
    );
}

#[test]
fn running_counts_admitted_unfinished_requests() {
    let mut a = asm();
    let mut out = Outputs::default();
    let mut r = synth::Request::new("x", 11, T0);
    let mut r2 = synth::Request::new("y", 12, T0);
    a.apply(
        engine(
            "e1",
            vec![r.queue(Some(0), T0 + MS), r2.queue(Some(1), T0 + MS)],
        ),
        T0,
        &mut out,
    );
    assert_eq!(a.snapshot().instances[0].running, 2);
    let usage = Usage {
        legs: 0,
        ..Usage::default()
    };
    a.apply(
        engine("e1", vec![r.root("m", T0 + S, &usage)]),
        T0 + S,
        &mut out,
    );
    assert_eq!(a.snapshot().instances[0].running, 1);
    assert_eq!(out.turns.len(), 1);
}

#[test]
fn rows_and_instances_are_capped() {
    let mut a = asm();
    let mut out = Outputs::default();
    let mut spans = Vec::new();
    for i in 0..(MAX_ROWS as i64 + 10) {
        let mut r = synth::Request::new(format!("q{i}"), 1000 + i as u64, T0);
        spans.push(r.queue(Some(i), T0 + MS));
    }
    a.apply(engine("e1", spans), T0, &mut out);
    assert_eq!(a.snapshot().instances[0].rows.len(), MAX_ROWS);

    // Finished requests leave their instance idle, so newcomers can replace it.
    let usage = Usage {
        legs: 0,
        ..Usage::default()
    };
    for i in 0..(MAX_INSTANCES + 5) {
        let mut r = synth::Request::new("done", 7, T0);
        let span = r.root("m", T0 + MS, &usage);
        a.apply(
            engine(&format!("idle-{i}"), vec![span]),
            T0 + S + i as i64,
            &mut out,
        );
    }
    let snap = a.snapshot();
    assert_eq!(snap.instances.len(), MAX_INSTANCES);
    assert!(
        snap.instances.iter().any(|i| &*i.instance == "e1"),
        "busy instance kept"
    );
    assert!(
        snap.instances.iter().any(|i| &*i.instance == "idle-260"),
        "newest idle instance present"
    );
}

/// Its request span lost (past the engine's export queue bound, say), a request still gets a
/// record of what arrived, marked incomplete, with nothing it did not see.
#[test]
fn a_request_whose_root_span_never_arrives_gets_an_incomplete_record() {
    let cfg = AssemblyConfig {
        request_ttl_ns: 10 * S,
        ..AssemblyConfig::default()
    };
    let mut a = Assembler::new(cfg);
    let mut out = Outputs::default();
    let mut r = synth::Request::new("lost-root", 7, T0);
    r.session_id = Some("sess-9".into());
    let admitted = T0 + 5 * MS;
    let leg = r.leg(0, None, admitted, 0);
    let queue = r.queue(None, admitted);
    let leg_span = r.leg_span(&leg, T0 + S, 12, "finished");
    a.apply(engine("e1", vec![queue, leg_span]), T0 + S, &mut out);
    assert!(out.turns.is_empty(), "waits for its request span");
    a.tick(T0 + 12 * S, &mut out);
    assert_eq!(out.evicted_ttl, 1);
    assert_eq!(out.turns.len(), 1);
    let t = &out.turns[0];
    assert!(!t.complete && !t.legs_complete);
    assert_eq!(t.status, TurnStatus::Unknown);
    assert_eq!(&*t.request_id, "lost-root");
    assert_eq!(t.session_id.as_deref(), Some("sess-9"));
    assert_eq!(t.legs.len(), 1);
    assert_eq!(t.legs[0].tokens, Some(12));
    // The interval its spans covered: arrival (the queue span's start) to the leg's end.
    assert_eq!((t.start_time_unix_nano, t.end_time_unix_nano), (T0, T0 + S));
    // Nothing the request span would have said is guessed.
    assert_eq!(
        (t.usage.completion_tokens, t.usage.prompt_tokens),
        (None, None)
    );
    assert_eq!(
        (t.usage.ttft_ms, t.usage.e2e_ms, t.usage.decode_tps),
        (None, None, None)
    );
    assert_eq!(t.finish_reason, None);
    // Its late request span is not applied twice.
    let root = r.root("m", T0 + S + MS, &Usage::default());
    a.apply(engine("e1", vec![root]), T0 + 13 * S, &mut out);
    assert_eq!(out.turns.len(), 1);
    assert_eq!(out.late_spans, 1);
}

/// A sidecar started while a request runs (a restart) has seen none of its earlier spans: its
/// next decode window alone brings it back, with its own clocks (arrival, first token, tokens
/// so far over every leg), not the sidecar's.
#[test]
fn a_restarted_sidecar_shows_a_running_request_from_its_next_window_with_its_own_clocks() {
    let mut a = asm();
    let mut out = Outputs::default();
    let mut r = synth::Request::new("long-one", 3, T0);
    let admitted = T0 + 10 * MS;
    r.first_token_ns = Some(admitted + 90 * MS);
    // Moved into slot 2 after 4 s; the sidecar (re)starts 20 s in, while it decodes there.
    let leg = r.leg(1, Some(2), T0 + 4 * S, 200);
    let now = T0 + 20 * S;
    let window = r.decode(&leg, now - 250 * MS, now - MS, 12, 1001);
    a.apply(engine("e1", vec![window]), now, &mut out);
    let snap = a.snapshot();
    let v = row(&snap, "e1", Path::Slot, Some(2)).view(now);
    assert_eq!(v.state, RowState::Decoding);
    assert_eq!(v.request_id, Some("long-one"));
    assert_eq!(v.tokens_generated, Some(1001));
    assert_eq!(v.leg_index, Some(1));
    // Elapsed from the request's arrival, rate from its first token: 1000 tokens after the
    // first, in the 19.9 s since it.
    let elapsed = v.elapsed_s.expect("elapsed");
    assert!((elapsed - 20.0).abs() < 1e-6, "{elapsed}");
    let first = (admitted + 90 * MS) as f64;
    let want = 1000.0 / (((now - MS) as f64 - first) / 1e9);
    let tok_s = v.tok_s.expect("rate");
    assert!((tok_s - want).abs() < 1e-6, "{tok_s} vs {want}");
    assert!(v.ttft_ms.is_some_and(|t| (t - 100.0).abs() < 1e-6));
}

/// Speculative decoding in the live view: a request's drafted and accepted tokens are the sums
/// of its decode windows, a window that arrives out of order still counts (without moving the
/// row back), its acceptance is taken over drafted, and its `tok_s` stays its own rate: tokens
/// over its own time, however many of them drafts gave. Its turn record carries the request
/// span's counts and each leg's.
#[test]
fn drafts_sum_over_windows_and_leave_the_rate_alone() {
    use crate::tools::synth::Drafts;
    let mut a = asm();
    let mut out = Outputs::default();
    let mut r = synth::Request::new("spec", 21, T0);
    let admitted = T0 + 5 * MS;
    let first = admitted + 20 * MS;
    r.first_token_ns = Some(first);
    a.apply(
        engine("e1", vec![r.queue(Some(0), admitted)]),
        admitted,
        &mut out,
    );
    let slot = |a: &Assembler, now| {
        let snap = a.snapshot();
        let v = row(&snap, "e1", Path::Slot, Some(0)).view(now);
        (v.drafted_tokens, v.accepted_tokens, v.acceptance, v.tok_s)
    };
    assert_eq!(slot(&a, admitted), (None, None, None, None));
    // Three windows of 1 s, 100 tokens each (4 steps of 25 tokens: drafts of 24 tokens, all
    // taken, then fewer); the second arrives last.
    let leg = r.leg(0, Some(0), admitted, 0);
    let w = |r: &mut synth::Request, i: i64, drafted, accepted| {
        let start = first + i * S;
        r.decode_drafted(
            &leg,
            start,
            start + S,
            100,
            1 + 100 * (i + 1),
            4,
            Drafts { drafted, accepted },
        )
    };
    let (w0, w1, w2) = (
        w(&mut r, 0, 96, 96),
        w(&mut r, 1, 96, 48),
        w(&mut r, 2, 8, 0),
    );
    a.apply(engine("e1", vec![w0]), first + S, &mut out);
    assert_eq!(
        slot(&a, first + S),
        (Some(96), Some(96), Some(1.0), Some(100.0))
    );
    a.apply(engine("e1", vec![w2]), first + 3 * S, &mut out);
    a.apply(engine("e1", vec![w1]), first + 3 * S, &mut out);
    let (drafted, accepted, acceptance, tok_s) = slot(&a, first + 3 * S);
    assert_eq!((drafted, accepted), (Some(200), Some(144)));
    assert_eq!(acceptance, Some(0.72));
    assert_eq!(
        tok_s,
        Some(100.0),
        "300 tokens over the 3 s since the first: the request's own rate"
    );
    let snap = a.snapshot();
    assert_eq!(
        row(&snap, "e1", Path::Slot, Some(0))
            .view(first + 3 * S)
            .tokens_generated,
        Some(301),
        "the late window did not move the row back"
    );
    // It finishes: the turn record carries the request span's counts and the leg's.
    let end = first + 3 * S;
    let leg_span = r.leg_span_drafted(
        &leg,
        end,
        301,
        "finished",
        Drafts {
            drafted: 200,
            accepted: 144,
        },
    );
    let usage = Usage {
        completion_tokens: 301,
        speculation: Some(slotlight_otel::attr::value::SPECULATION_NGRAM.into()),
        drafts: Some(12),
        drafted_tokens: Some(200),
        accepted_tokens: Some(144),
        ..Usage::default()
    };
    let root = r.root("m", end + MS, &usage);
    a.apply(engine("e1", vec![leg_span, root]), end + MS, &mut out);
    assert_eq!(out.turns.len(), 1);
    let t = &out.turns[0];
    assert_eq!(
        t.usage.speculation.as_deref(),
        Some(slotlight_otel::attr::value::SPECULATION_NGRAM)
    );
    assert_eq!(
        (
            t.usage.drafts,
            t.usage.drafted_tokens,
            t.usage.accepted_tokens
        ),
        (Some(12), Some(200), Some(144))
    );
    assert_eq!(
        (t.legs[0].drafted_tokens, t.legs[0].accepted_tokens),
        (Some(200), Some(144))
    );
}
