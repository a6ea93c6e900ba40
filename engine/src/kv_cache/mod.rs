//! Host-side KV block bookkeeping: which blocks each sequence owns, and the prefix cache.
//!
//! Blocks are reference counted. A block that fills up is registered under the hash of its
//! whole token prefix (the chain of its own tokens and every earlier block's), so a later
//! sequence with the same prefix reuses it instead of recomputing it (automatic prefix caching;
//! this is what makes warm resume cheap). When the last owner releases a registered block it is
//! kept, evictable, in least-recently-used order; unregistered blocks return to the free list.
//! Only full blocks are ever shared, so a sequence never writes into a shared block.
//!
//! A model with sliding-window layers keeps their KV in a second pool whose blocks a sequence
//! gives back once its window has passed them ([`pools`]).
//!
//! Cached blocks can be **kept** for a live session ([`keep`]): a kept block that no sequence
//! holds is evicted only once no other cached block is left.

pub mod keep;
pub mod pools;

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

pub use keep::KeptBlock;
pub use pools::{KvPools, SeqKv};

/// A table entry whose block the sequence no longer holds: a sliding-window layer's block its
/// window has passed (given back to its pool). Never read: a local layer reads only its window.
pub const RELEASED: u32 = u32::MAX;

/// Blocks owned by one sequence, in position order.
#[derive(Debug, Default, Clone)]
pub struct SeqBlocks {
    /// Block ids; position `p` lives in `table[p / block_size]`.
    pub table: Vec<u32>,
    /// Prefix hashes of the leading full blocks that are registered (or were found) in the cache.
    hashes: Vec<u64>,
}

impl SeqBlocks {
    /// Number of table entries (blocks held, and any [`RELEASED`] before them).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Number of blocks actually held (entries not [`RELEASED`]).
    pub fn held(&self) -> usize {
        self.table.iter().filter(|&&b| b != RELEASED).count()
    }

    /// Whether no blocks are held.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// A change to the prefix cache, recorded where it happens for the KV-event stream
/// ([`crate::kv_events`]): only blocks registered under a prefix hash appear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks joined the prefix cache: `hashes` in prefix order, each block's parent the
    /// one before it (the first's is `parent`, `None` at the start of a prompt), and their
    /// tokens, `block_size` per block.
    Stored {
        /// Prefix hashes of the blocks, in order.
        hashes: Vec<u64>,
        /// The prefix hash of the block before the first (`None` for a prompt's first block).
        parent: Option<u64>,
        /// The blocks' tokens, concatenated.
        tokens: Vec<u32>,
    },
    /// Blocks left the prefix cache (evicted).
    Removed {
        /// Their prefix hashes.
        hashes: Vec<u64>,
    },
    /// Every block left the prefix cache (at start, and before a restatement).
    Cleared,
}

/// A registered block's key.
#[derive(Debug, Clone)]
struct Key {
    hash: u64,
    /// The previous block's prefix hash (`None` for a prompt's first block).
    parent: Option<u64>,
    /// Blocks before this one in its prefix (restatements list parents first).
    depth: usize,
    tokens: Vec<u32>,
}

#[derive(Debug, Clone, Default)]
struct Meta {
    refs: u32,
    /// Prefix hash, parent and the block's tokens, when registered.
    key: Option<Key>,
    /// LRU tick while evictable (in `evictable`, or in `kept` while kept).
    lru: Option<u64>,
    /// Sessions keeping the block ([`keep`]).
    holds: u32,
    /// Times the block was reclaimed from the cache: a keeping taken before is void.
    generation: u32,
}

/// Not enough free blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("KV cache exhausted: {needed} blocks needed, {available} available")]
pub struct OutOfBlocks {
    /// Blocks the request needed.
    pub needed: usize,
    /// Blocks that were free or evictable.
    pub available: usize,
}

/// Allocates KV blocks and keeps the prefix cache.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    meta: Vec<Meta>,
    free: Vec<u32>,
    evictable: BTreeMap<u64, u32>,
    /// Evictable blocks that sessions keep: taken only once `evictable` is empty.
    kept: BTreeMap<u64, u32>,
    /// Blocks with at least one keeping.
    kept_blocks: usize,
    /// Kept blocks reclaimed all the same (nothing else was left to evict).
    kept_evictions: u64,
    by_hash: HashMap<u64, u32>,
    tick: u64,
    evictions: u64,
    /// Changes to the prefix cache since the last [`BlockManager::take_events`], when
    /// recording (`None`: nothing is recorded, nothing copied).
    events: Option<Vec<KvEvent>>,
}

/// The prefix hash of a block of `tokens` after the block whose prefix hash is `parent` (0
/// for a prompt's first block): the last 8 bytes, read big-endian, of the SHA-256 of the
/// parent as 8 bytes big-endian followed by each token id as 4 bytes big-endian. The same
/// hash keys the prefix cache and the KV events, so a subscriber that rebuilds the chain from
/// a prompt's tokens finds exactly the blocks the engine would match (docs/api.md).
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = Sha256::new();
    h.update(parent.to_be_bytes());
    for t in tokens {
        h.update(t.to_be_bytes());
    }
    let digest = h.finalize();
    let mut last = [0u8; 8];
    last.copy_from_slice(&digest[24..32]);
    u64::from_be_bytes(last)
}

impl BlockManager {
    /// A manager of `blocks` blocks of `block_size` positions.
    pub fn new(blocks: usize, block_size: usize) -> Self {
        let n = u32::try_from(blocks).expect("block count fits u32");
        Self {
            block_size,
            meta: vec![Meta::default(); blocks],
            free: (0..n).rev().collect(),
            evictable: BTreeMap::new(),
            kept: BTreeMap::new(),
            kept_blocks: 0,
            kept_evictions: 0,
            by_hash: HashMap::new(),
            tick: 0,
            evictions: 0,
            events: None,
        }
    }

    /// Starts recording changes to the prefix cache ([`BlockManager::take_events`]).
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The changes recorded since the last call (empty when not recording).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The prefix cache as it is now, as events that rebuild it after a [`KvEvent::Cleared`]:
    /// every registered block, parents before children.
    pub fn restate(&self) -> Vec<KvEvent> {
        let mut keys: Vec<&Key> = self.meta.iter().filter_map(|m| m.key.as_ref()).collect();
        keys.sort_by_key(|k| (k.depth, k.hash));
        keys.into_iter()
            .map(|k| KvEvent::Stored {
                hashes: vec![k.hash],
                parent: k.parent,
                tokens: k.tokens.clone(),
            })
            .collect()
    }

    /// Records that the block of prefix hash `hash` left the cache.
    fn removed(&mut self, hash: u64) {
        let Some(ev) = self.events.as_mut() else {
            return;
        };
        match ev.last_mut() {
            Some(KvEvent::Removed { hashes }) => hashes.push(hash),
            _ => ev.push(KvEvent::Removed { hashes: vec![hash] }),
        }
    }

    /// Records that a block joined the cache.
    fn stored(&mut self, hash: u64, parent: Option<u64>, chunk: &[u32]) {
        let Some(ev) = self.events.as_mut() else {
            return;
        };
        // A block that extends the previous event's run joins it, as vLLM groups them.
        if let Some(KvEvent::Stored { hashes, tokens, .. }) = ev.last_mut()
            && parent.is_some()
            && hashes.last().copied() == parent
        {
            hashes.push(hash);
            tokens.extend_from_slice(chunk);
            return;
        }
        ev.push(KvEvent::Stored {
            hashes: vec![hash],
            parent,
            tokens: chunk.to_vec(),
        });
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// How many KV blocks the cache has in all, used or free.
    pub fn total(&self) -> usize {
        self.meta.len()
    }

    /// Blocks that can be handed out now (free plus evictable cached ones, kept ones included).
    pub fn available(&self) -> usize {
        self.free.len() + self.evictable.len() + self.kept.len()
    }

    /// Registered blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Blocks needed to hold `positions` positions.
    pub fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.block_size)
    }

    fn take_one(&mut self) -> Option<u32> {
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        // Least recently used first; a block a session keeps only when nothing else is left.
        let (tick, b) = match self.evictable.pop_first() {
            Some(e) => e,
            None => {
                let e = self.kept.pop_first()?;
                self.kept_evictions += 1;
                e
            }
        };
        debug_assert_eq!(self.meta[b as usize].lru, Some(tick));
        let m = &mut self.meta[b as usize];
        m.lru = None;
        m.generation = m.generation.wrapping_add(1);
        if m.holds > 0 {
            m.holds = 0;
            self.kept_blocks -= 1;
        }
        if let Some(key) = m.key.take() {
            self.by_hash.remove(&key.hash);
            self.removed(key.hash);
        }
        self.evictions += 1;
        Some(b)
    }

    /// The registered block holding `chunk` under prefix hash `hash`, if cached.
    fn find(&self, hash: u64, chunk: &[u32]) -> Option<u32> {
        let &b = self.by_hash.get(&hash)?;
        let m = &self.meta[b as usize];
        m.key
            .as_ref()
            .is_some_and(|k| k.tokens == chunk)
            .then_some(b)
    }

    /// Takes a reference on cached block `b` (no longer evictable).
    fn acquire(&mut self, b: u32) {
        let m = &mut self.meta[b as usize];
        if let Some(tick) = m.lru.take() {
            if m.holds > 0 {
                self.kept.remove(&tick);
            } else {
                self.evictable.remove(&tick);
            }
        }
        m.refs += 1;
    }

    /// The cached blocks of the longest prefix of `tokens` made of full blocks, leaving at
    /// least one token to compute, with their prefix hashes; takes no reference.
    fn lookup(&self, tokens: &[u32]) -> Vec<(u64, u32)> {
        let bs = self.block_size;
        let max_blocks = tokens.len().saturating_sub(1) / bs;
        let mut found = Vec::new();
        let mut parent = 0u64;
        for i in 0..max_blocks {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let hash = chain_hash(parent, chunk);
            let Some(b) = self.find(hash, chunk) else {
                break;
            };
            found.push((hash, b));
            parent = hash;
        }
        found
    }

    /// Finds the longest cached prefix of `tokens` made of full blocks, leaving at least one
    /// token to compute, and takes a reference on each block found. Returns the sequence's
    /// blocks and the number of cached positions.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> (SeqBlocks, usize) {
        let found = self.lookup(tokens);
        let seq = self.take_found(&found, 0);
        let cached = seq.table.len() * self.block_size;
        (seq, cached)
    }

    /// A sequence's table over the blocks `found` (in prefix order), holding those from
    /// `first` on (a reference taken on each) and [`RELEASED`] before.
    fn take_found(&mut self, found: &[(u64, u32)], first: usize) -> SeqBlocks {
        let mut seq = SeqBlocks::default();
        for (i, &(hash, b)) in found.iter().enumerate() {
            if i < first {
                seq.table.push(RELEASED);
            } else {
                self.acquire(b);
                seq.table.push(b);
            }
            seq.hashes.push(hash);
        }
        seq
    }

    /// Grows `seq` to hold `positions` positions.
    pub fn reserve(&mut self, seq: &mut SeqBlocks, positions: usize) -> Result<(), OutOfBlocks> {
        let need = self.blocks_for(positions).saturating_sub(seq.table.len());
        if need > self.available() {
            return Err(OutOfBlocks {
                needed: need,
                available: self.available(),
            });
        }
        for _ in 0..need {
            // Unwrap is safe: availability was checked above.
            let b = self.take_one().expect("checked availability");
            self.meta[b as usize].refs = 1;
            seq.table.push(b);
        }
        Ok(())
    }

    /// Registers every full block of `seq` whose tokens (`tokens[..computed]`) are now computed.
    pub fn register_full(&mut self, seq: &mut SeqBlocks, tokens: &[u32], computed: usize) {
        let bs = self.block_size;
        let full = (computed.min(tokens.len()) / bs).min(seq.table.len());
        while seq.hashes.len() < full {
            let i = seq.hashes.len();
            let parent = seq.hashes.last().copied();
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let hash = chain_hash(parent.unwrap_or(0), chunk);
            let b = seq.table[i];
            if b != RELEASED
                && !self.by_hash.contains_key(&hash)
                && self.meta[b as usize].key.is_none()
            {
                self.by_hash.insert(hash, b);
                self.meta[b as usize].key = Some(Key {
                    hash,
                    parent,
                    depth: i,
                    tokens: chunk.to_vec(),
                });
                self.stored(hash, parent, chunk);
            }
            seq.hashes.push(hash);
        }
    }

    /// Releases every block of `seq`: registered blocks become evictable (most recent last),
    /// others free.
    pub fn release(&mut self, seq: &mut SeqBlocks) {
        for b in std::mem::take(&mut seq.table) {
            self.release_one(b);
        }
        seq.hashes.clear();
    }

    /// Releases the blocks of `seq` before table entry `first`, leaving [`RELEASED`] in their
    /// place (the entries keep their positions; the prefix hashes stay, for later blocks).
    pub fn release_before(&mut self, seq: &mut SeqBlocks, first: usize) {
        let first = first.min(seq.table.len());
        for i in 0..first {
            let b = std::mem::replace(&mut seq.table[i], RELEASED);
            self.release_one(b);
        }
    }

    /// Reclaims cached block `b` now, if it is evictable (tests of what follows eviction).
    #[cfg(test)]
    pub(crate) fn forget(&mut self, b: u32) {
        let m = &mut self.meta[b as usize];
        let Some(tick) = m.lru.take() else {
            return;
        };
        if m.holds > 0 {
            self.kept.remove(&tick);
            m.holds = 0;
            self.kept_blocks -= 1;
        } else {
            self.evictable.remove(&tick);
        }
        m.generation = m.generation.wrapping_add(1);
        if let Some(key) = m.key.take() {
            self.by_hash.remove(&key.hash);
            self.removed(key.hash);
        }
        self.free.push(b);
    }

    fn release_one(&mut self, b: u32) {
        if b == RELEASED {
            return;
        }
        let m = &mut self.meta[b as usize];
        debug_assert!(m.refs > 0, "double release of block {b}");
        m.refs = m.refs.saturating_sub(1);
        if m.refs == 0 {
            if m.key.is_some() {
                self.tick += 1;
                m.lru = Some(self.tick);
                if m.holds > 0 {
                    self.kept.insert(self.tick, b);
                } else {
                    self.evictable.insert(self.tick, b);
                }
            } else {
                self.free.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_reused_after_release() {
        let mut m = BlockManager::new(8, 4);
        let toks: Vec<u32> = (0..10).collect();
        let (mut a, cached) = m.match_prefix(&toks);
        assert_eq!(cached, 0);
        m.reserve(&mut a, 10).expect("reserve");
        assert_eq!(a.len(), 3);
        m.register_full(&mut a, &toks, 10);
        m.release(&mut a);
        assert_eq!(m.available(), 8);
        // Same prefix plus more: two full blocks (8 positions) are reused.
        let longer: Vec<u32> = (0..14).collect();
        let (mut b, cached) = m.match_prefix(&longer);
        assert_eq!(cached, 8);
        m.reserve(&mut b, 14).expect("reserve");
        assert_eq!(b.len(), 4);
        // A prompt that is entirely cached still computes its last token.
        let (c, cached) = m.match_prefix(&toks[..8]);
        assert_eq!(cached, 4);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn different_prefix_misses_and_eviction_is_lru() {
        let mut m = BlockManager::new(4, 2);
        let a_toks = [1, 2, 3, 4, 5];
        let (mut a, _) = m.match_prefix(&a_toks);
        m.reserve(&mut a, 5).expect("reserve");
        m.register_full(&mut a, &a_toks, 5);
        m.release(&mut a);
        let (mut b, cached) = m.match_prefix(&[9, 9, 9, 9, 9]);
        assert_eq!(cached, 0);
        // Needs all 4 blocks: evicts cached ones rather than failing.
        m.reserve(&mut b, 8).expect("reserve");
        assert!(m.evictions() > 0);
        assert_eq!(
            m.reserve(&mut b, 10),
            Err(OutOfBlocks {
                needed: 1,
                available: 0
            })
        );
        m.release(&mut b);
        let (_, cached) = m.match_prefix(&a_toks);
        assert_eq!(cached, 0, "evicted blocks must not match");
    }

    #[test]
    fn chain_hash_is_the_documented_sha256() {
        // SHA-256 of 0u64 BE followed by tokens 1, 2 as u32 BE, last 8 bytes BE.
        let mut bytes = vec![0u8; 8];
        bytes.extend([0, 0, 0, 1, 0, 0, 0, 2]);
        let d = Sha256::digest(&bytes);
        let want = u64::from_be_bytes(d[24..32].try_into().expect("8 bytes"));
        assert_eq!(chain_hash(0, &[1, 2]), want);
        // Chained: the parent is part of the hash.
        assert_ne!(chain_hash(want, &[1, 2]), want);
        assert_ne!(chain_hash(0, &[2, 1]), want);
    }

    #[test]
    fn events_follow_registration_and_eviction() {
        let mut m = BlockManager::new(4, 2);
        assert!(m.take_events().is_empty());
        m.record_events();
        let t = [1, 2, 3, 4, 5];
        let (mut a, _) = m.match_prefix(&t);
        m.reserve(&mut a, 5).expect("reserve");
        m.register_full(&mut a, &t, 5);
        let h1 = chain_hash(0, &[1, 2]);
        let h2 = chain_hash(h1, &[3, 4]);
        assert_eq!(
            m.take_events(),
            vec![KvEvent::Stored {
                hashes: vec![h1, h2],
                parent: None,
                tokens: vec![1, 2, 3, 4],
            }]
        );
        // The same prefix again registers nothing new.
        let (mut b, cached) = m.match_prefix(&t);
        assert_eq!(cached, 4);
        m.reserve(&mut b, 5).expect("reserve");
        m.register_full(&mut b, &t, 5);
        assert!(m.take_events().is_empty());
        m.release(&mut a);
        m.release(&mut b);
        assert_eq!(
            m.restate(),
            vec![
                KvEvent::Stored {
                    hashes: vec![h1],
                    parent: None,
                    tokens: vec![1, 2],
                },
                KvEvent::Stored {
                    hashes: vec![h2],
                    parent: Some(h1),
                    tokens: vec![3, 4],
                },
            ]
        );
        // A prompt that needs every block evicts both, oldest first, in one event.
        let (mut c, _) = m.match_prefix(&[9; 7]);
        m.reserve(&mut c, 8).expect("reserve");
        assert_eq!(
            m.take_events(),
            vec![KvEvent::Removed {
                hashes: vec![h1, h2]
            }]
        );
        assert!(m.restate().is_empty());
    }

    #[test]
    fn shared_blocks_are_refcounted() {
        let mut m = BlockManager::new(6, 2);
        let t = [1, 2, 3, 4, 5];
        let (mut a, _) = m.match_prefix(&t);
        m.reserve(&mut a, 5).expect("reserve");
        m.register_full(&mut a, &t, 5);
        let (mut b, cached) = m.match_prefix(&t);
        assert_eq!(cached, 4);
        assert_eq!(&b.table[..], &a.table[..2]);
        m.reserve(&mut b, 5).expect("reserve");
        m.release(&mut a);
        // b still holds the shared blocks: they are not evictable.
        assert_eq!(m.available(), 6 - 3);
        m.release(&mut b);
        assert_eq!(m.available(), 6);
    }
}
