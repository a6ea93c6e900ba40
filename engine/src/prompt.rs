//! Turning a chat or a raw prompt into token ids.
//!
//! Chat messages are rendered with the model's chat template; a model that ships none is
//! rendered with its family's turn format (Gemma's for Gemma, ChatML for the others:
//! documented fallback, logged once at load). The rendered text is
//! encoded with special tokens recognized, as Hugging Face does for templated prompts. Raw
//! prompts are used as they are: no BOS unless the model's metadata asks for one.

use std::sync::Arc;

use crate::chat_template::{ChatMessage, ChatTemplate, TemplateError, fallback_template};
use crate::model::loader::Model;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Why a prompt could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The chat template refused the conversation or failed.
    #[error("chat template: {0}")]
    Template(#[from] TemplateError),
    /// Tokenization failed.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
}

/// Builds prompts for one model.
#[derive(Clone)]
pub struct PromptBuilder {
    tokenizer: Arc<Tokenizer>,
    template: Arc<ChatTemplate>,
    /// Whether `template` is the ChatML fallback.
    pub fallback: bool,
}

impl PromptBuilder {
    /// For `model`, falling back to its family's turn format when it has no template.
    pub fn new(model: &Model) -> Self {
        let (bos, eos) = (model.tokenizer.bos_token(), model.tokenizer.eos_token());
        let (template, fallback) = match &model.chat_template {
            Some(t) => (Arc::clone(t), false),
            None => (
                Arc::new(fallback_template(model.config.arch.turn_format(), bos, eos)),
                true,
            ),
        };
        Self {
            tokenizer: Arc::clone(&model.tokenizer),
            template,
            fallback,
        }
    }

    /// Renders and encodes a conversation ending with a generation prompt.
    pub fn chat(&self, messages: &[ChatMessage]) -> Result<(String, Vec<u32>), PromptError> {
        self.chat_with(messages, None, &serde_json::Map::new(), true)
    }

    /// Renders and encodes a conversation, offering `tools` (OpenAI tool objects) to the
    /// template as its `tools` variable and `kwargs` as extra variables (HF's
    /// `chat_template_kwargs`, e.g. `enable_thinking`), with or without a generation prompt.
    /// `tools` wins over a `kwargs` entry of the same name.
    pub fn chat_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<(String, Vec<u32>), PromptError> {
        let mut extra = kwargs.clone();
        if let Some(t) = tools {
            extra.insert("tools".into(), t.clone());
        }
        let text = self
            .template
            .render_with(messages, add_generation_prompt, &extra)?;
        let ids = self.tokenizer.encode(&text, true)?;
        Ok((text, ids))
    }

    /// The chat template's source (tool-call formats are recognised from it).
    pub fn template_source(&self) -> &str {
        self.template.source()
    }

    /// The tokenizer prompts are built with (shared with the step loops).
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Encodes a raw prompt as it is.
    pub fn raw(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        Ok(self.tokenizer.encode(text, true)?)
    }
}
