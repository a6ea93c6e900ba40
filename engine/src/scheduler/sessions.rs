//! The engine's memory of sessions: for each, its last turn (the tokens whose KV the engine
//! computed, prompt and reply, and the group that holds them) and how many turns it has had.
//!
//! A session is named by its key ([`crate::server::request::session`]) or found: a request sent without
//! a key whose prompt extends the whole of an earlier keyless turn (its prompt and the reply
//! tokens whose KV exists) joins that turn's session under an engine-made id, so a client that
//! resends its history gets a session without changing anything. Each keyless turn is
//! remembered as a **candidate** for that (a session of one turn no one has named yet); the
//! turn that extends it makes it a found session, of which the candidate's turn is turn 0.
//! Two conversations that share only a system prompt stay apart: neither prompt extends the
//! other's whole turn.
//!
//! **Branches.** A keyed session's turns usually extend its conversation: the new prompt
//! begins with the whole prompt of the session's last turn. A turn under the same key whose
//! prompt does not (a **side call**: Claude Code's titles, topics and quota checks carry the
//! main conversation's key) starts a branch of its own and leaves the main conversation's
//! last turn alone, so the next real turn is still compared with it (and its KV stays kept,
//! [`super::keep`]). A session remembers its main conversation and its latest
//! [`MAX_SIDE_BRANCHES`] side branches; a turn that extends a side branch continues it, and
//! makes it the main conversation when the main one had no turn since that branch began (a
//! client that started its conversation over, as a compaction does). Branches are numbered in
//! the order they began, the first conversation 0.
//!
//! Bounded: at most `--max-sessions` sessions and candidates together, and at most
//! `--session-memory-mib` of their remembered tokens, the least recently used candidate
//! dropped first, then the least recently used session.
//!
//! Finding a session costs one pass over the new prompt: every remembered turn that can be
//! found is indexed by a hash of its whole tokens, and the prompt's running hash is probed at
//! each length some indexed turn has (the tokens of a hit are compared whole, so a hash
//! collision never joins two conversations).

use std::collections::{BTreeMap, HashMap};

use super::resume::Prior;

/// A request's place in its session, decided when the request is submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionTurn {
    /// The session id: the request's key, or the engine-made id of a found session.
    pub id: String,
    /// The turn's index in its session, from 0 (the engine's count of the session's turns).
    pub index: u64,
    /// Whether the session was found from the prompt (the request had no key).
    pub found: bool,
    /// For a found session's turn 1: the request id of turn 0, the keyless turn whose whole
    /// tokens the prompt extends.
    pub extends: Option<String>,
    /// The branch the turn extends or starts (0: the session's first conversation; see the
    /// module's documentation).
    pub branch: u32,
    /// Whether the turn is a side call: its branch is not the session's main conversation.
    pub side_call: bool,
}

/// The most side branches a session remembers beside its main conversation (the latest).
pub const MAX_SIDE_BRANCHES: usize = 4;

/// A finished turn, as the memory keeps it.
#[derive(Debug, Clone, Copy)]
pub struct FinishedTurn<'a> {
    /// Tokens with KV (prompt and reply).
    pub tokens: &'a [u32],
    /// Of those, the prompt's.
    pub prompt_len: usize,
    /// The group that served it.
    pub group: usize,
    /// Its request id.
    pub request_id: &'a str,
    /// Its branch ([`SessionTurn::branch`]; 0 for a keyless turn).
    pub branch: u32,
}

/// What a session is to the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Named by the client's key.
    Keyed,
    /// One keyless turn, remembered in case a later prompt extends it.
    Candidate,
    /// Found: a keyless turn was extended; its turns are found by their tokens.
    Found,
}

/// A remembered turn: the last of its branch.
#[derive(Debug)]
struct LastTurn {
    /// Tokens with KV (prompt and reply).
    tokens: Vec<u32>,
    /// Of those, the prompt's: a turn extends this one when its prompt begins with them.
    prompt_len: usize,
    /// Its branch.
    branch: u32,
    /// When the branch's first turn was remembered (a tick).
    began: u64,
    /// When this turn was remembered (a tick).
    at: u64,
    /// The group that served it.
    group: usize,
    /// Its request id.
    request_id: String,
    /// Its hash in the index, when it can be found (candidates and found sessions).
    indexed: Option<u64>,
}

#[derive(Debug)]
struct Entry {
    kind: Kind,
    /// The main conversation's last turn.
    last: Option<LastTurn>,
    /// The latest side branches' last turns, oldest first.
    sides: Vec<LastTurn>,
    /// The number the next new branch takes.
    next_branch: u32,
    /// Turns received so far: the next turn's index.
    turns: u64,
    /// Least-recently-used tick.
    used: u64,
}

/// The engine's memory of sessions (see the module's documentation).
#[derive(Debug)]
pub struct SessionMemory {
    capacity: usize,
    /// The most bytes of remembered tokens.
    max_bytes: usize,
    /// Bytes of remembered tokens now.
    bytes: usize,
    sessions: HashMap<String, Entry>,
    /// Remembered turns that can be found, by the hash of their whole tokens.
    by_tokens: HashMap<u64, String>,
    /// How many indexed turns have each length.
    lengths: BTreeMap<usize, usize>,
    tick: u64,
    dropped: u64,
    found: u64,
    /// Makes engine ids unique across processes (the sidecar keys sessions by id alone).
    id_seed: u64,
    next_id: u64,
}

impl Entry {
    /// Places a new turn of prompt `prompt` among the session's branches: its branch, whether
    /// it is a side call, and the last turn it is compared with (its branch's, or for a new
    /// side branch the remembered turn sharing the longest prefix with it).
    fn place(&mut self, prompt: &[u32]) -> (u32, bool, Option<Prior>) {
        let Some(main) = &self.last else {
            let branch = self.next_branch;
            self.next_branch += 1;
            return (branch, false, None);
        };
        let of = |l: &LastTurn| Prior::of(prompt, &l.tokens, l.group);
        let main_prior = of(main);
        if main_prior.common >= main.prompt_len {
            return (main.branch, false, Some(main_prior));
        }
        let extended = self
            .sides
            .iter()
            .enumerate()
            .map(|(i, s)| (i, of(s)))
            .filter(|(i, p)| p.common >= self.sides[*i].prompt_len)
            .max_by_key(|(_, p)| p.common);
        if let Some((i, p)) = extended {
            let side = &self.sides[i];
            if side.began > main.at {
                // The main conversation had no turn since this branch began: the client
                // carries on here.
                let promoted = self.sides.remove(i);
                let branch = promoted.branch;
                if let Some(old) = self.last.replace(promoted) {
                    self.sides.push(old);
                }
                return (branch, false, Some(p));
            }
            return (side.branch, true, Some(p));
        }
        // On a tie, the main conversation (the first).
        let closest = std::iter::once(main_prior)
            .chain(self.sides.iter().map(of))
            .rev()
            .max_by_key(|p| p.common);
        let branch = self.next_branch;
        self.next_branch += 1;
        (branch, true, closest)
    }
}

/// The prefix of engine-made session ids.
const FOUND_PREFIX: &str = "found-";

/// Whether `id` is one the engine made (a found or provisional session's).
fn is_engine_made(id: &str) -> bool {
    id.starts_with(FOUND_PREFIX)
}

/// A 64-bit FNV-1a over the tokens' little-endian bytes, fed one token at a time.
#[derive(Debug, Clone, Copy)]
struct RunningHash(u64);

impl RunningHash {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Self(Self::OFFSET)
    }

    fn push(&mut self, token: u32) {
        for b in token.to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    fn of(tokens: &[u32]) -> u64 {
        let mut h = Self::new();
        for &t in tokens {
            h.push(t);
        }
        h.0
    }
}

/// A per-process random seed for engine-made session ids.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

impl SessionMemory {
    /// Room for `capacity` sessions and candidates (0 remembers none: every turn is `first`,
    /// and no session is found).
    pub fn new(capacity: usize) -> Self {
        Self::with_bytes(capacity, usize::MAX)
    }

    /// Room for `capacity` sessions and candidates and `max_bytes` of their tokens (the turn
    /// just remembered is kept even alone over the bound).
    pub fn with_bytes(capacity: usize, max_bytes: usize) -> Self {
        Self {
            capacity,
            max_bytes,
            bytes: 0,
            sessions: HashMap::new(),
            by_tokens: HashMap::new(),
            lengths: BTreeMap::new(),
            tick: 0,
            dropped: 0,
            found: 0,
            id_seed: random_seed(),
            next_id: 0,
        }
    }

    fn touch(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// A new turn arrives: `session` is its key, if any; without one, and when `find`, its
    /// session is looked for from `prompt`. Returns the turn's place in its session and what
    /// is known of the session's last turn, or `None` for a turn with no session.
    pub fn open_turn(
        &mut self,
        session: Option<&str>,
        find: bool,
        prompt: &[u32],
    ) -> Option<(SessionTurn, Option<Prior>)> {
        if self.capacity == 0 {
            return session.map(|s| {
                let turn = SessionTurn {
                    id: s.to_string(),
                    index: 0,
                    found: false,
                    extends: None,
                    branch: 0,
                    side_call: false,
                };
                (turn, None)
            });
        }
        let (id, found, provisional) = match session {
            Some(s) => (s.to_string(), false, false),
            None if find => match self.find(prompt) {
                Some(id) => (id, true, false),
                // Nothing extended: a session of its own from this first turn on, under a
                // provisional engine-made id that a later turn extending it continues.
                None => (self.make_id(), true, true),
            },
            None => return None,
        };
        let tick = self.touch();
        if !self.sessions.contains_key(&id) {
            self.make_room();
            self.sessions.insert(
                id.clone(),
                Entry {
                    kind: if provisional {
                        Kind::Candidate
                    } else {
                        Kind::Keyed
                    },
                    last: None,
                    sides: Vec::new(),
                    next_branch: 0,
                    turns: 0,
                    used: tick,
                },
            );
        }
        // Present: inserted above if it was not.
        let e = self.sessions.get_mut(&id)?;
        e.used = tick;
        let mut extends = None;
        if found && !provisional && e.kind == Kind::Candidate {
            e.kind = Kind::Found;
            extends = e.last.as_ref().map(|l| l.request_id.clone());
            self.found += 1;
        }
        let index = e.turns;
        e.turns += 1;
        let (branch, side_call, prior) = e.place(prompt);
        // A promotion moves the old main conversation among the side branches.
        let over = e.sides.len().saturating_sub(MAX_SIDE_BRANCHES);
        let gone: Vec<LastTurn> = e.sides.drain(..over).collect();
        for g in &gone {
            self.unindex(g);
            self.bytes -= g.tokens.len() * 4;
        }
        let turn = SessionTurn {
            id,
            index,
            found,
            extends,
            branch,
            side_call,
        };
        Some((turn, prior))
    }

    /// The session whose remembered turn `prompt` extends (the longest, if several).
    fn find(&self, prompt: &[u32]) -> Option<String> {
        let mut hash = RunningHash::new();
        let mut at = 0;
        let mut best: Option<&String> = None;
        for &len in self.lengths.keys() {
            if len >= prompt.len() {
                break;
            }
            for &t in &prompt[at..len] {
                hash.push(t);
            }
            at = len;
            let Some(id) = self.by_tokens.get(&hash.0) else {
                continue;
            };
            let whole = self
                .sessions
                .get(id)
                .and_then(|e| e.last.as_ref())
                .is_some_and(|l| l.tokens.as_slice() == &prompt[..len]);
            if whole {
                best = Some(id);
            }
        }
        best.cloned()
    }

    /// Remembers a finished turn: the tokens whose KV it left, the group that holds them and
    /// its request id. A turn of `session` replaces the last turn of its branch (the main
    /// conversation's, or a side branch's); a keyless turn (`session` `None`) is remembered as
    /// a candidate under a new engine-made id, which is returned.
    pub fn remember(&mut self, session: Option<&str>, turn: FinishedTurn<'_>) -> Option<String> {
        let tokens = turn.tokens;
        if self.capacity == 0 || tokens.is_empty() {
            return None;
        }
        let tick = self.touch();
        let (id, made) = match session {
            Some(s) => (s.to_string(), false),
            None => (self.make_id(), true),
        };
        if !self.sessions.contains_key(&id) {
            // A provisional session dropped while its first turn ran is a candidate again.
            let engine_made = made || is_engine_made(&id);
            self.make_room();
            self.sessions.insert(
                id.clone(),
                Entry {
                    kind: if engine_made {
                        Kind::Candidate
                    } else {
                        Kind::Keyed
                    },
                    last: None,
                    sides: Vec::new(),
                    next_branch: turn.branch + 1,
                    turns: u64::from(engine_made),
                    used: tick,
                },
            );
        }
        let e = self.sessions.get_mut(&id)?;
        e.used = tick;
        let main = e.last.as_ref().is_none_or(|l| l.branch == turn.branch);
        let old = if main {
            e.last.take()
        } else {
            e.sides
                .iter()
                .position(|s| s.branch == turn.branch)
                .map(|i| e.sides.remove(i))
        };
        let began = old.as_ref().map_or(tick, |o| o.began);
        let mut dropped = Vec::new();
        if let Some(old) = old {
            dropped.push(old);
        }
        let kind = e.kind;
        let indexed = (main && kind != Kind::Keyed).then(|| RunningHash::of(tokens));
        let last = LastTurn {
            tokens: tokens.to_vec(),
            prompt_len: turn.prompt_len.min(tokens.len()),
            branch: turn.branch,
            began,
            at: tick,
            group: turn.group,
            request_id: turn.request_id.to_string(),
            indexed,
        };
        if main {
            e.last = Some(last);
        } else {
            e.sides.push(last);
            while e.sides.len() > MAX_SIDE_BRANCHES {
                dropped.push(e.sides.remove(0));
            }
        }
        self.bytes += tokens.len() * 4;
        for d in &dropped {
            self.unindex(d);
            self.bytes -= d.tokens.len() * 4;
        }
        if let Some(h) = indexed {
            self.by_tokens.insert(h, id.clone());
            *self.lengths.entry(tokens.len()).or_insert(0) += 1;
        }
        while self.bytes > self.max_bytes && self.sessions.len() > 1 {
            if !self.drop_oldest(Some(&id)) {
                break;
            }
        }
        made.then_some(id)
    }

    /// Whether `branch` is `session`'s main conversation now (a side call's KV is not kept as
    /// the session's).
    pub fn is_main(&self, session: &str, branch: u32) -> bool {
        self.sessions
            .get(session)
            .and_then(|e| e.last.as_ref())
            .is_none_or(|l| l.branch == branch)
    }

    fn make_id(&mut self) -> String {
        self.next_id += 1;
        format!("{FOUND_PREFIX}{:016x}-{:x}", self.id_seed, self.next_id)
    }

    /// Whether `session` is a keyless turn's provisional session no later turn has extended
    /// yet (its KV is not kept as a live session's).
    pub fn is_candidate(&self, session: &str) -> bool {
        self.sessions
            .get(session)
            .is_some_and(|e| e.kind == Kind::Candidate)
    }

    /// Drops one entry when full: the least recently used candidate, else the least recently
    /// used session. O(n) over at most `capacity` entries, once per new entry beyond it.
    fn make_room(&mut self) {
        if self.sessions.len() < self.capacity {
            return;
        }
        self.drop_oldest(None);
    }

    /// Drops the least recently used candidate, else the least recently used session, never
    /// `keep`; whether one was dropped.
    fn drop_oldest(&mut self, keep: Option<&str>) -> bool {
        let oldest = |candidates: bool| {
            self.sessions
                .iter()
                .filter(|(k, e)| {
                    (!candidates || e.kind == Kind::Candidate) && Some(k.as_str()) != keep
                })
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
        };
        let Some(victim) = oldest(true).or_else(|| oldest(false)) else {
            return false;
        };
        if let Some(e) = self.sessions.remove(&victim) {
            for l in e.last.iter().chain(&e.sides) {
                self.unindex(l);
                self.bytes -= l.tokens.len() * 4;
            }
            if e.kind != Kind::Candidate {
                self.dropped += 1;
            }
        }
        true
    }

    fn unindex(&mut self, last: &LastTurn) {
        let Some(h) = last.indexed else { return };
        self.by_tokens.remove(&h);
        let len = last.tokens.len();
        if let Some(n) = self.lengths.get_mut(&len) {
            *n -= 1;
            if *n == 0 {
                self.lengths.remove(&len);
            }
        }
    }

    /// The group that holds `session`'s last turn, if remembered.
    pub fn group_of(&self, session: &str) -> Option<usize> {
        self.sessions
            .get(session)
            .and_then(|e| e.last.as_ref())
            .map(|l| l.group)
    }

    /// The most sessions and candidates remembered.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sessions remembered now (candidates not counted).
    pub fn len(&self) -> usize {
        self.sessions
            .values()
            .filter(|e| e.kind != Kind::Candidate)
            .count()
    }

    /// Whether no session is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keyless turns remembered as candidates now.
    pub fn candidates(&self) -> usize {
        self.sessions.len() - self.len()
    }

    /// Sessions dropped to stay within the limit (candidates not counted).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Sessions found so far from their prompts.
    pub fn found(&self) -> u64 {
        self.found
    }

    /// Bytes of remembered tokens now, and the bound.
    pub fn bytes(&self) -> (usize, usize) {
        (self.bytes, self.max_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finished turn on branch 0 whose tokens are all prompt.
    fn fin<'a>(tokens: &'a [u32], group: usize, request_id: &'a str) -> FinishedTurn<'a> {
        FinishedTurn {
            tokens,
            prompt_len: tokens.len(),
            group,
            request_id,
            branch: 0,
        }
    }

    fn turn(m: &mut SessionMemory, key: Option<&str>, prompt: &[u32]) -> Option<SessionTurn> {
        m.open_turn(key, true, prompt).map(|(t, _)| t)
    }

    /// Whether a keyless turn joined no session: it starts a provisional one of its own.
    fn alone(t: Option<SessionTurn>) -> bool {
        t.is_some_and(|t| t.found && t.index == 0 && t.extends.is_none())
    }

    #[test]
    fn the_memory_is_bounded_by_the_bytes_of_its_tokens() {
        // Room for 3 sessions' tokens of 100 ids each.
        let mut m = SessionMemory::with_bytes(100, 3 * 400);
        for (k, id) in [(1u32, "a"), (2, "b"), (3, "c")] {
            turn(&mut m, Some(id), &[1]);
            m.remember(Some(id), fin(&[k; 100], 0, id));
        }
        assert_eq!(m.len(), 3);
        assert_eq!(m.bytes().0, 1200);
        // "a" used again: "b" is the least recently used.
        turn(&mut m, Some("a"), &[0; 100]);
        turn(&mut m, Some("d"), &[1]);
        m.remember(Some("d"), fin(&[9; 100], 0, "d"));
        assert!(m.group_of("b").is_none(), "dropped for the bytes");
        assert!(m.group_of("a").is_some() && m.group_of("d").is_some());
        assert!(m.bytes().0 <= 1200);
        assert_eq!(m.dropped(), 1);
        // One turn over the whole bound is kept, alone.
        turn(&mut m, Some("e"), &[1]);
        m.remember(Some("e"), fin(&[7; 1000], 0, "e"));
        assert_eq!(m.len(), 1);
        assert!(m.group_of("e").is_some());
    }

    #[test]
    fn keyed_turns_count_from_zero_and_compare_with_the_last() {
        let mut m = SessionMemory::new(4);
        let t0 = turn(&mut m, Some("a"), &[1, 2]).expect("turn");
        assert_eq!((t0.id.as_str(), t0.index, t0.found), ("a", 0, false));
        m.remember(Some("a"), fin(&[1, 2, 3], 0, "r0"));
        let (t1, prior) = m.open_turn(Some("a"), true, &[1, 2, 3, 4]).expect("turn");
        assert_eq!(t1.index, 1);
        assert_eq!(prior.map(|p| (p.common, p.last_len)), Some((3, 3)));
        assert_eq!(m.group_of("a"), Some(0));
        // No key and nothing to find: no session; no key and not looking: none either.
        assert!(alone(turn(&mut m, None, &[9, 9])));
        assert!(m.open_turn(None, false, &[1, 2, 3, 4]).is_none());
    }

    #[test]
    fn a_prompt_that_extends_a_keyless_turn_joins_its_session() {
        let mut m = SessionMemory::new(8);
        // Turn 0, keyless: a provisional session of its own from its arrival, under an
        // engine-made id; its turn is remembered as a candidate a later prompt may extend.
        let t0 = turn(&mut m, None, &[1, 2, 3]).expect("provisional");
        assert!(alone(Some(t0.clone())));
        let id = t0.id;
        assert!(id.starts_with("found-"));
        assert!(m.is_candidate(&id));
        assert!(
            m.remember(Some(&id), fin(&[1, 2, 3, 10, 11], 0, "req-0"))
                .is_none()
        );
        assert_eq!((m.len(), m.candidates(), m.found()), (0, 1, 0));
        // Turn 1 resends the history (prompt and reply) and adds to it.
        let (t1, prior) = m
            .open_turn(None, true, &[1, 2, 3, 10, 11, 4, 5])
            .expect("found");
        assert_eq!(t1.id, id);
        assert_eq!((t1.index, t1.found), (1, true));
        assert_eq!(t1.extends.as_deref(), Some("req-0"));
        assert_eq!(prior.map(|p| p.common), Some(5));
        assert_eq!((m.len(), m.candidates(), m.found()), (1, 0, 1));
        assert!(!m.is_candidate(&id));
        // Its reply is remembered under the found id; turn 2 finds that, not turn 0.
        m.remember(Some(&id), fin(&[1, 2, 3, 10, 11, 4, 5, 12], 0, "req-1"));
        let t2 = turn(&mut m, None, &[1, 2, 3, 10, 11, 4, 5, 12, 6]).expect("found");
        assert_eq!(
            (t2.id.as_str(), t2.index, t2.extends),
            (id.as_str(), 2, None)
        );
        // The old turn is no longer indexed: a fork from turn 0 finds nothing.
        assert!(alone(turn(&mut m, None, &[1, 2, 3, 10, 11, 7])));
    }

    #[test]
    fn conversations_sharing_only_a_system_prompt_stay_apart() {
        let mut m = SessionMemory::new(8);
        let system = [50, 51, 52];
        let a = m
            .remember(None, fin(&[50, 51, 52, 1, 60], 0, "a0"))
            .expect("a");
        // B's first prompt shares the system prompt only: no session.
        assert!(alone(turn(&mut m, None, &[50, 51, 52, 2])));
        let b = m
            .remember(None, fin(&[50, 51, 52, 2, 61], 0, "b0"))
            .expect("b");
        assert_ne!(a, b);
        let ta = turn(&mut m, None, &[50, 51, 52, 1, 60, 3]).expect("a1");
        let tb = turn(&mut m, None, &[50, 51, 52, 2, 61, 4]).expect("b1");
        assert_eq!((ta.id, tb.id), (a, b));
        // A prompt equal to a remembered turn does not extend it.
        assert!(alone(turn(&mut m, None, &system)));
    }

    #[test]
    fn a_hash_collision_never_joins_two_conversations() {
        let mut m = SessionMemory::new(4);
        let id = m.remember(None, fin(&[1, 2], 0, "r")).expect("id");
        // Point the entry's hash at other tokens of the same length.
        let h = RunningHash::of(&[7, 8]);
        let stored = m
            .by_tokens
            .remove(&RunningHash::of(&[1, 2]))
            .expect("indexed");
        assert_eq!(stored, id);
        m.by_tokens.insert(h, id);
        assert!(alone(turn(&mut m, None, &[7, 8, 9])));
    }

    #[test]
    fn memory_is_bounded_and_drops_candidates_first() {
        let mut m = SessionMemory::new(2);
        m.remember(Some("a"), fin(&[1, 2, 3], 0, "ra"));
        let c = m.remember(None, fin(&[4, 5], 1, "rc")).expect("candidate");
        m.remember(Some("b"), fin(&[6], 0, "rb")); // the candidate goes, not "a"
        assert_eq!((m.len(), m.candidates(), m.dropped()), (2, 0, 0));
        assert!(m.find(&[4, 5, 9]).is_none(), "{c} was dropped");
        assert_eq!(
            m.open_turn(Some("a"), true, &[1, 2, 9])
                .and_then(|(_, p)| p)
                .map(|p| p.common),
            Some(2)
        );
        m.remember(Some("c"), fin(&[7], 0, "rc2")); // "b" was used least recently
        assert_eq!((m.len(), m.dropped()), (2, 1));
        assert!(m.group_of("b").is_none());
        assert!(m.by_tokens.is_empty() && m.lengths.is_empty());
        let mut none = SessionMemory::new(0);
        assert!(none.remember(Some("a"), fin(&[1], 0, "r")).is_none());
        assert!(none.remember(None, fin(&[1], 0, "r")).is_none());
        let (t, prior) = none.open_turn(Some("a"), true, &[1]).expect("keyed");
        assert_eq!((t.index, prior), (0, None));
        assert!(none.open_turn(None, true, &[1, 2]).is_none());
    }

    #[test]
    fn dropping_an_indexed_turn_unindexes_it() {
        let mut m = SessionMemory::new(1);
        m.remember(None, fin(&[1, 2], 0, "r1"));
        m.remember(None, fin(&[3, 4], 0, "r2"));
        assert_eq!(m.candidates(), 1);
        assert_eq!(m.by_tokens.len(), 1);
        assert_eq!(m.lengths.get(&2), Some(&1));
        assert!(alone(turn(&mut m, None, &[1, 2, 5])));
        assert!(turn(&mut m, None, &[3, 4, 5]).is_some());
    }

    /// A finished keyed turn of `branch`: `prompt` then `reply`.
    fn answered(m: &mut SessionMemory, key: &str, t: &SessionTurn, prompt: &[u32], reply: &[u32]) {
        let tokens: Vec<u32> = prompt.iter().chain(reply).copied().collect();
        let turn = FinishedTurn {
            tokens: &tokens,
            prompt_len: prompt.len(),
            group: 0,
            request_id: "r",
            branch: t.branch,
        };
        m.remember(Some(key), turn);
    }

    #[test]
    fn a_side_call_leaves_the_main_conversation_alone() {
        let mut m = SessionMemory::new(4);
        let p0 = [50, 51, 1, 2];
        let (t0, _) = m.open_turn(Some("s"), true, &p0).expect("turn 0");
        assert_eq!((t0.branch, t0.side_call), (0, false));
        answered(&mut m, "s", &t0, &p0, &[10, 11]);
        // A side call under the same key: it shares the system prompt only.
        let side = [50, 51, 7, 8];
        let (t1, prior) = m.open_turn(Some("s"), true, &side).expect("side");
        assert_eq!((t1.index, t1.branch, t1.side_call), (1, 1, true));
        assert_eq!(prior.map(|p| p.common), Some(2));
        answered(&mut m, "s", &t1, &side, &[12]);
        assert!(!m.is_main("s", 1) && m.is_main("s", 0));
        // The next real turn still extends the main conversation, reply and all.
        let p2 = [50, 51, 1, 2, 10, 11, 3];
        let (t2, prior) = m.open_turn(Some("s"), true, &p2).expect("turn 2");
        assert_eq!((t2.branch, t2.side_call), (0, false));
        assert_eq!(prior.map(|p| (p.common, p.last_len)), Some((6, 6)));
        answered(&mut m, "s", &t2, &p2, &[13]);
        // A reply resent with other tokens still extends the prompt: main, compared with it.
        let p3 = [50, 51, 1, 2, 10, 11, 3, 99, 4];
        let (t3, prior) = m.open_turn(Some("s"), true, &p3).expect("turn 3");
        assert_eq!((t3.branch, t3.side_call), (0, false));
        assert_eq!(prior.map(|p| p.common), Some(7));
        // The side call's branch goes on as a side call: the main conversation moved since.
        let side2 = [50, 51, 7, 8, 12, 9];
        let (t4, _) = m.open_turn(Some("s"), true, &side2).expect("side again");
        assert_eq!((t4.branch, t4.side_call), (1, true));
    }

    #[test]
    fn a_conversation_started_over_becomes_the_main_one() {
        let mut m = SessionMemory::new(4);
        let (t0, _) = m.open_turn(Some("s"), true, &[1, 2]).expect("turn 0");
        answered(&mut m, "s", &t0, &[1, 2], &[3]);
        // A compaction: the conversation starts again from a summary.
        let (t1, _) = m.open_turn(Some("s"), true, &[1, 9]).expect("new branch");
        assert_eq!((t1.branch, t1.side_call), (1, true));
        answered(&mut m, "s", &t1, &[1, 9], &[4]);
        // Its next turn extends it while the old conversation had none since: it is main now.
        let (t2, prior) = m.open_turn(Some("s"), true, &[1, 9, 4, 5]).expect("turn 2");
        assert_eq!((t2.branch, t2.side_call), (1, false));
        assert_eq!(prior.map(|p| p.common), Some(3));
        assert!(m.is_main("s", 1));
        // At most MAX_SIDE_BRANCHES side branches; their bytes go with them.
        for k in 0..10u32 {
            let p = [100 + k, 1];
            let (t, _) = m.open_turn(Some("s"), true, &p).expect("side");
            assert!(t.side_call);
            answered(&mut m, "s", &t, &p, &[2]);
        }
        let e = m.sessions.get("s").expect("session");
        assert_eq!(e.sides.len(), MAX_SIDE_BRANCHES);
        let held: usize = e
            .last
            .iter()
            .chain(&e.sides)
            .map(|l| l.tokens.len() * 4)
            .sum();
        assert_eq!(m.bytes().0, held);
    }
}
