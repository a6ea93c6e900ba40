//! slotlight's sidecar: turns the engine's OpenTelemetry spans into live views.
//!
//! Data flow (one direction, bounded at every hop):
//!
//! ```text
//! OTLP/gRPC ─┐                      ┌─> forward queue ─> upstream collector / Jaeger (--forward-otlp)
//!            ├─ receiver (decode, ──┤
//! OTLP/HTTP ─┘   validate, count)   └─> ingest queue ─> assembly task (owns every map)
//!                                                          │ watch: slot snapshot
//!                                                          │ broadcast + ring: turn records
//!                                                          │ writer thread: SQLite (--turns-db)
//!                                                          v
//!                                    views: /v1/slots, /v1/turns, /metrics, / (live page)
//! ```
//!
//! Receivers only decode, validate into typed spans ([`spans`]), count, and hand the
//! batch over a bounded channel; a full queue becomes `503` / `UNAVAILABLE` with a retry hint.
//! The assembly task is the single owner of the per-instance, per-request state and publishes
//! immutable snapshots; the HTTP views only read those snapshots.

#![deny(clippy::cast_possible_truncation)]

pub mod api;
pub mod assembly;
pub mod bench;
pub mod config;
pub mod error;
pub mod forward;
pub mod metrics;
pub mod net;
pub mod otlp;
pub mod raw;
pub mod receiver;
pub mod server;
pub mod spanmetrics;
pub mod spans;
pub mod store;
pub mod synth;
pub mod turn;
pub mod vocab;

pub use config::Config;
pub use otlp::unix_now_ns;
pub use server::{Sidecar, start};
