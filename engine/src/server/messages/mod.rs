//! Anthropic's Messages API: `POST /v1/messages` (with or without `?beta=true`, as Claude Code
//! sends it) and `POST /v1/messages/count_tokens`.
//!
//! A front door like the others: its bodies taken apart ([`types`]) into the one request
//! path's input ([`crate::server::request`]), launched and answered through
//! [`crate::server::request::launch`] ([`handler`]), with its own typed responses ([`response`]), stream
//! encoder ([`stream`]) and thinking-block signatures ([`signature`]). Errors are in
//! Anthropic's shape ([`crate::server::error::ErrorShape::Anthropic`]).

pub mod handler;
pub mod response;
pub mod signature;
pub mod stream;
pub mod translate;
pub mod types;
