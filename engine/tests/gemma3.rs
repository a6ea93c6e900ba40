//! Gemma 3 270M (Q4_K_M) against llama.cpp on the same file: tokenization of hard strings,
//! greedy continuations, and a served chat. The expected values were recorded from llama.cpp's
//! llama-server (see `fixtures/gemma3_270m_llamacpp.json`, `source`); the tests need only the
//! model file (`slotlight-engine fetch-model gemma3-270m`, or `SLOTLIGHT_GEMMA_MODEL`), and
//! are skipped when it is missing unless `SLOTLIGHT_REQUIRE_MODEL=1`.

mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::{Value, json};
use slotlight_engine::backend::{Backend, SeqChunk};
use slotlight_engine::model::config::Arch;
use slotlight_engine::model::loader::Model;
use support::server::{Options, TestServer};

fn model_path() -> Option<PathBuf> {
    let p = std::env::var_os("SLOTLIGHT_GEMMA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| slotlight_engine::known_models::GEMMA3_270M.path());
    if p.exists() {
        return Some(p);
    }
    if std::env::var("SLOTLIGHT_REQUIRE_MODEL").is_ok_and(|v| v == "1") {
        panic!("Gemma 3 270M is required but missing at {}", p.display());
    }
    eprintln!(
        "skipping: Gemma 3 270M is not at {} (run `slotlight-engine fetch-model gemma3-270m`)",
        p.display()
    );
    None
}

/// The model, loaded once for every test of this file.
fn model() -> Option<&'static Model> {
    static MODEL: OnceLock<Option<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| model_path().map(|p| Model::load(&p).expect("load Gemma 3 270M")))
        .as_ref()
}

fn expected() -> Value {
    let path = support::fixtures().join("gemma3_270m_llamacpp.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id")).expect("u32"))
        .collect()
}

#[test]
fn the_config_describes_gemma3() {
    let Some(m) = model() else { return };
    let c = &m.config;
    assert_eq!(c.arch, Arch::Gemma3);
    assert_eq!(
        (c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim),
        (640, 18, 4, 1, 256)
    );
    let f = &c.family;
    assert!(f.qk_norm && f.post_norms);
    let sw = f.sliding_window.as_ref().expect("sliding window");
    assert_eq!(sw.window, 512);
    let globals: Vec<usize> = (0..c.layers).filter(|&l| f.window(l).is_none()).collect();
    assert_eq!(globals, vec![5, 11, 17]);
    assert_eq!(sw.local_rope_theta, Some(10000.0));
    assert!((c.rope_theta - 1e6).abs() < 1.0);
    // llama.cpp's converter stored 1 + w: the norms are used as they are.
    assert!(m.weights.blocks[0].attn_norm.iter().all(|&w| w > 1.0));
}

#[test]
fn tokenization_equals_llama_cpp() {
    let Some(m) = model() else { return };
    let mut bad = Vec::new();
    for case in expected()["tokenize"].as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        let got = m.tokenizer.encode(text, true).expect("encode");
        if got != want {
            bad.push(format!(
                "{text:?}:\n  ours      {got:?}\n  llama.cpp {want:?}"
            ));
        }
        // Decoding the ids (without BOS, special tokens kept) gives the text back.
        let body = want.strip_prefix(&[2]).unwrap_or(&want);
        assert_eq!(m.tokenizer.decode_with(body, false).expect("decode"), text);
    }
    assert!(
        bad.is_empty(),
        "{} cases differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// Greedy decoding from `prompt`, returning the tokens and each step's logits.
fn greedy(m: &Model, prompt: &[u32], n: usize) -> Vec<(u32, Vec<f32>)> {
    let mut b = support::cpu_backend(m, prompt.len() + n + 1);
    let blocks: Vec<u32> = (0..u32::try_from(b.num_blocks()).expect("blocks")).collect();
    let mut out = Vec::new();
    let mut logits = Vec::new();
    let step = |b: &mut dyn Backend, tokens: &[u32], start: usize, logits: &mut Vec<f32>| {
        logits.clear();
        b.forward(
            &[SeqChunk {
                tokens,
                start_pos: start,
                blocks: &blocks,
                all_logits: false,
                no_logits: false,
            }],
            logits,
        )
        .expect("forward");
    };
    step(&mut b, prompt, 0, &mut logits);
    for i in 0..n {
        let t = support::argmax(&logits);
        out.push((t, logits.clone()));
        if i + 1 < n {
            step(&mut b, &[t], prompt.len() + i, &mut logits);
        }
    }
    out
}

/// Our greedy tokens equal llama.cpp's until the first near-tie: where they part, our logit for
/// llama.cpp's token is within `NEAR` nats of our best, and llama.cpp's own top two were within
/// `THEIR_NEAR`. Both engines quantize activations to 8 bits, so any change of arithmetic moves
/// a logit by about one activation step; on the default model's presets the two engines parted
/// where llama.cpp's own margin was up to 0.59 nats (and where a float32 reference was asked,
/// it put the two tokens within 0.06: docs/performance.md), hence the wider bound on
/// llama.cpp's side.
#[test]
fn greedy_continuations_equal_llama_cpp_up_to_near_ties() {
    const NEAR: f32 = 0.3;
    const THEIR_NEAR: f32 = 0.6;
    let Some(m) = model() else { return };
    let mut report = Vec::new();
    for case in expected()["greedy"].as_array().expect("cases") {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["ids"]);
        let margins: Vec<f64> = case["margins"]
            .as_array()
            .expect("margins")
            .iter()
            .map(|v| v.as_f64().expect("margin"))
            .collect();
        let got = greedy(m, &prompt, want.len());
        let same = got
            .iter()
            .zip(&want)
            .take_while(|(g, w)| g.0 == **w)
            .count();
        report.push(format!(
            "{} prompt tokens: {same}/{} equal",
            prompt.len(),
            want.len()
        ));
        if same < want.len() {
            let (ours, logits) = &got[same];
            let theirs = want[same];
            let gap = logits[*ours as usize] - logits[theirs as usize];
            #[allow(clippy::cast_possible_truncation)]
            let their_margin = margins[same] as f32;
            assert!(
                gap <= NEAR && their_margin <= THEIR_NEAR,
                "prompt of {} tokens parts from llama.cpp at step {same}: ours {ours}, llama.cpp \
                 {theirs}; our gap {gap}, llama.cpp's margin {their_margin} (not a near-tie)",
                prompt.len()
            );
        }
    }
    eprintln!("{}", report.join("\n"));
}

/// A served chat streams Gemma's turn format and ends with usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_chat_streams_with_usage() {
    let Some(m) = model() else { return };
    let s = TestServer::start(m, Options::default()).await;
    let body = json!({
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"}
        ],
        "max_tokens": 8,
        "ignore_eos": true,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true}
    });
    let (chunks, done) = s.stream("/v1/chat/completions", body).await;
    assert!(done, "the stream ends with [DONE]");
    let last = chunks.last().expect("chunks");
    let u = &last["usage"];
    assert_eq!(u["completion_tokens"], 8, "{last}");
    // <bos><start_of_turn>user\nAnswer briefly.\n\nWhat is ...?<end_of_turn>\n<start_of_turn>model\n
    let prompt = m
        .tokenizer
        .encode(
            "<bos><start_of_turn>user\nAnswer briefly.\n\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
            true,
        )
        .expect("encode");
    assert_eq!(u["prompt_tokens"], prompt.len(), "{u}");
    assert!(u["ttft_ms"].as_f64().is_some(), "{u}");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!text.is_empty());
    s.stop().await;
}

/// KV bytes a sequence holds at 4,096 positions (f16, blocks of 16): every layer whole, 18
/// layers × 1 KV head × 256 dims × keys and values × 2 bytes = 18 KiB a position; with the 15
/// local layers keeping their 512-position window only, the 3 global layers' 3 KiB a position
/// plus the window's 512 positions × 15 KiB.
#[test]
fn the_local_layers_hold_only_their_window() {
    let Some(m) = model() else { return };
    let whole = slotlight_engine::backend::kv_bytes_per_sequence(&m.config, 16, 4096, false);
    let held = slotlight_engine::backend::kv_bytes_per_sequence(&m.config, 16, 4096, true);
    assert_eq!(whole, 4096 * 18 * 1024);
    assert_eq!(held, 4096 * 3 * 1024 + 512 * 15 * 1024);
    eprintln!(
        "KV at 4,096 positions: {whole} bytes whole ({} a position), {held} windowed ({} a position)",
        whole / 4096,
        held / 4096
    );
}

/// Past the 512-position window, through the scheduler with the local layers windowed: the
/// same greedy tokens as every layer kept whole, and a second turn that resumes beyond the
/// window reuses all of its prefix and still gives the tokens of a cold run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windowed_kv_past_the_window_gives_the_same_greedy_tokens() {
    use slotlight_engine::runtime::{self, RuntimeConfig};
    use slotlight_engine::sampling::SamplingParams;
    use slotlight_engine::scheduler::{EngineHandle, Event, GenerateRequest, SchedulerConfig};
    let Some(m) = model() else { return };
    let engine = || {
        let sched = SchedulerConfig {
            batch: 2,
            prefill_chunk: 256,
            max_sessions: 4,
            ..SchedulerConfig::default()
        };
        let rc = RuntimeConfig {
            threads: Some(2),
            ctx_size: 1024,
            kv_tokens: 2048,
            block_size: 16,
        };
        let devices = runtime::parse_devices("cpu").expect("cpu");
        let b = runtime::build_backends_for(m, &devices, &rc, Some(&sched)).expect("backend");
        assert!(b[0].windowed_kv().is_some(), "{}", b[0].describe());
        EngineHandle::start(b, std::sync::Arc::clone(&m.tokenizer), sched)
    };
    let run = |e: &EngineHandle, prompt: Vec<u32>, n: usize, session: Option<&str>| {
        let req = GenerateRequest {
            sampling: SamplingParams::greedy(),
            ignore_eos: true,
            session: session.map(str::to_owned),
            ..GenerateRequest::new("g", prompt, n)
        };
        let mut rx = e.submit(req).expect("submit");
        async move {
            loop {
                match rx.recv().await.expect("events until the completion") {
                    Event::Done(c) => return *c,
                    _ => continue,
                }
            }
        }
    };
    let text = "The lighthouse keeper wrote in his log every evening: the weather, the ships that \
                passed, the birds that rested on the rail, and what the sea had brought ashore. ";
    let base = m.tokenizer.encode(text, false).expect("encode");
    let mut prompt = vec![2];
    prompt.extend(base.iter().copied().cycle().take(600));
    let warm = engine();
    let first = run(&warm, prompt.clone(), 12, Some("s")).await;
    let whole: Vec<u32> = greedy(m, &prompt, 12).iter().map(|(t, _)| *t).collect();
    assert_eq!(
        first.tokens, whole,
        "windowed and whole KV differ past the window"
    );
    let mut next = prompt.clone();
    next.extend(&first.tokens);
    next.extend(
        m.tokenizer
            .encode(" The next morning", false)
            .expect("encode"),
    );
    let second = run(&warm, next.clone(), 12, Some("s")).await;
    let cold = run(&engine(), next.clone(), 12, None).await;
    assert_eq!(second.tokens, cold.tokens);
    // Every position the first turn computed is reused: its whole blocks from the prefix
    // cache, the partly filled last one continued (the session's tail).
    let reachable = prompt.len() + first.tokens.len() - 1;
    assert!(reachable > 512 && reachable % 16 != 0);
    assert_eq!(second.timings.cached_tokens, reachable);
    assert_eq!(
        second.timings.resume.map(|r| r.outcome.as_str()),
        Some("full")
    );
}
