//! KV kept for live sessions: after a turn, its session's blocks stay ahead of other cached
//! prefixes for a time to live, within a bounded share of the group's blocks.
//!
//! Each group keeps its own sessions' blocks (the turn's blocks live in the group that served
//! it). A turn's keeping lasts `--session-kv-ttl` from the turn's end, or the TTL the request
//! asked for (Responses `prompt_cache_options.ttl`, Messages `cache_control.ttl`) up to
//! `--session-kv-ttl-max`; the session's next turn replaces it. At most
//! `--session-kv-share` of the group's blocks are kept: a new keeping that would go beyond
//! lets go of the longest-idle sessions first, and a turn larger than the whole share keeps
//! its leading blocks only. Kept blocks are still evictable, last ([`crate::kv_cache::keep`]):
//! keeping never refuses a request room.
//!
//! When a keeping's TTL passes it ends, and the memory says whether every block was still
//! there then: a later turn that finds blocks gone is `expired` in that case (the loss
//! happened after the keeping), `evicted` otherwise.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::kv_cache::{BlockManager, KeptBlock};
use crate::metrics::group::SessionKv;

/// How sessions' KV is kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeepConfig {
    /// How long after a turn its session's KV is kept (zero: not kept).
    pub ttl: Duration,
    /// The longest TTL a request may ask for.
    pub max_ttl: Duration,
    /// The share of a group's blocks kept for sessions at most, from 0 to 1.
    pub share: f64,
}

impl Default for KeepConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(300),
            max_ttl: Duration::from_secs(3600),
            share: 0.5,
        }
    }
}

impl KeepConfig {
    /// The TTL of a turn that asked for `asked` (`None`: the default), within the bound.
    pub fn ttl_for(&self, asked: Option<Duration>) -> Duration {
        asked.map_or(self.ttl, |t| t.min(self.max_ttl))
    }
}

/// Where a session's keeping stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Kept until `until`.
    Kept,
    /// The TTL passed; `intact`: every block was still there then.
    Expired {
        /// Every block was still there when the TTL passed.
        intact: bool,
    },
    /// Let go before its TTL to keep the share.
    LetGo,
}

#[derive(Debug)]
struct Keeping {
    blocks: Vec<KeptBlock>,
    /// The turn's end: the longest idle is let go first.
    since: Instant,
    until: Instant,
    state: State,
}

/// One group's keepings.
#[derive(Debug)]
pub struct SessionKeeping {
    cfg: KeepConfig,
    /// The most blocks kept at once.
    cap: usize,
    /// The most sessions remembered, kept or not (`--max-sessions`).
    capacity: usize,
    sessions: HashMap<String, Keeping>,
    expiries: u64,
    evicted_share: u64,
}

impl SessionKeeping {
    /// Keepings of a group of `blocks` KV blocks, remembering at most `capacity` sessions.
    pub fn new(cfg: KeepConfig, blocks: usize, capacity: usize) -> Self {
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )] // a share of a block count: small, and clamped to [0, blocks]
        let cap = ((blocks as f64) * cfg.share.clamp(0.0, 1.0)).floor() as usize;
        Self {
            cfg,
            cap: cap.min(blocks),
            capacity,
            sessions: HashMap::new(),
            expiries: 0,
            evicted_share: 0,
        }
    }

    /// The TTL a turn that asked for `asked` gets: zero when nothing is kept at all.
    pub fn ttl_for(&self, asked: Option<Duration>) -> Duration {
        if self.cap == 0 || self.capacity == 0 {
            Duration::ZERO
        } else {
            self.cfg.ttl_for(asked)
        }
    }

    /// Keeps `session`'s blocks (`table`, the finished turn's blocks in position order) for
    /// `ttl` from `now`, replacing its previous keeping.
    pub fn keep(
        &mut self,
        session: &str,
        table: &[u32],
        ttl: Duration,
        now: Instant,
        mgr: &mut BlockManager,
    ) {
        if let Some(old) = self.sessions.remove(session)
            && old.state == State::Kept
        {
            mgr.unkeep(&old.blocks);
        }
        if ttl.is_zero() || self.cap == 0 {
            return;
        }
        let mut blocks = mgr.keep(&table[..table.len().min(self.cap)]);
        if blocks.is_empty() {
            return;
        }
        while mgr.kept_blocks() > self.cap {
            let Some(idlest) = self
                .sessions
                .iter()
                .filter(|(_, k)| k.state == State::Kept)
                .min_by_key(|(_, k)| k.since)
                .map(|(s, _)| s.clone())
            else {
                // Alone over the share (its blocks shared with no one else): keep fewer.
                if let Some(last) = blocks.pop() {
                    mgr.unkeep(std::slice::from_ref(&last));
                    continue;
                }
                break;
            };
            if let Some(k) = self.sessions.get_mut(&idlest) {
                let before = mgr.kept_blocks();
                mgr.unkeep(&k.blocks);
                self.evicted_share += (before - mgr.kept_blocks()) as u64;
                k.state = State::LetGo;
            }
        }
        self.sessions.insert(
            session.to_string(),
            Keeping {
                blocks,
                since: now,
                until: now + ttl,
                state: State::Kept,
            },
        );
        self.bound();
    }

    /// Ends the keepings whose TTL has passed by `now`.
    pub fn expire(&mut self, now: Instant, mgr: &mut BlockManager) {
        for k in self.sessions.values_mut() {
            if k.state == State::Kept && k.until <= now {
                let intact = mgr.intact(&k.blocks);
                mgr.unkeep(&k.blocks);
                k.state = State::Expired { intact };
                self.expiries += 1;
            }
        }
    }

    /// When the next keeping's TTL passes, if any is kept.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.sessions
            .values()
            .filter(|k| k.state == State::Kept)
            .map(|k| k.until)
            .min()
    }

    /// How much longer from `now` `session`'s KV is kept (zero when it is not).
    pub fn kept_for(&self, session: &str, now: Instant) -> Duration {
        self.sessions
            .get(session)
            .filter(|k| k.state == State::Kept)
            .map_or(Duration::ZERO, |k| k.until.saturating_duration_since(now))
    }

    /// Whether `session`'s keeping ended at its TTL with every block still there: a loss of
    /// its blocks since happened after the keeping (`expired`).
    pub fn expired_intact(&self, session: &str) -> bool {
        self.sessions
            .get(session)
            .is_some_and(|k| k.state == State::Expired { intact: true })
    }

    /// What became of keepings so far; `mgr` counts the kept blocks and those reclaimed.
    pub fn stats(&self, mgr: &BlockManager) -> SessionKv {
        SessionKv {
            blocks: mgr.kept_blocks(),
            expiries: self.expiries,
            evicted_pressure: mgr.kept_evictions(),
            evicted_share: self.evicted_share,
        }
    }

    /// Forgets the oldest keepings that ended, beyond `capacity` sessions.
    fn bound(&mut self) {
        while self.sessions.len() > self.capacity {
            let Some(oldest) = self
                .sessions
                .iter()
                .filter(|(_, k)| k.state != State::Kept)
                .min_by_key(|(_, k)| k.since)
                .map(|(s, _)| s.clone())
            else {
                return;
            };
            self.sessions.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ttl_s: u64, share: f64) -> KeepConfig {
        KeepConfig {
            ttl: Duration::from_secs(ttl_s),
            max_ttl: Duration::from_secs(60),
            share,
        }
    }

    /// Caches `tokens` (2 positions per block) and returns the sequence's table.
    fn turn(m: &mut BlockManager, tokens: &[u32]) -> Vec<u32> {
        let (mut s, _) = m.match_prefix(tokens);
        m.reserve(&mut s, tokens.len()).expect("reserve");
        m.register_full(&mut s, tokens, tokens.len());
        let t = s.table.clone();
        m.release(&mut s);
        t
    }

    #[test]
    fn a_turn_asks_for_its_ttl_within_the_bound() {
        let k = SessionKeeping::new(cfg(10, 0.5), 8, 4);
        assert_eq!(k.ttl_for(None), Duration::from_secs(10));
        assert_eq!(
            k.ttl_for(Some(Duration::from_secs(30))),
            Duration::from_secs(30)
        );
        assert_eq!(
            k.ttl_for(Some(Duration::from_secs(3600))),
            Duration::from_secs(60)
        );
        let off = SessionKeeping::new(cfg(10, 0.0), 8, 4);
        assert_eq!(off.ttl_for(None), Duration::ZERO);
    }

    #[test]
    fn keepings_expire_and_say_whether_they_were_intact() {
        let mut m = BlockManager::new(8, 2);
        let mut k = SessionKeeping::new(cfg(10, 0.5), 8, 4);
        let t0 = Instant::now();
        let a = turn(&mut m, &[1, 2, 3, 4]);
        k.keep("a", &a, Duration::from_secs(10), t0, &mut m);
        assert_eq!(k.stats(&m).blocks, 2);
        assert_eq!(k.next_expiry(), Some(t0 + Duration::from_secs(10)));
        k.expire(t0 + Duration::from_secs(9), &mut m);
        assert_eq!(k.stats(&m).expiries, 0);
        k.expire(t0 + Duration::from_secs(10), &mut m);
        let s = k.stats(&m);
        assert_eq!((s.blocks, s.expiries), (0, 1));
        assert!(k.expired_intact("a"));
        assert_eq!(k.next_expiry(), None);
        // Evicted while kept (nothing else left), then expired: not intact.
        let b = turn(&mut m, &[5, 6, 7, 8]);
        k.keep("b", &b, Duration::from_secs(10), t0, &mut m);
        let (mut big, _) = m.match_prefix(&[9; 16]);
        m.reserve(&mut big, 16).expect("room, the kept blocks last");
        assert_eq!(k.stats(&m).evicted_pressure, 2);
        k.expire(t0 + Duration::from_secs(10), &mut m);
        assert!(!k.expired_intact("b"));
        m.release(&mut big);
    }

    #[test]
    fn the_share_lets_go_of_the_idlest_session_first() {
        // 8 blocks, share 0.5: 4 kept at most.
        let mut m = BlockManager::new(8, 2);
        let mut k = SessionKeeping::new(cfg(10, 0.5), 8, 4);
        let t0 = Instant::now();
        let a = turn(&mut m, &[1, 2, 3, 4]);
        k.keep("a", &a, Duration::from_secs(10), t0, &mut m);
        let b = turn(&mut m, &[5, 6, 7, 8]);
        k.keep(
            "b",
            &b,
            Duration::from_secs(10),
            t0 + Duration::from_secs(1),
            &mut m,
        );
        assert_eq!(k.stats(&m).blocks, 4);
        let c = turn(&mut m, &[9, 10, 11, 12]);
        k.keep(
            "c",
            &c,
            Duration::from_secs(10),
            t0 + Duration::from_secs(2),
            &mut m,
        );
        let s = k.stats(&m);
        assert_eq!((s.blocks, s.evicted_share), (4, 2));
        // "a" was let go (not expired): a loss of its blocks is `evicted`.
        k.expire(t0 + Duration::from_secs(20), &mut m);
        assert!(!k.expired_intact("a"));
        assert!(k.expired_intact("b"));
        // A turn larger than the share keeps its leading blocks only.
        let d = turn(&mut m, &[1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]);
        k.keep(
            "d",
            &d,
            Duration::from_secs(10),
            t0 + Duration::from_secs(30),
            &mut m,
        );
        assert_eq!(k.stats(&m).blocks, 4);
    }

    #[test]
    fn the_next_turn_replaces_the_keeping() {
        let mut m = BlockManager::new(8, 2);
        let mut k = SessionKeeping::new(cfg(10, 1.0), 8, 4);
        let t0 = Instant::now();
        let a = turn(&mut m, &[1, 2, 3, 4]);
        k.keep("a", &a, Duration::from_secs(10), t0, &mut m);
        let a2 = turn(&mut m, &[1, 2, 3, 4, 5, 6]);
        k.keep("a", &a2, Duration::from_secs(10), t0, &mut m);
        assert_eq!(k.stats(&m).blocks, 3);
        // A zero TTL lets go.
        k.keep("a", &a2, Duration::ZERO, t0, &mut m);
        assert_eq!(k.stats(&m).blocks, 0);
    }

    #[test]
    fn ended_keepings_are_bounded() {
        let mut m = BlockManager::new(16, 2);
        let mut k = SessionKeeping::new(cfg(1, 1.0), 16, 2);
        let t0 = Instant::now();
        for (i, s) in ["a", "b", "c"].into_iter().enumerate() {
            let base = u32::try_from(i).expect("small") * 10;
            let t = turn(&mut m, &[base, base + 1]);
            k.keep(s, &t, Duration::from_secs(1), t0, &mut m);
            k.expire(t0 + Duration::from_secs(5), &mut m);
        }
        assert!(k.sessions.len() <= 2);
        assert!(k.expired_intact("c"));
    }
}
