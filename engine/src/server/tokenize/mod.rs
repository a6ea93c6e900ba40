//! What a request's prompt would be, without generating: `POST /tokenize` and
//! `POST /detokenize` (vLLM's and llama.cpp's shapes; [`handler`]) and vLLM's render API
//! (`POST /v1/chat/completions/render`, `POST /v1/completions/render`; [`render`]). Both read
//! their bodies as the generation endpoints do and go through the same checks, template and
//! encoding ([`crate::server::request`]), so their token ids are the ones a generation
//! request computes.

pub mod handler;
pub mod render;
