//! The sidecar's records, types of their own below the parts that make, keep and serve them:
//!
//! * [`spans`]: the engine's spans, validated and typed, as the receivers' decoder makes them;
//! * [`usage`]: a request's usage and timing, declared once: its request span holds it and
//!   its turn record repeats it;
//! * [`turn`]: one finished request's record, built from its spans, and the query that lists
//!   the records;
//! * [`session`]: one session's record, made from its turn records, and its query;
//! * [`slots`]: the slot view, one row per slot and solo path.
//!
//! The receivers make spans; the assembly makes slot rows, turn records and session records
//! from them; the store keeps the records, the views serve them, the metrics count them.

pub mod session;
pub mod slots;
pub mod spans;
pub mod turn;
pub mod usage;
