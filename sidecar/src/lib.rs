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
//! The parts, in the order a span travels:
//!
//! * [`receiver`]: the OTLP/gRPC and OTLP/HTTP receivers. They only decode and validate into
//!   typed spans ([`receiver::decode`]), count, hand the batch over a bounded channel (a full
//!   queue becomes `503` / `UNAVAILABLE` with a retry hint) and offer the bytes to the
//!   forwarder ([`receiver::forward`]). No state.
//! * [`assembly`]: the single owner of the per-instance, per-request state; it makes the slot
//!   snapshots ([`records::slots`]) and the turn records ([`records::turn`]), tracks the live
//!   sessions ([`assembly::sessions`]) and publishes them.
//! * [`store`]: keeps the turn records: the in-memory ring or the SQLite file (`--turns-db`).
//! * [`views`]: `/v1/slots`, `/v1/turns`, `/metrics` and the live page; they only read what
//!   the assembly published and the store kept.
//! * [`metrics`]: every metric served on `/metrics`, counted by the parts above.
//! * [`tools`]: the benchmark and the synthetic spans, apart from the service.
//!
//! What the parts share sits below them, in two folders: [`records`] (the engine's spans,
//! typed; a finished request's record and its query; a session's record, made from its turns,
//! and its query; the slot view) and, under everything, [`base`] (the configuration, the
//! errors, the IP networks of the allow list and the shared vocabulary). [`server`] starts the
//! parts and stops them.

#![deny(clippy::cast_possible_truncation)]

pub mod assembly;
pub mod base;
pub mod metrics;
pub mod receiver;
pub mod records;
pub mod server;
pub mod store;
pub mod tools;
pub mod views;

pub use base::config::Config;
pub use base::vocab::unix_now_ns;
pub use server::{Sidecar, start};
