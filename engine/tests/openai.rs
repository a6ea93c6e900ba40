//! The OpenAI API for real clients, on a tiny synthetic model (random weights, a byte
//! vocabulary, a ChatML template without tool support): every field honored or refused with a
//! 400 naming it, structured outputs that always parse and validate, tool calls in the generic
//! format, logprobs, `n` > 1 sharing the prompt, `/tokenize` and `/detokenize`, and what the
//! request span says about all of it.

mod support;

use opentelemetry::Value as OtelValue;
use opentelemetry_sdk::trace::SpanData;
use serde_json::{Value, json};
use slotlight_engine::model::loader::Model;
use slotlight_engine::model::testing::TinyLlama;
use slotlight_otel::{attr, span};
use support::server::{Options, TestServer};

/// The tiny model with room for the generic tool prompt (every byte is a token), and every
/// printable ASCII byte, space and newline in its vocabulary.
fn model() -> Model {
    let path = TinyLlama {
        context: 4096,
        vocab: 3 + 94 + 2,
        ..TinyLlama::default()
    }
    .write_temp();
    Model::load(&path).expect("tiny model")
}

async fn server(m: &Model) -> TestServer {
    TestServer::start(
        m,
        Options {
            ctx_size: 4096,
            kv_tokens: 16384,
            ..Options::default()
        },
    )
    .await
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn param_of(v: &Value) -> &str {
    v["error"]["param"].as_str().unwrap_or("")
}

fn attr_of<'a>(s: &'a SpanData, key: &str) -> Option<&'a OtelValue> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_is_honored_or_refused_by_name() {
    let m = model();
    let s = server(&m).await;
    let base = || json!({"messages": user("hi"), "max_tokens": 2});
    // Refused: a 400 in OpenAI's shape, `param` naming the field.
    let refused: &[(&str, Value)] = &[
        ("audio", json!({"voice": "alloy", "format": "wav"})),
        ("functions", json!([{"name": "f"}])),
        ("function_call", json!("auto")),
        ("reasoning_effort", json!("high")),
        ("verbosity", json!("low")),
        ("web_search_options", json!({})),
        ("metadata", json!({"k": "v"})),
        ("store", json!(true)),
        ("service_tier", json!("flex")),
        ("modalities", json!(["text", "audio"])),
        ("cache_prompt", json!(false)),
        ("guided_json", json!({"type": "object"})),
        ("some_unknown_field", json!(1)),
        ("stream_options", json!({"include_usage": true})),
    ];
    for (field, value) in refused {
        let mut body = base();
        body[*field] = value.clone();
        let (code, v) = s.chat(body).await;
        assert_eq!(code, 400, "{field}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{field}: {v}");
        assert_eq!(param_of(&v), *field, "{field}: {v}");
    }
    // Nested fields are named by their path.
    let mut body = base();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true, "bogus": 1});
    let (code, v) = s.chat(body).await;
    assert_eq!((code, param_of(&v)), (400, "stream_options.bogus"), "{v}");
    let (code, v) = s
        .chat(json!({"messages": [{"role": "user", "content": "x", "colour": "red"}]}))
        .await;
    assert_eq!((code, param_of(&v)), (400, "messages[0].colour"), "{v}");
    let (code, v) = s
        .chat(json!({"messages": user("x"), "temperature": "hot"}))
        .await;
    assert_eq!((code, param_of(&v)), (400, "temperature"), "{v}");
    // Completions refuse their own unsupported fields too.
    for (field, value) in [
        ("suffix", json!("x")),
        ("best_of", json!(3)),
        ("bogus", json!(true)),
    ] {
        let mut body = json!({"prompt": "ab", "max_tokens": 2});
        body[field] = value;
        let r = s.post("/v1/completions", body).await;
        assert_eq!(r.status().as_u16(), 400, "{field}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(param_of(&v), field, "{v}");
    }
    // Accepted: explicit nulls, settings that match what the engine does, and the extras.
    let mut body = base();
    for k in [
        "logprobs",
        "tools",
        "functions",
        "metadata",
        "seed",
        "stop",
        "some_unknown_field",
    ] {
        body[k] = Value::Null;
    }
    body["store"] = json!(false);
    body["service_tier"] = json!("auto");
    body["modalities"] = json!(["text"]);
    body["cache_prompt"] = json!(true);
    body["parallel_tool_calls"] = json!(true);
    body["top_k"] = json!(5);
    body["min_p"] = json!(0.05);
    body["repetition_penalty"] = json!(1.1);
    body["ignore_eos"] = json!(true);
    body["logit_bias"] = json!({"40": -100});
    body["prompt_cache_key"] = json!("conv-1");
    body["safety_identifier"] = json!("u-1");
    body["user"] = json!("u-1");
    body["messages"] = json!([
        {"role": "developer", "content": "be brief", "name": "ops"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "hello", "refusal": null, "tool_calls": null},
        {"role": "user", "content": "again"}
    ]);
    let (code, v) = s.chat(body).await;
    assert_eq!(code, 200, "{v}");
    // logit_bias is honored: a banned token never comes out.
    let mut body = json!({"prompt": "ab", "max_tokens": 40, "ignore_eos": true, "temperature": 1.5, "seed": 3});
    let (_, plain) = {
        let r = s.post("/v1/completions", body.clone()).await;
        (200, r.json::<Value>().await.expect("json"))
    };
    let text = plain["choices"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let Some(common) = text.bytes().next() else {
        panic!("no text: {plain}");
    };
    let id = m
        .tokenizer
        .encode(&char::from(common).to_string(), false)
        .expect("encodes")[0];
    let mut bias = serde_json::Map::new();
    bias.insert(id.to_string(), json!(-100));
    body["logit_bias"] = Value::Object(bias);
    let r = s.post("/v1/completions", body.clone()).await;
    let v: Value = r.json().await.expect("json");
    let banned = v["choices"][0]["text"].as_str().unwrap_or("");
    assert!(
        !banned.contains(char::from(common)),
        "{banned:?} has {common}"
    );
    body["logit_bias"] = json!({"999999": 1});
    let r = s.post("/v1/completions", body).await;
    assert_eq!(r.status().as_u16(), 400);
    s.stop().await;
}

/// A hand check of the schema used below, since there is no JSON-schema validator here.
fn check_person(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    let keys: Vec<&String> = o.keys().collect();
    if keys != ["name", "age", "pet"] {
        return Err(format!("keys {keys:?}"));
    }
    let name = o["name"].as_str().ok_or("name")?;
    if name.is_empty() || name.chars().count() > 6 {
        return Err(format!("name {name:?}"));
    }
    let age = o["age"].as_i64().ok_or("age")?;
    if !(0..=120).contains(&age) {
        return Err(format!("age {age}"));
    }
    if !matches!(o["pet"].as_str(), Some("cat" | "dog")) {
        return Err(format!("pet {}", o["pet"]));
    }
    Ok(())
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pet": {"enum": ["cat", "dog"]}
        },
        "required": ["name", "age", "pet"],
        "additionalProperties": false
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_outputs_always_parse_and_validate() {
    let m = model();
    let s = server(&m).await;
    // A random model writes anything; the mask makes every reply valid, whatever the seed.
    for seed in 0..6 {
        let (code, v) = s
            .chat(json!({
                "messages": user("a person please"),
                "max_tokens": 120,
                "temperature": 1.0,
                "seed": seed,
                "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema(), "strict": true}}
            }))
            .await;
        assert_eq!(code, 200, "{v}");
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "stop", "{v}");
        let text = c["message"]["content"].as_str().unwrap_or("");
        let parsed: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        check_person(&parsed).unwrap_or_else(|e| panic!("{text}: {e}"));
    }
    // json_object; vLLM's structured_outputs; llama.cpp's json_schema and grammar.
    let (code, v) = s
        .chat(json!({"messages": user("x"), "max_tokens": 200, "seed": 1, "response_format": {"type": "json_object"}}))
        .await;
    assert_eq!(code, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()),
            "{text}"
        );
    } else {
        assert!(text.starts_with('{'), "{text}");
    }
    let cases = [
        (
            json!({"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}),
            "^[0-9]{3}-[a-z]{2}$",
        ),
        (
            json!({"structured_outputs": {"choice": ["yes", "no", "maybe"]}}),
            "^(yes|no|maybe)$",
        ),
        (
            json!({"structured_outputs": {"grammar": "start: \"a\" B\nB: /[xyz]{2}/"}}),
            "^a[xyz]{2}$",
        ),
        (
            json!({"grammar": "start: (\"ab\" | \"cd\")+ \"!\""}),
            "^(ab|cd)+!$",
        ),
    ];
    for (extra, pattern) in cases {
        for seed in 0..3 {
            let mut body = json!({"messages": user("x"), "max_tokens": 60, "seed": seed});
            for (k, v) in extra.as_object().expect("object") {
                body[k] = v.clone();
            }
            let (code, v) = s.chat(body).await;
            assert_eq!(code, 200, "{extra}: {v}");
            let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
            if v["choices"][0]["finish_reason"] != "stop" {
                continue; // a repetition cut by max_tokens
            }
            let rx = regex_lite(pattern);
            assert!(rx(text), "{extra}: {text:?} does not match {pattern}");
        }
    }
    for seed in 0..3 {
        let r = s
            .post(
                "/v1/completions",
                json!({"prompt": "person:", "max_tokens": 120, "seed": seed, "json_schema": person_schema()}),
            )
            .await;
        let v: Value = r.json().await.expect("json");
        let text = v["choices"][0]["text"].as_str().unwrap_or("");
        check_person(&serde_json::from_str(text).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{text}: {e}"));
    }
    // Streaming: the chunks concatenate to a valid reply.
    let (chunks, done) = s
        .stream(
            "/v1/chat/completions",
            json!({"messages": user("x"), "max_tokens": 120, "stream": true, "seed": 9,
                   "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": person_schema()}}}),
        )
        .await;
    assert!(done);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    check_person(&serde_json::from_str(&text).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{text}: {e}"));
    s.stop().await;
}

/// A tiny matcher for the anchored patterns above: alternatives of literal pieces, classes
/// with counts, and `+` on a group (enough for these cases; no regex crate in the tree).
fn regex_lite(pattern: &str) -> impl Fn(&str) -> bool {
    let p = pattern.to_string();
    move |text: &str| match p.as_str() {
        "^[0-9]{3}-[a-z]{2}$" => {
            let b = text.as_bytes();
            b.len() == 6
                && b[..3].iter().all(u8::is_ascii_digit)
                && b[3] == b'-'
                && b[4..].iter().all(u8::is_ascii_lowercase)
        }
        "^(yes|no|maybe)$" => matches!(text, "yes" | "no" | "maybe"),
        "^a[xyz]{2}$" => {
            text.len() == 3 && text.starts_with('a') && text[1..].chars().all(|c| "xyz".contains(c))
        }
        "^(ab|cd)+!$" => {
            let Some(body) = text.strip_suffix('!') else {
                return false;
            };
            !body.is_empty()
                && body.len() % 2 == 0
                && body.as_bytes().chunks(2).all(|c| c == b"ab" || c == b"cd")
        }
        other => panic!("no matcher for {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_answer_shape_sits_beside_generic_tool_calls() {
    let m = model();
    let s = server(&m).await;
    let weather = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}});
    let schema = json!({"type": "object", "properties": {"a": {"enum": ["x"]}}, "required": ["a"]});
    for seed in 0..4 {
        let (code, v) = s
            .chat(json!({"messages": user("x"), "max_tokens": 120, "seed": seed, "tools": [weather],
                         "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}))
            .await;
        assert_eq!(code, 200, "{v}");
        let c = &v["choices"][0];
        if c["finish_reason"] == "length" {
            continue;
        }
        // Either calls, or an answer that follows the schema.
        let calls = c["message"]["tool_calls"].as_array().map_or(0, Vec::len);
        if calls == 0 {
            let text = c["message"]["content"].as_str().unwrap_or("");
            assert_eq!(
                serde_json::from_str::<Value>(text).ok(),
                Some(json!({"a": "x"})),
                "{v}"
            );
        } else {
            assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        }
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schemas_grammars_and_tools_are_400s_and_the_engine_serves_on() {
    let m = model();
    let s = server(&m).await;
    let weather = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format.json_schema",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (
            json!({"structured_outputs": {"regex": "a("}}),
            "structured_outputs",
        ),
        (
            json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}),
            "structured_outputs",
        ),
        (
            json!({"structured_outputs": {"json": "{not json"}}),
            "structured_outputs.json",
        ),
        (json!({"grammar": "root ::= \"a\""}), "grammar"),
        (json!({"grammar": "start: undefined_rule"}), "grammar"),
        (
            json!({"json_schema": {"type": "object"}, "grammar": "start: \"a\""}),
            "grammar",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}),
            "tools[0].function.name",
        ),
        (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
        (
            json!({"tools": [weather, weather]}),
            "tools[1].function.name",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}}]}),
            "tools",
        ),
        (
            json!({"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": [weather], "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        // A JSON answer shape may sit beside the generic format's calls; a regex cannot.
        (
            json!({"tools": [weather], "structured_outputs": {"regex": "[a-z]+"}}),
            "structured_outputs",
        ),
        (
            json!({"logprobs": false, "top_logprobs": 3}),
            "top_logprobs",
        ),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (json!({"n": 0}), "n"),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].tool_call_id",
        ),
    ];
    for (extra, param) in cases {
        let mut body = json!({"messages": user("x"), "max_tokens": 4});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let (code, v) = s.chat(body).await;
        assert_eq!(code, 400, "{extra}: {v}");
        assert_eq!(param_of(&v), param, "{extra}: {v}");
        assert!(
            v["error"]["message"].as_str().is_some_and(|m| m.len() > 10),
            "{v}"
        );
    }
    // Nothing was queued, and the engine still serves.
    let (code, v) = s
        .chat(json!({"messages": user("x"), "max_tokens": 3}))
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(s.state.engine.in_flight(), 0);
    s.stop().await;
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 8}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}
        }},
        {"type": "function", "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 5}}, "required": ["zone"], "additionalProperties": false}
        }}
    ])
}

fn check_call(call: &Value) -> (String, Value) {
    assert_eq!(call["type"], "function");
    assert!(
        call["id"].as_str().is_some_and(|i| i.starts_with("call")),
        "{call}"
    );
    let name = call["function"]["name"].as_str().unwrap_or("").to_string();
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{call}: {e}"));
    match name.as_str() {
        "get_weather" => {
            let city = args["city"].as_str().unwrap_or("");
            assert!(!city.is_empty() && city.chars().count() <= 8, "{args}");
            assert!(matches!(args["unit"].as_str(), Some("c" | "f")), "{args}");
        }
        "get_time" => assert!(
            args["zone"].as_str().is_some_and(|z| z.len() <= 5),
            "{args}"
        ),
        other => panic!("unknown tool {other}"),
    }
    (name, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_in_the_generic_format() {
    let m = model();
    let s = server(&m).await;
    // `required`: always a call, whatever the seed, with valid arguments. (One call: a random
    // model given parallel calls may list them until `max_tokens`.)
    for seed in 0..4 {
        let (code, v) = s
            .chat(json!({"messages": user("weather in Oslo?"), "tools": tools(), "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 200, "seed": seed}))
            .await;
        assert_eq!(code, 200, "{v}");
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        assert!(c["message"]["content"].is_null(), "{v}");
        let calls = c["message"]["tool_calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 1);
        check_call(&calls[0]);
    }
    // Parallel calls (asked for: the generic format defaults to one): every call listed is valid.
    let (code, v) = s
        .chat(json!({"messages": user("weather in Oslo?"), "tools": tools(), "tool_choice": "required", "parallel_tool_calls": true, "max_tokens": 300, "seed": 8}))
        .await;
    assert_eq!(code, 200, "{v}");
    if v["choices"][0]["finish_reason"] == "tool_calls" {
        for call in v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .expect("calls")
        {
            check_call(call);
        }
    }
    // A named function, one call only without parallel calls.
    let (code, v) = s
        .chat(json!({"messages": user("time?"), "tools": tools(), "max_tokens": 200, "seed": 5,
                     "tool_choice": {"type": "function", "function": {"name": "get_time"}}, "parallel_tool_calls": false}))
        .await;
    assert_eq!(code, 200, "{v}");
    let calls = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .expect("calls");
    assert_eq!(calls.len(), 1);
    let (name, args) = check_call(&calls[0]);
    assert_eq!(name, "get_time");
    // The loop: the call and its result go back; the next turn is an answer or another call.
    let (code, v) = s
        .chat(json!({
            "messages": [
                {"role": "user", "content": "time?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": calls[0]["id"], "type": "function", "function": {"name": "get_time", "arguments": args.to_string()}}]},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": "12:00"}
            ],
            "tools": tools(), "max_tokens": 200, "seed": 2
        }))
        .await;
    assert_eq!(code, 200, "{v}");
    let c = &v["choices"][0];
    if c["finish_reason"] == "tool_calls" {
        for call in c["message"]["tool_calls"].as_array().expect("calls") {
            check_call(call);
        }
    } else {
        assert!(c["message"]["content"].is_string(), "{v}");
        assert!(c["message"].get("tool_calls").is_none(), "{v}");
    }
    // `none`: plain text, no grammar.
    let (code, v) = s
        .chat(json!({"messages": user("hi"), "tools": tools(), "tool_choice": "none", "max_tokens": 5, "ignore_eos": true}))
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Streaming: the call arrives whole in `delta.tool_calls`, then `tool_calls` as the reason.
    let (chunks, done) = s
        .stream(
            "/v1/chat/completions",
            json!({"messages": user("weather?"), "tools": tools(), "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 200, "stream": true, "seed": 1}),
        )
        .await;
    assert!(done);
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert!(!calls.is_empty(), "{chunks:?}");
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(call["index"], i);
        check_call(call);
    }
    let reasons: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|r| !r.is_null())
        .collect();
    assert_eq!(reasons, vec!["tool_calls"]);
    // The request span says what was asked and what came out, never the arguments.
    let roots = s.spans.request_spans(9).await;
    let last = roots
        .iter()
        .find(|r| attr_of(r, attr::GEN_AI_REQUEST_STREAM).is_some_and(|v| v.as_str() == "true"))
        .expect("the streamed request");
    // A streamed request's time to its first chunk (the GenAI conventions' name) is its time
    // to first token; a whole response has none.
    assert_eq!(
        attr_of(last, attr::GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK),
        attr_of(last, attr::GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN)
    );
    assert!(attr_of(last, attr::GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK).is_some());
    let whole = roots
        .iter()
        .find(|r| attr_of(r, attr::GEN_AI_REQUEST_STREAM).is_some_and(|v| v.as_str() == "false"))
        .expect("a whole response");
    assert!(attr_of(whole, attr::GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK).is_none());
    assert_eq!(
        attr_of(last, attr::TOOLS_CHOICE).map(|v| v.as_str().into_owned()),
        Some("required".into())
    );
    assert_eq!(
        attr_of(last, attr::TOOLS_FORMAT).map(|v| v.as_str().into_owned()),
        Some("generic".into())
    );
    assert_eq!(
        attr_of(last, attr::CONSTRAINT_KIND).map(|v| v.as_str().into_owned()),
        Some("tools".into())
    );
    let Some(OtelValue::I64(n)) = attr_of(last, attr::TOOLS_CALLS) else {
        panic!("no tool call count");
    };
    assert_eq!(*n as usize, calls.len());
    let names = attr_of(last, attr::TOOLS_NAMES).map(|v| v.as_str().into_owned());
    assert!(names.is_some_and(|n| n.contains("get_weather") && n.contains("get_time")));
    let Some(OtelValue::F64(mask_ms)) = attr_of(last, attr::CONSTRAINT_MASK_MS) else {
        panic!("no mask time");
    };
    assert!(*mask_ms > 0.0);
    let arguments = check_call(calls[0]).1.to_string();
    for sp in s.spans.spans() {
        for kv in &sp.attributes {
            assert!(
                !kv.value.as_str().contains(&arguments),
                "{} carries the arguments in {}",
                sp.name,
                kv.key
            );
        }
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_in_both_shapes_streamed_and_not() {
    let m = model();
    let s = server(&m).await;
    let (code, v) = s
        .chat(json!({"messages": user("hi"), "max_tokens": 8, "ignore_eos": true, "temperature": 0, "logprobs": true, "top_logprobs": 3}))
        .await;
    assert_eq!(code, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content");
    assert_eq!(content.len(), 8);
    let mut text = String::new();
    for t in content {
        let lp = t["logprob"].as_f64().expect("logprob");
        assert!(lp <= 0.0);
        let top = t["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 3);
        let tops: Vec<f64> = top
            .iter()
            .map(|x| x["logprob"].as_f64().unwrap_or(1.0))
            .collect();
        assert!(tops.windows(2).all(|w| w[0] >= w[1]), "{tops:?}");
        assert!(tops.iter().map(|l| l.exp()).sum::<f64>() <= 1.0 + 1e-6);
        // Greedy picks the most likely token: it is the first alternative.
        assert_eq!(top[0]["token"], t["token"]);
        assert!((tops[0] - lp).abs() < 1e-6);
        let bytes: Vec<u8> = t["bytes"]
            .as_array()
            .expect("bytes")
            .iter()
            .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect();
        // Special tokens (the random model may pick one) are not part of the text.
        if !t["token"].as_str().unwrap_or("").starts_with("<|") {
            text.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    assert_eq!(
        text,
        v["choices"][0]["message"]["content"].as_str().unwrap_or("")
    );
    // Without logprobs the field is null.
    let (_, v) = s
        .chat(json!({"messages": user("hi"), "max_tokens": 2}))
        .await;
    assert!(v["choices"][0]["logprobs"].is_null());
    // Streamed: every token's entry arrives once, in order.
    let (chunks, _) = s
        .stream(
            "/v1/chat/completions",
            json!({"messages": user("hi"), "max_tokens": 8, "ignore_eos": true, "temperature": 0, "logprobs": true, "stream": true}),
        )
        .await;
    let streamed: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .collect();
    assert_eq!(streamed.len(), 8);
    for (a, b) in streamed.iter().zip(content) {
        assert_eq!(a["token"], b["token"]);
        assert!(
            (a["logprob"].as_f64().unwrap_or(0.0) - b["logprob"].as_f64().unwrap_or(1.0)).abs()
                < 1e-6
        );
    }
    // Completions: the legacy shape.
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": "abc", "max_tokens": 6, "ignore_eos": true, "temperature": 0, "logprobs": 2}),
        )
        .await;
    let v: Value = r.json().await.expect("json");
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(tokens.len(), 6);
    let text = v["choices"][0]["text"].as_str().unwrap_or("");
    let visible: Vec<&str> = tokens
        .iter()
        .copied()
        .filter(|t| !t.starts_with("<|"))
        .collect();
    assert_eq!(visible.concat(), text);
    // Each token's offset is where its text starts in the choice's text.
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .expect("offsets")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    let mut at = 0;
    for (t, o) in tokens.iter().zip(&offsets) {
        assert_eq!(*o, at, "{tokens:?} {offsets:?}");
        if !t.starts_with("<|") {
            at += t.chars().count() as u64;
        }
    }
    for (i, top) in lp["top_logprobs"]
        .as_array()
        .expect("top")
        .iter()
        .enumerate()
    {
        let top = top.as_object().expect("map");
        assert!(!top.is_empty() && top.len() <= 2);
        assert!(
            top.contains_key(tokens[i]),
            "greedy token among the top: {top:?}"
        );
    }
    let (code, v) = {
        let r = s
            .post(
                "/v1/completions",
                json!({"prompt": "abc", "max_tokens": 2, "logprobs": 1, "echo": true}),
            )
            .await;
        (r.status().as_u16(), r.json::<Value>().await.expect("json"))
    };
    assert_eq!((code, param_of(&v)), (400, "echo"), "{v}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_share_the_prompt_and_add_up() {
    let m = model();
    let s = server(&m).await;
    // A prompt longer than a few KV blocks, so a fork has something to share.
    let long = "abcdefghij".repeat(8);
    let body = |n: u64| json!({"messages": user(&long), "max_tokens": 6, "ignore_eos": true, "temperature": 1.0, "seed": 11, "n": n});
    // n = 3 first, so that nothing of the prompt is cached before it.
    let (code, three) = s.chat(body(3)).await;
    assert_eq!(code, 200, "{three}");
    let (code, one) = s.chat(body(1)).await;
    assert_eq!(code, 200, "{one}");
    let choices = three["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
    }
    // Choice 0 has the request's own seed; the others seed + index.
    assert_eq!(
        choices[0]["message"]["content"],
        one["choices"][0]["message"]["content"]
    );
    let u = &three["usage"];
    assert_eq!(u["completion_tokens"], 18);
    assert_eq!(u["prompt_tokens"], one["usage"]["prompt_tokens"]);
    assert_eq!(
        u["total_tokens"],
        u["prompt_tokens"].as_u64().unwrap_or(0) + 18
    );
    let leg_choices: std::collections::BTreeSet<u64> = u["legs"]
        .as_array()
        .expect("legs")
        .iter()
        .filter_map(|l| l["choice"].as_u64())
        .collect();
    assert_eq!(leg_choices.into_iter().collect::<Vec<_>>(), vec![0, 1, 2]);
    // One prefill of the prompt; the forks compute only its last, partial block.
    let prompt = u["prompt_tokens"].as_i64().unwrap_or(0);
    let roots = s.spans.request_spans(2).await;
    let root = roots
        .iter()
        .find(|r| {
            matches!(
                attr_of(r, attr::GEN_AI_REQUEST_CHOICE_COUNT),
                Some(OtelValue::I64(3))
            )
        })
        .expect("the n=3 root");
    let trace = root.span_context.trace_id();
    let prefills: Vec<SpanData> = s
        .spans
        .spans()
        .into_iter()
        .filter(|x| x.span_context.trace_id() == trace && x.name == span::PREFILL)
        .collect();
    assert_eq!(prefills.len(), 3);
    let computed = |sp: &SpanData| match attr_of(sp, attr::PREFILL_COMPUTED_TOKENS) {
        Some(OtelValue::I64(v)) => *v,
        other => panic!("{other:?}"),
    };
    let choice = |sp: &SpanData| match attr_of(sp, attr::CHOICE_INDEX) {
        Some(OtelValue::I64(v)) => *v,
        other => panic!("{other:?}"),
    };
    let total: i64 = prefills.iter().map(computed).sum();
    for p in &prefills {
        if choice(p) > 0 {
            assert!(computed(p) <= 16, "a fork computed {} tokens", computed(p));
        }
    }
    assert!(
        total < prompt * 2,
        "{total} tokens prefilled for a {prompt}-token prompt"
    );
    let legs: Vec<SpanData> = s
        .spans
        .spans()
        .into_iter()
        .filter(|x| x.span_context.trace_id() == trace && x.name == span::LEG)
        .collect();
    let mut seen: Vec<i64> = legs.iter().map(choice).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, vec![0, 1, 2], "every choice's legs are in the trace");
    // Streaming n = 2: both indices, a finish for each, and one usage.
    let mut b = body(2);
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let (chunks, done) = s.stream("/v1/chat/completions", b).await;
    assert!(done);
    let mut finished = std::collections::BTreeSet::new();
    for c in &chunks {
        if let Some(r) = c["choices"][0]["finish_reason"].as_str() {
            assert_eq!(r, "length");
            finished.insert(c["choices"][0]["index"].as_u64().unwrap_or(9));
        }
    }
    assert_eq!(finished.into_iter().collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(
        chunks.last().expect("chunks")["usage"]["completion_tokens"],
        12
    );
    // Completions too.
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": long, "max_tokens": 3, "ignore_eos": true, "n": 2, "best_of": 2}),
        )
        .await;
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    s.stop().await;
}

/// POSTs `body` to `path`: the status and the JSON answer (null when it is not JSON).
fn post_json(
    s: &TestServer,
    path: &str,
    body: Value,
) -> impl std::future::Future<Output = (u16, Value)> + use<> {
    let c = s.client.clone();
    let url = s.url(path);
    async move {
        let r = c.post(url).json(&body).send().await.expect("send");
        (
            r.status().as_u16(),
            r.json::<Value>().await.unwrap_or(Value::Null),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_in_both_shapes() {
    let m = model();
    let s = server(&m).await;
    let post = |path: &'static str, body: Value| post_json(&s, path, body);
    let (code, v) = post("/tokenize", json!({"prompt": "abc"})).await;
    assert_eq!(code, 200, "{v}");
    let ids: Vec<u64> = v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(v["count"], ids.len());
    assert_eq!(ids.len(), 3);
    assert_eq!(v["max_model_len"], 4096);
    let (_, v) = post("/tokenize", json!({"content": "abc", "with_pieces": true})).await;
    let pieces: Vec<&str> = v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(|t| t["piece"].as_str())
        .collect();
    assert_eq!(pieces.concat(), "abc");
    let (_, v) = post(
        "/tokenize",
        json!({"prompt": "<|im_start|>a", "return_token_strs": true}),
    )
    .await;
    assert_eq!(v["count"], 2, "special tokens are parsed: {v}");
    assert_eq!(v["token_strs"][0], "<|im_start|>");
    // Messages count exactly what a chat request's prompt has.
    let messages =
        json!([{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]);
    let (_, t) = post("/tokenize", json!({"messages": messages})).await;
    let (_, c) = s.chat(json!({"messages": messages, "max_tokens": 1})).await;
    assert_eq!(t["count"], c["usage"]["prompt_tokens"], "{t} {c}");
    let (_, with_tools) = post("/tokenize", json!({"messages": messages, "tools": tools()})).await;
    let (_, c) = s
        .chat(json!({"messages": messages, "tools": tools(), "max_tokens": 1}))
        .await;
    assert!(with_tools["count"].as_u64() > t["count"].as_u64());
    assert_eq!(
        with_tools["count"], c["usage"]["prompt_tokens"],
        "{with_tools} {c}"
    );
    // Detokenize answers both names.
    let (code, v) = post("/detokenize", json!({"tokens": ids})).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["prompt"], "abc");
    assert_eq!(v["content"], "abc");
    for (path, body, param) in [
        ("/detokenize", json!({"tokens": [999_999]}), "tokens"),
        ("/detokenize", json!({}), "tokens"),
        ("/tokenize", json!({}), "prompt"),
        (
            "/tokenize",
            json!({"prompt": "a", "content": "b"}),
            "content",
        ),
        ("/tokenize", json!({"prompt": "a", "bogus": 1}), "bogus"),
        ("/tokenize", json!({"prompt": 5}), "prompt"),
    ] {
        let (code, v) = post(path, body.clone()).await;
        assert_eq!(code, 400, "{path} {body}: {v}");
        assert_eq!(param_of(&v), param, "{path} {body}: {v}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_answers_the_token_ids_a_request_would_compute() {
    let m = model();
    let s = server(&m).await;
    let post = |path: &'static str, body: Value| post_json(&s, path, body);
    let ids = |v: &Value| -> Vec<u64> {
        v.as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
    // A whole chat body, as a client sends it to /v1/chat/completions (sampling and all).
    let messages =
        json!([{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]);
    let body = json!({"messages": messages, "tools": tools(), "max_tokens": 1, "temperature": 0.5, "stream": false});
    let (code, r) = post("/v1/chat/completions/render", body.clone()).await;
    assert_eq!(code, 200, "{r}");
    assert!(
        r["request_id"]
            .as_str()
            .is_some_and(|i| i.starts_with("chatcmpl-")),
        "{r}"
    );
    assert!(r["model"].is_string(), "{r}");
    let (_, t) = post("/tokenize", json!({"messages": messages, "tools": tools()})).await;
    assert_eq!(ids(&r["token_ids"]), ids(&t["tokens"]));
    let (_, c) = s.chat(body).await;
    assert_eq!(
        r["token_ids"].as_array().map(Vec::len),
        c["usage"]["prompt_tokens"].as_u64().map(|n| n as usize)
    );
    // vLLM's add_generation_prompt: without it, the prompt ends after the last message.
    let (_, bare) = post(
        "/v1/chat/completions/render",
        json!({"messages": messages, "add_generation_prompt": false}),
    )
    .await;
    let (_, t) = post(
        "/tokenize",
        json!({"messages": messages, "add_generation_prompt": false}),
    )
    .await;
    assert_eq!(ids(&bare["token_ids"]), ids(&t["tokens"]));
    assert!(ids(&bare["token_ids"]).len() < ids(&r["token_ids"]).len());
    // Completions: a list of one rendered prompt.
    let (code, r) = post(
        "/v1/completions/render",
        json!({"prompt": "abc", "max_tokens": 4}),
    )
    .await;
    assert_eq!(code, 200, "{r}");
    assert!(
        r[0]["request_id"]
            .as_str()
            .is_some_and(|i| i.starts_with("cmpl-")),
        "{r}"
    );
    let (_, t) = post("/tokenize", json!({"prompt": "abc"})).await;
    assert_eq!(ids(&r[0]["token_ids"]), ids(&t["tokens"]));
    // What the generation endpoint refuses, render refuses, in the same format.
    for (path, body, param) in [
        ("/v1/chat/completions/render", json!({}), "messages"),
        (
            "/v1/chat/completions/render",
            json!({"messages": messages, "bogus": 1}),
            "bogus",
        ),
        (
            "/v1/chat/completions/render",
            json!({"messages": messages, "continue_final_message": true}),
            "continue_final_message",
        ),
        (
            "/v1/chat/completions/render",
            json!({"messages": messages, "add_generation_prompt": "yes"}),
            "add_generation_prompt",
        ),
        (
            "/v1/completions/render",
            json!({"prompt": [999_999]}),
            "prompt",
        ),
        ("/v1/completions/render", json!({}), "prompt"),
    ] {
        let (code, v) = post(path, body.clone()).await;
        assert_eq!(code, 400, "{path} {body}: {v}");
        assert_eq!(param_of(&v), param, "{path} {body}: {v}");
    }
    let (code, v) = post(
        "/v1/completions/render",
        json!({"prompt": "a", "model": "another"}),
    )
    .await;
    assert_eq!(code, 404, "{v}");
    s.stop().await;
}

/// A Qwen 2.5-style template (Hermes tool format), abridged.
const HERMES_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
You may call functions. Signatures: <tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>
For each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>
{% endif %}{%- for message in messages %}{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{% for tc in message.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

/// A Llama 3.1-style template (JSON tool format), abridged.
const LLAMA3_TEMPLATE: &str = r#"{%- if tools is not none %}<|im_start|>system
Given the following functions, respond with a JSON for a function call with its proper arguments. Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. {% for t in tools %}{{ t | tojson }}{% endfor %}<|im_end|>
{% endif %}{%- for message in messages %}<|im_start|>{{ message.role }}
{%- if message.tool_calls %}{{ message.tool_calls[0].function | tojson }}{% else %}{{ message.content }}{% endif %}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_templates_get_their_own_format() {
    for (template, format) in [
        (HERMES_TEMPLATE, "hermes"),
        (LLAMA3_TEMPLATE, "llama3_json"),
    ] {
        let mut m = model();
        m.chat_template = Some(std::sync::Arc::new(
            slotlight_engine::chat_template::ChatTemplate::new(template, None, None)
                .expect("template compiles"),
        ));
        let s = server(&m).await;
        // Enforced by a grammar in the model's own format, parsed back into tool_calls.
        for seed in 0..3 {
            let (code, v) = s
                .chat(json!({"messages": user("weather?"), "tools": tools(), "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 200, "seed": seed}))
                .await;
            assert_eq!(code, 200, "{format}: {v}");
            let c = &v["choices"][0];
            assert_eq!(c["finish_reason"], "tool_calls", "{format}: {v}");
            let calls = c["message"]["tool_calls"].as_array().expect("calls");
            assert_eq!(calls.len(), 1, "{format}: {v}");
            check_call(&calls[0]);
        }
        // The tools reached the template: the prompt is longer with them.
        let (_, with) = s
            .chat(json!({"messages": user("hi"), "tools": tools(), "max_tokens": 1}))
            .await;
        let (_, without) = s
            .chat(json!({"messages": user("hi"), "max_tokens": 1}))
            .await;
        assert!(
            with["usage"]["prompt_tokens"].as_u64() > without["usage"]["prompt_tokens"].as_u64()
        );
        // `auto` in a native format: whatever the model wrote comes back, as text or calls.
        let (code, v) = s
            .chat(json!({"messages": user("hi"), "tools": tools(), "max_tokens": 30, "seed": 1}))
            .await;
        assert_eq!(code, 200, "{v}");
        let msg = &v["choices"][0]["message"];
        assert!(
            msg["content"].is_string() || msg["tool_calls"].is_array(),
            "{v}"
        );
        // History with calls and results renders through the template.
        let (code, v) = s
            .chat(json!({
                "messages": [
                    {"role": "user", "content": "time?"},
                    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{\"zone\":\"UTC\"}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}
                ],
                "tools": tools(), "max_tokens": 3
            }))
            .await;
        assert_eq!(code, 200, "{format}: {v}");
        let roots = s.spans.request_spans(3).await;
        assert!(
            roots
                .iter()
                .any(|r| attr_of(r, attr::TOOLS_FORMAT).is_some_and(|v| v.as_str() == format))
        );
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_returns_the_prompt_first_and_json_requests_say_so_on_their_span() {
    let m = model();
    let s = server(&m).await;
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": "abc", "max_tokens": 3, "ignore_eos": true, "echo": true}),
        )
        .await;
    let v: Value = r.json().await.expect("json");
    let text = v["choices"][0]["text"].as_str().unwrap_or("");
    assert!(text.starts_with("abc") && text.len() > 3, "{v}");
    let (chunks, _) = s
        .stream(
            "/v1/completions",
            json!({"prompt": "abc", "max_tokens": 3, "ignore_eos": true, "echo": true, "stream": true}),
        )
        .await;
    assert_eq!(chunks[0]["choices"][0]["text"], "abc");
    let (code, _) = s
        .chat(json!({"messages": user("x"), "max_tokens": 40, "response_format": {"type": "json_object"}}))
        .await;
    assert_eq!(code, 200);
    let roots = s.spans.request_spans(3).await;
    let json_root = roots
        .iter()
        .find(|r| attr_of(r, attr::CONSTRAINT_KIND).is_some())
        .expect("the constrained request");
    assert_eq!(
        attr_of(json_root, attr::CONSTRAINT_KIND).map(|v| v.as_str().into_owned()),
        Some("json_object".into())
    );
    assert_eq!(
        attr_of(json_root, attr::GEN_AI_OUTPUT_TYPE).map(|v| v.as_str().into_owned()),
        Some("json".into())
    );
    let Some(OtelValue::I64(masks)) = attr_of(json_root, attr::CONSTRAINT_MASKS) else {
        panic!("no mask count");
    };
    assert!(*masks >= 1);
    // Unconstrained requests carry none of it.
    assert!(
        roots
            .iter()
            .filter(|r| attr_of(r, attr::CONSTRAINT_KIND).is_none())
            .all(|r| attr_of(r, attr::CONSTRAINT_MASK_MS).is_none()
                && attr_of(r, attr::TOOLS_NAMES).is_none())
    );
    s.stop().await;
}

/// A thinking template: ChatML turns, an assistant's echoed `reasoning_content` rendered in a
/// `<think>` block, and a generation prompt that opens `<think>` unless `enable_thinking` is
/// false, when it closes an empty block (Qwen 3's way of turning thinking off).
const THINKING_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if message.reasoning_content %}{{ '<think>\n' + message.reasoning_content + '\n</think>\n\n' }}{% endif %}{{ message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% else %}{{ '<think>\n' }}{% endif %}{% endif %}";

/// `logit_bias` that bans the newline token (`Ċ`, the last of the tiny vocabulary).
fn no_newline() -> Value {
    json!({"98": -100})
}

/// The text a raw completion of `prompt` generates (seeded, `max_tokens` tokens, newlines
/// banned: the tiny model otherwise repeats them after `<think>\n`): what the chat with the
/// same rendered prompt and options generates too.
async fn raw_completion(s: &TestServer, prompt: &str, max_tokens: usize) -> String {
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": max_tokens, "seed": 5, "ignore_eos": true, "logit_bias": no_newline()}),
        )
        .await;
    let v: Value = r.json().await.expect("json");
    v["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("a completion: {v}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_templates_split_reasoning_and_take_template_kwargs() {
    let mut m = model();
    m.chat_template = Some(std::sync::Arc::new(
        slotlight_engine::chat_template::ChatTemplate::new(THINKING_TEMPLATE, None, None)
            .expect("template compiles"),
    ));
    let s = server(&m).await;
    let ask = |extra: Value| {
        let mut body = json!({"messages": user("hi"), "max_tokens": 12, "seed": 5, "ignore_eos": true, "logit_bias": no_newline()});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        body
    };
    // The prompt opens `<think>`: the whole reply (cut by length) is reasoning, and every
    // generated token counts as a reasoning token.
    let opened = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n";
    let raw = raw_completion(&s, opened, 12).await;
    let (code, v) = s.chat(ask(json!({}))).await;
    assert_eq!(code, 200, "{v}");
    let msg = &v["choices"][0]["message"];
    let reasoning = raw.trim();
    assert!(
        !reasoning.is_empty(),
        "the tiny model wrote only blanks: {raw:?}"
    );
    assert_eq!(msg["reasoning_content"], reasoning, "{v}");
    assert_eq!(msg["content"], "", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 12, "{v}");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"], 12,
        "{v}"
    );
    let opened_tokens = v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    // Streamed: the same reasoning, in `delta.reasoning_content`, and no content.
    let (chunks, done) = s
        .stream(
            "/v1/chat/completions",
            ask(json!({"stream": true, "stream_options": {"include_usage": true}})),
        )
        .await;
    assert!(done);
    let mut streamed = String::new();
    for c in &chunks {
        let Some(d) = c["choices"].get(0).map(|ch| &ch["delta"]) else {
            continue;
        };
        if let Some(r) = d["reasoning_content"].as_str() {
            streamed.push_str(r);
        }
        assert!(
            d["content"].is_null() || d["content"] == "",
            "content while reasoning: {c}"
        );
    }
    assert_eq!(streamed, reasoning);
    let last = chunks.last().expect("a usage chunk");
    assert_eq!(
        last["usage"]["completion_tokens_details"]["reasoning_tokens"], 12,
        "{last}"
    );
    // `chat_template_kwargs` reaches the template: `enable_thinking: false` closes the block,
    // so the reply is all content, exactly as generated.
    let closed = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    let raw = raw_completion(&s, closed, 12).await;
    let (code, v) = s
        .chat(ask(
            json!({"chat_template_kwargs": {"enable_thinking": false}}),
        ))
        .await;
    assert_eq!(code, 200, "{v}");
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["content"], raw.as_str(), "{v}");
    assert!(msg.get("reasoning_content").is_none(), "{v}");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"], 0,
        "{v}"
    );
    assert!(
        v["usage"]["prompt_tokens"].as_u64() > Some(opened_tokens),
        "{v}"
    );
    // `/tokenize` renders the same prompt with the same kwargs.
    let t = s
        .post(
            "/tokenize",
            json!({"messages": user("hi"), "chat_template_kwargs": {"enable_thinking": false}}),
        )
        .await;
    let t: Value = t.json().await.expect("json");
    assert_eq!(t["count"], v["usage"]["prompt_tokens"], "{t}");
    // With `n` = 2, the reasoning tokens of both choices add up.
    let (code, v) = s.chat(ask(json!({"n": 2}))).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 24, "{v}");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"], 24,
        "{v}"
    );
    for c in v["choices"].as_array().expect("choices") {
        assert!(c["message"]["reasoning_content"].is_string(), "{v}");
    }
    // A constraint cannot start inside an opened block; with thinking off it applies.
    let json_reply = json!({"response_format": {"type": "json_object"}, "max_tokens": 40});
    let (code, v) = s.chat(ask(json_reply.clone())).await;
    assert_eq!((code, param_of(&v)), (400, "response_format"), "{v}");
    let mut off = json_reply;
    off["chat_template_kwargs"] = json!({"enable_thinking": false});
    let (code, v) = s.chat(ask(off)).await;
    assert_eq!(code, 200, "{v}");
    // Bad kwargs are 400s naming them.
    for (kwargs, param) in [
        (json!("enable_thinking"), "chat_template_kwargs"),
        (json!([1]), "chat_template_kwargs"),
        (json!({"messages": []}), "chat_template_kwargs.messages"),
        (
            json!({"add_generation_prompt": false}),
            "chat_template_kwargs.add_generation_prompt",
        ),
        (json!({"tools": []}), "chat_template_kwargs.tools"),
    ] {
        let (code, v) = s.chat(ask(json!({"chat_template_kwargs": kwargs}))).await;
        assert_eq!((code, param_of(&v)), (400, param), "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
    // An assistant's echoed reasoning reaches the template; on a user message it is refused.
    let history = |reasoning: Value| {
        json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yes", "reasoning_content": reasoning},
            {"role": "user", "content": "ok"}
        ])
    };
    let (code, with) = s
        .chat(json!({"messages": history(json!("because")), "max_tokens": 1}))
        .await;
    assert_eq!(code, 200, "{with}");
    let (_, without) = s
        .chat(json!({"messages": history(json!("")), "max_tokens": 1}))
        .await;
    assert!(
        with["usage"]["prompt_tokens"].as_u64() > without["usage"]["prompt_tokens"].as_u64(),
        "{with} {without}"
    );
    let (code, v) = s
        .chat(json!({"messages": history(json!(7)), "max_tokens": 1}))
        .await;
    assert_eq!(
        (code, param_of(&v)),
        (400, "messages[1].reasoning_content"),
        "{v}"
    );
    let (code, v) = s
        .chat(json!({"messages": [{"role": "user", "content": "x", "reasoning_content": "r"}], "max_tokens": 1}))
        .await;
    assert_eq!(
        (code, param_of(&v)),
        (400, "messages[0].reasoning_content"),
        "{v}"
    );
    // The request span counts the reasoning tokens.
    let roots = s.spans.request_spans(4).await;
    assert!(
        roots.iter().any(|r| matches!(
            attr_of(r, attr::GEN_AI_USAGE_REASONING_OUTPUT_TOKENS),
            Some(OtelValue::I64(12))
        )),
        "no request span with 12 reasoning tokens"
    );
    s.stop().await;

    // A template without `<think>`: nothing of it on the wire.
    let plain = model();
    let s = server(&plain).await;
    let (code, v) = s
        .chat(json!({"messages": user("hi"), "max_tokens": 4, "chat_template_kwargs": {"enable_thinking": false}}))
        .await;
    assert_eq!(code, 200, "{v}");
    assert!(
        v["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{v}"
    );
    // No reasoning count (the details hold only the drafts' counts).
    assert!(
        v["usage"]["completion_tokens_details"]
            .get("reasoning_tokens")
            .is_none(),
        "{v}"
    );
    let roots = s.spans.request_spans(1).await;
    assert!(attr_of(&roots[0], attr::GEN_AI_USAGE_REASONING_OUTPUT_TOKENS).is_none());
    s.stop().await;
}

/// The tiny model with one more token, `</think>` (a user-defined token, kept in decoded
/// text, as Qwen 3's is), as its last id (99), and the thinking template.
fn model_with_think_close() -> Model {
    let tiny = TinyLlama {
        context: 4096,
        vocab: 100,
        ..TinyLlama::default()
    };
    let mut b = tiny.gguf();
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|t| (*t).to_string())
        .collect();
    tokens.extend((b'!'..=b'~').map(|c| char::from(c).to_string()));
    tokens.extend(["Ġ".to_string(), "Ċ".to_string(), "</think>".to_string()]);
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut types = vec![3, 3, 3];
    types.extend(std::iter::repeat_n(1, 96));
    types.push(4);
    b.kv_str_array("tokenizer.ggml.tokens", &refs);
    b.kv_i32_array("tokenizer.ggml.token_type", &types);
    b.kv_str("tokenizer.chat_template", THINKING_TEMPLATE);
    Model::load(&b.write_temp().1).expect("tiny model")
}

/// A reply that closes the block the prompt opened: its `</think>` token ends the reasoning
/// (empty, so left out) and counts as a reasoning token; what follows is content, whole and
/// streamed alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_think_token_ends_the_reasoning() {
    let m = model_with_think_close();
    let s = server(&m).await;
    // The bias makes `</think>` every token of the reply.
    let body = json!({"messages": user("hi"), "max_tokens": 4, "ignore_eos": true, "logit_bias": {"99": 100}});
    let (code, v) = s.chat(body.clone()).await;
    assert_eq!(code, 200, "{v}");
    let msg = &v["choices"][0]["message"];
    assert!(msg.get("reasoning_content").is_none(), "{v}");
    assert_eq!(msg["content"], "</think>".repeat(3), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"], 1,
        "{v}"
    );
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let (chunks, done) = s.stream("/v1/chat/completions", streamed).await;
    assert!(done);
    let mut content = String::new();
    for c in &chunks {
        if let Some(d) = c["choices"].get(0).map(|ch| &ch["delta"]) {
            assert!(d.get("reasoning_content").is_none(), "{c}");
            content.push_str(d["content"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(content, "</think>".repeat(3));
    s.stop().await;
}
