//! Responses API request bodies, through the handler's own code path: `read_json`, then
//! `ResponsesRequest::from_json` (every field taken apart by name, hosted tools set aside, the
//! rest refused), its items turned into the one request path's conversation
//! (`ResponsesRequest::chat`: messages, calls and their outputs, reasoning, adjacent messages
//! merged), `Common::validate` and `validate::messages`; and the sealed reasoning round trip.
//!
//! Checked: nothing panics; a conversation that validates holds no more messages than items
//! (plus `instructions`); a sealed text opens to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slotlight_engine::server::Limits;
use slotlight_engine::server::body::read_json;
use slotlight_engine::server::request::validate::messages;
use slotlight_engine::server::responses::translate::{open_reasoning, seal_reasoning};
use slotlight_engine::server::responses::types::ResponsesRequest;

const DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

fuzz_target!(|data: &[u8]| {
    let rt = slotlight_fuzz::runtime();
    let limits = Limits::default();
    let body = axum::body::Body::from(bytes::Bytes::copy_from_slice(data));
    let parsed = rt
        .block_on(read_json::<serde_json::Value>(body, 1 << 20, DEADLINE))
        .ok()
        .and_then(|v| ResponsesRequest::from_json(v).ok());
    if let Some(req) = parsed {
        let thinking = req.reasoning.enable_thinking();
        if let Ok(chat) = req.chat(&[], thinking) {
            assert!(chat.messages.len() <= req.input.len() + 1);
            let _ = chat.common.validate(&limits, 49_152);
            let _ = messages(&chat, &limits);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(open_reasoning(&seal_reasoning(text)).as_deref(), Some(text));
    }
});
