//! The facts the vendors' prompt-cache diagnostics compare, kept exactly, and the comparison.
//!
//! Anthropic's `diagnostics.previous_message_id` and OpenAI's
//! `prompt_cache_options.comparison_response_id` ask why a request's prompt cache missed
//! against an earlier request. The vendors estimate it; slotlight knows it: every request of
//! a door that offers diagnostics is [registered](Registry::register) under its response id
//! with its exact prompt token ids, the reply's token ids once it has them, and a fingerprint
//! of each part of the request a prompt is built from (the model, the system prompt or
//! instructions, the tools, the output format, and the other options that change the prompt).
//! [`diagnose`] compares two of them: how many tokens the current prompt could have reused
//! from the previous turn and did not (exact, counted on the tokens), and, when that is any,
//! the first part of the request that changed.
//!
//! The record is in memory and bounded ([`MAX_TURNS`] turns and [`MAX_TOKENS`] token ids, the
//! oldest forgotten first): a turn forgotten, or from before a restart, is "not found".

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

/// The most turns kept.
pub const MAX_TURNS: usize = 4096;

/// The most token ids kept over all turns (prompts and replies; 32 MiB of ids).
pub const MAX_TOKENS: usize = 8 << 20;

/// A part of a request, reduced to a hash of its exact content (equal content, equal
/// fingerprint; the content itself is not kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(u64);

impl Fingerprint {
    /// The fingerprint of `content`.
    pub fn of(content: &impl Hash) -> Self {
        let mut h = DefaultHasher::new();
        content.hash(&mut h);
        Self(h.finish())
    }

    /// The fingerprint of a JSON value, by its text (key order as sent).
    pub fn of_json(v: &serde_json::Value) -> Self {
        Self::of(&v.to_string())
    }
}

/// The parts of a request its prompt is built from, in the order a prompt puts them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sections {
    /// The model the request was served under.
    pub model: String,
    /// The system prompt (Anthropic's `system`) or instructions (OpenAI's `instructions`).
    pub system: Fingerprint,
    /// The tools offered, as sent.
    pub tools: Fingerprint,
    /// The output format asked for (a JSON schema, or none).
    pub format: Fingerprint,
    /// Every other option that changes the prompt: the tool choice, the thinking switch and
    /// other template variables.
    pub options: Fingerprint,
}

/// One registered turn: its parts, its prompt and, once it finished, its reply.
#[derive(Debug, Clone)]
pub struct Turn {
    /// What its prompt was built from.
    pub sections: Sections,
    /// The prompt's token ids, exactly as prefilled.
    pub prompt: Arc<[u32]>,
    /// The reply's token ids as generated (its first choice); `None` until it finished, or
    /// when it never did.
    pub reply: Option<Arc<[u32]>>,
}

impl Turn {
    /// A turn of `sections` whose prompt is `prompt`, its reply not yet known.
    pub fn new(sections: Sections, prompt: Arc<[u32]>) -> Self {
        Self {
            sections,
            prompt,
            reply: None,
        }
    }

    fn tokens(&self) -> usize {
        self.prompt.len() + self.reply.as_ref().map_or(0, |r| r.len())
    }
}

/// Why a prompt missed tokens it could have reused from the previous turn: the first part of
/// the request, in prompt order, that differs between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissReason {
    /// The model differs.
    Model,
    /// The system prompt or instructions differ.
    System,
    /// The tools differ.
    Tools,
    /// The output format differs.
    Format,
    /// Another option that changes the prompt differs (tool choice, thinking, template
    /// variables).
    Options,
    /// Only the conversation differs: an earlier message changed, or the reply as the client
    /// sent it back renders to other tokens than the ones generated.
    Input,
}

/// What [`diagnose`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Diagnosis {
    /// `None`: the current prompt continues the previous turn's tokens as far as both go (a
    /// cache hit); else why it departs from them.
    pub reason: Option<MissReason>,
    /// Tokens the current prompt could have reused from the previous turn and did not: the
    /// shorter of the two (the previous turn's prompt and reply, and the current prompt),
    /// less their common prefix. Zero for a hit.
    pub missed_tokens: usize,
    /// The length of that common prefix, in tokens.
    pub common_tokens: usize,
}

/// Compares the current turn with the previous one. The previous turn's tokens are its
/// prompt followed by its reply as generated (its prompt alone while it has no reply): a
/// prompt that continues them as far as both go is a hit; otherwise the missed tokens are
/// counted exactly and the reason is the first part of the request that changed, or the
/// conversation when none did.
pub fn diagnose(previous: &Turn, current: &Turn) -> Diagnosis {
    let reply: &[u32] = previous.reply.as_deref().unwrap_or(&[]);
    let before = previous.prompt.iter().chain(reply.iter());
    let common = before
        .zip(current.prompt.iter())
        .take_while(|(a, b)| a == b)
        .count();
    let reusable = previous.tokens().min(current.prompt.len());
    let missed = reusable.saturating_sub(common);
    if missed == 0 {
        return Diagnosis {
            reason: None,
            missed_tokens: 0,
            common_tokens: common,
        };
    }
    let (p, c) = (&previous.sections, &current.sections);
    let reason = if p.model != c.model {
        MissReason::Model
    } else if p.system != c.system {
        MissReason::System
    } else if p.tools != c.tools {
        MissReason::Tools
    } else if p.format != c.format {
        MissReason::Format
    } else if p.options != c.options {
        MissReason::Options
    } else {
        MissReason::Input
    };
    Diagnosis {
        reason: Some(reason),
        missed_tokens: missed,
        common_tokens: common,
    }
}

/// The recent turns by response id, bounded by [`MAX_TURNS`] and [`MAX_TOKENS`] (the oldest
/// forgotten first). Shared by every door; its lock is held only to insert, update or copy
/// out one entry.
#[derive(Debug)]
pub struct Registry {
    inner: Mutex<Kept>,
    max_turns: usize,
    max_tokens: usize,
}

#[derive(Debug, Default)]
struct Kept {
    turns: HashMap<String, Turn>,
    /// Ids in the order they were registered (the oldest first).
    order: VecDeque<String>,
    /// Token ids held over all turns.
    tokens: usize,
}

impl Default for Registry {
    fn default() -> Self {
        Self::with_bounds(MAX_TURNS, MAX_TOKENS)
    }
}

impl Registry {
    /// A registry that keeps at most `max_turns` turns and `max_tokens` token ids.
    pub fn with_bounds(max_turns: usize, max_tokens: usize) -> Self {
        Self {
            inner: Mutex::new(Kept::default()),
            max_turns,
            max_tokens,
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        // A panic while the lock was held leaves a consistent map (every update is one
        // insert or one field set), so a poisoned lock is used as it is.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers the turn answered as `id` (its reply comes with [`Registry::finish`]).
    pub fn register(&self, id: &str, turn: Turn) {
        let mut k = self.kept();
        k.tokens += turn.tokens();
        if let Some(old) = k.turns.insert(id.to_string(), turn) {
            k.tokens -= old.tokens();
        } else {
            k.order.push_back(id.to_string());
        }
        self.evict(&mut k);
    }

    /// Forgets the oldest turns until the bounds hold (the newest turn is kept even alone
    /// over the token bound).
    fn evict(&self, k: &mut Kept) {
        while k.order.len() > self.max_turns || (k.tokens > self.max_tokens && k.order.len() > 1) {
            let Some(oldest) = k.order.pop_front() else {
                break;
            };
            if let Some(t) = k.turns.remove(&oldest) {
                k.tokens -= t.tokens();
            }
        }
    }

    /// Records the reply of turn `id` (its first choice's tokens as generated).
    pub fn finish(&self, id: &str, reply: Arc<[u32]>) {
        let mut k = self.kept();
        let added = reply.len();
        let Some(t) = k.turns.get_mut(id) else {
            return;
        };
        let removed = t.reply.replace(reply).map_or(0, |r| r.len());
        k.tokens = k.tokens + added - removed;
        self.evict(&mut k);
    }

    /// The turn answered as `id`, when it is still kept.
    pub fn get(&self, id: &str) -> Option<Turn> {
        self.kept().turns.get(id).cloned()
    }

    /// How many turns are kept.
    pub fn len(&self) -> usize {
        self.kept().turns.len()
    }

    /// Whether no turn is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Compares `current` with the turn answered as `previous`: `None` when that turn is not
    /// kept (never registered, forgotten, or from before a restart).
    pub fn compare(&self, previous: &str, current: &Turn) -> Option<Diagnosis> {
        self.get(previous).map(|p| diagnose(&p, current))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sections() -> Sections {
        Sections {
            model: "m".into(),
            system: Fingerprint::of(&"be brief"),
            tools: Fingerprint::of_json(&serde_json::json!([])),
            format: Fingerprint::of(&None::<String>),
            options: Fingerprint::of(&"auto"),
        }
    }

    fn turn(prompt: &[u32], reply: Option<&[u32]>) -> Turn {
        Turn {
            sections: sections(),
            prompt: prompt.into(),
            reply: reply.map(Into::into),
        }
    }

    #[test]
    fn a_prompt_that_continues_the_previous_turn_is_a_hit() {
        let prev = turn(&[1, 2, 3], Some(&[4, 5]));
        // The previous prompt, its reply as generated, then the new message.
        let d = diagnose(&prev, &turn(&[1, 2, 3, 4, 5, 6, 7], None));
        assert_eq!(
            d,
            Diagnosis {
                reason: None,
                missed_tokens: 0,
                common_tokens: 5
            }
        );
        // A prompt shorter than the previous turn that is a prefix of it misses nothing.
        let d = diagnose(&prev, &turn(&[1, 2], None));
        assert_eq!((d.reason, d.missed_tokens), (None, 0));
        // Before the previous turn's reply is known, its prompt alone is compared.
        let d = diagnose(&turn(&[1, 2, 3], None), &turn(&[1, 2, 3, 9], None));
        assert_eq!((d.reason, d.missed_tokens), (None, 0));
    }

    #[test]
    fn missed_tokens_are_counted_on_the_tokens() {
        let prev = turn(&[1, 2, 3, 4], Some(&[5, 6]));
        // An earlier message changed at position 2: tokens 2..6 of the previous turn are lost.
        let d = diagnose(&prev, &turn(&[1, 2, 9, 4, 5, 6, 7, 8], None));
        assert_eq!(d.reason, Some(MissReason::Input));
        assert_eq!((d.missed_tokens, d.common_tokens), (4, 2));
        // The reply re-rendered differently (its last token): one token missed.
        let d = diagnose(&prev, &turn(&[1, 2, 3, 4, 5, 7, 8], None));
        assert_eq!((d.reason, d.missed_tokens), (Some(MissReason::Input), 1));
        // A current prompt shorter than the previous turn misses only what it has.
        let d = diagnose(&prev, &turn(&[1, 9, 9], None));
        assert_eq!(d.missed_tokens, 2);
    }

    #[test]
    fn the_reason_is_the_first_part_that_changed() {
        let prev = turn(&[1, 2, 3, 4], Some(&[5]));
        let changed = |f: fn(&mut Sections)| {
            let mut t = turn(&[1, 9, 3, 4, 5], None);
            f(&mut t.sections);
            diagnose(&prev, &t).reason
        };
        assert_eq!(
            changed(|s| s.model = "other".into()),
            Some(MissReason::Model)
        );
        assert_eq!(
            changed(|s| s.system = Fingerprint::of(&"be long")),
            Some(MissReason::System)
        );
        assert_eq!(
            changed(|s| s.tools = Fingerprint::of_json(&serde_json::json!([{"name": "f"}]))),
            Some(MissReason::Tools)
        );
        assert_eq!(
            changed(|s| s.format = Fingerprint::of(&Some("{}"))),
            Some(MissReason::Format)
        );
        assert_eq!(
            changed(|s| s.options = Fingerprint::of(&"none")),
            Some(MissReason::Options)
        );
        // Model and system both changed: the model comes first.
        assert_eq!(
            changed(|s| {
                s.model = "other".into();
                s.system = Fingerprint::of(&"x");
            }),
            Some(MissReason::Model)
        );
        // A part that changed but left the tokens alone is no miss (the tokens decide).
        let mut same = turn(&[1, 2, 3, 4, 5, 6], None);
        same.sections.tools = Fingerprint::of(&"ignored by the template");
        assert_eq!(diagnose(&prev, &same).reason, None);
    }

    #[test]
    fn the_registry_keeps_replies_and_forgets_the_oldest() {
        let r = Registry::with_bounds(2, 100);
        r.register("a", turn(&[1, 2], None));
        r.finish("a", Arc::from(vec![3u32]));
        assert_eq!(
            r.get("a").and_then(|t| t.reply).as_deref(),
            Some(&[3u32][..])
        );
        let d = r.compare("a", &turn(&[1, 2, 3, 4], None)).expect("kept");
        assert_eq!(d.reason, None);
        assert!(r.compare("nope", &turn(&[1], None)).is_none());
        r.register("b", turn(&[1], None));
        r.register("c", turn(&[1], None));
        assert_eq!(r.len(), 2);
        assert!(r.get("a").is_none(), "the oldest turn is forgotten first");
        // A reply for a forgotten turn is dropped.
        r.finish("a", Arc::from(vec![3u32]));
        assert!(r.get("a").is_none());
    }

    #[test]
    fn the_registry_is_bounded_by_tokens() {
        let r = Registry::with_bounds(100, 10);
        r.register("a", turn(&[1; 6], None));
        r.register("b", turn(&[1; 3], None));
        assert_eq!(r.len(), 2);
        // The reply takes the total to 12 tokens: "a" is forgotten.
        r.finish("b", Arc::from(vec![2u32; 3]));
        assert!(r.get("a").is_none());
        r.register("c", turn(&[1; 2], None));
        assert!(r.get("b").is_some() && r.get("c").is_some());
        // One turn larger than the bound is still kept, alone.
        r.register("d", turn(&[1; 50], None));
        assert_eq!(r.len(), 1);
        assert!(r.get("d").is_some());
    }
}
