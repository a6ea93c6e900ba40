//! Quantized weight matrices repacked at load into groups of eight interleaved rows, the
//! layout the integer kernels of [`super::gemm`] stream through.
//!
//! For each group of eight rows and each block of 32 columns, one record holds:
//! - the eight rows' f16 scales `d` (16 bytes: one load and one F16C conversion for all
//!   eight), then for Q4_1 the eight f16 minimums `m` (16 bytes);
//! - the codes as four 32-byte vectors, each pairing row `p` with row `p + 4`:
//!   - Q4_0/Q4_1 (`[row p's 16 bytes | row p+4's 16 bytes]`, the GGUF nibble order: byte `j`
//!     holds code `j` low and code `j + 16` high), so one mask gives both rows' codes
//!     0..16 and one shift and mask their codes 16..32;
//!   - Q8_0: eight vectors, the low halves then the high halves of each pair
//!     (`[row p: codes 0..16 | row p+4: codes 0..16]`, then codes 16..32).
//!
//! A group's records are contiguous, so a kernel reads one stream per group. The bytes per
//! weight are those of the file (20 per 32 for Q4_1); a last partial group is padded with
//! zero rows whose outputs are never written.

use std::sync::Arc;

use half::f16;
use memmap2::{Advice, Mmap, MmapMut};

use super::quant::QK;
use crate::model::weights::{DType, Tensor};

/// Rows per interleaved group.
pub const GROUP: usize = 8;

/// The weight formats with packed integer kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedFormat {
    /// f16 scale, codes 0..16 with an offset of 8.
    Q4_0,
    /// f16 scale and minimum, codes 0..16.
    Q4_1,
    /// f16 scale, signed 8-bit codes.
    Q8_0,
}

impl PackedFormat {
    /// The packed format for a stored type, when it has integer kernels.
    pub fn for_dtype(dtype: DType) -> Option<Self> {
        match dtype {
            DType::Q4_0 => Some(Self::Q4_0),
            DType::Q4_1 => Some(Self::Q4_1),
            DType::Q8_0 => Some(Self::Q8_0),
            _ => None,
        }
    }

    /// Bytes of one group's record for one block of 32 columns.
    pub const fn record_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 16 + 4 * 32,
            Self::Q4_1 => 32 + 4 * 32,
            Self::Q8_0 => 16 + 8 * 32,
        }
    }

    /// Byte offset of the codes within a record.
    pub const fn codes_offset(self) -> usize {
        match self {
            Self::Q4_1 => 32,
            Self::Q4_0 | Self::Q8_0 => 16,
        }
    }

    /// The GGUF block size of the format (bytes per 32 weights of one row).
    fn gguf_block(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
        }
    }
}

/// A weight matrix in the interleaved layout.
pub struct PackedMatrix {
    format: PackedFormat,
    rows: usize,
    k: usize,
    /// The arena holding this matrix (shared by every matrix packed with it).
    mem: Arc<Mmap>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedMatrix({:?} {}×{})",
            self.format, self.rows, self.k
        )
    }
}

/// Where a matrix goes in the arena, before its bytes are written.
struct Plan {
    format: PackedFormat,
    rows: usize,
    k: usize,
    len: usize,
}

/// Huge pages: the kernels stream every weight once per decode step, and 2 MiB pages save
/// most of the TLB misses of doing so (measured: about 9% faster batch-1 decode).
const HUGE_PAGE: usize = 2 << 20;

fn plan(tensors: &[&Tensor]) -> Option<Plan> {
    let first = tensors.first()?;
    let format = PackedFormat::for_dtype(first.dtype())?;
    let k = first.row_len();
    if k == 0
        || !k.is_multiple_of(QK)
        || tensors
            .iter()
            .any(|t| t.dtype() != first.dtype() || t.row_len() != k)
    {
        return None;
    }
    let rows: usize = tensors.iter().map(|t| t.rows()).sum();
    let len = rows.div_ceil(GROUP) * (k / QK) * format.record_bytes();
    Some(Plan {
        format,
        rows,
        k,
        len,
    })
}

/// Writes `tensors` (stacked by rows) into `out` in the interleaved layout.
fn fill(p: &Plan, tensors: &[&Tensor], out: &mut [u8]) {
    let (format, nb, rec) = (p.format, p.k / QK, p.format.record_bytes());
    let src_rows = tensors
        .iter()
        .flat_map(|t| (0..t.rows()).map(move |r| t.row_bytes_of(r)));
    for (r, src) in src_rows.enumerate() {
        let (g, i) = (r / GROUP, r % GROUP);
        let at = (i % 4) * 32 + (i / 4) * 16;
        for b in 0..nb {
            let blk = &src[b * format.gguf_block()..(b + 1) * format.gguf_block()];
            let rec_out = &mut out[(g * nb + b) * rec..(g * nb + b + 1) * rec];
            rec_out[2 * i..2 * i + 2].copy_from_slice(&blk[..2]);
            match format {
                PackedFormat::Q4_1 => {
                    rec_out[16 + 2 * i..18 + 2 * i].copy_from_slice(&blk[2..4]);
                    rec_out[32 + at..48 + at].copy_from_slice(&blk[4..20]);
                }
                PackedFormat::Q4_0 => rec_out[16 + at..32 + at].copy_from_slice(&blk[2..18]),
                PackedFormat::Q8_0 => {
                    // Low halves of the four pairs, then the high halves.
                    rec_out[16 + at..32 + at].copy_from_slice(&blk[2..18]);
                    rec_out[144 + at..160 + at].copy_from_slice(&blk[18..34]);
                }
            }
        }
    }
}

/// Repacks each set of tensors (stacked by rows) into one shared arena on huge pages; a set
/// comes back `None` when its type has no packed kernels, its tensors differ in type or row
/// length, or the row length is not whole blocks (or when memory cannot be had).
pub fn pack_all(sets: &[Vec<&Tensor>]) -> Vec<Option<PackedMatrix>> {
    let plans: Vec<Option<Plan>> = sets.iter().map(|s| plan(s)).collect();
    // Each matrix starts on a 64-byte line.
    let mut offsets = Vec::with_capacity(plans.len());
    let mut total = 0;
    for p in &plans {
        offsets.push(total);
        total += p.as_ref().map_or(0, |p| p.len.div_ceil(64) * 64);
    }
    let map = (total > 0)
        .then(|| MmapMut::map_anon(total.div_ceil(HUGE_PAGE) * HUGE_PAGE).ok())
        .flatten();
    let Some(mut map) = map else {
        return plans.iter().map(|_| None).collect();
    };
    // Only advice: without transparent huge pages the arena is ordinary memory.
    let _ = map.advise(Advice::HugePage);
    for ((p, set), &off) in plans.iter().zip(sets).zip(&offsets) {
        if let Some(p) = p {
            fill(p, set, &mut map[off..off + p.len]);
        }
    }
    let Ok(mem) = map.make_read_only() else {
        return plans.iter().map(|_| None).collect();
    };
    let mem = Arc::new(mem);
    plans
        .into_iter()
        .zip(offsets)
        .map(|(p, offset)| {
            p.map(|p| PackedMatrix {
                format: p.format,
                rows: p.rows,
                k: p.k,
                mem: Arc::clone(&mem),
                offset,
                len: p.len,
            })
        })
        .collect()
}

impl PackedMatrix {
    /// Repacks `tensors` stacked by rows (all of one format and row length) into an arena of
    /// their own; see [`pack_all`].
    pub fn pack(tensors: &[&Tensor]) -> Option<Self> {
        pack_all(&[tensors.to_vec()]).pop().flatten()
    }

    fn data(&self) -> &[u8] {
        &self.mem[self.offset..self.offset + self.len]
    }

    /// The format.
    pub fn format(&self) -> PackedFormat {
        self.format
    }

    /// Rows (outputs per input row).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Row length (inputs per output).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Number of eight-row groups.
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    /// Group `g`'s records (`k / 32` of them).
    pub fn group(&self, g: usize) -> &[u8] {
        let len = self.k / QK * self.format.record_bytes();
        &self.data()[g * len..(g + 1) * len]
    }

    /// The records of groups `g..` to the end.
    pub fn groups_from(&self, g: usize) -> &[u8] {
        let len = self.k / QK * self.format.record_bytes();
        &self.data()[g * len..]
    }

    /// Bytes held (what one pass over the matrix reads).
    pub fn bytes(&self) -> usize {
        self.len
    }

    /// Row `r` as f32, decoded from the packed layout (tests compare it with the file's).
    pub fn row_f32(&self, r: usize) -> Vec<f32> {
        let nb = self.k / QK;
        let (g, i) = (r / GROUP, r % GROUP);
        let (p, half) = (i % 4, i / 4);
        let rec = self.format.record_bytes();
        let mut out = Vec::with_capacity(self.k);
        for b in 0..nb {
            let blk = &self.data()[(g * nb + b) * rec..(g * nb + b + 1) * rec];
            let d = f16::from_le_bytes([blk[2 * i], blk[2 * i + 1]]).to_f32();
            let codes = &blk[self.format.codes_offset()..];
            let at = p * 32 + half * 16;
            match self.format {
                PackedFormat::Q8_0 => {
                    let c = codes[at..at + 16]
                        .iter()
                        .chain(&codes[128 + at..128 + at + 16]);
                    out.extend(c.map(|&c| d * f32::from(c.cast_signed())));
                }
                PackedFormat::Q4_0 | PackedFormat::Q4_1 => {
                    let (m, off) = if self.format == PackedFormat::Q4_1 {
                        let m = f16::from_le_bytes([blk[16 + 2 * i], blk[17 + 2 * i]]).to_f32();
                        (m, 0.0)
                    } else {
                        (0.0, 8.0)
                    };
                    let c = &codes[at..at + 16];
                    let lo = c.iter().map(|&c| f32::from(c & 0xF));
                    let hi = c.iter().map(|&c| f32::from(c >> 4));
                    out.extend(lo.chain(hi).map(|u| d * (u - off) + m));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::GgufFile;
    use crate::model::testing::{FixtureRng, GgufBuilder};

    #[test]
    fn packed_rows_decode_to_the_files_values() {
        for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0] {
            let mut b = GgufBuilder::new();
            let mut rng = FixtureRng::new(2);
            // 13 + 6 rows: two tensors stacked, a partial last group.
            b.tensor_quantized("a", &[13, 96], dtype, &rng.vec(13 * 96, 1.0));
            b.tensor_quantized("b", &[6, 96], dtype, &rng.vec(6 * 96, 1.0));
            let (_dir, path) = b.write_temp();
            let g = GgufFile::open(&path).expect("gguf");
            let (ta, tb) = (g.tensor("a").expect("a"), g.tensor("b").expect("b"));
            let m = PackedMatrix::pack(&[&ta, &tb]).expect("packs");
            assert_eq!((m.rows(), m.k(), m.groups()), (19, 96, 3));
            for r in 0..19 {
                let want = if r < 13 {
                    ta.row_f32(r)
                } else {
                    tb.row_f32(r - 13)
                };
                assert_eq!(m.row_f32(r), want, "{dtype:?} row {r}");
            }
        }
    }

    #[test]
    fn mixed_or_unpackable_tensors_are_refused() {
        let mut b = GgufBuilder::new();
        let mut rng = FixtureRng::new(3);
        b.tensor_quantized("a", &[8, 64], DType::Q4_1, &rng.vec(8 * 64, 1.0));
        b.tensor_quantized("b", &[8, 64], DType::Q8_0, &rng.vec(8 * 64, 1.0));
        b.tensor_quantized("c", &[8, 64], DType::F16, &rng.vec(8 * 64, 1.0));
        let (_dir, path) = b.write_temp();
        let g = GgufFile::open(&path).expect("gguf");
        let (a, bb, c) = (
            g.tensor("a").expect("a"),
            g.tensor("b").expect("b"),
            g.tensor("c").expect("c"),
        );
        assert!(PackedMatrix::pack(&[&a, &bb]).is_none());
        assert!(PackedMatrix::pack(&[&c]).is_none());
        assert!(PackedMatrix::pack(&[&a]).is_some());
    }
}
