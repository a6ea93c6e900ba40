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
//!   snapshots ([`slots`]) and the turn records ([`turn`]) and publishes them.
//! * [`store`]: keeps the turn records: the in-memory ring or the SQLite file (`--turns-db`).
//! * [`views`]: `/v1/slots`, `/v1/turns`, `/metrics` and the live page; they only read what
//!   the assembly published and the store kept.
//! * [`metrics`]: every metric served on `/metrics`, counted by the parts above.
//! * [`tools`]: the benchmark and the synthetic spans, apart from the service.
//!
//! What the parts share sits below them: [`spans`] (the engine's spans, typed), [`turn`] (a
//! finished request's record and its query), [`session`] (a session's record, made from its
//! turns, its query, and the tracker of live sessions), [`slots`] (the slot view), [`vocab`], [`net`],
//! [`config`] and [`error`]. [`server`] starts the parts and stops them.

#![deny(clippy::cast_possible_truncation)]

pub mod assembly;
pub mod config;
pub mod error;
pub mod metrics;
pub mod net;
pub mod receiver;
pub mod server;
pub mod session;
pub mod slots;
pub mod spans;
pub mod store;
pub mod tools;
pub mod turn;
pub mod views;
pub mod vocab;

pub use config::Config;
pub use server::{Sidecar, start};
pub use vocab::unix_now_ns;
