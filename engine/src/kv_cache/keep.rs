//! Keeping cached blocks for live sessions.
//!
//! A session's last turn leaves its blocks in the prefix cache, evictable in least recently
//! used order like any other. Kept blocks stay ahead of the others: while no sequence holds
//! them they wait in a list of their own, taken from only once no other cached block is left
//! (so keeping never refuses a request room: it only orders eviction). A block kept by several
//! sessions (a shared system prompt) is kept until the last lets go.
//!
//! A keeping names each block with its generation: a block reclaimed all the same (counted in
//! [`BlockManager::kept_evictions`]) starts a new generation, so a keeping of its old content
//! is void and letting it go later changes nothing.

use super::{BlockManager, RELEASED};

/// One block a session keeps: its id and its generation when kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptBlock {
    block: u32,
    generation: u32,
}

impl BlockManager {
    /// Keeps the leading cached blocks of `table` (a sequence's blocks in position order,
    /// already released or not), up to the first that is not registered in the cache.
    pub fn keep(&mut self, table: &[u32]) -> Vec<KeptBlock> {
        let mut kept = Vec::new();
        for &b in table {
            if b == RELEASED || self.meta[b as usize].key.is_none() {
                break;
            }
            let m = &mut self.meta[b as usize];
            m.holds += 1;
            if m.holds == 1 {
                self.kept_blocks += 1;
                if let Some(tick) = m.lru {
                    self.evictable.remove(&tick);
                    self.kept.insert(tick, b);
                }
            }
            kept.push(KeptBlock {
                block: b,
                generation: m.generation,
            });
        }
        kept
    }

    /// Lets go of blocks kept by [`BlockManager::keep`]; a block reclaimed since is skipped.
    pub fn unkeep(&mut self, kept: &[KeptBlock]) {
        for k in kept {
            let m = &mut self.meta[k.block as usize];
            if m.generation != k.generation || m.holds == 0 {
                continue;
            }
            m.holds -= 1;
            if m.holds == 0 {
                self.kept_blocks -= 1;
                if let Some(tick) = m.lru {
                    self.kept.remove(&tick);
                    self.evictable.insert(tick, k.block);
                }
            }
        }
    }

    /// Whether every block of a keeping still holds what it held when kept.
    pub fn intact(&self, kept: &[KeptBlock]) -> bool {
        kept.iter().all(|k| {
            let m = &self.meta[k.block as usize];
            m.generation == k.generation && m.key.is_some()
        })
    }

    /// Blocks kept by at least one session now.
    pub fn kept_blocks(&self) -> usize {
        self.kept_blocks
    }

    /// Kept blocks reclaimed so far because no other cached block was left.
    pub fn kept_evictions(&self) -> u64 {
        self.kept_evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manager of `blocks` blocks of 2 positions with `tokens` cached and released.
    fn cached(blocks: usize, tokens: &[u32]) -> (BlockManager, Vec<u32>) {
        let mut m = BlockManager::new(blocks, 2);
        let (mut s, _) = m.match_prefix(tokens);
        m.reserve(&mut s, tokens.len()).expect("reserve");
        m.register_full(&mut s, tokens, tokens.len());
        let table = s.table.clone();
        m.release(&mut s);
        (m, table)
    }

    #[test]
    fn kept_blocks_are_evicted_last() {
        let (mut m, a) = cached(6, &[1, 2, 3, 4]);
        let kept = m.keep(&a);
        assert_eq!((kept.len(), m.kept_blocks()), (2, 2));
        // Another conversation, cached after the kept one (so more recently used).
        let (mut s, _) = m.match_prefix(&[9, 9, 8, 8]);
        m.reserve(&mut s, 4).expect("reserve");
        m.register_full(&mut s, &[9, 9, 8, 8], 4);
        m.release(&mut s);
        assert_eq!(m.available(), 6);
        // Four blocks needed: the two free ones, then the unkept cached ones, not the kept.
        let (mut big, _) = m.match_prefix(&[5; 8]);
        m.reserve(&mut big, 8).expect("reserve");
        assert!(m.intact(&kept));
        assert_eq!(m.match_prefix(&[1, 2, 3, 4, 7]).1, 4);
        assert_eq!(m.kept_evictions(), 0);
        m.release(&mut big);
    }

    #[test]
    fn kept_blocks_go_when_nothing_else_is_left() {
        let (mut m, a) = cached(2, &[1, 2, 3, 4]);
        let kept = m.keep(&a);
        let (mut s, _) = m.match_prefix(&[7, 7, 7]);
        m.reserve(&mut s, 3)
            .expect("the kept blocks are still available");
        assert_eq!((m.kept_evictions(), m.kept_blocks()), (2, 0));
        assert!(!m.intact(&kept));
        // Letting go of a void keeping changes nothing.
        m.unkeep(&kept);
        assert_eq!(m.kept_blocks(), 0);
        m.release(&mut s);
    }

    #[test]
    fn a_block_kept_twice_is_kept_until_both_let_go() {
        let (mut m, a) = cached(4, &[1, 2, 3, 4]);
        let first = m.keep(&a);
        let second = m.keep(&a[..1]);
        m.unkeep(&first);
        assert_eq!(m.kept_blocks(), 1);
        // The block no longer kept is evicted first.
        let (mut s, _) = m.match_prefix(&[8, 8, 8, 8, 8, 8]);
        m.reserve(&mut s, 6).expect("reserve");
        assert!(m.intact(&second));
        assert_eq!(m.match_prefix(&[1, 2, 9]).1, 2);
        m.unkeep(&second);
        assert_eq!(m.kept_blocks(), 0);
        m.release(&mut s);
    }

    #[test]
    fn a_held_block_stays_kept_across_its_use() {
        let (mut m, a) = cached(4, &[1, 2, 3, 4]);
        let kept = m.keep(&a);
        // The next turn takes the blocks, then releases them: they go back to the kept list.
        let (mut s, cached_tokens) = m.match_prefix(&[1, 2, 3, 4, 5]);
        assert_eq!(cached_tokens, 4);
        assert_eq!(m.available(), 2);
        m.release(&mut s);
        assert_eq!((m.available(), m.kept_blocks()), (4, 2));
        let (mut t, _) = m.match_prefix(&[6, 6, 6, 6, 6]);
        m.reserve(&mut t, 4).expect("reserve");
        assert!(m.intact(&kept));
        m.release(&mut t);
    }

    #[test]
    fn only_registered_blocks_are_kept() {
        let mut m = BlockManager::new(4, 2);
        let (mut s, _) = m.match_prefix(&[1, 2, 3]);
        m.reserve(&mut s, 3).expect("reserve");
        m.register_full(&mut s, &[1, 2, 3], 3);
        // Block 0 is registered (full), block 1 holds one position: not cached, not kept.
        let kept = m.keep(&s.table);
        assert_eq!(kept.len(), 1);
        m.release(&mut s);
        assert_eq!(m.kept_blocks(), 1);
        assert_eq!(m.available(), 4);
    }
}
