//! The HTTP server: the front doors over one request path.
//!
//! - [`request`]: the one request path every door takes (the shared request, validation,
//!   session resolution, launch, pipeline, outcome, usage, spans, log line and metrics). No
//!   door's types enter it.
//! - The doors, each a folder of the same files: `types` (its wire types), `translate` (its
//!   body into the shared request, and its session keys in its order), `handler` (its
//!   endpoints), `stream` (its stream encoder) and `response` (its whole response), plus what
//!   only that door uses: [`openai`] (chat completions and completions), [`responses`]
//!   (OpenAI's Responses, with its response store), [`messages`] (Anthropic's Messages, with
//!   its thinking signatures) and [`tokenize`] (`/tokenize`, `/detokenize` and the render
//!   API; nothing there streams, so it has no `stream`). No door imports another.
//! - The HTTP plumbing, here at the top: the settings and shared state ([`state`]), bodies
//!   ([`body`]), errors in each API's shape ([`error`]), ids ([`ids`]), the middleware
//!   (arrival, API key; [`middleware`]), the routes (`routes`) and serving with its drain on
//!   shutdown (`listen`).
//!
//! A sixth API is a new folder beside the doors, with the same five files: its `translate`
//! builds a [`request::input::ChatRequest`] (or a completion) and calls
//! [`request::ValidRequest::chat`], its `handler` launches it with
//! [`request::launch::launch_request`] and answers through its `response` or its `stream`
//! encoder ([`request::launch::Encoder`]); then one line per endpoint in `routes`.

pub mod body;
pub mod error;
pub mod ids;
mod listen;
pub mod messages;
pub mod middleware;
pub mod openai;
pub mod request;
pub mod responses;
mod routes;
pub mod state;
pub mod tokenize;

pub use self::listen::{MAX_HEADERS, serve, shutdown_signal};
pub use self::request::arrival::{Arrival, LocalAddr, parent_context, server_address};
pub use self::routes::router;
pub use self::state::{AppState, Limits, ServeConfig, SharedState};
