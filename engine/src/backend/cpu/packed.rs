//! Quantized weight matrices repacked at load into groups of eight interleaved rows, the
//! layout the integer kernels of [`super::gemm`] stream through. Every block type of
//! llama.cpp's presets has a packed format; the bytes per weight stay those of the file
//! (within a few percent), so the packed arena replaces the file's pages.
//!
//! For each group of eight rows and each block of 32 columns, one record holds, in order:
//! - **scales**: for the one-scale types (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q8_0) the eight
//!   rows' f16 scales `d` (16 bytes: one load and one F16C conversion for all eight), then for
//!   Q4_1/Q5_1 the eight f16 minimums `m`; for the K-quants the rows' integer sub-block
//!   scales, one byte each (8 bytes for sub-blocks of 32; 16 for sub-blocks of 16: the first
//!   halves' then the second halves'), then for Q4_K/Q5_K the eight 6-bit minimums (Q2_K keeps
//!   its scale and minimum nibbles in one byte, as the file does);
//! - **bit planes** (codes wider than their nibble, and the 2- and 3-bit codes): 32 bytes per
//!   plane, byte `k` for position `k` of the code vectors below, its bit `2p + v` the plane's
//!   bit of position `k` of vector `(p, v)`, so one load serves all eight vectors and each
//!   takes its bit with one shift and one mask;
//! - **codes** as eight 32-byte vectors `(p, v)` of four codes per row: byte `4r + m` of vector
//!   `(p, v)` is row `r`'s code `16v + 4p + m` ([`slot`]), so each 32-bit lane is one row's
//!   four codes and one multiply-add of a vector with four activation codes broadcast gives
//!   the eight rows' sums, lane by lane, with nothing to add across lanes:
//!   - the nibble formats keep the pairs `(p, 0)` and `(p, 1)` in one vector's low and high
//!     nibbles (four vectors), so one mask gives codes 0..16 and one shift and mask 16..32;
//!   - Q8_0: the eight vectors as bytes, the `v = 0` ones first.
//!
//! The K-quants' super-blocks of 256 columns keep one more header before their eight records:
//! the rows' f16 `d`, then (for the types with minimums) their f16 `dmin`. Codes are stored
//! unsigned (`code + offset`, or the table index for IQ4); a kernel subtracts the offset or
//! looks the value up.
//!
//! A group's records are contiguous, so a kernel reads one stream per group; a last partial
//! group is padded with zero rows whose outputs are never written.

use std::sync::Arc;

use half::f16;
use memmap2::{Advice, Mmap, MmapMut};

use super::quant::QK;
use crate::model::weights::{BlockFields, DType, IQ4_VALUES, Tensor};

/// Rows per interleaved group.
pub const GROUP: usize = 8;

/// Columns per K-quant super-block (eight records).
pub const SUPER: usize = 256;

/// The weight formats with packed integer kernels: one per block type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PackedFormat {
    /// f16 scale, codes 0..16 with an offset of 8.
    Q4_0,
    /// f16 scale and minimum, codes 0..16.
    Q4_1,
    /// f16 scale, signed 8-bit codes.
    Q8_0,
    /// f16 scale, 5-bit codes (nibble + one plane) with an offset of 16.
    Q5_0,
    /// f16 scale and minimum, 5-bit codes.
    Q5_1,
    /// f16 scale, 4-bit indices into the IQ4 table.
    IQ4NL,
    /// Super-blocks: 2-bit codes (two planes), 4-bit scales and minimums per 16.
    Q2K,
    /// Super-blocks: 3-bit codes (three planes) with an offset of 4, signed scales per 16.
    Q3K,
    /// Super-blocks: 4-bit codes, 6-bit scales and minimums per 32.
    Q4K,
    /// Super-blocks: 5-bit codes, 6-bit scales and minimums per 32.
    Q5K,
    /// Super-blocks: 6-bit codes (nibble + two planes) with an offset of 32, i8 scales per 16.
    Q6K,
    /// Super-blocks: 4-bit IQ4 table indices, signed 6-bit scales per 32.
    IQ4XS,
}

impl PackedFormat {
    /// Every format (tests iterate it).
    pub const ALL: [PackedFormat; 12] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q8_0,
        Self::Q5_0,
        Self::Q5_1,
        Self::IQ4NL,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::IQ4XS,
    ];

    /// The packed format for a stored type, when it has integer kernels.
    pub fn for_dtype(dtype: DType) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.dtype() == dtype)
    }

    /// The format numbered `id` (the kernels' const parameter: `f as u8`).
    pub const fn from_id(id: u8) -> Self {
        Self::ALL[id as usize]
    }

    /// The stored type this format packs.
    pub const fn dtype(self) -> DType {
        match self {
            Self::Q4_0 => DType::Q4_0,
            Self::Q4_1 => DType::Q4_1,
            Self::Q8_0 => DType::Q8_0,
            Self::Q5_0 => DType::Q5_0,
            Self::Q5_1 => DType::Q5_1,
            Self::IQ4NL => DType::IQ4NL,
            Self::Q2K => DType::Q2K,
            Self::Q3K => DType::Q3K,
            Self::Q4K => DType::Q4K,
            Self::Q5K => DType::Q5K,
            Self::Q6K => DType::Q6K,
            Self::IQ4XS => DType::IQ4XS,
        }
    }

    /// Whether the format has K-quant super-blocks (a header per 256 columns, integer scales
    /// per record).
    pub const fn is_super(self) -> bool {
        matches!(
            self,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K | Self::IQ4XS
        )
    }

    /// Whether sub-blocks are 16 columns (two integer scales per record).
    pub const fn sub16(self) -> bool {
        matches!(self, Self::Q2K | Self::Q3K | Self::Q6K)
    }

    /// Whether weights carry a minimum (`− dmin·mn` or `+ m`).
    pub const fn has_min(self) -> bool {
        matches!(
            self,
            Self::Q4_1 | Self::Q5_1 | Self::Q2K | Self::Q4K | Self::Q5K
        )
    }

    /// Whether the low four bits of each code are in the nibble vectors.
    pub const fn nibble(self) -> bool {
        !matches!(self, Self::Q8_0 | Self::Q2K | Self::Q3K)
    }

    /// Bit planes beyond the nibble (or, without a nibble, all of the code's bits).
    pub const fn planes(self) -> usize {
        match self {
            Self::Q5_0 | Self::Q5_1 | Self::Q5K => 1,
            Self::Q2K | Self::Q6K => 2,
            Self::Q3K => 3,
            _ => 0,
        }
    }

    /// The offset stored codes carry (`stored = code + offset`).
    pub const fn offset(self) -> i32 {
        match self {
            Self::Q4_0 => 8,
            Self::Q5_0 => 16,
            Self::Q3K => 4,
            Self::Q6K => 32,
            _ => 0,
        }
    }

    /// Whether codes are IQ4 table indices.
    pub const fn lut(self) -> bool {
        matches!(self, Self::IQ4NL | Self::IQ4XS)
    }

    /// Bytes of a record's scales (and minimums) before its planes.
    pub const fn scale_bytes(self) -> usize {
        match self {
            Self::Q8_0 | Self::Q4_0 | Self::Q5_0 | Self::IQ4NL => 16,
            Self::Q4_1 | Self::Q5_1 => 32,
            Self::Q2K | Self::Q3K | Self::Q6K | Self::Q4K | Self::Q5K => 16,
            Self::IQ4XS => 8,
        }
    }

    /// Byte offset of the bit planes within a record.
    pub const fn planes_offset(self) -> usize {
        self.scale_bytes()
    }

    /// Byte offset of the codes within a record.
    pub const fn codes_offset(self) -> usize {
        self.planes_offset() + 32 * self.planes()
    }

    /// Bytes of one group's record for one block of 32 columns.
    pub const fn record_bytes(self) -> usize {
        let codes = match self {
            Self::Q8_0 => 8 * 32,
            _ if self.nibble() => 4 * 32,
            _ => 0,
        };
        self.codes_offset() + codes
    }

    /// Bytes of one group's super-block header (0 for the one-scale formats).
    pub const fn super_header_bytes(self) -> usize {
        match (self.is_super(), self.has_min()) {
            (false, _) => 0,
            (true, false) => 16,
            (true, true) => 32,
        }
    }

    /// Columns a row length must be a multiple of.
    pub const fn block_cols(self) -> usize {
        if self.is_super() { SUPER } else { QK }
    }

    /// Bytes of one group (eight rows) of `k` columns.
    pub const fn group_bytes(self, k: usize) -> usize {
        k / QK * self.record_bytes() + k / SUPER * self.super_header_bytes()
    }

    /// Byte offset of block `b`'s record within a group.
    pub const fn record_offset(self, b: usize) -> usize {
        if self.is_super() {
            let per_super = self.super_header_bytes() + 8 * self.record_bytes();
            b / 8 * per_super + self.super_header_bytes() + b % 8 * self.record_bytes()
        } else {
            b * self.record_bytes()
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
        || !k.is_multiple_of(format.block_cols())
        || tensors
            .iter()
            .any(|t| t.dtype() != first.dtype() || t.row_len() != k)
    {
        return None;
    }
    let rows: usize = tensors.iter().map(|t| t.rows()).sum();
    let len = rows.div_ceil(GROUP) * format.group_bytes(k);
    Some(Plan {
        format,
        rows,
        k,
        len,
    })
}

/// Writes `tensors` (stacked by rows) into `out` in the interleaved layout.
fn fill(p: &Plan, tensors: &[&Tensor], out: &mut [u8]) {
    let format = p.format;
    let dtype = format.dtype();
    let (be, bb) = (dtype.block_elems(), dtype.block_bytes());
    let gbytes = format.group_bytes(p.k);
    let src_rows = tensors
        .iter()
        .flat_map(|t| (0..t.rows()).map(move |r| t.row_bytes_of(r)));
    for (r, src) in src_rows.enumerate() {
        let (g, i) = (r / GROUP, r % GROUP);
        let grp = &mut out[g * gbytes..(g + 1) * gbytes];
        for (fb, blk) in src.chunks_exact(bb).enumerate() {
            if format == PackedFormat::Q8_0 {
                // The file's codes as they are, in the vector order.
                let rec = &mut grp[format.record_offset(fb)..][..format.record_bytes()];
                rec[2 * i..2 * i + 2].copy_from_slice(&blk[..2]);
                for (j, &c) in blk[2..34].iter().enumerate() {
                    let (p, v, k) = slot(i, j);
                    rec[16 + 128 * v + 32 * p + k] = c;
                }
                continue;
            }
            let f = BlockFields::decode(dtype, blk);
            if format.is_super() {
                let hdr = format.record_offset(fb * 8) - format.super_header_bytes();
                put_f16(&mut grp[hdr + 2 * i..], f.d);
                if format.has_min() {
                    put_f16(&mut grp[hdr + 16 + 2 * i..], f.dmin);
                }
            }
            for sb in 0..be / QK {
                let b = fb * (be / QK) + sb;
                let rec = &mut grp[format.record_offset(b)..][..format.record_bytes()];
                put_scales(format, &f, sb, i, rec);
                let codes: [u8; QK] =
                    std::array::from_fn(|j| stored_code(format, f.codes[sb * QK + j]));
                put_codes(format, &codes, i, rec);
            }
        }
    }
}

fn put_f16(out: &mut [u8], v: f32) {
    out[..2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// The unsigned code a record stores for a signed code.
fn stored_code(format: PackedFormat, code: i32) -> u8 {
    if format.lut() {
        let v = IQ4_VALUES.iter().position(|&t| i32::from(t) == code);
        // Table values come from the table: always found.
        return u8::try_from(v.unwrap_or(0)).unwrap_or(0);
    }
    u8::try_from(code + format.offset()).unwrap_or(0)
}

/// Row `i`'s scales of sub-block `sb` (32 columns) of block fields `f` into `rec`.
fn put_scales(format: PackedFormat, f: &BlockFields, sb: usize, i: usize, rec: &mut [u8]) {
    // Integer sub-scales and minimums fit a byte in every format (6 bits, or i8 for Q6_K).
    let byte = |v: i32| i8::try_from(v).map_or(0, i8::cast_unsigned);
    if !format.is_super() {
        put_f16(&mut rec[2 * i..], f.d);
        if format.has_min() {
            put_f16(&mut rec[16 + 2 * i..], -f.dmin);
        }
    } else if format == PackedFormat::Q2K {
        for h in 0..2 {
            let s = 2 * sb + h;
            rec[8 * h + i] = u8::try_from(f.sc[s] | (f.mn[s] << 4)).unwrap_or(0);
        }
    } else if format.sub16() {
        rec[i] = byte(f.sc[2 * sb]);
        rec[8 + i] = byte(f.sc[2 * sb + 1]);
    } else {
        rec[i] = byte(f.sc[sb]);
        if format.has_min() {
            rec[8 + i] = byte(f.mn[sb]);
        }
    }
}

/// Where row `i`'s code `j` of a block lives: its code vector `(p, v)` and byte `k` there.
pub const fn slot(i: usize, j: usize) -> (usize, usize, usize) {
    ((j % 16) / 4, j / 16, 4 * i + j % 4)
}

/// Row `i`'s 32 stored codes into `rec`'s planes and nibble vectors.
fn put_codes(format: PackedFormat, codes: &[u8; QK], i: usize, rec: &mut [u8]) {
    if format.nibble() {
        for j in 0..16 {
            let (p, _, k) = slot(i, j);
            rec[format.codes_offset() + 32 * p + k] =
                (codes[j] & 0xF) | ((codes[j + 16] & 0xF) << 4);
        }
    }
    let shift = if format.nibble() { 4 } else { 0 };
    for plane in 0..format.planes() {
        let at = format.planes_offset() + 32 * plane;
        for (j, c) in codes.iter().enumerate() {
            let (p, v, k) = slot(i, j);
            rec[at + k] |= ((c >> (shift + plane)) & 1) << (2 * p + v);
        }
    }
}

/// Repacks each set of tensors (stacked by rows) into one shared arena on huge pages; a set
/// comes back `None` when its type has no packed kernels, its tensors differ in type or row
/// length, or the row length is not whole blocks (or when memory cannot be had). Each packed
/// set's pages of the model file leave resident memory as soon as it is packed
/// ([`Tensor::release_resident`]), so the file and its packed copy are never resident whole
/// together.
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
    fill_all(&plans, sets, &offsets, &mut map);
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

/// Fills every planned matrix's region of `arena` (at `offsets`) from its set, on every core:
/// the regions are disjoint, handed out largest first to the least loaded thread. Each set's
/// file pages are released once it is packed.
fn fill_all(plans: &[Option<Plan>], sets: &[Vec<&Tensor>], offsets: &[usize], arena: &mut [u8]) {
    type Job<'a, 'b> = (&'a Plan, &'a [&'b Tensor], &'a mut [u8]);
    let mut jobs: Vec<Job<'_, '_>> = Vec::new();
    let mut rest = arena;
    let mut at = 0;
    for ((p, set), &off) in plans.iter().zip(sets).zip(offsets) {
        let Some(p) = p else { continue };
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(off - at);
        let (mine, tail) = tail.split_at_mut(p.len);
        rest = tail;
        at = off + p.len;
        jobs.push((p, set, mine));
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .clamp(1, jobs.len().max(1));
    jobs.sort_by_key(|j| std::cmp::Reverse(j.0.len));
    let mut bins: Vec<(usize, Vec<Job<'_, '_>>)> = (0..threads).map(|_| (0, Vec::new())).collect();
    for job in jobs {
        if let Some(bin) = bins.iter_mut().min_by_key(|b| b.0) {
            bin.0 += job.0.len;
            bin.1.push(job);
        }
    }
    std::thread::scope(|scope| {
        for (_, bin) in bins {
            scope.spawn(move || {
                for (p, set, out) in bin {
                    fill(p, set, out);
                    set.iter().for_each(|t| t.release_resident());
                }
            });
        }
    });
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
        let len = self.format.group_bytes(self.k);
        &self.data()[g * len..(g + 1) * len]
    }

    /// The records of groups `g..` to the end.
    pub fn groups_from(&self, g: usize) -> &[u8] {
        let len = self.format.group_bytes(self.k);
        &self.data()[g * len..]
    }

    /// Bytes held (what one pass over the matrix reads).
    pub fn bytes(&self) -> usize {
        self.len
    }

    /// Row `r` as f32, decoded from the packed layout (tests compare it with the file's).
    pub fn row_f32(&self, r: usize) -> Vec<f32> {
        let (g, i) = (r / GROUP, r % GROUP);
        let grp = self.group(g);
        let mut out = Vec::with_capacity(self.k);
        for b in 0..self.k / QK {
            let codes = row_codes(self.format, grp, b, i);
            let (scale, min) = row_scales(self.format, grp, b, i);
            #[allow(clippy::cast_precision_loss)] // small integers: exact
            out.extend(
                codes
                    .iter()
                    .enumerate()
                    .map(|(j, &c)| scale[j / 16] * c as f32 - min[j / 16]),
            );
        }
        out
    }
}

/// Row `i`'s 32 signed codes of block `b` of group bytes `grp` (the packed layout read back).
pub fn row_codes(format: PackedFormat, grp: &[u8], b: usize, i: usize) -> [i32; QK] {
    let rec = &grp[format.record_offset(b)..][..format.record_bytes()];
    if format == PackedFormat::Q8_0 {
        return std::array::from_fn(|j| {
            let (p, v, k) = slot(i, j);
            i32::from(rec[16 + 128 * v + 32 * p + k].cast_signed())
        });
    }
    let mut u = [0u8; QK];
    if format.nibble() {
        for j in 0..16 {
            let (p, _, k) = slot(i, j);
            let byte = rec[format.codes_offset() + 32 * p + k];
            u[j] = byte & 0xF;
            u[j + 16] = byte >> 4;
        }
    }
    let shift = if format.nibble() { 4 } else { 0 };
    for plane in 0..format.planes() {
        let at = format.planes_offset() + 32 * plane;
        for (j, c) in u.iter_mut().enumerate() {
            let (p, v, k) = slot(i, j);
            *c |= ((rec[at + k] >> (2 * p + v)) & 1) << (shift + plane);
        }
    }
    u.map(|c| {
        if format.lut() {
            i32::from(IQ4_VALUES[usize::from(c & 0xF)])
        } else {
            i32::from(c) - format.offset()
        }
    })
}

/// Row `i`'s effective scale and minimum of block `b`, per 16-column half (weight =
/// `scale · code − min`), from the packed layout.
pub fn row_scales(format: PackedFormat, grp: &[u8], b: usize, i: usize) -> ([f32; 2], [f32; 2]) {
    let rec = &grp[format.record_offset(b)..][..format.record_bytes()];
    let f16_at = |bytes: &[u8], at: usize| f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32();
    if !format.is_super() {
        let d = f16_at(rec, 2 * i);
        let m = if format.has_min() {
            -f16_at(rec, 16 + 2 * i)
        } else {
            0.0
        };
        return ([d; 2], [m; 2]);
    }
    let hdr = format.record_offset(b / 8 * 8) - format.super_header_bytes();
    let d = f16_at(grp, hdr + 2 * i);
    let dmin = if format.has_min() {
        f16_at(grp, hdr + 16 + 2 * i)
    } else {
        0.0
    };
    let s = |at: usize| f32::from(rec[at].cast_signed());
    let u = |at: usize| f32::from(rec[at]);
    match format {
        PackedFormat::Q2K => {
            let (a, c) = (rec[i], rec[8 + i]);
            (
                [d * f32::from(a & 0xF), d * f32::from(c & 0xF)],
                [dmin * f32::from(a >> 4), dmin * f32::from(c >> 4)],
            )
        }
        _ if format.sub16() => ([d * s(i), d * s(8 + i)], [0.0; 2]),
        _ if format.has_min() => ([d * s(i); 2], [dmin * u(8 + i); 2]),
        _ => ([d * s(i); 2], [0.0; 2]),
    }
}

/// Seeded random blocks of `dtype` for `rows × k` weights: every code bit pattern occurs, and
/// the f16 scale fields hold finite values in ±`scale` (minimums' scales non-negative).
#[cfg(test)]
pub(crate) fn random_blocks(dtype: DType, rows: usize, k: usize, seed: u64, scale: f32) -> Vec<u8> {
    let mut rng = crate::model::testing::FixtureRng::new(seed);
    let n = rows * k / dtype.block_elems();
    let bb = dtype.block_bytes();
    let mut out = Vec::with_capacity(n * bb);
    // The f16 fields of each block type: (offset, non-negative).
    let fields: &[(usize, bool)] = match dtype {
        DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::IQ4NL | DType::IQ4XS => &[(0, false)],
        DType::Q4_1 | DType::Q5_1 => &[(0, false), (2, false)],
        DType::Q2K => &[(80, false), (82, true)],
        DType::Q3K => &[(108, false)],
        DType::Q4K | DType::Q5K => &[(0, false), (2, true)],
        DType::Q6K => &[(208, false)],
        DType::F32 | DType::F16 | DType::BF16 => &[],
    };
    for _ in 0..n {
        let start = out.len();
        for _ in 0..bb {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            out.push(((rng.next_f32() + 1.0) * 127.99) as u8);
        }
        for &(at, positive) in fields {
            let v = rng.next_f32() * scale;
            let v = if positive { v.abs() } else { v };
            out[start + at..start + at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::GgufFile;
    use crate::model::testing::{FixtureRng, GgufBuilder};

    /// Every block type: random blocks (every bit pattern) of two stacked tensors with a
    /// partial last group read back from the packed layout exactly as the file decodes them.
    #[test]
    fn every_format_packs_rows_that_decode_to_the_files_values() {
        for fmt in PackedFormat::ALL {
            let dtype = fmt.dtype();
            let k = fmt.block_cols() * 2;
            let mut b = GgufBuilder::new();
            let id = dtype.ggml_id();
            b.tensor_raw("a", &[13, k], id, &random_blocks(dtype, 13, k, 11, 0.1));
            b.tensor_raw("b", &[6, k], id, &random_blocks(dtype, 6, k, 12, 0.1));
            let (_dir, path) = b.write_temp();
            let g = GgufFile::open(&path).expect("gguf");
            let (ta, tb) = (g.tensor("a").expect("a"), g.tensor("b").expect("b"));
            let m = PackedMatrix::pack(&[&ta, &tb]).expect("packs");
            assert_eq!(m.format(), fmt);
            assert_eq!((m.rows(), m.k(), m.groups()), (19, k, 3));
            // Within 4% of the file's bytes (Q3_K's 3.6% is the most).
            // Bytes a row (24 packed rows, 19 file rows), at most 26/25 of the file's.
            let (file, packed) = ((ta.bytes().len() + tb.bytes().len()) * 24, m.bytes() * 19);
            assert!(
                packed * 25 <= file * 26,
                "{fmt:?}: {packed} bytes a row vs the file's {file}"
            );
            for r in 0..19 {
                let want = if r < 13 {
                    ta.row_f32(r)
                } else {
                    tb.row_f32(r - 13)
                };
                let got = m.row_f32(r);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{fmt:?} row {r}: {:?} vs {:?}", &got[..8], &want[..8]);
            }
        }
    }

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
