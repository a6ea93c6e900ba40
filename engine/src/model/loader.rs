//! Loading a model from a path: a GGUF file, or a Hugging Face folder (`config.json`,
//! `*.safetensors`, `tokenizer.json`, `tokenizer_config.json`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::config::{ConfigError, ModelConfig};
use super::family::GGUF_NAMES;
use super::gguf::{GgufError, GgufFile, Value};
use super::llama::{LlamaWeights, WeightsError};
use super::safetensors::{Checkpoint, SafetensorsError};
use crate::chat_template::{ChatTemplate, TemplateError, fallback_template};
use crate::tokenizer::{GgufVocab, Tokenizer, TokenizerConfig, TokenizerError};
use slotlight_otel::span::OPS_TARGET;
use slotlight_otel::{attr, span};

/// Why a model could not be loaded. Every variant names the file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The path does not exist.
    #[error("{0}: no such file or directory")]
    NotFound(PathBuf),
    /// The GGUF file is unreadable.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The safetensors checkpoint is unreadable.
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    /// The configuration is missing or invalid.
    #[error("{path}: {source}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: ConfigError,
    },
    /// A weight is missing or mis-shaped.
    #[error("{path}: {source}")]
    Weights {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: WeightsError,
    },
    /// The tokenizer cannot be built.
    #[error("{path}: tokenizer: {source}")]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: TokenizerError,
    },
    /// The chat template does not compile.
    #[error("{path}: chat template: {source}")]
    Template {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: TemplateError,
    },
    /// Some other file problem.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The source format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A GGUF file.
    Gguf,
    /// A Hugging Face folder.
    HuggingFace,
}

/// A loaded model: configuration, weights (mapped, not copied), tokenizer and chat template.
pub struct Model {
    /// Where it came from.
    pub path: PathBuf,
    /// The format it was read from (GGUF file or Hugging Face folder).
    pub format: Format,
    /// The name clients use (`model` in requests): the file or folder name without extension.
    pub id: String,
    /// Its architecture and sizes, as the file gives them.
    pub config: ModelConfig,
    /// Its weights, mapped from the file and shared by every backend.
    pub weights: Arc<LlamaWeights>,
    /// Its tokenizer and chat template, shared by the server and every step loop.
    pub tokenizer: Arc<Tokenizer>,
    /// The model's chat template, or `None` when it has none.
    pub chat_template: Option<Arc<ChatTemplate>>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.path)
            .field("config", &self.config)
            .finish()
    }
}

fn model_id(path: &Path) -> String {
    path.file_stem()
        .or_else(|| path.file_name())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

/// What the engine reports about a loaded model (start-up span, `/health`, `bench --json`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModelInfo {
    /// The architecture family (`gemma3`, ...).
    pub arch: &'static str,
    /// The distinct matrix types, in name order.
    pub weight_types: Vec<&'static str>,
    /// The trained context length.
    pub context_length: usize,
    /// For a mixture of experts: experts per layer and experts each token runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts: Option<[usize; 2]>,
}

impl ModelInfo {
    /// Of a configuration and its weights.
    pub fn of(cfg: &ModelConfig, weights: &LlamaWeights) -> Self {
        Self {
            arch: cfg.arch.name(),
            weight_types: weights.dtypes().into_iter().map(|d| d.name()).collect(),
            context_length: cfg.context,
            experts: cfg.family.experts.map(|x| [x.count, x.used]),
        }
    }

    /// Records it on `span`'s `slotlight.model.*` fields.
    fn record(&self, span: &tracing::Span) {
        span.record(attr::MODEL_ARCH, self.arch);
        span.record(
            attr::MODEL_WEIGHT_TYPES,
            self.weight_types.join(",").as_str(),
        );
        // i64: tracing-opentelemetry exports a u64 field as a string.
        span.record(
            attr::MODEL_CONTEXT_LENGTH,
            i64::try_from(self.context_length).unwrap_or(i64::MAX),
        );
    }
}

/// A Hugging Face folder's `tokenizer_config.json`, when it has one.
fn hf_tokenizer_config(dir: &Path) -> Result<Option<TokenizerConfig>, LoadError> {
    let path = dir.join("tokenizer_config.json");
    if !path.exists() {
        return Ok(None);
    }
    TokenizerConfig::from_file(&path)
        .map(Some)
        .map_err(|source| LoadError::Tokenizer { path, source })
}

/// A Hugging Face folder's `tokenizer.json`, its special tokens named by `config`.
fn hf_tokenizer(dir: &Path, config: Option<&TokenizerConfig>) -> Result<Tokenizer, LoadError> {
    let path = dir.join("tokenizer.json");
    Tokenizer::from_file(&path, config).map_err(|source| LoadError::Tokenizer { path, source })
}

/// The tokenizer of a GGUF file (`tokenizer.ggml.*`; the file may hold no weights, like
/// llama.cpp's `ggml-vocab-*.gguf` test vocabularies).
pub fn gguf_tokenizer(g: &GgufFile, path: &Path) -> Result<Tokenizer, LoadError> {
    let tok_err = |source| LoadError::Tokenizer {
        path: path.to_path_buf(),
        source,
    };
    let strings = |k: &str| -> Option<Vec<String>> {
        g.get(k)?
            .as_array()?
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens").ok_or_else(|| LoadError::File {
        path: path.to_path_buf(),
        message: "no tokenizer.ggml.tokens: this GGUF carries no vocabulary".into(),
    })?;
    let merges = strings("tokenizer.ggml.merges");
    #[allow(clippy::cast_possible_truncation)]
    let token_types: Option<Vec<i32>> = g
        .get("tokenizer.ggml.token_type")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|v| v.as_f64().unwrap_or(1.0) as i32).collect());
    #[allow(clippy::cast_possible_truncation)]
    let scores: Option<Vec<f32>> = g
        .get("tokenizer.ggml.scores")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect());
    let id = |k: &str| {
        g.get(k)
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    };
    let model_kind = g
        .get("tokenizer.ggml.model")
        .and_then(Value::as_str)
        .unwrap_or("gpt2");
    let vocab = GgufVocab {
        model: model_kind,
        pre: g.get("tokenizer.ggml.pre").and_then(Value::as_str),
        tokens: &tokens,
        token_types: token_types.as_deref(),
        merges: merges.as_deref(),
        scores: scores.as_deref(),
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_id: id("tokenizer.ggml.eos_token_id"),
        eot_id: id("tokenizer.ggml.eot_token_id"),
        add_bos: g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(model_kind == "llama"),
        add_eos: g
            .get("tokenizer.ggml.add_eos_token")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        add_space_prefix: g
            .get("tokenizer.ggml.add_space_prefix")
            .and_then(Value::as_bool)
            .unwrap_or(true),
    };
    Tokenizer::from_gguf_vocab(&vocab).map_err(tok_err)
}

/// The `slotlight.startup.model` span, with room for the model's attributes.
fn model_span() -> tracing::Span {
    tracing::info_span!(
        target: OPS_TARGET,
        span::STARTUP_MODEL,
        { attr::MODEL_ARCH } = tracing::field::Empty,
        { attr::MODEL_WEIGHT_TYPES } = tracing::field::Empty,
        { attr::MODEL_CONTEXT_LENGTH } = tracing::field::Empty,
    )
}

impl Model {
    /// What the engine reports about this model.
    pub fn info(&self) -> ModelInfo {
        ModelInfo::of(&self.config, &self.weights)
    }

    /// Loads a GGUF file or a Hugging Face folder.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        if !path.exists() {
            return Err(LoadError::NotFound(path.to_path_buf()));
        }
        if path.is_dir() {
            Self::load_hf(path)
        } else {
            Self::load_gguf(path)
        }
    }

    /// The tokenizer alone, without the weights: built from a GGUF file's vocabulary (as
    /// `load` builds it), or read from a Hugging Face folder's `tokenizer.json`.
    pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, LoadError> {
        if !path.exists() {
            return Err(LoadError::NotFound(path.to_path_buf()));
        }
        if path.is_dir() {
            return hf_tokenizer(path, hf_tokenizer_config(path)?.as_ref());
        }
        gguf_tokenizer(&GgufFile::open(path)?, path)
    }

    /// The chat template source the model's chat prompts are rendered with, from metadata
    /// only (no weights): its own (GGUF `tokenizer.chat_template`, or `tokenizer_config.json`
    /// in a Hugging Face folder), else its family's fallback
    /// ([`fallback_template`] of its [`Arch::turn_format`](super::config::Arch::turn_format)).
    pub fn load_chat_template_source(
        path: &Path,
        tokenizer: &Tokenizer,
    ) -> Result<String, LoadError> {
        let config_err = |source| LoadError::Config {
            path: path.to_path_buf(),
            source,
        };
        let arch = if path.is_dir() {
            if let Some(src) = hf_tokenizer_config(path)?
                .as_ref()
                .and_then(TokenizerConfig::chat_template)
            {
                return Ok(src.to_owned());
            }
            let cfg_path = path.join("config.json");
            let text = std::fs::read_to_string(&cfg_path).map_err(|e| LoadError::File {
                path: cfg_path.clone(),
                message: e.to_string(),
            })?;
            ModelConfig::from_hf_json(&text).map_err(config_err)?.arch
        } else {
            let g = GgufFile::open(path)?;
            if let Some(src) = g.get("tokenizer.chat_template").and_then(Value::as_str) {
                return Ok(src.to_owned());
            }
            ModelConfig::from_gguf(&g).map_err(config_err)?.arch
        };
        let fallback = fallback_template(
            arch.turn_format(),
            tokenizer.bos_token(),
            tokenizer.eos_token(),
        );
        Ok(fallback.source().to_owned())
    }

    /// Loads weights and configuration only (no tokenizer); for kernels benchmarks and tests.
    pub fn load_weights(path: &Path) -> Result<(ModelConfig, Arc<LlamaWeights>), LoadError> {
        let g = GgufFile::open(path)?;
        let cfg = ModelConfig::from_gguf(&g).map_err(|source| LoadError::Config {
            path: path.to_path_buf(),
            source,
        })?;
        let w = LlamaWeights::assemble(&cfg, &GGUF_NAMES, |n| g.tensor(n)).map_err(|source| {
            LoadError::Weights {
                path: path.to_path_buf(),
                source,
            }
        })?;
        Ok((cfg, Arc::new(w)))
    }

    fn load_gguf(path: &Path) -> Result<Self, LoadError> {
        let mapping = model_span().entered();
        let g = GgufFile::open(path)?;
        let cfg = ModelConfig::from_gguf(&g).map_err(|source| LoadError::Config {
            path: path.to_path_buf(),
            source,
        })?;
        let weights =
            LlamaWeights::assemble(&cfg, &GGUF_NAMES, |n| g.tensor(n)).map_err(|source| {
                LoadError::Weights {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        ModelInfo::of(&cfg, &weights).record(&mapping);
        drop(mapping);
        let _tokenizer = tracing::info_span!(target: OPS_TARGET, span::STARTUP_TOKENIZER).entered();
        let tokenizer = gguf_tokenizer(&g, path)?;
        let chat_template = match g.get("tokenizer.chat_template").and_then(Value::as_str) {
            Some(src) => Some(Arc::new(
                ChatTemplate::new(src, tokenizer.bos_token(), tokenizer.eos_token()).map_err(
                    |source| LoadError::Template {
                        path: path.to_path_buf(),
                        source,
                    },
                )?,
            )),
            None => None,
        };
        Ok(Self {
            path: path.to_path_buf(),
            format: Format::Gguf,
            id: model_id(path),
            config: cfg,
            weights: Arc::new(weights),
            tokenizer: Arc::new(tokenizer),
            chat_template,
        })
    }

    fn load_hf(dir: &Path) -> Result<Self, LoadError> {
        let mapping = model_span().entered();
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| LoadError::File {
            path: cfg_path.clone(),
            message: e.to_string(),
        })?;
        let cfg = ModelConfig::from_hf_json(&text).map_err(|source| LoadError::Config {
            path: cfg_path.clone(),
            source,
        })?;
        let ckpt = Checkpoint::open(dir)?;
        let names = cfg.arch.spec().hf_tensors;
        let weights =
            LlamaWeights::assemble(&cfg, names, |n| ckpt.tensor(n)).map_err(|source| {
                LoadError::Weights {
                    path: dir.to_path_buf(),
                    source,
                }
            })?;
        ModelInfo::of(&cfg, &weights).record(&mapping);
        drop(mapping);
        let _tokenizer = tracing::info_span!(target: OPS_TARGET, span::STARTUP_TOKENIZER).entered();
        let tc_path = dir.join("tokenizer_config.json");
        let tc = hf_tokenizer_config(dir)?;
        let tokenizer = hf_tokenizer(dir, tc.as_ref())?;
        let chat_template = match tc.as_ref().and_then(TokenizerConfig::chat_template) {
            Some(src) => Some(Arc::new(
                ChatTemplate::new(src, tokenizer.bos_token(), tokenizer.eos_token()).map_err(
                    |source| LoadError::Template {
                        path: tc_path.clone(),
                        source,
                    },
                )?,
            )),
            None => None,
        };
        let mut config = cfg;
        config.name = model_id(dir);
        Ok(Self {
            path: dir.to_path_buf(),
            format: Format::HuggingFace,
            id: model_id(dir),
            config,
            weights: Arc::new(weights),
            tokenizer: Arc::new(tokenizer),
            chat_template,
        })
    }
}
