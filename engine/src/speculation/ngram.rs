//! Where a run of tokens occurred before: an index of the n-grams of one token sequence.
//!
//! Prompt-lookup decoding proposes, as a draft, the tokens that followed an earlier occurrence of
//! the sequence's last few tokens. [`NgramIndex`] keeps, for each n-gram length from `min_n` to
//! `max_n`, every position where each n-gram ends, and grows as the sequence grows (only the new
//! tokens are indexed). A lookup tries the longest suffix first, and among its occurrences
//! prefers the first one at or after a hint (where the last draft's source left off: a copy of
//! a file goes on from where it was), else the latest one.

use std::collections::HashMap;

/// Every occurrence of the n-grams of a token sequence, by length.
#[derive(Debug, Clone)]
pub struct NgramIndex {
    min_n: usize,
    /// `tables[n - min_n]`: the n-gram's hash → the positions its occurrences end at (after
    /// their last token), in increasing order.
    tables: Vec<HashMap<u64, Vec<usize>>>,
    /// N-grams ending at or before this position are indexed.
    indexed: usize,
}

/// A hash of `tokens` (FNV-1a over the ids): collisions are checked on lookup.
fn hash(tokens: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        for b in t.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl NgramIndex {
    /// An empty index of n-grams of `min_n` to `max_n` tokens (at least 1).
    pub fn new(min_n: usize, max_n: usize) -> Self {
        let min_n = min_n.max(1);
        let max_n = max_n.max(min_n);
        Self {
            min_n,
            tables: vec![HashMap::new(); max_n - min_n + 1],
            indexed: 0,
        }
    }

    /// Indexes the n-grams of `tokens` that end at or before `upto` (exclusive end position),
    /// from where the last call left off. `tokens` must extend what earlier calls saw.
    pub fn extend(&mut self, tokens: &[u32], upto: usize) {
        let upto = upto.min(tokens.len());
        for end in self.indexed.max(self.min_n)..=upto {
            for (i, table) in self.tables.iter_mut().enumerate() {
                let n = self.min_n + i;
                if n > end {
                    break;
                }
                table
                    .entry(hash(&tokens[end - n..end]))
                    .or_default()
                    .push(end);
            }
        }
        self.indexed = self.indexed.max(upto + 1);
    }

    /// Where the longest indexed n-gram equal to the end of `suffix` ended (the position of
    /// the token that followed it in `source`, the sequence this index was built over), and
    /// how long the match is. Among the occurrences of that n-gram: the first ending at or
    /// after `hint`, else the latest. `None` when no suffix of `min_n` tokens or more occurs.
    pub fn lookup(&self, source: &[u32], suffix: &[u32], hint: usize) -> Option<(usize, usize)> {
        for (i, table) in self.tables.iter().enumerate().rev() {
            let n = self.min_n + i;
            if n > suffix.len() {
                continue;
            }
            let want = &suffix[suffix.len() - n..];
            let Some(ends) = table.get(&hash(want)) else {
                continue;
            };
            let matches = |&&end: &&usize| source.get(end - n..end) == Some(want);
            let after = ends.partition_point(|&e| e < hint);
            let found = ends[after..]
                .iter()
                .find(matches)
                .or_else(|| ends.iter().rev().find(matches));
            if let Some(&end) = found {
                return Some((end, n));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_suffix_wins_and_the_hint_picks_the_occurrence() {
        //            0  1  2  3  4  5  6  7  8  9 10 11
        let source = [1, 2, 3, 9, 1, 2, 4, 7, 5, 2, 3, 8];
        let mut idx = NgramIndex::new(1, 3);
        idx.extend(&source, source.len());
        // `1 2 3` occurs once (ending at 3); a 3-gram beats the shorter ones.
        assert_eq!(idx.lookup(&source, &[7, 1, 2, 3], 0), Some((3, 3)));
        // `2 3`: ends at 3 and at 11; no hint beyond 3 takes the first after it.
        assert_eq!(idx.lookup(&source, &[6, 2, 3], 0), Some((3, 2)));
        assert_eq!(idx.lookup(&source, &[6, 2, 3], 4), Some((11, 2)));
        // A hint past every occurrence takes the latest.
        assert_eq!(idx.lookup(&source, &[6, 2, 3], 12), Some((11, 2)));
        // Nothing of `min_n` tokens: no match.
        assert_eq!(idx.lookup(&source, &[42], 0), None);
        let mut strict = NgramIndex::new(2, 3);
        strict.extend(&source, source.len());
        assert_eq!(
            strict.lookup(&source, &[6, 7], 0),
            None,
            "one token is too short"
        );
    }

    #[test]
    fn the_index_grows_with_its_sequence_and_never_sees_past_upto() {
        let mut seq = vec![5, 6, 7, 5, 6];
        let mut idx = NgramIndex::new(2, 2);
        // Index what ends before the last token: the suffix `5 6` must find the earlier one.
        idx.extend(&seq, seq.len() - 1);
        assert_eq!(idx.lookup(&seq, &seq, 0), Some((2, 2)));
        seq.extend([7, 5, 6]);
        idx.extend(&seq, seq.len() - 1);
        // Latest occurrence now ends at 5 (`5 6` at positions 3-4), the hint can go back.
        assert_eq!(idx.lookup(&seq, &seq, 3), Some((5, 2)));
        assert_eq!(idx.lookup(&seq, &seq, 0), Some((2, 2)));
    }
}
