//! The Responses API's stored state is exact: a response continued by `previous_response_id`
//! has a prompt that starts with the stored response's own prompt and reply token ids (never a
//! re-rendering of their text), on the default model with its real tokenizer and template; the
//! turn is a warm resume of the stored response's KV; and the span says which API it came
//! through.

mod support;

use serde_json::{Value, json};
use slotlight_engine::model::loader::Model;
use slotlight_otel::{attr, span};
use support::server::{Options, TestServer};

async fn server(m: &Model) -> TestServer {
    TestServer::start(
        m,
        Options {
            ctx_size: 2048,
            kv_tokens: 8192,
            ..Options::default()
        },
    )
    .await
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
        .get(id1)
        .await
        .expect("store")
        .expect("stored");
    let second = s
        .state
        .responses
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
    // Both request spans say which API they came through.
    let mut apis = Vec::new();
    for _ in 0..500 {
        apis = s
            .spans
            .spans()
            .into_iter()
            .filter(|x| span::is_request_span_name(&x.name))
            .filter_map(|x| {
                x.attributes
                    .iter()
                    .find(|kv| kv.key.as_str() == attr::API)
                    .map(|kv| kv.value.to_string())
            })
            .collect();
        if apis.len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(apis, vec!["responses".to_string(); 2]);
    s.stop().await;
}
