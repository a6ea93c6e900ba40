//! The `slotlight-engine` command line (the binary's front end; uses `anyhow` for errors).

mod bench;
mod generate;
pub mod serve;
mod spec_bench;

use std::path::PathBuf;
use std::sync::Arc;

use clap::builder::TypedValueParser as _;
use clap::{Args, Parser, Subcommand};

use crate::model::loader::Model;
use crate::runtime::{self, RuntimeConfig};
use crate::scheduler::{EngineHandle, SchedulerConfig};
use crate::speculation::SpeculationConfig;
use crate::telemetry::OPS_TARGET;
use slotlight_otel::span;

/// slotlight-engine: an LLM inference engine that tells the truth about its own timing.
#[derive(Debug, Parser)]
#[command(name = "slotlight-engine", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Commands,
}

/// The engine's subcommands: fetch a model, generate, bench, serve, export the tokenizer.
#[derive(Debug, Subcommand)]
pub enum Commands {
    /// Fetch a known model (default: SmolLM2-135M-Instruct Q4_1) into the cache folder.
    FetchModel(FetchArgs),
    /// Generate text from a prompt and stream it to stdout.
    Generate(generate::GenerateArgs),
    /// Measure prefill and decode speed on the model.
    Bench(bench::BenchArgs),
    /// Serve the OpenAI-compatible API.
    Serve(Box<serve::ServeArgs>),
    /// Write the model's tokenizer as Hugging Face files (`tokenizer.json` and
    /// `tokenizer_config.json`, with its chat template), for routers that tokenize prompts
    /// themselves, such as llm-d's precise prefix-cache scorer.
    ExportTokenizer(ExportTokenizerArgs),
}

/// Which model's tokenizer `export-tokenizer` writes, and where.
#[derive(Debug, Clone, Args)]
pub struct ExportTokenizerArgs {
    /// A GGUF file, a Hugging Face folder, or a known model's name. Default: the default
    /// model, fetched when missing.
    #[arg(long, env = "SLOTLIGHT_MODEL")]
    pub model: Option<PathBuf>,
    /// The `tokenizer.json` to write (its folder is created), beside which a
    /// `tokenizer_config.json` (the chat template, BOS/EOS) is written too, so the folder loads
    /// with `transformers`' `AutoTokenizer`; `-` writes only `tokenizer.json`, to stdout.
    #[arg(long)]
    pub out: PathBuf,
}

fn export_tokenizer(a: &ExportTokenizerArgs) -> anyhow::Result<()> {
    let path = ModelArgs {
        model: a.model.clone(),
        device: "cpu".to_owned(),
        threads: None,
        ctx_size: 0,
    }
    .resolve()?;
    use crate::tokenizer::export;
    let tokenizer = Model::load_tokenizer(&path)?;
    let json = export::tokenizer_json(&tokenizer)?;
    if a.out.as_os_str() == "-" {
        println!("{json}");
        return Ok(());
    }
    let dir = a.out.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    }
    let template = Model::load_chat_template_source(&path, &tokenizer)?;
    let config = serde_json::to_string_pretty(&export::tokenizer_config(&tokenizer, &template))?;
    let config_path = dir.map_or_else(
        || std::path::PathBuf::from("tokenizer_config.json"),
        |d| d.join("tokenizer_config.json"),
    );
    for (file, text) in [(&a.out, json), (&config_path, config)] {
        std::fs::write(file, text)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", file.display()))?;
        println!("{}", file.display());
    }
    Ok(())
}

/// Which known model `fetch-model` fetches, or `--list` to list them instead.
#[derive(Debug, Clone, Args)]
pub struct FetchArgs {
    /// The model's name (see --list).
    #[arg(default_value = crate::known_models::DEFAULT.name)]
    pub name: String,
    /// List the known models and whether each is fetched.
    #[arg(long)]
    pub list: bool,
}

fn fetch_model(a: &FetchArgs) -> anyhow::Result<()> {
    use crate::known_models::{self, FetchError};
    if a.list {
        for m in known_models::KNOWN {
            let state = if m.path().exists() {
                "fetched"
            } else {
                "not fetched"
            };
            println!("{:<14} {state:<12} {}", m.name, m.description);
        }
        return Ok(());
    }
    let m = known_models::find(&a.name).ok_or_else(|| FetchError::Unknown {
        name: a.name.clone(),
        known: known_models::names(),
    })?;
    println!("{}", m.ensure(true)?.display());
    Ok(())
}

/// Options shared by every command that runs the model.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// A GGUF file, a Hugging Face folder, or a known model's name (`smollm2-135m`,
    /// `gemma3-270m`: see `fetch-model --list`). Default: the default model, fetched when
    /// missing.
    #[arg(long, env = "SLOTLIGHT_MODEL")]
    pub model: Option<PathBuf>,
    /// Compute device(s): cpu, cpu,cpu (several CPU groups), cuda, cuda:N, cuda:0,1 or auto.
    #[arg(long, default_value = "cpu", env = "SLOTLIGHT_DEVICE")]
    pub device: String,
    /// Compute threads (all CPU groups together). Default: every core.
    #[arg(long, env = "SLOTLIGHT_THREADS")]
    pub threads: Option<usize>,
    /// Context length (capped by the model's own).
    #[arg(long, default_value_t = 4096)]
    pub ctx_size: usize,
}

/// Speculative decoding's flags (`serve`, `generate`, `bench`).
#[derive(Debug, Clone, Args)]
pub struct SpeculationArgs {
    /// Speculative decoding: `ngram` drafts tokens from each request's own prompt and reply
    /// (prompt lookup) and verifies a draft of K tokens in one forward step over K + 1
    /// positions, exactly (the output is the one plain decoding gives); `off` drafts nothing
    /// from them. A request's `prediction` (OpenAI's Predicted Outputs) is drafted from either
    /// way.
    #[arg(long, default_value = "ngram", value_parser = ["ngram", "off"])]
    pub speculative: String,
    /// The most tokens one draft may have (1 to 15); each sequence's draft length adapts
    /// below it, and drafting pauses where drafts keep failing.
    #[arg(long, default_value_t = SpeculationConfig::default().max_tokens,
          value_parser = clap::value_parser!(u8).range(1..=15).map(usize::from))]
    pub speculative_tokens: usize,
    /// The shortest run of a request's last tokens looked up in its prompt and reply (2 to 4):
    /// shorter runs find more drafts, and more that fail.
    #[arg(long, default_value_t = SpeculationConfig::default().min_ngram,
          value_parser = clap::value_parser!(u8).range(2..=4).map(usize::from))]
    pub speculative_ngram: usize,
}

impl SpeculationArgs {
    /// The scheduler's speculation settings.
    pub fn config(&self) -> SpeculationConfig {
        SpeculationConfig {
            ngram: self.speculative == "ngram",
            max_tokens: self.speculative_tokens,
            min_ngram: self.speculative_ngram,
        }
    }
}

impl ModelArgs {
    /// The model path, fetching the default model when none was given. A known model's name
    /// (that is not also an existing path) resolves to its cached file, which must have been
    /// fetched with `fetch-model NAME`.
    pub fn resolve(&self) -> anyhow::Result<PathBuf> {
        match &self.model {
            Some(p) if p.exists() => Ok(p.clone()),
            Some(p) => match p.to_str().and_then(crate::known_models::find) {
                Some(m) => Ok(m.cached()?),
                None => Ok(p.clone()),
            },
            None => Ok(crate::known_models::ensure(true)?),
        }
    }

    /// The known model's name `--model` gave (not a path), if any.
    pub fn known_name(&self) -> Option<&'static str> {
        let p = self.model.as_ref()?;
        if p.exists() {
            return None;
        }
        crate::known_models::find(p.to_str()?).map(|m| m.name)
    }

    /// Loads the model.
    pub fn load(&self) -> anyhow::Result<Model> {
        let path = self.resolve()?;
        Ok(Model::load(&path)?)
    }
}

/// Starts the scheduler over `model`.
pub fn start_engine(
    model: &Model,
    args: &ModelArgs,
    kv_tokens: usize,
    sched: SchedulerConfig,
) -> anyhow::Result<EngineHandle> {
    start_engine_with_events(model, args, kv_tokens, sched, None)
}

/// [`start_engine`], its step loops handing their prefix-cache changes to `kv_events`.
pub fn start_engine_with_events(
    model: &Model,
    args: &ModelArgs,
    kv_tokens: usize,
    sched: SchedulerConfig,
    kv_events: Option<crate::kv_events::KvEventSink>,
) -> anyhow::Result<EngineHandle> {
    let devices = runtime::parse_devices(&args.device)?;
    let rc = RuntimeConfig {
        threads: args.threads,
        ctx_size: args.ctx_size,
        kv_tokens,
        block_size: runtime::KV_BLOCK_SIZE,
    };
    let mut backends = tracing::info_span!(target: OPS_TARGET, span::STARTUP_KV_CACHE)
        .in_scope(|| runtime::build_backends_for(model, &devices, &rc, Some(&sched)))?;
    for (group, b) in backends.iter().enumerate() {
        let layout = kv_layout_line(b.as_ref());
        tracing::info!(group, kv = %layout, "Startup.KvPools");
    }
    tracing::info_span!(target: OPS_TARGET, span::STARTUP_WARMUP).in_scope(|| {
        for (group, b) in backends.iter_mut().enumerate() {
            if let Err(e) = warm_up(b.as_mut()) {
                // Not fatal: the first request pays for first use instead.
                tracing::warn!(group, error = %e, "Startup.WarmupFailed");
            }
        }
    });
    Ok(EngineHandle::start_with_events(
        backends,
        Arc::clone(&model.tokenizer),
        sched,
        kv_events,
    ))
}

/// One forward step of one token at position 0 of block 0, before the step loop owns the
/// backend: its thread pool starts and its device modules load now, not on the first request.
/// What it writes to block 0 is never read (a sequence writes a position before reading it).
fn warm_up(backend: &mut dyn crate::backend::Backend) -> Result<(), crate::backend::BackendError> {
    let chunk = crate::backend::SeqChunk {
        tokens: &[0],
        start_pos: 0,
        blocks: &[0],
        all_logits: false,
        no_logits: false,
    };
    let mut logits = Vec::new();
    // A backend with a window pool takes block 0 of it too.
    let windows: &[&[u32]] = if backend.windowed_kv().is_some() {
        &[&[0]]
    } else {
        &[]
    };
    backend
        .forward_windowed(&[chunk], windows, &mut logits)
        .map(|_| ())
}

/// The KV pools of a backend in words: blocks, positions and bytes of each, and what a
/// sequence of the model's context length holds.
pub fn kv_layout_line(backend: &dyn crate::backend::Backend) -> String {
    #[allow(clippy::cast_precision_loss)]
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let (cfg, bs) = (backend.config(), backend.block_size());
    let mut line = format!(
        "full pool {} blocks × {bs} positions ({:.1} MiB)",
        backend.num_blocks(),
        mib(backend.num_blocks() * backend.kv_block_bytes())
    );
    let window = backend.windowed_kv();
    if let Some(w) = window {
        line.push_str(&format!(
            ", window pool {} blocks for the last {} positions ({:.1} MiB)",
            w.blocks,
            w.window,
            mib(w.blocks * w.block_bytes)
        ));
    }
    let ctx = cfg.context;
    let held = crate::backend::kv_bytes_per_sequence(cfg, bs, ctx, window.is_some());
    let whole = crate::backend::kv_bytes_per_sequence(cfg, bs, ctx, false);
    line.push_str(&format!(
        "; a {ctx}-position sequence holds {:.1} MiB of KV ({:.1} MiB with every layer whole)",
        mib(held),
        mib(whole)
    ));
    line
}

/// Parses the command line and runs it.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Commands::FetchModel(a) => fetch_model(&a),
        Commands::Generate(a) => generate::run(a),
        Commands::Bench(a) => bench::run(a),
        Commands::Serve(a) => serve::run(*a),
        Commands::ExportTokenizer(a) => export_tokenizer(&a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("slotlight-engine: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
