//! Anthropic Messages request bodies, through the door's own code path: `read_json` (the body
//! read with its size limit, then serde), `MessagesRequest::from_json` for `/v1/messages` and
//! `/v1/messages/count_tokens` (every field taken apart by name, the blocks turned into chat
//! messages, thinking signatures checked), then `Common::validate` and `validate::messages`
//! (what the request path checks next). Thinking signatures of arbitrary text round-trip.
//!
//! Checked: nothing panics; `/v1/messages` never takes a body without `max_tokens`; the chat
//! messages a body becomes have roles the chat path knows, a system message only first, never
//! two user turns in a row (they are combined), and no final assistant turn; a session key
//! from `metadata.user_id` is at most 256 bytes.
#![no_main]

use axum::http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use slotlight_engine::server::Limits;
use slotlight_engine::server::body::read_json;
use slotlight_engine::server::messages::signature::Signer;
use slotlight_engine::server::messages::translate;
use slotlight_engine::server::messages::types::{Endpoint, MessagesRequest};
use slotlight_engine::server::request::session;
use slotlight_engine::server::request::validate::messages;

/// The body is whole already; the deadline only has to be there.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

fuzz_target!(|data: &[u8]| {
    let rt = slotlight_fuzz::runtime();
    let limits = Limits::default();
    let signer = Signer::new(None, "m");
    let body = axum::body::Body::from(bytes::Bytes::copy_from_slice(data));
    let value = rt
        .block_on(read_json::<serde_json::Value>(body, 1 << 20, DEADLINE))
        .ok();
    if let Some(v) = value {
        for endpoint in [Endpoint::Create, Endpoint::CountTokens] {
            let Ok(req) = MessagesRequest::from_json(v.clone(), endpoint, &signer) else {
                continue;
            };
            assert!(endpoint != Endpoint::Create || req.max_tokens.is_some());
            let chat = &req.chat.messages;
            for (i, m) in chat.iter().enumerate() {
                assert!(m.author().is_some(), "role {}", m.role);
                assert!(
                    m.role != "system" || i == 0,
                    "a system message after the first"
                );
                if i > 0 {
                    assert!(
                        !(m.role == "user" && chat[i - 1].role == "user"),
                        "two user turns in a row"
                    );
                }
            }
            assert!(chat.last().is_none_or(|m| m.role != "assistant"));
            assert!(
                session::resolve(&HeaderMap::new(), translate::session_keys(&req))
                    .is_none_or(|k| !k.id.is_empty() && k.id.len() <= 256)
            );
            let _ = req.chat.common.validate(&limits, 49_152);
            let _ = messages(&req.chat, &limits);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let carried = signer.sign(text, true);
        assert_eq!(signer.verify("", &carried).as_deref(), Ok(text));
        assert_eq!(
            signer.verify(text, &signer.sign(text, false)).as_deref(),
            Ok(text)
        );
    }
});
