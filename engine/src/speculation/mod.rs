//! Speculative decoding without a second model: drafts from the request's own prompt and reply
//! (prompt lookup, [`ngram`]) and from the client's prediction (OpenAI's Predicted Outputs),
//! verified exactly by the model.
//!
//! A draft of K tokens runs through the model in one forward step over K + 1 positions (the
//! sequence's last token, then the draft), beside the other sequences' plain decodes; each
//! position's logits decide, in order, whether its draft token is taken
//! ([`crate::sampling::Sampler::verify`]): at
//! temperature 0 when it is the argmax, so the output is the one plain decoding gives, bit for
//! bit; with sampling when it is the token plain decoding draws at that position (with that
//! position's own random number), so the output is again the one plain decoding gives, seed
//! for seed, and keeps the model's distribution. The first token not taken is replaced by the model's own choice, and a draft taken whole earns
//! one more token from its last position. The KV cache keeps only the positions of tokens
//! taken: the step loop counts the rest as never computed, and the prefix cache never
//! registers a block holding them.
//!
//! Each sequence owns its [`Drafter`] (its sources, what it follows, its adaptive length), so
//! speculation moves with it from the solo path to a slot and back.

pub mod drafter;
pub mod length;
pub mod ngram;

use slotlight_otel::attr::value;

pub use drafter::{Draft, Drafter};

/// The most tokens one draft may have (`--speculative-tokens`): a verification step of K + 1
/// rows stays below the CUDA backend's GEMM threshold (16 rows), where each row takes the same
/// kernels as a one-token step.
pub const MAX_DRAFT_TOKENS: usize = 15;

/// How the engine drafts (`serve --speculative`, `--speculative-tokens`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculationConfig {
    /// Draft from each request's own prompt and reply (`--speculative ngram`).
    pub ngram: bool,
    /// The most tokens one draft may have (1 to [`MAX_DRAFT_TOKENS`]; 0 drafts nothing, a
    /// prediction included).
    pub max_tokens: usize,
    /// The shortest run of tokens looked up in the prompt and reply (shorter runs repeat by
    /// chance too often to be worth a draft).
    pub min_ngram: usize,
}

impl SpeculationConfig {
    /// No drafts from the prompt; a client's prediction is still drafted from.
    pub fn off() -> Self {
        Self {
            ngram: false,
            ..Self::default()
        }
    }
}

impl Default for SpeculationConfig {
    fn default() -> Self {
        Self {
            ngram: true,
            max_tokens: 15,
            min_ngram: 3,
        }
    }
}

/// Where a draft came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftSource {
    /// The client's `prediction`.
    Prediction,
    /// The request's own prompt and reply so far.
    Ngram,
}

/// How a request was drafted for (`slotlight.speculation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpeculationMode {
    /// From its own prompt and reply.
    Ngram,
    /// From the client's prediction (and, with n-gram drafts on, its prompt and reply where
    /// the prediction has nothing to offer).
    Prediction,
    /// Not at all (`--speculative off` and no prediction, or a draft length of 0).
    Off,
}

impl SpeculationMode {
    /// The mode of a request under `cfg`, with or without a prediction.
    pub fn of(cfg: &SpeculationConfig, has_prediction: bool) -> Self {
        if cfg.max_tokens == 0 {
            SpeculationMode::Off
        } else if has_prediction {
            SpeculationMode::Prediction
        } else if cfg.ngram {
            SpeculationMode::Ngram
        } else {
            SpeculationMode::Off
        }
    }

    /// The contract's value of `slotlight.speculation`.
    pub fn as_str(self) -> &'static str {
        match self {
            SpeculationMode::Ngram => value::SPECULATION_NGRAM,
            SpeculationMode::Prediction => value::SPECULATION_PREDICTION,
            SpeculationMode::Off => value::SPECULATION_OFF,
        }
    }
}
