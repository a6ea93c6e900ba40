//! Model hyper-parameters, read from GGUF metadata or a Hugging Face `config.json`.

use serde::Deserialize;

use super::gguf::{GgufFile, Value};

/// How RoPE pairs the dimensions of a head.
///
/// Must match the weights' layout: llama.cpp's converter permutes the Q and K rows of `llama`
/// models so that GGUF files rotate adjacent pairs, while Hugging Face checkpoints (and GGUF
/// `qwen2` files) rotate the two halves of a head. Using the wrong convention corrupts
/// attention patterns without any error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(x[2i], x[2i+1])` (GGUF `llama`).
    Interleaved,
    /// Pairs `(x[i], x[i + d/2])` (Hugging Face, GGUF `qwen2`).
    Neox,
}

/// Llama 3 style frequency-dependent RoPE scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    /// Overall factor.
    pub factor: f64,
    /// Low-frequency factor.
    pub low_freq_factor: f64,
    /// High-frequency factor.
    pub high_freq_factor: f64,
    /// Context length the model was trained with before scaling.
    pub original_max_position: f64,
}

/// The architecture family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM, TinyLlama, Mistral (GGUF `llama`).
    Llama,
    /// Qwen2 (attention bias on q, k, v).
    Qwen2,
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The architecture family: decides tensor names and RoPE pairing.
    pub arch: Arch,
    /// Human-readable model name.
    pub name: String,
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention (query) heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Feed-forward size.
    pub ffn: usize,
    /// Longest context the model supports.
    pub context: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency.
    pub rope_theta: f64,
    /// RoPE pairing.
    pub rope_style: RopeStyle,
    /// Llama 3 RoPE scaling, when present.
    pub rope_scaling: Option<Llama3Scaling>,
    /// Whether q/k/v have biases.
    pub qkv_bias: bool,
}

/// Why a configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required key is missing or has the wrong type.
    #[error("missing or invalid metadata key {0}")]
    Missing(String),
    /// The architecture is not one this engine runs.
    #[error("unsupported architecture {0:?} (supported: llama, mistral, qwen2)")]
    Architecture(String),
    /// The numbers do not describe a valid model.
    #[error("inconsistent model shape: {0}")]
    Shape(String),
    /// `config.json` could not be parsed.
    #[error("config.json: {0}")]
    Json(#[from] serde_json::Error),
}

impl ModelConfig {
    /// Reads the configuration from GGUF metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Self, ConfigError> {
        let arch_name = g
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| ConfigError::Missing("general.architecture".into()))?
            .to_string();
        let arch = match arch_name.as_str() {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => return Err(ConfigError::Architecture(other.to_string())),
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let int = |k: &str| -> Result<usize, ConfigError> {
            g.get(&key(k))
                .and_then(Value::as_u64)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| ConfigError::Missing(key(k)))
        };
        let hidden = int("embedding_length")?;
        let heads = int("attention.head_count")?;
        let kv_heads = int("attention.head_count_kv").unwrap_or(heads);
        let head_dim = hidden.checked_div(heads).unwrap_or(0);
        let vocab = g
            .get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .map(<[Value]>::len)
            .or_else(|| {
                g.get(&key("vocab_size"))
                    .and_then(Value::as_u64)
                    .and_then(|v| usize::try_from(v).ok())
            })
            .or_else(|| {
                g.tensor_infos()
                    .get("token_embd.weight")
                    .map(|t| t.shape[0])
            })
            .ok_or_else(|| ConfigError::Missing("tokenizer.ggml.tokens".into()))?;
        #[allow(clippy::cast_possible_truncation)]
        let rms_eps = g
            .get(&key("attention.layer_norm_rms_epsilon"))
            .and_then(Value::as_f64)
            .unwrap_or(1e-5) as f32;
        let rope_theta = g
            .get(&key("rope.freq_base"))
            .and_then(Value::as_f64)
            .unwrap_or(10000.0);
        let rope_scaling = match g.get(&key("rope.scaling.type")).and_then(Value::as_str) {
            Some("llama3") => Some(Llama3Scaling {
                factor: g
                    .get(&key("rope.scaling.factor"))
                    .and_then(Value::as_f64)
                    .unwrap_or(8.0),
                low_freq_factor: g
                    .get(&key("rope.scaling.low_freq_factor"))
                    .and_then(Value::as_f64)
                    .unwrap_or(1.0),
                high_freq_factor: g
                    .get(&key("rope.scaling.high_freq_factor"))
                    .and_then(Value::as_f64)
                    .unwrap_or(4.0),
                original_max_position: g
                    .get(&key("rope.scaling.original_context_length"))
                    .and_then(Value::as_f64)
                    .unwrap_or(8192.0),
            }),
            _ => None,
        };
        let cfg = Self {
            arch,
            name: g
                .get("general.name")
                .and_then(Value::as_str)
                .unwrap_or(&arch_name)
                .to_string(),
            vocab,
            hidden,
            layers: int("block_count")?,
            heads,
            kv_heads,
            head_dim,
            ffn: int("feed_forward_length")?,
            context: int("context_length")?,
            rms_eps,
            rope_theta,
            rope_style: if arch == Arch::Qwen2 {
                RopeStyle::Neox
            } else {
                RopeStyle::Interleaved
            },
            rope_scaling,
            qkv_bias: arch == Arch::Qwen2,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self, ConfigError> {
        let c: HfConfig = serde_json::from_str(text)?;
        let model_type = c.model_type.clone().unwrap_or_default();
        let arch = match model_type.as_str() {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => return Err(ConfigError::Architecture(other.to_string())),
        };
        let heads = c.num_attention_heads;
        let rope_scaling = match c.rope_scaling {
            Some(s) if s.rope_type.as_deref().or(s.r#type.as_deref()) == Some("llama3") => {
                Some(Llama3Scaling {
                    factor: s.factor.unwrap_or(8.0),
                    low_freq_factor: s.low_freq_factor.unwrap_or(1.0),
                    high_freq_factor: s.high_freq_factor.unwrap_or(4.0),
                    original_max_position: s.original_max_position_embeddings.unwrap_or(8192.0),
                })
            }
            _ => None,
        };
        let cfg = Self {
            arch,
            name: model_type.clone(),
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            layers: c.num_hidden_layers,
            heads,
            kv_heads: c.num_key_value_heads.unwrap_or(heads),
            head_dim: c
                .head_dim
                .unwrap_or(c.hidden_size.checked_div(heads).unwrap_or(0)),
            ffn: c.intermediate_size,
            context: c.max_position_embeddings.unwrap_or(2048),
            #[allow(clippy::cast_possible_truncation)]
            rms_eps: c.rms_norm_eps.unwrap_or(1e-5) as f32,
            rope_theta: c.rope_theta.unwrap_or(10000.0),
            rope_style: RopeStyle::Neox,
            rope_scaling,
            qkv_bias: arch == Arch::Qwen2 || c.attention_bias.unwrap_or(false),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Shape(m));
        if self.hidden == 0
            || self.layers == 0
            || self.heads == 0
            || self.kv_heads == 0
            || self.vocab == 0
        {
            return bad(format!(
                "hidden {}, layers {}, heads {}, kv heads {}, vocab {} must all be positive",
                self.hidden, self.layers, self.heads, self.kv_heads, self.vocab
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} heads is not a multiple of {} kv heads",
                self.heads, self.kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > 512 {
            return bad(format!(
                "head size {} must be even and at most 512",
                self.head_dim
            ));
        }
        if self.context == 0 || self.context > 1 << 20 {
            return bad(format!("context length {} is out of range", self.context));
        }
        if self.hidden > 1 << 16 || self.ffn > 1 << 18 || self.layers > 1024 || self.vocab > 1 << 22
        {
            return bad("a dimension is implausibly large".into());
        }
        Ok(())
    }

    /// Query width (`heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Key/value width (`kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// RoPE inverse frequencies, one per pair, with any scaling applied.
    pub fn rope_inv_freq(&self, freq_factors: Option<&[f32]>) -> Vec<f32> {
        let d = self.head_dim;
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        (0..d / 2)
            .map(|i| {
                let mut f = 1.0 / self.rope_theta.powf((2 * i) as f64 / d as f64);
                if let Some(ff) = freq_factors {
                    f /= f64::from(ff.get(i).copied().unwrap_or(1.0));
                } else if let Some(s) = self.rope_scaling {
                    let low_wavelen = s.original_max_position / s.low_freq_factor;
                    let high_wavelen = s.original_max_position / s.high_freq_factor;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen > low_wavelen {
                        f /= s.factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (s.original_max_position / wavelen - s.low_freq_factor)
                            / (s.high_freq_factor - s.low_freq_factor);
                        f = (1.0 - smooth) * f / s.factor + smooth * f;
                    }
                }
                f as f32
            })
            .collect()
    }
}

#[derive(Deserialize)]
struct HfRopeScaling {
    rope_type: Option<String>,
    r#type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
}

#[derive(Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: usize,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<HfRopeScaling>,
    attention_bias: Option<bool>,
}
