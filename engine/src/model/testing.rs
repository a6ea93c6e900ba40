//! Test fixtures built in code: a GGUF writer and tiny random Llama-family models.
//!
//! Used by unit tests, integration tests and benches; nothing here is used when serving.

// A synthetic model's sizes are small constants of the tests (a few hundred at most): their
// casts to the GGUF's u32 fields and to f32 scales are exact. The quantizers clamp every code
// into its field's range before casting it to the field's width.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    clippy::cast_sign_loss
)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use half::f16;

use super::weights::{DType, IQ4_VALUES};

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
    /// Sets key `k` (GGUF type `ty`, encoded value `v`), replacing an earlier value of it: a
    /// test can change one key of a model [`TinyLlama::gguf`] wrote.
    fn set(&mut self, k: &str, ty: u32, v: Vec<u8>) -> &mut Self {
        match self.kvs.iter_mut().find(|(key, _, _)| key == k) {
            Some(kv) => *kv = (k.into(), ty, v),
            None => self.kvs.push((k.into(), ty, v)),
        }
        self
    }
    /// A string value.
    pub fn kv_str(&mut self, k: &str, v: &str) -> &mut Self {
        self.set(k, 8, gguf_str(v))
    }
    /// A u32 value.
    pub fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.set(k, 4, v.to_le_bytes().to_vec())
    }
    /// An f32 value.
    pub fn kv_f32(&mut self, k: &str, v: f32) -> &mut Self {
        self.set(k, 6, v.to_le_bytes().to_vec())
    }
    /// A bool value.
    pub fn kv_bool(&mut self, k: &str, v: bool) -> &mut Self {
        self.set(k, 7, vec![u8::from(v)])
    }
    /// An array of strings.
    pub fn kv_str_array(&mut self, k: &str, v: &[&str]) -> &mut Self {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            b.extend_from_slice(&gguf_str(s));
        }
        self.set(k, 9, b)
    }
    /// An array of i32.
    pub fn kv_i32_array(&mut self, k: &str, v: &[i32]) -> &mut Self {
        let mut b = 5u32.to_le_bytes().to_vec();
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            b.extend_from_slice(&x.to_le_bytes());
        }
        self.set(k, 9, b)
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
        let row = shape.last().copied().unwrap_or(1);
        assert!(
            row.is_multiple_of(dtype.block_elems()),
            "{name}: rows of {row} are not whole {} blocks",
            dtype.name()
        );
        self.tensor_raw(name, shape, dtype.ggml_id(), &quantize(dtype, data))
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

/// `x` stored as `dtype`, in GGML's block layout (the bytes [`super::weights::dequantize`]
/// reads). `x.len()` must be a whole number of blocks.
///
/// Q8_0, Q4_0 and Q4_1 are GGML's own simple quantizers. The others are round-to-nearest with
/// scales rounded *away from zero* (f16 fields and integer sub-block scales alike), so that
/// no weight is clipped: every weight then decodes to within half a step of its sub-block
/// (within half the local gap of the code book for IQ4_NL/IQ4_XS) of its value.
pub fn quantize(dtype: DType, x: &[f32]) -> Vec<u8> {
    assert!(
        x.len().is_multiple_of(dtype.block_elems()),
        "{} values are not whole {} blocks",
        x.len(),
        dtype.name()
    );
    match dtype {
        DType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => x.iter().flat_map(|v| f16b(*v)).collect(),
        DType::BF16 => x
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        DType::Q8_0 => quantize_q8_0(x),
        DType::Q4_0 => quantize_q4_0(x),
        DType::Q4_1 => quantize_q4_1(x),
        DType::Q5_0 => quantize_q5_0(x),
        DType::Q5_1 => quantize_q5_1(x),
        DType::Q2K => quantize_q2_k(x),
        DType::Q3K => quantize_q3_k(x),
        DType::Q4K => quantize_q4_k(x),
        DType::Q5K => quantize_q5_k(x),
        DType::Q6K => quantize_q6_k(x),
        DType::IQ4NL => quantize_iq4_nl(x),
        DType::IQ4XS => quantize_iq4_xs(x),
    }
}

/// `v` as the nearest f16 of at least its magnitude.
fn f16_away(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32().abs() >= v.abs() {
        h
    } else {
        // The next bit pattern is one ulp further from zero, for either sign.
        f16::from_bits(h.to_bits() + 1)
    }
}

/// `v` as the nearest f16 not above it.
fn f16_floor(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32() <= v {
        return h;
    }
    f16::from_bits(match h.to_bits() {
        0 => 0x8001,
        b if b & 0x8000 == 0 => b - 1,
        b => b + 1,
    })
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// The value of largest magnitude, with its sign.
fn extreme(x: &[f32]) -> f32 {
    x.iter()
        .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a })
}

/// The signed scale of least magnitude that puts every `x / s` in `[lo − ½, hi + ½]`, so
/// rounding to the nearest code in `lo..=hi` errs by at most half a step; the sign lets the
/// longer side of the data use the longer side of an asymmetric code range.
fn signed_scale(x: &[f32], lo: i32, hi: i32) -> f32 {
    let (mn, mx) = min_max(x);
    let (a, b) = (0.5 - lo as f32, hi as f32 + 0.5);
    let pos = (-mn / a).max(mx / b).max(0.0);
    let neg = (mx / a).max(-mn / b).max(0.0);
    if pos <= neg { pos } else { -neg }
}

/// The nearest code in `lo..=hi` to `v / step` (0 clamped into range when `step` is 0).
fn code(v: f32, step: f32, lo: i32, hi: i32) -> i32 {
    if step == 0.0 {
        return 0.clamp(lo, hi);
    }
    ((v / step).round() as i32).clamp(lo, hi)
}

/// The integer sub-block scale, at most `max` in magnitude, that makes `d · k` at least `s` in
/// magnitude (with the sign of `s`).
fn scale_code(s: f32, d: f32, max: i32) -> i32 {
    if d <= 0.0 || s == 0.0 {
        return 0;
    }
    let k = ((s.abs() / d).ceil() as i32).min(max);
    if s < 0.0 { -k } else { k }
}

/// Index of the IQ4 code-book entry whose decoded value `step · entry` is nearest `v`.
fn nearest_iq4(v: f32, step: f32) -> u8 {
    let err = |k: usize| (v - step * f32::from(IQ4_VALUES[k])).abs();
    (0..16).fold(0, |best, k| if err(k) < err(best) { k } else { best }) as u8
}

/// Bytes `j` of the 32 codes of one 32-weight block: code `j` in the low nibble, code `j + 16`
/// in the high one.
fn nibbles_32(q: &[u8]) -> impl Iterator<Item = u8> + '_ {
    (0..16).map(|j| (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4))
}

/// Bit 4 of each of 32 codes, code `j` at bit `j`.
fn high_bits_32(q: &[u8]) -> [u8; 4] {
    q.iter()
        .enumerate()
        .fold(0u32, |h, (j, &v)| h | (u32::from(v >> 4 & 1) << j))
        .to_le_bytes()
}

/// Q5_0: `d · (q − 16)`, 5-bit `q`.
pub fn quantize_q5_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 22);
    for b in x.chunks(32) {
        let d = f16_away(signed_scale(b, -16, 15));
        let q: Vec<u8> = b
            .iter()
            .map(|&v| (code(v, d.to_f32(), -16, 15) + 16) as u8)
            .collect();
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&high_bits_32(&q));
        out.extend(nibbles_32(&q));
    }
    out
}

/// Q5_1: `d · q + m`, 5-bit `q`.
pub fn quantize_q5_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 24);
    for b in x.chunks(32) {
        let (mn, mx) = min_max(b);
        let m = f16_floor(mn);
        let d = f16_away((mx - m.to_f32()) / 31.0);
        let q: Vec<u8> = b
            .iter()
            .map(|&v| code(v - m.to_f32(), d.to_f32(), 0, 31) as u8)
            .collect();
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&m.to_le_bytes());
        out.extend_from_slice(&high_bits_32(&q));
        out.extend(nibbles_32(&q));
    }
    out
}

/// IQ4_NL: `d · IQ4_VALUES[q]`; the largest weight maps to −127, the first entry.
pub fn quantize_iq4_nl(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 18);
    for b in x.chunks(32) {
        let d = f16_away(extreme(b) / -127.0);
        let q: Vec<u8> = b.iter().map(|&v| nearest_iq4(v, d.to_f32())).collect();
        out.extend_from_slice(&d.to_le_bytes());
        out.extend(nibbles_32(&q));
    }
    out
}

/// Scales and minimums of an asymmetric K-quant super-block (Q2_K, Q4_K, Q5_K): per
/// sub-block the integer scale and min codes (at most `code_max`) against the f16 `d` and
/// `dmin`, chosen so that `d·sc·q − dmin·m` with `q` in `0..=q_max` covers the sub-block;
/// then the weights' codes. Returns `(d, dmin, sc, m, q)`.
fn k_quant_asym(
    x: &[f32],
    sub: usize,
    code_max: i32,
    q_max: i32,
) -> (f16, f16, Vec<u8>, Vec<u8>, Vec<u8>) {
    let ranges: Vec<(f32, f32)> = x.chunks(sub).map(min_max).collect();
    // The minimum is subtracted: only sub-blocks reaching below zero need one.
    let need_min: Vec<f32> = ranges.iter().map(|&(mn, _)| (-mn).max(0.0)).collect();
    let dmin = f16_away(need_min.iter().fold(0f32, |a, &v| a.max(v)) / code_max as f32);
    let m: Vec<i32> = need_min
        .iter()
        .map(|&v| scale_code(v, dmin.to_f32(), code_max))
        .collect();
    let min: Vec<f32> = m.iter().map(|&k| dmin.to_f32() * k as f32).collect();
    let need_step: Vec<f32> = ranges
        .iter()
        .zip(&min)
        .map(|(&(_, mx), &mn)| ((mx + mn) / q_max as f32).max(0.0))
        .collect();
    let d = f16_away(need_step.iter().fold(0f32, |a, &v| a.max(v)) / code_max as f32);
    let sc: Vec<i32> = need_step
        .iter()
        .map(|&v| scale_code(v, d.to_f32(), code_max))
        .collect();
    let q = x
        .iter()
        .enumerate()
        .map(|(j, &v)| {
            let s = j / sub;
            code(v + min[s], d.to_f32() * sc[s] as f32, 0, q_max) as u8
        })
        .collect();
    let bytes = |v: Vec<i32>| v.into_iter().map(|k| k as u8).collect();
    (d, dmin, bytes(sc), bytes(m), q)
}

/// Signed sub-block scales of a symmetric super-block (Q3_K, Q6_K, IQ4_XS): per sub-block the
/// scale `ideal` asks for, as an integer code of magnitude at most `code_max` against one f16
/// `d`, rounded away from zero. Returns `(d, codes)`.
fn k_quant_scales(ideal: &[f32], code_max: i32) -> (f16, Vec<i32>) {
    let d = f16_away(ideal.iter().fold(0f32, |a, &v| a.max(v.abs())) / code_max as f32);
    let k = ideal
        .iter()
        .map(|&s| scale_code(s, d.to_f32(), code_max))
        .collect();
    (d, k)
}

/// The 12 bytes of 8 six-bit scales and 8 six-bit mins of Q4_K/Q5_K (the inverse of
/// [`super::weights::q4k_scale_min`]).
fn pack_q4k_scales(sc: &[u8], m: &[u8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    q
}

/// Q2_K: sub-blocks of 16, `d·sc·q − dmin·m` with 4-bit `sc`, `m` and 2-bit `q`.
pub fn quantize_q2_k(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 256 * 84);
    for b in x.chunks(256) {
        let (d, dmin, sc, m, q) = k_quant_asym(b, 16, 15, 3);
        out.extend(sc.iter().zip(&m).map(|(s, m)| s | (m << 4)));
        let mut qs = [0u8; 64];
        for (j, &v) in q.iter().enumerate() {
            // Weight 128·half + 32·shift + l sits in byte 32·half + l at bit 2·shift.
            let (half, shift, l) = (j / 128, j % 128 / 32, j % 32);
            qs[32 * half + l] |= v << (2 * shift);
        }
        out.extend_from_slice(&qs);
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&dmin.to_le_bytes());
    }
    out
}

/// Q3_K: sub-blocks of 16, `d·(u − 32)·(q − 4)` with 6-bit `u` and 3-bit `q`.
pub fn quantize_q3_k(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 256 * 110);
    for b in x.chunks(256) {
        let ideal: Vec<f32> = b.chunks(16).map(|s| signed_scale(s, -4, 3)).collect();
        let (d, k) = k_quant_scales(&ideal, 31);
        let (mut hm, mut qs, mut sc) = ([0u8; 32], [0u8; 64], [0u8; 12]);
        for (j, &v) in b.iter().enumerate() {
            let q = (code(v, d.to_f32() * k[j / 16] as f32, -4, 3) + 4) as u8;
            let (half, shift, l) = (j / 128, j % 128 / 32, j % 32);
            qs[32 * half + l] |= (q & 3) << (2 * shift);
            hm[l] |= (q >> 2) << (4 * half + shift);
        }
        for (s, &k) in k.iter().enumerate() {
            let u = (k + 32) as u8;
            if s < 8 {
                sc[s] |= u & 0xF;
            } else {
                sc[s - 8] |= (u & 0xF) << 4;
            }
            sc[8 + s % 4] |= (u >> 4) << (2 * (s / 4));
        }
        out.extend_from_slice(&hm);
        out.extend_from_slice(&qs);
        out.extend_from_slice(&sc);
        out.extend_from_slice(&d.to_le_bytes());
    }
    out
}

/// Q4_K: sub-blocks of 32, `d·sc·q − dmin·m` with 6-bit `sc`, `m` and 4-bit `q`.
pub fn quantize_q4_k(x: &[f32]) -> Vec<u8> {
    quantize_q45_k(x, false)
}

/// Q5_K: as Q4_K with 5-bit `q` (the fifth bits in 32 bytes before the nibbles).
pub fn quantize_q5_k(x: &[f32]) -> Vec<u8> {
    quantize_q45_k(x, true)
}

fn quantize_q45_k(x: &[f32], five: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 256 * if five { 176 } else { 144 });
    for b in x.chunks(256) {
        let (d, dmin, sc, m, q) = k_quant_asym(b, 32, 63, if five { 31 } else { 15 });
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&dmin.to_le_bytes());
        out.extend_from_slice(&pack_q4k_scales(&sc, &m));
        // Byte 32·j + l holds weight 64·j + l (low nibble) and 64·j + 32 + l (high nibble);
        // their fifth bits are bits 2·j and 2·j + 1 of qh[l].
        let (mut qh, mut qs) = ([0u8; 32], [0u8; 128]);
        for j in 0..4 {
            for l in 0..32 {
                let (lo, hi) = (q[64 * j + l], q[64 * j + 32 + l]);
                qs[32 * j + l] = (lo & 0xF) | ((hi & 0xF) << 4);
                qh[l] |= ((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1));
            }
        }
        if five {
            out.extend_from_slice(&qh);
        }
        out.extend_from_slice(&qs);
    }
    out
}

/// Q6_K: sub-blocks of 16, `d·sc·(q − 32)` with 8-bit signed `sc` and 6-bit `q`.
pub fn quantize_q6_k(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 256 * 210);
    for b in x.chunks(256) {
        let ideal: Vec<f32> = b.chunks(16).map(|s| signed_scale(s, -32, 31)).collect();
        let (d, k) = k_quant_scales(&ideal, 127);
        let q: Vec<u8> = b
            .iter()
            .enumerate()
            .map(|(j, &v)| (code(v, d.to_f32() * k[j / 16] as f32, -32, 31) + 32) as u8)
            .collect();
        let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
        // In each half of 128, weights l, l + 32, l + 64, l + 96 share qh[l]; low nibbles of
        // l and l + 64 share ql[l], of l + 32 and l + 96 share ql[l + 32].
        for half in 0..2 {
            for l in 0..32 {
                let j = 128 * half + l;
                let (a, b, c, e) = (q[j], q[j + 32], q[j + 64], q[j + 96]);
                ql[64 * half + l] = (a & 0xF) | ((c & 0xF) << 4);
                ql[64 * half + l + 32] = (b & 0xF) | ((e & 0xF) << 4);
                qh[32 * half + l] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
            }
        }
        out.extend_from_slice(&ql);
        out.extend_from_slice(&qh);
        out.extend(k.iter().map(|&k| (k as i8).cast_unsigned()));
        out.extend_from_slice(&d.to_le_bytes());
    }
    out
}

/// IQ4_XS: sub-blocks of 32, `d·(u − 32)·IQ4_VALUES[q]` with 6-bit `u`; each sub-block's
/// largest weight maps to about −127.
pub fn quantize_iq4_xs(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 256 * 136);
    for b in x.chunks(256) {
        let ideal: Vec<f32> = b.chunks(32).map(|s| extreme(s) / -127.0).collect();
        let (d, k) = k_quant_scales(&ideal, 31);
        let (mut sh, mut sl, mut qs) = (0u16, [0u8; 4], [0u8; 128]);
        for (s, (sub, &k)) in b.chunks(32).zip(&k).enumerate() {
            let u = (k + 32) as u8;
            sh |= u16::from(u >> 4) << (2 * s);
            sl[s / 2] |= (u & 0xF) << (4 * (s % 2));
            let q: Vec<u8> = sub
                .iter()
                .map(|&v| nearest_iq4(v, d.to_f32() * k as f32))
                .collect();
            for (l, byte) in nibbles_32(&q).enumerate() {
                qs[16 * s + l] = byte;
            }
        }
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&sh.to_le_bytes());
        out.extend_from_slice(&sl);
        out.extend_from_slice(&qs);
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
    /// A mixture of experts instead of one MLP per layer: (experts, experts per token, hidden
    /// units of one): a `qwen3moe` file (with Qwen3's q/k norms).
    pub experts: Option<(usize, usize, usize)>,
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
            experts: None,
        }
    }
}

impl TinyLlama {
    /// The model as GGUF bytes, with a byte-level gpt2 vocabulary of `vocab` tokens
    /// (ids 0..=2 are `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) and a ChatML template.
    pub fn gguf(&self) -> GgufBuilder {
        self.gguf_typed(&|_, dtype| dtype, false)
    }

    /// The model with each matrix (embedding and output included) stored as
    /// `type_of(name, default)`, `default` being the type [`TinyLlama::gguf`] gives it; 1-D
    /// tensors stay F32. The weights drawn are the same whatever the types. With `dequantized`,
    /// every matrix is stored instead as F32 holding the values its chosen type decodes to: the
    /// float reference of the typed file, which differs from it only in the engine's
    /// arithmetic.
    pub fn gguf_typed(
        &self,
        type_of: &dyn Fn(&str, DType) -> DType,
        dequantized: bool,
    ) -> GgufBuilder {
        let mut rng = FixtureRng::new(self.seed);
        let mut b = GgufBuilder::new();
        let arch = match (self.experts, self.qkv_bias) {
            (Some(_), _) => "qwen3moe",
            (None, true) => "qwen2",
            (None, false) => "llama",
        };
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
        if let Some((count, used, ffn)) = self.experts {
            b.kv_u32(&format!("{arch}.expert_count"), count as u32);
            b.kv_u32(&format!("{arch}.expert_used_count"), used as u32);
            b.kv_u32(&format!("{arch}.expert_feed_forward_length"), ffn as u32);
        }
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
        let store = |b: &mut GgufBuilder, name: &str, shape: &[usize], dtype: DType, x: &[f32]| {
            let dtype = type_of(name, dtype);
            if dequantized {
                let mut y = vec![0.0; x.len()];
                super::weights::dequantize(dtype, &quantize(dtype, x), &mut y);
                b.tensor_f32(name, shape, &y);
            } else {
                b.tensor_quantized(name, shape, dtype, x);
            }
        };
        let mat = |b: &mut GgufBuilder,
                   rng: &mut FixtureRng,
                   name: &str,
                   rows: usize,
                   cols: usize,
                   dtype: DType| {
            let scale = 1.0 / (cols as f32).sqrt() * 1.7;
            store(b, name, &[rows, cols], dtype, &rng.vec(rows * cols, scale));
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
        store(
            &mut b,
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
            if let Some((count, _, ffn)) = self.experts {
                norm(
                    &mut b,
                    &mut rng,
                    &format!("{p}.attn_q_norm.weight"),
                    head_dim,
                );
                norm(
                    &mut b,
                    &mut rng,
                    &format!("{p}.attn_k_norm.weight"),
                    head_dim,
                );
                b.tensor_f32(
                    &format!("{p}.ffn_gate_inp.weight"),
                    &[count, h],
                    &rng.vec(count * h, 1.0),
                );
                let scale = |cols: usize| 1.0 / (cols as f32).sqrt() * 1.7;
                for (part, rows, cols) in [("gate", ffn, h), ("up", ffn, h), ("down", h, ffn)] {
                    let x = rng.vec(count * rows * cols, scale(cols));
                    store(
                        &mut b,
                        &format!("{p}.ffn_{part}_exps.weight"),
                        &[count, rows, cols],
                        self.dtype,
                        &x,
                    );
                }
                continue;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::weights::{BlockFields, dequantize};

    /// Rows of 1,024 weights: uniform; sub-blocks of magnitudes four decades apart; all
    /// positive; all negative but one outlier; zeros.
    fn rows() -> Vec<Vec<f32>> {
        let mut rng = FixtureRng::new(20);
        let uniform = rng.vec(1024, 0.7);
        let decades: Vec<f32> = rng
            .vec(1024, 1.0)
            .iter()
            .enumerate()
            .map(|(j, v)| v * 10f32.powi((j / 16 % 5) as i32 - 2))
            .collect();
        let positive = rng.vec(1024, 0.5).iter().map(|v| v + 0.6).collect();
        let mut negative: Vec<f32> = rng.vec(1024, 0.2).iter().map(|v| v - 0.3).collect();
        negative[77] = 3.0;
        vec![uniform, decades, positive, negative, vec![0.0; 1024]]
    }

    /// Per-weight error bound in units of the decoded step of the weight's sub-block, plus a
    /// slack relative to the block's largest weight. Half a step for round-to-nearest with
    /// nothing clipped; GGML's Q4_0 maps the extreme to −8 and clips the opposite one at 7
    /// (a whole step); the IQ4 code book's widest gap is 24 (half: 12) and its top entry 113
    /// sits 14 below the 127 the data reaches. The slack covers f16 rounding of GGML's scales
    /// and mins in Q8_0/Q4_0/Q4_1 (they may clip a weight by that much), float rounding in the
    /// others.
    fn step_bound(dtype: DType) -> (f32, f32) {
        match dtype {
            DType::Q4_0 => (1.0, 2f32.powi(-9)),
            DType::Q8_0 | DType::Q4_1 => (0.5, 2f32.powi(-9)),
            DType::IQ4NL | DType::IQ4XS => (14.0, 1e-6),
            _ => (0.5, 1e-6),
        }
    }

    /// Bound of the relative RMS error on the uniform row; measured: F16 2e-4, BF16 1.7e-3,
    /// Q8_0 0.0040, Q6_K 0.015, Q5_0 0.032, Q5_1 0.030, Q5_K 0.031, Q4_0 0.066, Q4_1 0.062,
    /// Q4_K 0.064, IQ4_NL 0.068, IQ4_XS 0.068, Q3_K 0.131, Q2_K 0.307.
    fn rms_bound(dtype: DType) -> f32 {
        match dtype {
            DType::F32 => 0.0,
            DType::F16 => 5e-4,
            DType::BF16 => 4e-3,
            DType::Q8_0 => 5e-3,
            DType::Q6K => 0.02,
            DType::Q5_0 | DType::Q5_1 | DType::Q5K => 0.04,
            DType::Q4_0 | DType::Q4_1 | DType::Q4K | DType::IQ4NL | DType::IQ4XS => 0.08,
            DType::Q3K => 0.16,
            DType::Q2K => 0.36,
        }
    }

    /// Per-weight error bound of the float types: half an ulp (f16 below its normal range:
    /// half its smallest subnormal).
    fn float_bound(dtype: DType, x: f32) -> f32 {
        match dtype {
            DType::F16 => x.abs() * 2f32.powi(-11) + 2f32.powi(-25),
            DType::BF16 => x.abs() * 2f32.powi(-8),
            _ => 0.0,
        }
    }

    #[test]
    fn every_type_round_trips_within_its_step() {
        for dtype in DType::ALL {
            for (r, x) in rows().iter().enumerate() {
                let bytes = quantize(dtype, x);
                assert_eq!(
                    Some(bytes.len()),
                    dtype.bytes_for(x.len(), x.len()),
                    "{}",
                    dtype.name()
                );
                let mut y = vec![f32::NAN; x.len()];
                dequantize(dtype, &bytes, &mut y);
                let be = dtype.block_elems();
                for (j, (&a, &b)) in x.iter().zip(&y).enumerate() {
                    let bound = if dtype.is_quantized() {
                        let block = &bytes[j / be * dtype.block_bytes()..][..dtype.block_bytes()];
                        let f = BlockFields::decode(dtype, block);
                        let step = (f.d * f.sc[j % be / f.sub] as f32).abs();
                        let amax = x[j / be * be..][..be]
                            .iter()
                            .fold(0f32, |m, v| m.max(v.abs()));
                        let (steps, slack) = step_bound(dtype);
                        steps * step * (1.0 + 1e-6) + slack * amax
                    } else {
                        float_bound(dtype, a)
                    };
                    assert!(
                        (a - b).abs() <= bound,
                        "{} row {r} weight {j}: {a} decoded as {b} (bound {bound})",
                        dtype.name()
                    );
                }
            }
            let x = &rows()[0];
            let mut y = vec![0.0; x.len()];
            dequantize(dtype, &quantize(dtype, x), &mut y);
            let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum();
            let norm: f32 = x.iter().map(|a| a * a).sum();
            let rel = (err / norm).sqrt();
            eprintln!("{:<6} relative RMS error {rel:.4}", dtype.name());
            assert!(rel <= rms_bound(dtype), "{}: {rel}", dtype.name());
        }
    }

    #[test]
    fn directed_f16_rounding() {
        for v in [0.1f32, -0.1, 1e-6, -1e-6, 3.0e-8, 0.0, 1000.3] {
            assert!(f16_away(v).to_f32().abs() >= v.abs(), "{v}");
            assert!(f16_floor(v).to_f32() <= v, "{v}");
            assert!((f16_away(v).to_f32() - v).abs() <= v.abs() * 2f32.powi(-10) + 6e-8);
        }
    }
}
