//! What a request's prompt would be, without generating: `POST /tokenize` and
//! `POST /detokenize` (vLLM's and llama.cpp's shapes) and vLLM's render API
//! (`POST /v1/chat/completions/render`, `POST /v1/completions/render`).
//!
//! A door of the same files as the others, less a stream encoder (nothing here streams): its
//! bodies taken apart ([`types`]), turned into token ids through the shared request's own
//! reading, checks, template and encoding ([`translate`]), so the ids are the ones a
//! generation request computes; its endpoints ([`handler`]) and answers ([`response`]).

pub mod handler;
pub mod response;
pub mod translate;
pub mod types;
