//! The middleware every request passes: its arrival instant, the API key, the caller's trace
//! context and the address it reached; and a request's arrival as a handler reads it
//! ([`Arrived`]).

use std::net::SocketAddr;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;

use super::error::{ApiError, ErrorShape};
use super::state::SharedState;
use super::trace::ServerAddress;

/// When the request arrived (stamped by the outermost middleware).
#[derive(Debug, Clone, Copy)]
pub struct Arrival(pub Instant);

/// The address the server listens on (a request extension), for `server.address` when a
/// request has no `Host` header.
#[derive(Debug, Clone, Copy)]
pub struct LocalAddr(pub SocketAddr);

/// A request as it arrived: when, its headers and the address it reached.
pub struct Arrived {
    /// Arrival at the HTTP layer (the request span's start).
    pub received: Instant,
    /// The request's headers.
    pub headers: HeaderMap,
    /// The address the client reached (`server.address`, `server.port`).
    pub server: ServerAddress,
}

impl Arrived {
    /// Takes `request` apart into its arrival (the one the middleware stamped) and its body,
    /// not yet read.
    pub fn of(request: Request) -> (Self, Body) {
        let received = request
            .extensions()
            .get::<Arrival>()
            .map_or_else(Instant::now, |a| a.0);
        let local = request.extensions().get::<LocalAddr>().map(|l| l.0);
        let (parts, body) = request.into_parts();
        let server = server_address(&parts.headers, local);
        let arrived = Self {
            received,
            headers: parts.headers,
            server,
        };
        (arrived, body)
    }
}

/// `server.address` and `server.port`: the `Host` header the client sent (HTTP/1.1 requires
/// one), else the listening address.
pub fn server_address(headers: &HeaderMap, local: Option<SocketAddr>) -> ServerAddress {
    let from_host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.parse::<axum::http::uri::Authority>().ok())
        .map(|a| ServerAddress {
            address: Some(
                a.host()
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string(),
            ),
            port: a.port_u16().or_else(|| local.map(|l| l.port())),
        });
    from_host.unwrap_or_else(|| ServerAddress {
        address: local.map(|l| l.ip().to_string()),
        port: local.map(|l| l.port()),
    })
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The caller's trace context from W3C `traceparent`/`tracestate`, or an empty context.
pub fn parent_context(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

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
