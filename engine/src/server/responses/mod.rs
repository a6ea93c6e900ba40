//! OpenAI's Responses API: `POST /v1/responses` (whole or streamed), `GET` and
//! `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items` and
//! `POST /v1/responses/input_tokens`.
//!
//! A body is taken apart ([`types`]) and its items translated into the shared request's
//! conversation ([`translate`]); [`handler`] launches and answers it: the response object and
//! its output items ([`response`]), whole or as the stream's typed events ([`stream`]). With
//! `store` (the default) the response is kept ([`store`]) with the exact token ids of its
//! prompt and reply, and a later `previous_response_id` continues from those tokens
//! ([`continuation`]): a warm resume of that response's KV, never a re-rendering.

pub mod continuation;
pub mod handler;
pub mod response;
pub mod store;
pub mod stream;
pub mod translate;
pub mod types;
