//! Helpers shared by the CUDA tests (`cuda_emu.rs`, `cuda_parity.rs`); included with
//! `#[path]`, and also built on its own as an empty test crate.
#![allow(dead_code, missing_docs)]

use std::path::PathBuf;
use std::sync::Arc;

use half::f16;
use slotlight_engine::backend::{Backend, SeqChunk};
use slotlight_engine::model::config::ModelConfig;
use slotlight_engine::model::llama::LlamaWeights;
use slotlight_engine::model::loader::Model;
use slotlight_engine::model::testing::{FixtureRng, TinyLlama};
use slotlight_engine::model::weights::{DType, Storage, Tensor, dequantize};

/// The engine's test fixtures: under `$SLOTLIGHT_ENGINE_DIR` when set (prebuilt test binaries
/// run on another machine, see `scripts/gpu-check.sh`), else this crate's folder.
pub fn fixtures() -> PathBuf {
    std::env::var_os("SLOTLIGHT_ENGINE_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("tests")
        .join("fixtures")
}

/// Index of the largest value.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    u32::try_from(best).expect("index")
}

pub fn cpu_backend(cfg: &ModelConfig, w: &Arc<LlamaWeights>, positions: usize) -> impl Backend {
    let pool = Arc::new(slotlight_engine::backend::cpu::pool::ComputePool::new(2));
    slotlight_engine::backend::cpu::CpuBackend::new(
        cfg.clone(),
        Arc::clone(w),
        16,
        positions.div_ceil(16) + 1,
        pool,
    )
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| u32::try_from((i * 37 + 11) % vocab).expect("token"))
        .collect()
}

/// Prefills `prompts` one at a time, then decodes `steps` greedy tokens either each sequence
/// alone or all in one batch; returns every decode step's logits per sequence.
pub fn decode(
    b: &mut dyn Backend,
    prompts: &[Vec<u32>],
    steps: usize,
    batched: bool,
) -> Vec<Vec<Vec<f32>>> {
    let vocab = b.config().vocab;
    let per_seq = 8;
    let tables: Vec<Vec<u32>> = (0..prompts.len())
        .map(|s| {
            (0..per_seq)
                .map(|i| u32::try_from(s * per_seq + i).expect("block"))
                .collect()
        })
        .collect();
    let mut next = Vec::new();
    for (s, p) in prompts.iter().enumerate() {
        let mut logits = Vec::new();
        b.forward(
            &[SeqChunk {
                tokens: p,
                start_pos: 0,
                blocks: &tables[s],
                all_logits: false,
                no_logits: false,
            }],
            &mut logits,
        )
        .expect("prefill");
        next.push(argmax(&logits));
    }
    let mut pos: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let mut out = vec![Vec::new(); prompts.len()];
    for _ in 0..steps {
        let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let groups: Vec<Vec<usize>> = if batched {
            vec![(0..prompts.len()).collect()]
        } else {
            (0..prompts.len()).map(|s| vec![s]).collect()
        };
        for g in groups {
            let chunks: Vec<SeqChunk<'_>> = g
                .iter()
                .map(|&s| SeqChunk {
                    tokens: &toks[s],
                    start_pos: pos[s],
                    blocks: &tables[s],
                    all_logits: false,
                    no_logits: false,
                })
                .collect();
            let mut logits = Vec::new();
            b.forward(&chunks, &mut logits).expect("decode");
            for (i, &s) in g.iter().enumerate() {
                let row = logits[i * vocab..(i + 1) * vocab].to_vec();
                next[s] = argmax(&row);
                out[s].push(row);
            }
        }
        for p in &mut pos {
            *p += 1;
        }
    }
    out
}

/// The block types that gained device kernels with the K-quants (beside Q4_0, Q4_1, Q8_0).
pub const NEW_TYPES: [DType; 9] = [
    DType::Q5_0,
    DType::Q5_1,
    DType::IQ4NL,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::IQ4XS,
];

/// The stored type of each matrix of a synthetic model.
#[derive(Debug, Clone, Copy)]
pub struct MatrixTypes {
    pub q: DType,
    pub k: DType,
    pub v: DType,
    pub o: DType,
    pub gate: DType,
    pub up: DType,
    pub down: DType,
    pub embed: DType,
    pub output: DType,
}

impl MatrixTypes {
    /// Every matrix in `d`.
    pub fn all(d: DType) -> Self {
        Self {
            q: d,
            k: d,
            v: d,
            o: d,
            gate: d,
            up: d,
            down: d,
            embed: d,
            output: d,
        }
    }

    /// A llama.cpp Q4_K_M file's mix: Q4_K, with Q6_K for V, the down projection and the
    /// embedding/output.
    pub fn q4_k_m() -> Self {
        Self {
            v: DType::Q6K,
            down: DType::Q6K,
            embed: DType::Q6K,
            output: DType::Q6K,
            ..Self::all(DType::Q4K)
        }
    }

    /// Every section rule at once: Q, K and V in three formats (a Q4_K_M file whose K/V fall
    /// back to Q5_0 looks like this), gate and up in two (stored as F16 on the device).
    pub fn mixed() -> Self {
        Self {
            q: DType::Q4K,
            k: DType::Q5_0,
            v: DType::Q6K,
            o: DType::Q3K,
            gate: DType::Q4K,
            up: DType::Q5K,
            down: DType::IQ4XS,
            embed: DType::Q5_1,
            output: DType::Q2K,
        }
    }
}

/// Where a block of `dtype` keeps its f16 fields (scale, minimum).
fn f16_fields(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q6K => &[208],
        _ => &[0],
    }
}

/// A `rows × k` tensor of `dtype` of random blocks (every code, sub-scale and high-bit
/// pattern), each block's f16 fields scaled so that its largest weight is about `max_abs`.
pub fn random_quantized(
    name: &str,
    dtype: DType,
    rows: usize,
    k: usize,
    max_abs: f32,
    rng: &mut FixtureRng,
) -> Tensor {
    let (bb, be) = (dtype.block_bytes(), dtype.block_elems());
    let mut bytes = Vec::with_capacity(rows * k / be * bb);
    let mut w = vec![0f32; be];
    for _ in 0..rows * k / be {
        let mut blk: Vec<u8> = (0..bb)
            .map(|_| rng.next_f32().to_bits().to_le_bytes()[1])
            .collect();
        let field: Vec<f32> = f16_fields(dtype)
            .iter()
            .map(|_| {
                let r = rng.next_f32();
                r.signum() * (0.5 + 0.5 * r.abs())
            })
            .collect();
        let set = |blk: &mut Vec<u8>, c: f32| {
            for (&o, v) in f16_fields(dtype).iter().zip(&field) {
                blk[o..o + 2].copy_from_slice(&f16::from_f32(v * c).to_le_bytes());
            }
        };
        set(&mut blk, 1.0);
        dequantize(dtype, &blk, &mut w);
        let m = w.iter().fold(0f32, |a, x| a.max(x.abs()));
        set(&mut blk, if m > 0.0 { max_abs / m } else { 0.0 });
        bytes.extend_from_slice(&blk);
    }
    Tensor::new(
        name.into(),
        dtype,
        vec![rows, k],
        Storage::Owned(Arc::new(bytes)),
    )
}

/// The same tensor dequantized to F32 (the exact weights: the reference for device kernels
/// that decode in registers).
pub fn f32_copy(t: &Tensor) -> Tensor {
    Tensor::from_f32(t.name(), t.shape().to_vec(), &t.to_f32_vec())
}

/// A tiny Llama (hidden 256, so every super-block type fits its rows; 2 layers, GQA 4/2) whose
/// matrices have the stored types `types` and random blocks; returns its configuration, the
/// quantized weights and the same weights dequantized to F32.
pub fn synthetic_model(
    types: MatrixTypes,
    seed: u64,
) -> (ModelConfig, Arc<LlamaWeights>, Arc<LlamaWeights>) {
    let tiny = TinyLlama {
        hidden: 256,
        ffn: 512,
        heads: 4,
        kv_heads: 2,
        dtype: DType::F32,
        tied: false,
        seed,
        ..TinyLlama::default()
    };
    let (cfg, base) = Model::load_weights(&tiny.write_temp()).expect("load");
    let mut rng = FixtureRng::new(seed);
    let mut q = (*base).clone();
    let mut mat = |t: &Tensor, d: DType, max_abs: f32| {
        let [rows, k] = t.shape() else {
            panic!("{} is not a matrix", t.name())
        };
        random_quantized(t.name(), d, *rows, *k, max_abs, &mut rng)
    };
    let scaled = |k: usize| {
        #[allow(clippy::cast_precision_loss)]
        let s = 3.0 / (k as f32).sqrt();
        s
    };
    let (h, f) = (cfg.hidden, cfg.ffn);
    for b in &mut q.blocks {
        b.wq = mat(&b.wq, types.q, scaled(h));
        b.wk = mat(&b.wk, types.k, scaled(h));
        b.wv = mat(&b.wv, types.v, scaled(h));
        b.wo = mat(&b.wo, types.o, scaled(cfg.q_dim()));
        b.w_gate = mat(&b.w_gate, types.gate, scaled(h));
        b.w_up = mat(&b.w_up, types.up, scaled(h));
        b.w_down = mat(&b.w_down, types.down, scaled(f));
    }
    q.embed = mat(&q.embed, types.embed, 1.0);
    q.output = mat(&q.output, types.output, scaled(h));
    let mut r = q.clone();
    for b in &mut r.blocks {
        for t in [
            &mut b.wq,
            &mut b.wk,
            &mut b.wv,
            &mut b.wo,
            &mut b.w_gate,
            &mut b.w_up,
            &mut b.w_down,
        ] {
            *t = f32_copy(t);
        }
    }
    r.embed = f32_copy(&r.embed);
    r.output = f32_copy(&r.output);
    (cfg, Arc::new(q), Arc::new(r))
}

/// Bytes of the model's matrices as stored in the file.
pub fn matrix_bytes(w: &LlamaWeights) -> usize {
    let per_block: usize = w
        .blocks
        .iter()
        .map(|b| {
            [&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w_down]
                .iter()
                .map(|t| t.bytes().len())
                .sum::<usize>()
        })
        .sum();
    per_block + w.embed.bytes().len() + w.output.bytes().len()
}
