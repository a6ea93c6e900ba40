//! `/v1/sessions`: sessions made from their turn records (here from the in-memory ring), their
//! filters and errors, one session's turns in order with the gaps between them, and the session
//! histograms, observed once each session stops being live.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod support;

use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::Value;
use slotlight_otel::attr;
use slotlight_sidecar::tools::synth::{self, Request, Usage};
use support::*;

/// The request span of a finished turn `id` of `session`, from `start` to `start + 400 ms`.
fn turn(id: &str, session: &str, seed: u64, start: i64) -> Span {
    let usage = Usage {
        finish_reason: "stop".into(),
        prompt_tokens: 100,
        cached_tokens: 75,
        prefilled_tokens: 25,
        completion_tokens: 10,
        queue_ms: 100.0,
        prefill_ms: 20.0,
        ttft_ms: 150.0,
        decode_ms: 200.0,
        generation_ms: 250.0,
        decode_tps: Some(40.0),
        e2e_ms: 400.0,
        legs: 0,
        drafts: Some(10),
        drafted_tokens: Some(40),
        accepted_tokens: Some(30),
        ..Usage::default()
    };
    let mut r = Request::new(id, seed, start).with_session(session);
    r.root("small-model", start + 400 * MS, &usage)
}

#[tokio::test]
async fn sessions_are_listed_whole_and_each_one_says_where_its_time_went() {
    // Sessions stop being live at once: the histograms observe them at the next tick.
    let t = TestSidecar::start_with(|c| c.session_idle_s = 0).await;
    let t0 = now_ns() - 10 * S;
    // One export per engine, each applied whole: a session's turns all reach the tracker
    // before it next looks for ended sessions.
    // a2 is a side call under sess-a's key (a branch of its own).
    let mut a2 = turn("a2", "sess-a", 2, t0 + 2 * S);
    a2.attributes.extend([
        synth::kv_bool(attr::SESSION_SIDE_CALL, true),
        synth::kv_int(attr::SESSION_BRANCH, 1),
    ]);
    let a = vec![turn("a1", "sess-a", 1, t0), a2];
    t.send_grpc(synth::export("engine-a", a))
        .await
        .expect("export");
    t.send_grpc(synth::export(
        "engine-b",
        vec![turn("b1", "sess-b", 3, t0 + S)],
    ))
    .await
    .expect("export");
    for id in ["a1", "a2", "b1"] {
        t.wait_turn(id).await;
    }
    // Sessions of one turn are listed when asked (`min_turns=1`); by default only those a
    // later turn continued.
    let all = t
        .wait_for("/v1/sessions?min_turns=1", |v| v["count"] == 2)
        .await;
    let default = t.get_json("/v1/sessions").await;
    assert_eq!(default["count"], 1, "{default}");
    assert_eq!(default["sessions"][0]["session_id"], "sess-a");
    let ids: Vec<&str> = all["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["sess-a", "sess-b"], "latest activity first");
    let a = &all["sessions"][0];
    assert_eq!(a["turns"], 2);
    assert_eq!(a["side_calls"], 1);
    assert_eq!(all["sessions"][1]["side_calls"], 0);
    assert_eq!(
        (a["prompt_tokens"].as_i64(), a["cached_tokens"].as_i64()),
        (Some(200), Some(150))
    );
    assert_eq!(a["cache_hit_ratio"].as_f64(), Some(0.75));
    assert_eq!(
        (a["drafted_tokens"].as_i64(), a["accepted_tokens"].as_i64()),
        (Some(80), Some(60))
    );
    assert_eq!(a["draft_acceptance"].as_f64(), Some(0.75));
    assert_eq!(a["model_s"].as_f64(), Some(0.8));
    assert_eq!(a["queue_s"].as_f64(), Some(0.2));
    assert!((a["prefill_s"].as_f64().unwrap() - 0.1).abs() < 1e-12);
    assert!((a["decode_s"].as_f64().unwrap() - 0.5).abs() < 1e-12);
    assert!((a["client_s"].as_f64().unwrap() - 1.6).abs() < 1e-9, "{a}");
    assert_eq!(a["live"], false);
    assert_eq!(a["instances"], serde_json::json!(["engine-a"]));
    // Filters.
    let only_b = t
        .get_json("/v1/sessions?instance=engine-b&min_turns=1")
        .await;
    assert_eq!(only_b["count"], 1);
    assert_eq!(only_b["sessions"][0]["session_id"], "sess-b");
    assert_eq!(t.get_json("/v1/sessions?live=true").await["count"], 0);
    let page = t.get_json("/v1/sessions?limit=1&min_turns=1").await;
    assert_eq!(page["count"], 1);
    let cursor = page["next_cursor"].as_str().unwrap().to_string();
    let next = t
        .get_json(&format!("/v1/sessions?limit=1&min_turns=1&cursor={cursor}"))
        .await;
    assert_eq!(next["sessions"][0]["session_id"], "sess-b");
    assert!(next["next_cursor"].is_null());
    // One session: its turns in order, each with the gap before it.
    let detail = t.get_json("/v1/sessions/sess-a").await;
    assert_eq!(detail["turns"], 2);
    let turns = detail["turn_records"].as_array().unwrap();
    assert_eq!(turns[0]["request_id"], "a1");
    assert!(turns[0]["gap_before_s"].is_null());
    assert!((turns[1]["gap_before_s"].as_f64().unwrap() - 1.6).abs() < 1e-9);
    assert_eq!(
        (&turns[1]["session_side_call"], &turns[1]["session_branch"]),
        (&Value::Bool(true), &Value::from(1))
    );
    assert!(turns[0]["session_side_call"].is_null());
    assert!(detail["next_cursor"].is_null());
    // Its turn records a page at a time.
    let first = t.get_json("/v1/sessions/sess-a?limit=1").await;
    assert_eq!(first["turns"], 2, "the record is the whole session's");
    assert_eq!(first["turn_records"].as_array().unwrap().len(), 1);
    assert_eq!(first["turn_records"][0]["request_id"], "a1");
    let cursor = first["next_cursor"].as_str().unwrap().to_string();
    let second = t
        .get_json(&format!("/v1/sessions/sess-a?limit=1&cursor={cursor}"))
        .await;
    assert_eq!(second["turn_records"][0]["request_id"], "a2");
    assert!(second["next_cursor"].is_null());
    for bad in [
        "/v1/sessions/sess-a?limit=0",
        "/v1/sessions/sess-a?limit=1001",
        "/v1/sessions/sess-a?cursor=zz",
    ] {
        let (code, body) = t.get(bad).await;
        assert_eq!(code, 400, "{bad}: {body}");
    }
    // Errors in the API's shape.
    let (code, body) = t.get("/v1/sessions/nope").await;
    assert_eq!(code, 404, "{body}");
    let err: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(err["error"]["type"], "not_found");
    for bad in [
        "/v1/sessions?cursor=zz",
        "/v1/sessions?instance=",
        "/v1/sessions?live=maybe",
        "/v1/sessions?limit=1001",
        "/v1/sessions?limit=0",
    ] {
        let (code, body) = t.get(bad).await;
        assert_eq!(code, 400, "{bad}: {body}");
        let err: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(err["error"]["type"], "invalid_query", "{bad}");
    }
    // Each session observed once it ended: two sessions, three turns.
    let mut text = String::new();
    for _ in 0..500 {
        text = t.metrics().await;
        if sample(&text, "slotlight_session_turns_count") == Some(2.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        sample(&text, "slotlight_session_turns_count"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(sample(&text, "slotlight_session_turns_sum"), Some(3.0));
    assert_eq!(
        sample(&text, "slotlight_session_cache_hit_ratio_count"),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, "slotlight_session_client_share_count"),
        Some(1.0),
        "only sessions of two turns or more"
    );
    let share = sample(&text, "slotlight_session_client_share_sum").unwrap();
    assert!((share - 1.6 / 2.4).abs() < 1e-9, "{share}");
}
