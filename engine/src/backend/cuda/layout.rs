//! Host-side layout math shared with the kernels: how weights are packed for the device, where
//! a key or value lives in the paged KV cache, and how one step's chunks become the metadata the
//! kernels read. Everything here is plain Rust (no CUDA), so it is tested on any machine; the
//! kernels in [`super::kernels`] use the same formulas, and the functions named `*_unit` and
//! `pair_rows` below mirror their device twins line by line.

use half::f16;

use crate::backend::SeqChunk;
use crate::model::weights::{DType, Tensor};

/// Weights per quantization block (Q4_0, Q4_1, Q8_0).
pub const QK: usize = 32;
/// Weights one lane loads at a time (a quarter block): every format is read in units of 8.
pub const UNIT: usize = 8;
/// Token rows one matvec block handles (the tile; register arrays in the kernels).
pub const MV_TOKENS: usize = 8;
/// Warps per matvec block.
pub const MV_WARPS: usize = 8;
/// Threads per block for the element-wise and row kernels.
pub const ROW_THREADS: usize = 256;
/// Largest static shared memory a kernel may use without an opt-in.
pub const SMEM_LIMIT: usize = 48 * 1024;

/// How a weight matrix is stored on the device.
///
/// The block formats are split into two arrays (structure of arrays) so that every load is
/// aligned: first the codes of all blocks, row-major (`rows × K/32` blocks of 16 bytes for the
/// 4-bit formats, 32 for Q8_0), then the block headers (`f16 d` for Q4_0/Q8_0, `f16 d, f16 m`
/// for Q4_1). Within a 4-bit block, byte `j` holds weight `j` in its low nibble and weight
/// `j + 16` in its high nibble, exactly as in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WFormat {
    /// 4-bit codes with an offset of 8, f16 scale.
    Q4_0,
    /// 4-bit codes, f16 scale and f16 minimum.
    Q4_1,
    /// 8-bit signed codes, f16 scale.
    Q8_0,
    /// IEEE half, row-major.
    F16,
    /// f32, row-major.
    F32,
}

impl WFormat {
    /// Every format, in kernel-suffix order.
    pub const ALL: [WFormat; 5] = [
        WFormat::Q4_0,
        WFormat::Q4_1,
        WFormat::Q8_0,
        WFormat::F16,
        WFormat::F32,
    ];

    /// The number the kernels use for this format (`FMT_*` in the source, `_f<id>` suffixes).
    pub fn id(self) -> usize {
        match self {
            WFormat::Q4_0 => 0,
            WFormat::Q4_1 => 1,
            WFormat::Q8_0 => 2,
            WFormat::F16 => 3,
            WFormat::F32 => 4,
        }
    }

    /// Display name.
    pub fn name(self) -> &'static str {
        match self {
            WFormat::Q4_0 => "Q4_0",
            WFormat::Q4_1 => "Q4_1",
            WFormat::Q8_0 => "Q8_0",
            WFormat::F16 => "F16",
            WFormat::F32 => "F32",
        }
    }

    /// The device format for a stored type: the three block formats the kernels read in place
    /// stay as they are; F32 and BF16 become F32 (exact); F16 stays F16; the K-quants, which
    /// have no device kernels, become F16.
    pub fn for_dtype(d: DType) -> WFormat {
        match d {
            DType::Q4_0 => WFormat::Q4_0,
            DType::Q4_1 => WFormat::Q4_1,
            DType::Q8_0 => WFormat::Q8_0,
            DType::F16
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q2K
            | DType::Q3K
            | DType::Q4K
            | DType::Q5K
            | DType::Q6K
            | DType::IQ4NL
            | DType::IQ4XS => WFormat::F16,
            DType::F32 | DType::BF16 => WFormat::F32,
        }
    }

    /// The one format for a group of matrices fused into one device matrix (Q, K and V; gate
    /// and up): their common format when they agree, else F32 when any member is stored in
    /// f32/bf16 (no precision lost), else F16.
    pub fn for_group(ds: &[DType]) -> WFormat {
        let fmts: Vec<WFormat> = ds.iter().map(|d| WFormat::for_dtype(*d)).collect();
        match fmts.split_first() {
            Some((first, rest)) if rest.iter().all(|f| f == first) => *first,
            _ if fmts.contains(&WFormat::F32) => WFormat::F32,
            _ => WFormat::F16,
        }
    }

    /// Bytes of codes per 32-weight block (block formats only).
    fn code_bytes(self) -> usize {
        match self {
            WFormat::Q4_0 | WFormat::Q4_1 => 16,
            WFormat::Q8_0 => 32,
            WFormat::F16 => 64,
            WFormat::F32 => 128,
        }
    }

    /// Bytes of header per 32-weight block (block formats only).
    fn header_bytes(self) -> usize {
        match self {
            WFormat::Q4_0 | WFormat::Q8_0 => 2,
            WFormat::Q4_1 => 4,
            WFormat::F16 | WFormat::F32 => 0,
        }
    }

    /// Whether this is a block format.
    pub fn is_block(self) -> bool {
        self.header_bytes() > 0
    }

    /// Device bytes of a `rows × k` matrix.
    pub fn bytes(self, rows: usize, k: usize) -> usize {
        rows * (k / QK) * (self.code_bytes() + self.header_bytes())
    }

    /// Byte offset of the header array (block formats): right after all the codes, so it is
    /// 16-byte aligned.
    pub fn header_offset(self, rows: usize, k: usize) -> usize {
        rows * (k / QK) * self.code_bytes()
    }
}

fn f16_le(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

/// Packs the rows of `parts` (stacked, all with row length `k`) into device format `fmt`.
///
/// Tensors already in `fmt` are copied block by block; others are dequantized on the host
/// (exactly for F32, rounded to nearest for F16).
pub fn pack(fmt: WFormat, parts: &[&Tensor]) -> Result<Vec<u8>, String> {
    let k = parts.first().map_or(0, |t| t.row_len());
    if k == 0 || !k.is_multiple_of(QK) {
        return Err(format!("row length {k} is not a multiple of {QK}"));
    }
    if let Some(t) = parts.iter().find(|t| t.row_len() != k) {
        return Err(format!(
            "{} has rows of {}, expected {k}",
            t.name(),
            t.row_len()
        ));
    }
    let rows: usize = parts.iter().map(|t| t.rows()).sum();
    let nb = k / QK;
    let mut out = vec![0u8; fmt.bytes(rows, k)];
    let hoff = fmt.header_offset(rows, k);
    let (codes, headers) = out.split_at_mut(hoff);
    let mut row_f32 = vec![0f32; k];
    let mut r0 = 0;
    for t in parts {
        let native = WFormat::for_dtype(t.dtype()) == fmt
            && matches!(
                t.dtype(),
                DType::Q4_0 | DType::Q4_1 | DType::Q8_0 | DType::F16 | DType::F32
            );
        for r in 0..t.rows() {
            let row = r0 + r;
            let src = t.row_bytes_of(r);
            match fmt {
                WFormat::Q4_0 | WFormat::Q4_1 | WFormat::Q8_0 if native => {
                    let bb = t.dtype().block_bytes();
                    let (cb, hb) = (fmt.code_bytes(), fmt.header_bytes());
                    for b in 0..nb {
                        let blk = &src[b * bb..(b + 1) * bb];
                        let i = row * nb + b;
                        headers[i * hb..(i + 1) * hb].copy_from_slice(&blk[..hb]);
                        codes[i * cb..(i + 1) * cb].copy_from_slice(&blk[hb..hb + cb]);
                    }
                }
                WFormat::Q4_0 | WFormat::Q4_1 | WFormat::Q8_0 => {
                    return Err(format!(
                        "{} ({}) cannot be packed as {}",
                        t.name(),
                        t.dtype().name(),
                        fmt.name()
                    ));
                }
                WFormat::F16 | WFormat::F32 if native => {
                    let rb = src.len();
                    codes[row * rb..(row + 1) * rb].copy_from_slice(src);
                }
                WFormat::F16 => {
                    t.dequantize_row(r, &mut row_f32);
                    for (j, v) in row_f32.iter().enumerate() {
                        let o = (row * k + j) * 2;
                        codes[o..o + 2].copy_from_slice(&f16::from_f32(*v).to_le_bytes());
                    }
                }
                WFormat::F32 => {
                    t.dequantize_row(r, &mut row_f32);
                    for (j, v) in row_f32.iter().enumerate() {
                        let o = (row * k + j) * 4;
                        codes[o..o + 4].copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
        }
        r0 += t.rows();
    }
    Ok(out)
}

/// Host mirror of the kernels' `load_unit`: the 8 weights of unit `u` (0..k/8) of `row`, and
/// the column of each. The kernels compute in f32 exactly these products (`d * q`, `d * q + m`).
pub fn load_unit(
    fmt: WFormat,
    packed: &[u8],
    rows: usize,
    k: usize,
    row: usize,
    u: usize,
) -> ([f32; 8], [usize; 8]) {
    let mut w = [0f32; 8];
    let mut col = [0usize; 8];
    match fmt {
        WFormat::F32 => {
            for i in 0..8 {
                let o = (row * k + u * 8 + i) * 4;
                w[i] = f32::from_le_bytes([packed[o], packed[o + 1], packed[o + 2], packed[o + 3]]);
                col[i] = u * 8 + i;
            }
        }
        WFormat::F16 => {
            for i in 0..8 {
                w[i] = f16_le(packed, (row * k + u * 8 + i) * 2).to_f32();
                col[i] = u * 8 + i;
            }
        }
        WFormat::Q8_0 => {
            let nb = k / QK;
            let (b, sub) = (u / 4, u % 4);
            let blk = row * nb + b;
            let d = f16_le(packed, fmt.header_offset(rows, k) + blk * 2).to_f32();
            for i in 0..8 {
                let q = packed[blk * 32 + sub * 8 + i].cast_signed();
                w[i] = d * f32::from(q);
                col[i] = b * 32 + sub * 8 + i;
            }
        }
        WFormat::Q4_0 | WFormat::Q4_1 => {
            let nb = k / QK;
            let (b, sub) = (u / 4, u % 4);
            let blk = row * nb + b;
            let h = fmt.header_offset(rows, k) + blk * fmt.header_bytes();
            let d = f16_le(packed, h).to_f32();
            let m = if fmt == WFormat::Q4_1 {
                f16_le(packed, h + 2).to_f32()
            } else {
                0.0
            };
            for i in 0..4 {
                let byte = packed[blk * 16 + sub * 4 + i];
                let (lo, hi) = (f32::from(byte & 15), f32::from(byte >> 4));
                if fmt == WFormat::Q4_1 {
                    w[i] = d * lo + m;
                    w[4 + i] = d * hi + m;
                } else {
                    w[i] = d * (lo - 8.0);
                    w[4 + i] = d * (hi - 8.0);
                }
                col[i] = b * 32 + sub * 4 + i;
                col[4 + i] = b * 32 + 16 + sub * 4 + i;
            }
        }
    }
    (w, col)
}

/// Dequantizes one packed row through [`load_unit`] (tests compare this with the CPU's
/// dequantization of the file's bytes).
pub fn unpack_row(fmt: WFormat, packed: &[u8], rows: usize, k: usize, row: usize) -> Vec<f32> {
    let mut out = vec![0f32; k];
    for u in 0..k / UNIT {
        let (w, col) = load_unit(fmt, packed, rows, k, row, u);
        for i in 0..8 {
            out[col[i]] = w[i];
        }
    }
    out
}

/// The paged KV cache's layout, identical to the CPU's (`cpu/kv.rs`): block → layer →
/// keys/values → KV head → position in block → head dimension, in f16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Transformer blocks.
    pub layers: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head size.
    pub head_dim: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Number of blocks.
    pub blocks: usize,
}

impl KvLayout {
    /// Element index of dimension 0 of (`block`, `layer`, keys (`kind` 0) or values (1),
    /// `head`, `slot`): the kernels' `kv_off(block, layer, kind, head) + slot * HD`.
    pub fn offset(
        &self,
        block: usize,
        layer: usize,
        kind: usize,
        head: usize,
        slot: usize,
    ) -> usize {
        ((((block * self.layers + layer) * 2 + kind) * self.kv_heads + head) * self.block_size
            + slot)
            * self.head_dim
    }

    /// Elements in the whole cache.
    pub fn elems(&self) -> usize {
        self.blocks * self.layers * 2 * self.kv_heads * self.block_size * self.head_dim
    }

    /// Bytes in the whole cache.
    pub fn bytes(&self) -> usize {
        self.elems() * 2
    }
}

/// Which part of the fused QKV output a row pair belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvSection {
    /// Queries (rotated, stored to the query buffer).
    Q,
    /// Keys (rotated, stored to the cache).
    K,
    /// Values (stored to the cache).
    V,
}

/// Host mirror of the kernels' `pair_rows`: the two rows of the fused `[Wq; Wk; Wv]` output
/// that pair `p` covers, their section, and the RoPE frequency index. Pairs follow the RoPE
/// convention (adjacent rows when interleaved, rows `i` and `i + head_dim/2` for neox) so that
/// one warp can rotate its own two outputs; values simply take adjacent rows.
pub fn pair_rows(
    p: usize,
    q_dim: usize,
    kv_dim: usize,
    head_dim: usize,
    neox: bool,
) -> (usize, usize, QkvSection, usize) {
    let half = head_dim / 2;
    let (sec, pp, base) = if p < q_dim / 2 {
        (QkvSection::Q, p, 0)
    } else if p < (q_dim + kv_dim) / 2 {
        (QkvSection::K, p - q_dim / 2, q_dim)
    } else {
        (QkvSection::V, p - (q_dim + kv_dim) / 2, q_dim + kv_dim)
    };
    let (head, i) = (pp / half, pp % half);
    if sec != QkvSection::V && neox {
        let r0 = base + head * head_dim + i;
        (r0, r0 + half, sec, i)
    } else {
        let r0 = base + head * head_dim + 2 * i;
        (r0, r0 + 1, sec, i)
    }
}

/// A kernel launch shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Grid size: thread blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub block: (u32, u32, u32),
}

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The matvec kernels: `MV_WARPS` warps per block, each warp owning `rows_per_warp` output
/// rows (2 for the paired epilogues), `MV_TOKENS` tokens per block along y.
pub fn mv_shape(out_rows: usize, rows_per_warp: usize, tokens: usize) -> Shape {
    let per_block = MV_WARPS * rows_per_warp;
    Shape {
        grid: (
            u32_of(out_rows.div_ceil(per_block)),
            u32_of(tokens.div_ceil(MV_TOKENS)),
            1,
        ),
        block: (u32_of(MV_WARPS * 32), 1, 1),
    }
}

/// The attention kernel: one block per (token, KV head).
pub fn attn_shape(tokens: usize, kv_heads: usize, warps: usize) -> Shape {
    Shape {
        grid: (u32_of(tokens), u32_of(kv_heads), 1),
        block: (u32_of(warps * 32), 1, 1),
    }
}

/// One block of [`ROW_THREADS`] per row.
pub fn row_shape(rows: usize) -> Shape {
    Shape {
        grid: (u32_of(rows), 1, 1),
        block: (u32_of(ROW_THREADS), 1, 1),
    }
}

/// One thread per element.
pub fn elem_shape(n: usize) -> Shape {
    Shape {
        grid: (u32_of(n.div_ceil(ROW_THREADS).max(1)), 1, 1),
        block: (u32_of(ROW_THREADS), 1, 1),
    }
}

/// Warps per attention block: as many as fit (at most 8) while the per-warp partial results
/// (`group × (head_dim + 2)` floats each) and the group's queries stay under [`SMEM_LIMIT`].
pub fn attn_warps(group: usize, head_dim: usize) -> usize {
    let q = group * head_dim * 4;
    [8, 4, 2, 1]
        .into_iter()
        .find(|w| q + w * group * (head_dim + 2) * 4 <= SMEM_LIMIT)
        .unwrap_or(1)
}

/// One step, flattened for the device: token rows reordered so that rows taking the matvec
/// path come first, and the metadata array the kernels read.
///
/// `meta` layout (i32): `[tokens; T] [positions; T] [table offsets; T] [logit source rows; R]`
/// followed by each chunk's block table; a table offset is an index into `meta` itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Token rows (T).
    pub rows: usize,
    /// Rows `0..gemv_rows` take the matvec kernels; the rest the GEMM path.
    pub gemv_rows: usize,
    /// Logit rows (R), in chunk order.
    pub logit_rows: usize,
    /// The metadata.
    pub meta: Vec<i32>,
}

fn i32_of(n: usize) -> Result<i32, String> {
    i32::try_from(n).map_err(|_| format!("{n} does not fit the device's 32-bit indices"))
}

impl StepPlan {
    /// Plans `chunks` (already validated). Chunks of at least `gemm_min` tokens take the GEMM
    /// path (`None`: none does); a one-token chunk, every decode, always takes the matvec path,
    /// whatever else is in the step, so decoding is batch invariant.
    pub fn build(
        chunks: &[SeqChunk<'_>],
        block_size: usize,
        gemm_min: Option<usize>,
    ) -> Result<Self, String> {
        let is_gemm = |c: &SeqChunk<'_>| gemm_min.is_some_and(|m| c.tokens.len() >= m.max(2));
        let t: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let r: usize = chunks.iter().map(SeqChunk::logit_rows).sum();
        let order: Vec<usize> = (0..chunks.len())
            .filter(|&i| !is_gemm(&chunks[i]))
            .chain((0..chunks.len()).filter(|&i| is_gemm(&chunks[i])))
            .collect();
        let gemv_rows: usize = chunks
            .iter()
            .filter(|c| !is_gemm(c))
            .map(|c| c.tokens.len())
            .sum();
        let mut meta = vec![0i32; 3 * t + r];
        let mut first_row = vec![0usize; chunks.len()];
        let mut row = 0;
        for &ci in &order {
            let c = &chunks[ci];
            first_row[ci] = row;
            let table_at = meta.len();
            let used = (c.start_pos + c.tokens.len()).div_ceil(block_size);
            for &b in &c.blocks[..used.min(c.blocks.len())] {
                meta.push(i32::try_from(b).map_err(|_| format!("block {b} out of range"))?);
            }
            for (i, &tok) in c.tokens.iter().enumerate() {
                meta[row] = i32::try_from(tok).map_err(|_| format!("token {tok} out of range"))?;
                meta[t + row] = i32_of(c.start_pos + i)?;
                meta[2 * t + row] = i32_of(table_at)?;
                row += 1;
            }
        }
        let mut lr = 3 * t;
        for (ci, c) in chunks.iter().enumerate() {
            let n = c.tokens.len();
            let k = c.logit_rows();
            for j in n - k..n {
                meta[lr] = i32_of(first_row[ci] + j)?;
                lr += 1;
            }
        }
        Ok(Self {
            rows: t,
            gemv_rows,
            logit_rows: r,
            meta,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kv::KvStore;
    use crate::model::gguf::GgufFile;
    use crate::model::testing::{FixtureRng, GgufBuilder};

    fn tensor(dtype: DType, rows: usize, k: usize, seed: u64) -> (Tensor, std::path::PathBuf) {
        let mut rng = FixtureRng::new(seed);
        let wf = rng.vec(rows * k, 1.5);
        let mut b = GgufBuilder::new();
        b.tensor_quantized("w", &[rows, k], dtype, &wf);
        let (dir, p) = b.write_temp();
        let g = GgufFile::open(&p).expect("gguf");
        (g.tensor("w").expect("w"), dir)
    }

    #[test]
    fn packing_round_trips_through_the_kernel_unit_loader() {
        let (rows, k) = (5, 96);
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q8_0,
            DType::F16,
            DType::F32,
            DType::BF16,
        ] {
            let (t, _dir) = tensor(dtype, rows, k, 11);
            let fmt = WFormat::for_dtype(dtype);
            let packed = pack(fmt, &[&t]).expect("pack");
            assert_eq!(packed.len(), fmt.bytes(rows, k));
            for r in 0..rows {
                let want = t.row_f32(r);
                let got = unpack_row(fmt, &packed, rows, k, r);
                for j in 0..k {
                    // The device computes d*q (+ m) in f32 like the CPU: bit-identical values.
                    assert_eq!(got[j].to_bits(), want[j].to_bits(), "{dtype:?} r{r} c{j}");
                }
            }
        }
    }

    #[test]
    fn stacked_groups_keep_row_order_and_convert_mixed_types() {
        let (a, _d1) = tensor(DType::Q4_1, 4, 64, 1);
        let (b, _d2) = tensor(DType::Q4_1, 2, 64, 2);
        let (c, _d3) = tensor(DType::Q8_0, 2, 64, 3);
        assert_eq!(WFormat::for_group(&[a.dtype(), b.dtype()]), WFormat::Q4_1);
        let mixed = WFormat::for_group(&[a.dtype(), b.dtype(), c.dtype()]);
        assert_eq!(mixed, WFormat::F16);
        assert_eq!(WFormat::for_group(&[DType::Q4_1, DType::F32]), WFormat::F32);
        let same = pack(WFormat::Q4_1, &[&a, &b]).expect("pack");
        for (r, want) in (0..4)
            .map(|r| a.row_f32(r))
            .chain((0..2).map(|r| b.row_f32(r)))
            .enumerate()
        {
            assert_eq!(unpack_row(WFormat::Q4_1, &same, 6, 64, r), want);
        }
        let conv = pack(mixed, &[&a, &b, &c]).expect("pack");
        let all: Vec<Vec<f32>> = (0..4)
            .map(|r| a.row_f32(r))
            .chain((0..2).map(|r| b.row_f32(r)))
            .chain((0..2).map(|r| c.row_f32(r)))
            .collect();
        for (r, want) in all.iter().enumerate() {
            let got = unpack_row(WFormat::F16, &conv, 8, 64, r);
            for (g, w) in got.iter().zip(want) {
                assert_eq!(*g, f16::from_f32(*w).to_f32());
            }
        }
        assert!(pack(WFormat::Q4_1, &[&c]).is_err());
    }

    #[test]
    fn header_array_is_aligned_and_sizes_add_up() {
        for fmt in WFormat::ALL {
            for (rows, k) in [(1, 32), (3, 64), (576, 1536), (49152, 576)] {
                let h = fmt.header_offset(rows, k);
                assert_eq!(h % 16, 0, "{fmt:?}");
                assert!(h <= fmt.bytes(rows, k));
            }
        }
        // SmolLM2's fused QKV (576 + 2·192 rows of 576) in Q4_1: 20 bytes per 32 weights.
        assert_eq!(WFormat::Q4_1.bytes(960, 576), 960 * 18 * 20);
        assert_eq!(WFormat::Q8_0.bytes(49152, 576), 49152 * 18 * 34);
    }

    #[test]
    fn kv_offsets_match_the_cpu_cache() {
        let (layers, kvh, hd, bs, blocks) = (3, 2, 8, 4, 5);
        let lay = KvLayout {
            layers,
            kv_heads: kvh,
            head_dim: hd,
            block_size: bs,
            blocks,
        };
        let mut cpu = KvStore::new(layers, kvh, hd, bs, blocks);
        // A value that encodes its own coordinates (exact in f16).
        #[allow(clippy::cast_precision_loss)]
        let code = |b: usize, l: usize, kind: usize, h: usize, s: usize, d: usize| {
            (((((b * 3 + l) * 2 + kind) * 2 + h) * 4 + s) * 8 + d) as f32
        };
        let mut flat = vec![0f32; lay.elems()];
        for b in 0..blocks {
            for l in 0..layers {
                for s in 0..bs {
                    let mut k = vec![0f32; kvh * hd];
                    let mut v = vec![0f32; kvh * hd];
                    for h in 0..kvh {
                        for d in 0..hd {
                            k[h * hd + d] = code(b, l, 0, h, s, d);
                            v[h * hd + d] = code(b, l, 1, h, s, d);
                            flat[lay.offset(b, l, 0, h, s) + d] = k[h * hd + d];
                            flat[lay.offset(b, l, 1, h, s) + d] = v[h * hd + d];
                        }
                    }
                    cpu.write(b, s, l, &k, &v);
                }
            }
        }
        let mut out = vec![0f32; bs * hd];
        for b in 0..blocks {
            for l in 0..layers {
                for kind in 0..2 {
                    for h in 0..kvh {
                        cpu.read(b, l, kind, h, bs, &mut out);
                        let at = lay.offset(b, l, kind, h, 0);
                        assert_eq!(&flat[at..at + bs * hd], &out[..], "b{b} l{l} {kind} h{h}");
                    }
                }
            }
        }
        assert_eq!(lay.bytes(), cpu.bytes_per_token() * bs * blocks);
    }

    #[test]
    fn qkv_pairs_cover_every_row_once_and_follow_the_rope_convention() {
        let (q, kv, hd) = (64, 32, 16);
        for neox in [false, true] {
            let mut seen = vec![0; q + 2 * kv];
            for p in 0..(q + 2 * kv) / 2 {
                let (r0, r1, sec, i) = pair_rows(p, q, kv, hd, neox);
                seen[r0] += 1;
                seen[r1] += 1;
                let base = match sec {
                    QkvSection::Q => 0,
                    QkvSection::K => q,
                    QkvSection::V => q + kv,
                };
                let (a, b) = ((r0 - base) % hd, (r1 - base) % hd);
                assert_eq!((r0 - base) / hd, (r1 - base) / hd, "same head");
                if sec != QkvSection::V {
                    // The CPU rotates (2i, 2i+1) or (i, i + hd/2) with frequency i.
                    if neox {
                        assert_eq!((a, b), (i, i + hd / 2));
                    } else {
                        assert_eq!((a, b), (2 * i, 2 * i + 1));
                    }
                }
            }
            assert!(seen.iter().all(|&n| n == 1));
        }
    }

    #[test]
    fn launch_shapes_cover_the_work() {
        let s = mv_shape(960 / 2, 2, 1);
        assert_eq!(s.grid, (30, 1, 1));
        assert_eq!(s.block, (256, 1, 1));
        let s = mv_shape(49152, 2, 17);
        assert_eq!(s.grid, (3072, 3, 1));
        let s = attn_shape(5, 3, 8);
        assert_eq!((s.grid, s.block), ((5, 3, 1), (256, 1, 1)));
        assert_eq!(elem_shape(0).grid.0, 1);
        assert_eq!(elem_shape(257).grid.0, 2);
        // SmolLM2 (3 heads per KV head, 64 dims) and Llama-3-8B (4, 128) take 8 warps.
        assert_eq!(attn_warps(3, 64), 8);
        assert_eq!(attn_warps(4, 128), 8);
        assert_eq!(attn_warps(8, 256), 4);
        for (g, hd) in [(1, 16), (8, 256), (16, 256)] {
            let w = attn_warps(g, hd);
            assert!(g * hd * 4 + w * g * (hd + 2) * 4 <= SMEM_LIMIT);
        }
    }

    #[test]
    fn step_plan_puts_matvec_rows_first_and_logits_in_chunk_order() {
        let t1 = [5u32, 6, 7, 8, 9];
        let t2 = [42u32];
        let b1 = [3u32, 4];
        let b2 = [7u32, 8, 9];
        let chunks = [
            SeqChunk {
                tokens: &t1,
                start_pos: 0,
                blocks: &b1,
                all_logits: false,
                no_logits: false,
            },
            SeqChunk {
                tokens: &t2,
                start_pos: 33,
                blocks: &b2,
                all_logits: false,
                no_logits: false,
            },
        ];
        let p = StepPlan::build(&chunks, 16, Some(4)).expect("plan");
        assert_eq!((p.rows, p.gemv_rows, p.logit_rows), (6, 1, 2));
        let m = &p.meta;
        // Row 0: the decode (matvec); rows 1..6 the prefill chunk (GEMM).
        assert_eq!(&m[0..6], &[42, 5, 6, 7, 8, 9]);
        assert_eq!(&m[6..12], &[33, 0, 1, 2, 3, 4]);
        // Logits: chunk 0's last row (row 5), then chunk 1's (row 0).
        assert_eq!(&m[18..20], &[5, 0]);
        let (toff_decode, toff_prefill) = (m[12] as usize, m[13] as usize);
        assert_eq!(&m[toff_decode..toff_decode + 3], &[7, 8, 9]);
        assert_eq!(&m[toff_prefill..toff_prefill + 1], &[3]);
        assert!(m[13..18].iter().all(|&o| o == m[13]));
        // Without a GEMM path every row is a matvec row, in chunk order.
        let p = StepPlan::build(&chunks, 16, None).expect("plan");
        assert_eq!(p.gemv_rows, 6);
        assert_eq!(&p.meta[0..6], &[5, 6, 7, 8, 9, 42]);
        assert_eq!(&p.meta[18..20], &[4, 5]);
    }

    #[test]
    fn step_plan_all_logits_and_no_logits() {
        let t = [1u32, 2, 3];
        let b = [0u32];
        let c = |all, none| SeqChunk {
            tokens: &t,
            start_pos: 0,
            blocks: &b,
            all_logits: all,
            no_logits: none,
        };
        let p = StepPlan::build(&[c(true, false), c(false, true)], 16, None).expect("plan");
        assert_eq!((p.rows, p.logit_rows), (6, 3));
        assert_eq!(&p.meta[18..21], &[0, 1, 2]);
    }
}
