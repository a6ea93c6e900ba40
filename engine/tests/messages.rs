//! Anthropic's Messages API on a tiny synthetic model (random weights, a byte vocabulary, a
//! ChatML template without tool support): every field the SDK and Claude Code send accepted,
//! bad input refused in Anthropic's shape naming the field, whole and streamed replies that
//! agree, `max_tokens` clamped and said so on the span, stop sequences, tool calls, thinking
//! blocks and their signatures, the cache diagnostics counted on the tokens, and
//! `count_tokens` equal to the prompt a reply is given.

mod support;

use opentelemetry::Value as OtelValue;
use opentelemetry_sdk::trace::SpanData;
use serde_json::{Value, json};
use slotlight_engine::model::loader::Model;
use slotlight_engine::model::testing::TinyLlama;
use slotlight_engine::server::Limits;
use slotlight_otel::attr;
use support::server::{Options, TestServer};

/// The tiny model with room for the generic tool prompt.
fn model() -> Model {
    let path = TinyLlama {
        context: 4096,
        vocab: 3 + 94 + 2,
        ..TinyLlama::default()
    }
    .write_temp();
    Model::load(&path).expect("tiny model")
}

fn options() -> Options {
    Options {
        ctx_size: 4096,
        kv_tokens: 16384,
        ..Options::default()
    }
}

async fn server(m: &Model) -> TestServer {
    TestServer::start(m, options()).await
}

/// A request of one user message.
fn ask(text: &str, max_tokens: u64) -> Value {
    json!({"max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]})
}

/// POSTs `body` to `path`: the status, the JSON body and the headers.
async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value, reqwest::header::HeaderMap) {
    let r = s.post(path, body).await;
    let code = r.status().as_u16();
    let headers = r.headers().clone();
    (code, r.json().await.unwrap_or(Value::Null), headers)
}

async fn create(s: &TestServer, body: Value) -> (u16, Value) {
    let (code, v, _) = post(s, "/v1/messages", body).await;
    (code, v)
}

/// The error body's message, after checking the body is in Anthropic's shape with `kind`.
fn anthropic_error<'a>(v: &'a Value, kind: &str) -> &'a str {
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert!(
        v.get("param").is_none() && v["error"].get("param").is_none(),
        "{v}"
    );
    v["error"]["message"].as_str().unwrap_or("")
}

/// A stream's events: (event name, data).
async fn stream(s: &TestServer, mut body: Value) -> Vec<(String, Value)> {
    body["stream"] = json!(true);
    let r = s.post("/v1/messages?beta=true", body).await;
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.expect("body");
    let mut out = Vec::new();
    let mut name = String::new();
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).expect("event json");
            assert_eq!(
                v["type"],
                name.as_str(),
                "the event's name is its type: {v}"
            );
            out.push((name.clone(), v));
        }
    }
    out
}

fn attr_of<'a>(s: &'a SpanData, key: &str) -> Option<&'a OtelValue> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

/// The request span of response `id`.
async fn span_of(s: &TestServer, id: &str) -> SpanData {
    for _ in 0..500 {
        if let Some(x) = s.spans.request_spans(1).await.into_iter().find(|x| {
            attr_of(x, attr::GEN_AI_RESPONSE_ID).map(|v| v.as_str().into_owned())
                == Some(id.to_string())
        }) {
            return x;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no span for {id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_the_sdk_sends_is_accepted_and_bad_input_is_named() {
    let m = model();
    let s = server(&m).await;
    // A body with every field of the SDK's (and its beta's) create parameters that means
    // something or nothing here, as Claude Code and the SDK write them.
    let everything = json!({
        "model": m.id,
        "max_tokens": 4,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "citations": null}]},
            {"role": "system", "content": "# Environment"}
        ],
        "stop_sequences": ["\n\n"],
        "temperature": 0.7, "top_p": 0.9, "top_k": 20,
        "metadata": {"user_id": "{\"device_id\":\"d\",\"session_id\":\"s-every\"}"},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "high", "task_budget": null},
        "tools": [
            {"name": "Bash", "description": "Run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}, "cache_control": {"type": "ephemeral"}, "strict": false, "eager_input_streaming": null, "input_examples": [], "allowed_callers": ["direct"]},
            {"name": "Later", "input_schema": {"type": "object"}, "defer_loading": true},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
        "cache_control": {"type": "ephemeral"},
        "container": "c-1", "inference_geo": "us", "service_tier": "standard_only", "speed": "standard",
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "diagnostics": {"previous_message_id": null},
        "mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1/mcp", "name": "m"}],
        "fallbacks": null, "billing_policy": {"type": "billing_policy", "bill_to": "self"},
        "thread": {"type": "create"}
    });
    let (code, v, headers) = post(&s, "/v1/messages", everything.clone()).await;
    assert_eq!(code, 200, "{v}");
    let id = v["id"].as_str().expect("id");
    assert!(id.starts_with("msg_"), "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], m.id.as_str());
    assert!(v["diagnostics"].is_null(), "a first turn opting in: {v}");
    assert_eq!(
        headers.get("request-id").and_then(|h| h.to_str().ok()),
        Some(id)
    );
    assert_eq!(
        headers
            .get("x-slotlight-tools-skipped")
            .and_then(|h| h.to_str().ok()),
        Some("web_search_20250305,mcp_server")
    );
    let span = span_of(&s, id).await;
    assert_eq!(
        attr_of(&span, attr::API).map(|v| v.as_str().into_owned()),
        Some("messages".into())
    );
    let skipped = format!("{:?}", attr_of(&span, attr::TOOLS_SKIPPED));
    assert!(
        skipped.contains("web_search_20250305") && skipped.contains("mcp_server"),
        "{skipped}"
    );
    // Bad input: 400 in Anthropic's shape, the message naming the field.
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"messages": [{"role": "user", "content": "x"}]}),
            "max_tokens",
        ),
        (json!({"max_tokens": 4}), "messages"),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}),
            "messages[0].content[0]",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}]}),
            "messages[0].content[0]",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "presence_penalty": 1}),
            "presence_penalty",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
            "temperature",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "temperature": 7}),
            "temperature",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}),
            "tools[0].input_schema",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "g"}}),
            "tool_choice",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "output_config": {"format": {"type": "json_schema", "schema": {"$ref": "https://example.com/person.json"}}}}),
            "response_format",
        ),
        (
            json!({"max_tokens": -1, "messages": [{"role": "user", "content": "x"}]}),
            "max_tokens",
        ),
        (
            json!({"max_tokens": 4, "model": "claude-nope", "messages": [{"role": "user", "content": "x"}]}),
            "model",
        ),
        (json!([1, 2]), "request body"),
    ];
    for (body, field) in cases {
        let (code, v) = create(&s, body.clone()).await;
        let kind = if field == "model" {
            assert_eq!(code, 404, "{body}: {v}");
            "not_found_error"
        } else {
            assert_eq!(code, 400, "{body}: {v}");
            "invalid_request_error"
        };
        let message = anthropic_error(&v, kind);
        assert!(message.contains(field), "{body}: {message}");
    }
    // Malformed JSON, and an unknown route under /v1/messages, in the same shape.
    let r = s
        .client
        .post(s.url("/v1/messages"))
        .header("content-type", "application/json")
        .body("{\"max_tokens\": ")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.expect("json");
    anthropic_error(&v, "invalid_request_error");
    let (code, v, _) = post(&s, "/v1/messages/batches", json!({})).await;
    assert_eq!(code, 404);
    assert!(anthropic_error(&v, "not_found_error").contains("/v1/messages/batches"));
    // The OpenAI routes keep their own shape.
    let (code, v, _) = post(&s, "/v1/nope", json!({})).await;
    assert_eq!(code, 404);
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    // The engine served on through all of it.
    let (code, v) = create(&s, ask("hi", 3)).await;
    assert_eq!(code, 200, "{v}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_overload_and_size_errors_are_anthropics() {
    let m = model();
    let s = TestServer::start(
        &m,
        Options {
            api_key: Some("sekrit".into()),
            max_queue: 0,
            max_body_bytes: 4096,
            ..options()
        },
    )
    .await;
    let body = ask("hi", 2);
    let send = |headers: Vec<(&'static str, &'static str)>, body: Value| {
        let mut r = s.client.post(s.url("/v1/messages")).json(&body);
        for (k, v) in headers {
            r = r.header(k, v);
        }
        r.send()
    };
    // No key, a wrong one: 401 authentication_error.
    for headers in [vec![], vec![("x-api-key", "wrong")]] {
        let r = send(headers, body.clone()).await.expect("send");
        assert_eq!(r.status().as_u16(), 401);
        let v: Value = r.json().await.expect("json");
        anthropic_error(&v, "authentication_error");
    }
    // With the key (either header), the request passes authentication and meets the full
    // queue: 529 overloaded_error, with Retry-After.
    for headers in [
        vec![("x-api-key", "sekrit")],
        vec![("authorization", "Bearer sekrit")],
    ] {
        let r = send(headers, body.clone()).await.expect("send");
        assert_eq!(r.status().as_u16(), 529);
        assert!(r.headers().get("retry-after").is_some());
        let v: Value = r.json().await.expect("json");
        anthropic_error(&v, "overloaded_error");
    }
    // A body over the limit: 413 request_too_large.
    let big = ask(&"x".repeat(8192), 2);
    let r = send(vec![("x-api-key", "sekrit")], big)
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = r.json().await.expect("json");
    anthropic_error(&v, "request_too_large");
    // The OpenAI routes still answer 401 and 429 in OpenAI's shape.
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 401);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .header("x-api-key", "sekrit")
        .json(&json!({"messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 429);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["type"], "overloaded_error", "{v}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_and_streamed_replies_agree_and_count_tokens_counts_the_prompt() {
    let m = model();
    let s = server(&m).await;
    let body = json!({
        "max_tokens": 12, "temperature": 0,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "hello there"}]
    });
    let (code, whole) = create(&s, body.clone()).await;
    assert_eq!(code, 200, "{whole}");
    let text = whole["content"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    let u = &whole["usage"];
    let (code, count, _) = post(&s, "/v1/messages/count_tokens", body.clone()).await;
    assert_eq!(code, 200, "{count}");
    let prompt = u["input_tokens"].as_u64().expect("input")
        + u["cache_read_input_tokens"].as_u64().expect("read");
    assert_eq!(count["input_tokens"].as_u64(), Some(prompt), "{count} {u}");
    assert_eq!(u["cache_creation_input_tokens"], 0);
    assert!(u["output_tokens"].as_u64() > Some(0));
    // slotlight's extras beside Anthropic's counts.
    for k in ["queue_ms", "ttft_ms", "e2e_ms", "resume", "legs"] {
        assert!(u.get(k).is_some(), "{k}: {u}");
    }
    let events = stream(&s, body.clone()).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(
        names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{names:?}"
    );
    let start = &events[0].1["message"];
    assert!(
        start["stop_reason"].is_null() && start["content"] == json!([]),
        "{start}"
    );
    // `message_start` is sent once the prompt's reuse is known: its counts are the final ones
    // (this stream repeats the whole request's prompt, so part of it is read from the cache).
    let su = &start["usage"];
    assert_eq!(
        su["input_tokens"].as_u64().expect("input")
            + su["cache_read_input_tokens"].as_u64().expect("read"),
        prompt,
        "{su}"
    );
    let mut streamed = String::new();
    let mut open = None;
    for (name, v) in &events {
        match name.as_str() {
            "content_block_start" => {
                assert!(open.is_none(), "blocks do not overlap");
                open = v["index"].as_u64();
                assert_eq!(v["content_block"]["type"], "text", "{v}");
            }
            "content_block_delta" => {
                assert_eq!(v["index"].as_u64(), open, "{v}");
                assert_eq!(v["delta"]["type"], "text_delta");
                streamed.push_str(v["delta"]["text"].as_str().unwrap_or(""));
            }
            "content_block_stop" => {
                assert_eq!(v["index"].as_u64(), open.take(), "{v}");
            }
            _ => {}
        }
    }
    assert_eq!(streamed, text, "greedy: the same reply whole and streamed");
    let delta = &events[events.len() - 2].1;
    assert_eq!(
        delta["delta"]["stop_reason"], whole["stop_reason"],
        "{delta}"
    );
    assert_eq!(
        delta["usage"]["output_tokens"], u["output_tokens"],
        "{delta}"
    );
    assert_eq!(
        delta["usage"]["input_tokens"].as_u64().expect("input")
            + delta["usage"]["cache_read_input_tokens"]
                .as_u64()
                .expect("read"),
        prompt
    );
    assert!(
        su["cache_read_input_tokens"].as_u64() > Some(0),
        "the repeated prompt is read from the cache: {su}"
    );
    assert_eq!(
        su["input_tokens"], delta["usage"]["input_tokens"],
        "{su} {delta}"
    );
    assert_eq!(
        su["cache_read_input_tokens"], delta["usage"]["cache_read_input_tokens"],
        "{su} {delta}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_is_clamped_and_the_span_says_so() {
    let m = model();
    let s = TestServer::start(
        &m,
        Options {
            limits: Limits {
                max_tokens: 6,
                ..Limits::default()
            },
            ..options()
        },
    )
    .await;
    // Claude Code always asks for 32000.
    let mut body = ask("hi", 32000);
    body["temperature"] = json!(0);
    let (code, v) = create(&s, body).await;
    assert_eq!(code, 200, "{v}");
    assert!(v["usage"]["output_tokens"].as_u64() <= Some(6), "{v}");
    let span = span_of(&s, v["id"].as_str().expect("id")).await;
    assert_eq!(
        attr_of(&span, attr::REQUEST_MAX_TOKENS_ASKED),
        Some(&OtelValue::I64(32000))
    );
    assert_eq!(
        attr_of(&span, attr::GEN_AI_REQUEST_MAX_TOKENS),
        Some(&OtelValue::I64(6))
    );
    // Within the limit, nothing is clamped and nothing is said.
    let (code, v) = create(&s, ask("hi", 3)).await;
    assert_eq!(code, 200, "{v}");
    let span = span_of(&s, v["id"].as_str().expect("id")).await;
    assert_eq!(attr_of(&span, attr::REQUEST_MAX_TOKENS_ASKED), None);
    // `max_tokens: 0` prefills and answers nothing.
    let (code, v) = create(&s, ask("hi", 0)).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["content"], json!([]), "{v}");
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_sequence_is_named() {
    let m = model();
    let s = server(&m).await;
    // The tiny model's greedy reply: a run of one character, then of another.
    let mut body = ask("tell me", 200);
    body["temperature"] = json!(0);
    let (code, v) = create(&s, body.clone()).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["stop_reason"], "max_tokens", "{v}");
    let text = v["content"][0]["text"].as_str().expect("text").to_string();
    let first = text.chars().next().expect("a reply");
    let (at, second) = text
        .char_indices()
        .find(|(_, c)| *c != first)
        .unwrap_or_else(|| panic!("a reply of two characters: {text:?}"));
    // A stop sequence met after some text: the text before it, and its name.
    body["stop_sequences"] = json!(["never-generated-zzz", second.to_string()]);
    let (code, v) = create(&s, body.clone()).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["stop_reason"], "stop_sequence", "{v}");
    assert_eq!(v["stop_sequence"], second.to_string(), "{v}");
    assert_eq!(v["content"][0]["text"], &text[..at], "{v}");
    let events = stream(&s, body).await;
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence", "{delta}");
    assert_eq!(
        delta["delta"]["stop_sequence"],
        second.to_string(),
        "{delta}"
    );
    // One met at once: no text at all.
    let mut body = ask("tell me", 200);
    body["temperature"] = json!(0);
    body["stop_sequences"] = json!([first.to_string()]);
    let (code, v) = create(&s, body).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["stop_reason"], "stop_sequence", "{v}");
    assert_eq!(v["stop_sequence"], first.to_string(), "{v}");
    assert_eq!(v["content"], json!([]), "{v}");
    s.stop().await;
}

fn weather_tool() -> Value {
    json!([{
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 8}}, "required": ["city"], "additionalProperties": false}
    }])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_round_trip() {
    let m = model();
    let s = server(&m).await;
    let body = json!({
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "weather in Oslo?"}],
        "tools": weather_tool(),
        "tool_choice": {"type": "tool", "name": "get_weather"}
    });
    let (code, v) = create(&s, body.clone()).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let call = v["content"]
        .as_array()
        .expect("content")
        .iter()
        .find(|b| b["type"] == "tool_use")
        .expect("a tool_use block")
        .clone();
    assert!(
        call["id"].as_str().is_some_and(|i| i.starts_with("toolu_")),
        "{call}"
    );
    assert_eq!(call["name"], "get_weather");
    let city = call["input"]["city"].as_str().expect("an input object");
    assert!(!city.is_empty() && city.chars().count() <= 8, "{call}");
    // Streamed: the call arrives as one block with its input as JSON.
    let events = stream(&s, body.clone()).await;
    let start = events
        .iter()
        .find(|(n, v)| n == "content_block_start" && v["content_block"]["type"] == "tool_use")
        .expect("a tool_use block");
    assert_eq!(start.1["content_block"]["input"], json!({}));
    let json_delta = events
        .iter()
        .find(|(_, v)| v["delta"]["type"] == "input_json_delta")
        .expect("its input");
    let input: Value = serde_json::from_str(
        json_delta.1["delta"]["partial_json"]
            .as_str()
            .expect("text"),
    )
    .expect("the input is JSON");
    assert!(input["city"].is_string(), "{input}");
    assert_eq!(
        events[events.len() - 2].1["delta"]["stop_reason"],
        "tool_use"
    );
    // The result goes back (as the SDK writes it, with the assistant's blocks as they came).
    let (code, v2) = create(
        &s,
        json!({
            "max_tokens": 40,
            "messages": [
                {"role": "user", "content": "weather in Oslo?"},
                {"role": "assistant", "content": v["content"]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call["id"], "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "Thanks."}
                ]}
            ],
            "tools": weather_tool()
        }),
    )
    .await;
    assert_eq!(code, 200, "{v2}");
    assert!(
        ["end_turn", "max_tokens", "tool_use"].contains(&v2["stop_reason"].as_str().unwrap_or("")),
        "{v2}"
    );
    s.stop().await;
}

/// A ChatML template that opens `<think>` unless `enable_thinking` is false, and renders an
/// assistant's reasoning.
const THINKING_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if message.reasoning_content %}{{ '<think>\n' + message.reasoning_content + '\n</think>\n\n' }}{% endif %}{{ message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% else %}{{ '<think>\n' }}{% endif %}{% endif %}";

/// A reply with a thinking block, asked with `body` (sampled: the tiny model's greedy
/// reasoning is blank lines, which the reply trims away; a few tries find one with text).
async fn thinking_reply(s: &TestServer, body: &Value) -> Value {
    for _ in 0..8 {
        let (code, r) = create(s, body.clone()).await;
        assert_eq!(code, 200, "{r}");
        assert!(
            r["usage"]["output_tokens_details"]["thinking_tokens"].as_u64() > Some(0),
            "{r}"
        );
        if r["content"][0]["type"] == "thinking" {
            return r;
        }
    }
    panic!("no reply with reasoning text in eight tries");
}

/// The text a `sl1.<mac>.<hex>` signature carries.
fn carried(signature: &str) -> String {
    let hex = signature.rsplit('.').next().expect("parts");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    String::from_utf8(bytes).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_blocks_are_signed_and_come_back() {
    let mut m = model();
    m.chat_template = Some(std::sync::Arc::new(
        slotlight_engine::chat_template::ChatTemplate::new(THINKING_TEMPLATE, None, None)
            .expect("template compiles"),
    ));
    let s = server(&m).await;
    let body = json!({"max_tokens": 24, "temperature": 1.0, "top_k": 40,
        "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024}});
    let v = thinking_reply(&s, &body).await;
    let block = v["content"][0].clone();
    let thinking = block["thinking"].as_str().expect("thinking").to_string();
    assert!(!thinking.is_empty(), "{v}");
    assert!(
        block["signature"]
            .as_str()
            .is_some_and(|s| s.starts_with("sl1.")),
        "{v}"
    );
    // `disabled` turns the template's switch off: no reasoning at all.
    let mut off = body.clone();
    off["thinking"] = json!({"type": "disabled"});
    let (code, v_off) = create(&s, off).await;
    assert_eq!(code, 200, "{v_off}");
    assert_eq!(
        v_off["usage"]["output_tokens_details"]["thinking_tokens"], 0,
        "{v_off}"
    );
    // Streamed: thinking deltas, then the signature, then the block's stop.
    let mut kinds: Vec<String> = Vec::new();
    for _ in 0..8 {
        let events = stream(&s, body.clone()).await;
        kinds = events
            .iter()
            .filter(|(n, _)| n == "content_block_delta")
            .map(|(_, v)| v["delta"]["type"].as_str().unwrap_or("").to_string())
            .collect();
        if !kinds.is_empty() {
            break;
        }
    }
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("signature_delta"),
        "{kinds:?}"
    );
    assert!(
        kinds[..kinds.len() - 1]
            .iter()
            .all(|k| k == "thinking_delta"),
        "{kinds:?}"
    );
    // The block comes back in the history, verified; edited, it is refused naming it.
    let history = |block: Value| {
        json!({"max_tokens": 4, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [block, {"type": "text", "text": "ok"}]},
            {"role": "user", "content": "again"}
        ]})
    };
    let (code, e) = create(&s, history(block.clone())).await;
    assert_eq!(code, 200, "{e}");
    let mut edited = block.clone();
    edited["thinking"] = json!(format!("{thinking} (edited)"));
    let (code, e) = create(&s, history(edited)).await;
    assert_eq!(code, 400, "{e}");
    assert!(
        anthropic_error(&e, "invalid_request_error").contains("messages[1].content[0].signature")
    );
    // With `display: "omitted"` the block is empty and its signature carries the text: sent
    // back as it came, the prompt holds the reasoning exactly as if it had been shown.
    let mut omitted = body.clone();
    omitted["thinking"] = json!({"type": "enabled", "budget_tokens": 1024, "display": "omitted"});
    let v = thinking_reply(&s, &omitted).await;
    let empty = v["content"][0].clone();
    assert_eq!(empty["thinking"], "", "{v}");
    let signature = empty["signature"].as_str().expect("signature").to_string();
    let text = carried(&signature);
    assert!(!text.is_empty());
    let count = |block: Value| {
        let s = &s;
        async move {
            let (code, c, _) = post(s, "/v1/messages/count_tokens", history(block)).await;
            assert_eq!(code, 200, "{c}");
            c["input_tokens"].as_u64().expect("count")
        }
    };
    let as_sent = count(empty.clone()).await;
    let shown = count(json!({"type": "thinking", "thinking": text, "signature": signature})).await;
    let none = count(json!({"type": "redacted_thinking", "data": "x"})).await;
    assert_eq!(
        as_sent, shown,
        "the reasoning is restored from the signature"
    );
    assert!(as_sent > none, "and it is in the prompt");
    s.stop().await;
}

/// The common prefix of two token lists.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_diagnostics_are_counted_on_the_tokens() {
    let m = model();
    let s = server(&m).await;
    let turn = |system: &str, history: Vec<Value>, previous: Option<&str>| {
        let mut b = json!({"max_tokens": 8, "temperature": 0, "system": system, "messages": history, "tools": weather_tool(), "tool_choice": {"type": "none"}});
        if let Some(p) = previous {
            b["diagnostics"] = json!({"previous_message_id": p});
        }
        b
    };
    let first = vec![json!({"role": "user", "content": "hello"})];
    let (code, a) = create(&s, turn("Be brief.", first.clone(), None)).await;
    assert_eq!(code, 200, "{a}");
    assert!(a["diagnostics"].is_null());
    let a_id = a["id"].as_str().expect("id");
    let reply = a["content"][0]["text"].as_str().unwrap_or("").to_string();
    let mut next = first.clone();
    next.push(json!({"role": "assistant", "content": reply}));
    next.push(json!({"role": "user", "content": "and then?"}));
    let registry = &s.state.diagnostics;
    let kept = registry.get(a_id).expect("the first turn is kept");
    let before: Vec<u32> = kept
        .prompt
        .iter()
        .chain(kept.reply.as_deref().unwrap_or(&[]).iter())
        .copied()
        .collect();
    // The exact count: the previous turn's tokens (prompt and reply) the current prompt could
    // have reused, less those it shares.
    let missed = |id: &str| {
        let now = registry.get(id).expect("kept");
        before.len().min(now.prompt.len()) - common(&before, &now.prompt)
    };
    // A continuation: its diagnosis is whatever the tokens say, exactly.
    let (code, b) = create(&s, turn("Be brief.", next.clone(), Some(a_id))).await;
    assert_eq!(code, 200, "{b}");
    let n = missed(b["id"].as_str().expect("id"));
    if n == 0 {
        assert!(b["diagnostics"].is_null(), "a hit: {b}");
    } else {
        assert_eq!(
            b["diagnostics"]["cache_miss_reason"],
            json!({"type": "messages_changed", "cache_missed_input_tokens": n}),
            "the reply rendered back differs from its tokens: {b}"
        );
    }
    // The system prompt changed: everything after its first change is missed.
    let (code, c) = create(&s, turn("Be long.", next.clone(), Some(a_id))).await;
    assert_eq!(code, 200, "{c}");
    let n = missed(c["id"].as_str().expect("id"));
    assert!(n > 0);
    assert_eq!(
        c["diagnostics"]["cache_miss_reason"],
        json!({"type": "system_changed", "cache_missed_input_tokens": n}),
        "{c}"
    );
    // An earlier message changed.
    let mut changed = next.clone();
    changed[0] = json!({"role": "user", "content": "HELLO"});
    let (code, d) = create(&s, turn("Be brief.", changed, Some(a_id))).await;
    assert_eq!(code, 200, "{d}");
    let n = missed(d["id"].as_str().expect("id"));
    assert_eq!(
        d["diagnostics"]["cache_miss_reason"],
        json!({"type": "messages_changed", "cache_missed_input_tokens": n}),
        "{d}"
    );
    // Tools changed (offered to the model this time, so the prompt changes).
    let mut with_tools = turn("Be brief.", next.clone(), Some(a_id));
    with_tools["tool_choice"] = json!({"type": "auto"});
    with_tools["tools"][0]["description"] = json!("The weather, now");
    let (code, e) = create(&s, with_tools).await;
    assert_eq!(code, 200, "{e}");
    assert_eq!(
        e["diagnostics"]["cache_miss_reason"]["type"], "tools_changed",
        "{e}"
    );
    // Unknown previous message.
    let (code, f) = create(&s, turn("Be brief.", next, Some("msg_unknown"))).await;
    assert_eq!(code, 200, "{f}");
    assert_eq!(
        f["diagnostics"],
        json!({"cache_miss_reason": {"type": "previous_message_not_found"}})
    );
    s.stop().await;
}

/// A reply cut because the prompt and the reply fill the context stops with Anthropic's
/// `model_context_window_exceeded` (Claude Code then compacts rather than retrying into a
/// full context); one cut by `max_tokens` stops with `max_tokens`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_fills_the_context_says_so() {
    let m = model();
    let s = TestServer::start(
        &m,
        Options {
            ctx_size: 96,
            ..options()
        },
    )
    .await;
    let mut body = ask("tell me", 32000);
    body["temperature"] = json!(0);
    let (code, v) = create(&s, body.clone()).await;
    assert_eq!(code, 200, "{v}");
    let used = v["usage"]["input_tokens"].as_u64().unwrap_or(0)
        + v["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0)
        + v["usage"]["output_tokens"].as_u64().unwrap_or(0);
    assert_eq!(
        used, 96,
        "the tiny model's reply runs to the end of the context: {v}"
    );
    assert_eq!(v["stop_reason"], "model_context_window_exceeded", "{v}");
    body["max_tokens"] = json!(5);
    let (code, v) = create(&s, body).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["stop_reason"], "max_tokens", "{v}");
    s.stop().await;
}
