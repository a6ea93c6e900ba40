//! The OpenAI-compatible API on a tiny synthetic model: response shapes, usage, errors and
//! limits in OpenAI's format, authentication, overload, cancellation and shutdown.

mod support;

use serde_json::{Value, json};
use slotlight_engine::server::Limits;
use support::server::{Options, TestServer, tiny_model};

fn chat_body(max_tokens: u64) -> Value {
    json!({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": max_tokens, "ignore_eos": true, "temperature": 0})
}

fn error_of(v: &Value) -> (&str, Option<&str>) {
    let e = &v["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "error body without message: {v}"
    );
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "error body missing fields: {v}"
    );
    (e["type"].as_str().unwrap_or(""), e["code"].as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_returns_content_and_consistent_usage() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let (code, v) = s.chat(chat_body(12)).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"].is_string());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let u = &v["usage"];
    assert_eq!(u["completion_tokens"], 12);
    let (p, c, t) = (
        u["prompt_tokens"].as_u64(),
        u["completion_tokens"].as_u64(),
        u["total_tokens"].as_u64(),
    );
    assert_eq!(p.zip(c).map(|(p, c)| p + c), t);
    let f = |k: &str| {
        u[k].as_f64()
            .unwrap_or_else(|| panic!("usage.{k} missing: {u}"))
    };
    assert!(f("prefill_ms") > 0.0 && f("decode_ms") > 0.0);
    // Admission, then the prefill's device time, both before the first token: a queue time
    // taken from another clock (or a prefill time holding more than its steps) breaks this.
    assert!(
        f("queue_ms") + f("prefill_ms") <= f("ttft_ms") + 1e-6,
        "queue + prefill device time within the time to first token: {u}"
    );
    assert!(f("ttft_ms") <= f("e2e_ms") && f("generation_ms") <= f("e2e_ms"));
    assert!(
        f("ttft_ms") + f("generation_ms") <= f("e2e_ms") + 1e-6,
        "{u}"
    );
    let tps = f("decode_tps");
    assert!(
        (tps - 11.0 / (f("decode_ms") / 1000.0)).abs() < 1e-6 * tps.max(1.0),
        "decode_tps: 11 decode steps' tokens per second of decode_ms"
    );
    assert!(u["prompt_tokens_details"]["cached_tokens"].is_u64());
    // llama.cpp's `timings`, with llama.cpp's definitions: wall-clock times, rates as counts
    // per second of those times, the first token counted among the predicted ones.
    let tm = &v["timings"];
    let t = |k: &str| {
        tm[k]
            .as_f64()
            .unwrap_or_else(|| panic!("timings.{k} missing: {tm}"))
    };
    let near = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    assert_eq!(tm["predicted_n"], 12);
    assert!(near(t("predicted_ms"), f("generation_ms")), "{tm} {u}");
    assert!(
        near(t("predicted_per_second"), 12.0 / (t("predicted_ms") / 1e3)),
        "{tm}"
    );
    assert!(
        near(t("predicted_per_token_ms"), t("predicted_ms") / 12.0),
        "{tm}"
    );
    let prompt_n = t("prompt_n");
    assert!(
        near(t("prompt_per_second"), prompt_n / (t("prompt_ms") / 1e3)),
        "{tm}"
    );
    assert!(
        near(t("prompt_per_token_ms"), t("prompt_ms") / prompt_n),
        "{tm}"
    );
    assert!(
        t("prompt_ms") >= f("prefill_ms") && t("prompt_ms") <= f("ttft_ms") - f("queue_ms") + 1e-6,
        "prompt_ms is the prefill's wall time, between its device time and the first token: {tm} {u}"
    );
    assert_eq!(tm["cache_n"], u["prompt_tokens_details"]["cached_tokens"]);
    s.stop().await;
}

/// A request that produces a single token had no decode step: its decode figures are
/// unknown (`null`), never zero, and so are the rates that would divide by zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_has_no_decode_figures_and_no_made_up_rates() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let (code, v) = s.chat(chat_body(1)).await;
    assert_eq!(code, 200, "{v}");
    let u = &v["usage"];
    for k in ["decode_ms", "decode_tps"] {
        assert!(u.get(k).is_some_and(Value::is_null), "usage.{k}: {u}");
    }
    assert_eq!(
        u["generation_ms"],
        json!(0.0),
        "first and last token are the same: {u}"
    );
    for k in ["queue_ms", "prefill_ms", "ttft_ms", "e2e_ms"] {
        assert!(u[k].is_f64(), "usage.{k}: {u}");
    }
    let tm = &v["timings"];
    assert_eq!(tm["predicted_ms"], json!(0.0), "{tm}");
    assert!(
        tm.get("predicted_per_second").is_some_and(Value::is_null),
        "a rate over zero time is unknown, not infinite or zero: {tm}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_has_openai_chunks_and_a_final_usage_chunk() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let mut body = chat_body(6);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (chunks, done) = s.stream("/v1/chat/completions", body).await;
    assert!(done, "stream must end with [DONE]");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    let ids: std::collections::HashSet<_> = chunks
        .iter()
        .map(|c| c["id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids.len(), 1, "one id per stream");
    let last = chunks.last().expect("chunks");
    assert_eq!(last["choices"], json!([]), "usage chunk has empty choices");
    assert_eq!(last["usage"]["completion_tokens"], 6);
    assert!(last["usage"]["ttft_ms"].as_f64().is_some());
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    // Without include_usage, no usage chunk.
    let mut body = chat_body(3);
    body["stream"] = json!(true);
    let (chunks, _) = s.stream("/v1/chat/completions", body).await;
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    // continuous_usage_stats: every content chunk carries counts.
    let mut body = chat_body(4);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"continuous_usage_stats": true});
    let (chunks, _) = s.stream("/v1/chat/completions", body).await;
    let with_usage = chunks.iter().filter(|c| c.get("usage").is_some()).count();
    assert!(with_usage >= 4, "usage on every chunk: {chunks:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_stream_and_not() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": "abc", "max_tokens": 5, "ignore_eos": true}),
        )
        .await;
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["object"], "text_completion");
    assert!(v["choices"][0]["text"].is_string());
    assert_eq!(v["usage"]["completion_tokens"], 5);
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": [5, 6, 7], "max_tokens": 2, "ignore_eos": true}),
        )
        .await;
    assert_eq!(r.status().as_u16(), 200);
    let (chunks, done) = s
        .stream(
            "/v1/completions",
            json!({"prompt": "abc", "max_tokens": 3, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}),
        )
        .await;
    assert!(done);
    assert_eq!(
        chunks.last().expect("chunks")["usage"]["completion_tokens"],
        3
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_openai_errors_and_loses_nothing() {
    let m = tiny_model();
    let s = TestServer::start(
        &m,
        Options {
            max_body_bytes: 4096,
            ctx_size: 256,
            ..Options::default()
        },
    )
    .await;
    let raw = |body: &'static str| {
        let c = s.client.clone();
        let url = s.url("/v1/chat/completions");
        async move {
            let r = c
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("send");
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    for body in [
        "{bad",
        "",
        "[]",
        "null",
        "{\"messages\": \"hi\"}",
        "{\"messages\": [{\"role\": 1}]}",
    ] {
        let (code, v) = raw(body).await;
        assert_eq!(code, 400, "{body}: {v}");
        assert_eq!(error_of(&v).0, "invalid_request_error");
    }
    let cases = [
        (json!({"messages": []}), 400, "messages"),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "n": 99}),
            400,
            "n",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
            400,
            "",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": 9.0}),
            400,
            "",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "top_p": 0}),
            400,
            "",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
            400,
            "max_tokens",
        ),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            400,
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            400,
            "messages[0].content[0]",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "stop": ["", "a"]}),
            400,
            "stop",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "stop": (0..40).map(|i| i.to_string()).collect::<Vec<_>>()}),
            400,
            "stop",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4o"}),
            404,
            "model",
        ),
    ];
    for (body, want, param) in cases {
        let (code, v) = s.chat(body.clone()).await;
        assert_eq!(code, want, "{body}: {v}");
        error_of(&v);
        if !param.is_empty() {
            assert_eq!(v["error"]["param"], param, "{body}: {v}");
        }
    }
    // Context overflow names both numbers.
    let (code, v) = s
        .chat(json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 250}))
        .await;
    assert_eq!(code, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("250") && msg.contains("256"), "{msg}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    // Body over the limit: 413 in OpenAI's shape.
    let big = "x".repeat(8000);
    let (code, v) = s
        .chat(json!({"messages": [{"role": "user", "content": big}]}))
        .await;
    assert_eq!(code, 413, "{v}");
    assert_eq!(v["error"]["code"], "request_too_large");
    // Unknown route.
    let r = s
        .client
        .get(s.url("/v2/nothing"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 404);
    // Nothing was lost: the server still answers.
    let (code, _) = s.chat(chat_body(2)).await;
    assert_eq!(code, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_is_explicit_and_refused_in_openai_format() {
    let m = tiny_model();
    let s = TestServer::start(
        &m,
        Options {
            limits: Limits {
                max_messages: 3,
                max_message_bytes: 100,
                max_tokens: 50,
                ..Limits::default()
            },
            ..Options::default()
        },
    )
    .await;
    let user = |text: &str| json!({"role": "user", "content": text});
    let cases = [
        (
            json!({"messages": [user("a"), user("b"), user("c"), user("d")]}),
            "messages",
            "at most 3",
        ),
        (
            json!({"messages": [user(&"y".repeat(101))]}),
            "messages[0].content",
            "the limit is 100",
        ),
        (
            json!({"messages": [user("x")], "max_tokens": 51}),
            "max_tokens",
            "limit of 50",
        ),
        (
            json!({"messages": [user("x")], "stop": (0..17).map(|i| format!("s{i}")).collect::<Vec<_>>()}),
            "stop",
            "at most 16",
        ),
        (
            json!({"messages": [user("x")], "stop": ["z".repeat(513)]}),
            "stop",
            "",
        ),
    ];
    for (body, param, words) in cases {
        let (code, v) = s.chat(body).await;
        assert_eq!(code, 400, "{v}");
        assert_eq!(error_of(&v).0, "invalid_request_error", "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(words), "{msg}");
    }
    // Exactly at each limit is accepted.
    let (code, v) = s
        .chat(json!({"messages": [user("a"), user("b"), user(&"y".repeat(100))], "max_tokens": 2, "stop": (0..16).map(|i| format!("s{i}")).collect::<Vec<_>>()}))
        .await;
    assert_eq!(code, 200, "{v}");
    // A request head over the header limit (64 KiB here) is answered 431, and the server
    // goes on serving.
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .header("x-padding", "p".repeat(80 * 1024))
        .json(&chat_body(2))
        .send()
        .await
        .expect("an answer, not a dropped connection");
    assert_eq!(r.status().as_u16(), 431);
    let (code, _) = s.chat(chat_body(2)).await;
    assert_eq!(code, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_required_when_set() {
    let m = tiny_model();
    let s = TestServer::start(
        &m,
        Options {
            api_key: Some("sekret".into()),
            ..Options::default()
        },
    )
    .await;
    let (code, v) = s.chat(chat_body(1)).await;
    assert_eq!(code, 401);
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .bearer_auth("wrong")
        .json(&chat_body(1))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 401);
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .bearer_auth("sekret")
        .json(&chat_body(1))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let r = s
        .client
        .get(s.url("/v1/models"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 401);
    let r = s.client.get(s.url("/health")).send().await.expect("send");
    assert_eq!(r.status().as_u16(), 200, "health needs no key");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_with_retry_after() {
    let m = tiny_model();
    let s = TestServer::start(
        &m,
        Options {
            batch: 1,
            max_queue: 1,
            ..Options::default()
        },
    )
    .await;
    // Fill the one slot and the one queue place with long requests, streamed so they start.
    // The tiny model is fast: `a` can finish (and `b` take the slot) before `c` is sent. Such a
    // run proves nothing either way and is tried again; a queue without its limit answers `c`
    // with 200 on every try and fails.
    let mut long = chat_body(200);
    long["stream"] = json!(true);
    let c = s.client.clone();
    let url = s.url("/v1/chat/completions");
    let mut refused = None;
    for _ in 0..20 {
        let a = c.post(&url).json(&long).send().await.expect("a");
        // A streamed answer starts before the step loop admits its request: wait for `a` to
        // leave the queue, or `b` would find the one place still taken.
        for _ in 0..1000 {
            if s.state.engine.queued() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let b = c.post(&url).json(&long).send().await.expect("b");
        assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
        let full = s.state.engine.queued() == 1 && s.state.engine.in_flight() == 2;
        let r = c.post(&url).json(&chat_body(1)).send().await.expect("c");
        let code = r.status().as_u16();
        if full && code == 429 {
            refused = Some(r);
        }
        drop((a, b));
        if refused.is_some() {
            break;
        }
        // Both streams are dropped: wait for the engine to be idle before the next try.
        for _ in 0..1000 {
            if s.state.engine.in_flight() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    let r = refused.expect("a full queue never answered 429 in 20 tries");
    assert!(r.headers().get("retry-after").is_some());
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["type"], "overloaded_error");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_frees_its_slot() {
    // A long context, so that the long request is still running, whatever the machine's speed,
    // when the client walks away (200 tokens of the tiny model can finish before the first poll).
    let path = slotlight_engine::model::testing::TinyLlama {
        context: 8192,
        ..Default::default()
    }
    .write_temp();
    let m = slotlight_engine::model::loader::Model::load(&path).expect("tiny model");
    let s = TestServer::start(
        &m,
        Options {
            batch: 1,
            ctx_size: 8192,
            kv_tokens: 8192,
            limits: Limits {
                max_tokens: 8000,
                ..Limits::default()
            },
            ..Options::default()
        },
    )
    .await;
    let mut long = chat_body(8000);
    long["stream"] = json!(true);
    let mut r = s.post("/v1/chat/completions", long).await;
    let _ = r.chunk().await.expect("first chunk");
    let mut busy = s.get("/v1/requests").await;
    for _ in 0..200 {
        if busy["data"].as_array().is_some_and(|d| !d.is_empty()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        busy = s.get("/v1/requests").await;
    }
    assert_eq!(busy["data"].as_array().map(Vec::len), Some(1), "{busy}");
    drop(r);
    // The next request gets the slot: the cancelled one is gone.
    let (code, v) = s.chat(chat_body(3)).await;
    assert_eq!(code, 200, "{v}");
    let mut idle = s.get("/v1/requests").await;
    for _ in 0..100 {
        if idle["data"].as_array().is_some_and(Vec::is_empty) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        idle = s.get("/v1/requests").await;
    }
    assert_eq!(idle["data"], json!([]), "{idle}");
    // The cancellation is on the request span.
    let spans = s.spans.spans();
    assert!(
        spans.iter().any(|sp| sp
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == slotlight_otel::attr::ERROR_TYPE
                && kv.value.as_str() == "cancelled")),
        "a cancelled request span"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_does_not_stall_others() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let mut long = chat_body(200);
    long["stream"] = json!(true);
    // Open a stream and never read it.
    let stalled = s.post("/v1/chat/completions", long).await;
    assert_eq!(stalled.status().as_u16(), 200);
    // Others complete while it sits unread.
    for _ in 0..3 {
        let (code, v) = s.chat(chat_body(5)).await;
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 5);
    }
    drop(stalled);
    s.stop().await;
}

/// A reader that sleeps between chunks is charged the device time its tokens cost, not the
/// time it took to read them: the engine's clocks (and so `decode_ms`, a sum of decode steps)
/// do not wait for the reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_is_charged_the_device_time_of_its_tokens() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let mut body = chat_body(40);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let started = std::time::Instant::now();
    let mut r = s.post("/v1/chat/completions", body).await;
    let mut text = Vec::new();
    while let Some(c) = r.chunk().await.expect("chunk") {
        text.extend_from_slice(&c);
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    }
    let read_ms = started.elapsed().as_secs_f64() * 1000.0;
    let text = String::from_utf8(text).expect("utf-8");
    let usage = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|c| c.get("usage").cloned())
        .expect("a usage chunk");
    let f = |k: &str| usage[k].as_f64().unwrap_or_else(|| panic!("{k}: {usage}"));
    assert_eq!(usage["completion_tokens"], 40);
    // The reader's sleeps are in neither the engine's decode time nor its end-to-end time.
    assert!(f("decode_ms") <= f("generation_ms") + 1e-6, "{usage}");
    assert!(
        f("e2e_ms") * 2.0 < read_ms,
        "e2e {} ms far below the {read_ms} ms the reader took",
        f("e2e_ms")
    );
    // The device time is what the decode windows' steps cost, exactly.
    let id = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|c| c["id"].as_str().map(str::to_string))
        .expect("id");
    let mut windows = 0.0;
    for _ in 0..500 {
        let spans = s.spans.spans();
        let mine = |sp: &&opentelemetry_sdk::trace::SpanData| {
            sp.attributes.iter().any(|kv| {
                kv.key.as_str() == slotlight_otel::attr::REQUEST_ID && kv.value.as_str() == id
            })
        };
        if spans
            .iter()
            .filter(mine)
            .any(|sp| slotlight_otel::span::is_request_span_name(&sp.name))
        {
            windows = spans
                .iter()
                .filter(mine)
                .filter(|sp| sp.name == slotlight_otel::span::DECODE)
                .filter_map(|sp| {
                    sp.attributes
                        .iter()
                        .find(|kv| kv.key.as_str() == slotlight_otel::attr::DECODE_DEVICE_MS)
                        .and_then(|kv| match kv.value {
                            opentelemetry::Value::F64(v) => Some(v),
                            _ => None,
                        })
                })
                .sum();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        (windows - f("decode_ms")).abs() < 1e-6 * f("decode_ms").max(1.0),
        "decode_ms {} is the decode windows' device time {windows}",
        f("decode_ms")
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_requests() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let v = s.get("/v1/models").await;
    assert_eq!(v["data"][0]["id"], m.id);
    let h = s.get("/health").await;
    assert_eq!(h["status"], "ok");
    let info = &h["model_info"];
    assert_eq!(info["arch"], "llama", "{h}");
    assert_eq!(info["context_length"], m.config.context, "{h}");
    assert!(
        info["weight_types"]
            .as_array()
            .is_some_and(|t| !t.is_empty() && t.iter().all(Value::is_string)),
        "{h}"
    );
    let r = s.get("/v1/requests").await;
    assert_eq!(r["data"], json!([]));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_refuses_new_requests_with_503_and_finishes_in_flight() {
    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    let mut long = chat_body(60);
    long["stream"] = json!(true);
    let r = s.post("/v1/chat/completions", long).await;
    s.state.engine.begin_shutdown();
    let (code, v) = s.chat(chat_body(1)).await;
    assert_eq!(code, 503, "{v}");
    let text = r.text().await.expect("in-flight stream finishes");
    assert!(text.contains("[DONE]"));
    s.stop().await;
}
