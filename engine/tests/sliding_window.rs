//! Sliding-window KV (issue 21, item 3): the local layers of the tiny Gemma 3 (window set to 16
//! positions, blocks of 4) keep only their window, in a window pool too small for a whole
//! conversation; greedy tokens are bit-identical to a cold run and to every layer kept whole,
//! and `cached_tokens` and the resume outcome say what was really reused, below and beyond
//! the window.

mod support;

use std::sync::Arc;
use std::time::Duration;

use slotlight_engine::backend::Backend;
use slotlight_engine::backend::cpu::CpuBackend;
use slotlight_engine::backend::cpu::pool::ComputePool;
use slotlight_engine::backend::cpu::weights::CpuWeights;
use slotlight_engine::model::loader::Model;
use slotlight_engine::runtime::window_pool_blocks;
use slotlight_engine::sampling::SamplingParams;
use slotlight_engine::scheduler::resume::ResumeOutcome;
use slotlight_engine::scheduler::{
    Completion, EngineHandle, Event, GenerateRequest, SchedulerConfig, SessionWindows,
};
use slotlight_engine::speculation::SpeculationConfig;

const WINDOW: usize = 16;
const BLOCK: usize = 4;
const FULL_BLOCKS: usize = 128;

/// The tiny Gemma 3 (one local layer, one global) with a 16-position window.
fn model() -> Model {
    let path = support::fixtures().join("tiny").join("gemma3.F32.gguf");
    let mut m = Model::load(&path).expect("tiny gemma3");
    let sw = m
        .config
        .family
        .sliding_window
        .as_mut()
        .expect("gemma3 has local layers");
    sw.window = WINDOW;
    m
}

/// One slot, small prefill chunks, and no drafts (the window pool below is sized for plain
/// decoding; `engine/tests/speculation.rs` runs drafts over Gemma 3's window pool).
fn sched() -> SchedulerConfig {
    SchedulerConfig {
        batch: 1,
        max_queue: 16,
        prefill_chunk: 8,
        mixed_prefill_chunk: 4,
        return_to_solo: true,
        max_sessions: 16,
        session_memory_bytes: 256 << 20,
        speculation: SpeculationConfig {
            max_tokens: 0,
            ..SpeculationConfig::off()
        },
        session_kv: Default::default(),
        session_windows: SessionWindows::off(),
    }
}

/// A CPU backend, its local layers windowed (the pool sized for [`sched`]) or whole.
fn backend(m: &Model, windowed: bool) -> CpuBackend {
    let weights = Arc::new(CpuWeights::new(Arc::clone(&m.weights)));
    let window = windowed
        .then(|| window_pool_blocks(&m.config, BLOCK, FULL_BLOCKS, &sched()))
        .flatten();
    CpuBackend::with_layout(
        m.config.clone(),
        weights,
        BLOCK,
        FULL_BLOCKS,
        window,
        Arc::new(ComputePool::new(2)),
    )
}

fn engine(m: &Model, windowed: bool) -> EngineHandle {
    EngineHandle::start(
        vec![Box::new(backend(m, windowed))],
        Arc::clone(&m.tokenizer),
        sched(),
    )
}

async fn run(e: &EngineHandle, prompt: &[u32], n: usize, session: Option<&str>) -> Completion {
    let req = GenerateRequest {
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        session: session.map(str::to_owned),
        ..GenerateRequest::new("r", prompt.to_vec(), n)
    };
    let mut rx = e.submit(req).expect("submit");
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(120), rx.recv())
            .await
            .expect("the request finishes")
            .expect("events until the completion");
        if let Event::Done(c) = ev {
            assert!(
                c.finish_reason.error_type().is_none(),
                "{:?}",
                c.finish_reason
            );
            return *c;
        }
    }
}

/// Tokens of a user's turn: printable ids, different for every turn.
fn user_turn(turn: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| u32::try_from(10 + (turn * 7 + i * 3) % 200).expect("small"))
        .collect()
}

#[test]
fn the_window_pool_is_smaller_than_a_sequence() {
    let m = model();
    let b = backend(&m, true);
    let w = b.windowed_kv().expect("a window pool");
    assert_eq!(w.window, WINDOW);
    // One slot: its window (ceil(15 / 4) + 2 = 6 blocks) and one prefill chunk (2 blocks).
    assert_eq!(w.blocks, 8);
    // Drafts of up to 10 tokens reach 3 blocks further past a decode row.
    let drafting = SchedulerConfig {
        speculation: SpeculationConfig {
            max_tokens: 10,
            ..SpeculationConfig::default()
        },
        ..sched()
    };
    assert_eq!(
        window_pool_blocks(&m.config, BLOCK, FULL_BLOCKS, &drafting),
        Some(8 + 3)
    );
    // The local layer's half of the KV lives there; the full pool keeps the global layer's.
    assert_eq!(w.block_bytes, b.kv_block_bytes());
    assert!(backend(&m, false).windowed_kv().is_none());
    assert_eq!(
        backend(&m, false).kv_block_bytes(),
        2 * b.kv_block_bytes(),
        "every layer whole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_past_the_window_resumes_exactly() {
    let m = model();
    let warm = engine(&m, true);
    let whole = engine(&m, false);
    let mut history: Vec<u32> = Vec::new();
    // (user tokens, reply tokens): the first turn ends within the window, the others go on to
    // about 150 positions, nine times the window, through a window pool of 32 positions.
    let turns = [(6, 5), (9, 12), (20, 30), (13, 40)];
    let mut remembered = 0;
    for (t, &(user, reply)) in turns.iter().enumerate() {
        history.extend(user_turn(t, user));
        let prompt = history.clone();
        let got = run(&warm, &prompt, reply, Some("s")).await;
        let kept = run(&whole, &prompt, reply, Some("s")).await;
        let cold = run(&engine(&m, true), &prompt, reply, None).await;
        let cold_whole = run(&engine(&m, false), &prompt, reply, None).await;
        assert_eq!(got.tokens, cold.tokens, "turn {t}: warm and cold differ");
        assert_eq!(
            got.tokens, kept.tokens,
            "turn {t}: windowed and whole differ"
        );
        assert_eq!(cold.tokens, cold_whole.tokens, "turn {t}: cold runs differ");
        assert_eq!(cold.timings.cached_tokens, 0);
        // What the last turn left computed, within the prompt less its last token: all of it
        // is reused (its whole blocks from the prefix cache, its partly filled last block
        // continued), below the window (turn 1: 10 positions) and beyond it.
        let reachable = remembered.min(prompt.len() - 1);
        assert_eq!(got.timings.cached_tokens, reachable, "turn {t}");
        assert_eq!(kept.timings.cached_tokens, reachable, "turn {t}");
        let resume = got.timings.resume.expect("a session's turn");
        let want = if t == 0 {
            ResumeOutcome::First
        } else {
            ResumeOutcome::Full
        };
        assert_eq!((t, resume.outcome), (t, want));
        assert_eq!(resume.cached_tokens, reachable);
        if t == 1 {
            assert!(
                reachable > 0 && reachable < WINDOW,
                "a reuse within the window"
            );
        }
        if t >= 2 {
            assert!(reachable > WINDOW, "a reuse beyond the window");
        }
        history.extend(&got.tokens);
        remembered = history.len() - 1;
    }
    assert!(history.len() > 8 * WINDOW);
    // Idle: nothing held in either pool by a request (the session's tail, its last turn's
    // partly filled last block, is given back before a request waits); the window pool and
    // bytes are published.
    let g = warm.group_metrics()[0].snapshot();
    assert_eq!((g.kv_blocks_used, g.kv_window_blocks_used), (0, 0));
    assert_eq!((g.kv_blocks, g.kv_window_blocks), (128, 8));
    let b = backend(&m, true);
    let wb = b.windowed_kv().map_or(0, |w| w.block_bytes);
    assert_eq!(g.kv_bytes, (128 * b.kv_block_bytes() + 8 * wb) as u64);
    let h = whole.group_metrics()[0].snapshot();
    assert_eq!((h.kv_blocks, h.kv_window_blocks), (128, 0));
    assert_eq!(
        h.kv_bytes,
        (128 * backend(&m, false).kv_block_bytes()) as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_window_is_recomputed_and_reported() {
    let m = model();
    let warm = engine(&m, true);
    let whole = engine(&m, false);
    let first = user_turn(0, 30);
    let a = run(&warm, &first, 20, Some("s")).await;
    let b = run(&whole, &first, 20, Some("s")).await;
    assert_eq!(a.tokens, b.tokens);
    // Other traffic, long enough to reclaim every window-pool block (8 of them) but leaving
    // the full pool (128) its cached prefix.
    let other = user_turn(5, 60);
    run(&warm, &other, 10, None).await;
    run(&whole, &other, 10, None).await;
    let mut next = first.clone();
    next.extend(&a.tokens);
    next.extend(user_turn(1, 10));
    let got = run(&warm, &next, 15, Some("s")).await;
    let kept = run(&whole, &next, 15, Some("s")).await;
    let cold = run(&engine(&m, true), &next, 15, None).await;
    assert_eq!(got.tokens, cold.tokens, "recomputed exactly");
    assert_eq!(kept.tokens, cold.tokens);
    let computed = first.len() + a.tokens.len() - 1;
    // Kept whole, the prefix is all there; windowed, the blocks the first recomputed row
    // would read were reclaimed, so nothing of it could be resumed, and that is what is said:
    // `window`, the full-attention KV of the whole prefix (to whole blocks) being still there.
    assert_eq!(kept.timings.cached_tokens, computed);
    let w = got.timings.resume.expect("a session's turn");
    assert_eq!(got.timings.cached_tokens, 0);
    assert_eq!(w.outcome, ResumeOutcome::Window);
    assert_eq!(w.evicted_tokens, Some(computed / BLOCK * BLOCK));
    assert_eq!(w.cached_tokens, 0);
}

/// An engine of two slots (its window pool sized for both), its live sessions' KV kept for
/// `ttl`.
fn two_slots(m: &Model, ttl: Duration) -> EngineHandle {
    two_slots_with(m, ttl, SessionWindows::off())
}

/// [`two_slots`], its sessions' windows kept as `windows` says.
fn two_slots_with(m: &Model, ttl: Duration, windows: SessionWindows) -> EngineHandle {
    let cfg = SchedulerConfig {
        batch: 2,
        session_kv: slotlight_engine::scheduler::KeepConfig {
            ttl,
            ..Default::default()
        },
        session_windows: windows,
        ..sched()
    };
    let weights = Arc::new(CpuWeights::new(Arc::clone(&m.weights)));
    let window = window_pool_blocks(&m.config, BLOCK, FULL_BLOCKS, &cfg);
    let backend = CpuBackend::with_layout(
        m.config.clone(),
        weights,
        BLOCK,
        FULL_BLOCKS,
        window,
        Arc::new(ComputePool::new(2)),
    );
    EngineHandle::start(vec![Box::new(backend)], Arc::clone(&m.tokenizer), cfg)
}

/// Session `s`'s turn of prompt `first` (20 tokens generated), then other traffic that, with
/// nothing kept, recycles the window pool's blocks; the turn's completion.
async fn turn_then_traffic(e: &EngineHandle, first: &[u32]) -> Completion {
    let a = run(e, first, 20, Some("s")).await;
    run(e, &user_turn(5, 60), 10, None).await;
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sessions_last_window_outlasts_other_traffic() {
    let m = model();
    let first = user_turn(0, 30);
    let turn = async |e: &EngineHandle| {
        let a = turn_then_traffic(e, &first).await;
        let mut next = first.clone();
        next.extend(&a.tokens);
        next.extend(user_turn(1, 10));
        let got = run(e, &next, 15, Some("s")).await;
        let computed = first.len() + a.tokens.len() - 1;
        (got, computed)
    };
    // Kept: the session's last window is still in the window pool; the turn resumes whole
    // (its partly filled last block continued).
    let (kept, computed) = turn(&two_slots(&m, Duration::from_secs(3600))).await;
    let r = kept.timings.resume.expect("a session's turn");
    assert_eq!(
        (r.outcome, r.cached_tokens),
        (ResumeOutcome::Full, computed)
    );
    // Not kept: the full-attention KV (whole blocks) is there, the window's is not: `window`.
    let (lost, computed) = turn(&two_slots(&m, Duration::ZERO)).await;
    let r = lost.timings.resume.expect("a session's turn");
    assert_eq!(
        (r.outcome, r.evicted_tokens),
        (
            ResumeOutcome::Window,
            Some(computed / BLOCK * BLOCK - r.cached_tokens)
        )
    );
    assert_eq!(kept.tokens, lost.tokens, "the same tokens either way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_departs_inside_the_reply_resumes_from_the_prompts_checkpoint() {
    let m = model();
    let first = user_turn(0, 30);
    let turn = async |e: &EngineHandle| {
        let a = turn_then_traffic(e, &first).await;
        // The client resends the reply changed from its 6th token on.
        let mut next = first.clone();
        next.extend(&a.tokens[..5]);
        next.extend(user_turn(2, 12));
        run(e, &next, 8, Some("s")).await
    };
    // The window before the prompt's end was kept: resumed up to the prompt's last whole block
    // (room for one window beside the running ones: the session's tail holds a block too).
    let one = SessionWindows {
        room: 1,
        ..SessionWindows::off()
    };
    let kept = turn(&two_slots_with(&m, Duration::from_secs(3600), one)).await;
    let r = kept.timings.resume.expect("a session's turn");
    assert_eq!(r.diverged_at, Some(first.len() + 5));
    assert_eq!(r.cached_tokens, first.len() / BLOCK * BLOCK, "{r:?}");
    // Nothing kept: the window layers' blocks were recycled, nothing is resumed.
    let lost = turn(&two_slots_with(&m, Duration::ZERO, one)).await;
    let r = lost.timings.resume.expect("a session's turn");
    assert_eq!((r.outcome, r.cached_tokens), (ResumeOutcome::Window, 0));
    assert_eq!(kept.tokens, lost.tokens, "the same tokens either way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_departs_late_in_a_long_reply_resumes_from_the_checkpoint_before() {
    let m = model();
    let first = user_turn(0, 30);
    let turn = async |e: &EngineHandle| {
        let a = run(e, &first, 80, Some("s")).await;
        // Other traffic, long enough to recycle every window block not kept apart.
        run(e, &user_turn(5, 160), 10, None).await;
        // The client resends the 80-token reply changed from its 51st token on.
        let mut next = first.clone();
        next.extend(&a.tokens[..50]);
        next.extend(user_turn(2, 12));
        let got = run(e, &next, 8, Some("s")).await;
        (next, got)
    };
    // Room for four windows kept apart: the session's last window, its prompt's checkpoint
    // and its latest two checkpoints inside the reply.
    let windows = |every| SessionWindows {
        room: 4,
        checkpoint_every: every,
        reply_checkpoints: 2,
    };
    let hour = Duration::from_secs(3600);
    // Checkpoints 32 and 64 positions into the reply (its window, 16 positions, before the
    // last block boundary there): resumed from the one before the departure, the rest of the
    // reply recomputed.
    let kept = two_slots_with(&m, hour, windows(32));
    let (next, got) = turn(&kept).await;
    // The kept windows are counted (within the pool).
    let g = kept.group_metrics()[0].snapshot();
    assert!(
        g.session_kv_window_blocks > 0 && g.session_kv_window_blocks <= g.kv_window_blocks,
        "{g:?}"
    );
    let r = got.timings.resume.expect("a session's turn");
    assert_eq!(r.diverged_at, Some(first.len() + 50));
    assert_eq!(r.cached_tokens, (first.len() + 32) / BLOCK * BLOCK, "{r:?}");
    // The full-attention KV held the whole common prefix; the window's was checkpointed short
    // of it: `window`, with what that cost.
    let reachable = (first.len() + 50) / BLOCK * BLOCK;
    assert_eq!(
        (r.outcome, r.evicted_tokens),
        (ResumeOutcome::Window, Some(reachable - r.cached_tokens))
    );
    // No checkpoints inside replies: resumed from the prompt's checkpoint only.
    let (_, none) = turn(&two_slots_with(&m, hour, windows(0))).await;
    let n = none.timings.resume.expect("a session's turn");
    assert_eq!(n.cached_tokens, first.len() / BLOCK * BLOCK, "{n:?}");
    assert_eq!(got.tokens, none.tokens, "the same tokens either way");
    let cold = run(&engine(&m, true), &next, 8, None).await;
    assert_eq!(got.tokens, cold.tokens, "recomputed exactly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_pool_too_small_for_the_batch_preempts_and_recomputes_exactly() {
    let m = model();
    // The window pool is sized for one slot (8 blocks); two requests decode at once. Two
    // submits are two commands, and on a loaded machine the loop may finish the first before
    // the second arrives: such a run shows no preemption and proves nothing, so it is run
    // again on a fresh engine (at most 20 times; the first request decodes longer, so that
    // the second arrives while it runs).
    let (p, q) = (user_turn(3, 40), user_turn(4, 36));
    let mut attempts = 0;
    let (a, b, g, two_last) = loop {
        attempts += 1;
        let two = EngineHandle::start(
            vec![Box::new(backend(&m, true))],
            Arc::clone(&m.tokenizer),
            SchedulerConfig {
                batch: 2,
                ..sched()
            },
        );
        let (a, b) = tokio::join!(run(&two, &p, 80, None), run(&two, &q, 40, None));
        let g = two.group_metrics()[0].snapshot();
        if g.preemptions > 0 || attempts == 20 {
            break (a, b, g, two);
        }
    };
    let solo = engine(&m, false);
    assert_eq!(a.tokens, run(&solo, &p, 80, None).await.tokens);
    assert_eq!(b.tokens, run(&solo, &q, 40, None).await.tokens);
    assert!(g.preemptions > 0, "the window pool ran out");
    // The gauges are published by the step loop after the last reply has gone out: read them
    // once it has (bounded wait).
    let mut used = g.kv_window_blocks_used;
    for _ in 0..200 {
        if used == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        used = two_last.group_metrics()[0].snapshot().kv_window_blocks_used;
    }
    assert_eq!(
        used, 0,
        "window blocks still held after both requests ended"
    );
}
