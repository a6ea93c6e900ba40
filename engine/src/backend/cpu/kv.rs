//! The CPU KV cache storage: fixed-size blocks (pages) of f16 keys and values.
//!
//! Which sequence owns which block is decided by [`crate::kv_cache::BlockManager`]; this type
//! only holds the numbers. A block holds, for every layer and KV head, the keys transposed
//! (`head_dim × block_size`: one dimension of every position is contiguous, so a query takes
//! the scores of a whole block with one multiply-add per dimension) and the values as rows
//! (`block_size × head_dim`: one position's values are contiguous, to be weighted and added).

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Paged f16 key/value storage.
pub struct KvStore {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    blocks: usize,
    data: Vec<f16>,
}

impl KvStore {
    /// Storage for `blocks` blocks.
    pub fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        blocks: usize,
    ) -> Self {
        let n = blocks * layers * 2 * kv_heads * block_size * head_dim;
        Self {
            layers,
            kv_heads,
            head_dim,
            block_size,
            blocks,
            data: vec![f16::ZERO; n],
        }
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes per position (all layers, keys and values).
    pub fn bytes_per_token(&self) -> usize {
        self.layers * 2 * self.kv_heads * self.head_dim * 2
    }

    fn base(&self, block: usize, layer: usize, kind: usize, head: usize) -> usize {
        (((block * self.layers + layer) * 2 + kind) * self.kv_heads + head)
            * self.block_size
            * self.head_dim
    }

    /// Stores the keys and values (`kv_heads * head_dim` each) of one position.
    pub fn write(&mut self, block: usize, slot: usize, layer: usize, k: &[f32], v: &[f32]) {
        let (d, bs) = (self.head_dim, self.block_size);
        for h in 0..self.kv_heads {
            let kb = self.base(block, layer, 0, h) + slot;
            for (i, x) in k[h * d..(h + 1) * d].iter().enumerate() {
                self.data[kb + i * bs] = f16::from_f32(*x);
            }
            let vb = self.base(block, layer, 1, h) + slot * d;
            self.data[vb..vb + d].convert_from_f32_slice(&v[h * d..(h + 1) * d]);
        }
    }

    /// One head's keys in a block, transposed: `head_dim × block_size`.
    pub fn keys(&self, block: usize, layer: usize, head: usize) -> &[f16] {
        let b = self.base(block, layer, 0, head);
        &self.data[b..b + self.block_size * self.head_dim]
    }

    /// One head's values in a block: `block_size × head_dim`.
    pub fn values(&self, block: usize, layer: usize, head: usize) -> &[f16] {
        let b = self.base(block, layer, 1, head);
        &self.data[b..b + self.block_size * self.head_dim]
    }

    /// Converts the first `n` positions of one head's keys (`kind` 0) or values (1) in a block
    /// into `out` (`n * head_dim`, one position after another).
    pub fn read(
        &self,
        block: usize,
        layer: usize,
        kind: usize,
        head: usize,
        n: usize,
        out: &mut [f32],
    ) {
        let (d, bs) = (self.head_dim, self.block_size);
        if kind == 1 {
            self.values(block, layer, head)[..n * d].convert_to_f32_slice(&mut out[..n * d]);
            return;
        }
        let keys = self.keys(block, layer, head);
        for p in 0..n {
            for i in 0..d {
                out[p * d + i] = keys[i * bs + p].to_f32();
            }
        }
    }
}
