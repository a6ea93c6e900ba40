//! The CPU KV cache storage: fixed-size blocks (pages) of f16 keys and values.
//!
//! Which sequence owns which block is decided by [`crate::kv_cache::BlockManager`]; this type
//! only holds the numbers. A block holds, for every layer, key and value rows of
//! `block_size` positions for each KV head, laid out so that one head's positions within a
//! block are contiguous.

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
        let d = self.head_dim;
        for h in 0..self.kv_heads {
            let kb = self.base(block, layer, 0, h) + slot * d;
            self.data[kb..kb + d].convert_from_f32_slice(&k[h * d..(h + 1) * d]);
            let vb = self.base(block, layer, 1, h) + slot * d;
            self.data[vb..vb + d].convert_from_f32_slice(&v[h * d..(h + 1) * d]);
        }
    }

    /// Converts the first `n` positions of one head's keys (`kind` 0) or values (1) in a block
    /// into `out` (`n * head_dim`).
    pub fn read(
        &self,
        block: usize,
        layer: usize,
        kind: usize,
        head: usize,
        n: usize,
        out: &mut [f32],
    ) {
        let b = self.base(block, layer, kind, head);
        let len = n * self.head_dim;
        self.data[b..b + len].convert_to_f32_slice(&mut out[..len]);
    }
}
