//! Host-side layout math shared with the kernels: how weights are packed for the device, where
//! a key or value lives in the paged KV cache, and how one step's chunks become the metadata the
//! kernels read. Everything here is plain Rust (no CUDA), so it is tested on any machine; the
//! kernels in [`super::kernels`] use the same formulas, and the functions named `*_unit` and
//! `pair_rows` below mirror their device twins line by line.

use half::f16;

use crate::backend::SeqChunk;
use crate::model::weights::{BlockFields, DType, IQ4_VALUES, Tensor};

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

/// Weights per super-block of the K-quants and IQ4_XS.
pub const QK_K: usize = 256;

/// How a weight matrix is stored on the device.
///
/// The block formats are split into two arrays (structure of arrays) so that every load is
/// aligned: first the codes of all 32-weight blocks, row-major, then (at the next multiple of 16
/// bytes) the headers. Every format with 4 or more bits per code keeps the file's nibble order
/// in 16 bytes per block: byte `j` holds weight `j` in its low nibble and weight `j + 16` in its
/// high nibble. Extra code bits follow the nibbles: Q5_0, Q5_1 and Q5_K one `u32` whose bit `j`
/// is bit 4 of weight `j` (the file's `qh` of Q5_0/Q5_1); Q6_K one `u16` per quarter block
/// (unit) holding bits 4–5 of its 8 weights. Q2_K and Q3_K keep 2 bits per weight in one `u16`
/// per unit (Q3_K then one byte per unit with each weight's third bit). A unit's 8 weights are
/// always weights `4·sub .. 4·sub+4` and `16 + 4·sub .. 16 + 4·sub+4` of its block.
///
/// Headers: Q4_0, Q8_0, Q5_0 and IQ4_NL one `f16 d` per block, Q4_1 and Q5_1 `f16 d, f16 m`.
/// The super-block formats (256 weights) keep one header per super-block, with the integer
/// sub-scales unpacked from the file's 6-bit fields at load: Q4_K/Q5_K `f16 d, f16 dmin, u8
/// scale[8], u8 min[8]`; Q2_K `f16 d, f16 dmin`, the 16 bytes `scale | min << 4` as in the file;
/// Q3_K and Q6_K `f16 d`, 2 bytes unused, `i8 scale[16]` (Q3_K's offset of 32 removed); IQ4_XS
/// `f16 d`, 2 bytes unused, `i8 scale[8]` (offset removed). The kernels multiply `d` by the
/// integer sub-scale in f32, exactly as the reference decoding does.
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
    /// 5-bit codes with an offset of 16, f16 scale.
    Q5_0,
    /// 5-bit codes, f16 scale and f16 minimum.
    Q5_1,
    /// 4-bit indices into [`IQ4_VALUES`], f16 scale.
    IQ4NL,
    /// 2-bit codes; per super-block f16 d and dmin, 4-bit scale and min per 16 weights.
    Q2K,
    /// 3-bit codes with an offset of 4; per super-block f16 d, signed scale per 16 weights.
    Q3K,
    /// 4-bit codes; per super-block f16 d and dmin, 6-bit scale and min per 32 weights.
    Q4K,
    /// 5-bit codes; per super-block f16 d and dmin, 6-bit scale and min per 32 weights.
    Q5K,
    /// 6-bit codes with an offset of 32; per super-block f16 d, i8 scale per 16 weights.
    Q6K,
    /// 4-bit indices into [`IQ4_VALUES`]; per super-block f16 d, signed scale per 32 weights.
    IQ4XS,
}

impl WFormat {
    /// Every format, in kernel-suffix order.
    pub const ALL: [WFormat; 14] = [
        WFormat::Q4_0,
        WFormat::Q4_1,
        WFormat::Q8_0,
        WFormat::F16,
        WFormat::F32,
        WFormat::Q5_0,
        WFormat::Q5_1,
        WFormat::IQ4NL,
        WFormat::Q2K,
        WFormat::Q3K,
        WFormat::Q4K,
        WFormat::Q5K,
        WFormat::Q6K,
        WFormat::IQ4XS,
    ];

    /// The number the kernels use for this format (`FMT_*` in the source, `_f<id>` suffixes).
    pub fn id(self) -> usize {
        match self {
            WFormat::Q4_0 => 0,
            WFormat::Q4_1 => 1,
            WFormat::Q8_0 => 2,
            WFormat::F16 => 3,
            WFormat::F32 => 4,
            WFormat::Q5_0 => 5,
            WFormat::Q5_1 => 6,
            WFormat::IQ4NL => 7,
            WFormat::Q2K => 8,
            WFormat::Q3K => 9,
            WFormat::Q4K => 10,
            WFormat::Q5K => 11,
            WFormat::Q6K => 12,
            WFormat::IQ4XS => 13,
        }
    }

    /// The stored type this format keeps as it is (F32 also takes BF16, F16 any type).
    pub fn dtype(self) -> DType {
        match self {
            WFormat::Q4_0 => DType::Q4_0,
            WFormat::Q4_1 => DType::Q4_1,
            WFormat::Q8_0 => DType::Q8_0,
            WFormat::F16 => DType::F16,
            WFormat::F32 => DType::F32,
            WFormat::Q5_0 => DType::Q5_0,
            WFormat::Q5_1 => DType::Q5_1,
            WFormat::IQ4NL => DType::IQ4NL,
            WFormat::Q2K => DType::Q2K,
            WFormat::Q3K => DType::Q3K,
            WFormat::Q4K => DType::Q4K,
            WFormat::Q5K => DType::Q5K,
            WFormat::Q6K => DType::Q6K,
            WFormat::IQ4XS => DType::IQ4XS,
        }
    }

    /// Display name (the stored type's).
    pub fn name(self) -> &'static str {
        self.dtype().name()
    }

    /// The device format for a stored type: every block type stays quantized in its own
    /// format (dequantized in registers by the kernels); F32 and BF16 become F32 (exact); F16
    /// stays F16.
    pub fn for_dtype(d: DType) -> WFormat {
        match d {
            DType::F32 | DType::BF16 => WFormat::F32,
            d => WFormat::ALL
                .into_iter()
                .find(|f| f.dtype() == d)
                .unwrap_or(WFormat::F16),
        }
    }

    /// The one format for a group of matrices fused into one device matrix (gate and up):
    /// their common format when they agree, else F32 when any member is stored in f32/bf16
    /// (no precision lost), else F16. (Q, K and V need no common format: see
    /// [`WFormat::sections`].)
    pub fn for_group(ds: &[DType]) -> WFormat {
        let fmts: Vec<WFormat> = ds.iter().map(|d| WFormat::for_dtype(*d)).collect();
        match fmts.split_first() {
            Some((first, rest)) if rest.iter().all(|f| f == first) => *first,
            _ if fmts.contains(&WFormat::F32) => WFormat::F32,
            _ => WFormat::F16,
        }
    }

    /// The sections of a stack of matrices that the kernels run one launch each over (Q, K and
    /// V): runs of consecutive members with the same device format, as (format, members). A
    /// Q4_K_M file's `[Q4_K, Q4_K, Q6_K]` is two sections, each kept in its own format.
    pub fn sections(ds: &[DType]) -> Vec<(WFormat, std::ops::Range<usize>)> {
        let mut out: Vec<(WFormat, std::ops::Range<usize>)> = Vec::new();
        for (i, d) in ds.iter().enumerate() {
            let f = WFormat::for_dtype(*d);
            match out.last_mut() {
                Some((lf, r)) if *lf == f => r.end = i + 1,
                _ => out.push((f, i..i + 1)),
            }
        }
        out
    }

    /// Bytes of codes per 32-weight block (block formats only).
    fn code_bytes(self) -> usize {
        match self {
            WFormat::Q4_0 | WFormat::Q4_1 | WFormat::IQ4NL | WFormat::Q4K | WFormat::IQ4XS => 16,
            WFormat::Q5_0 | WFormat::Q5_1 | WFormat::Q5K => 20,
            WFormat::Q6K => 24,
            WFormat::Q3K => 12,
            WFormat::Q2K => 8,
            WFormat::Q8_0 => 32,
            WFormat::F16 => 64,
            WFormat::F32 => 128,
        }
    }

    /// Bytes of one header (block formats only); one header serves
    /// [`WFormat::header_weights`] weights.
    fn header_bytes(self) -> usize {
        match self {
            WFormat::Q4_0 | WFormat::Q8_0 | WFormat::Q5_0 | WFormat::IQ4NL => 2,
            WFormat::Q4_1 | WFormat::Q5_1 => 4,
            WFormat::Q2K | WFormat::Q3K | WFormat::Q4K | WFormat::Q5K | WFormat::Q6K => 20,
            WFormat::IQ4XS => 12,
            WFormat::F16 | WFormat::F32 => 0,
        }
    }

    /// Weights per header: 32, or 256 for the super-block formats.
    pub fn header_weights(self) -> usize {
        match self {
            WFormat::Q2K
            | WFormat::Q3K
            | WFormat::Q4K
            | WFormat::Q5K
            | WFormat::Q6K
            | WFormat::IQ4XS => QK_K,
            _ => QK,
        }
    }

    /// Bits per stored code of the formats decoded by the generic unit loader.
    fn code_bits(self) -> u32 {
        match self {
            WFormat::Q2K => 2,
            WFormat::Q3K => 3,
            WFormat::Q5_0 | WFormat::Q5_1 | WFormat::Q5K => 5,
            WFormat::Q6K => 6,
            WFormat::Q8_0 => 8,
            WFormat::F16 => 16,
            WFormat::F32 => 32,
            _ => 4,
        }
    }

    /// What the kernels subtract from a stored code (the reference's signed code).
    fn code_offset(self) -> i32 {
        match self {
            WFormat::Q4_0 => 8,
            WFormat::Q5_0 => 16,
            WFormat::Q3K => 4,
            WFormat::Q6K => 32,
            _ => 0,
        }
    }

    /// Whether codes index the non-linear table [`IQ4_VALUES`].
    fn is_table(self) -> bool {
        matches!(self, WFormat::IQ4NL | WFormat::IQ4XS)
    }

    /// Whether this is a block format.
    pub fn is_block(self) -> bool {
        self.header_bytes() > 0
    }

    /// Device bytes of a `rows × k` matrix.
    pub fn bytes(self, rows: usize, k: usize) -> usize {
        if !self.is_block() {
            return rows * (k / QK) * self.code_bytes();
        }
        self.header_offset(rows, k) + rows * (k / self.header_weights()) * self.header_bytes()
    }

    /// Byte offset of the header array (block formats): right after all the codes, rounded up
    /// to a multiple of 16 (the kernels' `hdr_off`).
    pub fn header_offset(self, rows: usize, k: usize) -> usize {
        (rows * (k / QK) * self.code_bytes()).next_multiple_of(16)
    }

    /// The definitions the kernels use for this format: `(code bytes, header bytes, code bits,
    /// code offset, super-block, table)`, written into the source as `FMT_*` macros.
    pub fn kernel_params(self) -> (usize, usize, u32, i32, bool, bool) {
        (
            self.code_bytes(),
            self.header_bytes(),
            self.code_bits(),
            self.code_offset(),
            self.header_weights() == QK_K,
            self.is_table(),
        )
    }
}

fn f16_le(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

/// The 8 weights of unit `sub` of a block, in unit order: weights `4·sub ..` then `16 + 4·sub ..`.
fn unit_weight(sub: usize, e: usize) -> usize {
    if e < 4 {
        4 * sub + e
    } else {
        16 + 4 * sub + e - 4
    }
}

/// Writes one 32-weight block's stored (unsigned) codes `v` as `fmt`'s code bytes.
fn write_codes(fmt: WFormat, v: &[u8; 32], c: &mut [u8]) {
    let bits = fmt.code_bits();
    if bits >= 4 {
        for i in 0..16 {
            c[i] = (v[i] & 15) | ((v[i + 16] & 15) << 4);
        }
    }
    if bits == 5 {
        let qh = (0..32).fold(0u32, |a, i| a | (u32::from((v[i] >> 4) & 1) << i));
        c[16..20].copy_from_slice(&qh.to_le_bytes());
    }
    for sub in 0..4 {
        let (mut lo2, mut hi2, mut b3) = (0u16, 0u16, 0u8);
        for e in 0..8 {
            let x = v[unit_weight(sub, e)];
            lo2 |= u16::from(x & 3) << (2 * e);
            hi2 |= u16::from((x >> 4) & 3) << (2 * e);
            b3 |= ((x >> 2) & 1) << e;
        }
        match bits {
            6 => c[16 + 2 * sub..18 + 2 * sub].copy_from_slice(&hi2.to_le_bytes()),
            2 | 3 => {
                c[2 * sub..2 * sub + 2].copy_from_slice(&lo2.to_le_bytes());
                if bits == 3 {
                    c[8 + sub] = b3;
                }
            }
            _ => {}
        }
    }
}

/// A super-block's device header from its decoded fields (see [`WFormat`]).
fn write_super_header(fmt: WFormat, f: &BlockFields, h: &mut [u8]) {
    // Exact: d and dmin are the file's f16 fields.
    h[0..2].copy_from_slice(&f16::from_f32(f.d).to_le_bytes());
    h[2..4].copy_from_slice(&f16::from_f32(f.dmin).to_le_bytes());
    // Unwraps are safe here: the sub-scales are 6-bit (Q4_K/Q5_K, unsigned), 4-bit (Q2_K), or
    // signed and within i8 (Q3_K, Q6_K, IQ4_XS), as GGML defines them.
    let byte = |v: i32| u8::try_from(v).expect("unsigned sub-scale");
    let signed = |v: i32| i8::try_from(v).expect("signed sub-scale").cast_unsigned();
    match fmt {
        WFormat::Q4K | WFormat::Q5K => {
            for j in 0..8 {
                h[4 + j] = byte(f.sc[j]);
                h[12 + j] = byte(f.mn[j]);
            }
        }
        WFormat::Q2K => {
            for s in 0..16 {
                h[4 + s] = byte(f.sc[s] | (f.mn[s] << 4));
            }
        }
        WFormat::Q3K | WFormat::Q6K => {
            h[2..4].fill(0);
            for s in 0..16 {
                h[4 + s] = signed(f.sc[s]);
            }
        }
        WFormat::IQ4XS => {
            h[2..4].fill(0);
            for s in 0..8 {
                h[4 + s] = signed(f.sc[s]);
            }
        }
        _ => unreachable!("{fmt:?} has no super-block header"),
    }
}

/// Packs one row of a super-block type: per file block, its header and the code bytes of its
/// eight 32-weight blocks (`codes` and `headers` are the row's slices).
fn pack_super_row(fmt: WFormat, dtype: DType, src: &[u8], codes: &mut [u8], headers: &mut [u8]) {
    let (bb, cb, hb) = (dtype.block_bytes(), fmt.code_bytes(), fmt.header_bytes());
    for (s, blk) in src.chunks_exact(bb).enumerate() {
        let f = BlockFields::decode(dtype, blk);
        write_super_header(fmt, &f, &mut headers[s * hb..(s + 1) * hb]);
        for j in 0..8 {
            let mut v = [0u8; 32];
            for (l, x) in v.iter_mut().enumerate() {
                let c = f.codes[32 * j + l];
                let stored = if fmt.is_table() {
                    IQ4_VALUES
                        .iter()
                        .position(|&t| i32::from(t) == c)
                        .and_then(|i| i32::try_from(i).ok())
                        .unwrap_or(0)
                } else {
                    c + fmt.code_offset()
                };
                // Unwrap is safe here: every stored code fits 6 bits.
                *x = u8::try_from(stored).expect("code in range");
            }
            let i = s * 8 + j;
            write_codes(fmt, &v, &mut codes[i * cb..(i + 1) * cb]);
        }
    }
}

/// Packs the rows of `parts` (stacked, all with row length `k`) into device format `fmt`.
///
/// Tensors already in `fmt` are copied block by block (the super-block types repacked);
/// others are dequantized on the host (exactly for F32, rounded to nearest for F16).
pub fn pack(fmt: WFormat, parts: &[&Tensor]) -> Result<Vec<u8>, String> {
    let k = parts.first().map_or(0, |t| t.row_len());
    if k == 0 || !k.is_multiple_of(fmt.header_weights()) {
        return Err(format!(
            "row length {k} is not a multiple of {}",
            fmt.header_weights()
        ));
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
    let (cb, hb) = (fmt.code_bytes(), fmt.header_bytes());
    let hpr = k / fmt.header_weights();
    let mut row_f32 = vec![0f32; k];
    let mut r0 = 0;
    for t in parts {
        let native = t.dtype() == fmt.dtype();
        for r in 0..t.rows() {
            let row = r0 + r;
            let src = t.row_bytes_of(r);
            match fmt {
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
                _ if !native => {
                    return Err(format!(
                        "{} ({}) cannot be packed as {}",
                        t.name(),
                        t.dtype().name(),
                        fmt.name()
                    ));
                }
                _ if hpr < nb => pack_super_row(
                    fmt,
                    t.dtype(),
                    src,
                    &mut codes[row * nb * cb..(row + 1) * nb * cb],
                    &mut headers[row * hpr * hb..(row + 1) * hpr * hb],
                ),
                _ => {
                    let bb = t.dtype().block_bytes();
                    // Where the file's block keeps its nibbles and (Q5) its high bits.
                    let (qs, qh) = match fmt {
                        WFormat::Q5_0 => (6, Some(2)),
                        WFormat::Q5_1 => (8, Some(4)),
                        _ => (hb, None),
                    };
                    for b in 0..nb {
                        let blk = &src[b * bb..(b + 1) * bb];
                        let i = row * nb + b;
                        headers[i * hb..(i + 1) * hb].copy_from_slice(&blk[..hb]);
                        let c = &mut codes[i * cb..(i + 1) * cb];
                        match qh {
                            Some(h) => {
                                c[..16].copy_from_slice(&blk[qs..qs + 16]);
                                c[16..20].copy_from_slice(&blk[h..h + 4]);
                            }
                            None => c.copy_from_slice(&blk[qs..qs + cb]),
                        }
                    }
                }
            }
        }
        r0 += t.rows();
    }
    Ok(out)
}

/// Host mirror of the kernels' `load_unit`: the 8 weights of unit `u` (0..k/8) of `row`, and
/// the column of each. The kernels compute in f32 exactly these products (`d * q`, `d * q + m`,
/// and for the sub-scaled formats `(d * sc) * q - dmin * m`, never fused), which are the
/// reference decoding's.
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
        _ => {
            let nb = k / QK;
            let (b, sub) = (u / 4, u % 4);
            let blk = row * nb + b;
            let c = &packed[blk * fmt.code_bytes()..(blk + 1) * fmt.code_bytes()];
            let q = unit_codes(fmt, c, sub);
            let (s, m) = unit_scales(fmt, packed, fmt.header_offset(rows, k), blk);
            for e in 0..8 {
                let code = if fmt.is_table() {
                    i32::from(IQ4_VALUES[usize::from(q[e])])
                } else {
                    i32::from(q[e]) - fmt.code_offset()
                };
                #[allow(clippy::cast_precision_loss)] // |code| ≤ 127: exact
                let code = code as f32;
                w[e] = s[e / 4] * code - m[e / 4];
                col[e] = b * 32 + unit_weight(sub, e);
            }
        }
    }
    (w, col)
}

/// Host mirror of the kernels' code unpacking: the stored (unsigned) codes of unit `sub` of a
/// block whose code bytes are `c`, in unit order.
fn unit_codes(fmt: WFormat, c: &[u8], sub: usize) -> [u8; 8] {
    let mut q = [0u8; 8];
    let bits = fmt.code_bits();
    let u16_at = |i: usize| u16::from_le_bytes([c[i], c[i + 1]]);
    if bits >= 4 {
        for i in 0..4 {
            let byte = c[sub * 4 + i];
            q[i] = byte & 15;
            q[4 + i] = byte >> 4;
        }
    } else {
        let l = u16_at(2 * sub);
        for (e, x) in q.iter_mut().enumerate() {
            *x = u8::try_from((l >> (2 * e)) & 3).unwrap_or(0);
        }
    }
    match bits {
        5 => {
            let h = u32::from_le_bytes([c[16], c[17], c[18], c[19]]);
            for (e, x) in q.iter_mut().enumerate() {
                let bit = (h >> unit_weight(sub, e)) & 1;
                *x |= u8::try_from(bit << 4).unwrap_or(0);
            }
        }
        6 => {
            let h = u16_at(16 + 2 * sub);
            for (e, x) in q.iter_mut().enumerate() {
                *x |= u8::try_from(((h >> (2 * e)) & 3) << 4).unwrap_or(0);
            }
        }
        3 => {
            for (e, x) in q.iter_mut().enumerate() {
                *x |= ((c[8 + sub] >> e) & 1) << 2;
            }
        }
        _ => {}
    }
    q
}

/// Host mirror of the kernels' scales: the scale and the minimum of the two halves of a unit
/// of block `blk` (the halves differ for sub-blocks of 16 weights), as the reference's
/// `scale` and `min` (weight = scale · code − min).
fn unit_scales(fmt: WFormat, packed: &[u8], hoff: usize, blk: usize) -> ([f32; 2], [f32; 2]) {
    let f16_at = |i: usize| f16_le(packed, i).to_f32();
    if fmt.header_weights() == QK {
        let h = hoff + blk * fmt.header_bytes();
        let d = f16_at(h);
        let m = if fmt == WFormat::Q5_1 {
            -f16_at(h + 2)
        } else {
            0.0
        };
        return ([d; 2], [m; 2]);
    }
    let h = hoff + (blk / 8) * fmt.header_bytes();
    let j = blk % 8;
    let (d, dmin) = (f16_at(h), f16_at(h + 2));
    let byte = |i: usize| packed[h + 4 + i];
    let (mut s, mut m) = ([0f32; 2], [0f32; 2]);
    for half in 0..2 {
        (s[half], m[half]) = match fmt {
            WFormat::Q4K | WFormat::Q5K => (d * f32::from(byte(j)), dmin * f32::from(byte(8 + j))),
            WFormat::Q2K => {
                let x = byte(2 * j + half);
                (d * f32::from(x & 15), dmin * f32::from(x >> 4))
            }
            WFormat::IQ4XS => (d * f32::from(byte(j).cast_signed()), 0.0),
            _ => (d * f32::from(byte(2 * j + half).cast_signed()), 0.0),
        };
    }
    (s, m)
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
/// followed by each chunk's block table; a row's table offset counts from the start of the
/// table-offset section (the kernels take `tabs = meta + 2T` and read `tabs + tabs[row]`).
///
/// With a window pool, `meta_window` holds the window pool's tables the same way:
/// `[table offsets; T]` (counted from its start) followed by each chunk's window table, the
/// blocks the window has passed marked [`WINDOW_RELEASED`] (which the kernels never read).
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
    /// The window pool's block tables (empty without one).
    pub meta_window: Vec<i32>,
}

/// A window-table entry for a block the window has passed (given back to the pool).
pub const WINDOW_RELEASED: i32 = -1;

fn i32_of(n: usize) -> Result<i32, String> {
    i32::try_from(n).map_err(|_| format!("{n} does not fit the device's 32-bit indices"))
}

impl StepPlan {
    /// Plans `chunks` (already validated). Chunks of at least `gemm_min` tokens take the GEMM
    /// path (`None`: none does); a one-token chunk, every decode, always takes the matvec path,
    /// whatever else is in the step, so decoding is batch invariant. `windows` holds each
    /// chunk's window-pool table (empty without a window pool), entries the window has passed
    /// being [`crate::kv_cache::RELEASED`].
    pub fn build(
        chunks: &[SeqChunk<'_>],
        block_size: usize,
        gemm_min: Option<usize>,
        windows: &[&[u32]],
    ) -> Result<Self, String> {
        if !windows.is_empty() && windows.len() != chunks.len() {
            return Err(format!(
                "{} window block tables for {} chunks",
                windows.len(),
                chunks.len()
            ));
        }
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
        let mut meta_window = if windows.is_empty() {
            Vec::new()
        } else {
            vec![0i32; t]
        };
        let mut first_row = vec![0usize; chunks.len()];
        let mut row = 0;
        for &ci in &order {
            let c = &chunks[ci];
            first_row[ci] = row;
            let table_at = meta.len() - 2 * t;
            let used = (c.start_pos + c.tokens.len()).div_ceil(block_size);
            for &b in &c.blocks[..used.min(c.blocks.len())] {
                meta.push(i32::try_from(b).map_err(|_| format!("block {b} out of range"))?);
            }
            let window_at = meta_window.len();
            if let Some(w) = windows.get(ci) {
                for &b in &w[..used.min(w.len())] {
                    meta_window.push(if b == crate::kv_cache::RELEASED {
                        WINDOW_RELEASED
                    } else {
                        i32::try_from(b).map_err(|_| format!("window block {b} out of range"))?
                    });
                }
            }
            for (i, &tok) in c.tokens.iter().enumerate() {
                meta[row] = i32::try_from(tok).map_err(|_| format!("token {tok} out of range"))?;
                meta[t + row] = i32_of(c.start_pos + i)?;
                meta[2 * t + row] = i32_of(table_at)?;
                if !windows.is_empty() {
                    meta_window[row] = i32_of(window_at)?;
                }
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
            meta_window,
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

    /// Where a block of `dtype` keeps its f16 fields.
    fn f16_fields(dtype: DType) -> &'static [usize] {
        match dtype {
            DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
            DType::Q2K => &[80, 82],
            DType::Q3K => &[108],
            DType::Q6K => &[208],
            _ => &[0],
        }
    }

    /// A `rows × k` tensor of `dtype` made of random blocks: every bit pattern of codes,
    /// sub-scales and high bits, with finite f16 scales of either sign.
    fn random_tensor(dtype: DType, rows: usize, k: usize, seed: u64) -> Tensor {
        let mut rng = FixtureRng::new(seed);
        let n = rows * k / dtype.block_elems();
        let mut bytes = Vec::with_capacity(n * dtype.block_bytes());
        for _ in 0..n {
            let mut blk: Vec<u8> = (0..dtype.block_bytes())
                .map(|_| rng.next_f32().to_bits().to_le_bytes()[1])
                .collect();
            for &o in f16_fields(dtype) {
                let v = f16::from_f32(rng.next_f32() * 0.05);
                blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
            }
            bytes.extend_from_slice(&blk);
        }
        Tensor::new(
            "w".into(),
            dtype,
            vec![rows, k],
            crate::model::weights::Storage::Owned(std::sync::Arc::new(bytes)),
        )
    }

    #[test]
    fn every_block_type_stays_quantized_and_decodes_bit_for_bit() {
        let (rows, k) = (3, 512);
        for dtype in DType::ALL.into_iter().filter(|d| d.is_quantized()) {
            let t = random_tensor(dtype, rows, k, 5 + u64::from(dtype.ggml_id()));
            let fmt = WFormat::for_dtype(dtype);
            assert_eq!(fmt.dtype(), dtype, "{dtype:?} has its own device format");
            let packed = pack(fmt, &[&t]).expect("pack");
            assert_eq!(packed.len(), fmt.bytes(rows, k));
            // Memory on the device ≈ the file's: at most 6% more (the unpacked sub-scales).
            let file = t.bytes().len();
            assert!(
                packed.len() * 100 <= file * 106 + 1600,
                "{dtype:?}: {} vs {file}",
                packed.len()
            );
            for r in 0..rows {
                let want = t.row_f32(r);
                let got = unpack_row(fmt, &packed, rows, k, r);
                for j in 0..k {
                    assert_eq!(got[j].to_bits(), want[j].to_bits(), "{dtype:?} r{r} c{j}");
                }
            }
        }
    }

    #[test]
    fn qkv_sections_keep_each_format() {
        use DType::{Q4K, Q5_0, Q6K};
        let s = WFormat::sections(&[Q4K, Q4K, Q6K]);
        assert_eq!(s, vec![(WFormat::Q4K, 0..2), (WFormat::Q6K, 2..3)]);
        let s = WFormat::sections(&[Q4K, Q5_0, Q5_0]);
        assert_eq!(s, vec![(WFormat::Q4K, 0..1), (WFormat::Q5_0, 1..3)]);
        assert_eq!(WFormat::sections(&[Q6K; 3]), vec![(WFormat::Q6K, 0..3)]);
        // BF16 and F32 share F32.
        let s = WFormat::sections(&[DType::BF16, DType::F32, Q4K]);
        assert_eq!(s, vec![(WFormat::F32, 0..2), (WFormat::Q4K, 2..3)]);
        // Sections stacked in one fused order decode as the members did.
        let (q, kk, v) = (
            random_tensor(Q4K, 4, 256, 1),
            random_tensor(Q4K, 2, 256, 2),
            random_tensor(Q6K, 2, 256, 3),
        );
        let parts = [&q, &kk, &v];
        let mut row = 0;
        for (fmt, range) in WFormat::sections(&[Q4K, Q4K, Q6K]) {
            let members = &parts[range];
            let packed = pack(fmt, members).expect("pack");
            let n: usize = members.iter().map(|t| t.rows()).sum();
            let want: Vec<Vec<f32>> = members
                .iter()
                .flat_map(|t| (0..t.rows()).map(|r| t.row_f32(r)))
                .collect();
            for (r, w) in want.iter().enumerate() {
                assert_eq!(&unpack_row(fmt, &packed, n, 256, r), w, "row {}", row + r);
            }
            row += n;
        }
        assert_eq!(row, 8);
        // Gate and up of different types share one format: F16 (F32 with a float member).
        assert_eq!(WFormat::for_group(&[Q4K, Q6K]), WFormat::F16);
        assert_eq!(WFormat::for_group(&[Q4K, Q4K]), WFormat::Q4K);
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
        let p = StepPlan::build(&chunks, 16, Some(4), &[]).expect("plan");
        assert_eq!((p.rows, p.gemv_rows, p.logit_rows), (6, 1, 2));
        let m = &p.meta;
        // Row 0: the decode (matvec); rows 1..6 the prefill chunk (GEMM).
        assert_eq!(&m[0..6], &[42, 5, 6, 7, 8, 9]);
        assert_eq!(&m[6..12], &[33, 0, 1, 2, 3, 4]);
        // Logits: chunk 0's last row (row 5), then chunk 1's (row 0).
        assert_eq!(&m[18..20], &[5, 0]);
        let (toff_decode, toff_prefill) = (12 + m[12] as usize, 12 + m[13] as usize);
        assert_eq!(&m[toff_decode..toff_decode + 3], &[7, 8, 9]);
        assert_eq!(&m[toff_prefill..toff_prefill + 1], &[3]);
        assert!(m[13..18].iter().all(|&o| o == m[13]));
        // Without a GEMM path every row is a matvec row, in chunk order.
        let p = StepPlan::build(&chunks, 16, None, &[]).expect("plan");
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
        let p = StepPlan::build(&[c(true, false), c(false, true)], 16, None, &[]).expect("plan");
        assert_eq!((p.rows, p.logit_rows), (6, 3));
        assert_eq!(&p.meta[18..21], &[0, 1, 2]);
    }

    #[test]
    fn step_plan_fills_the_window_tables_with_released_blocks_marked() {
        use crate::kv_cache::RELEASED;
        // A decode at 40 (blocks of 16: its window of 8 reaches back to 33, block 2) whose
        // window table has given back blocks 0 and 1, and a prefill chunk from 0 with no
        // block given back yet.
        let t1 = [1u32, 2, 3];
        let t2 = [9u32];
        let (f1, f2) = ([10u32], [20u32, 21, 22]);
        let (w1, w2) = ([5u32], [RELEASED, RELEASED, 7]);
        let chunks = [
            SeqChunk {
                tokens: &t1,
                start_pos: 0,
                blocks: &f1,
                all_logits: false,
                no_logits: false,
            },
            SeqChunk {
                tokens: &t2,
                start_pos: 40,
                blocks: &f2,
                all_logits: false,
                no_logits: false,
            },
        ];
        let p = StepPlan::build(&chunks, 16, None, &[&w1, &w2]).expect("plan");
        let (m, w) = (&p.meta, &p.meta_window);
        // Each row's tables: the full ones in `meta` (offsets from 2T), the window ones in
        // `meta_window` (offsets from its start), in the same row order.
        let t = p.rows;
        assert_eq!(t, 4);
        let full = |row: usize| &m[2 * t + m[2 * t + row] as usize..];
        let win = |row: usize| &w[w[row] as usize..];
        for row in 0..3 {
            assert_eq!(full(row)[0], 10);
            assert_eq!(win(row)[0], 5);
        }
        assert_eq!(&full(3)[..3], &[20, 21, 22]);
        assert_eq!(&win(3)[..3], &[WINDOW_RELEASED, WINDOW_RELEASED, 7]);
        assert_eq!(w.len(), t + 1 + 3);
        // Without a window pool there is no window table.
        assert!(
            StepPlan::build(&chunks, 16, None, &[])
                .expect("plan")
                .meta_window
                .is_empty()
        );
        // One window table per chunk, or none.
        assert!(StepPlan::build(&chunks, 16, None, &[&w1]).is_err());
    }
}
