//! How many tokens to draft next: grows while drafts are taken whole, shrinks to what was
//! taken when one is cut, and backs off where drafts keep failing.
//!
//! A verification step costs more than a plain decode step (its rows share one pass over the
//! weights, but each adds compute), so a draft that fails is time lost. After two drafts in a
//! row of which nothing was taken, drafting pauses for 2, then 4, 8, 16 steps (at most
//! [`MAX_PAUSE`]); any accepted token ends the backoff.

/// The longest pause, in decode steps, after drafts that keep failing.
pub const MAX_PAUSE: u32 = 16;

/// A sequence's adaptive draft length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftLength {
    /// The most tokens a draft may have.
    max: usize,
    /// The length of the next draft.
    next: usize,
    /// Drafts in a row of which no token was taken.
    misses: u32,
    /// Decode steps left before the next draft.
    pause: u32,
}

impl DraftLength {
    /// A length that starts at half of `max` (at least 1) and never exceeds it.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            next: max.div_ceil(2).max(1).min(max),
            misses: 0,
            pause: 0,
        }
    }

    /// The length of the next draft (0 while paused, or when `max` is 0).
    pub fn next(&self) -> usize {
        if self.pause > 0 { 0 } else { self.next }
    }

    /// A decode step ran without a draft: one step less of a pause.
    pub fn skipped(&mut self) {
        self.pause = self.pause.saturating_sub(1);
    }

    /// A draft of `drafted` tokens was verified and `accepted` of them were taken.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        if accepted == 0 {
            self.misses += 1;
            self.next = 1.min(self.max);
            if self.misses >= 2 {
                self.pause = (1u32 << (self.misses - 1).min(4)).min(MAX_PAUSE);
            }
            return;
        }
        self.misses = 0;
        self.next = if accepted >= drafted {
            (drafted * 2).min(self.max)
        } else {
            (accepted + 1).min(self.max)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_drafts_grow_cut_ones_shrink_and_misses_back_off() {
        let mut l = DraftLength::new(10);
        assert_eq!(l.next(), 5);
        l.record(5, 5);
        assert_eq!(l.next(), 10, "taken whole: twice as long");
        l.record(10, 10);
        assert_eq!(l.next(), 10, "never beyond the maximum");
        l.record(10, 3);
        assert_eq!(l.next(), 4, "cut after 3: one more than was taken");
        l.record(4, 0);
        assert_eq!(l.next(), 1, "a first miss drafts one token");
        l.record(1, 0);
        assert_eq!(l.next(), 0, "a second miss pauses");
        for _ in 0..2 {
            assert_eq!(l.next(), 0);
            l.skipped();
        }
        assert_eq!(l.next(), 1, "two steps of pause after two misses");
        l.record(1, 0);
        let mut paused = 0;
        while l.next() == 0 {
            paused += 1;
            l.skipped();
        }
        assert_eq!(paused, 4, "the pause doubles");
        for _ in 0..10 {
            l.record(1, 0);
        }
        let mut paused = 0;
        while l.next() == 0 {
            paused += 1;
            l.skipped();
        }
        assert_eq!(paused, MAX_PAUSE, "and stops doubling");
        l.record(1, 1);
        assert_eq!(l.next(), 2, "a taken token ends the backoff");
        l.record(2, 0);
        assert_eq!(l.next(), 1, "misses count from zero again");
    }

    #[test]
    fn a_zero_maximum_never_drafts() {
        let mut l = DraftLength::new(0);
        assert_eq!(l.next(), 0);
        l.record(0, 0);
        assert_eq!(l.next(), 0);
    }
}
