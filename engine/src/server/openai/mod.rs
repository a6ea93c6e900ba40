//! The OpenAI-compatible endpoints, plus `/tokenize` and `/detokenize`.
//!
//! Chat and completions share one path ([`handler`]): wire types ([`types`]) → the checks
//! ([`validate`]) → a valid request and its facts ([`request`]) → the per-request pipeline →
//! typed responses ([`response`]); tool calls live in [`tools`], reasoning output in
//! [`reasoning`].

pub mod handler;
pub mod reasoning;
pub mod render;
pub mod request;
pub mod response;
pub mod tokenize;
pub mod tools;
pub mod types;
pub mod validate;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Reads the body up to `limit` bytes within `deadline` and parses it as JSON; errors in
/// OpenAI's shape. The deadline stops a client that sends its body a byte at a time from
/// holding a connection and its task forever (408 `request_timeout`); nothing is admitted to
/// the scheduler before the body is whole, so a slow sender never holds a slot.
pub async fn read_json<T: DeserializeOwned>(
    body: Body,
    limit: usize,
    deadline: std::time::Duration,
) -> Result<T, ApiError> {
    let read = tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await;
    let Ok(read) = read else {
        return Err(ApiError::request_timeout(deadline));
    };
    let bytes = match read {
        Ok(b) => b,
        Err(e) => {
            // axum documents the limit's error as the source: a type, not a message.
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return Err(if too_large {
                ApiError::too_large(limit)
            } else {
                ApiError::invalid(format!("could not read the request body: {e}"))
            });
        }
    };
    if bytes.is_empty() {
        return Err(ApiError::invalid(
            "the request body is empty; send a JSON object",
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                "malformed JSON"
            }
            _ => "invalid request",
        };
        ApiError::invalid(format!("{what}: {e}"))
    })
}

/// A fresh response id with `prefix` (`chatcmpl` or `cmpl`).
pub fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    use std::hash::{BuildHasher, Hasher};
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{prefix}-{:016x}{:04x}", h.finish(), n & 0xffff)
}

/// The `created` field of a response: the Unix time now, in seconds.
pub fn created() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// The session: the `x-session-id` header, else the body's hint (`prompt_cache_key`, else
/// `user`, else `safety_identifier`).
pub fn session(headers: &HeaderMap, user: Option<&str>) -> Option<String> {
    headers
        .get("x-session-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty() && s.len() <= 256)
        .map(str::to_string)
        .or_else(|| user.filter(|u| !u.is_empty()).map(str::to_string))
}

/// Wraps a stream of JSON chunks (serialized) as SSE ending with `[DONE]`.
pub fn sse(
    stream: impl Stream<Item = String> + Send + 'static,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    use futures_util::StreamExt;
    let events = stream
        .map(|v| Ok(SseEvent::default().data(v)))
        .chain(futures_util::stream::once(async {
            Ok(SseEvent::default().data("[DONE]"))
        }));
    Sse::new(events).keep_alive(KeepAlive::default())
}
