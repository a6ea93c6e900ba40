//! The middleware every request passes: its arrival instant (the outermost layer) and the API
//! key. What a handler reads of the arrival is in [`super::request::arrival`].

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;

use super::error::{ApiError, ErrorShape};
use super::request::arrival::Arrival;
use super::state::SharedState;

/// Stamps the request's [`Arrival`] (the outermost layer).
pub(super) async fn stamp_arrival(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Arrival(Instant::now()));
    next.run(req).await
}

/// Refuses a request without the configured API key (401), given as a bearer token
/// (`Authorization: Bearer <key>`, OpenAI's clients) or as `x-api-key` (Anthropic's), and
/// answered in the shape of the route's API. Both headers are compared in constant time.
pub(super) async fn authenticate(
    State(st): State<SharedState>,
    req: Request,
    next: Next,
) -> Response {
    if let Some(key) = &st.cfg.api_key
        && !has_key(req.headers(), key)
    {
        let shape = ErrorShape::of_path(req.uri().path());
        return ApiError::unauthorized().render(shape);
    }
    next.run(req).await
}

/// Whether `headers` carry `key`, as a bearer token or as `x-api-key`.
fn has_key(headers: &HeaderMap, key: &str) -> bool {
    use subtle::ConstantTimeEq;
    let matches = |given: Option<&str>| -> bool {
        given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(key.as_bytes())))
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    // Both are compared, whichever matches, so the time taken does not say which was sent.
    let a = matches(bearer);
    let b = matches(x_api_key);
    a | b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn the_key_is_taken_as_a_bearer_token_or_as_x_api_key() {
        assert!(has_key(&headers(&[("authorization", "Bearer k1")]), "k1"));
        assert!(has_key(&headers(&[("x-api-key", "k1")]), "k1"));
        assert!(has_key(
            &headers(&[("x-api-key", "wrong"), ("authorization", "Bearer k1")]),
            "k1"
        ));
        assert!(!has_key(&headers(&[("x-api-key", "k2")]), "k1"));
        assert!(!has_key(&headers(&[("authorization", "k1")]), "k1"));
        assert!(!has_key(&headers(&[]), "k1"));
        assert!(!has_key(&headers(&[("x-api-key", "")]), "k1"));
    }
}
