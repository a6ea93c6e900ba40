//! The engine's memory of the replies it generated: each reply's exact token ids, found again
//! by what a client sends back (the reply's text as returned and its tool calls), so that a
//! later prompt holding that reply as an assistant message is built from the generated ids
//! rather than from a re-tokenization of its text. A reply whose text does not tokenize back
//! to its ids (a non-canonical split, whitespace an API trimmed, a tool call the template
//! writes otherwise than the model did) then costs the next turn nothing: the prompt is the
//! KV cache's own tokens.
//!
//! A resent message is used only when it is the reply as generated: its text (outer
//! whitespace aside) and its tool calls (names and arguments, as JSON values) equal the
//! remembered ones; anything else is rendered as sent. Bounded in bytes, the least recently
//! used reply forgotten first.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::chat_template::{ChatMessage, Role};

/// A reply as a client sends it back: its text and its tool calls (id, name, arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplyKey {
    /// The reply's text, outer whitespace trimmed.
    pub text: String,
    /// Its tool calls in order: the function's name and its arguments as a JSON value (an
    /// object, or the text as sent when it is not JSON).
    pub calls: Vec<(String, Value)>,
    /// Its tool calls' ids in order (`call_…`, `toolu_…`: the engine's own, unique to the
    /// reply), so that replies of the same text and calls (an agent calling one tool again
    /// and again) are told apart.
    pub call_ids: Vec<String>,
}

impl ReplyKey {
    /// The key of a reply of `text` making `calls` (arguments as JSON text or values).
    pub fn new(text: &str, calls: Vec<(String, Value)>) -> Self {
        Self {
            text: text.trim().to_string(),
            calls: calls
                .into_iter()
                .map(|(name, args)| (name, normalize(args)))
                .collect(),
            call_ids: Vec::new(),
        }
    }

    /// The same key, its tool calls having the ids `ids`.
    #[must_use]
    pub fn with_call_ids(mut self, ids: Vec<String>) -> Self {
        self.call_ids = ids;
        self
    }

    /// A hash of the text, the calls' names and their ids (the arguments are compared on a
    /// match).
    fn digest(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.text.hash(&mut h);
        for (name, _) in &self.calls {
            name.hash(&mut h);
        }
        self.call_ids.hash(&mut h);
        h.finish()
    }

    fn bytes(&self) -> usize {
        self.text.len()
            + self
                .calls
                .iter()
                .map(|(n, a)| n.len() + a.to_string().len())
                .sum::<usize>()
            + self.call_ids.iter().map(String::len).sum::<usize>()
    }
}

impl ReplyKey {
    /// The key of an assistant message as a client sent it back (`None` for other roles).
    pub fn of_message(m: &ChatMessage) -> Option<Self> {
        if m.role != Role::Assistant {
            return None;
        }
        let sent = m.tool_calls.iter().flatten();
        let calls = sent
            .clone()
            .map(|c| {
                let f = &c["function"];
                (
                    f["name"].as_str().unwrap_or_default().to_string(),
                    f["arguments"].clone(),
                )
            })
            .collect();
        let ids = sent
            .map(|c| c["id"].as_str().unwrap_or_default().to_string())
            .collect();
        Some(Self::new(&m.content, calls).with_call_ids(ids))
    }
}

/// Arguments as a JSON value: a JSON text is parsed, anything else kept as it is.
fn normalize(args: Value) -> Value {
    match args {
        Value::String(s) => serde_json::from_str::<Value>(&s).unwrap_or(Value::String(s)),
        other => other,
    }
}

struct Entry {
    key: ReplyKey,
    ids: Arc<[u32]>,
    stamp: u64,
    bytes: usize,
}

#[derive(Default)]
struct Inner {
    /// Entries by digest (a few per digest when texts collide).
    entries: HashMap<u64, Vec<Entry>>,
    /// Recency: stamp → digest, the oldest first.
    order: BTreeMap<u64, u64>,
    clock: u64,
    bytes: usize,
}

/// The remembered replies, bounded in bytes.
pub struct ReplyMemory {
    inner: Mutex<Inner>,
    max_bytes: usize,
}

impl std::fmt::Debug for ReplyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyMemory")
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// The default bound: 64 MiB of token ids and texts.
pub const DEFAULT_BYTES: usize = 64 << 20;

impl Default for ReplyMemory {
    fn default() -> Self {
        Self::with_bytes(DEFAULT_BYTES)
    }
}

/// What one entry costs besides its ids and key.
const OVERHEAD: usize = 64;

impl ReplyMemory {
    /// A memory of at most `max_bytes` (0 remembers nothing).
    pub fn with_bytes(max_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update leaves the maps consistent; a poisoned lock is used as it is.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remembers the reply `key` generated as `ids` (its end-of-turn token included when it
    /// ended with one). A reply of the same key replaces the older one.
    pub fn remember(&self, key: ReplyKey, ids: &[u32]) {
        if ids.is_empty() {
            return;
        }
        let bytes = key.bytes() + ids.len() * 4 + OVERHEAD;
        if bytes > self.max_bytes / 4 {
            return;
        }
        let digest = key.digest();
        let mut g = self.lock();
        g.clock += 1;
        let stamp = g.clock;
        let old = g.entries.get_mut(&digest).and_then(|list| {
            list.iter()
                .position(|e| e.key == key)
                .map(|at| list.swap_remove(at))
        });
        if let Some(old) = old {
            g.order.remove(&old.stamp);
            g.bytes -= old.bytes;
        }
        g.entries.entry(digest).or_default().push(Entry {
            key,
            ids: Arc::from(ids),
            stamp,
            bytes,
        });
        g.order.insert(stamp, digest);
        g.bytes += bytes;
        while g.bytes > self.max_bytes {
            let Some((oldest, d)) = g.order.pop_first() else {
                break;
            };
            let gone = g.entries.get_mut(&d).and_then(|list| {
                list.iter()
                    .position(|e| e.stamp == oldest)
                    .map(|at| list.swap_remove(at))
            });
            if let Some(e) = gone {
                g.bytes -= e.bytes;
            }
            if g.entries.get(&d).is_some_and(Vec::is_empty) {
                g.entries.remove(&d);
            }
        }
    }

    /// The ids of the reply a client sent back as `key`, when it is one the engine generated
    /// and still remembers (made the most recently used).
    pub fn recall(&self, key: &ReplyKey) -> Option<Arc<[u32]>> {
        let digest = key.digest();
        let mut g = self.lock();
        g.clock += 1;
        let now = g.clock;
        let entry = g
            .entries
            .get_mut(&digest)?
            .iter_mut()
            .find(|e| e.key == *key)?;
        let (was, ids) = (entry.stamp, Arc::clone(&entry.ids));
        entry.stamp = now;
        g.order.remove(&was);
        g.order.insert(now, digest);
        Some(ids)
    }

    /// Forgets every reply.
    pub fn clear(&self) {
        *self.lock() = Inner::default();
    }

    /// Replies remembered now.
    pub fn len(&self) -> usize {
        self.lock().entries.values().map(Vec::len).sum()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_reply_sent_back_as_generated_is_found_and_anything_else_is_not() {
        let m = ReplyMemory::default();
        let calls = vec![(
            "get_weather".to_string(),
            json!(r#"{"city": "Paris", "unit": "c"}"#),
        )];
        m.remember(ReplyKey::new("Let me look.", calls), &[5, 6, 7, 2]);
        // Sent back trimmed, with the arguments as an object in another key order.
        let back = ReplyKey::new(
            " Let me look.\n",
            vec![("get_weather".into(), json!({"unit": "c", "city": "Paris"}))],
        );
        assert_eq!(m.recall(&back).as_deref(), Some(&[5u32, 6, 7, 2][..]));
        let other_args = ReplyKey::new(
            "Let me look.",
            vec![("get_weather".into(), json!({"city": "Rome", "unit": "c"}))],
        );
        assert!(m.recall(&other_args).is_none());
        assert!(m.recall(&ReplyKey::new("Let me see.", vec![])).is_none());
        assert!(m.recall(&ReplyKey::new("Let me look.", vec![])).is_none());
    }

    #[test]
    fn replies_of_the_same_call_are_told_apart_by_their_call_ids() {
        // An agent calling one tool with the same arguments turn after turn: the same text and
        // calls, generated as other ids each time.
        let m = ReplyMemory::default();
        let call = || vec![("list_agents".to_string(), json!({}))];
        let key = |id: &str| ReplyKey::new("", call()).with_call_ids(vec![id.into()]);
        m.remember(key("toolu_1"), &[5, 6, 7, 2]);
        m.remember(key("toolu_2"), &[5, 8, 7, 2]);
        assert_eq!(
            m.recall(&key("toolu_1")).as_deref(),
            Some(&[5u32, 6, 7, 2][..])
        );
        assert_eq!(
            m.recall(&key("toolu_2")).as_deref(),
            Some(&[5u32, 8, 7, 2][..])
        );
        // A call id the engine never gave is not its reply.
        assert!(m.recall(&key("toolu_3")).is_none());
        assert!(m.recall(&ReplyKey::new("", call())).is_none());
    }

    #[test]
    fn the_least_recently_used_reply_goes_first_within_the_bytes() {
        let one = ReplyKey::new("a", vec![]).bytes() + 4 * 100 + OVERHEAD;
        let m = ReplyMemory::with_bytes(one * 4);
        m.remember(ReplyKey::new("a", vec![]), &[1; 100]);
        m.remember(ReplyKey::new("b", vec![]), &[2; 100]);
        m.remember(ReplyKey::new("c", vec![]), &[3; 100]);
        m.remember(ReplyKey::new("d", vec![]), &[4; 100]);
        // "a" used again: "b" is now the oldest.
        assert!(m.recall(&ReplyKey::new("a", vec![])).is_some());
        m.remember(ReplyKey::new("e", vec![]), &[5; 100]);
        assert!(m.recall(&ReplyKey::new("b", vec![])).is_none());
        assert!(m.recall(&ReplyKey::new("a", vec![])).is_some());
        assert_eq!(m.len(), 4);
        assert!(m.bytes() <= one * 4);
        // The same reply again replaces, never doubles.
        m.remember(ReplyKey::new("e", vec![]), &[6; 100]);
        assert_eq!(m.len(), 4);
        assert_eq!(
            m.recall(&ReplyKey::new("e", vec![])).as_deref(),
            Some(&[6u32; 100][..])
        );
        // Nothing is remembered by a memory of no bytes.
        let none = ReplyMemory::with_bytes(0);
        none.remember(ReplyKey::new("a", vec![]), &[1]);
        assert!(none.is_empty());
    }
}
