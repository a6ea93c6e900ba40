//! Causal attention of new tokens over a sequence's paged KV cache.

use super::kv::KvStore;
use super::matmul::dot_f32;
use super::ops::softmax;

/// Where one query token reads its keys and values.
#[derive(Clone, Copy)]
pub struct TokenCtx<'a> {
    /// The token's position (it attends to positions `0..=pos`).
    pub pos: usize,
    /// Its sequence's block table.
    pub blocks: &'a [u32],
}

/// Attention for one token and one KV head: the `group` query heads that share that KV head.
///
/// `q` holds the group's query rows (`group * head_dim`), `out` receives the group's outputs.
/// Scratch buffers are passed in so the caller can reuse them.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    kv: &KvStore,
    layer: usize,
    kv_head: usize,
    ctx: TokenCtx<'_>,
    q: &[f32],
    head_dim: usize,
    out: &mut [f32],
    scores: &mut Vec<f32>,
    buf: &mut Vec<f32>,
) {
    let bs = kv.block_size();
    let n = ctx.pos + 1;
    let group = q.len() / head_dim;
    #[allow(clippy::cast_precision_loss)]
    let scale = 1.0 / (head_dim as f32).sqrt();
    scores.clear();
    scores.resize(group * n, 0.0);
    buf.resize(bs * head_dim, 0.0);
    for (bi, &block) in ctx.blocks.iter().enumerate() {
        let start = bi * bs;
        if start >= n {
            break;
        }
        let len = (n - start).min(bs);
        kv.read(block as usize, layer, 0, kv_head, len, buf);
        for g in 0..group {
            let qh = &q[g * head_dim..(g + 1) * head_dim];
            for s in 0..len {
                scores[g * n + start + s] =
                    dot_f32(qh, &buf[s * head_dim..(s + 1) * head_dim]) * scale;
            }
        }
    }
    for g in 0..group {
        softmax(&mut scores[g * n..(g + 1) * n]);
    }
    out.fill(0.0);
    for (bi, &block) in ctx.blocks.iter().enumerate() {
        let start = bi * bs;
        if start >= n {
            break;
        }
        let len = (n - start).min(bs);
        kv.read(block as usize, layer, 1, kv_head, len, buf);
        for g in 0..group {
            let o = &mut out[g * head_dim..(g + 1) * head_dim];
            for s in 0..len {
                let p = scores[g * n + start + s];
                for (ov, vv) in o.iter_mut().zip(&buf[s * head_dim..(s + 1) * head_dim]) {
                    *ov += p * vv;
                }
            }
        }
    }
}
