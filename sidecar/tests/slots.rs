//! `/v1/slots` end to end over OTLP: the move scenario users reported on other engines,
//! states, two engine instances, and the SSE stream.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod support;

use slotlight_sidecar::tools::synth::{self, Request, Usage};
use support::*;

/// A request decodes alone at 50 tok/s for 3 s (synthetic windows, no sleeping), then moves
/// into slot 0 when a second request arrives. Its row's `elapsed_s` keeps counting from the
/// request's own start and its `tok_s` stays near 50 right after the move; the naive figure
/// (whole reply over time in the new leg) would be hundreds.
#[tokio::test]
async fn moved_request_keeps_elapsed_and_rate() {
    let t = TestSidecar::start().await;
    let inst = "engine-move";
    let start = now_ns() - 3_300 * MS;
    let admitted = start + 10 * MS;
    let first = admitted + 90 * MS;
    let mut a = Request::new("req-a", 1, start).with_session("sess-a");
    a.first_token_ns = Some(first);

    t.send_grpc(synth::export(inst, vec![a.queue(None, admitted)]))
        .await
        .expect("export");
    let row = t
        .wait_row(inst, "solo", None, |r| r["state"] == "prefill")
        .await;
    assert_eq!(row["request_id"], "req-a");
    assert_eq!(row["session_id"], "sess-a");

    // 3 s on the solo path, 250 ms windows at 50 tok/s.
    let solo = a.leg(0, None, admitted, 0);
    let mut windows = Vec::new();
    let mut generated = 1;
    for i in 0..12 {
        let w0 = first + i * 250 * MS;
        windows.push(a.decode(&solo, w0, w0 + 250 * MS, 12, {
            generated = 1 + (i + 1) * 25 / 2;
            generated
        }));
    }
    t.send_grpc(synth::export(inst, windows))
        .await
        .expect("export");
    let row = t
        .wait_row(inst, "solo", None, |r| r["tokens_generated"] == generated)
        .await;
    assert_eq!(row["state"], "decoding");
    let solo_rate = row["tok_s"].as_f64().unwrap();
    assert!((solo_rate - 50.0).abs() < 0.5, "solo rate {solo_rate}");

    // A second request arrives; the first moves into slot 0 and decodes 100 ms more there.
    let moved_at = first + 3 * S;
    let mut b = Request::new("req-b", 2, moved_at - 5 * MS);
    let solo_span = a.leg_span(&solo, moved_at, generated, "moved");
    let mut slot_leg = a.leg(1, Some(0), moved_at, generated);
    slot_leg.previous = Some(solo.span_id);
    let w = a.decode(&slot_leg, moved_at, moved_at + 100 * MS, 5, generated + 5);
    let sent = std::time::Instant::now();
    t.send_grpc(synth::export(
        inst,
        vec![b.queue(Some(1), moved_at), solo_span, w],
    ))
    .await
    .expect("export");

    let row = t
        .wait_row(inst, "slot", Some(0), |r| r["request_id"] == "req-a")
        .await;
    assert_eq!(row["state"], "decoding");
    assert_eq!(row["leg_index"], 1);
    let elapsed = row["elapsed_s"].as_f64().unwrap();
    assert!(
        elapsed >= 3.2,
        "elapsed counts from the request's start, not the move: {elapsed}"
    );
    let rate = row["tok_s"].as_f64().unwrap();
    assert!(
        (rate - 50.0).abs() < 1.0,
        "rate right after the move: {rate}"
    );
    let naive = (generated + 5) as f64 / 0.1;
    assert!(rate < naive / 10.0);
    let leg_rate = row["leg_tok_s"].as_f64().unwrap();
    assert!((leg_rate - 50.0).abs() < 1.0, "leg rate {leg_rate}");
    assert!(row["in_slot_s"].as_f64().unwrap() < elapsed);
    assert!((row["ttft_ms"].as_f64().unwrap() - 100.0).abs() < 1e-6);
    // The row's age is the sidecar's own: how long since it changed, which is at most the
    // time since this test sent the change (the spans' own times are 100 ms and more older).
    let age = row["age_s"].as_f64().unwrap();
    assert!(
        age <= sent.elapsed().as_secs_f64(),
        "age {age} s, sent {:?} ago",
        sent.elapsed()
    );
    assert!(!row["history"].as_array().unwrap().is_empty());

    let slots = t.get_json("/v1/slots").await;
    assert_eq!(
        find_row(&slots, inst, "solo", None).unwrap()["state"],
        "idle"
    );
    assert_eq!(
        find_row(&slots, inst, "slot", Some(1)).unwrap()["request_id"],
        "req-b"
    );

    // The request finishes: its row clears when the request span arrives.
    let slot_span = a.leg_span(&slot_leg, moved_at + 100 * MS, 5, "finished");
    let usage = Usage {
        legs: 2,
        moved: true,
        completion_tokens: generated + 5,
        ..Usage::default()
    };
    let root = a.root("m", moved_at + 101 * MS, &usage);
    t.send_grpc(synth::export(inst, vec![slot_span, root]))
        .await
        .expect("export");
    t.wait_row(inst, "slot", Some(0), |r| r["state"] == "idle")
        .await;
    let turn = t.wait_turn("req-a").await;
    assert_eq!(turn["moved"], true);
    assert_eq!(turn["legs"].as_array().unwrap().len(), 2);
    assert_eq!(turn["legs"][0]["path"], "solo");
    assert_eq!(turn["legs"][1]["slot"], 0);
}

#[tokio::test]
async fn two_engine_instances_do_not_mix() {
    let t = TestSidecar::start().await;
    for (inst, per) in [("engine-x", 3), ("engine-y", 7)] {
        let spans = synth::whole_request("shared-id", 5, now_ns() - S, Some(0), 2, per);
        let n = spans.len();
        t.send_grpc(synth::export(inst, spans[..n - 2].to_vec()))
            .await
            .expect("export");
    }
    let x = t
        .wait_row("engine-x", "slot", Some(0), |r| r["state"] == "decoding")
        .await;
    let y = t
        .wait_row("engine-y", "slot", Some(0), |r| r["state"] == "decoding")
        .await;
    assert_eq!(x["tokens_generated"], 7);
    assert_eq!(y["tokens_generated"], 15);
    let slots = t.get_json("/v1/slots").await;
    let instances: Vec<&str> = slots["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["instance"].as_str().unwrap())
        .collect();
    assert_eq!(instances, ["engine-x", "engine-y"]);
    for i in slots["instances"].as_array().unwrap() {
        assert_eq!(i["running"], 1);
        assert_eq!(i["slots"].as_array().unwrap().len(), 1);
    }

    // Finishing the request on one instance leaves the other's row alone.
    let spans = synth::whole_request("shared-id", 5, now_ns() - S, Some(0), 2, 3);
    let n = spans.len();
    t.send_grpc(synth::export("engine-x", spans[n - 2..].to_vec()))
        .await
        .expect("export");
    t.wait_row("engine-x", "slot", Some(0), |r| r["state"] == "idle")
        .await;
    let slots = t.get_json("/v1/slots").await;
    assert_eq!(
        find_row(&slots, "engine-y", "slot", Some(0)).unwrap()["state"],
        "decoding"
    );
    let turns = t.get_json("/v1/turns").await;
    assert_eq!(turns["count"], 1);
    assert_eq!(turns["turns"][0]["instance"], "engine-x");
}

#[tokio::test]
async fn slots_stream_pushes_changes() {
    let t = TestSidecar::start().await;
    let mut resp = t
        .http
        .get(t.view_url("/v1/slots/stream"))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let first = read_sse(&mut resp, "slots", 1).await;
    assert!(first[0]["instances"].as_array().unwrap().is_empty());
    let spans = synth::whole_request("streamed", 9, now_ns() - S, Some(3), 1, 4);
    t.send_grpc(synth::export("engine-s", spans[..3].to_vec()))
        .await
        .expect("export");
    loop {
        let ev = read_sse(&mut resp, "slots", 1).await.remove(0);
        if let Some(row) = find_row(&ev, "engine-s", "slot", Some(3))
            && row["state"] == "decoding"
        {
            assert_eq!(row["request_id"], "streamed");
            break;
        }
    }
}

/// A long prefill's progress windows reach `/v1/slots` over OTLP: the row says `prefill` with
/// the prompt's positions done of total (llama.cpp's `prompt_progress` shape) and the prefill's
/// own rate, and drops them once the request decodes.
#[tokio::test]
async fn a_prefill_advances_in_slots() {
    let t = TestSidecar::start().await;
    let inst = "engine-prefill";
    let start = now_ns() - 500 * MS;
    let admitted = start + 10 * MS;
    let mut a = Request::new("req-long", 5, start);
    t.send_grpc(synth::export(inst, vec![a.queue(Some(0), admitted)]))
        .await
        .expect("export");
    let p0 = admitted + MS;
    let w = a.prefill_window(Some(0), p0, p0, p0 + 200 * MS, 4096, 1024, 2048, 1024);
    t.post_proto(&synth::export(inst, vec![w])).await;
    let row = t
        .wait_row(inst, "slot", Some(0), |r| {
            r["prompt_progress"]["processed"] == 2048
        })
        .await;
    assert_eq!(row["state"], "prefill");
    assert_eq!(row["request_id"], "req-long");
    assert_eq!(row["prompt_progress"]["total"], 4096);
    assert_eq!(row["prompt_progress"]["cache"], 1024);
    assert_eq!(row["prompt_progress"]["time_ms"].as_f64(), Some(200.0));
    let rate = row["prefill_tok_s"].as_f64().unwrap();
    assert!((rate - 5120.0).abs() < 1e-6, "{rate}");

    let first = p0 + 300 * MS;
    a.first_token_ns = Some(first);
    let leg = a.leg(0, Some(0), admitted, 0);
    let w = a.decode(&leg, first, first + 50 * MS, 5, 6);
    t.send_grpc(synth::export(inst, vec![w]))
        .await
        .expect("export");
    let row = t
        .wait_row(inst, "slot", Some(0), |r| r["state"] == "decoding")
        .await;
    assert!(row["prompt_progress"].is_null(), "{row}");
    assert!(row["prefill_tok_s"].is_null(), "{row}");
}

/// Speculative decoding on a live row: the drafted and accepted tokens so far are the sums of
/// the request's decode windows and `acceptance` their ratio, while `tok_s` stays the
/// request's own rate (tokens since its first over the time since, drafts or not).
#[tokio::test]
async fn a_drafting_request_shows_its_acceptance_beside_its_own_rate() {
    use slotlight_sidecar::tools::synth::Drafts;
    let t = TestSidecar::start().await;
    let inst = "engine-spec";
    let start = now_ns() - 2_200 * MS;
    let first = start + 200 * MS;
    let mut r = Request::new("req-spec", 41, start);
    r.first_token_ns = Some(first);
    let leg = r.leg(0, Some(3), start + 10 * MS, 0);
    // Two windows of 1 s and 80 tokens: 32 draft tokens verified in each, 24 then 8 taken.
    let windows = vec![
        r.decode_drafted(
            &leg,
            first,
            first + S,
            80,
            81,
            40,
            Drafts {
                drafted: 32,
                accepted: 24,
            },
        ),
        r.decode_drafted(
            &leg,
            first + S,
            first + 2 * S,
            80,
            161,
            60,
            Drafts {
                drafted: 32,
                accepted: 8,
            },
        ),
    ];
    t.send_grpc(synth::export(inst, windows))
        .await
        .expect("export");
    let row = t
        .wait_row(inst, "slot", Some(3), |r| r["tokens_generated"] == 161)
        .await;
    assert_eq!(row["drafted_tokens"], 64);
    assert_eq!(row["accepted_tokens"], 32);
    assert_eq!(row["acceptance"].as_f64(), Some(0.5));
    assert_eq!(
        row["tok_s"].as_f64(),
        Some(80.0),
        "160 tokens over 2 s: {row}"
    );
    // A request whose windows state no drafts: null, not 0.
    let plain = synth::whole_request("req-plain", 42, now_ns() - S, Some(4), 2, 10);
    t.send_grpc(synth::export(inst, plain[..3].to_vec()))
        .await
        .expect("export");
    let row = t
        .wait_row(inst, "slot", Some(4), |r| r["state"] == "decoding")
        .await;
    assert!(
        row["acceptance"].is_null() && row["drafted_tokens"].is_null(),
        "{row}"
    );
}
