//! Preemption on a KV cache too small for everything admitted, with the tiny synthetic model:
//! a prefill cut by a preemption is recorded (so the prefill records' device time adds up to
//! the request's prefill time), and `decode_tps` counts only decode steps (the token a
//! re-prefill produces is prefill time).
//!
//! Regression tests for issue 12 ("Truthful numbers everywhere"), items 2 and 3.

mod support;

use std::sync::Arc;
use std::time::Duration;

use slotlight_engine::model::loader::Model;
use slotlight_engine::runtime::{self, RuntimeConfig};
use slotlight_engine::sampling::SamplingParams;
use slotlight_engine::scheduler::{
    Completion, EngineHandle, Event, FinishReason, GenerateRequest, SchedulerConfig,
};
use slotlight_engine::timing::{PrefillEnd, PrefillReason, PrefillRecord};
use support::server::tiny_model;

/// An engine with room for `ctx` positions of context and (about) as many in its KV cache.
fn engine(model: &Model, ctx: usize, prefill_chunk: usize, mixed: usize) -> EngineHandle {
    let rc = RuntimeConfig {
        threads: Some(2),
        ctx_size: ctx,
        kv_tokens: ctx,
        block_size: 16,
    };
    let backends =
        runtime::build_backends(model, &runtime::parse_devices("cpu").expect("cpu"), &rc)
            .expect("backend");
    EngineHandle::start(
        backends,
        Arc::clone(&model.tokenizer),
        SchedulerConfig {
            batch: 4,
            max_queue: 16,
            prefill_chunk,
            mixed_prefill_chunk: mixed,
            return_to_solo: true,
            max_sessions: 64,
            session_kv: Default::default(),
        },
    )
}

fn request(id: &str, prompt_len: usize, n: usize) -> GenerateRequest {
    let prompt = (0..prompt_len)
        .map(|i| u32::try_from(40 + i % 50).expect("small"))
        .collect();
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..GenerateRequest::new(id, prompt, n)
    }
}

/// Every event of a request until its completion: its prefill records (as emitted) and the
/// completion.
async fn collect(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> (Vec<PrefillRecord>, Completion) {
    let mut prefills = Vec::new();
    let deadline = Duration::from_secs(120);
    loop {
        let ev = tokio::time::timeout(deadline, rx.recv())
            .await
            .expect("the request finishes")
            .expect("events until the completion");
        match ev {
            Event::Prefilled(p) => prefills.push(p),
            Event::Done(c) => return (prefills, *c),
            _ => {}
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Two requests that together need more KV blocks than there are: the older one, needing a
/// block, preempts the newer one in the middle of its (chunked) prefill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_cut_by_preemption_is_recorded_and_prefill_time_adds_up() {
    let m = tiny_model();
    // 128 positions: 9 blocks. A: 10 prompt + 100 reply (7 blocks at the end). B: 100 prompt
    // (7 blocks at admission), prefilled 2 tokens a step while A decodes.
    // The scenario needs B to arrive while A still decodes: two submits are two commands, and
    // on a loaded machine the loop may finish A (100 tiny steps) in between. Such a run shows
    // no preemption and proves nothing, so it is run again on a fresh engine (at most 5 times).
    let mut attempts = 0;
    let (pb, cb) = loop {
        attempts += 1;
        let e = engine(&m, 128, 16, 2);
        let a = e.submit(request("a", 10, 100)).expect("a");
        let b = e.submit(request("b", 100, 4)).expect("b");
        let ((_, ca), (pb, cb)) = tokio::join!(collect(a), collect(b));
        assert_eq!(ca.finish_reason, FinishReason::Length);
        assert_eq!(cb.finish_reason, FinishReason::Length);
        if pb.iter().any(|p| p.end_reason == PrefillEnd::Preempted) || attempts == 5 {
            break (pb, cb);
        }
    };
    let t = &cb.timings;
    assert!(
        pb.iter().any(|p| p.end_reason == PrefillEnd::Preempted),
        "B's first prefill was cut by the preemption ({attempts} attempts): {pb:?}"
    );
    let last = pb.last().expect("a prefill");
    assert_eq!(
        (last.end_reason, last.reason),
        (PrefillEnd::Finished, PrefillReason::Preempted),
        "B prefilled again after the preemption: {pb:?}"
    );
    assert_eq!(pb, t.prefills, "the emitted records are the request's own");
    let recorded: Duration = pb.iter().map(|p| p.device).sum();
    assert_eq!(
        recorded, t.prefill_device,
        "every prefill step's device time is in exactly one prefill record"
    );
    let usage_prefill = t.usage().prefill_ms.expect("prefill_ms");
    assert!((ms(recorded) - usage_prefill).abs() < 1e-9);
    let computed: usize = pb.iter().map(|p| p.computed_tokens).sum();
    assert_eq!(computed, t.prefilled_tokens);
    let chunks: usize = pb.iter().map(|p| p.chunks).sum();
    assert_eq!(
        u64::try_from(chunks).expect("chunks"),
        t.prefill_steps,
        "every prefill step is a chunk of one record"
    );
}

/// A decoding request preempted and prefilled again gets one token from that re-prefill:
/// `decode_tps` counts the decode steps' tokens over the decode steps' time, so
/// `decode_tps × decode_ms` is the completion tokens minus the tokens prefills produced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_tps_after_a_preemption_counts_decode_steps_only() {
    let m = tiny_model();
    // 80 positions: 6 blocks. A and B: 10 prompt + 60 reply each (5 blocks at the end).
    let e = engine(&m, 80, 256, 32);
    // One request of two choices, so both are queued by one command whatever the timing.
    let mut req = request("ab", 10, 60);
    req.n = 2;
    let mut rxs = e.submit_choices(req).expect("ab").into_iter();
    let (a, b) = (rxs.next().expect("choice 0"), rxs.next().expect("choice 1"));
    let ((_, ca), (pb, cb)) = tokio::join!(collect(a), collect(b));
    assert_eq!(ca.finish_reason, FinishReason::Length);
    assert_eq!(cb.finish_reason, FinishReason::Length);
    let t = &cb.timings;
    let finished_prefills = pb
        .iter()
        .filter(|p| p.end_reason == PrefillEnd::Finished)
        .count();
    assert!(
        finished_prefills >= 2,
        "B was preempted while decoding and prefilled again: {pb:?}"
    );
    let u = t.usage();
    let (tps, decode_ms) = (u.decode_tps.expect("tps"), u.decode_ms.expect("decode"));
    #[allow(clippy::cast_precision_loss)]
    let decode_tokens = (t.generated_tokens - finished_prefills) as f64;
    assert!(
        (tps * decode_ms / 1000.0 - decode_tokens).abs() < 1e-6,
        "decode_tps {tps} over decode_ms {decode_ms} covers {decode_tokens} decode tokens"
    );
    assert_eq!(
        t.decode_steps,
        u64::try_from(t.generated_tokens - finished_prefills).expect("n")
    );
}

/// The group's own metrics under preemption: every preemption, token and finish is counted
/// where it happens (equal to what the requests report), a preempted request waits again (the
/// queue gauge moves on its way back), and once both are done every gauge is back at idle.
///
/// One request of two choices, so that both are queued by one command whatever the timing:
/// the second forks after the first's prefill, both decode, and the cache (6 blocks) cannot
/// hold both replies (5 blocks each), so the newer is preempted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_metrics_count_preemptions_and_return_to_idle() {
    let m = tiny_model();
    let e = engine(&m, 80, 256, 32);
    let metrics = e.group_metrics();
    let idle = metrics[0].snapshot();
    assert_eq!((idle.waiting, idle.kv_blocks_used), (0, 0));
    let mut req = request("ab", 10, 60);
    req.n = 2;
    let mut rxs = e.submit_choices(req).expect("ab").into_iter();
    let (a, b) = (rxs.next().expect("choice 0"), rxs.next().expect("choice 1"));
    let ((_, ca), (pb, cb)) = tokio::join!(collect(a), collect(b));
    assert!(
        pb.iter().any(|p| p.reason == PrefillReason::Preempted),
        "the second choice was preempted and prefilled again: {pb:?}"
    );
    // The loop publishes its gauges at the end of the iteration that sent the completions.
    let mut after = metrics[0].snapshot();
    for _ in 0..1000 {
        if after.running_solo + after.running_slot == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        after = metrics[0].snapshot();
    }
    let (_, stats) = e.snapshot().await;
    assert!(stats[0].preemptions >= 1, "{stats:?}");
    assert_eq!(after.preemptions, stats[0].preemptions);
    assert_eq!(after.step_duration.count, stats[0].steps);
    assert_eq!(after.step_batch.count, stats[0].steps);
    assert_eq!(
        (after.waiting, after.running_solo, after.running_slot),
        (0, 0, 0)
    );
    assert!(after.kv_blocks > 0);
    assert_eq!(
        after.kv_blocks_used, 0,
        "no block is held once both are done"
    );
    assert_eq!(after.kv_usage(), 0.0);
    let generated = ca.timings.generated_tokens + cb.timings.generated_tokens;
    assert_eq!(
        after.generation_tokens,
        u64::try_from(generated).expect("n")
    );
    assert_eq!(
        after.prompt_tokens, 10,
        "the prompt once per request, not per choice nor again after the preemption"
    );
    // Each admission looks its tokens up in the prefix cache, the re-admission included.
    assert!(after.prefix_queried > 20, "{after:?}");
    let length = slotlight_engine::metrics::group::OUTCOMES
        .iter()
        .position(|(f, _)| *f == "length")
        .expect("length");
    assert_eq!(after.finished[length], 2);
    assert_eq!(after.finished.iter().sum::<u64>(), 2);
}
