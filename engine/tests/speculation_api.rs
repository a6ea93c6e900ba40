//! Predicted Outputs and drafts as the API shows them, on the tiny synthetic model: the
//! `prediction` field (OpenAI's shape, on chat and completions), `usage.completion_tokens_details`
//! with OpenAI's `accepted_prediction_tokens` and `rejected_prediction_tokens`, slotlight's
//! `drafted_tokens` and `accepted_tokens`, llama.cpp's `timings.draft_n`, the request, leg and
//! decode spans, and `/metrics` (with vLLM's `spec_decode` names under `--metrics-compat vllm`).
//!
//! Regression tests for issue 33 ("Agents rewrite what they read"), items 1 and 3.

mod support;

use std::time::Duration;

use opentelemetry::Value as OtelValue;
use opentelemetry_sdk::trace::SpanData;
use serde_json::{Value, json};
use slotlight_engine::model::loader::Model;
use slotlight_engine::model::testing::TinyLlama;
use slotlight_engine::speculation::SpeculationConfig;
use slotlight_otel::{attr, span};
use support::server::{Options, TestServer};

fn model() -> Model {
    let path = TinyLlama {
        context: 1024,
        vocab: 3 + 94 + 2,
        ..TinyLlama::default()
    }
    .write_temp();
    Model::load(&path).expect("tiny model")
}

async fn server(m: &Model, speculation: SpeculationConfig) -> TestServer {
    TestServer::start(
        m,
        Options {
            speculation,
            vllm_metrics: true,
            progress_ms: 0,
            ..Options::default()
        },
    )
    .await
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

async fn spans_named(s: &TestServer, name: &str, want: usize) -> Vec<SpanData> {
    for _ in 0..500 {
        let found: Vec<SpanData> = s
            .spans
            .spans()
            .into_iter()
            .filter(|x| {
                if name.is_empty() {
                    span::is_request_span_name(&x.name)
                } else {
                    x.name == name
                }
            })
            .collect();
        if found.len() >= want {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name:?} spans never arrived");
}

fn int_attr(s: &SpanData, key: &str) -> Option<i64> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .and_then(|kv| match &kv.value {
            OtelValue::I64(v) => Some(*v),
            _ => None,
        })
}

fn str_attr(s: &SpanData, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().to_string())
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// A prediction of the reply itself is taken whole: the same content as without it, its
/// tokens in `accepted_prediction_tokens`, none rejected, fewer decode steps than tokens; an
/// edited prediction has rejected tokens; usage, llama.cpp timings, spans and metrics agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prediction_is_verified_and_counted_everywhere() {
    let m = model();
    // Drafts only from predictions, so that the counts below are the prediction's alone.
    let s = server(
        &m,
        SpeculationConfig {
            max_tokens: 8,
            ..SpeculationConfig::off()
        },
    )
    .await;
    let ask = |extra: Value| {
        let mut b = json!({"messages": user("hello"), "max_tokens": 24, "temperature": 0, "ignore_eos": true});
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        b
    };
    let (code, plain) = s.chat(ask(json!({}))).await;
    assert_eq!(code, 200, "{plain}");
    let content = plain["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    let u = &plain["usage"];
    assert!(
        u.get("completion_tokens_details").is_none(),
        "not drafted for: no details {u}"
    );
    assert_eq!((n(&u["drafted_tokens"]), n(&u["accepted_tokens"])), (0, 0));
    assert!(
        plain["timings"].get("draft_n").is_none(),
        "{}",
        plain["timings"]
    );

    let (code, v) = s
        .chat(ask(
            json!({"prediction": {"type": "content", "content": content}}),
        ))
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], content.as_str());
    let u = &v["usage"];
    let d = &u["completion_tokens_details"];
    let (accepted, rejected) = (
        n(&d["accepted_prediction_tokens"]),
        n(&d["rejected_prediction_tokens"]),
    );
    assert!(accepted >= 16, "most of the reply was predicted: {u}");
    assert_eq!(rejected, 0, "{u}");
    assert!(d.get("reasoning_tokens").is_none(), "{u}");
    assert_eq!(n(&u["accepted_tokens"]), accepted);
    assert_eq!(n(&u["drafted_tokens"]), accepted + rejected);
    assert_eq!(n(&v["timings"]["draft_n"]), accepted + rejected);
    assert_eq!(n(&v["timings"]["draft_n_accepted"]), accepted);
    let legs = u["legs"].as_array().expect("legs");
    let leg_accepted: u64 = legs.iter().map(|l| n(&l["accepted_tokens"])).sum();
    assert_eq!(leg_accepted, accepted);
    // One decode step verified several tokens: the decode rate counts them all.
    assert!(u["decode_tps"].as_f64().is_some_and(|t| t > 0.0), "{u}");

    // An edited prediction (parts, as OpenAI allows): its edit is rejected.
    let mut edited: Vec<char> = content.chars().collect();
    let mid = edited.len() / 2;
    edited[mid] = if edited[mid] == 'a' { 'b' } else { 'a' };
    let edited: String = edited.into_iter().collect();
    let (code, e) = s
        .chat(ask(json!({"prediction": {"type": "content", "content": [{"type": "text", "text": edited}]}})))
        .await;
    assert_eq!(code, 200, "{e}");
    assert_eq!(e["choices"][0]["message"]["content"], content.as_str());
    let d = &e["usage"]["completion_tokens_details"];
    assert!(n(&d["rejected_prediction_tokens"]) > 0, "{e}");

    // The request spans: the mode and the counts, equal to the usage.
    let roots = spans_named(&s, "", 3).await;
    let root = roots
        .iter()
        .find(|r| str_attr(r, attr::SPECULATION).as_deref() == Some("prediction"))
        .expect("a predicted request's span");
    let drafted = int_attr(root, attr::USAGE_DRAFTED_TOKENS).expect("drafted");
    let taken = int_attr(root, attr::USAGE_ACCEPTED_TOKENS).expect("accepted");
    assert!(int_attr(root, attr::USAGE_DRAFTS).is_some_and(|d| d > 0));
    assert!(taken > 0 && taken <= drafted);
    let plain_root = roots
        .iter()
        .find(|r| str_attr(r, attr::SPECULATION).as_deref() == Some("off"))
        .expect("the plain request's span");
    assert_eq!(int_attr(plain_root, attr::USAGE_DRAFTED_TOKENS), Some(0));
    // Legs and decode windows carry the counts; a window's steps are fewer than its tokens
    // where drafts were taken.
    let legs = spans_named(&s, span::LEG, 3).await;
    let leg_taken: i64 = legs
        .iter()
        .filter_map(|l| int_attr(l, attr::LEG_ACCEPTED_TOKENS))
        .sum();
    assert!(leg_taken >= taken, "{leg_taken} {taken}");
    let windows = spans_named(&s, span::DECODE, 2).await;
    let w_taken: i64 = windows
        .iter()
        .filter_map(|w| int_attr(w, attr::DECODE_ACCEPTED_TOKENS))
        .sum();
    assert!(w_taken > 0, "decode windows carry the taken drafts");
    assert!(windows.iter().any(|w| {
        int_attr(w, attr::DECODE_WINDOW_STEPS).unwrap_or(0)
            < int_attr(w, attr::DECODE_WINDOW_TOKENS).unwrap_or(0)
    }));
    for w in &windows {
        assert!(
            int_attr(w, attr::DECODE_ACCEPTED_TOKENS) <= int_attr(w, attr::DECODE_DRAFTED_TOKENS)
        );
    }

    // `/metrics`: slotlight's counters and vLLM's, the same numbers.
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let value = |prefix: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or_else(|| panic!("{prefix} missing in {text}"), |v| v as u64)
    };
    let ours = value("slotlight_engine_spec_decode_accepted_tokens_total{");
    assert!(ours >= accepted, "{text}");
    assert_eq!(value("vllm:spec_decode_num_accepted_tokens_total{"), ours);
    assert_eq!(
        value("vllm:spec_decode_num_draft_tokens_total{"),
        value("slotlight_engine_spec_decode_draft_tokens_total{")
    );
    assert_eq!(
        value("vllm:spec_decode_num_drafts_total{"),
        value("slotlight_engine_spec_decode_drafts_total{")
    );
    let first_position = text
        .lines()
        .find(|l| {
            l.starts_with("vllm:spec_decode_num_accepted_tokens_per_pos_total{")
                && l.contains("position=\"0\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(first_position.is_some_and(|v| v > 0.0), "{text}");
    s.stop().await;
}

/// The field is checked as OpenAI defines it, on chat and completions; a completion with a
/// prediction takes it; a streamed one reports the counts in its usage chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prediction_field_is_checked_and_taken_on_both_endpoints() {
    let m = model();
    let s = server(&m, SpeculationConfig::default()).await;
    for (bad, param) in [
        (json!({"type": "text", "content": "x"}), "prediction.type"),
        (json!({"type": "content"}), "prediction.content"),
        (
            json!({"type": "content", "content": 3}),
            "prediction.content",
        ),
        (
            json!({"type": "content", "content": [{"type": "image_url"}]}),
            "prediction.content[0]",
        ),
        (
            json!({"type": "content", "content": "x", "extra": 1}),
            "prediction.extra",
        ),
        (json!("x"), "prediction"),
    ] {
        let (code, v) = s
            .chat(json!({"messages": user("hi"), "max_tokens": 2, "prediction": bad}))
            .await;
        assert_eq!(code, 400, "{bad}: {v}");
        assert_eq!(v["error"]["param"], param, "{bad}: {v}");
    }
    let complete = |body: Value| async {
        let r = s.post("/v1/completions", body).await;
        assert_eq!(r.status().as_u16(), 200);
        r.json::<Value>().await.expect("json")
    };
    let base = json!({"prompt": "abc", "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let plain = complete(base.clone()).await;
    let text = plain["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    let mut with = base.clone();
    with["prediction"] = json!({"type": "content", "content": text});
    let v = complete(with.clone()).await;
    assert_eq!(v["choices"][0]["text"], text.as_str());
    assert!(n(&v["usage"]["completion_tokens_details"]["accepted_prediction_tokens"]) > 0);
    // Streamed: the usage chunk has the same counts.
    with["stream"] = json!(true);
    with["stream_options"] = json!({"include_usage": true});
    let (chunks, done) = s.stream("/v1/completions", with).await;
    assert!(done);
    let usage = chunks
        .iter()
        .rev()
        .find(|c| !c["usage"].is_null())
        .map(|c| c["usage"].clone())
        .expect("usage chunk");
    assert_eq!(
        usage["completion_tokens_details"],
        v["usage"]["completion_tokens_details"]
    );
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, text);
    s.stop().await;
}
