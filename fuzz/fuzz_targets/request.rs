//! Chat and completion request bodies, through the handlers' own code path: `read_json` (the
//! body read with its size limit, then serde), `ChatRequest::from_json` /
//! `CompletionRequest::from_json` (every field taken apart by name, the rest refused),
//! `Common::validate` (sampling values, stop lists, `max_tokens`, `n`, `user`, grammars) and
//! `validate::messages` (roles, content parts, tool calls, size limits); then the validated stop
//! strings run over the message text, cut into arbitrary deltas, through `StopMatcher` (what
//! the request task does with generated text).
//!
//! Checked: nothing panics; the stop matcher's output is a prefix of its input, equal to the
//! input when no stop string matched, and cut exactly before the matched stop string.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slotlight_engine::server::Limits;
use slotlight_engine::server::body::read_json;
use slotlight_engine::server::request::input::{ChatRequest, CompletionRequest, Prompt};
use slotlight_engine::server::request::validate::messages;
use slotlight_engine::stop::StopMatcher;

/// The body is whole already; the deadline only has to be there.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

fuzz_target!(|data: &[u8]| {
    let rt = slotlight_fuzz::runtime();
    let limits = Limits::default();
    let body = || axum::body::Body::from(bytes::Bytes::copy_from_slice(data));
    let vocab = 49_152;
    let chat = rt
        .block_on(read_json::<serde_json::Value>(body(), 1 << 20, DEADLINE))
        .ok()
        .and_then(|v| ChatRequest::from_json(v).ok());
    if let Some(req) = chat {
        let opts = req.common.validate(&limits, vocab);
        let messages = messages(&req, &limits);
        if let (Ok(opts), Ok(messages)) = (opts, messages) {
            assert!(opts.max_tokens >= 1 && opts.max_tokens <= limits.max_tokens);
            assert!(messages.len() <= limits.max_messages);
            let text: String = messages.iter().map(|m| m.content.as_str()).collect();
            check_stops(opts.stop.stops(), &text, data);
        }
    }
    let completion = rt
        .block_on(read_json::<serde_json::Value>(body(), 1 << 20, DEADLINE))
        .ok()
        .and_then(|v| CompletionRequest::from_json(v).ok());
    if let Some(req) = completion
        && let Ok(opts) = req.common.validate(&limits, vocab)
    {
        let text = match &req.prompt {
            Prompt::Text(t) => t.clone(),
            Prompt::Texts(v) => v.concat(),
            Prompt::Tokens(_) | Prompt::TokenLists(_) => String::new(),
        };
        check_stops(opts.stop.stops(), &text, data);
    }
});

/// Feeds `text` to a matcher over `stops` in deltas cut at char boundaries chosen by `cuts`.
fn check_stops(stops: &[String], text: &str, cuts: &[u8]) {
    let Ok(mut m) = StopMatcher::new(stops) else {
        panic!("validate accepted stop strings StopMatcher refuses: {stops:?}");
    };
    let mut out = String::new();
    let mut matched = None;
    let mut rest = text;
    let mut i = 0;
    while !rest.is_empty() {
        let want = usize::from(cuts.get(i % cuts.len().max(1)).copied().unwrap_or(1) % 7) + 1;
        i += 1;
        let mut end = want.min(rest.len());
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        let (delta, tail) = rest.split_at(end);
        rest = tail;
        let o = m.push(delta);
        out.push_str(&o.text);
        if o.matched.is_some() {
            matched = o.matched;
            break;
        }
    }
    out.push_str(&m.finish());
    assert!(
        text.starts_with(&out),
        "stop output is not a prefix of the input"
    );
    let contains =
        |hay: &[u8], needle: &str| hay.windows(needle.len()).any(|w| w == needle.as_bytes());
    match matched {
        None => {
            assert_eq!(out, text, "no stop matched, yet text was lost");
            assert!(
                !stops.iter().any(|s| contains(text.as_bytes(), s)),
                "a stop string occurs in the text but did not match"
            );
        }
        Some(i) => {
            assert!(
                text[out.len()..].starts_with(stops[i].as_str()),
                "output not cut right before stop string {i}"
            );
            // The stop string that completes first wins: none completes earlier.
            let end = out.len() + stops[i].len();
            assert!(
                !stops
                    .iter()
                    .any(|s| contains(&text.as_bytes()[..end - 1], s)),
                "another stop string completes before the matched one"
            );
        }
    }
}
