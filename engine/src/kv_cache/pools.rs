//! The KV pools of one group: every layer's KV in one pool, or, for a model with
//! sliding-window (local) layers on a backend that supports it, the global layers' KV in the
//! full pool and the local layers' in a window pool of their own.
//!
//! A sequence's full-pool table covers every position it has computed, as always. Its
//! window-pool table is indexed the same way (`table[p / block_size]`), but the blocks that
//! the window has passed are given back ([`RELEASED`] in their place): with `next` the next
//! position to compute and `B` the last whole-block boundary at or before it, the sequence
//! keeps the blocks from the one holding `B + 1 - window` on, which are what a row at `next`
//! reads (`next + 1 - window` is never earlier) and what a resume at `B` needs. A local layer
//! thus holds at most `window / block_size + 2` blocks per sequence, whatever its length.
//!
//! Both pools register full blocks under the same prefix hashes, so the prefix cache stays
//! exact: a prefix of `P` positions (whole blocks) is reused only when the full pool holds
//! all of it and the window pool holds the blocks covering `[P + 1 - window, P)`, the
//! positions the first recomputed row can see. When the window's blocks are gone (given back
//! and then reclaimed), the longest shorter prefix that satisfies both is reused instead, and
//! that is what `cached` says.

use super::{BlockManager, KvEvent, OutOfBlocks, RELEASED, SeqBlocks};

/// A sequence's blocks in the group's pools.
#[derive(Debug, Default, Clone)]
pub struct SeqKv {
    /// Blocks of the full pool (every layer's KV, or the global layers' with a window pool).
    pub full: SeqBlocks,
    /// Blocks of the window pool (empty without one).
    pub window: SeqBlocks,
}

/// A finished turn's last block, partly filled (its positions `start..start + tokens.len()`),
/// taken out of the turn's tables in both pools before they are released, so that the
/// session's next turn, which resends those tokens, continues in it instead of computing
/// them again: the prefix cache holds whole blocks only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tail {
    /// The block's first position.
    pub start: usize,
    /// The tokens whose KV it holds.
    pub tokens: Vec<u32>,
    /// Its block in the full pool.
    full: u32,
    /// Its block in the window pool (with one).
    window: Option<u32>,
}

/// The window pool and the window its layers see.
#[derive(Debug)]
struct WindowPool {
    blocks: BlockManager,
    window: usize,
}

/// The group's KV pools: the full pool, and the window pool when local layers keep only their
/// window.
#[derive(Debug)]
pub struct KvPools {
    full: BlockManager,
    window: Option<WindowPool>,
}

/// The first window-pool table entry a sequence keeps when `next` is its next position.
pub fn first_kept(next: usize, window: usize, block_size: usize) -> usize {
    let bs = block_size.max(1);
    (next / bs * bs + 1).saturating_sub(window) / bs
}

impl KvPools {
    /// One pool of `blocks` blocks of `block_size` positions, every layer whole.
    pub fn whole(blocks: usize, block_size: usize) -> Self {
        Self {
            full: BlockManager::new(blocks, block_size),
            window: None,
        }
    }

    /// A full pool of `blocks` blocks and a window pool of `window_blocks` blocks for layers
    /// that see the last `window` positions.
    pub fn windowed(blocks: usize, block_size: usize, window: usize, window_blocks: usize) -> Self {
        Self {
            full: BlockManager::new(blocks, block_size),
            window: Some(WindowPool {
                blocks: BlockManager::new(window_blocks, block_size),
                window: window.max(1),
            }),
        }
    }

    /// Starts recording the full pool's prefix-cache changes (the KV events describe the full
    /// pool: with a window pool, a prefix also needs its window's blocks there to be reused).
    pub fn record_events(&mut self) {
        self.full.record_events();
    }

    /// The full pool's prefix-cache changes since the last call.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.full.take_events()
    }

    /// The full pool's prefix cache as events that rebuild it.
    pub fn restate(&self) -> Vec<KvEvent> {
        self.full.restate()
    }

    /// The full pool.
    pub fn full(&self) -> &BlockManager {
        &self.full
    }

    /// The full pool, to keep a session's blocks in it ([`super::keep`]).
    pub fn full_mut(&mut self) -> &mut BlockManager {
        &mut self.full
    }

    /// The window pool, when there is one.
    pub fn window_pool(&self) -> Option<&BlockManager> {
        self.window.as_ref().map(|w| &w.blocks)
    }

    /// The window pool, mutably, when there is one.
    pub fn window_pool_mut(&mut self) -> Option<&mut BlockManager> {
        self.window.as_mut().map(|w| &mut w.blocks)
    }

    /// The local layers' window, when they keep only it.
    pub fn window(&self) -> Option<usize> {
        self.window.as_ref().map(|w| w.window)
    }

    /// Positions per block (both pools).
    pub fn block_size(&self) -> usize {
        self.full.block_size()
    }

    /// Full-pool blocks needed to hold `positions` positions.
    pub fn blocks_for(&self, positions: usize) -> usize {
        self.full.blocks_for(positions)
    }

    /// Full-pool blocks that can be handed out now.
    pub fn available(&self) -> usize {
        self.full.available()
    }

    /// Finds the longest cached prefix of `tokens` (whole blocks, at least one token left to
    /// compute) that both pools can resume from, and takes a reference on each block it
    /// keeps. Returns the sequence's blocks and the number of cached positions.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> (SeqKv, usize) {
        let bs = self.full.block_size();
        let found = self.full.lookup(tokens);
        let Some(wp) = self.window.as_mut() else {
            let full = self.full.take_found(&found, 0);
            return (
                SeqKv {
                    full,
                    window: SeqBlocks::default(),
                },
                found.len() * bs,
            );
        };
        let present: Vec<Option<u32>> = found
            .iter()
            .enumerate()
            .map(|(i, &(hash, _))| wp.blocks.find(hash, &tokens[i * bs..(i + 1) * bs]))
            .collect();
        // The longest prefix whose window blocks are all still in the window pool.
        let mut n = found.len();
        while n > 0 {
            let lo = first_kept(n * bs, wp.window, bs);
            if present[lo..n].iter().all(Option::is_some) {
                break;
            }
            n -= 1;
        }
        let lo = first_kept(n * bs, wp.window, bs);
        let in_window: Vec<(u64, u32)> = found[..n]
            .iter()
            .zip(&present)
            .map(|(&(hash, _), b)| (hash, b.unwrap_or(RELEASED)))
            .collect();
        let window = wp.blocks.take_found(&in_window, lo);
        let full = self.full.take_found(&found[..n], 0);
        (SeqKv { full, window }, n * bs)
    }

    /// Positions of `tokens` the full pool alone holds (whole blocks, at least one token left
    /// to compute), whatever the window pool still has: beside [`KvPools::match_prefix`]'s
    /// answer, it says whether a shorter resume is the window pool's doing.
    pub fn full_cached(&self, tokens: &[u32]) -> usize {
        self.full.lookup(tokens).len() * self.full.block_size()
    }

    /// Grows the sequence's full-pool table to hold `positions` positions.
    pub fn reserve(&mut self, seq: &mut SeqKv, positions: usize) -> Result<(), OutOfBlocks> {
        self.full.reserve(&mut seq.full, positions)
    }

    /// Makes the window-pool table ready to compute positions `start..end`: gives back what
    /// the window has passed at `start`, then grows it to `end` positions. Nothing to do
    /// without a window pool.
    pub fn reserve_window(
        &mut self,
        seq: &mut SeqKv,
        start: usize,
        end: usize,
    ) -> Result<(), OutOfBlocks> {
        self.slide(seq, start);
        match self.window.as_mut() {
            Some(wp) => wp.blocks.reserve(&mut seq.window, end),
            None => Ok(()),
        }
    }

    /// Gives back the window-pool blocks the window has passed when `next` is the sequence's
    /// next position (registered ones stay in the prefix cache, evictable).
    pub fn slide(&mut self, seq: &mut SeqKv, next: usize) {
        if let Some(wp) = self.window.as_mut() {
            let first = first_kept(next, wp.window, wp.blocks.block_size());
            wp.blocks.release_before(&mut seq.window, first);
        }
    }

    /// Registers the sequence's full blocks, in both pools, once `computed` positions of
    /// `tokens` are computed.
    pub fn register_full(&mut self, seq: &mut SeqKv, tokens: &[u32], computed: usize) {
        self.full.register_full(&mut seq.full, tokens, computed);
        if let Some(wp) = self.window.as_mut() {
            wp.blocks.register_full(&mut seq.window, tokens, computed);
        }
    }

    /// Takes the sequence's partly filled last block (positions `computed / block_size *
    /// block_size .. computed` of `tokens`) out of its tables, in both pools, unregistered
    /// and held; `None` when `computed` ends on a block boundary or the block is not the
    /// sequence's alone to give.
    pub fn detach_tail(
        &mut self,
        seq: &mut SeqKv,
        tokens: &[u32],
        computed: usize,
    ) -> Option<Tail> {
        let bs = self.full.block_size();
        let (at, len) = (computed / bs, computed % bs);
        let full = *seq.full.table.get(at)?;
        if len == 0 || full == RELEASED || computed > tokens.len() {
            return None;
        }
        let window = match &self.window {
            Some(_) => match seq.window.table.get(at) {
                Some(&b) if b != RELEASED => Some(b),
                _ => return None,
            },
            None => None,
        };
        seq.full.table[at] = RELEASED;
        if window.is_some() {
            seq.window.table[at] = RELEASED;
        }
        Some(Tail {
            start: at * bs,
            tokens: tokens[at * bs..computed].to_vec(),
            full,
            window,
        })
    }

    /// Continues a sequence matched up to `cached` positions in `tail`, when `tokens` go on
    /// with the tail's tokens and at least one more: the tail's blocks become the sequence's
    /// next ones (it writes on into them). Returns the positions gained, or the tail when it
    /// does not continue this sequence.
    pub fn attach_tail(
        &mut self,
        seq: &mut SeqKv,
        tokens: &[u32],
        cached: usize,
        tail: Tail,
    ) -> Result<usize, Tail> {
        let bs = self.full.block_size();
        let end = tail.start + tail.tokens.len();
        let fits = cached == tail.start
            && seq.full.table.len() * bs == cached
            && (tail.window.is_none() || seq.window.table.len() * bs == cached)
            && tokens.len() > end
            && tokens[tail.start..end] == tail.tokens[..];
        if !fits {
            return Err(tail);
        }
        seq.full.table.push(tail.full);
        if let Some(w) = tail.window {
            seq.window.table.push(w);
        }
        Ok(tail.tokens.len())
    }

    /// Gives a tail's blocks back (free).
    pub fn release_tail(&mut self, tail: Tail) {
        let mut full = SeqBlocks::default();
        full.table.push(tail.full);
        self.full.release(&mut full);
        if let (Some(b), Some(wp)) = (tail.window, self.window.as_mut()) {
            let mut window = SeqBlocks::default();
            window.table.push(b);
            wp.blocks.release(&mut window);
        }
    }

    /// Releases every block of the sequence in both pools.
    pub fn release(&mut self, seq: &mut SeqKv) {
        self.full.release(&mut seq.full);
        if let Some(wp) = self.window.as_mut() {
            wp.blocks.release(&mut seq.window);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a sequence of `tokens` through the pools as the step loop does: chunks of
    /// `chunk` positions from `from`, window reserved before and slid after each.
    fn compute(p: &mut KvPools, seq: &mut SeqKv, tokens: &[u32], from: usize, chunk: usize) {
        let mut at = from;
        while at < tokens.len() {
            let end = (at + chunk).min(tokens.len());
            p.reserve(seq, end).expect("full");
            p.reserve_window(seq, at, end).expect("window");
            at = end;
            p.register_full(seq, tokens, at);
            p.slide(seq, at);
        }
    }

    #[test]
    fn a_tail_is_continued_only_by_a_prompt_that_goes_on_from_it() {
        let mut p = KvPools::windowed(32, 4, 8, 16);
        let toks: Vec<u32> = (0..30).collect();
        let mut s = SeqKv::default();
        compute(&mut p, &mut s, &toks[..22], 0, 4);
        // 22 positions: five whole blocks and 2 positions of the sixth.
        let tail = p
            .detach_tail(&mut s, &toks, 22)
            .expect("a partly filled block");
        assert_eq!((tail.start, tail.tokens.clone()), (20, vec![20, 21]));
        p.release(&mut s);
        // Held apart: one block in each pool.
        assert_eq!(
            (
                p.full.available(),
                p.window_pool().map(BlockManager::available)
            ),
            (31, Some(15))
        );
        // A prompt that departs inside the tail does not take it.
        let mut other = toks.clone();
        other[21] = 99;
        let (mut o, cached) = p.match_prefix(&other);
        assert_eq!(cached, 20);
        let tail = p
            .attach_tail(&mut o, &other, cached, tail)
            .expect_err("departs");
        p.release(&mut o);
        // One that goes on from it does: its 22 positions are reused.
        let (mut n, cached) = p.match_prefix(&toks);
        let gained = p
            .attach_tail(&mut n, &toks, cached, tail)
            .expect("continues");
        assert_eq!(cached + gained, 22);
        assert_eq!((n.full.table.len(), n.window.table.len()), (6, 6));
        // A prompt that ends inside it leaves nothing to compute: not taken.
        let tail2 = Tail {
            start: 20,
            tokens: vec![20, 21],
            full: n.full.table[5],
            window: n.window.table.get(5).copied(),
        };
        let mut short = SeqKv::default();
        assert!(p.attach_tail(&mut short, &toks[..22], 20, tail2).is_err());
        p.release(&mut n);
        assert_eq!(
            (
                p.full.available(),
                p.window_pool().map(BlockManager::available)
            ),
            (32, Some(16)),
            "every block given back"
        );
    }

    #[test]
    fn first_kept_covers_the_window_of_the_last_block_boundary() {
        // Window 8, blocks of 4: at 20 rows see 13.., a resume at 20 needs 13..20.
        assert_eq!(first_kept(20, 8, 4), 3);
        // At 23 rows see 16.., but a resume at 20 still needs block 3.
        assert_eq!(first_kept(23, 8, 4), 3);
        assert_eq!(first_kept(24, 8, 4), 4);
        assert_eq!(first_kept(5, 8, 4), 0);
    }

    #[test]
    fn window_blocks_are_given_back_and_counted_exactly() {
        let mut p = KvPools::windowed(32, 4, 8, 8);
        let toks: Vec<u32> = (0..50).collect();
        let mut s = SeqKv::default();
        compute(&mut p, &mut s, &toks, 0, 1);
        // 50 positions: 13 full blocks; the window pool keeps blocks 10..=12 (positions
        // 40..52), as the window of a resume at 48 (41..48) and of a row at 50 (43..) need.
        assert_eq!(s.full.held(), 13);
        assert_eq!(s.window.held(), 3);
        assert_eq!(s.window.len(), 13);
        assert!(s.window.table[..10].iter().all(|&b| b == RELEASED));
        let wp = p.window_pool().expect("window pool");
        // Used = neither free nor evictable: exactly what the sequence holds.
        assert_eq!(wp.total() - wp.available(), 3);
        assert_eq!(p.full().total() - p.full().available(), 13);
        p.release(&mut s);
        assert_eq!(p.window_pool().map(BlockManager::available), Some(8));
        assert_eq!(p.available(), 32);
    }

    #[test]
    fn a_prefix_longer_than_the_window_is_reused_when_its_window_is_held() {
        let mut p = KvPools::windowed(32, 4, 8, 16);
        let toks: Vec<u32> = (0..30).collect();
        let mut a = SeqKv::default();
        compute(&mut p, &mut a, &toks, 0, 5);
        p.release(&mut a);
        // The next turn extends the first: 28 positions (7 blocks) reusable, and the window
        // pool still holds blocks 5 and 6 (positions 21..28).
        let longer: Vec<u32> = (0..40).collect();
        let (b, cached) = p.match_prefix(&longer);
        assert_eq!(cached, 28);
        assert_eq!(b.full.held(), 7);
        assert_eq!(b.window.held(), 2);
        assert_eq!(b.window.table[..5], [RELEASED; 5]);
    }

    #[test]
    fn reuse_falls_back_when_the_window_was_reclaimed() {
        // A window pool of 4 blocks: enough for one sequence, not for a cache of old ones.
        let mut p = KvPools::windowed(32, 4, 8, 4);
        let toks: Vec<u32> = (0..30).collect();
        let mut a = SeqKv::default();
        compute(&mut p, &mut a, &toks, 0, 1);
        p.release(&mut a);
        // A prompt that departs at 17: the full pool has 4 blocks (16 positions), but the
        // window pool's blocks 2 and 3 (9..16) were given back long ago and reclaimed.
        let mut other: Vec<u32> = (0..17).collect();
        other.extend([99, 98, 97]);
        let (b, cached) = p.match_prefix(&other);
        // Window blocks 0..=3 were given back during the first sequence and reclaimed by its
        // later blocks (only 4 fit): nothing can be resumed.
        assert_eq!(cached, 0);
        assert_eq!((b.full.held(), b.window.held()), (0, 0));
        // The same prompt without a window pool reuses the 16 positions.
        let mut whole = KvPools::whole(32, 4);
        let mut c = SeqKv::default();
        compute(&mut whole, &mut c, &toks, 0, 1);
        whole.release(&mut c);
        assert_eq!(whole.match_prefix(&other).1, 16);
    }

    #[test]
    fn reuse_is_limited_to_the_longest_prefix_whose_window_is_held() {
        let mut p = KvPools::windowed(32, 4, 8, 32);
        let toks: Vec<u32> = (0..30).collect();
        let mut a = SeqKv::default();
        compute(&mut p, &mut a, &toks, 0, 1);
        // Block 6 of the window pool (positions 24..28) is reclaimed once given back.
        let lost = a.window.table[6];
        p.release(&mut a);
        if let Some(wp) = p.window.as_mut() {
            wp.blocks.forget(lost);
        }
        // 28 positions are in the full pool, but a resume at 28 needs 21..28: the longest
        // prefix whose window is held is 24 (it needs 17..24, blocks 4 and 5).
        let longer: Vec<u32> = (0..40).collect();
        let (mut b, cached) = p.match_prefix(&longer);
        assert_eq!(cached, 24);
        assert_eq!((b.full.held(), b.window.held()), (6, 2));
        p.release(&mut b);
    }

    #[test]
    fn without_a_window_pool_nothing_is_given_back() {
        let mut p = KvPools::whole(16, 4);
        let toks: Vec<u32> = (0..30).collect();
        let mut s = SeqKv::default();
        compute(&mut p, &mut s, &toks, 0, 1);
        assert_eq!(s.full.held(), 8);
        assert!(s.window.is_empty());
        assert!(p.window_pool().is_none());
    }
}
