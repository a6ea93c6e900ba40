//! The engine's own metrics: saturation and work per slot group, request latencies and
//! refusals, and the exporter's health, served on `GET /metrics` (see [`exposition`]).
//!
//! Counted where the work happens, read elsewhere: each slot group's step loop owns its
//! [`GroupMetrics`] (atomics; no lock shared between groups), the HTTP layer owns
//! [`RequestMetrics`] (each request's task observes its own finished usage once), and the
//! `/metrics` handler reads both at scrape time. Nothing reads per-request timing back from
//! them. Every name is a constant of [`slotlight_otel::metric::engine`] (or a GenAI histogram
//! of [`slotlight_otel::metric`]), and every count is exact whatever the trace sampler keeps.
//! With `OTEL_METRICS_EXPORTER=otlp` the same instruments also go out over OTLP ([`otlp`]).

pub mod exposition;
pub mod group;
pub mod histogram;
pub mod instruments;
pub mod otlp;
pub mod requests;

pub use exposition::{Scrape, StoreSnapshot, TelemetrySnapshot, VllmCompat, negotiate, render};
pub use group::{GroupMetrics, GroupSnapshot};
pub use histogram::{AtomicHistogram, HistogramSnapshot};
pub use requests::{Observation, RequestMetrics, RequestSnapshot};
