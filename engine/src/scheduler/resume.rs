//! Warm resume, explained: for each request, whether it reused its conversation's KV and, if
//! not, why, decided from facts the engine has (never guessed).
//!
//! The engine remembers, per session, the tokens of the session's last turn whose KV it
//! computed (prompt and reply) and the group that holds them
//! ([`super::sessions::SessionMemory`]). A new turn of the session is compared with them: the
//! longest common prefix is what could have been reused; what the prefix cache actually gave
//! (`cached_tokens`) says whether it was, and whether the session's KV was still being kept
//! when the turn came ([`super::keep`]) says which of `evicted` and `expired` a loss is.

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

/// What the prefix cache answered for a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// Positions reused (both pools could resume from them).
    pub cached: usize,
    /// Positions the full-attention pool alone held (equal to `cached` without a window pool).
    pub full: usize,
}

/// Decides a request's outcome once the prefix cache has answered.
///
/// - `session`: whether the request has a session; `prior`: its last turn, if remembered.
/// - `group`: the group serving it; `found`: what the prefix cache gave it;
///   `prompt_len`: its prompt's length; `block_size`: positions per KV block.
/// - `expired`: the session's KV had stopped being kept (its TTL passed) with every block
///   still there: a loss since is `expired`, not `evicted`.
///
/// The prefix cache reuses whole blocks only and always leaves the prompt's last token to be
/// computed, so "everything that could be reused" is the common prefix rounded down to whole
/// blocks within `prompt_len - 1`. `cached` is what the prefix cache really gave, which with
/// sliding-window layers is never more than the local layers can resume from
/// ([`crate::kv_cache::pools`]): when the full-attention pool held the whole reachable prefix
/// and only the window pool fell short, the loss is `window`.
pub fn decide(
    session: bool,
    prior: Option<&Prior>,
    group: usize,
    found: Found,
    prompt_len: usize,
    block_size: usize,
    expired: bool,
) -> Resume {
    let cached = found.cached;
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
            outcome: if found.full >= reachable {
                ResumeOutcome::Window
            } else if expired {
                ResumeOutcome::Expired
            } else {
                ResumeOutcome::Evicted
            },
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What the prefix cache found without a window pool.
    fn same(cached: usize) -> Found {
        Found {
            cached,
            full: cached,
        }
    }

    fn prior(common: usize, last_len: usize, group: usize) -> Prior {
        Prior {
            common,
            last_len,
            group,
        }
    }

    #[test]
    fn outcomes_follow_from_the_facts() {
        let d = |session, p: Option<&Prior>, g, cached, len| {
            decide(session, p, g, same(cached), len, 16, false)
        };
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
    fn a_loss_after_the_keeping_expired_is_expired() {
        let p = prior(70, 70, 0);
        let lost = decide(true, Some(&p), 0, same(32), 90, 16, true);
        assert_eq!(
            (lost.outcome, lost.evicted_tokens),
            (ResumeOutcome::Expired, Some(32))
        );
        // Nothing lost: expiry alone changes nothing.
        let kept = decide(true, Some(&p), 0, same(64), 90, 16, true);
        assert_eq!(kept.outcome, ResumeOutcome::Full);
    }

    #[test]
    fn a_loss_of_the_window_layers_alone_is_window() {
        let p = prior(70, 70, 0);
        // The full pool held the 64 reachable positions; the window pool allowed 16.
        let w = decide(
            true,
            Some(&p),
            0,
            Found {
                cached: 16,
                full: 64,
            },
            90,
            16,
            true,
        );
        assert_eq!(
            (w.outcome, w.evicted_tokens, w.cached_tokens),
            (ResumeOutcome::Window, Some(48), 16)
        );
        // The full pool lost blocks too: evicted (or expired), as without a window pool.
        let e = decide(
            true,
            Some(&p),
            0,
            Found {
                cached: 16,
                full: 32,
            },
            90,
            16,
            false,
        );
        assert_eq!(e.outcome, ResumeOutcome::Evicted);
    }
}
