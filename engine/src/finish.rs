//! How a request ended in the engine: [`FinishReason`] and, for an error, [`EngineError`].
//! Below the scheduler (which decides them) and the metrics (which count them), so both
//! reach them without an import running back up; the scheduler re-exports them. They stay
//! typed until a label is written (a JSON body, a span attribute, a metric label).

use slotlight_otel::attr::value;

use crate::kv_cache::OutOfBlocks;

/// Why a request finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the context was reached.
    Length,
    /// The client cancelled (disconnected).
    Cancelled,
    /// The engine failed or is shutting down.
    Error(EngineError),
}

impl FinishReason {
    /// The OpenAI `finish_reason` label.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => value::FINISH_STOP,
            FinishReason::Length => value::FINISH_LENGTH,
            FinishReason::Cancelled => value::FINISH_CANCELLED,
            FinishReason::Error(_) => value::FINISH_ERROR,
        }
    }

    /// The `error.type` of a request that did not run to its end; `None` for `stop` and
    /// `length`.
    pub fn error_type(&self) -> Option<&'static str> {
        match self {
            FinishReason::Stop | FinishReason::Length => None,
            FinishReason::Cancelled => Some(value::ERROR_CANCELLED),
            FinishReason::Error(e) => Some(e.label()),
        }
    }

    /// How the request ended (`slotlight.request.status`).
    pub fn status(&self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::Length => value::STATUS_OK,
            FinishReason::Cancelled => value::STATUS_CANCELLED,
            FinishReason::Error(_) => value::STATUS_ERROR,
        }
    }
}

/// Why the engine ended a request it had accepted with an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The engine is shutting down (or a drain timed out) before the request finished; the
    /// caller may retry elsewhere.
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// A forward step failed; every request of the step loop ends with it.
    #[error("internal error: {0}")]
    Step(String),
    /// The KV cache cannot hold the request, even with every other request preempted.
    #[error("{0}")]
    KvCacheExhausted(OutOfBlocks),
    /// The step loop went away without finishing the request (it panicked or was dropped).
    #[error("the engine stopped without finishing the request")]
    Lost,
    /// The structured-output grammar failed while generating (its mask or its state).
    #[error("structured output: {0}")]
    StructuredOutput(String),
    /// A generated token could not be decoded to text; the choice ends rather than answer
    /// with the token's text silently missing.
    #[error("internal error: decoding a generated token: {0}")]
    Decode(String),
}

impl EngineError {
    /// The stable `error.type` label.
    pub fn label(&self) -> &'static str {
        match self {
            EngineError::ShuttingDown => value::ERROR_SHUTDOWN,
            EngineError::Step(_)
            | EngineError::Lost
            | EngineError::StructuredOutput(_)
            | EngineError::Decode(_) => value::ERROR_INTERNAL,
            EngineError::KvCacheExhausted(_) => value::ERROR_KV_CACHE_EXHAUSTED,
        }
    }
}
