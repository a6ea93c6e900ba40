//! One cache-diagnostics engine for both doors: the same conversations sent through the
//! Responses API (`prompt_cache_options.comparison_response_id`) and the Messages API
//! (`diagnostics.previous_message_id`) get the same verdict, each in its vendor's words, on
//! the default model: a continuation that resends the reply as generated is a hit, a
//! divergence inside the compared reply is a miss on both (`input_changed`,
//! `messages_changed`), as are a changed system prompt and a changed earlier message; and a
//! response created with `store: false` is comparable by id while the engine remembers it.

mod support;

use serde_json::{Value, json};
use slotlight_engine::model::loader::Model;
use support::server::{Options, TestServer};

async fn server(m: &Model) -> TestServer {
    TestServer::start(m, Options::default_model()).await
}

async fn post(s: &TestServer, path: &str, body: Value) -> Value {
    let r = s.post(path, body).await;
    let status = r.status().as_u16();
    let v: Value = r.json().await.expect("json");
    assert_eq!(status, 200, "{path}: {v}");
    v
}

/// A turn of one conversation: the system prompt and the messages, alternating user and
/// assistant, the last a user's.
struct Turn<'a> {
    system: &'a str,
    messages: Vec<(&'static str, String)>,
}

/// The verdict, door-neutral: `None` for a hit, else the miss reason in that door's words.
type Verdict = Option<String>;

/// The Responses API: the turn as input items; `compare` asks for diagnostics against it.
async fn via_responses(
    s: &TestServer,
    t: &Turn<'_>,
    compare: Option<&str>,
    store: bool,
) -> (String, String, Verdict) {
    let input: Vec<Value> = t
        .messages
        .iter()
        .map(|(role, text)| json!({"type": "message", "role": role, "content": text}))
        .collect();
    let mut body = json!({"input": input, "instructions": t.system, "temperature": 0,
                          "max_output_tokens": 24, "store": store});
    if let Some(c) = compare {
        body["prompt_cache_options"] = json!({"comparison_response_id": c});
    }
    let v = post(s, "/v1/responses", body).await;
    let id = v["id"].as_str().expect("id").to_string();
    let text = v["output"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["type"] == "message"))
        .and_then(|m| m["content"][0]["text"].as_str())
        .unwrap_or("")
        .to_string();
    let verdict = compare.map(|_| {
        let d = &v["prompt_cache_diagnostics"];
        match d["type"].as_str() {
            Some("cache_hit") => None,
            Some("cache_miss") => Some(d["reason"].as_str().expect("reason").to_string()),
            other => panic!("unexpected diagnostics {other:?}: {v}"),
        }
    });
    (id, text, verdict.flatten())
}

/// The Messages API: the same turn.
async fn via_messages(
    s: &TestServer,
    t: &Turn<'_>,
    compare: Option<&str>,
) -> (String, String, Verdict) {
    let messages: Vec<Value> = t
        .messages
        .iter()
        .map(|(role, text)| json!({"role": role, "content": text}))
        .collect();
    let mut body = json!({"system": t.system, "messages": messages, "temperature": 0,
                          "max_tokens": 24});
    if let Some(c) = compare {
        body["diagnostics"] = json!({"previous_message_id": c});
    }
    let v = post(s, "/v1/messages", body).await;
    let id = v["id"].as_str().expect("id").to_string();
    let text = v["content"][0]["text"].as_str().unwrap_or("").to_string();
    let verdict = if v["diagnostics"].is_null() {
        None
    } else {
        Some(
            v["diagnostics"]["cache_miss_reason"]["type"]
                .as_str()
                .expect("reason")
                .to_string(),
        )
    };
    (id, text, verdict)
}

/// Anthropic's word for each of OpenAI's reasons, as the scenarios meet them.
fn same_verdict(responses: &Verdict, messages: &Verdict, system_changed: bool) -> bool {
    match (responses.as_deref(), messages.as_deref()) {
        (None, None) => true,
        (Some("input_changed"), Some("messages_changed")) => !system_changed,
        // OpenAI counts the instructions as input; Anthropic names the system prompt.
        (Some("input_changed"), Some("system_changed")) => system_changed,
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_doors_give_the_same_verdict_on_the_same_conversations() {
    let Some(path) = support::default_model() else {
        return;
    };
    let m = Model::load(&path).expect("model");
    let s = server(&m).await;
    let first = Turn {
        system: "Be brief.",
        messages: vec![("user", "Name three colours.".to_string())],
    };
    for store in [true, false] {
        let (r_id, r_text, _) = via_responses(&s, &first, None, store).await;
        let (m_id, m_text, _) = via_messages(&s, &first, None).await;
        assert_eq!(r_text, m_text, "greedy: one prompt, one reply");
        assert!(!r_text.is_empty(), "a reply to resend");
        let then = |reply: String, system: &'static str, first_user: &str| Turn {
            system,
            messages: vec![
                ("user", first_user.to_string()),
                ("assistant", reply),
                ("user", "And three animals?".to_string()),
            ],
        };
        // (scenario, the turn, whether its system prompt changed, the verdict it must get:
        // `Some(true)` a miss, `Some(false)` a hit, `None` whatever the tokens say, alike).
        let mid = r_text.chars().count() / 2;
        let diverged: String = r_text.chars().take(mid).chain("ZZZ".chars()).collect();
        let scenarios = [
            (
                "the reply resent as generated",
                then(r_text.clone(), "Be brief.", "Name three colours."),
                false,
                Some(false),
            ),
            (
                "a divergence inside the reply",
                then(diverged, "Be brief.", "Name three colours."),
                false,
                Some(true),
            ),
            (
                "the system prompt changed",
                then(r_text.clone(), "Be long.", "Name three colours."),
                true,
                Some(true),
            ),
            (
                "an earlier message changed",
                then(r_text.clone(), "Be brief.", "Name four colours."),
                false,
                Some(true),
            ),
        ];
        for (what, turn, system_changed, must_miss) in scenarios {
            let (_, _, rv) = via_responses(&s, &turn, Some(&r_id), true).await;
            let (_, _, mv) = via_messages(&s, &turn, Some(&m_id)).await;
            assert!(
                same_verdict(&rv, &mv, system_changed),
                "{what} (store: {store}): Responses {rv:?}, Messages {mv:?}"
            );
            if let Some(miss) = must_miss {
                assert_eq!(rv.is_some(), miss, "{what} (store: {store}): {rv:?}");
            }
        }
    }
    s.stop().await;
}
