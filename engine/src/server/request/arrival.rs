//! A request's arrival as the handlers read it: when it arrived (stamped by the outermost
//! middleware), its headers, the address it reached, and the caller's trace context.

use std::net::SocketAddr;
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, header};
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;

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
