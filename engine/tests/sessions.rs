//! Sessions in the engine, with the tiny synthetic model: a session found from its prompt (a
//! keyless prompt that extends the whole of an earlier turn) and kept apart from one that
//! shares only its beginning; a key's turns counted; live sessions' KV kept against KV
//! pressure (kept within the TTL, `expired` after it, `evicted` without keeping); and, over
//! HTTP, how each key was found, on the request span.
//!
//! Issue 32 ("An agent's session, seen whole and kept warm"), items 1, 2, 4 and 7; issue 39, item 3
//! (a side call under the session's key leaves its main conversation alone).

mod support;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Value as OtelValue;
use opentelemetry_sdk::trace::SpanData;
use serde_json::json;
use slotlight_engine::model::loader::Model;
use slotlight_engine::runtime::{self, RuntimeConfig};
use slotlight_engine::sampling::SamplingParams;
use slotlight_engine::scheduler::{
    Completion, EngineHandle, Event, GenerateRequest, KeepConfig, SchedulerConfig, SessionTurn,
};
use slotlight_engine::speculation::SpeculationConfig;
use slotlight_engine::timing::ResumeOutcome;
use slotlight_otel::{attr, span};
use support::server::{Options, TestServer, tiny_model};

const BLOCK: usize = 16;

/// An engine of 16 KV blocks (256 positions) keeping sessions' KV as `keep` says.
fn engine(model: &Model, keep: KeepConfig) -> EngineHandle {
    let rc = RuntimeConfig {
        threads: Some(2),
        ctx_size: 256,
        kv_tokens: 256,
        block_size: BLOCK,
    };
    let backends =
        runtime::build_backends(model, &runtime::parse_devices("cpu").expect("cpu"), &rc)
            .expect("backend");
    EngineHandle::start(
        backends,
        Arc::clone(&model.tokenizer),
        SchedulerConfig {
            batch: 2,
            max_queue: 16,
            prefill_chunk: 128,
            mixed_prefill_chunk: 16,
            return_to_solo: true,
            max_sessions: 64,
            session_memory_bytes: 256 << 20,
            session_kv: keep,
            speculation: SpeculationConfig::default(),
            session_windows: slotlight_engine::scheduler::SessionWindows::for_batch(2),
        },
    )
}

fn keep(ttl: Duration) -> KeepConfig {
    KeepConfig {
        ttl,
        max_ttl: Duration::from_secs(3600),
        share: 0.5,
    }
}

/// `len` tokens from `start` on (ids 3 to 92: no special token).
fn tokens(start: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| u32::try_from(3 + (start + i * 7) % 90).expect("small"))
        .collect()
}

fn request(id: &str, prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..GenerateRequest::new(id, prompt, max_tokens)
    }
}

/// Submits `req` and waits for its completion; returns it and the turn the engine gave it.
async fn run(e: &EngineHandle, req: GenerateRequest) -> (Completion, Option<SessionTurn>) {
    let s = e.submit_turn(req).expect("submit");
    let mut events = s.events;
    let mut rx = events.pop().expect("one choice");
    while let Some(ev) = rx.recv().await {
        if let Event::Done(c) = ev {
            return (*c, s.session);
        }
    }
    panic!("no completion");
}

fn outcome(c: &Completion) -> ResumeOutcome {
    c.timings.resume.expect("admitted").outcome
}

/// The next turn's prompt: the last prompt, the reply, and `more` new tokens.
fn next_turn(prompt: &[u32], reply: &Completion, more: Vec<u32>) -> Vec<u32> {
    let mut p = prompt.to_vec();
    p.extend(&reply.tokens);
    p.extend(more);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_prompt_that_extends_an_earlier_turn_joins_its_session() {
    let m = tiny_model();
    let e = engine(&m, KeepConfig::default());
    let find = |id: &str, prompt: Vec<u32>| GenerateRequest {
        find_session: true,
        ..request(id, prompt, 8)
    };
    // Turn 0: no key, nothing to find: a provisional session of its own from its arrival
    // (its turn 0), with nothing to resume.
    let p0 = tokens(0, 40);
    let (c0, t0) = run(&e, find("r0", p0.clone())).await;
    let t0 = t0.expect("provisional");
    assert!(t0.found && t0.id.starts_with("found-"), "{t0:?}");
    assert_eq!((t0.index, t0.extends.as_deref()), (0, None));
    assert_eq!(outcome(&c0), ResumeOutcome::None);
    assert_eq!(
        c0.timings.session_kv_ttl, None,
        "no KV kept for a lone turn"
    );
    // Turn 1 resends the history: it joins turn 0's session, as its turn 1.
    let p1 = next_turn(&p0, &c0, tokens(5, 12));
    let (c1, t1) = run(&e, find("r1", p1.clone())).await;
    let t1 = t1.expect("found");
    assert_eq!(t1.id, t0.id, "the provisional session continues");
    assert!(t1.found, "{t1:?}");
    assert_eq!((t1.index, t1.extends.as_deref()), (1, Some("r0")));
    assert_eq!(outcome(&c1), ResumeOutcome::Full);
    // Turn 0's whole blocks (a provisional session keeps nothing of its own, its partly
    // filled last block included, until a later turn extends it).
    let reachable = (p0.len() + c0.tokens.len() - 1) / BLOCK * BLOCK;
    assert_eq!(c1.timings.cached_tokens, reachable);
    // Turn 2: the same session, turn 2, extending nothing named.
    let p2 = next_turn(&p1, &c1, tokens(9, 10));
    let (c2, t2) = run(&e, find("r2", p2)).await;
    let t2 = t2.expect("found");
    assert_eq!(
        (t2.id.as_str(), t2.index, t2.extends),
        (t1.id.as_str(), 2, None)
    );
    assert_eq!(outcome(&c2), ResumeOutcome::Full);
    // Another conversation with the same first block (a shared system prompt) only: a
    // session of its own; it reuses that block as a plain prefix.
    let mut other = p0[..BLOCK].to_vec();
    other.extend(tokens(50, 30));
    let (c3, t3) = run(&e, find("r3", other)).await;
    let t3 = t3.expect("provisional");
    assert!(t3.id != t1.id && t3.index == 0, "{t3:?}");
    assert_eq!(outcome(&c3), ResumeOutcome::Prefix);
    // A request that does not look for its session finds none.
    let p4 = next_turn(&p1, &c1, tokens(11, 6));
    assert_eq!(run(&e, request("r4", p4, 2)).await.1, None);
    let stats = e.session_stats();
    assert_eq!((stats.found, stats.remembered), (1, 1), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_turns_are_counted_in_order() {
    let m = tiny_model();
    let e = engine(&m, KeepConfig::default());
    let mut prompt = tokens(0, 20);
    for (index, more) in (0..3u64).zip([5, 9, 13]) {
        let req = GenerateRequest {
            session: Some("k".into()),
            ..request(&format!("k{index}"), prompt.clone(), 4)
        };
        let (c, t) = run(&e, req).await;
        let t = t.expect("keyed");
        assert_eq!((t.id.as_str(), t.index, t.found), ("k", index, false));
        let want = if index == 0 {
            ResumeOutcome::First
        } else {
            ResumeOutcome::Full
        };
        assert_eq!(outcome(&c), want);
        // The engine keeps the session's KV for the TTL it states.
        assert_eq!(
            c.timings.session_kv_ttl,
            Some(KeepConfig::default().ttl),
            "{index}"
        );
        prompt = next_turn(&prompt, &c, tokens(more, 5));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_call_leaves_the_sessions_last_turn_and_kept_kv_alone() {
    let m = tiny_model();
    let e = engine(&m, keep(Duration::from_secs(3600)));
    let keyed = |id: &str, prompt: Vec<u32>, max| GenerateRequest {
        session: Some("s".into()),
        ..request(id, prompt, max)
    };
    let p0 = tokens(0, 40);
    let (c0, t0) = run(&e, keyed("s0", p0.clone(), 8)).await;
    let t0 = t0.expect("keyed");
    assert_eq!((t0.branch, t0.side_call), (0, false));
    // A side call under the same key, its prompt another conversation: a branch of its own.
    let (side, ts) = run(&e, keyed("side", tokens(500, 150), 8)).await;
    let ts = ts.expect("keyed");
    assert_eq!((ts.index, ts.branch, ts.side_call), (1, 1, true));
    // The session's KV is still the main conversation's, kept for what is left of its TTL.
    let left = side.timings.session_kv_ttl.expect("stated");
    assert!(
        left > Duration::ZERO && left <= Duration::from_secs(3600),
        "{left:?}"
    );
    pressure(&e, "other").await;
    // The next real turn is compared with turn 0, whose KV outlasted the side call and the
    // other traffic.
    let (c1, t1) = run(&e, keyed("s1", next_turn(&p0, &c0, tokens(3, 8)), 4)).await;
    let t1 = t1.expect("keyed");
    assert_eq!((t1.index, t1.branch, t1.side_call), (2, 0, false));
    assert_eq!(outcome(&c1), ResumeOutcome::Full);
    assert_eq!(c1.timings.cached_tokens, p0.len() + c0.tokens.len() - 1);
}

/// Other traffic between two turns of session `s`: two keyless prompts of 150 tokens, each
/// needing 10 of the 16 blocks, so that the least recently used cached blocks (the session's)
/// go first unless kept.
async fn pressure(e: &EngineHandle, tag: &str) {
    for i in 0..2 {
        let (c, _) = run(
            e,
            request(&format!("{tag}-{i}"), tokens(100 + i * 31, 150), 8),
        )
        .await;
        assert!(c.timings.first_token.is_some());
    }
}

/// Turn 1 of session `s`, then other traffic, then turn 2: turn 2's completion.
async fn two_turns_under_pressure(
    e: &EngineHandle,
    before_pressure: impl AsyncFnOnce(),
) -> Completion {
    let p0 = tokens(0, 40);
    let first = GenerateRequest {
        session: Some("s".into()),
        ..request("s0", p0.clone(), 8)
    };
    let (c0, _) = run(e, first).await;
    assert_eq!(outcome(&c0), ResumeOutcome::First);
    before_pressure().await;
    pressure(e, "other").await;
    let second = GenerateRequest {
        session: Some("s".into()),
        ..request("s1", next_turn(&p0, &c0, tokens(3, 8)), 4)
    };
    run(e, second).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sessions_kv_outlasts_other_traffic_within_its_ttl() {
    let m = tiny_model();
    // A TTL no test run reaches: the keeping cannot end during the test.
    let e = engine(&m, keep(Duration::from_secs(3600)));
    let c = two_turns_under_pressure(&e, async || {}).await;
    assert_eq!(outcome(&c), ResumeOutcome::Full);
    // Every position the first turn computed (two whole blocks and its tail of 15).
    assert_eq!(c.timings.cached_tokens, 47);
    let g = e.group_metrics()[0].snapshot().session_kv;
    assert!(g.blocks > 0, "{g:?}");
    assert_eq!((g.expiries, g.evicted_pressure, g.evicted_share), (0, 0, 0));
    // Without keeping, the same traffic reclaims the session's blocks: evicted.
    let off = engine(&m, keep(Duration::ZERO));
    let c = two_turns_under_pressure(&off, async || {}).await;
    let r = c.timings.resume.expect("admitted");
    assert_eq!(
        (r.outcome, r.evicted_tokens),
        (ResumeOutcome::Evicted, Some(32))
    );
    assert_eq!(c.timings.session_kv_ttl, Some(Duration::ZERO));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_after_its_sessions_ttl_that_finds_its_kv_gone_is_expired() {
    let m = tiny_model();
    let e = Arc::new(engine(&m, keep(Duration::from_millis(50))));
    let waiter = Arc::clone(&e);
    let c = two_turns_under_pressure(&e, async move || {
        // Wait for the state (the keeping ended), not for a duration.
        for _ in 0..2000 {
            if waiter.group_metrics()[0].snapshot().session_kv.expiries > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the keeping never expired");
    })
    .await;
    let r = c.timings.resume.expect("admitted");
    assert_eq!(
        (r.outcome, r.evicted_tokens),
        (ResumeOutcome::Expired, Some(32))
    );
    let g = e.group_metrics()[0].snapshot().session_kv;
    assert!(g.expiries >= 1, "{g:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_asks_for_its_sessions_ttl_within_the_bound() {
    let m = tiny_model();
    let e = engine(
        &m,
        KeepConfig {
            ttl: Duration::from_secs(5),
            max_ttl: Duration::from_secs(60),
            share: 0.5,
        },
    );
    for (asked, got) in [(None, 5), (Some(30), 30), (Some(7200), 60)] {
        let req = GenerateRequest {
            session: Some(format!("ttl-{got}")),
            session_ttl: asked.map(Duration::from_secs),
            ..request("t", tokens(0, 20), 2)
        };
        let (c, _) = run(&e, req).await;
        assert_eq!(c.timings.session_kv_ttl, Some(Duration::from_secs(got)));
    }
}

fn attr_of<'a>(s: &'a SpanData, key: &str) -> Option<&'a OtelValue> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn text(s: &SpanData, key: &str) -> Option<String> {
    attr_of(s, key).map(|v| v.as_str().into_owned())
}

/// The request span of response `id`, once exported.
async fn request_span(s: &TestServer, id: &str) -> SpanData {
    for _ in 0..500 {
        if let Some(sp) = s.spans.spans().into_iter().find(|x| {
            span::is_request_span_name(&x.name) && text(x, attr::REQUEST_ID).as_deref() == Some(id)
        }) {
            return sp;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no request span for {id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_span_says_the_session_its_turn_and_how_its_key_was_found() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let msg = json!([{"role": "user", "content": "hi"}]);
    let post = |path: &'static str, body: serde_json::Value, header: Option<&'static str>| {
        let mut r = s.client.post(s.url(path)).json(&body);
        if let Some(h) = header {
            r = r.header("x-session-id", h);
        }
        async move {
            let v: serde_json::Value = r.send().await.expect("send").json().await.expect("json");
            v["id"].as_str().expect("id").to_string()
        }
    };
    let chat = |extra: serde_json::Value| {
        let mut body = json!({"messages": msg, "max_tokens": 2});
        if let (Some(b), Some(x)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(x.clone());
        }
        body
    };
    let cases = [
        (
            post(
                "/v1/chat/completions",
                chat(json!({"user": "u1", "prompt_cache_key": "p1"})),
                Some("h1"),
            )
            .await,
            "h1",
            attr::value::SESSION_SOURCE_HEADER,
            0,
            false,
        ),
        (
            post(
                "/v1/chat/completions",
                chat(json!({"user": "u1", "prompt_cache_key": "p1"})),
                None,
            )
            .await,
            "p1",
            attr::value::SESSION_SOURCE_PROMPT_CACHE_KEY,
            0,
            false,
        ),
        (
            post("/v1/chat/completions", chat(json!({"user": "u1"})), None).await,
            "u1",
            attr::value::SESSION_SOURCE_USER,
            0,
            false,
        ),
        (
            post(
                "/v1/chat/completions",
                chat(json!({"safety_identifier": "u1"})),
                None,
            )
            .await,
            "u1",
            attr::value::SESSION_SOURCE_USER,
            1,
            false,
        ),
        (
            post(
                "/v1/completions",
                json!({"prompt": "hi", "max_tokens": 2, "user": "c1"}),
                None,
            )
            .await,
            "c1",
            attr::value::SESSION_SOURCE_USER,
            0,
            false,
        ),
        (
            post(
                "/v1/completions",
                json!({"prompt": "hi", "max_tokens": 2}),
                Some("h1"),
            )
            .await,
            "h1",
            attr::value::SESSION_SOURCE_HEADER,
            1,
            true,
        ),
    ];
    for (id, session, source, turn, side_call) in cases {
        let sp = request_span(&s, &id).await;
        assert_eq!(
            text(&sp, attr::SESSION_ID).as_deref(),
            Some(session),
            "{id}"
        );
        assert_eq!(
            text(&sp, attr::GEN_AI_CONVERSATION_ID).as_deref(),
            Some(session)
        );
        assert_eq!(
            text(&sp, attr::SESSION_SOURCE).as_deref(),
            Some(source),
            "{id}"
        );
        assert_eq!(
            attr_of(&sp, attr::SESSION_TURN),
            Some(&OtelValue::I64(turn)),
            "{id}"
        );
        assert_eq!(
            attr_of(&sp, attr::SESSION_SIDE_CALL),
            Some(&OtelValue::Bool(side_call)),
            "{id}"
        );
        // A side call's session KV is the main conversation's, kept for what is left of it.
        let ttl_ms = match attr_of(&sp, attr::SESSION_KV_TTL_MS) {
            Some(OtelValue::F64(ms)) => *ms,
            other => panic!("{id}: {other:?}"),
        };
        if side_call {
            assert!(ttl_ms > 0.0 && ttl_ms <= 300_000.0, "{id}: {ttl_ms}");
            assert_eq!(attr_of(&sp, attr::SESSION_BRANCH), Some(&OtelValue::I64(1)));
        } else {
            assert!((ttl_ms - 300_000.0).abs() < f64::EPSILON, "{id}: {ttl_ms}");
            assert_eq!(attr_of(&sp, attr::SESSION_BRANCH), Some(&OtelValue::I64(0)));
        }
        assert_eq!(attr_of(&sp, attr::SESSION_EXTENDS), None);
    }
    // No key, and no earlier turn extended: a provisional session from the first turn on
    // (a later turn that extends it continues the id), keeping no KV yet.
    let id = post("/v1/chat/completions", chat(json!({})), None).await;
    let sp = request_span(&s, &id).await;
    let found = text(&sp, attr::SESSION_ID).expect("a provisional session");
    assert!(found.starts_with("found-"), "{found}");
    assert_eq!(
        text(&sp, attr::SESSION_SOURCE).as_deref(),
        Some(attr::value::SESSION_SOURCE_FOUND)
    );
    assert_eq!(attr_of(&sp, attr::SESSION_TURN), Some(&OtelValue::I64(0)));
    for k in [attr::SESSION_KV_TTL_MS, attr::SESSION_EXTENDS] {
        assert_eq!(attr_of(&sp, k), None, "{k}");
    }
    s.stop().await;
}
