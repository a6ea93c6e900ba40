//! One sequence's drafts: from the client's prediction, then from its own prompt and reply.
//!
//! A draft follows a source (the prediction, or the sequence itself) from a position: the
//! tokens there are proposed, and while they are taken the next draft goes on from where the
//! last one stopped. When a draft is cut (the model wrote something else), the next one looks
//! up the sequence's last tokens in the prediction first, then in the sequence, and follows
//! the occurrence found (the first after where the source was left, else the latest).
//! A prediction is followed from its start before anything is generated.

use super::length::DraftLength;
use super::ngram::NgramIndex;
use super::{DraftSource, SpeculationConfig};

/// The longest n-gram looked up (tokens).
pub const MAX_NGRAM: usize = 4;

/// A proposed draft: the tokens, and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    /// Which source the tokens came from.
    pub source: DraftSource,
    /// The tokens, to verify in order after the sequence's last token.
    pub tokens: Vec<u32>,
}

/// What the drafter follows: a source and the position of the next token to propose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Follow {
    source: DraftSource,
    at: usize,
}

/// The draft state of one sequence.
#[derive(Debug, Clone)]
pub struct Drafter {
    /// The prediction's tokens, and the index of their n-grams.
    prediction: Option<(Vec<u32>, NgramIndex)>,
    /// The index of the sequence's own n-grams (prompt and reply), when drafting from them.
    context: Option<NgramIndex>,
    follow: Option<Follow>,
    /// Where each source was last left (the hint for the next lookup in it).
    left: [usize; 2],
    length: DraftLength,
}

fn slot(source: DraftSource) -> usize {
    match source {
        DraftSource::Prediction => 0,
        DraftSource::Ngram => 1,
    }
}

impl Drafter {
    /// The drafter of a sequence under `cfg`, with the client's `prediction` tokens when given.
    /// `None` when nothing would ever be drafted (no prediction, n-gram drafts off, or a
    /// draft length of 0).
    pub fn new(cfg: &SpeculationConfig, prediction: Option<&[u32]>) -> Option<Self> {
        let prediction = prediction.filter(|p| !p.is_empty()).map(|p| {
            let mut idx = NgramIndex::new(1, MAX_NGRAM);
            idx.extend(p, p.len());
            (p.to_vec(), idx)
        });
        let context = cfg
            .ngram
            .then(|| NgramIndex::new(cfg.min_ngram, MAX_NGRAM.max(cfg.min_ngram)));
        if cfg.max_tokens == 0 || (prediction.is_none() && context.is_none()) {
            return None;
        }
        let follow = prediction.as_ref().map(|_| Follow {
            source: DraftSource::Prediction,
            at: 0,
        });
        Some(Self {
            prediction,
            context,
            follow,
            left: [0; 2],
            length: DraftLength::new(cfg.max_tokens),
        })
    }

    fn source_tokens<'a>(&'a self, source: DraftSource, seq: &'a [u32]) -> &'a [u32] {
        match source {
            DraftSource::Prediction => self.prediction.as_ref().map_or(&[], |(p, _)| p),
            DraftSource::Ngram => seq,
        }
    }

    /// The next draft for a sequence whose tokens (prompt and reply so far) are `seq`, at most
    /// `room` tokens long; `None` when there is none to propose (nothing found, paused, or no
    /// room). Each call stands for one decode step.
    pub fn propose(&mut self, seq: &[u32], room: usize) -> Option<Draft> {
        let want = self.length.next().min(room);
        if want == 0 {
            self.length.skipped();
            return None;
        }
        if self.follow.is_none() {
            self.follow = self.find(seq);
        }
        let Some(f) = self.follow else {
            self.length.skipped();
            return None;
        };
        let tokens: Vec<u32> = self
            .source_tokens(f.source, seq)
            .get(f.at..)
            .unwrap_or(&[])
            .iter()
            .take(want)
            .copied()
            .collect();
        if tokens.is_empty() {
            self.follow = None;
            self.length.skipped();
            return None;
        }
        Some(Draft {
            source: f.source,
            tokens,
        })
    }

    /// Looks up the end of `seq` in the prediction, then in `seq` itself.
    fn find(&mut self, seq: &[u32]) -> Option<Follow> {
        if let Some((p, idx)) = &self.prediction
            && let Some((at, _)) = idx.lookup(p, seq, self.left[0])
            && at < p.len()
        {
            return Some(Follow {
                source: DraftSource::Prediction,
                at,
            });
        }
        let idx = self.context.as_mut()?;
        // Everything ending before the last token: the suffix must not find itself.
        idx.extend(seq, seq.len().saturating_sub(1));
        let (at, _) = idx.lookup(seq, seq, self.left[1])?;
        Some(Follow {
            source: DraftSource::Ngram,
            at,
        })
    }

    /// The draft `draft` was verified: `accepted` of its tokens were taken, then `next` was
    /// generated (the token after them, when the sequence goes on). Moves the follow on when
    /// the source still agrees, and adapts the next draft's length.
    pub fn record(&mut self, draft: &Draft, accepted: usize, next: Option<u32>, seq: &[u32]) {
        self.length.record(draft.tokens.len(), accepted);
        let Some(f) = self.follow else {
            return;
        };
        let at = f.at + accepted;
        self.left[slot(f.source)] = at;
        let src = self.source_tokens(f.source, seq);
        let goes_on =
            accepted == draft.tokens.len() && next.is_some() && src.get(at).copied() == next;
        self.follow = goes_on.then_some(Follow {
            source: f.source,
            at: at + 1,
        });
    }

    /// A token was generated without a draft (a plain decode step, or the prefill's token):
    /// a prediction followed from its start must agree with it, or be looked up again.
    pub fn observe(&mut self, token: u32, seq: &[u32]) {
        let Some(f) = self.follow else {
            return;
        };
        let src = self.source_tokens(f.source, seq);
        self.follow = (src.get(f.at).copied() == Some(token)).then_some(Follow {
            source: f.source,
            at: f.at + 1,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ngram: bool, max: usize) -> SpeculationConfig {
        SpeculationConfig {
            ngram,
            max_tokens: max,
            min_ngram: 2,
        }
    }

    #[test]
    fn a_prediction_is_followed_from_its_start_and_realigned_after_an_edit() {
        let prediction = [10, 11, 12, 13, 14, 15, 16, 17];
        let mut d = Drafter::new(&cfg(false, 4), Some(&prediction)).expect("drafter");
        // The prompt, then the prefill's first token agrees with the prediction's.
        let mut seq = vec![1, 2, 3, 10];
        d.observe(10, &seq);
        let draft = d.propose(&seq, 16).expect("draft");
        assert_eq!(draft.source, DraftSource::Prediction);
        assert_eq!(draft.tokens, vec![11, 12]);
        // Both taken, then 13 generated: it goes on from 14.
        seq.extend([11, 12, 13]);
        d.record(&draft, 2, Some(13), &seq);
        let draft = d.propose(&seq, 16).expect("draft");
        assert_eq!(draft.tokens, vec![14, 15, 16, 17]);
        // The model writes 99 instead of 14 (an edit), then 15: the prediction is found again
        // from the last token.
        seq.push(99);
        d.record(&draft, 0, Some(99), &seq);
        seq.push(15);
        d.observe(15, &seq);
        let draft = d.propose(&seq, 16).expect("draft");
        assert_eq!(draft.tokens, vec![16], "one token after a miss");
        assert_eq!(draft.source, DraftSource::Prediction);
    }

    #[test]
    fn ngram_drafts_copy_what_followed_the_last_tokens_and_respect_room() {
        let mut d = Drafter::new(&cfg(true, 8), None).expect("drafter");
        //             a  b  c  d  e  f     a  b
        let seq = vec![1, 2, 3, 4, 5, 6, 9, 1, 2];
        let draft = d.propose(&seq, 16).expect("draft");
        assert_eq!(draft.source, DraftSource::Ngram);
        assert_eq!(draft.tokens, vec![3, 4, 5, 6]);
        let mut d = Drafter::new(&cfg(true, 8), None).expect("drafter");
        assert_eq!(d.propose(&seq, 2).expect("draft").tokens, vec![3, 4]);
        // Nothing repeats: no draft.
        let mut d = Drafter::new(&cfg(true, 8), None).expect("drafter");
        assert_eq!(d.propose(&[1, 2, 3, 4], 16), None);
        // The suffix never matches itself; what followed its earlier occurrence may run into it.
        let mut d = Drafter::new(&cfg(true, 8), None).expect("drafter");
        let seq = vec![7, 7, 7];
        assert_eq!(d.propose(&seq, 16).expect("draft").tokens, vec![7]);
    }

    #[test]
    fn nothing_to_draft_from_makes_no_drafter() {
        assert!(Drafter::new(&cfg(false, 8), None).is_none());
        assert!(Drafter::new(&cfg(false, 8), Some(&[])).is_none());
        assert!(Drafter::new(&cfg(true, 0), Some(&[1])).is_none());
    }
}
