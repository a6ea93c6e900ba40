//! Model hyper-parameters, read from GGUF metadata or a Hugging Face `config.json`:
//! the sizes every model has here, and its family's own ([`Hparams`]) handed to its
//! [`FamilySpec`](family::FamilySpec).

use serde::Deserialize;

use super::family::{self, Hparams, WindowPattern};
use super::gguf::{GgufFile, Value};

// At home in `family`; kept here for the backends and tests that name them by this path.
pub use super::family::{Activation, Arch, Experts, Family, RopeStyle, SlidingWindow};

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
    /// What the family's block does beyond Llama's.
    pub family: Family,
}

/// Why a configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required key is missing or has the wrong type.
    #[error("missing or invalid metadata key {0}")]
    Missing(String),
    /// The architecture is not one this engine runs.
    #[error("unsupported architecture {:?} (supported: {})", .0, family::gguf_names())]
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
        let arch = family::by_gguf_name(&arch_name)
            .ok_or_else(|| ConfigError::Architecture(arch_name.clone()))?;
        let spec = arch.spec();
        let key = |k: &str| format!("{arch_name}.{k}");
        let float = |k: &str| g.get(&key(k)).and_then(Value::as_f64);
        let int = |k: &str| -> Result<usize, ConfigError> {
            g.get(&key(k))
                .and_then(Value::as_u64)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| ConfigError::Missing(key(k)))
        };
        let hidden = int("embedding_length")?;
        let heads = int("attention.head_count")?;
        let kv_heads = int("attention.head_count_kv").unwrap_or(heads);
        let head_dim = int("attention.key_length")
            .ok()
            .unwrap_or_else(|| hidden.checked_div(heads).unwrap_or(0));
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
        let layers = int("block_count")?;
        let scaling_type = g.get(&key("rope.scaling.type")).and_then(Value::as_str);
        let family = (spec.block)(&Hparams {
            hidden,
            heads,
            head_dim,
            layers,
            sliding_window: int("attention.sliding_window").ok(),
            // llama.cpp: the pattern may be an array of per-layer flags or a period.
            window_pattern: match g.get(&key("attention.sliding_window_pattern")) {
                Some(Value::Array(a)) => Some(WindowPattern::Layers(
                    a.iter().map(|v| v.as_bool().unwrap_or(false)).collect(),
                )),
                Some(v) => v
                    .as_u64()
                    .and_then(|p| usize::try_from(p).ok())
                    .map(WindowPattern::Period),
                None => None,
            },
            local_rope_theta: float("rope.freq_base_swa"),
            rope_linear_factor: match scaling_type {
                Some("linear") => float("rope.scaling.factor"),
                _ => None,
            },
            attn_softcap: float("attn_logit_softcapping"),
            final_softcap: float("final_logit_softcapping"),
            query_pre_attn_scalar: None,
            experts: match (
                int("expert_count"),
                int("expert_used_count"),
                int("expert_feed_forward_length"),
            ) {
                (Ok(c), Ok(u), Ok(f)) => Some((c, u, f)),
                _ => None,
            },
        });
        if spec.moe && family.experts.is_none() {
            return Err(ConfigError::Missing(format!(
                "{} (with {}, {})",
                key("expert_count"),
                key("expert_used_count"),
                key("expert_feed_forward_length")
            )));
        }
        let rope_scaling = match scaling_type {
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
            layers,
            heads,
            kv_heads,
            head_dim,
            // A mixture of experts may state no dense feed-forward size.
            ffn: int("feed_forward_length").or_else(|e| family.experts.map(|x| x.ffn).ok_or(e))?,
            context: int("context_length")?,
            rms_eps,
            rope_theta,
            rope_style: spec.gguf_rope,
            rope_scaling,
            qkv_bias: spec.qkv_bias,
            family,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self, ConfigError> {
        let c: HfConfig = serde_json::from_str(text)?;
        let model_type = c.model_type.clone().unwrap_or_default();
        let arch = family::by_hf_model_type(&model_type)
            .ok_or_else(|| ConfigError::Architecture(model_type.clone()))?;
        let spec = arch.spec();
        let heads = c.num_attention_heads;
        let head_dim = c
            .head_dim
            .unwrap_or(c.hidden_size.checked_div(heads).unwrap_or(0));
        // transformers 5 moves the RoPE bases into `rope_parameters` (per layer type for Gemma 3).
        let rope_param = |layer_type: &str, k: &str| -> Option<serde_json::Value> {
            let p = c.rope_parameters.as_ref()?;
            p.get(layer_type)
                .and_then(|t| t.get(k))
                .or_else(|| p.get(k))
                .cloned()
        };
        let rope_theta = c
            .rope_theta
            .or_else(|| rope_param("full_attention", "rope_theta")?.as_f64())
            .unwrap_or(10000.0);
        #[allow(clippy::cast_precision_loss)]
        let family = (spec.block)(&Hparams {
            hidden: c.hidden_size,
            heads,
            head_dim,
            layers: c.num_hidden_layers,
            sliding_window: c.sliding_window,
            window_pattern: match &c.layer_types {
                Some(t) => Some(WindowPattern::Layers(
                    t.iter().map(|t| t == "sliding_attention").collect(),
                )),
                None => c.sliding_window_pattern.map(WindowPattern::Period),
            },
            local_rope_theta: c
                .rope_local_base_freq
                .or_else(|| rope_param("sliding_attention", "rope_theta")?.as_f64()),
            rope_linear_factor: c
                .rope_scaling
                .as_ref()
                .filter(|s| s.rope_type.as_deref().or(s.r#type.as_deref()) == Some("linear"))
                .and_then(|s| s.factor)
                .or_else(|| {
                    (rope_param("full_attention", "rope_type")?.as_str()? == "linear")
                        .then(|| rope_param("full_attention", "factor")?.as_f64())?
                }),
            attn_softcap: c.attn_logit_softcapping,
            final_softcap: c.final_logit_softcapping,
            // transformers scales queries by 1/√head_dim unless the config says otherwise.
            query_pre_attn_scalar: Some(c.query_pre_attn_scalar.unwrap_or(head_dim as f64)),
            experts: None,
        });
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
            head_dim,
            ffn: c.intermediate_size,
            context: c.max_position_embeddings.unwrap_or(2048),
            #[allow(clippy::cast_possible_truncation)]
            rms_eps: c.rms_norm_eps.unwrap_or(1e-5) as f32,
            rope_theta,
            rope_style: RopeStyle::Neox,
            rope_scaling,
            qkv_bias: spec.qkv_bias || c.attention_bias.unwrap_or(false),
            family,
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
        if let Some(sw) = &self.family.sliding_window
            && (sw.window == 0 || sw.local.len() != self.layers)
        {
            return bad(format!(
                "sliding window of {} positions over {} layer flags for {} layers",
                sw.window,
                sw.local.len(),
                self.layers
            ));
        }
        if let Some(x) = &self.family.experts
            && (x.count == 0 || x.used == 0 || x.used > x.count || x.ffn == 0 || x.count > 1024)
        {
            return bad(format!(
                "{} of {} experts per token, {} hidden units each",
                x.used, x.count, x.ffn
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

    /// RoPE inverse frequencies of the global layers, one per pair, with any scaling applied.
    pub fn rope_inv_freq(&self, freq_factors: Option<&[f32]>) -> Vec<f32> {
        let mut f = self.rope_inv_freq_with(self.rope_theta, freq_factors);
        if let Some(k) = self.family.rope_linear_factor {
            #[allow(clippy::cast_possible_truncation)]
            let k = k as f32;
            f.iter_mut().for_each(|v| *v /= k);
        }
        f
    }

    /// RoPE inverse frequencies of the local (sliding-window) layers, when they differ from
    /// the global ones (their own base, no scaling).
    pub fn rope_inv_freq_local(&self) -> Option<Vec<f32>> {
        let theta = self.family.sliding_window.as_ref()?.local_rope_theta?;
        Some(
            (0..self.head_dim / 2)
                .map(|i| {
                    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
                    let f = 1.0 / theta.powf((2 * i) as f64 / self.head_dim as f64);
                    #[allow(clippy::cast_possible_truncation)]
                    let f = f as f32;
                    f
                })
                .collect(),
        )
    }

    fn rope_inv_freq_with(&self, theta: f64, freq_factors: Option<&[f32]>) -> Vec<f32> {
        let d = self.head_dim;
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        (0..d / 2)
            .map(|i| {
                let mut f = 1.0 / theta.powf((2 * i) as f64 / d as f64);
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
    rope_parameters: Option<serde_json::Value>,
    attention_bias: Option<bool>,
    query_pre_attn_scalar: Option<f64>,
    sliding_window: Option<usize>,
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    rope_local_base_freq: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
}
