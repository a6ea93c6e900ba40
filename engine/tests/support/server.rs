//! An in-process server on 127.0.0.1 for integration tests, and an in-memory span exporter.
#![allow(dead_code, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SimpleSpanProcessor, SpanData, SpanExporter};
use slotlight_engine::model::loader::Model;
use slotlight_engine::prompt::PromptBuilder;
use slotlight_engine::runtime::{self, RuntimeConfig};
use slotlight_engine::scheduler::{EngineHandle, KeepConfig, SchedulerConfig};
use slotlight_engine::server::Limits;
use slotlight_engine::server::{AppState, ServeConfig};
use slotlight_engine::speculation::SpeculationConfig;
use slotlight_engine::telemetry::Telemetry;
use slotlight_engine::timing::TimeAnchor;

/// Spans kept in memory.
#[derive(Debug, Clone, Default)]
pub struct MemoryExporter(pub Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for MemoryExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().expect("lock").extend(batch);
        Ok(())
    }
}

impl MemoryExporter {
    pub fn spans(&self) -> Vec<SpanData> {
        self.0.lock().expect("lock").clone()
    }

    /// The request spans (one per request, in the order they ended) once at least `want` have
    /// ended; panics when they never do.
    pub async fn request_spans(&self, want: usize) -> Vec<SpanData> {
        for _ in 0..500 {
            let roots: Vec<SpanData> = self
                .spans()
                .into_iter()
                .filter(|x| slotlight_otel::span::is_request_span_name(&x.name))
                .collect();
            if roots.len() >= want {
                return roots;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{want} request spans never arrived");
    }
}

#[derive(Clone)]
pub struct Options {
    pub batch: usize,
    pub max_queue: usize,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    pub progress_ms: u64,
    pub ctx_size: usize,
    pub kv_tokens: usize,
    pub devices: String,
    pub telemetry: bool,
    pub limits: Limits,
    pub drain: Duration,
    pub trace_content: bool,
    pub metrics_public: bool,
    /// The engine's data-parallel rank, stated on request spans.
    pub data_parallel_rank: u32,
    /// How decoding drafts (speculative decoding; the engine's default unless set).
    pub speculation: SpeculationConfig,
    /// Serve vLLM's metric names too (`--metrics-compat vllm`).
    pub vllm_metrics: bool,
    /// How live sessions' KV is kept.
    pub session_kv: KeepConfig,
}

impl Options {
    /// The options of the tests on the default model: a 2,048-position context over 8,192
    /// positions of KV.
    pub fn default_model() -> Self {
        Self {
            ctx_size: 2048,
            kv_tokens: 8192,
            ..Self::default()
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            batch: 4,
            max_queue: 64,
            api_key: None,
            max_body_bytes: 1 << 20,
            progress_ms: 250,
            ctx_size: 1024,
            kv_tokens: 4096,
            devices: "cpu".into(),
            telemetry: true,
            limits: Limits::default(),
            drain: Duration::from_secs(10),
            trace_content: false,
            metrics_public: false,
            data_parallel_rank: 0,
            speculation: SpeculationConfig::default(),
            vllm_metrics: false,
            session_kv: KeepConfig::default(),
        }
    }
}

pub struct TestServer {
    pub base: String,
    pub state: Arc<AppState>,
    pub spans: MemoryExporter,
    pub client: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(model: &Model, o: Options) -> Self {
        let devices = runtime::parse_devices(&o.devices).expect("devices");
        let threads = 2usize.max(devices.len());
        let rc = RuntimeConfig {
            threads: Some(threads),
            ctx_size: o.ctx_size,
            kv_tokens: o.kv_tokens,
            block_size: 16,
        };
        let sched = SchedulerConfig {
            batch: o.batch,
            max_queue: o.max_queue,
            prefill_chunk: 256,
            mixed_prefill_chunk: 32,
            return_to_solo: true,
            max_sessions: 64,
            session_memory_bytes: 256 << 20,
            speculation: o.speculation.clone(),
            session_kv: o.session_kv,
            session_windows: slotlight_engine::scheduler::SessionWindows::for_batch(o.batch),
        };
        let backends =
            runtime::build_backends_for(model, &devices, &rc, Some(&sched)).expect("backends");
        let context = o.ctx_size.min(model.config.context);
        let engine = Arc::new(EngineHandle::start(
            backends,
            Arc::clone(&model.tokenizer),
            sched,
        ));
        let spans = MemoryExporter::default();
        let telemetry = if o.telemetry {
            let provider = SdkTracerProvider::builder()
                .with_span_processor(SimpleSpanProcessor::new(spans.clone()))
                .build();
            Telemetry::with_provider(provider, "test-instance".into())
                .with_data_parallel_rank(o.data_parallel_rank)
        } else {
            Telemetry::disabled()
        };
        let st = Arc::new(AppState {
            engine,
            grammars: Arc::new(slotlight_engine::constraint::Grammars::new(
                Arc::clone(&model.tokenizer),
                model.config.vocab,
            )),
            prompts: PromptBuilder::new(model),
            cfg: ServeConfig {
                api_key: o.api_key.clone(),
                max_body_bytes: o.max_body_bytes,
                limits: Limits {
                    max_tokens: o.limits.max_tokens.min(context),
                    ..o.limits.clone()
                },
                progress_interval: Duration::from_millis(o.progress_ms),
                trace_content: o.trace_content,
                model_names: vec![model.id.clone()],
                model_info: model.info(),
                drain_timeout: o.drain,
                read_timeout: Duration::from_secs(30),
                max_header_bytes: 64 * 1024,
                metrics_public: o.metrics_public,
                generic_tools: true,
                vllm_metrics: o
                    .vllm_metrics
                    .then(|| slotlight_engine::metrics::VllmCompat {
                        model_name: model.id.clone(),
                        block_size: 16,
                    }),
            },
            telemetry: Arc::new(telemetry),
            metrics: Arc::default(),
            anchor: TimeAnchor::now(),
            vocab: model.config.vocab,
            context,
            started: 0,
            diagnostics: Default::default(),
            responses: Arc::new(
                slotlight_engine::server::responses::store::ResponseStore::open(
                    &slotlight_engine::server::responses::store::StoreLocation::Memory,
                    Default::default(),
                )
                .await
                .expect("in-memory response store"),
            ),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let s2 = Arc::clone(&st);
        let task = tokio::spawn(async move {
            let _ = slotlight_engine::server::serve(listener, s2, async move {
                let _ = rx.await;
            })
            .await;
        });
        Self {
            base,
            state: st,
            spans,
            client: reqwest::Client::new(),
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("send")
    }

    pub async fn chat(&self, body: serde_json::Value) -> (u16, serde_json::Value) {
        let r = self.post("/v1/chat/completions", body).await;
        let code = r.status().as_u16();
        (code, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn get(&self, path: &str) -> serde_json::Value {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json")
    }

    /// Streams a request and returns every `data:` payload (without `[DONE]`) and whether
    /// `[DONE]` arrived.
    pub async fn stream(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> (Vec<serde_json::Value>, bool) {
        let r = self.post(path, body).await;
        assert_eq!(r.status().as_u16(), 200);
        let text = r.text().await.expect("body");
        let mut out = Vec::new();
        let mut done = false;
        for line in text.lines() {
            if let Some(d) = line.strip_prefix("data: ") {
                if d == "[DONE]" {
                    done = true;
                } else {
                    out.push(serde_json::from_str(d).expect("chunk json"));
                }
            }
        }
        (out, done)
    }

    /// Stops the server (drains) and waits for it.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

/// The tiny synthetic model (random weights, byte vocabulary), written to a temp file.
pub fn tiny_model() -> Model {
    let path = slotlight_engine::model::testing::TinyLlama::default().write_temp();
    Model::load(&path).expect("tiny model")
}
