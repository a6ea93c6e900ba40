//! `GET /metrics`: the Prometheus text format (0.0.4), or OpenMetrics 1.0 when the scraper
//! asks for it, encoded by `prometheus-client` from one snapshot of every source taken at
//! scrape time. `# HELP` is the contract's doc of each name.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use slotlight_otel::attr::value;
use slotlight_otel::metric::{self, engine, label};

use super::group::{GROUP_COUNTERS, GROUP_GAUGES, GroupSnapshot, OUTCOMES};
use super::histogram::HistogramSnapshot;
use super::requests::{RequestSnapshot, SeriesKey};

/// The exporter's own state, for the telemetry-health metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct TelemetrySnapshot {
    /// Spans handed to the OTLP collector successfully (`slotlight_engine_spans_exported_total`).
    pub spans_exported: u64,
    /// Spans lost (beyond the queue's bounds, refused for good, left at shutdown).
    pub spans_dropped: u64,
    /// Failed export attempts.
    pub export_failures: u64,
    /// Spans in the export queue now.
    pub spans_queued: u64,
    /// The share of traces the sampler keeps.
    pub sampling_ratio: f64,
}

/// Everything one scrape reports, read once.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Each slot group's counters and gauges.
    pub groups: Vec<GroupSnapshot>,
    /// The HTTP layer's latencies and refusals.
    pub requests: RequestSnapshot,
    /// The exporter's counts.
    pub telemetry: TelemetrySnapshot,
    /// With `--metrics-compat vllm`: the model-server protocol's signals under vLLM's names.
    pub vllm: Option<VllmCompat>,
    /// The Responses store (absent where the state holds none).
    pub responses_store: Option<StoreSnapshot>,
}

/// The Responses store as `/metrics` reports it.
#[derive(Debug, Clone, Default)]
pub struct StoreSnapshot {
    /// Its backend (`sqlite`, `memory`, `redis`, `unavailable`).
    pub backend: &'static str,
    /// Why it could not be opened, when it could not.
    pub unavailable: Option<String>,
    /// Finished responses it failed to save.
    pub not_stored: u64,
}

/// What the vLLM-compatible families need besides the groups' snapshots.
#[derive(Debug, Clone, Default)]
pub struct VllmCompat {
    /// The served model's name (`model_name`).
    pub model_name: String,
    /// Positions per KV block.
    pub block_size: usize,
}

/// The `Content-Type` and format for an `Accept` header, as the sidecar answers it.
pub use slotlight_otel::exposition::negotiate;

/// Renders `scrape` in OpenMetrics (with `# EOF`) or the Prometheus text format.
pub fn render(scrape: Scrape, openmetrics: bool) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut out = String::with_capacity(16 << 10);
    let written = if openmetrics {
        prometheus_client::encoding::text::encode(&mut out, &registry)
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
    };
    // Writing to a String cannot fail; an encoder error would be a bug in a label set.
    if let Err(e) = written {
        tracing::error!(error = %e, "Metrics.EncodeFailed");
    }
    out
}

fn help(name: &str) -> &'static str {
    engine::ALL
        .iter()
        .chain(metric::ALL)
        .chain(metric::vllm::ALL)
        .find(|e| e.name == name)
        .map_or("", |e| e.doc.trim())
}

/// The family's descriptor; a counter is described without its `_total`, which the encoder
/// adds to each sample.
fn family<'s>(
    enc: &'s mut DescriptorEncoder<'_>,
    name: &'static str,
    t: MetricType,
) -> Result<MetricEncoder<'s>, std::fmt::Error> {
    let base = match t {
        MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    };
    enc.encode_descriptor(base, help(name), None, t)
}

type Labels = Vec<(&'static str, String)>;

fn counter(m: &mut MetricEncoder<'_>, labels: &Labels, v: u64) -> std::fmt::Result {
    m.encode_family(labels)?
        .encode_counter::<NoLabelSet, u64, u64>(&v, None)
}

fn gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    m: &mut MetricEncoder<'_>,
    labels: &Labels,
    v: V,
) -> std::fmt::Result {
    m.encode_family(labels)?.encode_gauge(&v)
}

fn histogram(
    m: &mut MetricEncoder<'_>,
    labels: &Labels,
    h: &HistogramSnapshot,
) -> std::fmt::Result {
    m.encode_family(labels)?
        .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)
}

fn group_labels(g: &GroupSnapshot) -> Labels {
    vec![(label::SLOT_GROUP, g.group.to_string())]
}

/// The GenAI labels of a series (the request model only when known).
fn genai_labels(k: &SeriesKey) -> Labels {
    let mut l = vec![
        (label::API, k.api.to_string()),
        (label::GEN_AI_OPERATION_NAME, k.operation.to_string()),
        (label::GEN_AI_PROVIDER_NAME, value::PROVIDER.to_string()),
    ];
    if !k.request_model.is_empty() {
        l.push((label::GEN_AI_REQUEST_MODEL, k.request_model.clone()));
    }
    l.push((label::GEN_AI_RESPONSE_MODEL, k.response_model.clone()));
    l
}

impl Scrape {
    fn encode_groups(&self, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        for (name, get) in GROUP_GAUGES {
            let mut m = family(enc, name, MetricType::Gauge)?;
            for g in &self.groups {
                gauge(&mut m, &group_labels(g), get(g))?;
            }
        }
        {
            let mut m = family(enc, engine::REQUESTS_RUNNING, MetricType::Gauge)?;
            for g in &self.groups {
                for (path, n) in [
                    (value::PATH_SOLO, g.running_solo),
                    (value::PATH_SLOT, g.running_slot),
                ] {
                    let mut l = group_labels(g);
                    l.push((label::PATH, path.to_string()));
                    gauge(&mut m, &l, n)?;
                }
            }
        }
        {
            let mut m = family(enc, engine::KV_CACHE_USAGE, MetricType::Gauge)?;
            for g in &self.groups {
                gauge(&mut m, &group_labels(g), g.kv_usage())?;
            }
        }
        for (name, get) in GROUP_COUNTERS {
            let mut m = family(enc, name, MetricType::Counter)?;
            for g in &self.groups {
                counter(&mut m, &group_labels(g), get(g))?;
            }
        }
        {
            let mut m = family(
                enc,
                engine::SPEC_DECODE_ACCEPTED_TOKENS_PER_POS,
                MetricType::Counter,
            )?;
            for g in &self.groups {
                for (pos, n) in g.spec_accepted_per_pos[..g.draft_positions]
                    .iter()
                    .enumerate()
                {
                    let mut l = group_labels(g);
                    l.push((label::POSITION, pos.to_string()));
                    counter(&mut m, &l, *n)?;
                }
            }
        }
        {
            let mut m = family(enc, engine::SESSION_KV_EVICTED_BLOCKS, MetricType::Counter)?;
            for g in &self.groups {
                for (reason, n) in g.session_kv.by_reason() {
                    let mut l = group_labels(g);
                    l.push((label::REASON, reason.to_string()));
                    counter(&mut m, &l, n)?;
                }
            }
        }
        {
            let mut m = family(enc, engine::REQUESTS_FINISHED, MetricType::Counter)?;
            for g in &self.groups {
                for ((finish, error), n) in OUTCOMES.iter().zip(g.finished) {
                    let mut l = group_labels(g);
                    l.push((label::FINISH_REASON, finish.to_string()));
                    if let Some(e) = error {
                        l.push((label::ERROR_TYPE, e.to_string()));
                    }
                    counter(&mut m, &l, n)?;
                }
            }
        }
        type H = fn(&GroupSnapshot) -> &HistogramSnapshot;
        let hists: [(&'static str, H); 2] = [
            (engine::STEP_DURATION, |g| &g.step_duration),
            (engine::STEP_BATCH_SIZE, |g| &g.step_batch),
        ];
        for (name, get) in hists {
            let mut m = family(enc, name, MetricType::Histogram)?;
            for g in &self.groups {
                histogram(&mut m, &group_labels(g), get(g))?;
            }
        }
        Ok(())
    }

    fn encode_requests(&self, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let r = &self.requests;
        type H = fn(&super::requests::SeriesSnapshot) -> &HistogramSnapshot;
        let ok_only: [(&'static str, H); 2] = [
            (metric::TIME_TO_FIRST_TOKEN, |s| &s.ttft),
            (metric::TIME_PER_OUTPUT_TOKEN, |s| &s.tpot),
        ];
        for (name, get) in ok_only {
            let mut m = family(enc, name, MetricType::Histogram)?;
            for s in &r.series {
                histogram(&mut m, &genai_labels(&s.key), get(s))?;
            }
        }
        {
            let mut m = family(enc, metric::REQUEST_DURATION, MetricType::Histogram)?;
            for s in &r.series {
                for (error, h) in &s.duration {
                    let mut l = genai_labels(&s.key);
                    if let Some(e) = error {
                        l.push((label::ERROR_TYPE, e.to_string()));
                    }
                    histogram(&mut m, &l, h)?;
                }
            }
        }
        {
            let mut m = family(enc, engine::QUEUE_TIME, MetricType::Histogram)?;
            for s in &r.series {
                histogram(&mut m, &genai_labels(&s.key), &s.queue)?;
            }
        }
        {
            let mut m = family(enc, engine::REQUESTS_REFUSED, MetricType::Counter)?;
            for (e, n) in &r.refused {
                counter(&mut m, &vec![(label::ERROR_TYPE, e.to_string())], *n)?;
            }
        }
        Ok(())
    }

    fn encode_telemetry(&self, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let t = &self.telemetry;
        for (name, v) in [
            (engine::SPANS_EXPORTED, t.spans_exported),
            (engine::SPANS_DROPPED, t.spans_dropped),
            (engine::SPAN_EXPORT_FAILURES, t.export_failures),
        ] {
            family(enc, name, MetricType::Counter)?
                .encode_counter::<NoLabelSet, u64, u64>(&v, None)?;
        }
        family(enc, engine::SPAN_QUEUE_SPANS, MetricType::Gauge)?.encode_gauge(&t.spans_queued)?;
        family(enc, engine::TRACE_SAMPLING_RATIO, MetricType::Gauge)?
            .encode_gauge(&t.sampling_ratio)?;
        Ok(())
    }
}

/// The Responses store's availability (with the reason it is not) and its unsaved responses.
fn encode_store(enc: &mut DescriptorEncoder<'_>, s: &StoreSnapshot) -> std::fmt::Result {
    let mut l = vec![(label::BACKEND, s.backend.to_string())];
    if let Some(reason) = &s.unavailable {
        l.push((label::REASON, reason.clone()));
    }
    gauge(
        &mut family(enc, engine::RESPONSES_STORE_AVAILABLE, MetricType::Gauge)?,
        &l,
        i64::from(s.unavailable.is_none()),
    )?;
    counter(
        &mut family(enc, engine::RESPONSES_NOT_STORED, MetricType::Counter)?,
        &vec![(label::BACKEND, s.backend.to_string())],
        s.not_stored,
    )
}

impl Scrape {
    /// The vLLM-named families ([`metric::vllm`]), from the same group snapshots as the
    /// engine's own, so each equals the series it mirrors.
    fn encode_vllm(&self, enc: &mut DescriptorEncoder<'_>, c: &VllmCompat) -> std::fmt::Result {
        use metric::vllm;
        let model = vec![(label::MODEL_NAME, c.model_name.clone())];
        let sum = |f: fn(&GroupSnapshot) -> u64| self.groups.iter().map(f).sum::<u64>();
        let waiting = sum(|g| g.waiting);
        let running = sum(|g| g.running_solo + g.running_slot);
        let (used, all) = (sum(|g| g.kv_bytes_used), sum(|g| g.kv_bytes));
        #[allow(clippy::cast_precision_loss)] // byte counts far below 2^53
        let usage = if all == 0 {
            0.0
        } else {
            used as f64 / all as f64
        };
        gauge(
            &mut family(enc, vllm::NUM_REQUESTS_WAITING, MetricType::Gauge)?,
            &model,
            waiting,
        )?;
        gauge(
            &mut family(enc, vllm::NUM_REQUESTS_RUNNING, MetricType::Gauge)?,
            &model,
            running,
        )?;
        gauge(
            &mut family(enc, vllm::KV_CACHE_USAGE_PERC, MetricType::Gauge)?,
            &model,
            usage,
        )?;
        let mut cache = model.clone();
        cache.push((label::BLOCK_SIZE, c.block_size.to_string()));
        cache.push((label::NUM_GPU_BLOCKS, sum(|g| g.kv_blocks).to_string()));
        gauge(
            &mut family(enc, vllm::CACHE_CONFIG_INFO, MetricType::Gauge)?,
            &cache,
            1u64,
        )?;
        for (name, v) in [
            (vllm::SPEC_DECODE_NUM_DRAFTS, sum(|g| g.spec_drafts)),
            (
                vllm::SPEC_DECODE_NUM_DRAFT_TOKENS,
                sum(|g| g.spec_draft_tokens),
            ),
            (
                vllm::SPEC_DECODE_NUM_ACCEPTED_TOKENS,
                sum(|g| g.spec_accepted_tokens),
            ),
        ] {
            counter(&mut family(enc, name, MetricType::Counter)?, &model, v)?;
        }
        {
            let positions = self
                .groups
                .iter()
                .map(|g| g.draft_positions)
                .max()
                .unwrap_or(0);
            let mut m = family(
                enc,
                vllm::SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS,
                MetricType::Counter,
            )?;
            for pos in 0..positions {
                let mut l = model.clone();
                l.push((label::POSITION, pos.to_string()));
                let n: u64 = self
                    .groups
                    .iter()
                    .map(|g| g.spec_accepted_per_pos[pos])
                    .sum();
                counter(&mut m, &l, n)?;
            }
        }
        let mut lora = model;
        lora.push((label::MAX_LORA, "0".to_string()));
        lora.push((label::RUNNING_LORA_ADAPTERS, String::new()));
        lora.push((label::WAITING_LORA_ADAPTERS, String::new()));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        gauge(
            &mut family(enc, vllm::LORA_REQUESTS_INFO, MetricType::Gauge)?,
            &lora,
            now,
        )
    }
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        self.encode_groups(&mut enc)?;
        self.encode_requests(&mut enc)?;
        self.encode_telemetry(&mut enc)?;
        if let Some(store) = &self.responses_store {
            encode_store(&mut enc, store)?;
        }
        if let Some(c) = &self.vllm {
            self.encode_vllm(&mut enc, c)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::group::GroupMetrics;
    use crate::metrics::requests::{Observation, RequestMetrics};
    use std::time::Duration;

    fn scrape() -> Scrape {
        let g = GroupMetrics::new(0, 4).with_draft_positions(3);
        g.enter_queue(2);
        g.count_draft(3, 2);
        g.count_draft(2, 0);
        // A full pool of 64 blocks of 256 bytes (3 held) and a window pool of 16 blocks of
        // 1 KiB (4 held, 5 kept for sessions).
        let kv = crate::metrics::group::KvUsage {
            blocks: 64,
            blocks_used: 3,
            window_blocks: 16,
            window_blocks_used: 4,
            window_blocks_kept: 5,
            total_bytes: 64 * 256 + 16 * 1024,
            used_bytes: 3 * 256 + 4 * 1024,
        };
        g.publish(1, 0, &kv, 0);
        g.count_token();
        g.observe_step(Duration::from_millis(3), 1);
        let r = RequestMetrics::default();
        r.observe(&Observation {
            api: "chat.completions",
            operation: "chat",
            request_model: Some("m"),
            response_model: "m",
            error_type: None,
            ttft: Some(0.03),
            tpot: Some(0.01),
            duration: 0.5,
            queue: Some(0.001),
        });
        r.count_refused("overloaded");
        Scrape {
            groups: vec![g.snapshot()],
            requests: r.snapshot(),
            telemetry: TelemetrySnapshot {
                sampling_ratio: 1.0,
                ..Default::default()
            },
            vllm: None,
            responses_store: None,
        }
    }

    #[test]
    fn the_responses_store_says_why_it_is_unavailable_and_what_it_did_not_save() {
        let mut s = scrape();
        s.responses_store = Some(StoreSnapshot {
            backend: "unavailable",
            unavailable: Some("file is not a database".into()),
            not_stored: 0,
        });
        let text = render(s, false);
        assert!(text.contains(
            "slotlight_engine_responses_store_available{backend=\"unavailable\",reason=\"file is not a database\"} 0\n"
        ));
        let mut s = scrape();
        s.responses_store = Some(StoreSnapshot {
            backend: "redis",
            unavailable: None,
            not_stored: 3,
        });
        let text = render(s, false);
        assert!(text.contains("slotlight_engine_responses_store_available{backend=\"redis\"} 1\n"));
        assert!(
            text.contains("slotlight_engine_responses_not_stored_total{backend=\"redis\"} 3\n")
        );
    }

    #[test]
    fn vllm_names_mirror_the_engine_series_of_the_same_scrape() {
        let plain = render(scrape(), false);
        assert!(
            !plain
                .lines()
                .any(|l| l.starts_with("vllm:") || l.starts_with("# TYPE vllm:")),
            "only with --metrics-compat vllm"
        );
        let mut s = scrape();
        s.vllm = Some(VllmCompat {
            model_name: "smol".into(),
            block_size: 16,
        });
        let text = render(s, false);
        for line in [
            "vllm:num_requests_waiting{model_name=\"smol\"} 2\n",
            "vllm:num_requests_running{model_name=\"smol\"} 1\n",
            // (3·256 + 4·1024) / (64·256 + 16·1024), as slotlight_engine_kv_cache_usage_ratio.
            "vllm:kv_cache_usage_perc{model_name=\"smol\"} 0.1484375\n",
            "slotlight_engine_kv_cache_usage_ratio{slot_group=\"0\"} 0.1484375\n",
            "vllm:cache_config_info{model_name=\"smol\",block_size=\"16\",num_gpu_blocks=\"64\"} 1\n",
            // Two drafts of 5 tokens, 2 taken, both at their draft's first two positions.
            "vllm:spec_decode_num_drafts_total{model_name=\"smol\"} 2\n",
            "vllm:spec_decode_num_draft_tokens_total{model_name=\"smol\"} 5\n",
            "vllm:spec_decode_num_accepted_tokens_total{model_name=\"smol\"} 2\n",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"smol\",position=\"0\"} 1\n",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"smol\",position=\"1\"} 1\n",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"smol\",position=\"2\"} 0\n",
            "slotlight_engine_spec_decode_drafts_total{slot_group=\"0\"} 2\n",
            "slotlight_engine_spec_decode_accepted_tokens_per_pos_total{slot_group=\"0\",position=\"1\"} 1\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(text.contains(
            "vllm:lora_requests_info{model_name=\"smol\",max_lora=\"0\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} "
        ));
        assert!(text.contains("# TYPE vllm:num_requests_waiting gauge"));
        assert!(
            text.contains("# TYPE vllm:spec_decode_num_drafts_total counter"),
            "{text}"
        );
        assert!(
            !text.contains("position=\"3\""),
            "only the positions a draft may have"
        );
    }

    #[test]
    fn prometheus_text_names_every_family_with_its_samples() {
        let text = render(scrape(), false);
        assert!(!text.contains("# EOF"));
        for line in [
            "slotlight_engine_requests_waiting{slot_group=\"0\"} 2\n",
            "slotlight_engine_requests_running{slot_group=\"0\",path=\"solo\"} 1\n",
            "slotlight_engine_generation_tokens_total{slot_group=\"0\"} 1\n",
            "# TYPE slotlight_engine_generation_tokens_total counter\n",
            "slotlight_engine_requests_refused_total{error_type=\"overloaded\"} 1\n",
            "slotlight_engine_step_batch_size_bucket{slot_group=\"0\",le=\"1\"} 1\n",
            "slotlight_engine_kv_blocks{slot_group=\"0\"} 64\n",
            "slotlight_engine_kv_blocks_used{slot_group=\"0\"} 3\n",
            "slotlight_engine_kv_window_blocks{slot_group=\"0\"} 16\n",
            "slotlight_engine_kv_window_blocks_used{slot_group=\"0\"} 4\n",
            "slotlight_engine_session_kv_window_blocks{slot_group=\"0\"} 5\n",
            "slotlight_engine_kv_bytes{slot_group=\"0\"} 32768\n",
            "slotlight_engine_kv_bytes_used{slot_group=\"0\"} 4864\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from:\n{text}");
        }
        let ttft = metric::TIME_TO_FIRST_TOKEN;
        assert!(
            text.contains(&format!(
                "{ttft}_bucket{{slotlight_api=\"chat.completions\",gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"slotlight\",gen_ai_request_model=\"m\",gen_ai_response_model=\"m\",le=\"0.04\"}} 1\n"
            )),
            "{text}"
        );
        // Usage counts bytes over both pools: 4,864 of 32,768.
        assert!(
            text.contains("slotlight_engine_kv_cache_usage_ratio{slot_group=\"0\"} 0.1484375\n"),
            "{text}"
        );
    }

    #[test]
    fn openmetrics_ends_with_eof_and_names_counter_families_without_total() {
        let text = render(scrape(), true);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("# TYPE slotlight_engine_generation_tokens counter\n"));
    }
}
