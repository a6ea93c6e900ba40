//! slotlight-engine: loads Llama, Mistral, Qwen 2/3 and Gemma 2/3 models (each family's forward
//! pass one description, [`model::ops`]), runs them on CPU or CUDA, schedules requests
//! with continuous batching, and serves an OpenAI-compatible API whose usage carries each
//! request's own timings.
//!
//! Lossy casts are denied crate-wide: timing and token math must not truncate or round
//! silently. Where a cast is right, a local `#[allow]` says why.

#![deny(clippy::cast_possible_truncation, clippy::cast_precision_loss)]

pub mod backend;
pub mod chat_template;
pub mod cli;
pub mod constraint;
pub mod diagnostics;
pub mod finish;
pub mod known_models;
pub mod kv_cache;
pub mod kv_events;
pub mod metrics;
pub mod model;
pub mod prompt;
pub mod replies;
pub mod runtime;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod speculation;
pub mod stop;
pub mod telemetry;
pub mod timing;
pub mod tokenizer;
