//! Causal attention of new tokens over a sequence's paged KV cache.
//!
//! One call handles a run of query rows of one sequence and one KV head (with the query heads
//! that share it), walking the sequence's blocks once: each block's keys and values are
//! converted from f16 once and used by every query row, with a running (online) softmax per
//! row. A row's arithmetic depends only on its own position and the sequence's cache, never on
//! which other rows share the call, so chunked prefill, decode and batching agree exactly.

use super::kv::KvStore;
use super::matmul::dot_f32;

/// A run of query rows of one sequence.
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    /// The sequence's block table.
    pub blocks: &'a [u32],
    /// Position of each row (increasing).
    pub positions: &'a [usize],
    /// Query rows, `positions.len() × stride`.
    pub q: &'a [f32],
    /// Floats between consecutive rows in `q` and in the output.
    pub stride: usize,
}

/// Scratch reused across calls.
#[derive(Default)]
pub struct Scratch {
    k: Vec<f32>,
    v: Vec<f32>,
    scores: Vec<f32>,
    state: Vec<f32>,
}

/// Attention for `rows` against KV head `kv_head` of `layer`; the `group` query heads that
/// share it start at head `kv_head * group`. Writes each row's `group × head_dim` outputs at
/// `out[r * stride + kv_head * group * head_dim ..]`.
///
/// # Safety
/// `out` must be valid for writes at those offsets, and no other thread may write them.
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend(
    kv: &KvStore,
    layer: usize,
    kv_head: usize,
    group: usize,
    head_dim: usize,
    rows: Rows<'_>,
    out: *mut f32,
    s: &mut Scratch,
) {
    let bs = kv.block_size();
    let hd = head_dim;
    let n = rows.positions.len();
    let Some(&max_pos) = rows.positions.last() else {
        return;
    };
    #[allow(clippy::cast_precision_loss)]
    let scale = 1.0 / (hd as f32).sqrt();
    // Per (row, head): running max, running sum, then the accumulator.
    let per = hd + 2;
    s.state.clear();
    s.state.resize(n * group * per, 0.0);
    for st in s.state.chunks_exact_mut(per) {
        st[0] = f32::NEG_INFINITY;
    }
    s.k.resize(bs * hd, 0.0);
    s.v.resize(bs * hd, 0.0);
    s.scores.resize(bs, 0.0);
    let first_head = kv_head * group;
    for (bi, &block) in rows.blocks.iter().enumerate() {
        let start = bi * bs;
        if start > max_pos {
            break;
        }
        let len = (max_pos + 1 - start).min(bs);
        kv.read(block as usize, layer, 0, kv_head, len, &mut s.k);
        kv.read(block as usize, layer, 1, kv_head, len, &mut s.v);
        for (r, &pos) in rows.positions.iter().enumerate() {
            if start > pos {
                continue;
            }
            let valid = (pos + 1 - start).min(len);
            for j in 0..group {
                let qoff = r * rows.stride + (first_head + j) * hd;
                let qv = &rows.q[qoff..qoff + hd];
                let sc = &mut s.scores[..valid];
                let mut blk_max = f32::NEG_INFINITY;
                for (t, x) in sc.iter_mut().enumerate() {
                    *x = dot_f32(qv, &s.k[t * hd..(t + 1) * hd]) * scale;
                    blk_max = blk_max.max(*x);
                }
                let st = &mut s.state[(r * group + j) * per..(r * group + j + 1) * per];
                let (m, rest) = st.split_at_mut(1);
                let (l, acc) = rest.split_at_mut(1);
                let new_m = m[0].max(blk_max);
                let corr = (m[0] - new_m).exp();
                l[0] *= corr;
                for a in acc.iter_mut() {
                    *a *= corr;
                }
                for (t, x) in sc.iter().enumerate() {
                    let e = (x - new_m).exp();
                    l[0] += e;
                    for (a, v) in acc.iter_mut().zip(&s.v[t * hd..(t + 1) * hd]) {
                        *a += e * v;
                    }
                }
                m[0] = new_m;
            }
        }
    }
    for r in 0..n {
        for j in 0..group {
            let st = &s.state[(r * group + j) * per..(r * group + j + 1) * per];
            let inv = 1.0 / st[1];
            let off = r * rows.stride + (first_head + j) * hd;
            for (d, a) in st[2..].iter().enumerate() {
                // SAFETY: the caller guarantees `out` covers this row's heads exclusively.
                unsafe { *out.add(off + d) = a * inv };
            }
        }
    }
}
