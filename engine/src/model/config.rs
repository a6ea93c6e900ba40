//! Model hyper-parameters, read from GGUF metadata or a Hugging Face `config.json`.

use serde::Deserialize;

use super::gguf::{GgufFile, Value};
use crate::chat_template::TurnFormat;

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

/// The architecture family: its name, and through [`Arch::family`] what the forward pass does
/// differently for it. Backends read the [`Family`], never the `Arch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM, TinyLlama, Mistral (GGUF `llama`).
    Llama,
    /// Qwen2 (attention bias on q, k, v).
    Qwen2,
    /// Qwen3 (per-head RMSNorm on q and k, no bias).
    Qwen3,
    /// Gemma 2 (GeGLU, pre- and post-norms, soft-capped attention and logits, sliding window
    /// on every other layer).
    Gemma2,
    /// Gemma 3 (GeGLU, pre- and post-norms, QK norm, sliding window on five of six layers).
    Gemma3,
}

impl Arch {
    /// The GGUF `general.architecture` name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// The turn format its models are prompted with when they ship no chat template:
    /// Gemma's for Gemma, ChatML for the others.
    pub fn turn_format(self) -> TurnFormat {
        match self {
            Arch::Gemma2 | Arch::Gemma3 => TurnFormat::Gemma,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => TurnFormat::ChatMl,
        }
    }
}

/// The feed-forward's gate activation (`act(gate) * up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// SiLU (SwiGLU: Llama, Qwen).
    #[default]
    Silu,
    /// GELU, tanh approximation (GeGLU: Gemma; ggml's `gelu`, PyTorch's `gelu(approximate="tanh")`).
    GeluTanh,
}

/// Which layers attend only to the last `window` positions (sliding-window attention).
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Positions a local layer sees, its own included: key `p` is visible from query `q` when
    /// `q - p < window` (llama.cpp's standard SWA, Hugging Face's `sliding_window`).
    pub window: usize,
    /// Per layer: `true` for a local (windowed) layer, `false` for a global one.
    pub local: Vec<bool>,
    /// RoPE base of the local layers (Gemma 3: 10000; global layers use
    /// [`ModelConfig::rope_theta`] and its scaling).
    pub local_rope_theta: Option<f64>,
}

impl SlidingWindow {
    /// Every `period`-th layer global, the others local (llama.cpp's `set_swa_pattern`, Gemma 3
    /// with period 6, Gemma 2 with period 2).
    pub fn periodic(window: usize, period: usize, layers: usize) -> Self {
        Self {
            window,
            local: (0..layers)
                .map(|l| period == 0 || l % period < period - 1)
                .collect(),
            local_rope_theta: None,
        }
    }
}

/// What a family does beyond the Llama block (pre-norm attention and SwiGLU, both added to the
/// residual). One description per family, read by every backend; the defaults are Llama's.
///
/// The block, in order: `h = norm(x) · attn_norm`; q, k, v projections (+ bias); per-head
/// `qk_norm`; RoPE; q scaled by [`Family::attn_scale`]; attention (windowed on local layers,
/// scores soft-capped by `attn_softcap`); output projection; `post_norms`: normed by
/// `attn_post_norm`; added to `x`. Then `h = norm(x) · ffn_norm`; `activation(gate) · up`; down
/// projection; `post_norms`: normed by `ffn_post_norm`; added to `x`.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Per-head RMSNorm of q and k before RoPE (`attn_q_norm`, `attn_k_norm`: Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm of the attention and feed-forward outputs before the residual add
    /// (`post_attention_norm`, `post_ffw_norm`: Gemma 2/3).
    pub post_norms: bool,
    /// The feed-forward activation.
    pub activation: Activation,
    /// The embedding rows are multiplied by this (Gemma: `√hidden`).
    pub embed_scale: f32,
    /// Queries are multiplied by this before attention: `1/√head_dim`, or Gemma's
    /// `1/√query_pre_attn_scalar`. `None`: `1/√head_dim`.
    pub attn_scale: Option<f32>,
    /// Attention scores become `cap · tanh(score / cap)` (Gemma 2's `attn_logit_softcapping`).
    pub attn_softcap: Option<f32>,
    /// Logits become `cap · tanh(logit / cap)` (Gemma 2's `final_logit_softcapping`).
    pub final_softcap: Option<f32>,
    /// Local layers, when the family has them.
    pub sliding_window: Option<SlidingWindow>,
    /// Linear RoPE scaling of the global layers: positions are divided by this (Gemma 3 4B+).
    pub rope_linear_factor: Option<f64>,
}

impl Default for Family {
    fn default() -> Self {
        Self {
            qk_norm: false,
            post_norms: false,
            activation: Activation::Silu,
            embed_scale: 1.0,
            attn_scale: None,
            attn_softcap: None,
            final_softcap: None,
            sliding_window: None,
            rope_linear_factor: None,
        }
    }
}

impl Family {
    /// Whether layer `l` is local, and its window.
    pub fn window(&self, l: usize) -> Option<usize> {
        let sw = self.sliding_window.as_ref()?;
        sw.local
            .get(l)
            .copied()
            .unwrap_or(false)
            .then_some(sw.window)
    }
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
    #[error(
        "unsupported architecture {0:?} (supported: llama, mistral, qwen2, qwen3, gemma2, gemma3)"
    )]
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
            "qwen3" => Arch::Qwen3,
            "gemma2" => Arch::Gemma2,
            "gemma3" => Arch::Gemma3,
            other => return Err(ConfigError::Architecture(other.to_string())),
        };
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
        let rope_linear_factor = match scaling_type {
            Some("linear") => float("rope.scaling.factor").filter(|&f| f > 0.0 && f != 1.0),
            _ => None,
        };
        let family = match arch {
            Arch::Llama | Arch::Qwen2 => Family::default(),
            Arch::Qwen3 => Family {
                qk_norm: true,
                ..Family::default()
            },
            Arch::Gemma2 | Arch::Gemma3 => {
                let gemma3 = arch == Arch::Gemma3;
                // llama.cpp: the pattern may be an array of per-layer flags or a period.
                let pattern_key = key("attention.sliding_window_pattern");
                let sliding_window =
                    int("attention.sliding_window")
                        .ok()
                        .filter(|&w| w > 0)
                        .map(|w| {
                            let mut sw = match g.get(&pattern_key) {
                                Some(Value::Array(a)) => SlidingWindow {
                                    window: w,
                                    local: a.iter().map(|v| v.as_bool().unwrap_or(false)).collect(),
                                    local_rope_theta: None,
                                },
                                Some(v) => SlidingWindow::periodic(
                                    w,
                                    v.as_u64()
                                        .and_then(|p| usize::try_from(p).ok())
                                        .unwrap_or(6),
                                    layers,
                                ),
                                None => {
                                    SlidingWindow::periodic(w, if gemma3 { 6 } else { 2 }, layers)
                                }
                            };
                            if gemma3 {
                                sw.local_rope_theta =
                                    Some(float("rope.freq_base_swa").unwrap_or(10000.0));
                            }
                            sw
                        });
                #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
                let family = Family {
                    qk_norm: gemma3,
                    post_norms: true,
                    activation: Activation::GeluTanh,
                    embed_scale: (hidden as f32).sqrt(),
                    // llama.cpp (GGUF has no `query_pre_attn_scalar`): 1/√head_dim, except
                    // the 27B models (62 layers for Gemma 3, 46 for Gemma 2): 1/√(hidden/heads).
                    attn_scale: Some(
                        1.0 / (if layers == if gemma3 { 62 } else { 46 } {
                            hidden.checked_div(heads).unwrap_or(head_dim)
                        } else {
                            head_dim
                        } as f32)
                            .sqrt(),
                    ),
                    attn_softcap: float("attn_logit_softcapping")
                        .filter(|&c| c > 0.0)
                        .map(|c| c as f32),
                    final_softcap: float("final_logit_softcapping")
                        .filter(|&c| c > 0.0)
                        .map(|c| c as f32),
                    sliding_window,
                    rope_linear_factor,
                };
                family
            }
        };
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
            ffn: int("feed_forward_length")?,
            context: int("context_length")?,
            rms_eps,
            rope_theta,
            // llama.cpp's `llama_model_rope_type`: NEOX for Qwen and Gemma, NORM for llama.
            rope_style: if arch == Arch::Llama {
                RopeStyle::Interleaved
            } else {
                RopeStyle::Neox
            },
            rope_scaling,
            qkv_bias: arch == Arch::Qwen2,
            family,
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
            "qwen3" => Arch::Qwen3,
            "gemma2" => Arch::Gemma2,
            "gemma3_text" | "gemma3" => Arch::Gemma3,
            other => return Err(ConfigError::Architecture(other.to_string())),
        };
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
        let family = match arch {
            Arch::Llama | Arch::Qwen2 => Family::default(),
            Arch::Qwen3 => Family {
                qk_norm: true,
                ..Family::default()
            },
            Arch::Gemma2 | Arch::Gemma3 => {
                let gemma3 = arch == Arch::Gemma3;
                let layers = c.num_hidden_layers;
                let sliding_window = c.sliding_window.filter(|&w| w > 0).map(|w| {
                    let mut sw = match &c.layer_types {
                        Some(t) => SlidingWindow {
                            window: w,
                            local: t.iter().map(|t| t == "sliding_attention").collect(),
                            local_rope_theta: None,
                        },
                        None => SlidingWindow::periodic(
                            w,
                            c.sliding_window_pattern
                                .unwrap_or(if gemma3 { 6 } else { 2 }),
                            layers,
                        ),
                    };
                    if gemma3 {
                        sw.local_rope_theta = Some(
                            c.rope_local_base_freq
                                .or_else(|| rope_param("sliding_attention", "rope_theta")?.as_f64())
                                .unwrap_or(10000.0),
                        );
                    }
                    sw
                });
                let linear = c
                    .rope_scaling
                    .as_ref()
                    .filter(|s| s.rope_type.as_deref().or(s.r#type.as_deref()) == Some("linear"))
                    .and_then(|s| s.factor)
                    .or_else(|| {
                        (rope_param("full_attention", "rope_type")?.as_str()? == "linear")
                            .then(|| rope_param("full_attention", "factor")?.as_f64())?
                    })
                    .filter(|&f| f > 0.0 && f != 1.0);
                #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
                let family = Family {
                    qk_norm: gemma3,
                    post_norms: true,
                    activation: Activation::GeluTanh,
                    embed_scale: (c.hidden_size as f32).sqrt(),
                    attn_scale: Some(
                        1.0 / (c.query_pre_attn_scalar.unwrap_or(head_dim as f64) as f32).sqrt(),
                    ),
                    attn_softcap: c
                        .attn_logit_softcapping
                        .filter(|&v| v > 0.0)
                        .map(|v| v as f32),
                    final_softcap: c
                        .final_logit_softcapping
                        .filter(|&v| v > 0.0)
                        .map(|v| v as f32),
                    sliding_window,
                    rope_linear_factor: linear,
                };
                family
            }
        };
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
            qkv_bias: arch == Arch::Qwen2 || c.attention_bias.unwrap_or(false),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma_families_fall_back_to_gemma_turns_and_the_others_to_chatml() {
        assert_eq!(Arch::Gemma2.turn_format(), TurnFormat::Gemma);
        assert_eq!(Arch::Gemma3.turn_format(), TurnFormat::Gemma);
        for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
            assert_eq!(arch.turn_format(), TurnFormat::ChatMl, "{}", arch.name());
        }
    }
}
