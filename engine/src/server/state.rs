//! The server's settings and the state every handler shares.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use super::error::ApiError;
use crate::constraint::Grammars;
use crate::metrics::RequestMetrics;
use crate::prompt::PromptBuilder;
use crate::scheduler::EngineHandle;
use crate::telemetry::Telemetry;
use crate::timing::TimeAnchor;

/// What the HTTP server is set up with: the API key, body and request limits, what spans
/// record, and the model it serves under which names.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Required bearer token, when set.
    pub api_key: Option<String>,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// The limits every request is checked against (messages, stop strings, tokens, `n`, tools).
    pub limits: Limits,
    /// Decode progress window (`slotlight.decode` spans); zero turns them off.
    pub progress_interval: Duration,
    /// Record prompt and completion text on spans.
    pub trace_content: bool,
    /// Names the model answers to (the first is reported).
    pub model_names: Vec<String>,
    /// The model's architecture, weight types and context length (reported in `/health`).
    pub model_info: crate::model::loader::ModelInfo,
    /// How long in-flight requests may run after SIGTERM before they are cancelled.
    pub drain_timeout: Duration,
    /// How long a client may take to send a request's headers (then the connection is closed),
    /// and again its body (then 408). Also closes keep-alive connections idle this long.
    pub read_timeout: Duration,
    /// Largest request head (request line and headers), bytes; larger ones get 431.
    pub max_header_bytes: usize,
    /// Offer tools to a model whose chat template cannot call them in the generic JSON format
    /// (`--generic-tools`); off leaves them out.
    pub generic_tools: bool,
    /// Serve `GET /metrics` without the API key (for a scraper that has none).
    pub metrics_public: bool,
    /// With `--metrics-compat vllm`: also serve the model-server protocol's metrics under
    /// vLLM's names.
    pub vllm_metrics: Option<crate::metrics::VllmCompat>,
}

/// Everything handlers share.
pub struct AppState {
    /// The scheduler's handle: submit requests, read what is in flight.
    pub engine: Arc<EngineHandle>,
    /// Prompt building for the served model.
    pub prompts: PromptBuilder,
    /// Structured-output grammars for the served model (compiler built on first use).
    pub grammars: Arc<Grammars>,
    /// The server's settings (limits, timeouts, model names).
    pub cfg: ServeConfig,
    /// The tracer request spans are recorded with, and the exporter's counts.
    pub telemetry: Arc<Telemetry>,
    /// Request latencies and refusals, observed by the HTTP layer (`/metrics`).
    pub metrics: Arc<RequestMetrics>,
    /// Converts request instants to wall-clock time.
    pub anchor: TimeAnchor,
    /// Vocabulary size: token-id prompts are checked against it.
    pub vocab: usize,
    /// Context length served (`/v1/models` reports it as `max_model_len`).
    pub context: usize,
    /// When the server started (unix seconds).
    pub started: u64,
    /// Recent turns by response id, for the cache diagnostics (Anthropic's
    /// `diagnostics.previous_message_id`).
    pub diagnostics: crate::diagnostics::Registry,
    /// The Responses door's store of responses (`--responses-db`): a
    /// `responses::store::ResponseStore`, which that door reads back
    /// (`ResponseStore::of`). The state holds it without naming its type, so that no door's
    /// type enters the plumbing every door stands on.
    pub responses: Arc<dyn Any + Send + Sync>,
}

/// The state every handler receives.
pub type SharedState = Arc<AppState>;

impl AppState {
    /// The name the request is served under: the one it asked for when it is one of the
    /// served names (every one is served), the first served name when it asked for none, or
    /// 404 for another one.
    pub fn check_model(&self, asked: Option<&str>) -> Result<String, ApiError> {
        let served = self.cfg.model_names.first().cloned().unwrap_or_default();
        match asked {
            None | Some("") => Ok(served),
            Some(m) if self.cfg.model_names.iter().any(|n| n == m) => Ok(m.to_string()),
            Some(m) => Err(ApiError::model_not_found(
                m,
                &self.cfg.model_names.join("`, `"),
            )),
        }
    }
}

/// Limits on what a request may ask for.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most messages one request sends (a stored chain's history is not counted).
    pub max_messages: usize,
    /// Longest message content, in bytes.
    pub max_message_bytes: usize,
    /// Most stop strings.
    pub max_stop: usize,
    /// The largest `max_tokens` a request may ask for; more is refused.
    pub max_tokens: usize,
    /// `max_tokens` when the request gives none.
    pub default_max_tokens: usize,
    /// The most choices (`n`) one request may ask for; more is refused.
    pub max_n: usize,
    /// Most tools in one request.
    pub max_tools: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_messages: 4096,
            max_message_bytes: 256 * 1024,
            max_stop: crate::stop::MAX_STOP_STRINGS,
            max_tokens: 4096,
            default_max_tokens: 256,
            max_n: 16,
            max_tools: 128,
        }
    }
}
