//! Request spans, checked with an in-memory exporter: the span tree of one request, the legs of
//! a request that moves, every root's attributes against its own HTTP usage, and W3C
//! `traceparent` propagation.

mod support;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{SpanId, SpanKind, Status};
use opentelemetry::{KeyValue, Value as OtelValue};
use opentelemetry_sdk::trace::SpanData;
use serde_json::{Value, json};
use slotlight_engine::model::loader::Model;
use slotlight_otel::{attr, span};
use support::server::{Options, TestServer, tiny_model};

fn get<'a>(s: &'a SpanData, key: &str) -> Option<&'a OtelValue> {
    s.attributes
        .iter()
        .find(|kv: &&KeyValue| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn int(s: &SpanData, key: &str) -> i64 {
    match get(s, key) {
        Some(OtelValue::I64(v)) => *v,
        other => panic!("{key} on {}: {other:?}", s.name),
    }
}

fn dbl(s: &SpanData, key: &str) -> f64 {
    match get(s, key) {
        Some(OtelValue::F64(v)) => *v,
        other => panic!("{key} on {}: {other:?}", s.name),
    }
}

fn string(s: &SpanData, key: &str) -> String {
    get(s, key)
        .map(|v| v.as_str().into_owned())
        .unwrap_or_else(|| panic!("{key} on {}", s.name))
}

async fn settle(s: &TestServer, want_roots: usize) -> Vec<SpanData> {
    for _ in 0..500 {
        let spans = s.spans.spans();
        if spans
            .iter()
            .filter(|x| span::is_request_span_name(&x.name))
            .count()
            >= want_roots
        {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("request spans never arrived");
}

fn trace_of(spans: &[SpanData], root: &SpanData) -> Vec<SpanData> {
    spans
        .iter()
        .filter(|s| s.span_context.trace_id() == root.span_context.trace_id())
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_gives_root_queue_prefill_leg_and_decode_windows() {
    let m = tiny_model();
    let s = TestServer::start(
        &m,
        Options {
            progress_ms: 1,
            data_parallel_rank: 3,
            ..Options::default()
        },
    )
    .await;
    let (code, v) = s
        .chat(json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 40, "ignore_eos": true, "user": "sess-1"}))
        .await;
    assert_eq!(code, 200);
    let spans = settle(&s, 1).await;
    let root = spans
        .iter()
        .find(|x| span::is_request_span_name(&x.name))
        .expect("root")
        .clone();
    assert_eq!(root.name, format!("chat {}", m.id));
    assert_eq!(root.span_kind, SpanKind::Server);
    assert_eq!(root.parent_span_id, SpanId::INVALID);
    assert_eq!(
        dbl(&root, attr::TRACE_SAMPLING_RATIO),
        1.0,
        "the root states its sampler's ratio (this provider keeps every trace)"
    );
    // The replica that served it: the instance (as the resource names it) and the rank.
    assert_eq!(string(&root, attr::ENGINE_INSTANCE), "test-instance");
    assert_eq!(int(&root, attr::ENGINE_DATA_PARALLEL_RANK), 3);
    let all = trace_of(&spans, &root);
    let names: Vec<&str> = all.iter().map(|x| x.name.as_ref()).collect();
    for n in [span::QUEUE, span::PREFILL, span::LEG] {
        assert_eq!(
            names.iter().filter(|x| **x == n).count(),
            1,
            "{n} in {names:?}"
        );
    }
    let leg = all.iter().find(|x| x.name == span::LEG).expect("leg");
    assert_eq!(string(leg, attr::LEG_PATH), "solo");
    assert!(
        get(leg, attr::SLOT_INDEX).is_none(),
        "no slot on the solo path"
    );
    assert_eq!(int(leg, attr::LEG_TOKENS_GENERATED), 40);
    assert_eq!(int(leg, attr::LEG_INDEX), 0);
    let decodes: Vec<_> = all.iter().filter(|x| x.name == span::DECODE).collect();
    assert!(!decodes.is_empty(), "decode windows");
    assert!(
        decodes
            .iter()
            .all(|d| d.parent_span_id == leg.span_context.span_id())
    );
    let window_total: i64 = decodes
        .iter()
        .map(|d| int(d, attr::DECODE_WINDOW_TOKENS))
        .sum();
    assert_eq!(
        window_total, 39,
        "windows cover every decode token once, and not the prefill's token"
    );
    // The first window starts where decoding starts (the first token), and the windows'
    // device time is the decode steps' alone: it adds up to usage.decode_ms, without the
    // prefill step's time.
    let first_token = int(&root, attr::REQUEST_FIRST_TOKEN_TIME);
    let first_window = decodes
        .iter()
        .min_by_key(|d| d.start_time)
        .expect("a window");
    assert_eq!(
        i64::try_from(
            first_window
                .start_time
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after the epoch")
                .as_nanos()
        )
        .expect("ns"),
        first_token,
        "the first window starts at the first token"
    );
    let window_device: f64 = decodes.iter().map(|d| dbl(d, attr::DECODE_DEVICE_MS)).sum();
    let decode_ms = v["usage"]["decode_ms"].as_f64().expect("decode_ms");
    assert!(
        (window_device - decode_ms).abs() < 1e-6 * decode_ms.max(1.0),
        "decode windows' device time {window_device} is the decode steps' {decode_ms}"
    );
    let last = decodes
        .iter()
        .max_by_key(|d| int(d, attr::DECODE_TOKENS_GENERATED))
        .expect("last");
    assert_eq!(int(last, attr::DECODE_TOKENS_GENERATED), 40);
    let prefill_ids: Vec<_> = all
        .iter()
        .filter(|x| x.name == span::PREFILL)
        .map(|x| x.span_context.span_id())
        .collect();
    for child in all.iter().filter(|x| x.name != root.name) {
        // Decode windows hang under their leg, prefill windows under their prefill.
        if child.name == span::PREFILL_WINDOW {
            assert!(
                prefill_ids.contains(&child.parent_span_id),
                "a prefill window's parent is a prefill"
            );
        } else {
            assert_eq!(
                child.parent_span_id == root.span_context.span_id(),
                child.name != span::DECODE,
                "{}",
                child.name
            );
        }
        assert_eq!(
            string(child, attr::REQUEST_ID),
            v["id"].as_str().expect("id")
        );
        assert_eq!(string(child, attr::GEN_AI_CONVERSATION_ID), "sess-1");
    }
    let prefill = all
        .iter()
        .find(|x| x.name == span::PREFILL)
        .expect("prefill");
    assert_eq!(
        int(prefill, attr::PREFILL_PROMPT_TOKENS),
        v["usage"]["prompt_tokens"].as_i64().expect("p")
    );
    // GenAI attributes on the root.
    assert_eq!(string(&root, attr::GEN_AI_OPERATION_NAME), "chat");
    assert_eq!(string(&root, attr::GEN_AI_PROVIDER_NAME), "slotlight");
    assert_eq!(
        string(&root, attr::GEN_AI_RESPONSE_ID),
        v["id"].as_str().expect("id")
    );
    assert_eq!(int(&root, attr::GEN_AI_USAGE_OUTPUT_TOKENS), 40);
    assert_eq!(root.status, Status::Unset);
    match get(&root, attr::GEN_AI_RESPONSE_FINISH_REASONS) {
        Some(OtelValue::Array(a)) => assert_eq!(a.to_string(), "[\"length\"]"),
        other => panic!("finish reasons: {other:?}"),
    }
    // Times: children inside the root; the queue starts at the root's start.
    let q = all.iter().find(|x| x.name == span::QUEUE).expect("queue");
    assert_eq!(q.start_time, root.start_time);
    for c in &all {
        assert!(
            c.start_time >= root.start_time && c.end_time <= root.end_time,
            "{} inside the root",
            c.name
        );
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_root_span_equals_its_own_http_usage() {
    let m = tiny_model();
    let s = Arc::new(
        TestServer::start(
            &m,
            Options {
                batch: 8,
                ..Options::default()
            },
        )
        .await,
    );
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            let (code, v) = s
                .chat(json!({"messages": [{"role": "user", "content": format!("q{i}")}], "max_tokens": 4 + i % 11, "ignore_eos": true, "seed": i}))
                .await;
            assert_eq!(code, 200, "{v}");
            v
        }));
    }
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.expect("task"));
    }
    let spans = settle(&s, 32).await;
    for v in &replies {
        let id = v["id"].as_str().expect("id");
        let root = spans
            .iter()
            .find(|x| {
                span::is_request_span_name(&x.name)
                    && get(x, attr::REQUEST_ID).is_some_and(|r| r.as_str() == id)
            })
            .unwrap_or_else(|| panic!("root span of {id}"));
        let u = &v["usage"];
        let same = |key: &str, field: &str| {
            let want = u[field].as_f64().expect(field);
            assert_eq!(dbl(root, key), want, "{id}: {key} vs usage.{field}");
        };
        same(attr::USAGE_QUEUE_MS, "queue_ms");
        same(attr::USAGE_PREFILL_MS, "prefill_ms");
        same(attr::USAGE_TTFT_MS, "ttft_ms");
        same(attr::USAGE_DECODE_MS, "decode_ms");
        same(attr::USAGE_GENERATION_MS, "generation_ms");
        same(attr::USAGE_E2E_MS, "e2e_ms");
        same(attr::USAGE_DECODE_TPS, "decode_tps");
        // vLLM's names carry vLLM's wall-clock meanings; device time is under slotlight's.
        let secs = |k: &str| dbl(root, k) * 1000.0;
        let ms = |f: &str| u[f].as_f64().expect(f);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6 * b.abs().max(1.0);
        assert!(near(
            secs(attr::GEN_AI_LATENCY_TIME_IN_MODEL_DECODE),
            ms("generation_ms")
        ));
        assert!(near(
            secs(attr::GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL),
            ms("ttft_ms") - ms("queue_ms")
        ));
        assert!(near(
            secs(attr::GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE),
            ms("e2e_ms") - ms("queue_ms")
        ));
        assert!(near(
            secs(attr::GEN_AI_LATENCY_TIME_IN_QUEUE),
            ms("queue_ms")
        ));
        assert_eq!(string(root, attr::REQUEST_STATUS), "ok");
        assert_eq!(
            int(root, attr::GEN_AI_USAGE_INPUT_TOKENS),
            u["prompt_tokens"].as_i64().expect("p")
        );
        assert_eq!(
            int(root, attr::GEN_AI_USAGE_OUTPUT_TOKENS),
            u["completion_tokens"].as_i64().expect("c")
        );
        assert_eq!(
            int(root, attr::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS),
            u["prompt_tokens_details"]["cached_tokens"]
                .as_i64()
                .expect("cached")
        );
        assert!(
            (dbl(root, attr::GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN) * 1000.0
                - u["ttft_ms"].as_f64().expect("t"))
            .abs()
                < 1e-6
        );
    }
    Arc::try_unwrap(s).ok().expect("server").stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_makes_the_request_span_a_child_of_the_caller() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .header("traceparent", format!("00-{trace}-{parent}-01"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let spans = settle(&s, 1).await;
    let root = spans
        .iter()
        .find(|x| span::is_request_span_name(&x.name))
        .expect("root");
    assert_eq!(root.span_context.trace_id().to_string(), trace);
    assert_eq!(root.parent_span_id.to_string(), parent);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_get_an_error_span() {
    let m = tiny_model();
    let s = TestServer::start(
        &m,
        Options {
            ctx_size: 64,
            ..Options::default()
        },
    )
    .await;
    let (code, _) = s
        .chat(json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60}))
        .await;
    assert_eq!(code, 400);
    let spans = settle(&s, 1).await;
    let root = spans
        .iter()
        .find(|x| span::is_request_span_name(&x.name))
        .expect("root");
    assert_eq!(string(root, attr::ERROR_TYPE), "context_length");
    assert_eq!(string(root, attr::REQUEST_STATUS), "refused");
    assert!(matches!(root.status, Status::Error { .. }));
    // It was never admitted and never had a token: those values are absent, not zero.
    for k in [
        attr::USAGE_QUEUE_MS,
        attr::USAGE_TTFT_MS,
        attr::USAGE_GENERATION_MS,
        attr::GEN_AI_LATENCY_TIME_IN_QUEUE,
        attr::GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN,
    ] {
        assert!(get(root, k).is_none(), "{k} on a refused request");
    }
    s.stop().await;
}

/// Every request a generation route answers is a turn: requests refused before the scheduler
/// (malformed body, validation, unknown model) get a request span of status `refused` with a
/// typed `error.type`, keyed by their session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_before_the_scheduler_get_a_refused_span() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let cases = [
        (
            "/v1/chat/completions",
            "not json".to_string(),
            400,
            "validation",
            "chat",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [], "max_tokens": 3}).to_string(),
            400,
            "validation",
            "chat",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "model": "no-such-model"}).to_string(),
            404,
            "not_found",
            "text_completion",
        ),
    ];
    for (i, (path, body, code, error_type, operation)) in cases.iter().enumerate() {
        let session = format!("refused-{i}");
        let r = s
            .client
            .post(s.url(path))
            .header("content-type", "application/json")
            .header("x-session-id", &session)
            .body(body.clone())
            .send()
            .await
            .expect("send");
        assert_eq!(r.status().as_u16(), *code, "{path} {body}");
        let mut found = None;
        for _ in 0..500 {
            found = s.spans.spans().into_iter().find(|x| {
                get(x, attr::GEN_AI_CONVERSATION_ID).is_some_and(|v| v.as_str() == session)
            });
            if found.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let root = found.unwrap_or_else(|| panic!("a span for {path} {body}"));
        assert!(span::is_request_span_name(&root.name), "{}", root.name);
        assert_eq!(root.span_kind, SpanKind::Server);
        assert_eq!(string(&root, attr::REQUEST_STATUS), "refused");
        assert_eq!(string(&root, attr::ERROR_TYPE), *error_type);
        assert_eq!(string(&root, attr::GEN_AI_OPERATION_NAME), *operation);
        assert!(!string(&root, attr::REQUEST_ID).is_empty());
        assert!(matches!(root.status, Status::Error { .. }));
        assert_eq!(string(&root, attr::SERVER_ADDRESS), "127.0.0.1");
        assert!(get(&root, attr::USAGE_E2E_MS).is_none());
    }
    // One span per refusal, none for the served.
    let (code, _) = s
        .chat(json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
        .await;
    assert_eq!(code, 200);
    let spans = settle(&s, 4).await;
    let refused = spans
        .iter()
        .filter(|x| get(x, attr::REQUEST_STATUS).is_some_and(|v| v.as_str() == "refused"))
        .count();
    assert_eq!(refused, 3);
    s.stop().await;
}

/// GenAI request attributes: the penalties, stop sequences and choice count only where the
/// request set them; `server.address` and `server.port` from the `Host` the client used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_span_carries_the_genai_request_attributes_that_were_set() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let (code, set) = s
        .chat(
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "frequency_penalty": 0.5, "presence_penalty": 0.25, "stop": ["zz", "yy"], "n": 1}),
        )
        .await;
    assert_eq!(code, 200, "{set}");
    let (code, unset) = s
        .chat(json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
        .await;
    assert_eq!(code, 200, "{unset}");
    let spans = settle(&s, 2).await;
    let root_of = |v: &Value| {
        let id = v["id"].as_str().expect("id").to_string();
        spans
            .iter()
            .find(|x| {
                span::is_request_span_name(&x.name)
                    && get(x, attr::REQUEST_ID).is_some_and(|r| r.as_str() == id)
            })
            .expect("root")
            .clone()
    };
    let root = root_of(&set);
    assert_eq!(dbl(&root, attr::GEN_AI_REQUEST_FREQUENCY_PENALTY), 0.5);
    assert_eq!(dbl(&root, attr::GEN_AI_REQUEST_PRESENCE_PENALTY), 0.25);
    assert_eq!(int(&root, attr::GEN_AI_REQUEST_CHOICE_COUNT), 1);
    match get(&root, attr::GEN_AI_REQUEST_STOP_SEQUENCES) {
        Some(OtelValue::Array(a)) => assert_eq!(a.to_string(), "[\"zz\",\"yy\"]"),
        other => panic!("stop sequences: {other:?}"),
    }
    let port = s.base.rsplit(':').next().expect("port");
    assert_eq!(string(&root, attr::SERVER_ADDRESS), "127.0.0.1");
    assert_eq!(int(&root, attr::SERVER_PORT).to_string(), port);
    let root = root_of(&unset);
    for k in [
        attr::GEN_AI_REQUEST_FREQUENCY_PENALTY,
        attr::GEN_AI_REQUEST_PRESENCE_PENALTY,
        attr::GEN_AI_REQUEST_STOP_SEQUENCES,
        attr::GEN_AI_REQUEST_CHOICE_COUNT,
    ] {
        assert!(get(&root, k).is_none(), "{k} was not set");
    }
    s.stop().await;
}

/// The first request runs solo, then moves into a slot when a second arrives: two legs under
/// one root, linked, with the request's own start and first-token times on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_request_has_a_solo_leg_then_a_slot_leg_with_unchanged_clocks() {
    let Some(path) = support::default_model() else {
        return;
    };
    let m = Model::load(&path).expect("load");
    let s = TestServer::start(&m, Options::default()).await;
    let body = |n: u64| json!({"messages": [{"role": "user", "content": "Tell me about lighthouses."}], "max_tokens": n, "ignore_eos": true, "stream": true});
    let mut a = s.post("/v1/chat/completions", body(60)).await;
    let _ = a.chunk().await;
    for _ in 0..1000 {
        let v = s.get("/v1/requests").await;
        if v["data"]
            .as_array()
            .and_then(|d| d.first())
            .is_some_and(|r| r["generated_tokens"].as_u64() >= Some(10))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let b = s.post("/v1/chat/completions", body(10)).await;
    let (ta, tb) = (a.text().await.expect("a"), b.text().await.expect("b"));
    assert!(ta.contains("[DONE]") && tb.contains("[DONE]"));
    let spans = settle(&s, 2).await;
    let first_id = ta
        .lines()
        .find_map(|l| {
            l.strip_prefix("data: ")
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
        })
        .and_then(|v| v["id"].as_str().map(str::to_string))
        .expect("id");
    let root = spans
        .iter()
        .find(|x| {
            span::is_request_span_name(&x.name)
                && get(x, attr::REQUEST_ID).is_some_and(|r| r.as_str() == first_id)
        })
        .expect("root of the first request");
    let mut legs: Vec<_> = trace_of(&spans, root)
        .into_iter()
        .filter(|x| x.name == span::LEG)
        .collect();
    legs.sort_by_key(|l| int(l, attr::LEG_INDEX));
    assert!(legs.len() >= 2, "solo then slot");
    assert_eq!(string(&legs[0], attr::LEG_PATH), "solo");
    assert_eq!(string(&legs[1], attr::LEG_PATH), "slot");
    assert!(get(&legs[1], attr::SLOT_INDEX).is_some());
    assert_eq!(string(&legs[0], attr::LEG_END_REASON), "moved");
    assert_eq!(
        int(&legs[1], attr::LEG_TOKENS_CARRIED),
        int(&legs[0], attr::LEG_TOKENS_GENERATED)
    );
    assert_eq!(
        legs[1].links.links.len(),
        1,
        "a leg links to the previous one"
    );
    assert_eq!(
        legs[1].links.links[0].span_context.span_id(),
        legs[0].span_context.span_id()
    );
    for l in &legs {
        assert_eq!(
            int(l, attr::REQUEST_START_TIME),
            int(root, attr::REQUEST_START_TIME)
        );
        assert_eq!(
            int(l, attr::REQUEST_FIRST_TOKEN_TIME),
            int(root, attr::REQUEST_FIRST_TOKEN_TIME)
        );
    }
    let total: i64 = legs
        .iter()
        .map(|l| int(l, attr::LEG_TOKENS_GENERATED))
        .sum();
    assert_eq!(total, 60);
    assert!(get(root, attr::REQUEST_MOVED).is_some_and(|v| v.as_str() == "true"));
    s.stop().await;
}

/// Every string an exported span carries: attribute values, event names and event attributes.
fn span_strings(spans: &[SpanData]) -> Vec<String> {
    let mut out = Vec::new();
    for s in spans {
        out.push(s.name.to_string());
        out.extend(s.attributes.iter().map(|kv| kv.value.as_str().into_owned()));
        for e in s.events.iter() {
            out.push(e.name.to_string());
            out.extend(e.attributes.iter().map(|kv| kv.value.as_str().into_owned()));
        }
    }
    out
}

/// The four content attributes of the GenAI conventions.
const CONTENT_KEYS: [&str; 4] = [
    attr::GEN_AI_INPUT_MESSAGES,
    attr::GEN_AI_OUTPUT_MESSAGES,
    attr::GEN_AI_SYSTEM_INSTRUCTIONS,
    attr::GEN_AI_TOOL_DEFINITIONS,
];

/// Content attribute `key` of the request span, parsed as the JSON text it must be.
fn content_json(root: &SpanData, key: &str) -> Value {
    let text = string(root, key);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{key} is not JSON ({e}): {text}"))
}

/// The text parts of `message` (a GenAI input or output message), joined.
fn text_parts(message: &Value) -> String {
    message["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["type"] == "text")
        .filter_map(|p| p["content"].as_str())
        .collect()
}

/// A model whose vocabulary spells JSON (printable ASCII), so that a forced tool call can be
/// written, with a context long enough for a tool prompt.
fn ascii_model() -> Model {
    let path = slotlight_engine::model::testing::TinyLlama {
        context: 4096,
        vocab: 3 + 94 + 2,
        ..Default::default()
    }
    .write_temp();
    Model::load(&path).expect("tiny model")
}

/// Without `--trace-content` no text of the request or the reply is on any span, and none of
/// the content attributes; with it, the request span carries the conversation in the GenAI
/// conventions' structure: the leading system message as system instructions (and not as an
/// input message), the user's text as an input message, each choice's reply as an output
/// message with its finish reason, and the tools offered. A successful request leaves the
/// span's status unset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_carry_content_in_the_genai_conventions_only_when_asked_to() {
    let m = tiny_model();
    let marker = "zebra-marker-7391";
    let system = "system-marker-5521";
    let tools = json!([{"type": "function", "function": {"name": "lookup", "description": "Looks a word up", "parameters": {"type": "object"}}}]);
    let body = json!({"messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": format!("tell me about {marker}")}],
        "max_tokens": 8, "ignore_eos": true, "n": 2, "tools": tools, "tool_choice": "none"});
    for trace_content in [false, true] {
        let s = TestServer::start(
            &m,
            Options {
                trace_content,
                ..Options::default()
            },
        )
        .await;
        let (code, v) = s.chat(body.clone()).await;
        assert_eq!(code, 200, "{v}");
        let spans = settle(&s, 1).await;
        let strings = span_strings(&spans);
        for text in [marker, system] {
            assert_eq!(
                strings.iter().any(|x| x.contains(text)),
                trace_content,
                "{text} in spans with trace_content={trace_content}"
            );
        }
        let root = spans
            .iter()
            .find(|x| span::is_request_span_name(&x.name))
            .expect("request span");
        assert_eq!(
            root.status,
            Status::Unset,
            "success leaves the status unset"
        );
        if !trace_content {
            for key in CONTENT_KEYS {
                assert!(get(root, key).is_none(), "{key} without --trace-content");
            }
            s.stop().await;
            continue;
        }
        let input = content_json(root, attr::GEN_AI_INPUT_MESSAGES);
        let input = input.as_array().expect("an array of messages");
        assert_eq!(
            input.len(),
            1,
            "the system message is not an input message: {input:?}"
        );
        assert_eq!(input[0]["role"], "user");
        assert_eq!(text_parts(&input[0]), format!("tell me about {marker}"));
        assert_eq!(
            content_json(root, attr::GEN_AI_SYSTEM_INSTRUCTIONS),
            json!([{"type": "text", "content": system}])
        );
        assert_eq!(
            content_json(root, attr::GEN_AI_TOOL_DEFINITIONS),
            json!([{"type": "function", "name": "lookup", "description": "Looks a word up", "parameters": {"type": "object"}}])
        );
        let output = content_json(root, attr::GEN_AI_OUTPUT_MESSAGES);
        let output = output.as_array().expect("an array of messages");
        assert_eq!(output.len(), 2, "one output message per choice: {output:?}");
        for (i, o) in output.iter().enumerate() {
            let choice = &v["choices"][i];
            assert_eq!(o["role"], "assistant");
            assert_eq!(o["finish_reason"], choice["finish_reason"], "{o}");
            assert_eq!(
                text_parts(o),
                choice["message"]["content"].as_str().unwrap_or(""),
                "choice {i}"
            );
        }
        // A completion's prompt is one user message; its reply the one output message.
        let r = s
            .post(
                "/v1/completions",
                json!({"prompt": marker, "max_tokens": 4, "ignore_eos": true}),
            )
            .await;
        assert_eq!(r.status().as_u16(), 200);
        let v: Value = r.json().await.expect("JSON");
        let spans = settle(&s, 2).await;
        let root = spans
            .iter()
            .find(|x| {
                span::is_request_span_name(&x.name)
                    && get(x, attr::GEN_AI_RESPONSE_ID).map(|id| id.as_str().into_owned())
                        == v["id"].as_str().map(str::to_string)
            })
            .expect("the completion's span");
        assert_eq!(
            content_json(root, attr::GEN_AI_INPUT_MESSAGES),
            json!([{"role": "user", "parts": [{"type": "text", "content": marker}]}])
        );
        let output = content_json(root, attr::GEN_AI_OUTPUT_MESSAGES);
        assert_eq!(
            text_parts(&output[0]),
            v["choices"][0]["text"].as_str().unwrap_or("")
        );
        assert_eq!(output[0]["finish_reason"], "length");
        assert!(get(root, attr::GEN_AI_SYSTEM_INSTRUCTIONS).is_none());
        s.stop().await;
    }
}

/// With `--trace-content`, a reply of tool calls is an output message of `tool_call` parts,
/// with the ids, names and arguments the response gives, and the conventions' finish reason
/// `tool_call`; the call and its result sent back are parts of the next request's input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_is_a_tool_call_part_of_the_messages() {
    let m = ascii_model();
    let s = TestServer::start(
        &m,
        Options {
            trace_content: true,
            ctx_size: 4096,
            kv_tokens: 16384,
            ..Options::default()
        },
    )
    .await;
    let tools = json!([{"type": "function", "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 5}}, "required": ["zone"], "additionalProperties": false}}}]);
    let user = json!({"role": "user", "content": "time?"});
    let (code, v) = s
        .chat(json!({"messages": [user], "tools": tools, "max_tokens": 200, "seed": 5,
                     "tool_choice": {"type": "function", "function": {"name": "get_time"}}, "parallel_tool_calls": false}))
        .await;
    assert_eq!(code, 200, "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_time", "{v}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or(""))
        .expect("arguments are JSON");
    let spans = settle(&s, 1).await;
    let root = spans
        .iter()
        .find(|x| span::is_request_span_name(&x.name))
        .expect("request span");
    let output = content_json(root, attr::GEN_AI_OUTPUT_MESSAGES);
    assert_eq!(
        output,
        json!([{"role": "assistant", "finish_reason": "tool_call", "parts": [
            {"type": "tool_call", "id": call["id"], "name": "get_time", "arguments": args}]}])
    );
    // The call and its result go back: both are parts of the next request's input messages.
    let (code, v2) = s
        .chat(json!({"messages": [user, v["choices"][0]["message"],
                     {"role": "tool", "tool_call_id": call["id"], "content": "12:00"}],
                     "tools": tools, "max_tokens": 4}))
        .await;
    assert_eq!(code, 200, "{v2}");
    let spans = settle(&s, 2).await;
    let root = spans
        .iter()
        .find(|x| {
            span::is_request_span_name(&x.name)
                && get(x, attr::GEN_AI_RESPONSE_ID).map(|id| id.as_str().into_owned())
                    == v2["id"].as_str().map(str::to_string)
        })
        .expect("the second request's span");
    let input = content_json(root, attr::GEN_AI_INPUT_MESSAGES);
    assert_eq!(input[1]["role"], "assistant");
    assert_eq!(
        input[1]["parts"],
        json!([{"type": "tool_call", "id": call["id"], "name": "get_time", "arguments": args}])
    );
    assert_eq!(
        input[2],
        json!({"role": "tool", "parts": [{"type": "tool_call_response", "id": call["id"], "response": "12:00"}]})
    );
    s.stop().await;
}

/// Warm resume on the request span: each turn's `slotlight.resume` and its counts equal the
/// turn's own `usage` (first, full, then an edited history that diverges), and a value that
/// does not apply is left off the span (`null` in usage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_span_says_whether_the_turn_reused_its_conversation() {
    let Some(path) = support::default_model() else {
        return;
    };
    let m = Model::load(&path).expect("default model");
    let s = TestServer::start(&m, Options::default()).await;
    let turn = |messages: Value| {
        let s = &s;
        async move {
            let (code, v) = s
                .chat(json!({"messages": messages, "max_tokens": 8, "temperature": 0, "user": "span-resume"}))
                .await;
            assert_eq!(code, 200, "{v}");
            v
        }
    };
    let reply =
        |v: &Value| json!({"role": "assistant", "content": v["choices"][0]["message"]["content"]});
    let mut msgs = vec![json!({"role": "user", "content": "Name a planet."})];
    let v1 = turn(json!(msgs)).await;
    msgs.extend([
        reply(&v1),
        json!({"role": "user", "content": "Another one."}),
    ]);
    let v2 = turn(json!(msgs)).await;
    let mut edited = msgs.clone();
    edited[0] = json!({"role": "user", "content": "Name a moon."});
    let v3 = turn(json!(edited)).await;
    let spans = settle(&s, 3).await;
    let mut outcomes = Vec::new();
    for v in [&v1, &v2, &v3] {
        let id = v["id"].as_str().expect("id");
        let root = spans
            .iter()
            .find(|x| {
                span::is_request_span_name(&x.name)
                    && get(x, attr::REQUEST_ID).is_some_and(|r| r.as_str() == id)
            })
            .unwrap_or_else(|| panic!("root span of {id}"));
        let u = &v["usage"];
        let outcome = string(root, attr::RESUME);
        assert_eq!(outcome, u["resume"].as_str().expect("usage.resume"));
        for (key, field) in [
            (attr::RESUME_REUSABLE_TOKENS, "reusable_tokens"),
            (attr::RESUME_DIVERGED_AT, "diverged_at"),
            (attr::RESUME_EVICTED_TOKENS, "evicted_tokens"),
        ] {
            match u[field].as_i64() {
                Some(n) => assert_eq!(int(root, key), n, "{id}: {key}"),
                None => assert!(get(root, key).is_none(), "{id}: {key} does not apply"),
            }
        }
        outcomes.push(outcome);
    }
    assert_eq!(outcomes, ["first", "full", "diverged"]);
    // The edit is in the first user message: the prompts part inside it.
    let diverged_at = v3["usage"]["diverged_at"].as_u64().expect("diverged_at");
    let first_prompt = v1["usage"]["prompt_tokens"].as_u64().expect("prompt");
    assert!(
        diverged_at > 0 && diverged_at < first_prompt,
        "{diverged_at}"
    );
    s.stop().await;
}
