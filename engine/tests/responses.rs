//! The Responses API's stored state is exact: a response continued by `previous_response_id`
//! has a prompt that starts with the stored response's own prompt and reply token ids (never a
//! re-rendering of their text), on the default model with its real tokenizer and template; the
//! turn is a warm resume of the stored response's KV; and the span says which API it came
//! through.

mod support;

use serde_json::{Value, json};
use slotlight_engine::model::loader::Model;
use slotlight_engine::server::responses::store::ResponseStore;
use slotlight_otel::attr;
use support::server::{Options, TestServer};

async fn server(m: &Model) -> TestServer {
    TestServer::start(m, Options::default_model()).await
}

async fn create(s: &TestServer, body: Value) -> Value {
    let r = s.post("/v1/responses", body).await;
    let status = r.status().as_u16();
    let v: Value = r.json().await.expect("json");
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_starts_with_the_stored_prompt_and_reply_tokens() {
    let Some(path) = support::default_model() else {
        return;
    };
    let m = Model::load(&path).expect("model");
    let s = server(&m).await;
    // Digits after spaces: text the tokenizer may split otherwise than the model generated it.
    let r1 = create(
        &s,
        json!({"input": "Count from 1 to 12, separated by spaces.", "instructions": "Be brief.",
               "temperature": 0, "max_output_tokens": 40}),
    )
    .await;
    let id1 = r1["id"].as_str().expect("id");
    let r2 = create(
        &s,
        json!({"input": "Now backwards.", "instructions": "Be brief.", "temperature": 0,
               "max_output_tokens": 8, "previous_response_id": id1}),
    )
    .await;
    let id2 = r2["id"].as_str().expect("id");
    let first = s
        .state
        .responses
        .downcast_ref::<ResponseStore>()
        .expect("the Responses store")
        .get(id1)
        .await
        .expect("store")
        .expect("stored");
    let second = s
        .state
        .responses
        .downcast_ref::<ResponseStore>()
        .expect("the Responses store")
        .get(id2)
        .await
        .expect("store")
        .expect("stored");
    assert!(!first.reply_tokens.is_empty());
    let mut before = first.prompt_tokens.clone();
    before.extend_from_slice(&first.reply_tokens);
    assert!(
        second.prompt_tokens.starts_with(&before),
        "the continued prompt begins with the first turn's exact tokens"
    );
    assert!(second.prompt_tokens.len() > before.len());
    assert_eq!(
        r2["usage"]["input_tokens"].as_u64(),
        u64::try_from(second.prompt_tokens.len()).ok()
    );
    assert_eq!(r2["usage"]["resume"], "full", "{}", r2["usage"]);
    // The reply's tokens decode to the text the first response returned.
    let text = m.tokenizer.decode(&first.reply_tokens).expect("decode");
    let shown = r1["output"][0]["content"][0]["text"]
        .as_str()
        .expect("text");
    assert_eq!(text.trim_end(), shown.trim_end());
    // Both request spans say which API they came through; the continuation says which
    // response it continued (the GenAI conventions' name).
    let spans = request_spans(&s, 2).await;
    let apis: Vec<&str> = spans
        .iter()
        .filter_map(|x| x.get(attr::API).map(String::as_str))
        .collect();
    assert_eq!(apis, vec!["responses"; 2]);
    let continued: Vec<Option<&str>> = spans
        .iter()
        .map(|x| {
            x.get(attr::GEN_AI_REQUEST_PREVIOUS_RESPONSE_ID)
                .map(String::as_str)
        })
        .collect();
    assert_eq!(continued, vec![None, Some(id1)]);
    s.stop().await;
}

/// The request spans' attributes, in the order the requests ended, once `n` have ended.
async fn request_spans(s: &TestServer, n: usize) -> Vec<std::collections::HashMap<String, String>> {
    s.spans
        .request_spans(n)
        .await
        .into_iter()
        .map(|x| {
            x.attributes
                .iter()
                .map(|kv| (kv.key.as_str().to_string(), kv.value.to_string()))
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_doors_find_their_sessions_and_ask_for_their_kv_lifetime() {
    let Some(path) = support::default_model() else {
        return;
    };
    let m = Model::load(&path).expect("model");
    let s = server(&m).await;
    // Codex: the prompt cache key is the session, and `ttl` asks for its KV's lifetime.
    create(
        &s,
        json!({"input": "Say hi.", "store": false, "prompt_cache_key": "codex-1",
               "prompt_cache_options": {"ttl": "90s"}, "max_output_tokens": 4}),
    )
    .await;
    // A stored response without a key starts a chain: its continuation is the same session.
    let r1 = create(&s, json!({"input": "Say hello.", "max_output_tokens": 4})).await;
    let id1 = r1["id"].as_str().expect("id");
    create(
        &s,
        json!({"input": "Again.", "previous_response_id": id1, "max_output_tokens": 4}),
    )
    .await;
    // Claude Code: the session inside `metadata.user_id`, the longest `cache_control.ttl`.
    let r = s
        .post(
            "/v1/messages",
            json!({"max_tokens": 4,
                   "system": [{"type": "text", "text": "Be brief.",
                               "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
                   "messages": [{"role": "user", "content": "Say hi."}],
                   "metadata": {"user_id": "{\"device_id\":\"d\",\"session_id\":\"cc-7\"}"}}),
        )
        .await;
    assert_eq!(r.status().as_u16(), 200);
    // A lifetime that is not a duration is refused, naming the field.
    let bad = s
        .post(
            "/v1/responses",
            json!({"input": "x", "prompt_cache_options": {"ttl": "soon"}}),
        )
        .await;
    assert_eq!(bad.status().as_u16(), 400);
    let v: Value = bad.json().await.expect("json");
    assert_eq!(v["error"]["param"], "prompt_cache_options.ttl", "{v}");

    let spans = request_spans(&s, 4).await;
    let of = |i: usize, key: &str| spans[i].get(key).cloned().unwrap_or_default();
    let ttl_ms = |i: usize| of(i, attr::SESSION_KV_TTL_MS).parse::<f64>().ok();
    assert_eq!(of(0, attr::SESSION_ID), "codex-1");
    assert_eq!(
        of(0, attr::SESSION_SOURCE),
        attr::value::SESSION_SOURCE_PROMPT_CACHE_KEY
    );
    assert_eq!(ttl_ms(0), Some(90_000.0));
    assert_eq!(
        of(1, attr::SESSION_ID),
        id1,
        "the chain's session is its first response"
    );
    assert_eq!(of(2, attr::SESSION_ID), id1);
    assert_eq!(
        of(2, attr::SESSION_SOURCE),
        attr::value::SESSION_SOURCE_RESPONSE_CHAIN
    );
    assert_eq!(of(2, attr::SESSION_TURN), "1");
    assert_eq!(of(3, attr::SESSION_ID), "cc-7");
    assert_eq!(
        of(3, attr::SESSION_SOURCE),
        attr::value::SESSION_SOURCE_METADATA
    );
    assert_eq!(ttl_ms(3), Some(3_600_000.0));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prediction_on_the_agent_doors_is_drafted_from_and_changes_nothing() {
    let Some(path) = support::default_model() else {
        return;
    };
    let m = Model::load(&path).expect("model");
    let s = server(&m).await;
    let ask = json!({"input": "List the days of the week, one per line.", "temperature": 0,
                     "max_output_tokens": 40, "store": false});
    let plain = create(&s, ask.clone()).await;
    let text = plain["output"][0]["content"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    let mut predicted = ask.clone();
    predicted["prediction"] = json!({"type": "content", "content": text});
    let r = create(&s, predicted).await;
    assert_eq!(
        r["output"][0]["content"][0]["text"],
        plain["output"][0]["content"][0]["text"]
    );
    let details = &r["usage"]["output_tokens_details"];
    let accepted = details["accepted_prediction_tokens"]
        .as_u64()
        .expect("accepted");
    assert!(accepted > 0, "{}", r["usage"]);
    assert_eq!(r["usage"]["accepted_tokens"].as_u64(), Some(accepted));
    assert!(r["usage"]["drafted_tokens"].as_u64() >= Some(accepted));
    // The Messages door takes the same object.
    let msg = s
        .post(
            "/v1/messages",
            json!({"max_tokens": 40, "temperature": 0,
                   "messages": [{"role": "user", "content": "List the days of the week, one per line."}],
                   "prediction": {"type": "content", "content": text}}),
        )
        .await;
    assert_eq!(msg.status().as_u16(), 200);
    let v: Value = msg.json().await.expect("json");
    assert!(v["usage"]["accepted_tokens"].as_u64() > Some(0), "{v}");
    // A prediction of another type is refused, naming the field.
    let bad = s
        .post(
            "/v1/responses",
            json!({"input": "x", "prediction": {"type": "diff", "content": "x"}}),
        )
        .await;
    assert_eq!(bad.status().as_u16(), 400);
    let e: Value = bad.json().await.expect("json");
    assert_eq!(e["error"]["param"], "prediction.type", "{e}");
    s.stop().await;
}

/// Codex sends no `max_output_tokens`: OpenAI's meaning is the rest of the context, so the
/// request may run to `--max-tokens-limit` (or what the context leaves), not to
/// `--default-max-tokens`; a stored chain's history is not counted against `--max-messages`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_request_without_a_limit_runs_to_the_context_and_its_chain_is_not_counted() {
    let Some(path) = support::default_model() else {
        return;
    };
    let m = Model::load(&path).expect("model");
    let limits = slotlight_engine::server::Limits {
        max_tokens: 300,
        default_max_tokens: 8,
        max_messages: 3,
        ..Default::default()
    };
    let s = TestServer::start(
        &m,
        Options {
            ctx_size: 2048,
            kv_tokens: 8192,
            limits,
            ..Options::default()
        },
    )
    .await;
    let r1 = create(&s, json!({"input": "Say hi.", "temperature": 0})).await;
    create(
        &s,
        json!({"input": "Say hi.", "temperature": 0, "max_output_tokens": 5}),
    )
    .await;
    let spans = request_spans(&s, 2).await;
    let max_tokens = |i: usize| spans[i].get(attr::GEN_AI_REQUEST_MAX_TOKENS).cloned();
    assert_eq!(
        max_tokens(0).as_deref(),
        Some("300"),
        "the limit, not the default"
    );
    assert_eq!(max_tokens(1).as_deref(), Some("5"), "as asked");
    // Three turns sent one at a time on a stored chain: each sends two messages (with its
    // instructions), under the limit of three, whatever the chain holds.
    let mut previous = r1["id"].as_str().expect("id").to_string();
    for turn in ["Again.", "Once more.", "And again."] {
        let r = create(
            &s,
            json!({"input": turn, "instructions": "Be brief.", "previous_response_id": previous,
                   "max_output_tokens": 4, "temperature": 0}),
        )
        .await;
        previous = r["id"].as_str().expect("id").to_string();
    }
    // Four messages sent in one request are still refused.
    let said = |role: &str, t: &str| json!({"role": role, "content": t});
    let r = s
        .post(
            "/v1/responses",
            json!({"input": [said("user", "a"), said("assistant", "b"), said("user", "c")],
                   "instructions": "x", "max_output_tokens": 4}),
        )
        .await;
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["param"], "input", "{v}");
    s.stop().await;
}

/// The status and body bytes of a `GET`.
async fn raw_get(s: &TestServer, path: &str) -> (u16, Vec<u8>) {
    let r = s.client.get(s.url(path)).send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.bytes().await.expect("body").to_vec())
}

/// The body bytes of `POST /v1/responses/input_tokens` for `body`.
async fn count(s: &TestServer, body: Value) -> Vec<u8> {
    let r = s.post("/v1/responses/input_tokens", body).await;
    assert_eq!(r.status().as_u16(), 200);
    r.bytes().await.expect("body").to_vec()
}

/// The store's copy of `id`, whole.
async fn stored(
    s: &TestServer,
    id: &str,
) -> Option<slotlight_engine::server::responses::store::StoredResponse> {
    s.state
        .responses
        .downcast_ref::<ResponseStore>()
        .expect("the Responses store")
        .get(id)
        .await
        .expect("store")
}

/// A stored chain is kept as links to its parents: deleting the responses before one keeps
/// its `GET`, its `input_items`, its stored prompt and history and the prompt of its
/// continuation byte for byte what they were, while the deleted ones are 404s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_chains_earlier_responses_keeps_the_later_ones_exact() {
    let Some(path) = support::default_model() else {
        return;
    };
    let m = Model::load(&path).expect("model");
    let s = server(&m).await;
    let turn = |input: &str, previous: Option<&str>| {
        let mut body = json!({"input": input, "instructions": "Be brief.", "temperature": 0,
                              "max_output_tokens": 6});
        if let Some(p) = previous {
            body["previous_response_id"] = json!(p);
        }
        body
    };
    let r1 = create(&s, turn("Say hi.", None)).await;
    let id1 = r1["id"].as_str().expect("id").to_string();
    let r2 = create(&s, turn("Again.", Some(&id1))).await;
    let id2 = r2["id"].as_str().expect("id").to_string();
    let r3 = create(&s, turn("Once more.", Some(&id2))).await;
    let id3 = r3["id"].as_str().expect("id").to_string();
    let object = raw_get(&s, &format!("/v1/responses/{id3}")).await;
    let items = raw_get(&s, &format!("/v1/responses/{id3}/input_items")).await;
    let tokens = count(&s, turn("And again.", Some(&id3))).await;
    let whole = stored(&s, &id3).await.expect("stored");
    assert_eq!(object.0, 200);
    assert_eq!(
        whole.history.len(),
        4,
        "two earlier turns, each input and output"
    );
    for id in [&id2, &id1] {
        let r = s
            .client
            .delete(s.url(&format!("/v1/responses/{id}")))
            .send()
            .await
            .expect("delete");
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(raw_get(&s, &format!("/v1/responses/{id}")).await.0, 404);
    }
    assert_eq!(raw_get(&s, &format!("/v1/responses/{id3}")).await, object);
    assert_eq!(
        raw_get(&s, &format!("/v1/responses/{id3}/input_items")).await,
        items
    );
    assert_eq!(count(&s, turn("And again.", Some(&id3))).await, tokens);
    assert_eq!(stored(&s, &id3).await.as_ref(), Some(&whole));
    let gone = s.post("/v1/responses", turn("Again.", Some(&id2))).await;
    assert_eq!(gone.status().as_u16(), 404);
    // The chain goes on from the engine's own tokens.
    let r4 = create(&s, turn("And again.", Some(&id3))).await;
    let fourth = stored(&s, r4["id"].as_str().expect("id"))
        .await
        .expect("stored");
    let mut before = whole.prompt_tokens.clone();
    before.extend_from_slice(&whole.reply_tokens);
    assert!(fourth.prompt_tokens.starts_with(&before));
    assert_eq!(fourth.history, whole.conversation_items());
    s.stop().await;
}
