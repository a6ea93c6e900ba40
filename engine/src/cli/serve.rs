//! `slotlight-engine serve`: the OpenAI-compatible API.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::ModelArgs;
use crate::prompt::PromptBuilder;
use crate::scheduler::{KeepConfig, SchedulerConfig, SessionWindows};
use crate::server::Limits;
use crate::server::{AppState, ServeConfig};
use crate::telemetry::{LogFormat, OPS_TARGET, QueueLimits, Telemetry, TelemetryConfig};
use crate::timing::TimeAnchor;
use slotlight_otel::span;

/// Arguments of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to bind (loopback by default; use 0.0.0.0 to listen on every interface).
    #[arg(long, default_value = "127.0.0.1", env = "SLOTLIGHT_HOST")]
    pub host: String,
    /// Port to bind.
    #[arg(long, default_value_t = 8080, env = "SLOTLIGHT_PORT")]
    pub port: u16,
    /// Require the key on the API (not on /health): `Authorization: Bearer KEY` (OpenAI's
    /// clients, Claude Code) or `x-api-key: KEY` (the anthropic SDKs).
    #[arg(long, env = "SLOTLIGHT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Names clients may use for the model (several after one flag, or the flag repeated):
    /// the first is the name responses and `/v1/models` report first; every one is listed and
    /// served, as are the model's own id and its known name.
    #[arg(long, num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// Batch slots per device group.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Requests that may wait for a slot; more get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Sessions whose last turn the engine remembers, to say whether each turn reused the
    /// conversation's KV and why not (`usage.resume`); the least recently used is dropped first.
    #[arg(long, default_value_t = 4096)]
    pub max_sessions: usize,
    /// MiB of those sessions' remembered tokens (each session's last turn, prompt and reply):
    /// long contexts cost memory, so the least recently used session is dropped first beyond
    /// this too.
    #[arg(long, default_value_t = 256)]
    pub session_memory_mib: usize,
    /// Seconds after a turn that its session's KV stays ahead of other cached prefixes (long
    /// enough for an agent's ordinary tool calls); a later turn that finds its blocks
    /// reclaimed after that says `expired`. 0 keeps none.
    #[arg(long, default_value_t = 300.0, value_parser = seconds)]
    pub session_kv_ttl: f64,
    /// The longest a request may ask its session's KV to be kept, seconds (Responses
    /// `prompt_cache_options.ttl`, Messages `cache_control.ttl`).
    #[arg(long, default_value_t = 3600.0, value_parser = seconds)]
    pub session_kv_ttl_max: f64,
    /// MiB of generated replies remembered (their token ids, by their text and tool calls),
    /// so that a reply a client sends back is prompted as the tokens the engine generated,
    /// not as a re-tokenization of its text; the least recently used is forgotten first. 0
    /// remembers none.
    #[arg(long, default_value_t = 64)]
    pub reply_memory_mib: usize,
    /// The share of each group's KV blocks that live sessions may keep, from 0 to 1 (the
    /// longest-idle session lets go first).
    #[arg(long, default_value_t = 0.5, value_parser = share)]
    pub session_kv_share: f64,
    /// With sliding-window layers (Gemma 2 and 3, Mistral): windows of their KV the window
    /// pool keeps for live sessions per group, beyond the running requests' (a session's last
    /// turn's end, its prompt's end and its latest checkpoints inside long replies), so that
    /// a next turn resumes whatever the pool's churn. Default: two per batch slot. 0 keeps
    /// them only in the pool's free room.
    #[arg(long)]
    pub session_windows: Option<usize>,
    /// With sliding-window layers: positions between checkpoints of their window inside a
    /// reply (a next turn that departs late in a long reply resumes from the checkpoint
    /// before). 0 takes none inside replies.
    #[arg(long, default_value_t = 2048)]
    pub window_checkpoint_every: usize,
    /// KV cache positions per device group (default: 2 × context or 512 per slot, whichever is larger).
    #[arg(long)]
    pub kv_cache_tokens: Option<usize>,
    /// Prefill tokens per step while nothing else decodes.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Prefill tokens per step while other requests decode.
    #[arg(long, default_value_t = 64)]
    pub mixed_prefill_chunk: usize,
    /// Largest request body, bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Largest `max_tokens` a request may ask for; also how far a Responses request without
    /// `max_output_tokens` may run (to the end of the context, at most this).
    #[arg(long, default_value_t = 4096)]
    pub max_tokens_limit: usize,
    /// `max_tokens` when a chat completions or completions request gives none (Messages
    /// requires it; Responses without `max_output_tokens` runs to `--max-tokens-limit`).
    #[arg(long, default_value_t = 256)]
    pub default_max_tokens: usize,
    /// Most messages one request sends (a stored Responses chain's history is not counted;
    /// the body size and the context bound the rest): enough for a 1,000-round tool session.
    #[arg(long, default_value_t = 4096)]
    pub max_messages: usize,
    /// Longest content of one message, bytes (stop strings: at most 16, each at most 512 bytes).
    #[arg(long, default_value_t = 256 * 1024)]
    pub max_message_bytes: usize,
    /// Seconds in-flight requests may run after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 30)]
    pub drain_timeout_s: u64,
    /// Seconds a client may take to send a request's headers (the connection is then closed)
    /// and again its body (then 408); keep-alive connections idle this long are closed.
    #[arg(long, default_value_t = 30)]
    pub read_timeout_s: u64,
    /// Largest request head (request line and headers), bytes; larger ones get 431.
    #[arg(long, default_value_t = 64 * 1024)]
    pub max_header_bytes: usize,
    /// OTLP endpoint (default: `OTEL_EXPORTER_OTLP_ENDPOINT`, else http://127.0.0.1:4317).
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    /// OTLP protocol: grpc or http/protobuf (default: `OTEL_EXPORTER_OTLP_PROTOCOL`, else grpc).
    #[arg(long)]
    pub otlp_protocol: Option<String>,
    /// Spans the export queue holds at most (queued or being sent) while the collector is slow
    /// or down; beyond it new spans are dropped and counted (default:
    /// `OTEL_BSP_MAX_QUEUE_SIZE`, else 65,536).
    #[arg(long)]
    pub otlp_queue_spans: Option<usize>,
    /// Estimated encoded bytes the span export queue holds at most (default 64 MiB).
    #[arg(long)]
    pub otlp_queue_bytes: Option<usize>,
    /// Export no spans.
    #[arg(long)]
    pub no_telemetry: bool,
    /// Serve `GET /metrics` without the API key (it is behind `--api-key` otherwise).
    #[arg(long)]
    pub metrics_public: bool,
    /// Also serve other engines' metric names on `GET /metrics`: `vllm` adds the model-server
    /// protocol's signals under vLLM's names (`vllm:num_requests_waiting`, …), which the
    /// Kubernetes inference gateway's endpoint picker reads by default.
    #[arg(long, value_enum, default_value_t = MetricsCompat::None)]
    pub metrics_compat: MetricsCompat,
    /// Length of decode progress windows (`slotlight.decode` spans), ms; 0 turns them off.
    #[arg(long, default_value_t = 250)]
    pub progress_interval_ms: u64,
    /// Offer tools to models whose chat template has no tool support, in a generic JSON format
    /// the output is held to (`on`), or leave the tools out of such models' prompts and let
    /// them answer in text (`off`: the request span lists the tools as skipped).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub generic_tools: Switch,
    /// Record the conversation on the request span in the GenAI conventions (`gen_ai.input.messages`, `gen_ai.output.messages`, ...); off by default: no content leaves the engine.
    #[arg(long)]
    pub trace_content: bool,
    /// How log lines are written: text for people, JSON for log collectors.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Speculative decoding.
    #[command(flatten)]
    pub speculation: super::SpeculationArgs,
    /// KV-cache events.
    #[command(flatten)]
    pub kv_events: KvEventsArgs,
    /// The Responses API's store.
    #[command(flatten)]
    pub responses: ResponsesArgs,
    /// Model and device.
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Where the Responses API keeps stored responses, and how much (docs/api.md, "Stored
/// responses").
#[derive(Debug, Args)]
pub struct ResponsesArgs {
    /// The store: an SQLite file (default `responses.db` under `$XDG_STATE_HOME/slotlight`,
    /// else `~/.local/state/slotlight`), `:memory:` to keep nothing past the process, or a
    /// Redis URL (`redis://HOST:PORT/DB`) shared by several replicas.
    #[arg(long, env = "SLOTLIGHT_RESPONSES_DB")]
    pub responses_db: Option<String>,
    /// Most stored responses; the oldest go first.
    #[arg(long, default_value_t = 10_000)]
    pub responses_max: usize,
    /// Most bytes of stored responses, each counted by its own stored part (its items, the
    /// JSON returned and its token ids beyond its parent's: a chain is kept as links to its
    /// parents); the oldest go first.
    #[arg(long, default_value_t = 1 << 30)]
    pub responses_max_bytes: u64,
    /// How long a stored response is kept, in hours (OpenAI keeps them 30 days).
    #[arg(long, default_value_t = 720)]
    pub responses_ttl_hours: u64,
    /// With a Redis store: most milliseconds to open a connection, each attempt. A Redis that
    /// is down costs a request at most a few of these; the engine reconnects by itself when
    /// it is back.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub responses_redis_connect_timeout_ms: u64,
    /// With a Redis store: most milliseconds for the answer to a command.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub responses_redis_timeout_ms: u64,
}

/// Arguments of the KV-cache event stream (vLLM's wire format; docs/api.md).
#[derive(Debug, Args)]
pub struct KvEventsArgs {
    /// Publish the prefix cache's changes (KV-cache events) on a ZMQ PUB socket at this
    /// endpoint: `tcp://*:PORT` binds, `tcp://HOST:PORT` connects to a subscriber that binds
    /// (llm-d's endpoint picker). Off when absent.
    #[arg(long)]
    pub kv_events_endpoint: Option<String>,
    /// A ZMQ ROUTER socket (always bound) that resends the latest batches from a sequence
    /// number (the 8-byte big-endian number in; `[sequence, batch]` frames out, then sequence
    /// -1 with an empty batch).
    #[arg(long, requires = "kv_events_endpoint")]
    pub kv_events_replay_endpoint: Option<String>,
    /// The topic (first frame) of every event message (default `kv@<instance>:<port>@<model>`,
    /// as llm-d's precise prefix-cache scorer expects, which names a pod by the address and
    /// port it routes to: the instance is `$POD_IP`, else `$HOSTNAME`, else the engine's
    /// instance id; the port is `--port`; the model is the first `--served-model-name`, else
    /// the model's id).
    #[arg(long, requires = "kv_events_endpoint")]
    pub kv_events_topic: Option<String>,
    /// The engine's data-parallel rank: each KV event batch carries it, and so does every request
    /// span (`slotlight.engine.data_parallel_rank`).
    #[arg(long, default_value_t = 0)]
    pub data_parallel_rank: u32,
}

pub(super) fn run(a: ServeArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("slotlight-http")
        .build()?;
    // Telemetry first, so that the start-up is traced through the same provider (the gRPC
    // exporter is built inside the runtime).
    let telemetry = {
        let _rt = rt.enter();
        crate::telemetry::from_config(&TelemetryConfig {
            disabled: a.no_telemetry,
            endpoint: a.otlp_endpoint.clone(),
            protocol: a.otlp_protocol.clone(),
            queue: Some(queue_limits(&a)),
        })
    };
    let ops = telemetry.as_ref().ok().and_then(Telemetry::ops_tracer);
    let records = telemetry.as_ref().ok().and_then(Telemetry::logger_provider);
    crate::telemetry::init_logs(a.log_format, ops, records);
    let telemetry = telemetry?.with_data_parallel_rank(a.kv_events.data_parallel_rank);
    rt.block_on(serve(a, telemetry))
}

/// Starts the KV-event publisher when `--kv-events-endpoint` is given.
/// A number of seconds: finite, not negative, at most a year.
fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if v.is_finite() && (0.0..=31_536_000.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s} is not between 0 and 31536000 seconds"))
    }
}

/// A share, from 0 to 1.
fn share(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s} is not between 0 and 1"))
    }
}

fn start_kv_events(
    a: &ServeArgs,
    model_id: &str,
    instance_id: &str,
) -> anyhow::Result<Option<crate::kv_events::KvEventSink>> {
    let Some(endpoint) = a.kv_events.kv_events_endpoint.clone() else {
        return Ok(None);
    };
    let topic = a.kv_events.kv_events_topic.clone().unwrap_or_else(|| {
        let instance = ["POD_IP", "HOSTNAME"]
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| instance_id.to_owned());
        let model = a.served_model_name.first().map_or(model_id, String::as_str);
        crate::kv_events::default_topic(&format!("{instance}:{}", a.port), model)
    });
    let cfg = crate::kv_events::KvEventsConfig {
        endpoint,
        replay_endpoint: a.kv_events.kv_events_replay_endpoint.clone(),
        topic,
        data_parallel_rank: a.kv_events.data_parallel_rank,
        block_size: crate::runtime::KV_BLOCK_SIZE,
    };
    tracing::info!(endpoint = %cfg.endpoint, topic = %cfg.topic, replay = ?cfg.replay_endpoint, "Startup.KvEvents");
    Ok(Some(crate::kv_events::publisher::start(cfg)?))
}

/// A feature switched on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

/// Metric names served beside slotlight's own (`--metrics-compat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsCompat {
    /// slotlight's names only.
    None,
    /// Also vLLM's names for the model-server protocol's signals.
    Vllm,
}

/// The span export queue's bounds: the flags, else the `OTEL_BSP_*` variables, else the
/// defaults.
fn queue_limits(a: &ServeArgs) -> QueueLimits {
    let env = QueueLimits::from_env();
    QueueLimits {
        max_spans: a.otlp_queue_spans.unwrap_or(env.max_spans).max(1),
        max_bytes: a.otlp_queue_bytes.unwrap_or(env.max_bytes).max(1),
        ..env
    }
}

async fn serve(a: ServeArgs, telemetry: Telemetry) -> anyhow::Result<()> {
    anyhow::ensure!(a.batch >= 1, "--batch must be at least 1");
    let startup = tracing::info_span!(target: OPS_TARGET, span::STARTUP);
    let (model, engine, prompts) = startup.in_scope(|| -> anyhow::Result<_> {
        let model = a.model.load()?;
        let context = a.model.ctx_size.min(model.config.context);
        let kv = a
            .kv_cache_tokens
            .unwrap_or_else(|| (2 * context).max(512 * a.batch));
        let sched = SchedulerConfig {
            batch: a.batch,
            max_queue: a.max_queue,
            prefill_chunk: a.prefill_chunk.max(1),
            mixed_prefill_chunk: a.mixed_prefill_chunk.max(1),
            return_to_solo: true,
            max_sessions: a.max_sessions,
            session_memory_bytes: a.session_memory_mib.saturating_mul(1 << 20),
            speculation: a.speculation.config(),
            session_kv: KeepConfig {
                ttl: Duration::from_secs_f64(a.session_kv_ttl),
                max_ttl: Duration::from_secs_f64(a.session_kv_ttl_max),
                share: a.session_kv_share,
            },
            session_windows: SessionWindows {
                room: a
                    .session_windows
                    .unwrap_or(SessionWindows::for_batch(a.batch).room),
                checkpoint_every: a.window_checkpoint_every,
                ..SessionWindows::for_batch(a.batch)
            },
        };
        let kv_events = start_kv_events(&a, &model.id, &telemetry.instance_id)?;
        let engine = Arc::new(super::start_engine_with_events(
            &model, &a.model, kv, sched, kv_events,
        )?);
        let prompts = PromptBuilder::new(&model)
            .with_reply_memory(a.reply_memory_mib.saturating_mul(1 << 20));
        Ok((model, engine, prompts))
    })?;
    let context = a.model.ctx_size.min(model.config.context);
    let groups = crate::runtime::parse_devices(&a.model.device)?.len();
    let kv = a
        .kv_cache_tokens
        .unwrap_or_else(|| (2 * context).max(512 * a.batch));
    if prompts.fallback {
        tracing::warn!(
            arch = model.config.arch.name(),
            "the model has no chat template: chat requests use its family's built-in turn format (Gemma's for Gemma, else ChatML)"
        );
    }
    // The served names first (the first is reported), then the model's own id and, for
    // `--model gemma3-270m`, the name it was asked for; each once.
    let mut names: Vec<String> = Vec::new();
    let own = std::iter::once(model.id.clone()).chain(a.model.known_name().map(str::to_owned));
    for n in a.served_model_name.iter().cloned().chain(own) {
        if !n.is_empty() && !names.contains(&n) {
            names.push(n);
        }
    }
    let cfg = ServeConfig {
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        max_body_bytes: a.max_body_bytes,
        limits: Limits {
            max_tokens: a.max_tokens_limit.min(context),
            default_max_tokens: a.default_max_tokens,
            max_messages: a.max_messages,
            max_message_bytes: a.max_message_bytes,
            ..Limits::default()
        },
        progress_interval: Duration::from_millis(a.progress_interval_ms),
        trace_content: a.trace_content,
        model_names: names,
        model_info: model.info(),
        drain_timeout: Duration::from_secs(a.drain_timeout_s),
        read_timeout: Duration::from_secs(a.read_timeout_s.max(1)),
        max_header_bytes: a.max_header_bytes,
        metrics_public: a.metrics_public,
        generic_tools: a.generic_tools == Switch::On,
        vllm_metrics: (a.metrics_compat == MetricsCompat::Vllm).then(|| {
            crate::metrics::VllmCompat {
                model_name: model.id.clone(),
                block_size: crate::runtime::KV_BLOCK_SIZE,
            }
        }),
    };
    let responses = {
        use crate::server::responses::store::{
            RedisTimeouts, ResponseStore, StoreLimits, StoreLocation,
        };
        let r = &a.responses;
        let location = r
            .responses_db
            .as_deref()
            .map_or_else(StoreLocation::default_file, StoreLocation::parse);
        let limits = StoreLimits {
            max_responses: r.responses_max.max(1),
            max_bytes: r.responses_max_bytes,
            max_age: Duration::from_secs(r.responses_ttl_hours.saturating_mul(3600).max(1)),
        };
        // A store that cannot be opened (corrupt, unreadable, locked past the busy timeout)
        // does not stop the engine: everything else is served, and a Responses request that
        // needs the store is answered 503 with the reason.
        let timeouts = RedisTimeouts {
            connect: Duration::from_millis(r.responses_redis_connect_timeout_ms),
            response: Duration::from_millis(r.responses_redis_timeout_ms),
        };
        let store = match ResponseStore::open_with(&location, limits, timeouts).await {
            Ok(store) => {
                tracing::info!(store = store.describe(), "Responses.StoreOpened");
                store
            }
            Err(e) => {
                tracing::warn!(error = %e, location = ?location, "Responses.StoreUnavailable");
                ResponseStore::unavailable(e.to_string())
            }
        };
        Arc::new(store)
    };
    let st = Arc::new(AppState {
        engine,
        grammars: Arc::new(crate::constraint::Grammars::new(
            Arc::clone(&model.tokenizer),
            model.config.vocab,
        )),
        prompts,
        cfg,
        vocab: model.config.vocab,
        context,
        telemetry: Arc::new(telemetry),
        metrics: Arc::default(),
        anchor: TimeAnchor::now(),
        started: crate::server::ids::created(),
        diagnostics: Default::default(),
        responses,
    });
    if let Some(meter) = st.telemetry.meter() {
        crate::metrics::otlp::register(
            &meter,
            &st.engine.group_metrics(),
            &st.metrics,
            st.telemetry.snapshot_source(),
        );
    }
    let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port)).await?;
    let addr = listener.local_addr()?;
    drop(startup);
    let counts = st.telemetry.counts();
    tracing::info!(
        listen = %addr,
        loopback_only = addr.ip().is_loopback(),
        model = %model.id,
        context,
        batch = a.batch,
        groups,
        kv_tokens = kv,
        telemetry = counts.endpoint.as_deref().unwrap_or("off"),
        instance_id = %st.telemetry.instance_id,
        auth = st.cfg.api_key.is_some(),
        "slotlight-engine listening on http://{addr} ({})",
        if addr.ip().is_loopback() { "loopback only" } else { "all interfaces" }
    );
    crate::server::serve(listener, st, crate::server::shutdown_signal()).await?;
    tracing::info!("slotlight-engine stopped");
    Ok(())
}
