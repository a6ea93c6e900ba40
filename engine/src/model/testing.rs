//! Test fixtures built in code: a GGUF writer and tiny random Llama-family models.
//!
//! Used by unit tests, integration tests and benches; nothing here is used when serving.

// A synthetic model's sizes are small constants of the tests (a few hundred at most): their
// casts to the GGUF's u32 fields and to f32 scales are exact.
#![allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use half::f16;

use super::weights::DType;

/// A fresh, empty, process-unique temporary directory.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("slotlight-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// Writes GGUF v3 files.
#[derive(Default)]
pub struct GgufBuilder {
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<usize>, u32, Vec<u8>)>,
}

fn gguf_str(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

impl GgufBuilder {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }
    /// A string value.
    pub fn kv_str(&mut self, k: &str, v: &str) -> &mut Self {
        self.kvs.push((k.into(), 8, gguf_str(v)));
        self
    }
    /// A u32 value.
    pub fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.kvs.push((k.into(), 4, v.to_le_bytes().to_vec()));
        self
    }
    /// An f32 value.
    pub fn kv_f32(&mut self, k: &str, v: f32) -> &mut Self {
        self.kvs.push((k.into(), 6, v.to_le_bytes().to_vec()));
        self
    }
    /// A bool value.
    pub fn kv_bool(&mut self, k: &str, v: bool) -> &mut Self {
        self.kvs.push((k.into(), 7, vec![u8::from(v)]));
        self
    }
    /// An array of strings.
    pub fn kv_str_array(&mut self, k: &str, v: &[&str]) -> &mut Self {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            b.extend_from_slice(&gguf_str(s));
        }
        self.kvs.push((k.into(), 9, b));
        self
    }
    /// An array of i32.
    pub fn kv_i32_array(&mut self, k: &str, v: &[i32]) -> &mut Self {
        let mut b = 5u32.to_le_bytes().to_vec();
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            b.extend_from_slice(&x.to_le_bytes());
        }
        self.kvs.push((k.into(), 9, b));
        self
    }
    /// An F32 tensor; `shape` is outermost first.
    pub fn tensor_f32(&mut self, name: &str, shape: &[usize], data: &[f32]) -> &mut Self {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor_raw(name, shape, 0, &bytes)
    }
    /// A tensor of `dtype`, quantized from f32 values.
    pub fn tensor_quantized(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        data: &[f32],
    ) -> &mut Self {
        let (id, bytes): (u32, Vec<u8>) = match dtype {
            DType::F32 => (0, data.iter().flat_map(|v| v.to_le_bytes()).collect()),
            DType::F16 => (
                1,
                data.iter()
                    .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                    .collect(),
            ),
            DType::BF16 => (
                30,
                data.iter()
                    .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                    .collect(),
            ),
            DType::Q8_0 => (8, quantize_q8_0(data)),
            DType::Q4_0 => (2, quantize_q4_0(data)),
            DType::Q4_1 => (3, quantize_q4_1(data)),
            _ => panic!("test writer does not quantize {}", dtype.name()),
        };
        self.tensor_raw(name, shape, id, &bytes)
    }
    /// A tensor with a raw GGML type id and bytes.
    pub fn tensor_raw(
        &mut self,
        name: &str,
        shape: &[usize],
        type_id: u32,
        bytes: &[u8],
    ) -> &mut Self {
        self.tensors
            .push((name.into(), shape.to_vec(), type_id, bytes.to_vec()));
        self
    }
    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kvs {
            out.extend_from_slice(&gguf_str(k));
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, shape, ty, data) in &self.tensors {
            out.extend_from_slice(&gguf_str(name));
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in shape.iter().rev() {
                out.extend_from_slice(&(*d as u64).to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(32) * 32;
        }
        while out.len() % 32 != 0 {
            out.push(0);
        }
        let base = out.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(base + off as usize, 0);
            out.extend_from_slice(data);
        }
        while out.len() % 32 != 0 {
            out.push(0);
        }
        out
    }
    /// Writes the file into a fresh temp dir; returns (dir, file path).
    pub fn write_temp(&self) -> (PathBuf, PathBuf) {
        let dir = temp_dir("model");
        let path = dir.join("model.gguf");
        std::fs::write(&path, self.bytes()).expect("write gguf");
        (dir, path)
    }
}

fn f16b(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

/// Reference Q8_0 quantization.
pub fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16b(d));
        #[allow(clippy::cast_possible_truncation)]
        out.extend(b.iter().map(|v| ((v * id).round() as i8).cast_unsigned()));
    }
    out
}

/// Reference Q4_0 quantization.
pub fn quantize_q4_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let max = b
            .iter()
            .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16b(d));
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
        for j in 0..16 {
            out.push(q(b[j]) | (q(b[j + 16]) << 4));
        }
    }
    out
}

/// Reference Q4_1 quantization.
pub fn quantize_q4_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let min = b.iter().copied().fold(f32::INFINITY, f32::min);
        let max = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16b(d));
        out.extend_from_slice(&f16b(min));
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
        for j in 0..16 {
            out.push(q(b[j]) | (q(b[j + 16]) << 4));
        }
    }
    out
}

/// A small deterministic pseudo-random generator for fixtures (xorshift64*).
pub struct FixtureRng(u64);

impl FixtureRng {
    /// A generator whose draws depend on `seed` only.
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Uniform in [-1, 1).
    #[allow(clippy::cast_precision_loss)]
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        (v as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// `n` values scaled by `scale`.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale).collect()
    }
}

/// Shape of a tiny synthetic Llama model.
#[derive(Debug, Clone)]
pub struct TinyLlama {
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Transformer blocks (layers).
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Feed-forward size.
    pub ffn: usize,
    /// Context length.
    pub context: usize,
    /// Type of the matrices.
    pub dtype: DType,
    /// Whether the output projection is tied to the embedding.
    pub tied: bool,
    /// Whether q/k/v carry biases (Qwen2).
    pub qkv_bias: bool,
    /// Seed of the random weights: the same seed writes the same model, byte for byte.
    pub seed: u64,
}

impl Default for TinyLlama {
    fn default() -> Self {
        Self {
            vocab: 96,
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 128,
            context: 256,
            dtype: DType::Q4_1,
            tied: true,
            qkv_bias: false,
            seed: 7,
        }
    }
}

impl TinyLlama {
    /// The model as GGUF bytes, with a byte-level gpt2 vocabulary of `vocab` tokens
    /// (ids 0..=2 are `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) and a ChatML template.
    pub fn gguf(&self) -> GgufBuilder {
        let mut rng = FixtureRng::new(self.seed);
        let mut b = GgufBuilder::new();
        let arch = if self.qkv_bias { "qwen2" } else { "llama" };
        let head_dim = self.hidden / self.heads;
        b.kv_str("general.architecture", arch);
        b.kv_str("general.name", "tiny");
        b.kv_u32(&format!("{arch}.context_length"), self.context as u32);
        b.kv_u32(&format!("{arch}.embedding_length"), self.hidden as u32);
        b.kv_u32(&format!("{arch}.block_count"), self.layers as u32);
        b.kv_u32(&format!("{arch}.feed_forward_length"), self.ffn as u32);
        b.kv_u32(&format!("{arch}.attention.head_count"), self.heads as u32);
        b.kv_u32(
            &format!("{arch}.attention.head_count_kv"),
            self.kv_heads as u32,
        );
        b.kv_f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-5);
        b.kv_f32(&format!("{arch}.rope.freq_base"), 10000.0);
        b.kv_u32(&format!("{arch}.rope.dimension_count"), head_dim as u32);
        // Vocabulary: three specials, then printable ASCII bytes in GPT-2 byte-level form.
        let mut tokens: Vec<String> = vec![
            "<|endoftext|>".into(),
            "<|im_start|>".into(),
            "<|im_end|>".into(),
        ];
        let mut types = vec![3, 3, 3];
        let alphabet: Vec<char> = (b'!'..=b'~').map(char::from).chain(['Ġ', 'Ċ']).collect();
        for c in alphabet.iter().take(self.vocab.saturating_sub(3)) {
            tokens.push(c.to_string());
            types.push(1);
        }
        while tokens.len() < self.vocab {
            tokens.push(format!("<extra_{}>", tokens.len()));
            types.push(4);
        }
        let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        b.kv_str("tokenizer.ggml.model", "gpt2");
        b.kv_str("tokenizer.ggml.pre", "default");
        b.kv_str_array("tokenizer.ggml.tokens", &token_refs);
        b.kv_i32_array("tokenizer.ggml.token_type", &types);
        b.kv_str_array("tokenizer.ggml.merges", &[]);
        b.kv_u32("tokenizer.ggml.bos_token_id", 1);
        b.kv_u32("tokenizer.ggml.eos_token_id", 2);
        b.kv_bool("tokenizer.ggml.add_bos_token", false);
        b.kv_str(
            "tokenizer.chat_template",
            "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        );
        let h = self.hidden;
        let kv = self.kv_heads * head_dim;
        let mat = |b: &mut GgufBuilder,
                   rng: &mut FixtureRng,
                   name: &str,
                   rows: usize,
                   cols: usize,
                   dtype: DType| {
            let scale = 1.0 / (cols as f32).sqrt() * 1.7;
            b.tensor_quantized(name, &[rows, cols], dtype, &rng.vec(rows * cols, scale));
        };
        let norm = |b: &mut GgufBuilder, rng: &mut FixtureRng, name: &str, n: usize| {
            let v: Vec<f32> = rng.vec(n, 0.2).iter().map(|x| 1.0 + x).collect();
            b.tensor_f32(name, &[n], &v);
        };
        let embd_type = if self.dtype.is_quantized() {
            DType::Q8_0
        } else {
            self.dtype
        };
        b.tensor_quantized(
            "token_embd.weight",
            &[self.vocab, h],
            embd_type,
            &rng.vec(self.vocab * h, 1.0),
        );
        for l in 0..self.layers {
            let p = format!("blk.{l}");
            norm(&mut b, &mut rng, &format!("{p}.attn_norm.weight"), h);
            mat(
                &mut b,
                &mut rng,
                &format!("{p}.attn_q.weight"),
                h,
                h,
                self.dtype,
            );
            mat(
                &mut b,
                &mut rng,
                &format!("{p}.attn_k.weight"),
                kv,
                h,
                self.dtype,
            );
            mat(
                &mut b,
                &mut rng,
                &format!("{p}.attn_v.weight"),
                kv,
                h,
                self.dtype,
            );
            if self.qkv_bias {
                b.tensor_f32(&format!("{p}.attn_q.bias"), &[h], &rng.vec(h, 0.1));
                b.tensor_f32(&format!("{p}.attn_k.bias"), &[kv], &rng.vec(kv, 0.1));
                b.tensor_f32(&format!("{p}.attn_v.bias"), &[kv], &rng.vec(kv, 0.1));
            }
            mat(
                &mut b,
                &mut rng,
                &format!("{p}.attn_output.weight"),
                h,
                h,
                self.dtype,
            );
            norm(&mut b, &mut rng, &format!("{p}.ffn_norm.weight"), h);
            mat(
                &mut b,
                &mut rng,
                &format!("{p}.ffn_gate.weight"),
                self.ffn,
                h,
                self.dtype,
            );
            mat(
                &mut b,
                &mut rng,
                &format!("{p}.ffn_up.weight"),
                self.ffn,
                h,
                self.dtype,
            );
            mat(
                &mut b,
                &mut rng,
                &format!("{p}.ffn_down.weight"),
                h,
                self.ffn,
                self.dtype,
            );
        }
        norm(&mut b, &mut rng, "output_norm.weight", h);
        if !self.tied {
            mat(&mut b, &mut rng, "output.weight", self.vocab, h, embd_type);
        }
        b
    }

    /// Writes the model into a fresh temp dir and returns the file's path.
    pub fn write_temp(&self) -> PathBuf {
        self.gguf().write_temp().1
    }
}
