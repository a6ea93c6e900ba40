//! A reply the engine generated, sent back by the client, is prompted as the engine's own
//! tokens: on the default model, a tool call resent with its result (chat completions and
//! Messages), whose rendering by the template differs from the tokens the model generated,
//! makes the next turn a `full` resume of the session's KV, and the greedy continuation is
//! the same text as with the reply rendered from its text; a resent reply that differs from
//! the generated one is rendered as sent.

mod support;

use serde_json::{Value, json};
use slotlight_engine::model::loader::Model;
use support::server::{Options, TestServer};

async fn server(m: &Model) -> TestServer {
    TestServer::start(m, Options::default_model()).await
}

async fn post(s: &TestServer, path: &str, session: &str, body: Value) -> Value {
    let r = s
        .client
        .post(s.url(path))
        .header("x-session-id", session)
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    let v: Value = r.json().await.expect("json");
    assert_eq!(status, 200, "{path}: {v}");
    v
}

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_tool_call_is_the_engines_own_tokens_on_chat_completions() {
    let Some(path) = support::default_model() else {
        return;
    };
    let m = Model::load(&path).expect("model");
    let s = server(&m).await;
    let first = vec![
        json!({"role": "system", "content": "You call tools."}),
        json!({"role": "user", "content": "What is the weather in Paris?"}),
    ];
    let body = |messages: &[Value], max_tokens: u64| {
        json!({"messages": messages, "tools": [weather()], "tool_choice": "required",
               "temperature": 0, "max_tokens": max_tokens})
    };
    // The same `tool_choice` in every turn: the default model's (generic) tool prompt says it.
    let t1 = post(&s, "/v1/chat/completions", "s-chat", body(&first, 60)).await;
    let msg = &t1["choices"][0]["message"];
    let calls = msg["tool_calls"].as_array().expect("a tool call").clone();
    assert!(!calls.is_empty(), "{t1}");
    // The client sends the call back as returned, with its result.
    let mut second = first.clone();
    second.push(json!({"role": "assistant", "content": msg["content"], "tool_calls": calls}));
    second.push(json!({"role": "tool", "tool_call_id": calls[0]["id"], "content": "Sunny, 21 C."}));
    let t2 = post(&s, "/v1/chat/completions", "s-chat", body(&second, 24)).await;
    let u = &t2["usage"];
    assert_eq!(
        u["resume"], "full",
        "the resent call is the generated tokens: {u}"
    );
    let held = t1["usage"]["prompt_tokens"].as_u64().expect("prompt")
        + t1["usage"]["completion_tokens"]
            .as_u64()
            .expect("completion");
    // Everything the first turn left in the KV (its last token was sampled, never computed).
    assert_eq!(u["reusable_tokens"].as_u64(), Some(held - 1), "{u}");
    // The same conversation in a new session, the reply rendered from its text this time
    // (the engine forgot it): the template writes the call otherwise than the model did, so
    // the turn diverges inside the reply; the greedy answer is the same either way.
    post(&s, "/v1/chat/completions", "s-chat-2", body(&first, 60)).await;
    s.state.prompts.replies().clear();
    let again = post(&s, "/v1/chat/completions", "s-chat-2", body(&second, 24)).await;
    assert_eq!(again["usage"]["resume"], "diverged", "{}", again["usage"]);
    assert!(
        again["usage"]["diverged_at"].as_u64() > t1["usage"]["prompt_tokens"].as_u64(),
        "inside the reply: {}",
        again["usage"]
    );
    // (The call ids are new for each reply.)
    let answer = |v: &Value| {
        let m = &v["choices"][0]["message"];
        let calls: Vec<Value> = m["tool_calls"]
            .as_array()
            .map(|c| c.iter().map(|c| c["function"].clone()).collect())
            .unwrap_or_default();
        (m["content"].clone(), calls)
    };
    assert_eq!(
        answer(&again),
        answer(&t2),
        "greedy: the same continuation either way"
    );
    // A resent call that differs from the generated one is rendered as sent.
    s.state.prompts.replies().clear();
    let t1 = post(&s, "/v1/chat/completions", "s-chat-3", {
        let mut b = body(&first, 60);
        b["tool_choice"] = json!("required");
        b
    })
    .await;
    let mut edited = t1["choices"][0]["message"]["tool_calls"]
        .as_array()
        .expect("a tool call")
        .clone();
    edited[0]["function"]["arguments"] = json!("{\"city\": \"Lyon\"}");
    let mut third = first.clone();
    third.push(json!({"role": "assistant", "content": null, "tool_calls": edited}));
    third.push(json!({"role": "tool", "tool_call_id": edited[0]["id"], "content": "Rain."}));
    let t3 = post(&s, "/v1/chat/completions", "s-chat-3", body(&third, 8)).await;
    assert_ne!(t3["usage"]["resume"], "full", "{}", t3["usage"]);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_tool_use_block_is_the_engines_own_tokens_on_messages() {
    let Some(path) = support::default_model() else {
        return;
    };
    let m = Model::load(&path).expect("model");
    let s = server(&m).await;
    let tools = json!([{"name": "get_weather", "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]);
    let first = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let t1 = post(
        &s,
        "/v1/messages",
        "s-msg",
        json!({"system": "You call tools.", "messages": first, "tools": tools,
               "tool_choice": {"type": "any"}, "temperature": 0, "max_tokens": 60}),
    )
    .await;
    assert_eq!(t1["stop_reason"], "tool_use", "{t1}");
    let content = t1["content"].clone();
    let call = content
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
        .expect("a tool_use block")
        .clone();
    let mut second = first.as_array().expect("messages").clone();
    second.push(json!({"role": "assistant", "content": content}));
    second.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call["id"], "content": "Sunny, 21 C."}]}));
    let t2 = post(
        &s,
        "/v1/messages",
        "s-msg",
        json!({"system": "You call tools.", "messages": second, "tools": tools,
               "tool_choice": {"type": "any"}, "temperature": 0, "max_tokens": 24}),
    )
    .await;
    assert_eq!(t2["usage"]["resume"], "full", "{}", t2["usage"]);
    s.stop().await;
}

/// Claude Code's shape: no system prompt before the first message (the generic tool prompt
/// is then a message of its own, inserted before the conversation) and one tool called turn
/// after turn with the same arguments (replies of the same text and calls, told apart by
/// their `toolu_…` ids). Each later turn resends every earlier reply and resumes `full`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_calling_one_tool_again_and_again_resumes_full_each_turn() {
    let Some(path) = support::default_model() else {
        return;
    };
    let m = Model::load(&path).expect("model");
    let s = server(&m).await;
    let tools = json!([{"name": "list_files", "description": "Lists the files.",
        "input_schema": {"type": "object", "properties": {}}}]);
    let mut messages = vec![json!({"role": "user", "content": "Which files are there?"})];
    let mut ids = Vec::new();
    for turn in 0..3 {
        let r = post(
            &s,
            "/v1/messages",
            "s-agent",
            json!({"messages": messages, "tools": tools, "tool_choice": {"type": "any"},
                   "temperature": 0, "max_tokens": 40}),
        )
        .await;
        if turn > 0 {
            assert_eq!(r["usage"]["resume"], "full", "turn {turn}: {}", r["usage"]);
        }
        let content = r["content"].clone();
        let call = content
            .as_array()
            .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
            .expect("a tool_use block")
            .clone();
        ids.push(call["id"].clone());
        messages.push(json!({"role": "assistant", "content": content}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call["id"], "content": "README.md"}]}));
    }
    // Three calls, three ids, whatever their arguments.
    ids.dedup();
    assert_eq!(ids.len(), 3);
    s.stop().await;
}
