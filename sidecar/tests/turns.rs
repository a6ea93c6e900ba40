//! `/v1/turns`: records equal the spans they came from; filters; the SSE stream.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod support;

use serde_json::Value;
use slotlight_otel::attr::value;
use slotlight_sidecar::tools::synth::{self, Request, Usage};
use support::*;

/// Sends one finished request with the given usage and returns its record.
async fn finished(
    t: &TestSidecar,
    inst: &str,
    id: &str,
    session: &str,
    seed: u64,
    usage: &Usage,
) -> Value {
    let start = now_ns() - 2 * S;
    let mut r = Request::new(id, seed, start).with_session(session);
    r.first_token_ns = Some(start + 30 * MS);
    r.data_parallel_rank = Some(2);
    let leg = r.leg(0, Some(1), start + 2 * MS, 0);
    let spans = vec![
        r.queue(Some(1), start + 2 * MS),
        r.prefill(
            start + 2 * MS,
            start + 30 * MS,
            usage.prompt_tokens,
            usage.cached_tokens,
        ),
        r.decode(
            &leg,
            start + 30 * MS,
            start + 400 * MS,
            usage.completion_tokens - 1,
            usage.completion_tokens,
        ),
        r.leg_span(&leg, start + 400 * MS, usage.completion_tokens, "finished"),
        r.root("small-model", start + 401 * MS, usage),
    ];
    t.send_grpc(synth::export(inst, spans))
        .await
        .expect("export");
    t.wait_turn(id).await
}

#[tokio::test]
async fn turn_record_equals_the_request_span() {
    let t = TestSidecar::start().await;
    let usage = Usage {
        finish_reason: "length".into(),
        prompt_tokens: 123,
        cached_tokens: 64,
        prefilled_tokens: 59,
        completion_tokens: 17,
        queue_ms: 1.234_567_891,
        prefill_ms: 27.000_000_1,
        ttft_ms: 30.1,
        decode_ms: 333.333_333_333_333_3,
        generation_ms: 370.000_000_000_1,
        decode_tps: Some(48.000_000_000_01),
        e2e_ms: 401.987_654_321,
        legs: 1,
        moved: false,
        error_type: None,
        status: None,
        resume: Some(value::RESUME_EVICTED.into()),
        reusable_tokens: Some(96),
        diverged_at: Some(90),
        evicted_tokens: Some(32),
        speculation: Some(value::SPECULATION_PREDICTION.into()),
        drafts: Some(5),
        drafted_tokens: Some(20),
        accepted_tokens: Some(15),
    };
    let turn = finished(&t, "engine-t", "req-eq", "sess-1", 1, &usage).await;
    // Exactly the attribute values (JSON numbers round-trip f64 exactly).
    assert_eq!(turn["request_id"], "req-eq");
    assert_eq!(turn["session_id"], "sess-1");
    assert_eq!(turn["instance"], "engine-t");
    assert_eq!(
        turn["data_parallel_rank"], 2,
        "the replica's rank, from the request span"
    );
    assert_eq!(turn["model"], "small-model");
    assert_eq!(turn["finish_reason"], "length");
    assert_eq!(turn["status"], "ok");
    assert_eq!(turn["prompt_tokens"], usage.prompt_tokens);
    assert_eq!(turn["cached_tokens"], usage.cached_tokens);
    assert_eq!(turn["prefilled_tokens"], usage.prefilled_tokens);
    assert_eq!(turn["completion_tokens"], usage.completion_tokens);
    assert_eq!(turn["queue_ms"].as_f64(), Some(usage.queue_ms));
    assert_eq!(turn["prefill_ms"].as_f64(), Some(usage.prefill_ms));
    assert_eq!(turn["ttft_ms"].as_f64(), Some(usage.ttft_ms));
    assert_eq!(turn["decode_ms"].as_f64(), Some(usage.decode_ms));
    assert_eq!(turn["generation_ms"].as_f64(), Some(usage.generation_ms));
    assert_eq!(turn["e2e_ms"].as_f64(), Some(usage.e2e_ms));
    assert_eq!(turn["total_ms"].as_f64(), Some(usage.e2e_ms));
    assert_eq!(turn["decode_tps"].as_f64(), usage.decode_tps);
    assert_eq!(
        turn["prefill_tps"].as_f64(),
        Some(usage.prefilled_tokens as f64 / (usage.prefill_ms / 1e3))
    );
    assert_eq!(turn["moved"], false);
    assert_eq!(turn["legs_complete"], true);
    assert_eq!(turn["resume"], value::RESUME_EVICTED);
    assert_eq!(turn["reusable_tokens"], 96);
    assert_eq!(turn["diverged_at"], 90);
    assert_eq!(turn["evicted_tokens"], 32);
    assert_eq!(turn["speculation"], value::SPECULATION_PREDICTION);
    assert_eq!(turn["drafts"], 5);
    assert_eq!(turn["drafted_tokens"], 20);
    assert_eq!(turn["accepted_tokens"], 15);
    let leg = &turn["legs"][0];
    assert_eq!(leg["path"], "slot");
    assert_eq!(leg["slot"], 1);
    assert_eq!(leg["group"], 0);
    assert_eq!(leg["tokens"], usage.completion_tokens);
    assert!((leg["ms"].as_f64().unwrap() - 398.0).abs() < 1e-6);
    let trace = turn["trace_id"].as_str().unwrap();
    assert_eq!(trace.len(), 32);

    // No decode step: decode_tps absent → null.
    let no_decode = Usage {
        completion_tokens: 1,
        decode_tps: None,
        ..Usage::default()
    };
    let turn = finished(&t, "engine-t", "req-one", "sess-1", 2, &no_decode).await;
    assert!(turn["decode_tps"].is_null());
    // An engine that says nothing of drafts: null, not 0.
    assert!(turn["speculation"].is_null() && turn["drafted_tokens"].is_null());

    // A cancelled request from an engine that sends no status: error status and error.type.
    let cancelled = Usage {
        finish_reason: "cancelled".into(),
        error_type: Some("cancelled".into()),
        ..Usage::default()
    };
    let turn = finished(&t, "engine-t", "req-fail", "sess-2", 3, &cancelled).await;
    assert_eq!(turn["status"], "cancelled");
    assert_eq!(turn["error_type"], "cancelled");

    // The engine's own status wins: a request refused by a full queue.
    let refused = Usage {
        finish_reason: "error".into(),
        error_type: Some("overloaded".into()),
        status: Some("refused".into()),
        ..Usage::default()
    };
    let turn = finished(&t, "engine-t", "req-refused", "sess-2", 4, &refused).await;
    assert_eq!(turn["status"], "refused");
    assert_eq!(turn["error_type"], "overloaded");
    // Never admitted: no resume attributes on its span, null in its record (present, not
    // left out).
    for k in ["resume", "reusable_tokens", "diverged_at", "evicted_tokens"] {
        assert_eq!(turn.get(k), Some(&Value::Null), "{k}: {turn}");
    }
}

#[tokio::test]
async fn turns_filter_limit_and_order() {
    let t = TestSidecar::start_with(|c| c.turns = 4).await;
    for i in 0..6u64 {
        let session = if i % 2 == 0 { "even" } else { "odd" };
        finished(
            &t,
            "engine-f",
            &format!("r{i}"),
            session,
            10 + i,
            &Usage::default(),
        )
        .await;
    }
    let all = t.get_json("/v1/turns").await;
    let ids: Vec<&str> = all["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["r5", "r4", "r3", "r2"], "a ring of 4, newest first");
    let even = t.get_json("/v1/turns?session_id=even&limit=1").await;
    assert_eq!(even["count"], 1);
    assert_eq!(even["turns"][0]["request_id"], "r4");
    let (status, _) = t.get("/v1/turns?limit=banana").await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn turns_stream_delivers_new_records() {
    let t = TestSidecar::start().await;
    let mut resp = t
        .http
        .get(t.view_url("/v1/turns/stream?session_id=watched"))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), 200);
    finished(&t, "engine-s", "not-me", "other", 1, &Usage::default()).await;
    finished(&t, "engine-s", "me", "watched", 2, &Usage::default()).await;
    let got = read_sse(&mut resp, "turn", 1).await;
    assert_eq!(got[0]["request_id"], "me");
}

/// Sends one finished request of `session` (its request span alone) that started at
/// `start_ns`, with `resume` as its outcome, and waits for its record.
async fn resumed(
    t: &TestSidecar,
    (id, seed): (&str, u64),
    session: &str,
    start_ns: i64,
    resume: &str,
) -> Value {
    let mut r = Request::new(id, seed, start_ns).with_session(session);
    let usage = Usage {
        legs: 0,
        cached_tokens: 48,
        resume: Some(resume.into()),
        reusable_tokens: Some(50),
        ..Usage::default()
    };
    t.send_grpc(synth::export(
        "engine-r",
        vec![r.root("small-model", start_ns + 100 * MS, &usage)],
    ))
    .await
    .expect("export");
    t.wait_turn(id).await
}

fn request_ids(v: &Value) -> Vec<&str> {
    v["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["request_id"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn a_session_lists_its_turns_oldest_first_with_their_outcomes() {
    let t = TestSidecar::start().await;
    let base = now_ns() - 10 * S;
    // Finished (sent) in the order 2, other, 1, 3; started in the order 1, 2, 3.
    resumed(
        &t,
        ("turn-2", 2),
        "chat-7",
        base + 2 * S,
        value::RESUME_FULL,
    )
    .await;
    resumed(
        &t,
        ("other-1", 4),
        "chat-8",
        base + 2 * S,
        value::RESUME_FIRST,
    )
    .await;
    resumed(&t, ("turn-1", 1), "chat-7", base + S, value::RESUME_FIRST).await;
    resumed(
        &t,
        ("turn-3", 3),
        "chat-7",
        base + 3 * S,
        value::RESUME_DIVERGED,
    )
    .await;

    let v = t.get_json("/v1/turns?session_id=chat-7").await;
    assert_eq!(v["count"], 3);
    assert_eq!(request_ids(&v), ["turn-1", "turn-2", "turn-3"]);
    let outcomes: Vec<(&str, &str)> = v["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["status"].as_str().unwrap(), t["resume"].as_str().unwrap()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("ok", value::RESUME_FIRST),
            ("ok", value::RESUME_FULL),
            ("ok", value::RESUME_DIVERGED)
        ]
    );
    assert_eq!(v["turns"][1]["cached_tokens"], 48);
    assert_eq!(v["turns"][1]["reusable_tokens"], 50);
    // `limit` keeps the session's latest turns, still oldest first.
    let v = t.get_json("/v1/turns?session_id=chat-7&limit=2").await;
    assert_eq!(request_ids(&v), ["turn-2", "turn-3"]);
    // An unknown session is an empty list.
    let (status, body) = t.get("/v1/turns?session_id=nobody").await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["count"], 0);
    assert_eq!(v["turns"], serde_json::json!([]));
    // Without a session: completion order, newest first, as before.
    let v = t.get_json("/v1/turns").await;
    assert_eq!(request_ids(&v), ["turn-3", "turn-1", "other-1", "turn-2"]);
}

#[tokio::test]
async fn a_bad_turns_query_answers_in_the_api_error_shape() {
    let t = TestSidecar::start().await;
    for (path, param) in [
        ("/v1/turns?session_id=", Value::from("session_id")),
        ("/v1/turns?limit=banana", Value::Null),
        ("/v1/turns/stream?session_id=", Value::from("session_id")),
        ("/v1/turns/stream?limit=-1", Value::Null),
        // Pages are bounded: a bigger one is read with `cursor`.
        ("/v1/turns?limit=1001", Value::from("limit")),
        ("/v1/turns?limit=0", Value::from("limit")),
    ] {
        let (status, body) = t.get(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert_eq!(v["error"]["type"], "invalid_query", "{path}: {body}");
        assert_eq!(v["error"]["param"], param, "{path}: {body}");
        assert!(
            !v["error"]["message"].as_str().unwrap().is_empty(),
            "{path}: {body}"
        );
    }
}
