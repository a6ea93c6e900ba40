//! Causal attention of new tokens over a sequence's paged f16 KV cache.
//!
//! The cache is read in chunks of [`CHUNK_BLOCKS`] blocks. For each chunk, every query row
//! and every query head of a KV head's group gets a partial softmax state (running maximum
//! `m`, running sum `l`, unnormalized output `acc`), computed block by block with an online
//! softmax: each block's keys and values are converted from f16 once and used by every row
//! and every head of the group. The chunks' states are then merged in order and normalized.
//!
//! That structure is what lets both threads work at batch 1: a decode row's chunks are
//! independent work items, merged afterwards; a prefill run of rows walks its chunks itself.
//! Both compute the same partial states and merge them in the same order, so a row's result
//! depends only on its position and the sequence's cache, never on which other rows share the
//! step: chunked prefill, decode and batching agree exactly.
//!
//! Queries arrive scaled (by `1/√head_dim`, or the family's attention scale). Local layers
//! (sliding-window attention) see only the last `window` positions of a row: blocks wholly
//! before the window are skipped, and the one block the window starts in is scored from the
//! window's first position on. Soft-capped scores (`cap · tanh(s / cap)`) take the portable
//! path.

use half::f16;

use super::isa::Isa;
use super::kv::KvStore;

/// Blocks per chunk of the cache (256 positions with 16-position blocks).
pub const CHUNK_BLOCKS: usize = 16;

/// A run of query rows of one sequence.
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    /// The sequence's block table.
    pub blocks: &'a [u32],
    /// Position of each row (increasing).
    pub positions: &'a [usize],
    /// Query rows, `positions.len() × stride`, already scaled by `1/√head_dim`.
    pub q: &'a [f32],
    /// Floats between consecutive rows in `q` and in the output.
    pub stride: usize,
}

/// Which heads of which layer.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// The layer index (selects that layer's KV cache).
    pub layer: usize,
    /// The KV head; its query heads start at `kv_head * group`.
    pub kv_head: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// Values per head.
    pub head_dim: usize,
    /// A local layer's window: key `p` is visible from a row at `pos` when `pos - p < window`.
    pub window: Option<usize>,
    /// Scores become `cap · tanh(score / cap)` before the softmax.
    pub softcap: Option<f32>,
}

impl Heads {
    /// Floats of one state: `m`, `l`, then `head_dim` accumulators.
    pub fn state_len(&self) -> usize {
        self.head_dim + 2
    }

    /// The first position a row at `pos` sees.
    fn first_visible(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// Chunks a row at `pos` reads.
pub fn chunks_for(pos: usize, block_size: usize) -> usize {
    pos / (block_size * CHUNK_BLOCKS) + 1
}

/// Scratch reused across calls (one per thread).
#[derive(Default)]
pub struct Scratch {
    kt: Vec<f32>,
    v: Vec<f32>,
    part: Vec<f32>,
    total: Vec<f32>,
}

/// Resets `states` (each `state_len` floats) to empty.
fn clear(states: &mut [f32], len: usize) {
    for st in states.chunks_exact_mut(len) {
        st[0] = f32::NEG_INFINITY;
        st[1..].fill(0.0);
    }
}

/// Partial states of chunk `c` for every row of `rows` and every query head of the group:
/// `out` holds `rows × group` states of [`Heads::state_len`] floats (rows that do not reach the
/// chunk keep empty states: `l = 0`).
#[allow(clippy::too_many_arguments)]
pub fn chunk_states(
    isa: Isa,
    kv: &KvStore,
    h: Heads,
    rows: Rows<'_>,
    c: usize,
    out: &mut [f32],
    s: &mut Scratch,
) {
    let (bs, hd, group) = (kv.block_size(), h.head_dim, h.group);
    let sl = h.state_len();
    clear(&mut out[..rows.positions.len() * group * sl], sl);
    let Some(&max_pos) = rows.positions.last() else {
        return;
    };
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni
        && bs == 16
        && matches!(hd, 32 | 64 | 128 | 256)
        && h.softcap.is_none()
    {
        // SAFETY: `Isa::Avx512Vnni` is only returned after detecting AVX-512 F beside AVX2,
        // FMA and F16C; sizes as checked.
        unsafe { wide_chunk_states(kv, h, rows, c, max_pos, out, s) };
        return;
    }
    s.kt.resize(bs * hd, 0.0);
    s.v.resize(bs * hd, 0.0);
    let first = c * CHUNK_BLOCKS;
    let last = (first + CHUNK_BLOCKS).min(rows.blocks.len());
    // Rows are in increasing order: the first sees the earliest positions.
    let min_visible = h.first_visible(rows.positions[0]);
    for bi in first..last {
        let start = bi * bs;
        if start > max_pos {
            break;
        }
        if start + bs <= min_visible {
            continue; // before every row's window
        }
        let block = rows.blocks[bi] as usize;
        if bi + 1 < last && start + bs <= max_pos {
            // The next block lies elsewhere in memory (pages are not in order, and even in
            // order a block's head is far from the next block's): fetch it while this one is
            // worked on.
            let next = rows.blocks[bi + 1] as usize;
            prefetch(kv.keys(next, h.layer, h.kv_head));
            prefetch(kv.values(next, h.layer, h.kv_head));
        }
        let (keys, values) = (
            kv.keys(block, h.layer, h.kv_head),
            kv.values(block, h.layer, h.kv_head),
        );
        convert(isa, keys, &mut s.kt);
        convert(isa, values, &mut s.v);
        for (r, &pos) in rows.positions.iter().enumerate() {
            let visible = h.first_visible(pos);
            if start > pos || start + bs <= visible {
                continue;
            }
            let valid = (pos + 1 - start).min(bs);
            let from = visible.saturating_sub(start);
            let q0 = r * rows.stride + h.kv_head * group * hd;
            let q = &rows.q[q0..q0 + group * hd];
            let st = &mut out[r * group * sl..(r + 1) * group * sl];
            if h.softcap.is_none() {
                block_update(isa, q, &s.kt, &s.v, bs, hd, from, valid, st);
            } else {
                range_update(q, &s.kt, &s.v, bs, hd, from..valid, h.softcap, st);
            }
        }
    }
}

/// [`chunk_states`] on AVX-512, [`WIDE`] blocks at a time: the group's keys and values are
/// converted once, then each row scores all of them in one pass over the head (one broadcast
/// of a query value serves every block) and takes their online-softmax steps in block order
/// with its accumulators in registers. Every state sees the same operations in the same order
/// as block by block, so the results are bit for bit those of the other SIMD paths.
///
/// # Safety
/// The CPU must have AVX-512 F, AVX2, FMA and F16C; 16-position blocks and a head size of 32,
/// 64, 128 or 256.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn wide_chunk_states(
    kv: &KvStore,
    h: Heads,
    rows: Rows<'_>,
    c: usize,
    max_pos: usize,
    out: &mut [f32],
    s: &mut Scratch,
) {
    let (bs, hd, group) = (kv.block_size(), h.head_dim, h.group);
    let sl = h.state_len();
    let per_block = bs * hd;
    s.kt.resize(WIDE * per_block, 0.0);
    s.v.resize(WIDE * per_block, 0.0);
    let first = c * CHUNK_BLOCKS;
    let last = (first + CHUNK_BLOCKS).min(rows.blocks.len());
    let min_visible = h.first_visible(rows.positions[0]);
    let mut g0 = first;
    while g0 < last && g0 * bs <= max_pos {
        let g1 = (g0 + WIDE).min(last);
        if g1 * bs <= min_visible {
            g0 = g1;
            continue; // wholly before every row's window
        }
        // The group's blocks that some row sees, converted into their slots.
        let mut needed = [false; WIDE];
        for bi in g0..g1 {
            let start = bi * bs;
            if start > max_pos || start + bs <= min_visible {
                continue;
            }
            let block = rows.blocks[bi] as usize;
            let slot = bi - g0;
            // SAFETY: as the caller guarantees (AVX2 and F16C); the lengths match.
            unsafe {
                avx2::convert(
                    kv.keys(block, h.layer, h.kv_head),
                    &mut s.kt[slot * per_block..(slot + 1) * per_block],
                );
                avx2::convert(
                    kv.values(block, h.layer, h.kv_head),
                    &mut s.v[slot * per_block..(slot + 1) * per_block],
                );
            }
            needed[slot] = true;
        }
        if g1 < last && g1 * bs <= max_pos && (g1 + 1) * bs > min_visible {
            // The next group's first block lies elsewhere in memory: fetch it meanwhile (a
            // block wholly before every row's window may be released: never touched).
            let next = rows.blocks[g1] as usize;
            prefetch(kv.keys(next, h.layer, h.kv_head));
            prefetch(kv.values(next, h.layer, h.kv_head));
        }
        for (r, &pos) in rows.positions.iter().enumerate() {
            let visible = h.first_visible(pos);
            let mut spans = [None; WIDE];
            for (slot, sp) in spans.iter_mut().enumerate().take(g1 - g0) {
                let start = (g0 + slot) * bs;
                if !needed[slot] || start > pos || start + bs <= visible {
                    continue;
                }
                *sp = Some((visible.saturating_sub(start), (pos + 1 - start).min(bs)));
            }
            if spans.iter().all(Option::is_none) {
                continue;
            }
            let q0 = r * rows.stride + h.kv_head * group * hd;
            let q = &rows.q[q0..q0 + group * hd];
            let st = &mut out[r * group * sl..(r + 1) * group * sl];
            // SAFETY: as the caller guarantees; the scratch holds WIDE blocks.
            unsafe { avx512::blocks_update(q, &s.kt, &s.v, hd, &spans, st) };
        }
        g0 = g1;
    }
}

/// Blocks the AVX-512 path takes at a time.
pub const WIDE: usize = 4;

/// Asks for `x`'s cache lines ahead of use.
fn prefetch(x: &[f16]) {
    #[cfg(target_arch = "x86_64")]
    for line in x.chunks(32) {
        // SAFETY: a prefetch is only a hint; the address is inside `x`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            );
        }
    }
}

/// f16 → f32 of a block's keys or values.
fn convert(isa: Isa, src: &[f16], dst: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa.avx2()` implies F16C; the lengths match.
        _ if isa.avx2() && src.len().is_multiple_of(8) => unsafe { avx2::convert(src, dst) },
        _ => {
            for (d, x) in dst.iter_mut().zip(src) {
                *d = x.to_f32();
            }
        }
    }
}

/// One block's update of `group` states (one per query head in `q`) with the block's
/// positions `from..valid`.
#[allow(clippy::too_many_arguments)]
fn block_update(
    isa: Isa,
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    bs: usize,
    hd: usize,
    from: usize,
    valid: usize,
    states: &mut [f32],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.avx2() && bs == 16 && matches!(hd, 32 | 64 | 128 | 256) => {
            // SAFETY: `isa.avx2()` implies AVX2 and FMA; sizes as checked.
            unsafe { avx2::block_update(q, kt, v, hd, from, valid, states) }
        }
        _ if from == 0 => scalar_block_update(q, kt, v, bs, hd, valid, states),
        _ => range_update(q, kt, v, bs, hd, from..valid, None, states),
    }
}

fn scalar_block_update(
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    bs: usize,
    hd: usize,
    valid: usize,
    states: &mut [f32],
) {
    let mut scores = [0f32; 64];
    let scores = if bs <= 64 {
        &mut scores[..valid]
    } else {
        return scalar_wide(q, kt, v, bs, hd, valid, states);
    };
    for (qh, st) in q.chunks_exact(hd).zip(states.chunks_exact_mut(hd + 2)) {
        for (j, x) in scores.iter_mut().enumerate() {
            *x = (0..hd).map(|d| qh[d] * kt[d * bs + j]).sum();
        }
        update(st, scores, v, hd);
    }
}

/// The portable update over block positions `range` only, scores soft-capped when asked.
#[allow(clippy::too_many_arguments)]
fn range_update(
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    bs: usize,
    hd: usize,
    range: std::ops::Range<usize>,
    softcap: Option<f32>,
    states: &mut [f32],
) {
    let mut scores = vec![0f32; range.len()];
    for (qh, st) in q.chunks_exact(hd).zip(states.chunks_exact_mut(hd + 2)) {
        for (x, j) in scores.iter_mut().zip(range.clone()) {
            let raw: f32 = (0..hd).map(|d| qh[d] * kt[d * bs + j]).sum();
            *x = match softcap {
                Some(cap) => cap * (raw / cap).tanh(),
                None => raw,
            };
        }
        update(st, &scores, &v[range.start * hd..], hd);
    }
}

/// The scalar update for blocks of more than 64 positions.
fn scalar_wide(
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    bs: usize,
    hd: usize,
    valid: usize,
    states: &mut [f32],
) {
    let mut scores = vec![0f32; valid];
    for (qh, st) in q.chunks_exact(hd).zip(states.chunks_exact_mut(hd + 2)) {
        for (j, x) in scores.iter_mut().enumerate() {
            *x = (0..hd).map(|d| qh[d] * kt[d * bs + j]).sum();
        }
        update(st, &scores, v, hd);
    }
}

/// Online-softmax update of one state with one block's scores.
fn update(st: &mut [f32], scores: &[f32], v: &[f32], hd: usize) {
    let bm = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let (m, rest) = st.split_at_mut(1);
    let (l, acc) = rest.split_at_mut(1);
    if bm > m[0] {
        let c = (m[0] - bm).exp();
        l[0] *= c;
        for a in acc.iter_mut() {
            *a *= c;
        }
        m[0] = bm;
    }
    for (j, x) in scores.iter().enumerate() {
        let e = (x - m[0]).exp();
        l[0] += e;
        for (a, vv) in acc.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
            *a += e * vv;
        }
    }
}

/// Merges the partial states `part` into `total` (both `n` states of `state_len` floats).
pub fn merge(total: &mut [f32], part: &[f32], state_len: usize) {
    for (t, p) in total
        .chunks_exact_mut(state_len)
        .zip(part.chunks_exact(state_len))
    {
        if p[1] == 0.0 {
            continue; // the row did not reach that chunk
        }
        if t[1] == 0.0 {
            t.copy_from_slice(p);
            continue;
        }
        let m = t[0].max(p[0]);
        let (ct, cp) = ((t[0] - m).exp(), (p[0] - m).exp());
        t[0] = m;
        for (a, b) in t[1..].iter_mut().zip(&p[1..]) {
            *a = *a * ct + b * cp;
        }
    }
}

/// Writes the normalized outputs of `group` states to `out[..group * head_dim]`.
///
/// # Safety
/// `out` must be valid for `states.len() / state_len × head_dim` writes.
pub unsafe fn finish(states: &[f32], hd: usize, out: *mut f32) {
    for (j, st) in states.chunks_exact(hd + 2).enumerate() {
        let inv = if st[1] > 0.0 { 1.0 / st[1] } else { 0.0 };
        for (d, a) in st[2..].iter().enumerate() {
            // SAFETY: as the caller guarantees.
            unsafe { *out.add(j * hd + d) = a * inv };
        }
    }
}

/// Attention for `rows` against KV head `h.kv_head`: every chunk, merged in order. Writes each
/// row's `group × head_dim` outputs at `out[r * stride + kv_head * group * head_dim ..]`.
///
/// # Safety
/// `out` must be valid for writes at those offsets, and no other thread may write them.
pub unsafe fn attend(
    isa: Isa,
    kv: &KvStore,
    h: Heads,
    rows: Rows<'_>,
    out: *mut f32,
    s: &mut Scratch,
) {
    let Some(&max_pos) = rows.positions.last() else {
        return;
    };
    let n = rows.positions.len() * h.group * h.state_len();
    let mut part = std::mem::take(&mut s.part);
    let mut total = std::mem::take(&mut s.total);
    part.resize(n, 0.0);
    total.resize(n, 0.0);
    clear(&mut total, h.state_len());
    for c in 0..chunks_for(max_pos, kv.block_size()) {
        chunk_states(isa, kv, h, rows, c, &mut part, s);
        merge(&mut total, &part, h.state_len());
    }
    let per_row = h.group * h.state_len();
    for r in 0..rows.positions.len() {
        // SAFETY: as the caller guarantees.
        unsafe {
            finish(
                &total[r * per_row..(r + 1) * per_row],
                h.head_dim,
                out.add(r * rows.stride + h.kv_head * h.group * h.head_dim),
            );
        }
    }
    s.part = part;
    s.total = total;
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::backend::cpu::simd::{exp, hmax, hsum};
    use std::arch::x86_64::*;

    /// f16 → f32, eight at a time.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn convert(src: &[f16], dst: &mut [f32]) {
        for (s, d) in src.chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
            // SAFETY: eight halves in, eight floats out.
            unsafe {
                let h = _mm_loadu_si128(s.as_ptr().cast());
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
    }

    /// See [`super::block_update`], for 16-position blocks and head sizes 32, 64, 128 or 256.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn block_update(
        q: &[f32],
        kt: &[f32],
        v: &[f32],
        hd: usize,
        from: usize,
        valid: usize,
        states: &mut [f32],
    ) {
        let group = q.len() / hd;
        let mut h = 0;
        // SAFETY (all calls): the caller checked the sizes.
        unsafe {
            while h < group {
                let n = (group - h).min(4);
                let qh = &q[h * hd..(h + n) * hd];
                let st = &mut states[h * (hd + 2)..(h + n) * (hd + 2)];
                match (n, hd) {
                    (1, 32) => heads::<1, 4>(qh, kt, v, from, valid, st),
                    (2, 32) => heads::<2, 4>(qh, kt, v, from, valid, st),
                    (3, 32) => heads::<3, 4>(qh, kt, v, from, valid, st),
                    (_, 32) => heads::<4, 4>(qh, kt, v, from, valid, st),
                    (1, 64) => heads::<1, 8>(qh, kt, v, from, valid, st),
                    (2, 64) => heads::<2, 8>(qh, kt, v, from, valid, st),
                    (3, 64) => heads::<3, 8>(qh, kt, v, from, valid, st),
                    (_, 64) => heads::<4, 8>(qh, kt, v, from, valid, st),
                    (1, 128) => heads::<1, 16>(qh, kt, v, from, valid, st),
                    (2, 128) => heads::<2, 16>(qh, kt, v, from, valid, st),
                    (3, 128) => heads::<3, 16>(qh, kt, v, from, valid, st),
                    (_, 128) => heads::<4, 16>(qh, kt, v, from, valid, st),
                    (1, _) => heads::<1, 32>(qh, kt, v, from, valid, st),
                    (2, _) => heads::<2, 32>(qh, kt, v, from, valid, st),
                    (3, _) => heads::<3, 32>(qh, kt, v, from, valid, st),
                    (_, _) => heads::<4, 32>(qh, kt, v, from, valid, st),
                }
                h += n;
            }
        }
    }

    /// `G` query heads of `8·V` values against positions `from..valid` of one 16-position
    /// block: the scores of all heads share each key load; then each head's online-softmax
    /// update and weighted sum (positions outside the range score -∞ and weigh 0).
    #[target_feature(enable = "avx2,fma")]
    // Index loops: the iterator form of the weighted sum (`enumerate().take().skip()`) was not
    // inlined and cost a twelfth of a long prefill.
    #[allow(clippy::needless_range_loop)]
    unsafe fn heads<const G: usize, const V: usize>(
        q: &[f32],
        kt: &[f32],
        v: &[f32],
        from: usize,
        valid: usize,
        states: &mut [f32],
    ) {
        let hd = 8 * V;
        let mut lo = [_mm256_setzero_ps(); G];
        let mut hi = [_mm256_setzero_ps(); G];
        // SAFETY (whole body): q holds G·hd floats, kt hd·16, v 16·hd, states G·(hd + 2).
        unsafe {
            for d in 0..hd {
                let k0 = _mm256_loadu_ps(kt.as_ptr().add(d * 16));
                let k1 = _mm256_loadu_ps(kt.as_ptr().add(d * 16 + 8));
                for g in 0..G {
                    let x = _mm256_broadcast_ss(&*q.as_ptr().add(g * hd + d));
                    lo[g] = _mm256_fmadd_ps(x, k0, lo[g]);
                    hi[g] = _mm256_fmadd_ps(x, k1, hi[g]);
                }
            }
            let idx_lo = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
            let idx_hi = _mm256_add_ps(idx_lo, _mm256_set1_ps(8.0));
            #[allow(clippy::cast_precision_loss)]
            let lim = _mm256_set1_ps(valid as f32);
            #[allow(clippy::cast_precision_loss)]
            let low = _mm256_set1_ps(from as f32);
            let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
            let keep_lo = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_LT_OQ>(idx_lo, lim),
                _mm256_cmp_ps::<_CMP_GE_OQ>(idx_lo, low),
            );
            let keep_hi = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_LT_OQ>(idx_hi, lim),
                _mm256_cmp_ps::<_CMP_GE_OQ>(idx_hi, low),
            );
            for g in 0..G {
                let st = states.as_mut_ptr().add(g * (hd + 2));
                let s0 = _mm256_blendv_ps(ninf, lo[g], keep_lo);
                let s1 = _mm256_blendv_ps(ninf, hi[g], keep_hi);
                let bm = hmax(_mm256_max_ps(s0, s1));
                let mut acc: [__m256; V] =
                    std::array::from_fn(|i| _mm256_loadu_ps(st.add(2 + 8 * i)));
                if bm > *st {
                    let c = (*st - bm).exp();
                    *st.add(1) *= c;
                    let cv = _mm256_set1_ps(c);
                    for a in &mut acc {
                        *a = _mm256_mul_ps(*a, cv);
                    }
                    *st = bm;
                }
                let m = _mm256_set1_ps(*st);
                let p0 = exp(_mm256_sub_ps(s0, m));
                let p1 = exp(_mm256_sub_ps(s1, m));
                *st.add(1) += hsum(_mm256_add_ps(p0, p1));
                let mut p = [0f32; 16];
                _mm256_storeu_ps(p.as_mut_ptr(), p0);
                _mm256_storeu_ps(p.as_mut_ptr().add(8), p1);
                for j in from..valid {
                    let w = _mm256_set1_ps(p[j]);
                    let row = v.as_ptr().add(j * hd);
                    for (i, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(row.add(8 * i)), *a);
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(st.add(2 + 8 * i), *a);
                }
            }
        }
    }
}

/// [`avx2::block_update`] on 512-bit vectors: a block's 16 scores are one vector, and a
/// head's accumulators half as many. Every lane sees the same operations in the same order as
/// there (the scores summed over the head in order, the same exponential, the weights summed
/// as eight pairs and then eight lanes), so the results are bit for bit those of the AVX2 path.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::WIDE;
    use crate::backend::cpu::simd::{hmax, hsum};
    use std::arch::x86_64::*;

    /// The states of the query heads in `q` take the blocks of `kt` and `v` (each
    /// `16 × hd` floats, [`super::WIDE`] of them) whose `spans` are given: positions
    /// `from..valid` of each, in block order.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, AVX2 and FMA; `hd` is 32, 64, 128 or 256; `kt` and `v` hold
    /// `WIDE` blocks, `q` whole heads and `states` one state per head.
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub unsafe fn blocks_update(
        q: &[f32],
        kt: &[f32],
        v: &[f32],
        hd: usize,
        spans: &[Option<(usize, usize)>; WIDE],
        states: &mut [f32],
    ) {
        let group = q.len() / hd;
        let mut h = 0;
        // SAFETY (all calls): as the caller guarantees.
        unsafe {
            while h < group {
                let n = (group - h).min(4);
                let qh = &q[h * hd..(h + n) * hd];
                let st = &mut states[h * (hd + 2)..(h + n) * (hd + 2)];
                match (n, hd) {
                    (1, 32) => heads::<1, 2>(qh, kt, v, spans, st),
                    (2, 32) => heads::<2, 2>(qh, kt, v, spans, st),
                    (3, 32) => heads::<3, 2>(qh, kt, v, spans, st),
                    (_, 32) => heads::<4, 2>(qh, kt, v, spans, st),
                    (1, 64) => heads::<1, 4>(qh, kt, v, spans, st),
                    (2, 64) => heads::<2, 4>(qh, kt, v, spans, st),
                    (3, 64) => heads::<3, 4>(qh, kt, v, spans, st),
                    (_, 64) => heads::<4, 4>(qh, kt, v, spans, st),
                    (1, 128) => heads::<1, 8>(qh, kt, v, spans, st),
                    (2, 128) => heads::<2, 8>(qh, kt, v, spans, st),
                    (3, 128) => heads::<3, 8>(qh, kt, v, spans, st),
                    (_, 128) => heads::<4, 8>(qh, kt, v, spans, st),
                    (1, _) => heads::<1, 16>(qh, kt, v, spans, st),
                    (2, _) => heads::<2, 16>(qh, kt, v, spans, st),
                    (3, _) => heads::<3, 16>(qh, kt, v, spans, st),
                    (_, _) => heads::<4, 16>(qh, kt, v, spans, st),
                }
                h += n;
            }
        }
    }

    /// `e^x`, lane by lane the operations of [`crate::backend::cpu::simd::exp`].
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    fn exp(x: __m512) -> __m512 {
        let zero_below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.0));
        let inf_above = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(88.0));
        let x = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(-87.0)),
            _mm512_set1_ps(88.0),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let p = _mm512_fmadd_ps(
            _mm512_mul_ps(p, r),
            r,
            _mm512_add_ps(r, _mm512_set1_ps(1.0)),
        );
        let ni = _mm512_cvtps_epi32(n);
        let half = _mm512_srai_epi32::<1>(ni);
        let pow = |k: __m512i| {
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
                k,
                _mm512_set1_epi32(127),
            )))
        };
        let e = _mm512_mul_ps(_mm512_mul_ps(p, pow(half)), pow(_mm512_sub_epi32(ni, half)));
        let e = _mm512_mask_blend_ps(inf_above, e, _mm512_set1_ps(f32::INFINITY));
        _mm512_maskz_mov_ps(!zero_below, e)
    }

    /// The low and the high eight lanes.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    fn halves(v: __m512) -> (__m256, __m256) {
        (
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
        )
    }

    /// `G` query heads of `16·V` values against the given spans of [`WIDE`] 16-position blocks
    /// (see [`super::avx2`]'s `heads`): the scores of all blocks first (each query value
    /// broadcast once for all of them), then each block's online-softmax step and weighted sum,
    /// in block order.
    #[target_feature(enable = "avx2,fma,avx512f")]
    // Index loops: the iterator form of the weighted sum (`enumerate().take().skip()`) was not
    // inlined and cost a twelfth of a long prefill.
    #[allow(clippy::needless_range_loop)]
    unsafe fn heads<const G: usize, const V: usize>(
        q: &[f32],
        kt: &[f32],
        v: &[f32],
        spans: &[Option<(usize, usize)>; WIDE],
        states: &mut [f32],
    ) {
        let hd = 16 * V;
        let per_block = 16 * hd;
        let mut sc = [[_mm512_setzero_ps(); G]; WIDE];
        // SAFETY (whole body): q holds G·hd floats, kt and v WIDE·16·hd, states G·(hd + 2).
        unsafe {
            for d in 0..hd {
                let k: [__m512; WIDE] = std::array::from_fn(|b| {
                    _mm512_loadu_ps(kt.as_ptr().add(b * per_block + d * 16))
                });
                for g in 0..G {
                    let x = _mm512_set1_ps(*q.as_ptr().add(g * hd + d));
                    for b in 0..WIDE {
                        sc[b][g] = _mm512_fmadd_ps(x, k[b], sc[b][g]);
                    }
                }
            }
            let keep_of = |from: usize, valid: usize| -> __mmask16 {
                // Positions from..valid of the block's 16 (both at most 16).
                #[allow(clippy::cast_possible_truncation)]
                let m = ((1u32 << valid) - 1) as u16 & !(((1u32 << from) - 1) as u16);
                m
            };
            if G * V <= 16 {
                // The accumulators of every head stay in registers beside a value row, over
                // all the blocks: each row is loaded once for all heads.
                let mut acc: [[__m512; V]; G] = [[_mm512_setzero_ps(); V]; G];
                for (g, a) in acc.iter_mut().enumerate() {
                    *a = load(states.as_ptr().add(g * (hd + 2)));
                }
                for (b, span) in spans.iter().enumerate() {
                    let Some((from, valid)) = *span else {
                        continue;
                    };
                    let keep = keep_of(from, valid);
                    let mut p = [[0f32; 16]; G];
                    for g in 0..G {
                        let st = states.as_mut_ptr().add(g * (hd + 2));
                        softmax_step(st, sc[b][g], keep, &mut p[g], &mut acc[g]);
                    }
                    let vb = v.as_ptr().add(b * per_block);
                    for j in from..valid {
                        let row = vb.add(j * hd);
                        let vals: [__m512; V] =
                            std::array::from_fn(|i| _mm512_loadu_ps(row.add(16 * i)));
                        for g in 0..G {
                            let w = _mm512_set1_ps(p[g][j]);
                            for (a, x) in acc[g].iter_mut().zip(&vals) {
                                *a = _mm512_fmadd_ps(w, *x, *a);
                            }
                        }
                    }
                }
                for (g, a) in acc.iter().enumerate() {
                    store(states.as_mut_ptr().add(g * (hd + 2)), a);
                }
            } else {
                // Large heads: one head's accumulators at a time.
                for g in 0..G {
                    let st = states.as_mut_ptr().add(g * (hd + 2));
                    let mut acc: [__m512; V] = load(st);
                    for (b, span) in spans.iter().enumerate() {
                        let Some((from, valid)) = *span else {
                            continue;
                        };
                        let mut p = [0f32; 16];
                        softmax_step(st, sc[b][g], keep_of(from, valid), &mut p, &mut acc);
                        let vb = v.as_ptr().add(b * per_block);
                        for j in from..valid {
                            let w = _mm512_set1_ps(p[j]);
                            let row = vb.add(j * hd);
                            for (i, a) in acc.iter_mut().enumerate() {
                                *a = _mm512_fmadd_ps(w, _mm512_loadu_ps(row.add(16 * i)), *a);
                            }
                        }
                    }
                    store(st, &acc);
                }
            }
        }
    }

    /// One head's online-softmax step over a block: the state `st` (`m`, `l`) and its
    /// accumulators `acc` take the block's scores (positions outside `keep` score -∞): the
    /// accumulators are rescaled to the new running maximum and the weights written to `p`.
    ///
    /// # Safety
    /// `st` must be valid for 2 floats.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    unsafe fn softmax_step<const V: usize>(
        st: *mut f32,
        scores: __m512,
        keep: __mmask16,
        p: &mut [f32; 16],
        acc: &mut [__m512; V],
    ) {
        // SAFETY: as the caller guarantees.
        unsafe {
            let s = _mm512_mask_blend_ps(keep, _mm512_set1_ps(f32::NEG_INFINITY), scores);
            let (s0, s1) = halves(s);
            let bm = hmax(_mm256_max_ps(s0, s1));
            if bm > *st {
                let c = (*st - bm).exp();
                *st.add(1) *= c;
                let cv = _mm512_set1_ps(c);
                for a in acc.iter_mut() {
                    *a = _mm512_mul_ps(*a, cv);
                }
                *st = bm;
            }
            let pe = exp(_mm512_sub_ps(s, _mm512_set1_ps(*st)));
            let (p0, p1) = halves(pe);
            *st.add(1) += hsum(_mm256_add_ps(p0, p1));
            _mm512_storeu_ps(p.as_mut_ptr(), pe);
        }
    }

    /// A head's accumulators, after its `m` and `l`.
    ///
    /// # Safety
    /// `st` must be valid for `2 + 16·V` floats.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    unsafe fn load<const V: usize>(st: *const f32) -> [__m512; V] {
        // SAFETY: as the caller guarantees.
        std::array::from_fn(|i| unsafe { _mm512_loadu_ps(st.add(2 + 16 * i)) })
    }

    /// Writes a head's accumulators back after its `m` and `l`.
    ///
    /// # Safety
    /// `st` must be valid for `2 + 16·V` floats.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    unsafe fn store<const V: usize>(st: *mut f32, acc: &[__m512; V]) {
        for (i, x) in acc.iter().enumerate() {
            // SAFETY: as the caller guarantees.
            unsafe { _mm512_storeu_ps(st.add(2 + 16 * i), *x) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::FixtureRng;

    /// A cache with `n` random positions for one layer and `kv_heads` heads.
    fn cache(
        n: usize,
        kv_heads: usize,
        hd: usize,
        bs: usize,
        seed: u64,
    ) -> (KvStore, Vec<f32>, Vec<f32>) {
        let blocks = n.div_ceil(bs) + 1;
        let mut kv = KvStore::new(1, kv_heads, hd, bs, blocks);
        let mut rng = FixtureRng::new(seed);
        let ks = rng.vec(n * kv_heads * hd, 1.0);
        let vs = rng.vec(n * kv_heads * hd, 1.0);
        for p in 0..n {
            let (k, v) = (
                &ks[p * kv_heads * hd..(p + 1) * kv_heads * hd],
                &vs[p * kv_heads * hd..(p + 1) * kv_heads * hd],
            );
            kv.write(p / bs, p % bs, 0, k, v);
        }
        // The reference sees the f16-rounded values the cache holds.
        let round = |x: &[f32]| {
            x.iter()
                .map(|v| f16::from_f32(*v).to_f32())
                .collect::<Vec<_>>()
        };
        (kv, round(&ks), round(&vs))
    }

    /// Plain softmax attention in f64 over the visible positions.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        q: &[f32],
        ks: &[f32],
        vs: &[f32],
        pos: usize,
        head: usize,
        kvh: usize,
        kv_heads: usize,
        hd: usize,
        window: Option<usize>,
        softcap: Option<f32>,
    ) -> Vec<f64> {
        let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let scores: Vec<f64> = (lo..=pos)
            .map(|p| {
                let s: f64 = (0..hd)
                    .map(|d| {
                        f64::from(q[head * hd + d]) * f64::from(ks[(p * kv_heads + kvh) * hd + d])
                    })
                    .sum();
                softcap.map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh())
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let l: f64 = e.iter().sum();
        (0..hd)
            .map(|d| {
                (lo..=pos)
                    .map(|p| e[p - lo] * f64::from(vs[(p * kv_heads + kvh) * hd + d]))
                    .sum::<f64>()
                    / l
            })
            .collect()
    }

    /// A local layer's blocks wholly before every row's window may have been released (the
    /// window pool reuses them): no ISA path reads them, and the result is that of a table
    /// whose old blocks are still there.
    #[test]
    fn blocks_before_the_window_are_never_read() {
        let (bs, hd, n, window) = (16, 64, 600, 37);
        let (kv_heads, group) = (1, 3);
        let (kv, _, _) = cache(n, kv_heads, hd, bs, 5);
        let qd = kv_heads * group * hd;
        let q = FixtureRng::new(3).vec(n * qd, 0.3);
        let whole: Vec<u32> = (0..u32::try_from(n.div_ceil(bs)).expect("blocks")).collect();
        let positions: Vec<usize> = (560..n).collect();
        // Released blocks: indices far outside the cache (reading one would panic).
        let first_kept = (positions[0] + 1 - window) / bs;
        let mut released = whole.clone();
        for b in released.iter_mut().take(first_kept) {
            *b = u32::MAX / 2;
        }
        let h = Heads {
            layer: 0,
            kv_head: 0,
            group,
            head_dim: hd,
            window: Some(window),
            softcap: None,
        };
        for isa in Isa::available() {
            let mut outs = Vec::new();
            for blocks in [&whole, &released] {
                let mut out = vec![0f32; positions.len() * qd];
                let rows = Rows {
                    blocks,
                    positions: &positions,
                    q: &q[positions[0] * qd..],
                    stride: qd,
                };
                let mut s = Scratch::default();
                // SAFETY: `out` holds one row of qd floats per position.
                unsafe { attend(isa, &kv, h, rows, out.as_mut_ptr(), &mut s) };
                outs.push(out);
            }
            assert_eq!(outs[0], outs[1], "{isa:?}");
        }
    }

    #[test]
    fn attention_matches_softmax_and_decode_chunks_equal_prefill_on_every_isa() {
        for (isa, runs) in Isa::all() {
            if !runs {
                eprintln!("NOT RUN: {isa:?} attention (this CPU lacks the instructions)");
            }
        }
        // Block 16 with head sizes the SIMD path takes; an odd block size takes the portable
        // path on every ISA. 600 positions cross three chunks. Windows of 37 and 300 start
        // inside blocks (and skip whole chunks); soft-capping takes the portable path.
        for (bs, hd, n, window, softcap) in [
            (16, 64, 600, None, None),
            (16, 32, 40, None, None),
            (4, 8, 37, None, None),
            (16, 64, 600, Some(300), None),
            (16, 32, 100, Some(37), Some(0.5)),
            (4, 8, 37, Some(5), None),
            (16, 256, 40, None, None),
            (16, 256, 90, Some(21), None),
        ] {
            let (kv_heads, group) = (2, 3);
            let (kv, ks, vs) = cache(n, kv_heads, hd, bs, (bs * hd) as u64);
            let qd = kv_heads * group * hd;
            let mut rng = FixtureRng::new(99);
            let q = rng.vec(n * qd, 0.3);
            let blocks: Vec<u32> = (0..u32::try_from(n.div_ceil(bs)).expect("blocks")).collect();
            let positions: Vec<usize> = (0..n).collect();
            // Every SIMD path (256- and 512-bit) gives the same bits.
            let mut simd: Option<(Isa, Vec<u32>)> = None;
            for isa in Isa::available() {
                let mut s = Scratch::default();
                let mut prefill = vec![0f32; n * qd];
                for kvh in 0..kv_heads {
                    let h = Heads {
                        layer: 0,
                        kv_head: kvh,
                        group,
                        head_dim: hd,
                        window,
                        softcap,
                    };
                    // Runs of 16 rows, as the backend hands them out.
                    for r0 in (0..n).step_by(16) {
                        let r1 = (r0 + 16).min(n);
                        let rows = Rows {
                            blocks: &blocks,
                            positions: &positions[r0..r1],
                            q: &q[r0 * qd..r1 * qd],
                            stride: qd,
                        };
                        // SAFETY: `prefill` holds n × qd floats.
                        unsafe {
                            attend(isa, &kv, h, rows, prefill.as_mut_ptr().add(r0 * qd), &mut s)
                        };
                    }
                }
                if isa.avx2() {
                    let bits: Vec<u32> = prefill.iter().map(|x| x.to_bits()).collect();
                    match &simd {
                        Some((first, want)) => assert!(
                            *want == bits,
                            "{isa:?} and {first:?} differ (bs{bs} hd{hd} n{n})"
                        ),
                        None => simd = Some((isa, bits)),
                    }
                }
                for &pos in &[0, 1, n / 2, n - 1] {
                    for head in 0..kv_heads * group {
                        let want = reference(
                            &q[pos * qd..(pos + 1) * qd],
                            &ks,
                            &vs,
                            pos,
                            head,
                            head / group,
                            kv_heads,
                            hd,
                            window,
                            softcap,
                        );
                        for d in 0..hd {
                            let got = f64::from(prefill[pos * qd + head * hd + d]);
                            assert!(
                                (got - want[d]).abs() < 1e-4,
                                "{isa:?} bs{bs} hd{hd} pos {pos} head {head} d {d}: {got} vs {}",
                                want[d]
                            );
                        }
                    }
                    // Decode: the row alone, its chunks as separate items merged afterwards.
                    for kvh in 0..kv_heads {
                        let h = Heads {
                            layer: 0,
                            kv_head: kvh,
                            group,
                            head_dim: hd,
                            window,
                            softcap,
                        };
                        let rows = Rows {
                            blocks: &blocks,
                            positions: &positions[pos..=pos],
                            q: &q[pos * qd..(pos + 1) * qd],
                            stride: qd,
                        };
                        let sl = h.state_len();
                        let chunks = chunks_for(pos, bs);
                        let mut parts = vec![0f32; chunks * group * sl];
                        for c in 0..chunks {
                            chunk_states(
                                isa,
                                &kv,
                                h,
                                rows,
                                c,
                                &mut parts[c * group * sl..(c + 1) * group * sl],
                                &mut s,
                            );
                        }
                        let mut total = vec![0f32; group * sl];
                        clear(&mut total, sl);
                        for c in 0..chunks {
                            merge(&mut total, &parts[c * group * sl..(c + 1) * group * sl], sl);
                        }
                        let mut out = vec![0f32; group * hd];
                        // SAFETY: `out` holds group × hd floats.
                        unsafe { finish(&total, hd, out.as_mut_ptr()) };
                        let at = pos * qd + kvh * group * hd;
                        assert_eq!(
                            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            prefill[at..at + group * hd]
                                .iter()
                                .map(|x| x.to_bits())
                                .collect::<Vec<_>>(),
                            "{isa:?} bs{bs} hd{hd}: decode differs from prefill at {pos}"
                        );
                    }
                }
            }
        }
    }
}
