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
use crate::replies::ReplyMemory;
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
    /// The replies the engine generated, by what a client sends back.
    replies: Arc<ReplyMemory>,
}

/// Stands in for the `k`-th remembered reply while the template renders: private-use
/// characters no template writes, trims or escapes.
fn sentinel(k: usize) -> String {
    format!("\u{E000}slotlight-generated-reply-{k}\u{E001}")
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
            replies: Arc::default(),
        }
    }

    /// The same, remembering at most `bytes` of generated replies (`--reply-memory-mib`).
    pub fn with_reply_memory(mut self, bytes: usize) -> Self {
        self.replies = Arc::new(ReplyMemory::with_bytes(bytes));
        self
    }

    /// The memory of generated replies (the request path remembers each reply there).
    pub fn replies(&self) -> &Arc<ReplyMemory> {
        &self.replies
    }

    /// Renders and encodes a conversation as [`PromptBuilder::chat_with`] does, except that
    /// each assistant message with [`ChatMessage::generated`] ids (its reply as the engine
    /// generated it) is those ids, whatever its text would tokenize to: the template renders
    /// the conversation with a sentinel in each such message's place (its text, tool calls
    /// and reasoning all in the ids), the text between sentinels is encoded piece by piece,
    /// and a reply that ended with its end-of-turn token is not followed by the template's
    /// writing of it again. Returns the text with each reply's decoded ids in its place, the
    /// ids, and how many replies were used; a template that does not write each sentinel
    /// once, in order, is rendered as sent instead (0 used).
    pub fn chat_generated(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<(String, Vec<u32>, usize), PromptError> {
        let used = messages.iter().filter(|m| m.generated.is_some()).count();
        if used == 0 {
            let (text, ids) = self.chat_with(messages, tools, kwargs, add_generation_prompt)?;
            return Ok((text, ids, 0));
        }
        let mut stand_in = messages.to_vec();
        let mut replies = Vec::with_capacity(used);
        for m in &mut stand_in {
            if let Some(ids) = m.generated.take() {
                m.content = sentinel(replies.len());
                m.tool_calls = None;
                m.reasoning_content = None;
                replies.push(ids);
            }
        }
        let rendered = self.render(&stand_in, tools, kwargs, add_generation_prompt)?;
        let Some(pieces) = split_at_sentinels(&rendered, replies.len()) else {
            let (text, ids) = self.chat_with(messages, tools, kwargs, add_generation_prompt)?;
            return Ok((text, ids, 0));
        };
        let tok = &self.tokenizer;
        let mut ids = tok.encode_with(pieces[0], true, true)?;
        let mut text = pieces[0].to_string();
        for (reply, piece) in replies.iter().zip(&pieces[1..]) {
            ids.extend_from_slice(reply);
            text.push_str(&tok.decode_with(reply, false)?);
            let mut after = *piece;
            // A reply that ended with its end-of-turn token holds it already.
            if let Some(&last) = reply.last()
                && tok.is_stop_token(last)
                && let Ok(end) = tok.decode_with(&[last], false)
                && !end.is_empty()
            {
                after = after.strip_prefix(end.as_str()).unwrap_or(after);
            }
            ids.extend(tok.encode_with(after, true, false)?);
            text.push_str(after);
        }
        Ok((text, ids, used))
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
        let text = self.render(messages, tools, kwargs, add_generation_prompt)?;
        let ids = self.tokenizer.encode(&text, true)?;
        Ok((text, ids))
    }

    /// The template's text for `messages`, `tools` (its `tools` variable) and `kwargs`.
    fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, PromptError> {
        let mut extra = kwargs.clone();
        if let Some(t) = tools {
            extra.insert("tools".into(), t.clone());
        }
        Ok(self
            .template
            .render_with(messages, add_generation_prompt, &extra)?)
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

/// `text` cut at the sentinels `0..n`, each found exactly once and in order: `n + 1` pieces.
fn split_at_sentinels(text: &str, n: usize) -> Option<Vec<&str>> {
    let mut pieces = Vec::with_capacity(n + 1);
    let mut rest = text;
    for k in 0..n {
        let s = sentinel(k);
        if text.matches(s.as_str()).count() != 1 {
            return None;
        }
        let at = rest.find(s.as_str())?;
        pieces.push(&rest[..at]);
        rest = &rest[at + s.len()..];
    }
    pieces.push(rest);
    Some(pieces)
}
