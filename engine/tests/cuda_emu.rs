//! The CUDA backend's whole code path (packing, step metadata, every kernel, the GEMM path's
//! bookkeeping, graph replay) run on the host kernel emulator and compared with the CPU
//! backend. Needs an x86-64 host with a C++ compiler; skips with a message otherwise, or fails
//! when `SLOTLIGHT_REQUIRE_TOOLS=1` (as in CI, which installs `g++`).
#![cfg(feature = "cuda")]

#[path = "cuda_support.rs"]
mod cuda_support;
mod support;

use std::sync::Arc;

use cuda_support::{
    MatrixTypes, NEW_TYPES, cpu_backend, decode, matrix_bytes, max_diff, synthetic_model, tokens,
};

use slotlight_engine::backend::cuda::emu::{self, EmuGpu};
use slotlight_engine::backend::cuda::{CudaOptions, GpuBackend};
use slotlight_engine::backend::{Backend, SeqChunk, kv_block_bytes, kv_bytes_per_sequence};
use slotlight_engine::kv_cache::{KvPools, RELEASED, SeqKv};
use slotlight_engine::model::config::ModelConfig;
use slotlight_engine::model::llama::LlamaWeights;
use slotlight_engine::model::loader::Model;
use slotlight_engine::model::testing::TinyLlama;
use slotlight_engine::model::weights::DType;
use slotlight_engine::runtime::window_pool_blocks;
use slotlight_engine::scheduler::SchedulerConfig;

/// Largest logit difference from the CPU backend for float weights: both use f32
/// activations (the GEMM path f16), so results differ by rounding only.
const TOLERANCE: f32 = 2e-2;

/// Largest logit difference from the CPU backend for quantized weights. The CPU quantizes
/// each matmul input to 8 bits per 32-value block for its integer kernels (as llama.cpp does;
/// `tiny_models.rs` bounds that at 0.25 from the reference logits) while the GPU kernels keep
/// f32 activations, so the two differ by up to that cost and a little rounding.
const QUANTIZED_TOLERANCE: f32 = 0.35;

/// Largest logit difference of the GEMM path (f16 weights and activations in the GEMM) from
/// the CPU on the same weights in f32.
const GEMM_TOLERANCE: f32 = 0.1;

/// Bytes of the f32 vectors beside the matrices (norms, RoPE frequencies) of the synthetic
/// models, with room to spare.
const VECTOR_BYTES: usize = 16 * 1024;

/// The tolerance for weights of `dtype`.
fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => TOLERANCE,
        _ => QUANTIZED_TOLERANCE,
    }
}

fn skip() -> bool {
    if emu::available() {
        return false;
    }
    let why = "the kernel emulator needs an x86-64 host with a C++ compiler (`$CXX`, else `c++`)";
    if std::env::var("SLOTLIGHT_REQUIRE_TOOLS").is_ok_and(|v| v == "1") {
        panic!("SLOTLIGHT_REQUIRE_TOOLS=1 but {why}");
    }
    eprintln!("skipping: {why}");
    true
}

fn emu_backend(
    cfg: &ModelConfig,
    w: &LlamaWeights,
    positions: usize,
    opts: CudaOptions,
    gemm: bool,
) -> GpuBackend<EmuGpu> {
    GpuBackend::with_gpu(
        EmuGpu::new(gemm),
        cfg.clone(),
        w,
        16,
        positions.div_ceil(16) + 1,
        opts,
        "emu".into(),
    )
    .expect("emulated backend")
}

fn matvec_only() -> CudaOptions {
    CudaOptions {
        prefill_gemm: false,
        ..CudaOptions::default()
    }
}

#[test]
fn tiny_models_match_the_cpu_for_every_weight_format() {
    if skip() {
        return;
    }
    for (dtype, tied, bias) in [
        (DType::Q4_0, true, false),
        (DType::Q4_1, false, false),
        (DType::Q8_0, true, true),
        (DType::F16, false, true),
        (DType::F32, true, false),
    ] {
        let tiny = TinyLlama {
            dtype,
            tied,
            qkv_bias: bias,
            ..TinyLlama::default()
        };
        let path = tiny.write_temp();
        let (cfg, w) = Model::load_weights(&path).expect("load");
        let seq = tokens(21, cfg.vocab);
        let mut gpu = emu_backend(&cfg, &w, seq.len(), matvec_only(), false);
        let mut cpu = cpu_backend(&cfg, &w, seq.len());
        let g = support::all_logits(&mut gpu, &seq);
        let c = support::all_logits(&mut cpu, &seq);
        let d = max_diff(&g, &c);
        eprintln!("{dtype:?} tied={tied} bias={bias}: worst logit difference {d:.2e}");
        assert!(d <= tolerance(dtype), "{dtype:?}: {d}");
    }
}

/// Tiny models written by the test GGUF writer's quantizers (round to nearest, as llama.cpp
/// does) in each newer block type: the emulated GPU against the CPU backend's integer kernels.
#[test]
fn tiny_quantized_models_of_every_new_type_match_the_cpu() {
    if skip() {
        return;
    }
    for dtype in NEW_TYPES {
        let tiny = TinyLlama {
            dtype,
            hidden: 256,
            ffn: 512,
            tied: false,
            ..TinyLlama::default()
        };
        let (cfg, w) = Model::load_weights(&tiny.write_temp()).expect("load");
        let seq = tokens(13, cfg.vocab);
        let mut gpu = emu_backend(&cfg, &w, seq.len(), matvec_only(), false);
        let mut cpu = cpu_backend(&cfg, &w, seq.len());
        let d = max_diff(
            &support::all_logits(&mut gpu, &seq),
            &support::all_logits(&mut cpu, &seq),
        );
        eprintln!("{dtype:?} (quantized by the test writer): worst logit difference {d:.2e}");
        assert!(d <= QUANTIZED_TOLERANCE, "{dtype:?}: {d}");
    }
}

/// Every block type of the K-quant generation stays quantized on the device (one format per
/// type, memory about the file's) and its kernels, decoding in registers, give the logits of the
/// CPU on the same weights dequantized to f32: the decode is exact, so only rounding differs.
#[test]
fn every_new_block_type_runs_quantized_and_matches_the_f32_weights() {
    if skip() {
        return;
    }
    for (i, dtype) in (0u64..).zip(NEW_TYPES) {
        let (cfg, wq, wf) = synthetic_model(MatrixTypes::all(dtype), 40 + i);
        let seq = tokens(13, cfg.vocab);
        let mut gpu = emu_backend(&cfg, &wq, seq.len(), matvec_only(), false);
        let desc = gpu.describe();
        assert!(
            desc.contains(&format!("weights {} on device", dtype.name())),
            "{desc}"
        );
        let (dev, file) = (gpu.weight_bytes(), matrix_bytes(&wq));
        assert!(
            dev <= file * 106 / 100 + VECTOR_BYTES,
            "{dtype:?}: {dev} bytes on the device for {file} in the file"
        );
        let mut cpu = cpu_backend(&cfg, &wf, seq.len());
        let d = max_diff(
            &support::all_logits(&mut gpu, &seq),
            &support::all_logits(&mut cpu, &seq),
        );
        eprintln!("{dtype:?}: {dev} device bytes for {file}; worst logit difference {d:.2e}");
        assert!(d <= TOLERANCE, "{dtype:?}: {d}");
    }
}

/// The device decode itself, bit for bit: the `embed` kernel of each format copies rows of a
/// packed matrix out as the f32 weights its unit loader computes, which must be the reference
/// `dequantize`'s values exactly (random blocks: every code and sub-scale pattern).
#[test]
fn device_decode_equals_the_reference_bit_for_bit_for_every_block_type() {
    use slotlight_engine::backend::cuda::gpu::{Arg, Gpu, Launch};
    use slotlight_engine::backend::cuda::kernels::KernelConfig;
    use slotlight_engine::backend::cuda::layout::{self, WFormat};
    use slotlight_engine::model::testing::FixtureRng;

    if skip() {
        return;
    }
    let (rows, k) = (6, 512);
    let kc = KernelConfig {
        hidden: k,
        q_dim: k,
        kv_dim: k / 2,
        head_dim: 64,
        heads: 8,
        kv_heads: 4,
        ffn: k,
        layers: 1,
        block_size: 16,
        neox: false,
        att_warps: layout::attn_warps(2, 64),
        formats: WFormat::ALL.to_vec(),
    };
    let names = kc.kernel_names();
    let mut gpu = EmuGpu::new(false);
    gpu.load(&kc, &names).expect("emulator build");
    let mut rng = FixtureRng::new(3);
    let quantized = DType::ALL.into_iter().filter(|d| d.is_quantized());
    for dtype in quantized {
        let t = cuda_support::random_quantized("w", dtype, rows, k, 1.0, &mut rng);
        let fmt = WFormat::for_dtype(dtype);
        let packed = layout::pack(fmt, &[&t]).expect("pack");
        let w = gpu.alloc(packed.len()).expect("alloc");
        gpu.upload(w, &packed).expect("upload");
        let meta: Vec<u8> = (0..rows)
            .flat_map(|r| i32::try_from(r).expect("row").to_le_bytes())
            .collect();
        let m = gpu.alloc(meta.len()).expect("alloc");
        gpu.upload(m, &meta).expect("upload");
        let x = gpu.alloc(rows * k * 4).expect("alloc");
        let kernel = names
            .iter()
            .position(|n| *n == format!("embed_f{}", fmt.id()))
            .expect("embed kernel");
        let l = Launch {
            kernel,
            grid: (u32::try_from(rows).expect("rows"), 1, 1),
            block: (256, 1, 1),
        };
        let args = [
            Arg::Ptr(w),
            Arg::I32(i32::try_from(rows).expect("rows")),
            Arg::Ptr(m),
            Arg::Ptr(x),
            // The embedding scale: 1 leaves the decoded weights exact.
            Arg::F32(1.0),
        ];
        let short = gpu.launch(l, &args[..4]);
        assert!(short.is_err(), "a launch missing an argument is refused");
        gpu.launch(l, &args).expect("launch");
        let mut got = vec![0f32; rows * k];
        gpu.download(&mut got, x).expect("download");
        let want = t.to_f32_vec();
        let bad = got
            .iter()
            .zip(&want)
            .position(|(g, w)| g.to_bits() != w.to_bits());
        assert_eq!(bad, None, "{dtype:?}: first differing weight");
        for p in [w, m, x] {
            gpu.free(p);
        }
    }
}

/// Models whose matrices differ in type, like llama.cpp's presets write them: each of Q, K and
/// V keeps its own format (one launch per run of equal formats), on the matvec and the GEMM
/// path; gate and up of different types share F16.
#[test]
fn mixed_type_models_keep_each_matrix_in_its_format() {
    if skip() {
        return;
    }
    for (label, types, formats) in [
        ("Q4_K_M", MatrixTypes::q4_k_m(), "Q4_K/Q6_K"),
        (
            "mixed",
            MatrixTypes::mixed(),
            "Q4_K/Q5_0/Q6_K/Q3_K/F16/IQ4_XS/Q5_1/Q2_K",
        ),
    ] {
        let (cfg, wq, wf) = synthetic_model(types, 77);
        let seq = tokens(21, cfg.vocab);
        let mut gpu = emu_backend(&cfg, &wq, seq.len(), matvec_only(), false);
        let desc = gpu.describe();
        assert!(
            desc.contains(&format!("weights {formats} on device")),
            "{desc}"
        );
        if label == "Q4_K_M" {
            let (dev, file) = (gpu.weight_bytes(), matrix_bytes(&wq));
            assert!(dev <= file * 106 / 100 + VECTOR_BYTES, "{dev} for {file}");
        }
        let g = support::all_logits(&mut gpu, &seq);
        let f = support::all_logits(&mut cpu_backend(&cfg, &wf, seq.len()), &seq);
        let c = support::all_logits(&mut cpu_backend(&cfg, &wq, seq.len()), &seq);
        let opts = CudaOptions {
            gemm_min_rows: 4,
            ..CudaOptions::default()
        };
        let mut gemm = emu_backend(&cfg, &wq, seq.len(), opts, true);
        assert!(gemm.uses_gemm());
        let e = support::all_logits(&mut gemm, &seq);
        let (d, dc, de) = (max_diff(&g, &f), max_diff(&g, &c), max_diff(&e, &f));
        eprintln!(
            "{label}: worst logit difference {d:.2e} (f32 weights), {dc:.2e} (CPU on the \
             quantized weights), {de:.2e} (GEMM path)"
        );
        assert!(d <= TOLERANCE, "{label}: {d}");
        assert!(dc <= QUANTIZED_TOLERANCE, "{label}: CPU {dc}");
        assert!(de <= GEMM_TOLERANCE, "{label}: GEMM {de}");
    }
}

#[test]
fn reference_fixture_models_match_the_cpu() {
    if skip() {
        return;
    }
    let dir = support::fixtures().join("tiny");
    // GGUF llama (interleaved RoPE) in three block formats; HF qwen2 (neox, biases) and
    // llama3 (scaled RoPE).
    for name in [
        "llama.Q4_1.gguf",
        "llama.Q8_0.gguf",
        "llama_k256.Q4_K_M.gguf",
        "qwen2",
        "llama3",
    ] {
        let model = Model::load(&dir.join(name)).expect("fixture");
        let (cfg, w) = (model.config.clone(), Arc::clone(&model.weights));
        let seq = tokens(24, cfg.vocab);
        let mut gpu = emu_backend(&cfg, &w, seq.len(), matvec_only(), false);
        let mut cpu = cpu_backend(&cfg, &w, seq.len());
        let d = max_diff(
            &support::all_logits(&mut gpu, &seq),
            &support::all_logits(&mut cpu, &seq),
        );
        eprintln!("{name}: worst logit difference {d:.2e}");
        // Every fixture but the Hugging Face folders (f32) has quantized weights.
        let tol = if name.ends_with(".gguf") {
            QUANTIZED_TOLERANCE
        } else {
            TOLERANCE
        };
        assert!(d <= tol, "{name}: {d}");
    }
}

#[test]
fn batched_decode_equals_solo_bit_for_bit() {
    if skip() {
        return;
    }
    let tiny = TinyLlama {
        dtype: DType::Q4_1,
        vocab: 96,
        ..TinyLlama::default()
    };
    let (cfg, w) = Model::load_weights(&tiny.write_temp()).expect("load");
    let prompts = vec![
        tokens(5, cfg.vocab),
        tokens(19, cfg.vocab)[3..].to_vec(),
        vec![7, 8],
    ];
    let mut b = emu_backend(&cfg, &w, 3 * 8 * 16, matvec_only(), false);
    let solo = decode(&mut b, &prompts, 6, false);
    let batched = decode(&mut b, &prompts, 6, true);
    for (s, (a, c)) in solo.iter().zip(&batched).enumerate() {
        for (step, (x, y)) in a.iter().zip(c).enumerate() {
            assert!(
                x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "sequence {s} step {step}: batched logits differ from solo"
            );
        }
    }
    // And the tokens agree with the CPU backend's.
    let mut cpu = cpu_backend(&cfg, &w, 3 * 8 * 16);
    let cpu_solo = decode(&mut cpu, &prompts, 6, false);
    for (s, (g, c)) in solo.iter().zip(&cpu_solo).enumerate() {
        let gt: Vec<u32> = g.iter().map(|r| support::argmax(r)).collect();
        let ct: Vec<u32> = c.iter().map(|r| support::argmax(r)).collect();
        assert_eq!(gt, ct, "sequence {s}: greedy tokens");
        for (x, y) in g.iter().zip(c) {
            let d = max_diff(x, y);
            assert!(d <= QUANTIZED_TOLERANCE, "sequence {s}: {d}");
        }
    }
}

#[test]
fn gemm_path_and_mixed_steps_match_the_cpu() {
    if skip() {
        return;
    }
    let tiny = TinyLlama {
        dtype: DType::Q8_0,
        qkv_bias: true,
        ..TinyLlama::default()
    };
    let (cfg, w) = Model::load_weights(&tiny.write_temp()).expect("load");
    let opts = CudaOptions {
        prefill_gemm: true,
        gemm_min_rows: 4,
        graphs: false,
    };
    let mut gpu = emu_backend(&cfg, &w, 128, opts, true);
    assert!(gpu.uses_gemm());
    let mut cpu = cpu_backend(&cfg, &w, 128);
    // One step: a decode (matvec row) next to a 9-token prompt chunk (GEMM rows) of another
    // sequence, after the decoding sequence's own 6-token prefill.
    let a = tokens(6, cfg.vocab);
    let bseq = tokens(9, cfg.vocab);
    let (ta, tb) = ([0u32, 1, 2], [3u32, 4, 5]);
    let run = |be: &mut dyn Backend| {
        let mut l = Vec::new();
        be.forward(
            &[SeqChunk {
                tokens: &a,
                start_pos: 0,
                blocks: &ta,
                all_logits: true,
                no_logits: false,
            }],
            &mut l,
        )
        .expect("prefill");
        let mut l2 = Vec::new();
        be.forward(
            &[
                SeqChunk {
                    tokens: &[17],
                    start_pos: a.len(),
                    blocks: &ta,
                    all_logits: false,
                    no_logits: false,
                },
                SeqChunk {
                    tokens: &bseq,
                    start_pos: 0,
                    blocks: &tb,
                    all_logits: true,
                    no_logits: false,
                },
            ],
            &mut l2,
        )
        .expect("mixed step");
        l.extend(l2);
        l
    };
    let g = run(&mut gpu);
    let c = run(&mut cpu);
    let d = max_diff(&g, &c);
    eprintln!("GEMM path (f16 weights and activations): worst logit difference {d:.2e}");
    // Q8_0 weights: the CPU's 8-bit activations against the GEMM path's f16 ones.
    assert!(d <= QUANTIZED_TOLERANCE, "{d}");
}

#[test]
fn graph_replay_gives_the_same_tokens() {
    if skip() {
        return;
    }
    let tiny = TinyLlama {
        dtype: DType::Q4_0,
        ..TinyLlama::default()
    };
    let (cfg, w) = Model::load_weights(&tiny.write_temp()).expect("load");
    let prompts = vec![tokens(7, cfg.vocab)];
    let mut plain = emu_backend(&cfg, &w, 128, matvec_only(), false);
    let graphs = CudaOptions {
        graphs: true,
        ..matvec_only()
    };
    let mut replayed = emu_backend(&cfg, &w, 128, graphs, false);
    let a = decode(&mut plain, &prompts, 5, false);
    let b = decode(&mut replayed, &prompts, 5, false);
    assert_eq!(a, b);
    assert!(replayed.options().graphs);
    assert_eq!(replayed.gpu().replays, 5);
}

#[test]
fn invalid_steps_are_refused_like_on_the_cpu() {
    if skip() {
        return;
    }
    let (cfg, w) = Model::load_weights(&TinyLlama::default().write_temp()).expect("load");
    let mut gpu = emu_backend(&cfg, &w, 32, matvec_only(), false);
    let blocks = [0u32];
    let mut l = Vec::new();
    for (toks, start) in [
        (vec![1u32; 17], 0),
        (vec![1], 16),
        (vec![], 0),
        (vec![999], 0),
    ] {
        let r = gpu.forward(
            &[SeqChunk {
                tokens: &toks,
                start_pos: start,
                blocks: &blocks,
                all_logits: false,
                no_logits: false,
            }],
            &mut l,
        );
        assert!(r.is_err(), "{} tokens at {start}", toks.len());
    }
    let r = gpu.forward(
        &[SeqChunk {
            tokens: &[1],
            start_pos: 0,
            blocks: &[99],
            all_logits: false,
            no_logits: false,
        }],
        &mut l,
    );
    assert!(r.is_err());
    assert!(gpu.describe().starts_with("emu kernel emulator"));
}

/// The default model through the emulated GPU path: a short chat prompt's greedy tokens and
/// logits against the CPU's. Slow (the emulator runs each GPU thread as a fiber), so ignored;
/// run with `cargo test --features cuda --test cuda_emu -- --ignored`.
#[test]
#[ignore = "minutes on the emulator; run explicitly"]
fn default_model_on_the_emulator_matches_the_cpu() {
    if skip() {
        return;
    }
    let Some(path) = support::default_model() else {
        return;
    };
    let model = Model::load(&path).expect("load");
    let (cfg, w) = (model.config.clone(), Arc::clone(&model.weights));
    let prompt = model
        .tokenizer
        .encode(
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
            true,
        )
        .expect("encode");
    let steps = 3;
    let positions = 8 * 16; // `decode` gives each sequence 8 blocks
    for (label, opts, gemm) in [
        ("matvec", matvec_only(), false),
        (
            "GEMM",
            CudaOptions {
                gemm_min_rows: 4,
                ..CudaOptions::default()
            },
            true,
        ),
    ] {
        let mut gpu = emu_backend(&cfg, &w, positions, opts, gemm);
        let mut cpu = cpu_backend(&cfg, &w, positions);
        let g = decode(&mut gpu, std::slice::from_ref(&prompt), steps, false);
        let c = decode(&mut cpu, std::slice::from_ref(&prompt), steps, false);
        let d = g[0]
            .iter()
            .zip(&c[0])
            .map(|(a, b)| max_diff(a, b))
            .fold(0.0, f32::max);
        let gt: Vec<u32> = g[0].iter().map(|r| support::argmax(r)).collect();
        let ct: Vec<u32> = c[0].iter().map(|r| support::argmax(r)).collect();
        eprintln!("SmolLM2 ({label}): tokens {gt:?} vs CPU {ct:?}, worst logit difference {d:.3}");
        assert_eq!(gt, ct);
        assert!(d <= 0.15, "{label}: {d}");
    }
}

/// Span names opened (in any thread) while a closure runs under a recording subscriber.
fn opened_spans(f: impl FnOnce()) -> Vec<String> {
    use std::sync::Mutex;
    use tracing_subscriber::layer::{Context, SubscriberExt};

    struct Record(Arc<Mutex<Vec<String>>>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Record {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: Context<'_, S>,
        ) {
            if let Ok(mut v) = self.0.lock() {
                v.push(attrs.metadata().name().to_string());
            }
        }
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Record(Arc::clone(&seen)));
    tracing::subscriber::with_default(subscriber, f);
    seen.lock().expect("record").clone()
}

/// Building a backend compiles its kernels inside the start-up span the contract names
/// (`slotlight.startup.kernel_compile`), so a slow NVRTC compile shows in the start-up trace.
#[test]
fn kernel_compile_is_a_start_up_span() {
    if skip() {
        return;
    }
    let path = TinyLlama::default().write_temp();
    let (cfg, w) = Model::load_weights(&path).expect("load");
    let spans = opened_spans(|| {
        emu_backend(&cfg, &w, 32, matvec_only(), false);
    });
    assert_eq!(
        spans
            .iter()
            .filter(|s| *s == slotlight_otel::span::STARTUP_KERNEL_COMPILE)
            .count(),
        1,
        "{spans:?}"
    );
}

/// Largest logit difference from the CPU of the f32 fixtures of the newer families (QK norm,
/// post-norms, GeGLU, scaled embeddings, soft-capping, sliding windows, two RoPE bases), on the
/// matvec path. Both backends compute in f32 and store keys and values in f16; they sum in
/// different orders (the CPU's SIMD dot products against the kernels' warp trees), and a key
/// that lands on the other side of an f16 rounding step moves the logits further through the
/// tiny Gemma 3's √hidden-scaled tied embeddings (logits up to 38, where the Llama fixtures
/// stay near 15): so [`TOLERANCE`] scaled by the logits' size over 15.
fn family_tolerance(base: f32, logits: &[f32]) -> f32 {
    let scale = logits.iter().fold(0f32, |m, v| m.max(v.abs()));
    base * (scale / 15.0).max(1.0)
}

#[test]
fn new_families_match_the_cpu_on_every_path() {
    if skip() {
        return;
    }
    let dir = support::fixtures().join("tiny");
    for name in [
        "qwen3",
        "qwen3.F32.gguf",
        "gemma2",
        "gemma2.F32.gguf",
        "gemma3",
        "gemma3.F32.gguf",
    ] {
        let model = Model::load(&dir.join(name)).expect("fixture");
        let (cfg, w) = (model.config.clone(), Arc::clone(&model.weights));
        // 24 positions: three times the fixtures' 8-position window.
        let seq = tokens(24, cfg.vocab);
        let c = support::all_logits(&mut cpu_backend(&cfg, &w, seq.len()), &seq);
        let mut gpu = emu_backend(&cfg, &w, seq.len(), matvec_only(), false);
        let d = max_diff(&support::all_logits(&mut gpu, &seq), &c);
        let opts = CudaOptions {
            gemm_min_rows: 4,
            ..CudaOptions::default()
        };
        let mut gemm = emu_backend(&cfg, &w, seq.len(), opts, true);
        assert!(gemm.uses_gemm());
        let de = max_diff(&support::all_logits(&mut gemm, &seq), &c);
        eprintln!(
            "{name} ({}): worst logit difference {d:.2e} (matvec), {de:.2e} (GEMM), logits up to {:.1}",
            cfg.arch.name(),
            c.iter().fold(0f32, |m, v| m.max(v.abs()))
        );
        assert!(d <= family_tolerance(TOLERANCE, &c), "{name}: matvec {d}");
        assert!(
            de <= family_tolerance(GEMM_TOLERANCE, &c),
            "{name}: GEMM {de}"
        );
    }
}

/// Decoding past the window on the new families: graph replay gives the plain launches'
/// logits bit for bit, a batch gives each sequence's solo logits bit for bit, and the greedy
/// tokens are the CPU's.
#[test]
fn new_families_decode_like_the_cpu_with_graphs_and_batches() {
    if skip() {
        return;
    }
    let dir = support::fixtures().join("tiny");
    for name in ["qwen3", "gemma2", "gemma3"] {
        let model = Model::load(&dir.join(name)).expect("fixture");
        let (cfg, w) = (model.config.clone(), Arc::clone(&model.weights));
        let prompts = vec![tokens(11, cfg.vocab), tokens(5, cfg.vocab)[1..].to_vec()];
        let mut plain = emu_backend(&cfg, &w, 2 * 8 * 16, matvec_only(), false);
        let solo = decode(&mut plain, &prompts, 12, false);
        let batched = decode(&mut plain, &prompts, 12, true);
        assert_eq!(solo, batched, "{name}: batched logits differ from solo");
        let graphs = CudaOptions {
            graphs: true,
            ..matvec_only()
        };
        let mut replayed = emu_backend(&cfg, &w, 2 * 8 * 16, graphs, false);
        let replay = decode(&mut replayed, &prompts, 12, false);
        assert!(
            replayed.options().graphs,
            "{name}: the graph capture failed"
        );
        assert_eq!(replayed.gpu().replays, 2 * 12, "{name}: steps replayed");
        assert_eq!(solo, replay, "{name}: replayed logits differ");
        let cpu = decode(&mut cpu_backend(&cfg, &w, 2 * 8 * 16), &prompts, 12, false);
        for (s, (g, c)) in solo.iter().zip(&cpu).enumerate() {
            let gt: Vec<u32> = g.iter().map(|r| support::argmax(r)).collect();
            let ct: Vec<u32> = c.iter().map(|r| support::argmax(r)).collect();
            assert_eq!(gt, ct, "{name} sequence {s}: greedy tokens");
            for (x, y) in g.iter().zip(c) {
                let d = max_diff(x, y);
                assert!(
                    d <= family_tolerance(TOLERANCE, y),
                    "{name} sequence {s}: {d}"
                );
            }
        }
    }
}

/// A step mixing a decode row (matvec kernels) with a prompt chunk (GEMM path) on the QK-norm
/// families: both halves of the raw QKV buffer meet in one `qkv_heads` launch.
#[test]
fn new_families_mix_matvec_and_gemm_rows_in_one_step() {
    if skip() {
        return;
    }
    let dir = support::fixtures().join("tiny");
    for name in ["qwen3", "gemma3"] {
        let model = Model::load(&dir.join(name)).expect("fixture");
        let (cfg, w) = (model.config.clone(), Arc::clone(&model.weights));
        let opts = CudaOptions {
            prefill_gemm: true,
            gemm_min_rows: 4,
            graphs: false,
        };
        let mut gpu = emu_backend(&cfg, &w, 128, opts, true);
        let mut cpu = cpu_backend(&cfg, &w, 128);
        let a = tokens(10, cfg.vocab);
        let b = tokens(13, cfg.vocab)[2..].to_vec();
        let (ta, tb) = ([0u32, 1, 2], [3u32, 4, 5]);
        let run = |be: &mut dyn Backend| {
            let mut l = Vec::new();
            be.forward(
                &[SeqChunk {
                    tokens: &a,
                    start_pos: 0,
                    blocks: &ta,
                    all_logits: true,
                    no_logits: false,
                }],
                &mut l,
            )
            .expect("prefill");
            be.forward(
                &[
                    SeqChunk {
                        tokens: &[17],
                        start_pos: a.len(),
                        blocks: &ta,
                        all_logits: false,
                        no_logits: false,
                    },
                    SeqChunk {
                        tokens: &b,
                        start_pos: 0,
                        blocks: &tb,
                        all_logits: true,
                        no_logits: false,
                    },
                ],
                &mut l,
            )
            .expect("mixed step");
            l
        };
        let c = run(&mut cpu);
        let d = max_diff(&run(&mut gpu), &c);
        eprintln!("{name}: mixed matvec + GEMM step, worst logit difference {d:.2e}");
        assert!(d <= family_tolerance(GEMM_TOLERANCE, &c), "{name}: {d}");
    }
}

/// The tiny Gemma 3 fixture (local layers with an 8-position window): config and weights.
fn tiny_gemma3() -> (ModelConfig, Arc<LlamaWeights>) {
    let model = Model::load(&support::fixtures().join("tiny").join("gemma3.F32.gguf"))
        .expect("tiny gemma3");
    (model.config.clone(), Arc::clone(&model.weights))
}

/// The paths the window-pool tests run: matvec only, GEMM rows (on the GEMM-capable
/// emulator) and decodes replayed from graphs; each with whether the emulator does GEMM.
fn windowed_paths() -> [(&'static str, CudaOptions, bool); 3] {
    let gemm = CudaOptions {
        gemm_min_rows: 4,
        ..CudaOptions::default()
    };
    let graphs = CudaOptions {
        graphs: true,
        ..matvec_only()
    };
    [
        ("matvec", matvec_only(), false),
        ("GEMM", gemm, true),
        ("graphs", graphs, false),
    ]
}

/// An emulated backend of `full_blocks` blocks of `bs` positions and, when given, a window
/// pool of `window_blocks` for the local layers.
fn layout_backend(
    cfg: &ModelConfig,
    w: &Arc<LlamaWeights>,
    bs: usize,
    full_blocks: usize,
    window_blocks: Option<usize>,
    opts: &CudaOptions,
    gemm: bool,
) -> GpuBackend<EmuGpu> {
    GpuBackend::with_layout(
        EmuGpu::new(gemm),
        cfg.clone(),
        w,
        bs,
        full_blocks,
        window_blocks,
        opts.clone(),
        "emu".into(),
    )
    .expect("emulated backend")
}

/// Runs `seq` through `b` with each chunk's window-pool table kept by the kv_cache's
/// [`KvPools`], as the scheduler does: chunks of `chunks[i]` tokens (the last one repeated),
/// every row's logits. With `poison`, before each step every window-pool block the sequence
/// does not hold (given back, or never handed out) is filled with NaN, and the table's
/// given-back entries name one of those blocks instead of the sentinel: a kernel that read a
/// position the window has passed would poison the logits. Returns the logits and the most
/// window blocks held at once.
fn windowed_logits(
    b: &mut GpuBackend<EmuGpu>,
    pools: &mut KvPools,
    seq: &[u32],
    chunks: &[usize],
    poison: bool,
) -> (Vec<f32>, usize) {
    let window_blocks = b.windowed_kv().map_or(0, |w| w.blocks);
    let mut s = SeqKv::default();
    let (mut at, mut i, mut most) = (0, 0, 0);
    let mut out = Vec::new();
    while at < seq.len() {
        let n = chunks[i.min(chunks.len() - 1)];
        let end = (at + n).min(seq.len());
        pools.reserve(&mut s, end).expect("full pool");
        pools.reserve_window(&mut s, at, end).expect("window pool");
        most = most.max(s.window.held());
        let mut table = s.window.table.clone();
        if poison {
            let free: Vec<u32> = (0..u32::try_from(window_blocks).expect("blocks"))
                .filter(|b| !table.contains(b))
                .collect();
            b.poison_window_blocks(&free).expect("poison");
            let nan = *free.first().expect("a block the sequence does not hold");
            for e in table.iter_mut().filter(|e| **e == RELEASED) {
                *e = nan;
            }
        }
        let windows: Vec<&[u32]> = if window_blocks > 0 {
            vec![&table]
        } else {
            Vec::new()
        };
        let chunk = SeqChunk {
            tokens: &seq[at..end],
            start_pos: at,
            blocks: &s.full.table,
            all_logits: true,
            no_logits: false,
        };
        b.forward_windowed(&[chunk], &windows, &mut out)
            .expect("windowed step");
        at = end;
        i += 1;
        pools.register_full(&mut s, seq, at);
        pools.slide(&mut s, at);
    }
    pools.release(&mut s);
    (out, most)
}

/// The tiny Gemma 3 (local layers with an 8-position window) on the emulator with its local
/// layers' KV in a window pool of 6 blocks of 4 positions, far fewer than the 96-position
/// sequence needs: the logits past the window equal the CPU's (every layer whole) within the
/// family's tolerance and the emulator's every-layer-whole run bit for bit, on the matvec and
/// the GEMM paths and with decodes replayed from a graph, while every block the window has
/// passed holds NaN.
#[test]
fn windowed_kv_matches_the_cpu_past_the_window_and_never_reads_released_blocks() {
    if skip() {
        return;
    }
    let (cfg, w) = tiny_gemma3();
    let window = cfg
        .family
        .sliding_window
        .as_ref()
        .expect("gemma3 has local layers")
        .window;
    assert_eq!(window, 8);
    let (bs, full_blocks, window_blocks) = (4, 32, 6);
    let seq = tokens(96, cfg.vocab);
    let cpu = support::all_logits(&mut cpu_backend(&cfg, &w, seq.len()), &seq);
    for (path, opts, gemm) in windowed_paths() {
        let build =
            |window_blocks| layout_backend(&cfg, &w, bs, full_blocks, window_blocks, &opts, gemm);
        let mut whole = build(None);
        assert!(whole.windowed_kv().is_none());
        let mut windowed = build(Some(window_blocks));
        let wk = windowed.windowed_kv().expect("a window pool");
        assert_eq!((wk.window, wk.blocks), (window, window_blocks));
        // A prompt chunk of 10 (GEMM rows on the GEMM path), chunks of 5, then decodes.
        let plan = [10, 5, 5, 1];
        let mut pools = KvPools::whole(full_blocks, bs);
        let (reference, _) = windowed_logits(&mut whole, &mut pools, &seq, &plan, false);
        let mut pools = KvPools::windowed(full_blocks, bs, window, window_blocks);
        let (got, most) = windowed_logits(&mut windowed, &mut pools, &seq, &plan, true);
        assert!(
            got.iter().all(|v| v.is_finite()),
            "{path}: a released block was read"
        );
        // The same with the sentinel in the given-back entries, as the scheduler sends them.
        let mut pools = KvPools::windowed(full_blocks, bs, window, window_blocks);
        let (plain, _) = windowed_logits(&mut windowed, &mut pools, &seq, &plan, false);
        assert_eq!(
            plain, got,
            "{path}: the sentinel and poisoned tables differ"
        );
        assert_eq!(got, reference, "{path}: windowed and whole differ");
        let d = max_diff(&got, &cpu);
        eprintln!("{path}: windowed KV, worst logit difference from the CPU {d:.2e}");
        assert!(d <= family_tolerance(GEMM_TOLERANCE, &cpu), "{path}: {d}");
        // The local layers held the window's blocks and a chunk's: never the sequence's 24.
        assert!(most <= 5, "{path}: {most} window blocks");
        if opts.graphs {
            // The decodes replayed one graph, its window tables uploaded beside it.
            assert!(windowed.options().graphs, "the graph capture failed");
            assert!(windowed.gpu().replays > 0, "no step replayed");
        }
    }
}

/// The window pool's bytes stay bounded: a sequence many windows long runs through a window
/// pool of a fixed few blocks, so the local layers' KV does not grow with the sequence, and
/// the whole KV of the windowed backend is the global layers' for every block plus that pool.
#[test]
fn windowed_kv_bytes_stay_bounded_for_a_long_sequence() {
    if skip() {
        return;
    }
    let (cfg, w) = tiny_gemma3();
    let window = 8;
    let (bs, full_blocks) = (4, 64);
    let window_blocks = window_pool_blocks(
        &cfg,
        bs,
        full_blocks,
        &SchedulerConfig {
            batch: 1,
            prefill_chunk: 4,
            mixed_prefill_chunk: 4,
            // No room for sessions' windows: the pool is the running sequence's alone.
            session_windows: slotlight_engine::scheduler::SessionWindows::off(),
            ..SchedulerConfig::default()
        },
    )
    .expect("a model with local layers");
    let mut b = layout_backend(
        &cfg,
        &w,
        bs,
        full_blocks,
        Some(window_blocks),
        &matvec_only(),
        false,
    );
    let wk = b.windowed_kv().expect("a window pool");
    let locals = (0..cfg.layers)
        .filter(|&l| cfg.family.window(l).is_some())
        .count();
    assert!(locals > 0 && locals < cfg.layers);
    assert_eq!(wk.block_bytes, kv_block_bytes(&cfg, locals, bs));
    assert_eq!(
        b.kv_block_bytes(),
        kv_block_bytes(&cfg, cfg.layers - locals, bs)
    );
    assert_eq!(
        b.kv_bytes(),
        full_blocks * b.kv_block_bytes() + window_blocks * wk.block_bytes
    );
    // 240 positions, 30 windows, through a window pool of a handful of blocks.
    let seq = tokens(240, cfg.vocab);
    assert!(window_blocks * bs < seq.len() / 4);
    let mut pools = KvPools::windowed(full_blocks, bs, window, window_blocks);
    let (logits, most) = windowed_logits(&mut b, &mut pools, &seq, &[4, 1], false);
    assert_eq!(logits.len(), seq.len() * cfg.vocab);
    assert!(logits.iter().all(|v| v.is_finite()));
    let per_seq = window.saturating_sub(1).div_ceil(bs) + 2;
    assert!(most <= per_seq, "{most} window blocks held at once");
    // What a sequence holds: its local layers' part stops growing past the window.
    let held = |n| kv_bytes_per_sequence(&cfg, bs, n, true);
    let global = |n: usize| n.div_ceil(bs) * kv_block_bytes(&cfg, cfg.layers - locals, bs);
    assert_eq!(held(240) - global(240), held(120) - global(120));
    assert!(held(240) < kv_bytes_per_sequence(&cfg, bs, 240, false));
}

/// Several sequences through `b` in the same steps, each with its own window-pool table, as
/// the scheduler batches them: sequence `i` joins at step `joins[i]`, runs chunks of `chunk`
/// tokens until `prompt` positions, then one token a step (its own next token, so the rows
/// are a prefill and teacher-forced decodes). Before each step every window-pool block no
/// sequence of the step holds is filled with NaN, and each table's given-back entries name
/// one of those blocks. Returns each sequence's logits, every row.
fn windowed_batch_logits(
    b: &mut GpuBackend<EmuGpu>,
    pools: &mut KvPools,
    seqs: &[Vec<u32>],
    joins: &[usize],
    prompt: usize,
    chunk: usize,
) -> Vec<Vec<f32>> {
    let window_blocks = b.windowed_kv().map_or(0, |w| w.blocks);
    let vocab = b.config().vocab;
    let mut kv: Vec<SeqKv> = seqs.iter().map(|_| SeqKv::default()).collect();
    let mut at = vec![0usize; seqs.len()];
    let mut out = vec![Vec::new(); seqs.len()];
    let mut step = 0;
    while at.iter().zip(seqs).any(|(a, s)| *a < s.len()) {
        let active: Vec<usize> = (0..seqs.len())
            .filter(|&i| joins[i] <= step && at[i] < seqs[i].len())
            .collect();
        let mut ends = Vec::new();
        for &i in &active {
            let n = if at[i] < prompt { chunk } else { 1 };
            let end = (at[i] + n).min(seqs[i].len());
            pools.reserve(&mut kv[i], end).expect("full pool");
            pools
                .reserve_window(&mut kv[i], at[i], end)
                .expect("window pool");
            ends.push(end);
        }
        let held: Vec<u32> = active
            .iter()
            .flat_map(|&i| kv[i].window.table.iter().copied())
            .collect();
        let free: Vec<u32> = (0..u32::try_from(window_blocks).expect("blocks"))
            .filter(|b| !held.contains(b))
            .collect();
        b.poison_window_blocks(&free).expect("poison");
        let nan = *free.first().expect("a block no sequence holds");
        let tables: Vec<Vec<u32>> = active
            .iter()
            .map(|&i| {
                let t = kv[i].window.table.iter();
                t.map(|&e| if e == RELEASED { nan } else { e }).collect()
            })
            .collect();
        let mut logits = Vec::new();
        {
            let windows: Vec<&[u32]> = tables.iter().map(Vec::as_slice).collect();
            let chunks: Vec<SeqChunk<'_>> = active
                .iter()
                .zip(&ends)
                .map(|(&i, &end)| SeqChunk {
                    tokens: &seqs[i][at[i]..end],
                    start_pos: at[i],
                    blocks: &kv[i].full.table,
                    all_logits: true,
                    no_logits: false,
                })
                .collect();
            b.forward_windowed(&chunks, &windows, &mut logits)
                .expect("batched windowed step");
        }
        let mut off = 0;
        for (&i, &end) in active.iter().zip(&ends) {
            let rows = (end - at[i]) * vocab;
            out[i].extend_from_slice(&logits[off..off + rows]);
            off += rows;
            at[i] = end;
            pools.register_full(&mut kv[i], &seqs[i], end);
            pools.slide(&mut kv[i], end);
        }
        assert_eq!(off, logits.len(), "one row of logits per token");
        step += 1;
    }
    for s in &mut kv {
        pools.release(s);
    }
    out
}

/// Batched steps with the window pool: three sequences of the tiny Gemma 3 (8-position
/// window), joining at different steps so that one prefills while others decode, each with
/// its own window-pool table in one shared pool, every block none of them holds NaN. Each
/// sequence's logits equal its own run alone bit for bit on the matvec path and with decodes
/// replayed from graphs, and the CPU's within the family's tolerance on every path (GEMM
/// included, whose rows depend on the batch).
#[test]
fn windowed_kv_in_batched_steps_matches_each_sequence_alone() {
    if skip() {
        return;
    }
    let (cfg, w) = tiny_gemma3();
    let window = 8;
    let (bs, full_blocks, window_blocks) = (4, 96, 18);
    let seqs = vec![
        tokens(64, cfg.vocab),
        tokens(80, cfg.vocab)[5..].to_vec(),
        tokens(40, cfg.vocab)[2..].to_vec(),
    ];
    let joins = [0, 3, 9];
    let (prompt, chunk) = (12, 5);
    let cpu: Vec<Vec<f32>> = seqs
        .iter()
        .map(|s| support::all_logits(&mut cpu_backend(&cfg, &w, s.len()), s))
        .collect();
    for (path, opts, gemm) in windowed_paths() {
        let mut b = layout_backend(&cfg, &w, bs, full_blocks, Some(window_blocks), &opts, gemm);
        let mut pools = KvPools::windowed(full_blocks, bs, window, window_blocks);
        let batched = windowed_batch_logits(&mut b, &mut pools, &seqs, &joins, prompt, chunk);
        for (i, s) in seqs.iter().enumerate() {
            let got = &batched[i];
            assert_eq!(got.len(), s.len() * cfg.vocab);
            assert!(
                got.iter().all(|v| v.is_finite()),
                "{path}: sequence {i} read a block it does not hold"
            );
            let d = max_diff(got, &cpu[i]);
            eprintln!(
                "{path}: batched windowed sequence {i}, worst difference from the CPU {d:.2e}"
            );
            assert!(
                d <= family_tolerance(GEMM_TOLERANCE, &cpu[i]),
                "{path} {i}: {d}"
            );
            if !gemm {
                let mut pools = KvPools::windowed(full_blocks, bs, window, window_blocks);
                let (alone, _) =
                    windowed_logits(&mut b, &mut pools, s, &[chunk, chunk, chunk, 1], true);
                assert!(
                    alone
                        .iter()
                        .zip(got)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{path}: sequence {i} batched differs from alone"
                );
            }
        }
        if opts.graphs {
            assert!(b.gpu().replays > 0, "no batched step replayed");
        }
    }
}

/// A draft's verification (speculative decoding) on the emulated device: one chunk of K + 1
/// rows, every row's logits, gives each row the logits a one-token step at its position gives,
/// bit for bit, for chunks of up to `exact_rows` rows: any length on the matvec path, and
/// below the GEMM threshold with the GEMM path on (longer chunks would take the GEMM).
#[test]
fn a_verification_chunk_equals_one_token_steps_bit_for_bit() {
    if skip() {
        return;
    }
    let dir = support::fixtures().join("tiny");
    let mut models: Vec<(String, ModelConfig, Arc<LlamaWeights>)> = ["qwen3", "gemma3"]
        .iter()
        .map(|name| {
            let m = Model::load(&dir.join(name)).expect("fixture");
            (name.to_string(), m.config.clone(), Arc::clone(&m.weights))
        })
        .collect();
    let tiny = TinyLlama {
        dtype: DType::Q4_1,
        vocab: 96,
        ..TinyLlama::default()
    };
    let (cfg, w) = Model::load_weights(&tiny.write_temp()).expect("load");
    models.push(("llama q4_1".into(), cfg, w));
    for (name, cfg, w) in &models {
        for (opts, gemm) in [(matvec_only(), false), (CudaOptions::default(), true)] {
            let mut b = emu_backend(cfg, w, 8 * 16, opts.clone(), gemm);
            let rows = b.exact_rows().min(12);
            if gemm {
                assert_eq!(b.exact_rows(), opts.gemm_min_rows - 1, "{name}");
            } else {
                assert_eq!(b.exact_rows(), usize::MAX, "{name}");
            }
            let prompt = tokens(21, cfg.vocab);
            let draft = tokens(rows + 3, cfg.vocab)[3..].to_vec();
            let table: Vec<u32> = (0..8).collect();
            let prefill = |b: &mut GpuBackend<EmuGpu>| {
                let mut logits = Vec::new();
                b.forward(
                    &[SeqChunk {
                        tokens: &prompt,
                        start_pos: 0,
                        blocks: &table,
                        all_logits: false,
                        no_logits: false,
                    }],
                    &mut logits,
                )
                .expect("prefill");
            };
            prefill(&mut b);
            let mut steps = Vec::new();
            for (i, t) in draft.iter().enumerate() {
                let mut logits = Vec::new();
                b.forward(
                    &[SeqChunk {
                        tokens: std::slice::from_ref(t),
                        start_pos: prompt.len() + i,
                        blocks: &table,
                        all_logits: false,
                        no_logits: false,
                    }],
                    &mut logits,
                )
                .expect("step");
                steps.extend(logits);
            }
            prefill(&mut b);
            let mut verified = Vec::new();
            b.forward(
                &[SeqChunk {
                    tokens: &draft,
                    start_pos: prompt.len(),
                    blocks: &table,
                    all_logits: true,
                    no_logits: false,
                }],
                &mut verified,
            )
            .expect("verify");
            assert_eq!(verified.len(), steps.len(), "{name}");
            let differ = verified
                .iter()
                .zip(&steps)
                .position(|(x, y)| x.to_bits() != y.to_bits());
            assert_eq!(
                differ.map(|i| i / cfg.vocab),
                None,
                "{name} (gemm {gemm}): the first row whose logits differ"
            );
        }
    }
}
