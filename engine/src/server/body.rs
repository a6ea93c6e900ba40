//! Reading a request body: whole, bounded in size and time, parsed as JSON.

use axum::body::Body;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Reads the body up to `limit` bytes within `deadline` and parses it as JSON; errors typed
/// ([`ApiError`]), answered in the shape of the API that reads it. The deadline stops a client that sends its body a byte at a time from
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
