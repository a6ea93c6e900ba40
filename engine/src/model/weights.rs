//! Tensors as stored on disk: element types, quantized block layouts, and their storage
//! (memory-mapped from the model file, or owned).

use std::sync::Arc;

use half::{bf16, f16};
use memmap2::Mmap;

/// Element type of a stored tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 32 weights per block: f16 scale, 32 × i8.
    Q8_0,
    /// 32 weights per block: f16 scale, 32 × 4-bit (offset 8).
    Q4_0,
    /// 32 weights per block: f16 scale, f16 min, 32 × 4-bit.
    Q4_1,
    /// 256 weights per super-block: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of 4-bit.
    Q4K,
    /// 256 weights per super-block: 128 bytes low 4 bits, 64 bytes high 2 bits, 16 × i8 scales, f16 d.
    Q6K,
}

impl DType {
    /// The type for a GGML type id, when supported.
    pub fn from_ggml(id: u32) -> Option<Self> {
        Some(match id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            8 => DType::Q8_0,
            12 => DType::Q4K,
            14 => DType::Q6K,
            30 => DType::BF16,
            _ => return None,
        })
    }

    /// The GGML name of a type id (for error messages).
    pub fn ggml_name(id: u32) -> &'static str {
        match id {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16..=23 => "IQ*",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            _ => "unknown",
        }
    }

    /// Display name.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q4K => "Q4_K",
            DType::Q6K => "Q6_K",
        }
    }

    /// Weights per block (1 for plain floats).
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => 32,
            DType::Q4K | DType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q4K => 144,
            DType::Q6K => 210,
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

    /// Name.
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

/// Dequantizes a run of blocks of type `dtype` into `out`.
pub fn dequantize(dtype: DType, src: &[u8], out: &mut [f32]) {
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
        DType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for (j, v) in o.iter_mut().enumerate() {
                    *v = d * f32::from(b[2 + j].cast_signed());
                }
            }
        }
        DType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(18)) {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    o[j] = d * (f32::from(q & 0xF) - 8.0);
                    o[j + 16] = d * (f32::from(q >> 4) - 8.0);
                }
            }
        }
        DType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(20)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                for j in 0..16 {
                    let q = b[4 + j];
                    o[j] = d * f32::from(q & 0xF) + m;
                    o[j + 16] = d * f32::from(q >> 4) + m;
                }
            }
        }
        DType::Q4K => {
            for (o, b) in out.chunks_exact_mut(256).zip(src.chunks_exact(144)) {
                let d = f16_at(b, 0);
                let dmin = f16_at(b, 2);
                let scales = &b[4..16];
                let qs = &b[16..144];
                for j in 0..4 {
                    let (sc0, m0) = q4k_scale_min(2 * j, scales);
                    let (sc1, m1) = q4k_scale_min(2 * j + 1, scales);
                    let (d0, mm0) = (d * f32::from(sc0), dmin * f32::from(m0));
                    let (d1, mm1) = (d * f32::from(sc1), dmin * f32::from(m1));
                    let q = &qs[32 * j..32 * j + 32];
                    for l in 0..32 {
                        o[64 * j + l] = d0 * f32::from(q[l] & 0xF) - mm0;
                        o[64 * j + 32 + l] = d1 * f32::from(q[l] >> 4) - mm1;
                    }
                }
            }
        }
        DType::Q6K => {
            for (o, b) in out.chunks_exact_mut(256).zip(src.chunks_exact(210)) {
                let ql = &b[0..128];
                let qh = &b[128..192];
                let sc = &b[192..208];
                let d = f16_at(b, 208);
                for half in 0..2 {
                    let ql = &ql[64 * half..];
                    let qh = &qh[32 * half..];
                    let sc = &sc[8 * half..];
                    let o = &mut o[128 * half..];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                        let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                        let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                        let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                        let s = |k: usize| d * f32::from(sc[is + k].cast_signed());
                        #[allow(clippy::cast_precision_loss)]
                        {
                            o[l] = s(0) * q1 as f32;
                            o[l + 32] = s(2) * q2 as f32;
                            o[l + 64] = s(4) * q3 as f32;
                            o[l + 96] = s(6) * q4 as f32;
                        }
                    }
                }
            }
        }
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K super-block.
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
