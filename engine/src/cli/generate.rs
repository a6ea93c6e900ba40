//! `slotlight-engine generate`: one request through the scheduler, streamed to stdout.

use std::io::Write;

use clap::Args;
use serde_json::json;

use super::ModelArgs;
use crate::chat_template::ChatMessage;
use crate::prompt::PromptBuilder;
use crate::sampling::SamplingParams;
use crate::scheduler::{Event, GenerateRequest, SchedulerConfig};

/// Arguments of `generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The text to continue.
    #[arg(long)]
    pub prompt: String,
    /// Render the prompt as one user message through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Top-k sampling (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Min-p sampling (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop strings (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// The reply expected (OpenAI's Predicted Outputs): drafted from first, verified like
    /// any draft, so it never changes the output.
    #[arg(long)]
    pub prediction: Option<String>,
    /// Speculative decoding.
    #[command(flatten)]
    pub speculation: super::SpeculationArgs,
    /// Model and device.
    #[command(flatten)]
    pub model: ModelArgs,
}

#[allow(clippy::cast_precision_loss)]
pub(super) fn run(a: GenerateArgs) -> anyhow::Result<()> {
    let model = a.model.load()?;
    let builder = PromptBuilder::new(&model);
    let prompt = if a.chat {
        builder
            .chat(&[ChatMessage::new(
                crate::chat_template::Role::User,
                a.prompt.clone(),
            )])?
            .1
    } else {
        builder.raw(&a.prompt)?
    };
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        seed: a.seed,
        ..SamplingParams::default()
    };
    sampling.validate()?;
    let ctx = a.model.ctx_size.min(model.config.context);
    if prompt.len() >= ctx {
        anyhow::bail!(
            "the prompt has {} tokens but the context length is {} tokens",
            prompt.len(),
            ctx
        );
    }
    let max_tokens = a.max_tokens.min(ctx - prompt.len());
    let sched = SchedulerConfig {
        speculation: a.speculation.config(),
        session_windows: crate::scheduler::SessionWindows::off(),
        ..SchedulerConfig::default()
    };
    let engine = super::start_engine(&model, &a.model, ctx, sched)?;
    let prediction = a
        .prediction
        .as_deref()
        .map(|p| model.tokenizer.encode(p, false))
        .transpose()?;
    let mut rx = engine.submit(GenerateRequest {
        sampling,
        stop: crate::stop::StopMatcher::new(&a.stop)?,
        ignore_eos: a.ignore_eos,
        prediction,
        ..GenerateRequest::new("generate", prompt.clone(), max_tokens)
    })?;
    let mut out = std::io::stdout().lock();
    let mut text = String::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Token { text: t, .. } => {
                if !a.json {
                    out.write_all(t.as_bytes())?;
                    out.flush()?;
                }
                text.push_str(&t);
            }
            Event::Done(c) => {
                text.push_str(&c.tail_text);
                if let crate::scheduler::FinishReason::Error(e) = &c.finish_reason {
                    anyhow::bail!("generation failed: {e}");
                }
                let t = &c.timings;
                let u = t.usage();
                let prefill_tps = u
                    .prefill_ms
                    .filter(|ms| *ms > 0.0)
                    .map(|ms| t.prefilled_tokens as f64 / (ms / 1000.0));
                if a.json {
                    let v = json!({
                        "prompt_token_ids": prompt,
                        "token_ids": c.tokens,
                        "text": text,
                        "finish_reason": c.finish_reason.as_str(),
                        "timings": {
                            "prefill_ms": u.prefill_ms,
                            "decode_ms": u.decode_ms,
                            "prefill_tps": prefill_tps,
                            "decode_tps": u.decode_tps,
                            "ttft_ms": u.ttft_ms,
                            "e2e_ms": u.e2e_ms,
                        },
                        "speculation": c.speculation.as_str(),
                        "decode_steps": t.decode_steps,
                        "drafts": t.drafts.drafts,
                        "drafted_tokens": t.drafts.drafted_tokens,
                        "accepted_tokens": t.drafts.accepted_tokens,
                    });
                    writeln!(out, "{v}")?;
                } else {
                    out.write_all(c.tail_text.as_bytes())?;
                    writeln!(out)?;
                    eprintln!(
                        "[{} prompt tokens, {} generated, prefill {} tok/s, decode {} tok/s, finish: {}; drafts ({}): {} of {} tokens taken]",
                        prompt.len(),
                        c.tokens.len(),
                        prefill_tps.map_or("-".into(), |v| format!("{v:.0}")),
                        u.decode_tps.map_or("-".into(), |v| format!("{v:.1}")),
                        c.finish_reason.as_str(),
                        c.speculation.as_str(),
                        t.drafts.accepted_tokens,
                        t.drafts.drafted_tokens,
                    );
                }
                break;
            }
            _ => {}
        }
    }
    Ok(())
}
