//! Warm resume, explained: for each request, whether it reused its conversation's KV and, if
//! not, why, decided from facts the engine has (never guessed).
//!
//! The engine remembers, per session, the tokens of the session's last turn whose KV it
//! computed (prompt and reply) and the group that holds them ([`SessionMemory`], bounded, least
//! recently used dropped first). A new turn of the session is compared with them: the longest
//! common prefix is what could have been reused; what the prefix cache actually gave
//! (`cached_tokens`) says whether it was.

use std::collections::HashMap;

/// A request's resume facts travel with its timings; they are defined there (below the
/// scheduler) and named here too.
pub use crate::timing::{Resume, ResumeOutcome};

/// What the engine knew of the session when the request arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prior {
    /// The longest common prefix of the new prompt and the last turn's tokens.
    pub common: usize,
    /// Tokens of the last turn with KV (prompt and reply).
    pub last_len: usize,
    /// The group that served the last turn.
    pub group: usize,
}

impl Prior {
    /// Compares `prompt` with the session's last turn `last` (served by `group`).
    pub fn of(prompt: &[u32], last: &[u32], group: usize) -> Self {
        let common = prompt.iter().zip(last).take_while(|(a, b)| a == b).count();
        Self {
            common,
            last_len: last.len(),
            group,
        }
    }
}

/// Decides a request's outcome once the prefix cache has answered.
///
/// - `session`: whether the request has a session; `prior`: its last turn, if remembered.
/// - `group`: the group serving it; `cached`: tokens the prefix cache gave it;
///   `prompt_len`: its prompt's length; `block_size`: positions per KV block.
///
/// The prefix cache reuses whole blocks only and always leaves the prompt's last token to be
/// computed, so "everything that could be reused" is the common prefix rounded down to whole
/// blocks within `prompt_len - 1`. `cached` is what the prefix cache really gave, which with
/// sliding-window layers is never more than the local layers can resume from
/// ([`crate::kv_cache::pools`]).
pub fn decide(
    session: bool,
    prior: Option<&Prior>,
    group: usize,
    cached: usize,
    prompt_len: usize,
    block_size: usize,
) -> Resume {
    let base = Resume {
        outcome: ResumeOutcome::None,
        reusable_tokens: None,
        cached_tokens: cached,
        diverged_at: None,
        evicted_tokens: None,
    };
    if !session {
        let outcome = if cached > 0 {
            ResumeOutcome::Prefix
        } else {
            ResumeOutcome::None
        };
        return Resume { outcome, ..base };
    }
    let Some(p) = prior else {
        return Resume {
            outcome: ResumeOutcome::First,
            ..base
        };
    };
    let reusable = Resume {
        reusable_tokens: Some(p.common),
        ..base
    };
    if p.group != group {
        return Resume {
            outcome: ResumeOutcome::OtherGroup,
            ..reusable
        };
    }
    let bs = block_size.max(1);
    let reachable = p.common.min(prompt_len.saturating_sub(1)) / bs * bs;
    // The prompt departs from the last turn before the last turn's end (and before its own).
    let diverged_at = (p.common < p.last_len && p.common < prompt_len).then_some(p.common);
    if cached < reachable {
        return Resume {
            outcome: ResumeOutcome::Evicted,
            diverged_at,
            evicted_tokens: Some(reachable - cached),
            ..reusable
        };
    }
    match diverged_at {
        Some(n) => Resume {
            outcome: ResumeOutcome::Diverged,
            diverged_at: Some(n),
            ..reusable
        },
        None => Resume {
            outcome: ResumeOutcome::Full,
            ..reusable
        },
    }
}

/// The engine's memory of sessions: each session's last turn (tokens with KV and the group
/// that holds them), at most `capacity` sessions, the least recently used dropped first.
#[derive(Debug)]
pub struct SessionMemory {
    capacity: usize,
    turns: HashMap<String, (Vec<u32>, usize, u64)>,
    tick: u64,
    dropped: u64,
}

impl SessionMemory {
    /// Room for `capacity` sessions (0 remembers none: every turn is `first`).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            turns: HashMap::new(),
            tick: 0,
            dropped: 0,
        }
    }

    /// What is known of `session` for a new prompt.
    pub fn prior(&mut self, session: &str, prompt: &[u32]) -> Option<Prior> {
        self.tick += 1;
        let tick = self.tick;
        let (tokens, group, used) = self.turns.get_mut(session)?;
        *used = tick;
        Some(Prior::of(prompt, tokens, *group))
    }

    /// The group that holds `session`'s last turn, if remembered.
    pub fn group_of(&self, session: &str) -> Option<usize> {
        self.turns.get(session).map(|(_, g, _)| *g)
    }

    /// Remembers `session`'s latest turn.
    pub fn remember(&mut self, session: &str, tokens: &[u32], group: usize) {
        if self.capacity == 0 {
            return;
        }
        self.tick += 1;
        if !self.turns.contains_key(session) && self.turns.len() >= self.capacity {
            // Least recently used first. O(n) over at most `capacity` entries, once per new
            // session beyond the limit.
            if let Some(old) = self
                .turns
                .iter()
                .min_by_key(|(_, (_, _, used))| *used)
                .map(|(k, _)| k.clone())
            {
                self.turns.remove(&old);
                self.dropped += 1;
            }
        }
        self.turns
            .insert(session.to_string(), (tokens.to_vec(), group, self.tick));
    }

    /// The most sessions remembered.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sessions remembered now.
    pub fn len(&self) -> usize {
        self.turns.len()
    }

    /// Whether no session is remembered.
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    /// Sessions dropped to stay within the limit.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prior(common: usize, last_len: usize, group: usize) -> Prior {
        Prior {
            common,
            last_len,
            group,
        }
    }

    #[test]
    fn outcomes_follow_from_the_facts() {
        let d = |session, p: Option<&Prior>, g, cached, len| decide(session, p, g, cached, len, 16);
        assert_eq!(d(false, None, 0, 0, 50).outcome, ResumeOutcome::None);
        assert_eq!(d(false, None, 0, 32, 50).outcome, ResumeOutcome::Prefix);
        let first = d(true, None, 0, 16, 50);
        assert_eq!(
            (first.outcome, first.reusable_tokens),
            (ResumeOutcome::First, None)
        );
        // The whole last turn (70 tokens) is a prefix of a 90-token prompt: 64 reachable.
        let full = d(true, Some(&prior(70, 70, 0)), 0, 64, 90);
        assert_eq!(full.outcome, ResumeOutcome::Full);
        assert_eq!(full.reusable_tokens, Some(70));
        // Only 32 of the 64 reachable tokens were still cached.
        let ev = d(true, Some(&prior(70, 70, 0)), 0, 32, 90);
        assert_eq!(
            (ev.outcome, ev.evicted_tokens),
            (ResumeOutcome::Evicted, Some(32))
        );
        // The history changed at token 40; 32 tokens (two blocks) were reachable and reused.
        let dv = d(true, Some(&prior(40, 70, 0)), 0, 32, 90);
        assert_eq!(
            (dv.outcome, dv.diverged_at),
            (ResumeOutcome::Diverged, Some(40))
        );
        // Changed at 40 and one of the two reachable blocks gone: evicted, still saying where.
        let both = d(true, Some(&prior(40, 70, 0)), 0, 16, 90);
        assert_eq!(
            (both.outcome, both.diverged_at, both.evicted_tokens),
            (ResumeOutcome::Evicted, Some(40), Some(16))
        );
        let other = d(true, Some(&prior(70, 70, 1)), 0, 0, 90);
        assert_eq!(other.outcome, ResumeOutcome::OtherGroup);
        // A prompt that is a prefix of the last turn: nothing departs, the last token is
        // computed again; block granularity applies.
        let same = d(true, Some(&prior(40, 70, 0)), 0, 32, 40);
        assert_eq!(same.outcome, ResumeOutcome::Full);
    }

    #[test]
    fn memory_is_bounded_and_drops_the_least_recently_used() {
        let mut m = SessionMemory::new(2);
        m.remember("a", &[1, 2, 3], 0);
        m.remember("b", &[4, 5], 1);
        assert_eq!(m.prior("a", &[1, 2, 9]).map(|p| p.common), Some(2));
        m.remember("c", &[6], 0); // "b" was used least recently
        assert_eq!((m.len(), m.dropped()), (2, 1));
        assert!(m.prior("b", &[4]).is_none());
        assert_eq!(m.group_of("a"), Some(0));
        assert_eq!(
            m.prior("c", &[6, 7]).map(|p| (p.common, p.last_len)),
            Some((1, 1))
        );
        let mut none = SessionMemory::new(0);
        none.remember("a", &[1], 0);
        assert!(none.prior("a", &[1]).is_none());
    }
}
