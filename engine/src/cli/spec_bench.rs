//! `slotlight-engine bench --speculative-prompts FILE`: speculative decoding side by side with
//! plain decoding, on a prompt set (as `tests/bench/speculative/prompts.json`): each prompt is
//! one chat message, generated greedily by an engine without drafts and by one with them, in
//! turns; the figures are completion tokens per second end to end (arrival to finish, the
//! prefill included), the decode rate, the drafts' acceptance, and whether the two outputs are
//! the same tokens.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::json;

use super::ModelArgs;
use crate::chat_template::{ChatMessage, Role};
use crate::model::loader::Model;
use crate::prompt::PromptBuilder;
use crate::sampling::SamplingParams;
use crate::scheduler::{EngineHandle, Event, FinishReason, GenerateRequest, SchedulerConfig};
use crate::speculation::SpeculationConfig;
use crate::timing::RequestTimings;

/// A prompt set file.
#[derive(Debug, Deserialize)]
struct PromptSet {
    prompts: Vec<BenchPrompt>,
}

/// One prompt of the set.
#[derive(Debug, Clone, Deserialize)]
struct BenchPrompt {
    /// Its name in the report.
    name: String,
    /// `input-grounded` or `free-form`.
    kind: String,
    /// What the user asks.
    instruction: String,
    /// A file (beside the prompt set) whose text follows the instruction.
    #[serde(default)]
    file: Option<PathBuf>,
    /// The file's text goes in a fenced block of this language.
    #[serde(default)]
    fence: Option<String>,
    /// Most tokens to generate.
    max_tokens: usize,
}

impl BenchPrompt {
    /// The user message: the instruction, then the file's text.
    fn message(&self, dir: &Path) -> anyhow::Result<String> {
        let Some(file) = &self.file else {
            return Ok(self.instruction.clone());
        };
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        Ok(match &self.fence {
            Some(lang) => format!("{}\n\n```{lang}\n{text}```", self.instruction),
            None => format!("{}\n\n{text}", self.instruction),
        })
    }
}

/// One greedy run: the tokens and the request's own clocks.
struct Run {
    tokens: Vec<u32>,
    timings: RequestTimings,
}

impl Run {
    /// Completion tokens per second from arrival to finish.
    #[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
    fn e2e_tps(&self) -> f64 {
        let ms = self.timings.usage().e2e_ms.unwrap_or(0.0);
        if ms > 0.0 {
            self.tokens.len() as f64 / (ms / 1000.0)
        } else {
            0.0
        }
    }
}

fn generate(engine: &EngineHandle, prompt: &[u32], max_tokens: usize) -> anyhow::Result<Run> {
    let mut rx = engine.submit(GenerateRequest {
        sampling: SamplingParams::greedy(),
        ..GenerateRequest::new("bench-speculative", prompt.to_vec(), max_tokens)
    })?;
    while let Some(ev) = rx.blocking_recv() {
        if let Event::Done(c) = ev {
            if let FinishReason::Error(e) = &c.finish_reason {
                anyhow::bail!("generation failed: {e}");
            }
            return Ok(Run {
                tokens: c.tokens,
                timings: c.timings,
            });
        }
    }
    anyhow::bail!("the engine went away")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs the prompt set at `file` on `model`, `reps` times each (after one untimed warm-up
/// round), drafting as `on` says in one engine and not at all in the other.
#[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
pub(super) fn run(
    model: &Model,
    args: &ModelArgs,
    file: &Path,
    on: SpeculationConfig,
    reps: usize,
    as_json: bool,
) -> anyhow::Result<()> {
    let set: PromptSet = serde_json::from_str(
        &std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?,
    )?;
    let dir = file.parent().unwrap_or(Path::new("."));
    let builder = PromptBuilder::new(model);
    let ctx = args.ctx_size.min(model.config.context);
    let engine = |spec: SpeculationConfig| {
        let sched = SchedulerConfig {
            batch: 1,
            speculation: spec,
            session_windows: crate::scheduler::SessionWindows::off(),
            ..SchedulerConfig::default()
        };
        super::start_engine(model, args, ctx, sched)
    };
    let plain = engine(SpeculationConfig {
        max_tokens: 0,
        ..SpeculationConfig::off()
    })?;
    let drafting = engine(on.clone())?;
    let mut report = Vec::new();
    for p in &set.prompts {
        let message = p.message(dir)?;
        let (_, prompt) = builder.chat(&[ChatMessage::new(Role::User, message)])?;
        let max_tokens = p.max_tokens.min(ctx.saturating_sub(prompt.len() + 1));
        anyhow::ensure!(max_tokens > 0, "prompt {} does not fit the context", p.name);
        let (mut off_tps, mut on_tps, mut on_decode, mut off_decode) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut identical = true;
        let mut last = None;
        for rep in 0..=reps {
            // Turns alternate, so that neither always runs second.
            let (a, b) = if rep % 2 == 0 {
                let a = generate(&plain, &prompt, max_tokens)?;
                (a, generate(&drafting, &prompt, max_tokens)?)
            } else {
                let b = generate(&drafting, &prompt, max_tokens)?;
                (generate(&plain, &prompt, max_tokens)?, b)
            };
            identical &= a.tokens == b.tokens;
            if rep > 0 {
                off_tps.push(a.e2e_tps());
                on_tps.push(b.e2e_tps());
                off_decode.push(a.timings.usage().decode_tps.unwrap_or(0.0));
                on_decode.push(b.timings.usage().decode_tps.unwrap_or(0.0));
            }
            last = Some((a, b));
        }
        let Some((a, b)) = last else { continue };
        let d = b.timings.drafts;
        let (off, on_rate) = (median(off_tps), median(on_tps));
        let acceptance = if d.drafted_tokens > 0 {
            d.accepted_tokens as f64 / d.drafted_tokens as f64
        } else {
            0.0
        };
        if !as_json {
            println!(
                "{:<10} {:<15} {:>4} tokens: plain {:>6.1} tok/s, drafting {:>6.1} tok/s ({:.2}x); decode {:.1} -> {:.1} tok/s; {} drafts, {} of {} draft tokens taken ({:.0}%), {:.2} tokens a decode step; {} output",
                p.name,
                p.kind,
                a.tokens.len(),
                off,
                on_rate,
                on_rate / off.max(1e-9),
                median(off_decode.clone()),
                median(on_decode.clone()),
                d.drafts,
                d.accepted_tokens,
                d.drafted_tokens,
                100.0 * acceptance,
                b.timings.decode_tokens as f64 / b.timings.decode_steps.max(1) as f64,
                if identical { "identical" } else { "DIFFERENT" },
            );
        }
        report.push(json!({
            "name": p.name,
            "kind": p.kind,
            "prompt_tokens": prompt.len(),
            "completion_tokens": a.tokens.len(),
            "plain_tps": off,
            "drafting_tps": on_rate,
            "speedup": on_rate / off.max(1e-9),
            "plain_decode_tps": median(off_decode),
            "drafting_decode_tps": median(on_decode),
            "drafts": d.drafts,
            "drafted_tokens": d.drafted_tokens,
            "accepted_tokens": d.accepted_tokens,
            "acceptance": acceptance,
            "decode_steps": b.timings.decode_steps,
            "decode_tokens": b.timings.decode_tokens,
            "identical": identical,
        }));
    }
    if as_json {
        println!(
            "{}",
            json!({
                "model": model.id,
                "speculative_tokens": on.max_tokens,
                "ngram": on.ngram,
                "reps": reps,
                "speculative": report,
            })
        );
    }
    Ok(())
}
