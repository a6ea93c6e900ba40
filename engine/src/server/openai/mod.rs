//! The OpenAI-compatible endpoints, plus `/tokenize` and `/detokenize`.
//!
//! Chat and completions are one front door ([`handler`]): their bodies taken apart
//! ([`types`]) into the one request path's input ([`crate::server::request`]), and their typed
//! responses ([`response`]). [`render`] and [`tokenize`] answer what a request's prompt would
//! be, through the same checks.

pub mod handler;
pub mod render;
pub mod response;
pub mod tokenize;
pub mod types;
