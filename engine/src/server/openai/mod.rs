//! OpenAI's chat completions and completions: `POST /v1/chat/completions` and
//! `POST /v1/completions`, one front door.
//!
//! Their bodies are the shared request's own JSON shape ([`crate::server::request::parse`]);
//! [`translate`] makes them valid requests with their session keys, [`handler`] launches and
//! answers them, whole ([`response`]) or as a stream of typed chunks ([`stream`]), in the
//! wire types of [`types`].

pub mod handler;
pub mod response;
pub mod stream;
pub mod translate;
pub mod types;
