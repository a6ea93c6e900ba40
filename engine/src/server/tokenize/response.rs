//! The endpoints' answers: `/tokenize`'s `tokens`, `count` and `max_model_len` (with pieces or
//! token texts when asked), `/detokenize`'s text under vLLM's and llama.cpp's names, and the
//! render API's `{"request_id", "model", "token_ids"}`.

use serde_json::{Value, json};

use crate::server::ids::new_id;
use crate::server::request::Api;
use crate::tokenizer::TokenBytes;

/// `/tokenize`'s answer for `ids`: each token an id, or `{"id", "piece"}` with `with_pieces`
/// (the piece a string, or its bytes when they are not valid UTF-8); `token_strs` adds the
/// tokens' texts.
pub fn tokens(
    ids: &[u32],
    bytes: &TokenBytes,
    with_pieces: bool,
    token_strs: bool,
    max_model_len: usize,
) -> Value {
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| {
                let b = bytes.bytes(id);
                let piece = match std::str::from_utf8(b) {
                    Ok(s) => json!(s),
                    Err(_) => json!(b),
                };
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    let mut out = json!({
        "tokens": tokens,
        "count": ids.len(),
        "max_model_len": max_model_len,
    });
    if token_strs {
        out["token_strs"] = json!(ids.iter().map(|&id| bytes.text(id)).collect::<Vec<_>>());
    }
    out
}

/// `/detokenize`'s answer: the text as `prompt` (vLLM) and `content` (llama.cpp).
pub fn detokenized(text: &str) -> Value {
    json!({"prompt": text, "content": text})
}

/// A render API answer: the prompt's token ids as a request of `api` would compute them.
pub fn rendered(api: Api, model: &str, ids: &[u32]) -> Value {
    json!({"request_id": new_id(api.id_prefix()), "model": model, "token_ids": ids})
}
