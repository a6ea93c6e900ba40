//! Tensors as stored on disk: element types, quantized block layouts, and their storage
//! (memory-mapped from the model file, or owned).

use std::sync::Arc;

use half::{bf16, f16};
use memmap2::Mmap;

/// Element type of a stored tensor: every type of llama.cpp's quantization presets.
///
/// Block layouts are GGML's, byte for byte (little-endian); `dequantize` is their reference
/// decoding, the one every kernel is tested against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16: 16 bits, f32's exponent range with 8 bits of mantissa.
    BF16,
    /// 32 weights per block: f16 scale, 32 × i8.
    Q8_0,
    /// 32 weights per block: f16 scale, 32 × 4-bit (offset 8).
    Q4_0,
    /// 32 weights per block: f16 scale, f16 min, 32 × 4-bit.
    Q4_1,
    /// 32 weights per block: f16 scale, 32 high bits, 32 × 4-bit low bits (offset 16).
    Q5_0,
    /// 32 weights per block: f16 scale, f16 min, 32 high bits, 32 × 4-bit low bits.
    Q5_1,
    /// 256 weights per super-block: 16 × (4-bit scale, 4-bit min) for sub-blocks of 16, 64 bytes
    /// of 2-bit codes, f16 d, f16 dmin.
    Q2K,
    /// 256 weights per super-block: 32 bytes of high bits, 64 bytes of 2-bit low bits, 12 bytes
    /// of 6-bit scales (offset 32) for sub-blocks of 16, f16 d; codes offset 4.
    Q3K,
    /// 256 weights per super-block: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins for
    /// sub-blocks of 32, 128 bytes of 4-bit codes.
    Q4K,
    /// 256 weights per super-block: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 32 bytes
    /// of high bits, 128 bytes of 4-bit low bits.
    Q5K,
    /// 256 weights per super-block: 128 bytes low 4 bits, 64 bytes high 2 bits, 16 × i8 scales
    /// for sub-blocks of 16, f16 d; codes offset 32.
    Q6K,
    /// 32 weights per block: f16 scale, 32 × 4-bit indices into the non-linear table
    /// [`IQ4_VALUES`].
    IQ4NL,
    /// 256 weights per super-block: f16 d, 16 bits of high scale bits, 4 bytes of low scale
    /// bits (6-bit scales, offset 32, per sub-block of 32), 128 bytes of 4-bit table indices.
    IQ4XS,
}

/// The non-linear 4-bit code book of IQ4_NL and IQ4_XS (GGML's `kvalues_iq4nl`).
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

impl DType {
    /// Every type, in GGML id order (tests iterate it).
    pub const ALL: [DType; 15] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::IQ4NL,
        DType::IQ4XS,
        DType::BF16,
    ];

    /// The type for a GGML type id, when supported.
    pub fn from_ggml(id: u32) -> Option<Self> {
        DType::ALL.into_iter().find(|d| d.ggml_id() == id)
    }

    /// The GGML type id.
    pub const fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q2K => 10,
            DType::Q3K => 11,
            DType::Q4K => 12,
            DType::Q5K => 13,
            DType::Q6K => 14,
            DType::IQ4NL => 20,
            DType::IQ4XS => 23,
            DType::BF16 => 30,
        }
    }

    /// The GGML name of a type id (for error messages).
    pub fn ggml_name(id: u32) -> &'static str {
        if let Some(d) = DType::from_ggml(id) {
            return d.name();
        }
        match id {
            9 => "Q8_1",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            21 => "IQ3_S",
            22 => "IQ2_S",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            _ => "unknown",
        }
    }

    /// Display name (GGML's).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q2K => "Q2_K",
            DType::Q3K => "Q3_K",
            DType::Q4K => "Q4_K",
            DType::Q5K => "Q5_K",
            DType::Q6K => "Q6_K",
            DType::IQ4NL => "IQ4_NL",
            DType::IQ4XS => "IQ4_XS",
        }
    }

    /// Weights per block (1 for plain floats).
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4NL => {
                32
            }
            DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K | DType::IQ4XS => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 | DType::IQ4NL => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q2K => 84,
            DType::Q3K => 110,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
            DType::IQ4XS => 136,
        }
    }

    /// Whether this is a block-quantized type.
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes for `elems` elements stored in rows of `row` elements; `None` when a row is not a
    /// whole number of blocks.
    pub fn bytes_for(self, row: usize, elems: usize) -> Option<usize> {
        let be = self.block_elems();
        if !row.is_multiple_of(be) {
            return None;
        }
        (elems / be).checked_mul(self.block_bytes())
    }
}

/// Where a tensor's bytes live.
#[derive(Clone)]
pub enum Storage {
    /// A slice of a memory-mapped file.
    Mapped {
        /// The map, shared by every tensor of the file.
        map: Arc<Mmap>,
        /// Byte offset in the map.
        offset: usize,
        /// Byte length.
        len: usize,
    },
    /// Bytes owned by the tensor (converted or synthesized weights).
    Owned(Arc<Vec<u8>>),
}

impl Storage {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped { map, offset, len } => &map[*offset..*offset + *len],
            Storage::Owned(v) => v,
        }
    }
}

/// A stored tensor: a name, a type, a shape (outermost first) and its bytes.
#[derive(Clone)]
pub struct Tensor {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    storage: Storage,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({} {} {:?})",
            self.name,
            self.dtype.name(),
            self.shape
        )
    }
}

impl Tensor {
    /// A tensor over the given storage. The caller guarantees the byte length matches.
    pub fn new(name: String, dtype: DType, shape: Vec<usize>, storage: Storage) -> Self {
        Self {
            name,
            dtype,
            shape,
            storage,
        }
    }

    /// An owned F32 tensor.
    pub fn from_f32(name: &str, shape: Vec<usize>, values: &[f32]) -> Self {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::new(
            name.to_string(),
            DType::F32,
            shape,
            Storage::Owned(Arc::new(bytes)),
        )
    }

    /// The type's name as llama.cpp writes it (`Q4_1`, `F16`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Shape, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Raw bytes.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }
    /// Number of elements.
    pub fn elems(&self) -> usize {
        self.shape.iter().product()
    }
    /// Elements per row (the innermost dimension).
    pub fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }
    /// Number of rows (all but the innermost dimension).
    pub fn rows(&self) -> usize {
        self.elems() / self.row_len().max(1)
    }
    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_len() / self.dtype.block_elems() * self.dtype.block_bytes()
    }
    /// One row's bytes.
    pub fn row_bytes_of(&self, row: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.bytes()[row * rb..(row + 1) * rb]
    }

    /// The same bytes under another shape of as many elements (`None` otherwise), e.g. a
    /// stack of experts `[count, rows, k]` as one matrix `[count·rows, k]`.
    pub fn reshaped(&self, shape: Vec<usize>) -> Option<Tensor> {
        let same =
            shape.iter().product::<usize>() == self.elems() && shape.last() == self.shape.last();
        same.then(|| Tensor::new(self.name.clone(), self.dtype, shape, self.storage.clone()))
    }

    /// Rows `r0..r1` as a matrix of their own (`[r1 - r0, row_len]`), sharing the file's bytes
    /// when mapped: one expert of a stack. `None` for an empty or out-of-range slice.
    pub fn row_slice(&self, r0: usize, r1: usize) -> Option<Tensor> {
        if r0 >= r1 || r1 > self.rows() {
            return None;
        }
        let rb = self.row_bytes();
        let storage = match &self.storage {
            Storage::Mapped { map, offset, .. } => Storage::Mapped {
                map: Arc::clone(map),
                offset: offset + r0 * rb,
                len: (r1 - r0) * rb,
            },
            Storage::Owned(v) => Storage::Owned(Arc::new(v[r0 * rb..r1 * rb].to_vec())),
        };
        Some(Tensor::new(
            format!("{}[{r0}..{r1}]", self.name),
            self.dtype,
            vec![r1 - r0, self.row_len()],
            storage,
        ))
    }

    /// Tells the OS that this tensor's pages of the model file are not needed now (after the
    /// CPU backend has repacked it): they leave the process's resident memory and are read
    /// again from the page cache if anything touches them later. No effect on owned tensors.
    pub fn release_resident(&self) {
        const PAGE: usize = 4096;
        if let Storage::Mapped { map, offset, len } = &self.storage {
            // Whole pages inside the tensor only.
            let start = offset.div_ceil(PAGE) * PAGE;
            let end = (offset + len) / PAGE * PAGE;
            if end > start {
                // SAFETY: the map is a read-only shared mapping of an unmodified file, so a
                // dropped page reads back the same bytes on its next access; no reference into
                // the map sees anything change.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
    }

    /// Dequantizes one row into `out` (length `row_len`).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        dequantize(self.dtype, self.row_bytes_of(row), out);
    }

    /// One row as f32 (convenience for tests and small tensors).
    pub fn row_f32(&self, row: usize) -> Vec<f32> {
        let mut v = vec![0.0; self.row_len()];
        self.dequantize_row(row, &mut v);
        v
    }

    /// The whole tensor as f32. Only for small tensors (norms, biases) and tests: the engine
    /// never dequantizes weight matrices at load.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut v = vec![0.0; self.elems()];
        for (r, chunk) in v.chunks_mut(self.row_len()).enumerate() {
            self.dequantize_row(r, chunk);
        }
        v
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Dequantizes a run of blocks of type `dtype` into `out`.
pub fn dequantize(dtype: DType, src: &[u8], out: &mut [f32]) {
    let bb = dtype.block_bytes();
    let be = dtype.block_elems();
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        _ => {
            for (o, b) in out.chunks_exact_mut(be).zip(src.chunks_exact(bb)) {
                let f = BlockFields::decode(dtype, b);
                #[allow(clippy::cast_precision_loss)] // small integers: exact
                for (j, v) in o.iter_mut().enumerate() {
                    let s = j / f.sub;
                    *v = f.d * f.sc[s] as f32 * f.codes[j] as f32 - f.dmin * f.mn[s] as f32;
                }
            }
        }
    }
}

/// One block of a quantized type decoded into integers, exactly as GGML defines it: weight
/// `j` is `d · sc[j / sub] · codes[j] − dmin · mn[j / sub]`. `d` and `dmin` are the block's
/// f16 fields (exact in f32); `sc` and `mn` its integer sub-block scales and minimums (1 and 0
/// for the one-scale types; Q4_1/Q5_1 store their additive minimum `m` as `dmin = −m`, `mn = 1`).
/// The reference decoding and the CPU packers share this one reading of the bits.
#[derive(Debug, Clone)]
pub struct BlockFields {
    /// Signed integer codes (offsets already removed; IQ4 codes are table values).
    pub codes: [i32; 256],
    /// Integer scale per sub-block.
    pub sc: [i32; 16],
    /// Integer minimum per sub-block.
    pub mn: [i32; 16],
    /// Block scale.
    pub d: f32,
    /// Block scale of the minimums.
    pub dmin: f32,
    /// Weights per sub-block (16 or 32).
    pub sub: usize,
}

impl BlockFields {
    /// Decodes one block of `dtype` (`b` holds exactly `dtype.block_bytes()` bytes).
    pub fn decode(dtype: DType, b: &[u8]) -> Self {
        let mut f = BlockFields {
            codes: [0; 256],
            sc: [1; 16],
            mn: [0; 16],
            d: 0.0,
            dmin: 0.0,
            sub: 32,
        };
        let codes = &mut f.codes;
        match dtype {
            DType::Q8_0 => {
                f.d = f16_at(b, 0);
                for (j, c) in codes.iter_mut().take(32).enumerate() {
                    *c = i32::from(b[2 + j].cast_signed());
                }
            }
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4NL => {
                f.d = f16_at(b, 0);
                let (qh, qs) = match dtype {
                    DType::Q4_0 | DType::IQ4NL => (0, 2),
                    DType::Q4_1 => (0, 4),
                    DType::Q5_0 => (u32_at(b, 2), 6),
                    _ => (u32_at(b, 4), 8),
                };
                if matches!(dtype, DType::Q4_1 | DType::Q5_1) {
                    f.dmin = -f16_at(b, 2);
                    f.mn[0] = 1;
                }
                let offset = match dtype {
                    DType::Q4_0 => 8,
                    DType::Q5_0 => 16,
                    _ => 0,
                };
                for j in 0..16 {
                    let q = b[qs + j];
                    if dtype == DType::IQ4NL {
                        codes[j] = i32::from(IQ4_VALUES[usize::from(q & 0xF)]);
                        codes[j + 16] = i32::from(IQ4_VALUES[usize::from(q >> 4)]);
                    } else {
                        let bit = |i: usize| i32::from(u8::from((qh >> i) & 1 == 1)) << 4;
                        codes[j] = (i32::from(q & 0xF) | bit(j)) - offset;
                        codes[j + 16] = (i32::from(q >> 4) | bit(j + 16)) - offset;
                    }
                }
            }
            DType::Q2K => {
                let (sc, qs) = (&b[0..16], &b[16..80]);
                (f.d, f.dmin, f.sub) = (f16_at(b, 80), f16_at(b, 82), 16);
                for (s, &v) in sc.iter().enumerate() {
                    f.sc[s] = i32::from(v & 0xF);
                    f.mn[s] = i32::from(v >> 4);
                }
                // Two halves of 128; in each, four shifts of 32 codes read from 32 bytes.
                for half in 0..2 {
                    for shift in 0..4 {
                        for l in 0..32 {
                            let q = qs[32 * half + l];
                            codes[128 * half + 32 * shift + l] = i32::from((q >> (2 * shift)) & 3);
                        }
                    }
                }
            }
            DType::Q3K => {
                let (hm, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
                (f.d, f.sub) = (f16_at(b, 108), 16);
                for s in 0..16 {
                    // 6-bit scales: low 4 bits from bytes 0..8, high 2 bits from bytes 8..12.
                    let lo = if s < 8 { sc[s] & 0xF } else { sc[s - 8] >> 4 };
                    let hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
                    f.sc[s] = i32::from(lo | (hi << 4)) - 32;
                }
                for half in 0..2 {
                    for shift in 0..4 {
                        for l in 0..32 {
                            let low = i32::from((qs[32 * half + l] >> (2 * shift)) & 3);
                            let high = (hm[l] >> (4 * half + shift)) & 1;
                            codes[128 * half + 32 * shift + l] =
                                low - if high == 1 { 0 } else { 4 };
                        }
                    }
                }
            }
            DType::Q4K | DType::Q5K => {
                (f.d, f.dmin) = (f16_at(b, 0), f16_at(b, 2));
                let sc = &b[4..16];
                let (qh, qs) = if dtype == DType::Q5K {
                    (Some(&b[16..48]), &b[48..176])
                } else {
                    (None, &b[16..144])
                };
                for s in 0..8 {
                    let (a, m) = q4k_scale_min(s, sc);
                    (f.sc[s], f.mn[s]) = (i32::from(a), i32::from(m));
                }
                for j in 0..4 {
                    for l in 0..32 {
                        let q = qs[32 * j + l];
                        let (mut lo, mut hi) = (i32::from(q & 0xF), i32::from(q >> 4));
                        if let Some(qh) = qh {
                            lo |= i32::from((qh[l] >> (2 * j)) & 1) << 4;
                            hi |= i32::from((qh[l] >> (2 * j + 1)) & 1) << 4;
                        }
                        codes[64 * j + l] = lo;
                        codes[64 * j + 32 + l] = hi;
                    }
                }
            }
            DType::Q6K => {
                let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
                (f.d, f.sub) = (f16_at(b, 208), 16);
                for (out, &v) in f.sc.iter_mut().zip(sc) {
                    *out = i32::from(v.cast_signed());
                }
                for half in 0..2 {
                    let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                    for l in 0..32 {
                        let j = 128 * half + l;
                        let c = |low: u8, high: u8| i32::from(low | (high << 4)) - 32;
                        codes[j] = c(ql[l] & 0xF, qh[l] & 3);
                        codes[j + 32] = c(ql[l + 32] & 0xF, (qh[l] >> 2) & 3);
                        codes[j + 64] = c(ql[l] >> 4, (qh[l] >> 4) & 3);
                        codes[j + 96] = c(ql[l + 32] >> 4, (qh[l] >> 6) & 3);
                    }
                }
            }
            DType::IQ4XS => {
                f.d = f16_at(b, 0);
                let sh = u16::from_le_bytes([b[2], b[3]]);
                let (sl, qs) = (&b[4..8], &b[8..136]);
                for s in 0..8 {
                    let lo = u16::from((sl[s / 2] >> (4 * (s % 2))) & 0xF);
                    let hi = (sh >> (2 * s)) & 3;
                    f.sc[s] = i32::from(lo | (hi << 4)) - 32;
                    for l in 0..16 {
                        let q = qs[16 * s + l];
                        codes[32 * s + l] = i32::from(IQ4_VALUES[usize::from(q & 0xF)]);
                        codes[32 * s + 16 + l] = i32::from(IQ4_VALUES[usize::from(q >> 4)]);
                    }
                }
            }
            DType::F32 | DType::F16 | DType::BF16 => unreachable!("not a block type"),
        }
        f
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K or Q5_K super-block.
pub fn q4k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_round_trip_matches_layout() {
        // d = 0.5, m = -1.0; nibbles j and j+16 in byte j.
        let mut b = Vec::new();
        b.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b.extend_from_slice(&f16::from_f32(-1.0).to_le_bytes());
        for j in 0..16u8 {
            b.push(j | ((15 - j) << 4));
        }
        let mut out = [0.0; 32];
        dequantize(DType::Q4_1, &b, &mut out);
        assert_eq!(out[0], -1.0);
        assert_eq!(out[3], 0.5);
        assert_eq!(out[16], 0.5 * 15.0 - 1.0);
        assert_eq!(out[31], -1.0);
    }

    #[test]
    fn row_sizes() {
        assert_eq!(DType::Q4_1.bytes_for(64, 128), Some(80));
        assert_eq!(DType::Q4_1.bytes_for(48, 48), None);
        assert_eq!(DType::Q6K.bytes_for(256, 512), Some(420));
    }
}
