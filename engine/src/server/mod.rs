//! The HTTP server: the front doors (OpenAI chat completions and completions in [`openai`],
//! with `/tokenize`, `/detokenize` and the render API; Anthropic's Messages in [`messages`]),
//! plus `/v1/models`, `/health`, `/v1/requests` and `/metrics`.
//!
//! One request path serves every front door: a door takes its body apart into
//! [`request::input`], [`request`] validates it into a `ValidRequest` (prompt built, grammar
//! compiled), [`front`] launches it and answers it (collected whole, or streamed through the
//! door's encoder), [`pipeline`] runs its task (events to output: [`reasoning`], [`tools`]),
//! [`trace`] and [`record`] write its spans, log line and metrics from its one
//! [`outcome`]. Every door finds its requests' session keys through [`session`]. Around
//! them: the settings and shared state (`state`), the routes (`routes`), the middleware
//! (arrival, API key, trace context; [`middleware`]), serving and the drain on shutdown
//! (`listen`). [`diagnostics`] keeps what the vendors' cache diagnostics compare.

pub mod body;
pub mod diagnostics;
pub mod error;
pub mod front;
pub mod ids;
mod listen;
pub mod messages;
pub mod middleware;
pub mod openai;
pub mod outcome;
pub mod pipeline;
pub mod reasoning;
pub mod record;
pub mod request;
pub mod response_store;
pub mod responses;
mod routes;
pub mod session;
pub mod state;
pub mod tools;
pub mod trace;
pub mod usage;

pub use self::listen::{MAX_HEADERS, serve, shutdown_signal};
pub use self::middleware::{Arrival, LocalAddr, parent_context, server_address};
pub use self::routes::router;
pub use self::state::{AppState, Limits, ServeConfig, SharedState};
