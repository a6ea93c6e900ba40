//! `slotlight-engine bench`: prefill and decode speed, and aggregate decode under concurrency.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use super::ModelArgs;
use crate::backend::SeqChunk;
use crate::model::gguf::GgufFile;
use crate::model::loader::{Format, Model};
use crate::model::weights::Tensor;
use crate::runtime::{self, RuntimeConfig};
use crate::sampling::SamplingParams;
use crate::scheduler::{Event, GenerateRequest, SchedulerConfig};

/// Arguments of `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Prompt lengths to time prefill at.
    #[arg(long, value_delimiter = ',', default_value = "128,512")]
    pub prompt_tokens: Vec<usize>,
    /// Tokens to decode per repetition.
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Repetitions (median and spread are reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Concurrent requests for aggregate decode through the scheduler (for example 1,2,4,8).
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Context depths to time batch-1 decode at (for example 0,2048): the context is prefilled
    /// first, untimed, then `--gen-tokens` tokens are decoded after it.
    #[arg(long, value_delimiter = ',')]
    pub decode_depth: Vec<usize>,
    /// Also time each `--concurrency` level with one of its requests constrained by a grammar
    /// (JSON objects, one per line): the step time with and without a token mask computed
    /// beside the forward step.
    #[arg(long)]
    pub constrained: bool,
    /// Skip the memory read-bandwidth measurement (with all threads) that decode is compared
    /// with.
    #[arg(long)]
    pub no_bandwidth: bool,
    /// Also time each `--concurrency` level with KV-cache events published on this ZMQ
    /// endpoint (as `serve --kv-events-endpoint`), beside the same level without them, and
    /// print what publishing costs decode.
    #[arg(long)]
    pub kv_events_endpoint: Option<String>,
    /// Time speculative decoding on a prompt set (JSON, as
    /// `tests/bench/speculative/prompts.json`) instead: each prompt, as one chat message, is
    /// generated greedily with drafts (`--speculative`, `--speculative-tokens`) and without,
    /// in turns, `--reps` times; prints each one's completion tokens per second end to end,
    /// the decode rates, the drafts' acceptance and whether the outputs are identical.
    #[arg(long)]
    pub speculative_prompts: Option<std::path::PathBuf>,
    /// Speculative decoding (of the drafting engine of `--speculative-prompts`).
    #[command(flatten)]
    pub speculation: super::SpeculationArgs,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Model and device.
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Median, min and max.
#[derive(Debug, Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(mut v: Vec<f64>) -> Spread {
    v.sort_by(f64::total_cmp);
    Spread {
        median: v.get(v.len() / 2).copied().unwrap_or(0.0),
        min: v.first().copied().unwrap_or(0.0),
        max: v.last().copied().unwrap_or(0.0),
    }
}

/// Resident and peak resident memory of this process, in MiB (Linux).
fn memory_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Prompt tokens for the benchmark: a passage of real text, repeated to length.
fn bench_tokens(model: &Model, n: usize) -> anyhow::Result<Vec<u32>> {
    let text = "The history of computing is a story of people who wanted machines to do arithmetic \
                faster than any clerk could. Early mechanical calculators gave way to relays, then \
                to vacuum tubes and transistors, and every step made programs longer and data larger. ";
    let base = model.tokenizer.encode(text, false)?;
    anyhow::ensure!(!base.is_empty(), "the tokenizer produced no tokens");
    Ok(base.iter().copied().cycle().take(n).collect())
}

#[allow(clippy::cast_precision_loss)]
pub(super) fn run(a: BenchArgs) -> anyhow::Result<()> {
    // Load time as users count it: the file opened and mapped, the backend's weights ready.
    let load_start = Instant::now();
    let model = a.model.load()?;
    if let Some(set) = &a.speculative_prompts {
        return super::spec_bench::run(
            &model,
            &a.model,
            set,
            a.speculation.config(),
            a.reps.max(1),
            a.json,
        );
    }
    let devices = runtime::parse_devices(&a.model.device)?;
    let rc = RuntimeConfig {
        threads: a.model.threads,
        ctx_size: a.model.ctx_size,
        kv_tokens: a.model.ctx_size,
        block_size: 16,
    };
    // Driven here with one block table: every layer whole (the scheduler runs below keep
    // the local layers' window only).
    let mut backend = runtime::build_backends_for(&model, &devices[..1], &rc, None)?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no backend"))?;
    let load_ms = load_start.elapsed().as_secs_f64() * 1000.0;
    let ctx = backend.config().context;
    let blocks: Vec<u32> = (0..u32::try_from(backend.num_blocks())?).collect();
    let reps = a.reps.max(1);
    let mut logits = Vec::new();
    let types = weight_types(&model)?;
    if !a.json {
        let list: Vec<String> = types.iter().map(|(t, n)| format!("{n} {t}")).collect();
        eprintln!(
            "model {} ({} tensors); {}",
            model.id,
            list.join(", "),
            backend.describe()
        );
    }
    // Prefill.
    let mut prefill = Vec::new();
    for &p in &a.prompt_tokens {
        anyhow::ensure!(
            p > 0 && p < ctx,
            "prompt of {p} tokens does not fit the context of {ctx}"
        );
        let toks = bench_tokens(&model, p)?;
        let mut runs = Vec::new();
        for _ in 0..=reps {
            logits.clear();
            let t = Instant::now();
            backend.forward(
                &[SeqChunk {
                    tokens: &toks,
                    start_pos: 0,
                    blocks: &blocks,
                    all_logits: false,
                    no_logits: false,
                }],
                &mut logits,
            )?;
            runs.push(p as f64 / t.elapsed().as_secs_f64());
        }
        runs.remove(0); // warm-up
        let s = spread(runs);
        if !a.json {
            println!(
                "prefill {p:>5} tokens: {:>8.1} tok/s (min {:.1}, max {:.1})",
                s.median, s.min, s.max
            );
        }
        prefill.push((p, s));
    }
    // Decode at batch 1, after a short prompt.
    let toks = bench_tokens(&model, 16)?;
    let gen_n = a.gen_tokens.min(ctx - toks.len() - 1).max(1);
    let mut runs = Vec::new();
    for _ in 0..=reps {
        logits.clear();
        backend.forward(
            &[SeqChunk {
                tokens: &toks,
                start_pos: 0,
                blocks: &blocks,
                all_logits: false,
                no_logits: false,
            }],
            &mut logits,
        )?;
        let vocab = backend.config().vocab;
        let t = Instant::now();
        for pos in toks.len()..toks.len() + gen_n {
            let next = argmax(&logits[logits.len() - vocab..]);
            logits.clear();
            backend.forward(
                &[SeqChunk {
                    tokens: &[next],
                    start_pos: pos,
                    blocks: &blocks,
                    all_logits: false,
                    no_logits: false,
                }],
                &mut logits,
            )?;
        }
        runs.push(gen_n as f64 / t.elapsed().as_secs_f64());
    }
    runs.remove(0);
    let decode = spread(runs);
    // Decode after a deep context.
    let mut depths = Vec::new();
    for &d in &a.decode_depth {
        anyhow::ensure!(
            d + gen_n < ctx,
            "a depth of {d} plus {gen_n} tokens does not fit the context of {ctx}"
        );
        let ctx_toks = bench_tokens(&model, d.max(1))?;
        let mut runs = Vec::new();
        for _ in 0..=reps {
            logits.clear();
            let mut pos = 0;
            if d > 0 {
                backend.forward(
                    &[SeqChunk {
                        tokens: &ctx_toks,
                        start_pos: 0,
                        blocks: &blocks,
                        all_logits: false,
                        no_logits: false,
                    }],
                    &mut logits,
                )?;
                pos = d;
            }
            let vocab = backend.config().vocab;
            let mut next = if d > 0 {
                argmax(&logits[logits.len() - vocab..])
            } else {
                ctx_toks[0]
            };
            let t = Instant::now();
            for p in pos..pos + gen_n {
                logits.clear();
                backend.forward(
                    &[SeqChunk {
                        tokens: &[next],
                        start_pos: p,
                        blocks: &blocks,
                        all_logits: false,
                        no_logits: false,
                    }],
                    &mut logits,
                )?;
                next = argmax(&logits[logits.len() - vocab..]);
            }
            runs.push(gen_n as f64 / t.elapsed().as_secs_f64());
        }
        runs.remove(0);
        let s = spread(runs);
        if !a.json {
            println!(
                "decode  at depth {d:>5}: {:>8.1} tok/s (min {:.1}, max {:.1})",
                s.median, s.min, s.max
            );
        }
        depths.push((d, s));
    }
    let threads = a
        .model
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let (rss, peak) = memory_mib();
    let bandwidth = (!a.no_bandwidth).then(|| read_bandwidth_gbs(threads));
    let weight_bytes = backend.weight_bytes_per_step();
    if let (Some(bw), false) = (bandwidth, a.json) {
        println!(
            "read bandwidth ({threads} threads): {bw:.1} GB/s; decode reads {:.1} MB of weights a token, so it runs at {:.0}% of that limit",
            weight_bytes as f64 / 1e6,
            100.0 * decode.median * weight_bytes as f64 / (bw * 1e9)
        );
    }
    if !a.json {
        println!(
            "decode  batch 1    : {:>8.1} tok/s (min {:.1}, max {:.1}) over {gen_n} tokens",
            decode.median, decode.min, decode.max
        );
        println!(
            "memory: resident {rss:.0} MiB, peak {peak:.0} MiB (context {ctx}); loaded in {load_ms:.0} ms; KV {} bytes a position",
            kv_bytes_per_position(&model)
        );
    }
    let backend_desc = backend.describe();
    let backend_isa = backend.isa_name();
    drop(backend);
    // Aggregate decode through the scheduler.
    let mut conc = Vec::new();
    let mut constrained = Vec::new();
    let mut with_events = Vec::new();
    let events = a
        .kv_events_endpoint
        .as_ref()
        .map(|endpoint| {
            crate::kv_events::publisher::start(crate::kv_events::KvEventsConfig {
                endpoint: endpoint.clone(),
                replay_endpoint: None,
                topic: crate::kv_events::default_topic("bench", &model.id),
                data_parallel_rank: 0,
                block_size: runtime::KV_BLOCK_SIZE,
            })
        })
        .transpose()?;
    for &c in &a.concurrency {
        let c = c.max(1);
        let (s, _, _) = concurrent_decode(&model, &a.model, c, a.gen_tokens, reps, false, None)?;
        if !a.json {
            println!(
                "decode concurrency {c:>2}: {:>8.1} tok/s aggregate (min {:.1}, max {:.1}), {:.2} ms a step",
                s.median,
                s.min,
                s.max,
                1000.0 * c as f64 / s.median.max(1e-9)
            );
        }
        conc.push((c, s));
        if let Some(sink) = &events {
            let before = sink.status();
            let (e, _, busy) = concurrent_decode(
                &model,
                &a.model,
                c,
                a.gen_tokens,
                reps,
                false,
                Some(sink.clone()),
            )?;
            let after = sink.status();
            // What the step loop itself spent handing events over, of all the time it ran.
            let handoff = 100.0 * (after.handoff_seconds - before.handoff_seconds)
                / busy.as_secs_f64().max(1e-9);
            let measured = 100.0 * (s.median - e.median) / s.median.max(1e-9);
            if !a.json {
                println!(
                    "  with KV events    : {:>8.1} tok/s aggregate (min {:.1}, max {:.1}), {:.2} ms a step ({measured:+.2}% against the run without); hand-off {handoff:.4}% of the step loop's time, {} batches, {} dropped",
                    e.median,
                    e.min,
                    e.max,
                    1000.0 * c as f64 / e.median.max(1e-9),
                    after.sequence - before.sequence,
                    after.dropped - before.dropped
                );
            }
            with_events.push((c, e, measured, handoff));
        }
        if a.constrained {
            let (s, mask_ms, _) =
                concurrent_decode(&model, &a.model, c, a.gen_tokens, reps, true, None)?;
            if !a.json {
                println!(
                    "  one constrained   : {:>8.1} tok/s aggregate (min {:.1}, max {:.1}), {:.2} ms a step; its mask {:.3} ms a token",
                    s.median,
                    s.min,
                    s.max,
                    1000.0 * c as f64 / s.median.max(1e-9),
                    mask_ms.unwrap_or(0.0)
                );
            }
            constrained.push((c, s, mask_ms));
        }
    }
    if a.json {
        let sp = |s: Spread| json!({"median": s.median, "min": s.min, "max": s.max});
        println!(
            "{}",
            json!({
                "model": model.id,
                "model_info": model.info(),
                "device": a.model.device,
                "backend": backend_desc,
                "prefill_tps": prefill.iter().map(|(p, s)| json!({"prompt_tokens": p, "tps": sp(*s)})).collect::<Vec<_>>(),
                "decode_tps": sp(decode),
                "decode_depth": depths.iter().map(|(d, s)| json!({"depth": d, "tps": sp(*s)})).collect::<Vec<_>>(),
                "gen_tokens": gen_n,
                "isa": backend_isa,
                "cpu": cpu_model(),
                "cpu_features": crate::backend::cpu::isa::cpu_features(),
                "threads": threads,
                "read_bandwidth_gbs": bandwidth,
                "weight_types": types,
                "bytes_per_decode_step": weight_bytes,
                "weight_bytes_per_token": weight_bytes,
                "decode_bandwidth_fraction": bandwidth.map(|bw| decode.median * weight_bytes as f64 / (bw * 1e9)),
                "concurrency": conc.iter().map(|(c, s)| json!({"concurrency": c, "aggregate_tps": sp(*s), "step_ms": 1000.0 * *c as f64 / s.median.max(1e-9)})).collect::<Vec<_>>(),
                "concurrency_with_kv_events": with_events.iter().map(|(c, s, measured, handoff)| json!({"concurrency": c, "aggregate_tps": sp(*s), "step_ms": 1000.0 * *c as f64 / s.median.max(1e-9), "slowdown_percent": measured, "handoff_percent": handoff})).collect::<Vec<_>>(),
                "concurrency_one_constrained": constrained.iter().map(|(c, s, m)| json!({"concurrency": c, "aggregate_tps": sp(*s), "step_ms": 1000.0 * *c as f64 / s.median.max(1e-9), "mask_ms_per_token": m})).collect::<Vec<_>>(),
                "rss_mib": rss,
                "peak_rss_mib": peak,
                "context": ctx,
                "kv_bytes_per_sequence": kv_per_sequence(&model, ctx),
                "kv_bytes_per_position": kv_bytes_per_position(&model),
                "load_ms": load_ms,
            })
        );
    }
    Ok(())
}

/// KV bytes of one position over every layer (keys and values as the cache stores them).
fn kv_bytes_per_position(model: &Model) -> usize {
    crate::backend::kv_bytes_per_sequence(&model.config, 16, 16, false) / 16
}

/// KV bytes one sequence holds at the context length and at 4,096 positions, with the
/// sliding-window layers keeping only their window (as the CPU scheduler runs them) and with
/// every layer whole, in 16-position blocks.
fn kv_per_sequence(model: &Model, ctx: usize) -> serde_json::Value {
    let at = |n: usize| {
        let held = crate::backend::kv_bytes_per_sequence(&model.config, 16, n, true);
        let whole = crate::backend::kv_bytes_per_sequence(&model.config, 16, n, false);
        json!({"positions": n, "windowed": held, "whole": whole})
    };
    json!([at(ctx), at(4096)])
}

/// Tensors per stored type (GGML names): every tensor of a GGUF file, as llama.cpp's loader
/// counts them; for a Hugging Face folder, the matrices (its 1-D tensors are read as f32 and
/// keep no type).
fn weight_types(model: &Model) -> anyhow::Result<BTreeMap<&'static str, usize>> {
    let mut counts = BTreeMap::new();
    let mut count = |name| *counts.entry(name).or_insert(0) += 1;
    match model.format {
        Format::Gguf => {
            for info in GgufFile::open(&model.path)?.tensor_infos().values() {
                count(info.dtype.name());
            }
        }
        Format::HuggingFace => {
            let w = &model.weights;
            // A tied output is the embedding itself.
            let output = (w.output.name() != w.embed.name()).then_some(&w.output);
            std::iter::once(&w.embed)
                .chain(
                    w.blocks
                        .iter()
                        .flat_map(|b| [&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w_down]),
                )
                .chain(output)
                .map(Tensor::dtype)
                .for_each(|d| count(d.name()));
        }
    }
    Ok(counts)
}

/// The CPU's model name (Linux).
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// Read bandwidth of this machine's memory with `threads` threads, in GB/s.
fn read_bandwidth_gbs(threads: usize) -> f64 {
    let pool = crate::backend::cpu::pool::ComputePool::new(threads);
    crate::backend::cpu::membw::read_bandwidth_gbs(&pool)
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    u32::try_from(best).unwrap_or(0)
}

/// A grammar that keeps a sequence generating: JSON objects of a small schema, one per line,
/// ended only by three control bytes no model writes.
const BENCH_GRAMMAR: &str = r#"start: (item "\n")+ "\u0001\u0002\u0003"
item: %json {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}}, "required": ["name", "age", "tags"], "additionalProperties": false}"#;

/// Aggregate decode rate with `c` requests decoding at once: tokens produced while all of them
/// were decoding, divided by the length of that window. With `constrained`, the first request
/// follows [`BENCH_GRAMMAR`]; its mean mask time per token comes back too.
#[allow(clippy::cast_precision_loss)]
fn concurrent_decode(
    model: &Model,
    args: &ModelArgs,
    c: usize,
    gen_n: usize,
    reps: usize,
    constrained: bool,
    kv_events: Option<crate::kv_events::KvEventSink>,
) -> anyhow::Result<(Spread, Option<f64>, Duration)> {
    let constraint = if constrained {
        let compiler =
            crate::constraint::Compiler::new(Arc::clone(&model.tokenizer), model.config.vocab)?;
        Some(compiler.compile(&crate::constraint::GrammarSpec::Lark(BENCH_GRAMMAR.into()))?)
    } else {
        None
    };
    let mut mask_times = Vec::new();
    let sched = SchedulerConfig {
        batch: c.max(1),
        max_queue: c * 2,
        session_windows: crate::scheduler::SessionWindows::off(),
        ..SchedulerConfig::default()
    };
    let ctx = args.ctx_size;
    let engine = super::start_engine_with_events(model, args, ctx * c.max(1), sched, kv_events)?;
    let prompt = bench_tokens(model, 32)?;
    let mut runs = Vec::new();
    let busy = Instant::now();
    for rep in 0..=reps {
        let receivers: Vec<_> = (0..c)
            .map(|i| {
                // Distinct prompts, in every repetition, so no request reuses another's cache
                // (and every block it fills is new to the prefix cache, as KV events count).
                let distinct = std::iter::once(u32::try_from(10 + i + rep * c).unwrap_or(10))
                    .chain(prompt.iter().copied())
                    .collect();
                engine.submit(GenerateRequest {
                    sampling: SamplingParams::greedy(),
                    ignore_eos: true,
                    constraint: if i == 0 { constraint.clone() } else { None },
                    ..GenerateRequest::new(format!("bench-{rep}-{i}"), distinct, gen_n)
                })
            })
            .collect::<Result<_, _>>()?;
        let handles: Vec<_> = receivers
            .into_iter()
            .map(|mut rx| {
                std::thread::spawn(move || {
                    let mut times = Vec::new();
                    let mut mask = None;
                    while let Some(ev) = rx.blocking_recv() {
                        match ev {
                            Event::Token { at, .. } => times.push(at),
                            Event::Done(c) => {
                                mask = c.mask;
                                break;
                            }
                            _ => {}
                        }
                    }
                    (times, mask)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().filter_map(|h| h.join().ok()).collect();
        for (_, m) in &results {
            if let Some(m) = m
                && m.masks > 0
                && rep > 0
            {
                mask_times.push(m.time.as_secs_f64() * 1000.0 / m.masks as f64);
            }
        }
        let all: Vec<Vec<Instant>> = results.into_iter().map(|(t, _)| t).collect();
        let start = all.iter().filter_map(|t| t.first().copied()).max();
        let end = all.iter().filter_map(|t| t.last().copied()).min();
        if let (Some(s), Some(e)) = (start, end)
            && e > s
        {
            let n: usize = all
                .iter()
                .map(|t| t.iter().filter(|&&x| x > s && x <= e).count())
                .sum();
            let secs = (e - s).max(Duration::from_micros(1)).as_secs_f64();
            if rep > 0 {
                runs.push(n as f64 / secs);
            }
        }
    }
    let busy = busy.elapsed();
    let mask = (!mask_times.is_empty()).then(|| spread(mask_times).median);
    Ok((spread(runs), mask, busy))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::TinyLlama;
    use crate::model::weights::DType;

    #[test]
    fn weight_types_count_every_tensor_of_the_file() {
        // Two layers: 2 × 7 matrices, 2 × 2 norms and the final norm; untied output.
        let tiny = TinyLlama {
            tied: false,
            ..TinyLlama::default()
        };
        let mix = |name: &str, default: DType| match name {
            "output.weight" => DType::Q8_0,
            n if n.ends_with("attn_v.weight") => DType::Q5_1,
            _ => default,
        };
        let (_dir, path) = tiny.gguf_typed(&mix, false).write_temp();
        let model = Model::load(&path).expect("load");
        let got = weight_types(&model).expect("types");
        let want = BTreeMap::from([("F32", 5), ("Q4_1", 12), ("Q5_1", 2), ("Q8_0", 2)]);
        assert_eq!(got, want);
        assert_eq!(
            serde_json::to_value(&got).expect("json"),
            json!({"F32": 5, "Q4_1": 12, "Q5_1": 2, "Q8_0": 2})
        );
    }
}
