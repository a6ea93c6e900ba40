//! A request's session key, and how it was found.
//!
//! Every front door resolves its requests' keys here, with one resolver ([`resolve`]): the
//! `x-session-id` header first; then the keys the door's body offers, in that door's order,
//! which each door lists in its `translate` (Responses: `conversation`, the session of the
//! `previous_response_id` chain, `prompt_cache_key`, `user`; Messages: `metadata.user_id`,
//! its `session_id` when it holds Claude Code's JSON object; chat and completions:
//! `prompt_cache_key`, `user` or `safety_identifier`). A request with no key may still join a
//! session: the engine finds it when the prompt extends the whole of an earlier turn
//! ([`crate::scheduler::resume`]), and the key's source is then [`KeySource::Found`].

use axum::http::HeaderMap;
use serde::Serialize;
use slotlight_otel::attr::value;

use crate::scheduler::SessionTurn;

/// The header that names a session, whatever the API.
pub const SESSION_HEADER: &str = "x-session-id";

/// The longest key taken, in bytes; a longer one is ignored (never truncated: two long keys
/// that share a beginning are different sessions).
pub const MAX_KEY_BYTES: usize = 256;

/// Where a request's session key came from (`slotlight.session.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    /// The `x-session-id` header.
    Header,
    /// The Responses API's `conversation` (its id).
    Conversation,
    /// The session of the stored response a Responses request continues
    /// (`previous_response_id`).
    ResponseChain,
    /// `prompt_cache_key` (Codex sends its conversation id there).
    PromptCacheKey,
    /// The Messages API's `metadata.user_id`.
    Metadata,
    /// `user`, else `safety_identifier`.
    User,
    /// No key: the engine found the turn this prompt extends.
    Found,
}

impl KeySource {
    /// The contract's value.
    pub fn as_str(self) -> &'static str {
        match self {
            KeySource::Header => value::SESSION_SOURCE_HEADER,
            KeySource::Conversation => value::SESSION_SOURCE_CONVERSATION,
            KeySource::ResponseChain => value::SESSION_SOURCE_RESPONSE_CHAIN,
            KeySource::PromptCacheKey => value::SESSION_SOURCE_PROMPT_CACHE_KEY,
            KeySource::Metadata => value::SESSION_SOURCE_METADATA,
            KeySource::User => value::SESSION_SOURCE_USER,
            KeySource::Found => value::SESSION_SOURCE_FOUND,
        }
    }
}

/// A request's session: its id and how it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionKey {
    /// The session id (`gen_ai.conversation.id`, `session.id`).
    pub id: String,
    /// Where it came from (`slotlight.session.source`).
    pub source: KeySource,
}

impl SessionKey {
    /// `id` from `source`, when it is a usable key: not empty and at most [`MAX_KEY_BYTES`].
    pub fn new(id: &str, source: KeySource) -> Option<Self> {
        usable(id).map(|id| Self {
            id: id.to_string(),
            source,
        })
    }
}

/// A launched request's session, as its span, log line and response say it: the key (the
/// client's, or the engine's for a found session) and the turn's place in the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnSession {
    /// The session id.
    pub id: String,
    /// How the key was found.
    pub source: KeySource,
    /// The turn's index in its session (`None` when the engine never took the request).
    pub turn: Option<u64>,
    /// For a found session's turn 1: the request id of the turn it extends.
    pub extends: Option<String>,
    /// The session branch the turn extends or starts (`None` when the engine never took the
    /// request).
    pub branch: Option<u32>,
    /// Whether the turn is a side call: its prompt does not extend the session's main
    /// conversation.
    pub side_call: bool,
}

impl TurnSession {
    /// The session of a request whose key was `key` and which the engine placed as `turn`
    /// (`None`: the engine refused it, or it has no session).
    pub fn of(key: Option<SessionKey>, turn: Option<SessionTurn>) -> Option<Self> {
        match (key, turn) {
            (_, Some(t)) if t.found => Some(Self {
                id: t.id,
                source: KeySource::Found,
                turn: Some(t.index),
                extends: t.extends,
                branch: Some(t.branch),
                side_call: t.side_call,
            }),
            (Some(k), t) => Some(Self {
                id: k.id,
                source: k.source,
                turn: t.as_ref().map(|t| t.index),
                extends: None,
                branch: t.as_ref().map(|t| t.branch),
                side_call: t.is_some_and(|t| t.side_call),
            }),
            (None, _) => None,
        }
    }
}

fn usable(id: &str) -> Option<&str> {
    (!id.is_empty() && id.len() <= MAX_KEY_BYTES).then_some(id)
}

/// The `x-session-id` header's key, when the request sent a usable one.
pub fn from_header(headers: &HeaderMap) -> Option<SessionKey> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| SessionKey::new(v, KeySource::Header))
}

/// A key a request's body offers, and where it comes from. Each door lists the keys its body
/// offers in its own order of preference (in its `translate`); [`resolve`] picks one, the
/// same way for every door.
pub type Offered<'a> = (Option<&'a str>, KeySource);

/// The one session resolver of every door: the `x-session-id` header, else the first usable
/// key the body offers, in the door's order (an empty or oversized key is passed over).
pub fn resolve<'a>(
    headers: &HeaderMap,
    offered: impl IntoIterator<Item = Offered<'a>>,
) -> Option<SessionKey> {
    from_header(headers).or_else(|| {
        offered
            .into_iter()
            .find_map(|(id, source)| id.and_then(|id| SessionKey::new(id, source)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn header(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(SESSION_HEADER, HeaderValue::from_str(v).expect("header"));
        h
    }

    fn key(id: &str, source: KeySource) -> Option<SessionKey> {
        Some(SessionKey {
            id: id.into(),
            source,
        })
    }

    #[test]
    fn the_header_comes_first_then_the_first_usable_offered_key() {
        let offered = [
            (None, KeySource::Conversation),
            (Some(""), KeySource::ResponseChain),
            (Some("pck"), KeySource::PromptCacheKey),
            (Some("u"), KeySource::User),
        ];
        assert_eq!(resolve(&header("h"), offered), key("h", KeySource::Header));
        let none = HeaderMap::new();
        assert_eq!(
            resolve(&none, offered),
            key("pck", KeySource::PromptCacheKey)
        );
        assert_eq!(resolve(&none, []), None);
        // An empty or oversized header is no key: the body's is taken.
        assert_eq!(
            resolve(&header(""), offered),
            key("pck", KeySource::PromptCacheKey)
        );
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        assert_eq!(
            resolve(&header(&long), offered),
            key("pck", KeySource::PromptCacheKey)
        );
        assert_eq!(
            resolve(&header(&long[1..]), offered).map(|k| k.id.len()),
            Some(MAX_KEY_BYTES)
        );
        let oversized = [
            (Some(long.as_str()), KeySource::User),
            (Some("u"), KeySource::User),
        ];
        assert_eq!(resolve(&none, oversized), key("u", KeySource::User));
    }

    #[test]
    fn a_turn_session_is_the_key_or_the_found_session() {
        let k = key("k", KeySource::Header);
        let keyed = SessionTurn {
            id: "k".into(),
            index: 3,
            found: false,
            extends: None,
            branch: 2,
            side_call: true,
        };
        let s = TurnSession::of(k.clone(), Some(keyed)).expect("session");
        assert_eq!(
            (s.id.as_str(), s.source, s.turn, s.branch, s.side_call),
            ("k", KeySource::Header, Some(3), Some(2), true)
        );
        // Refused by the engine: the key, no turn.
        let s = TurnSession::of(k, None).expect("session");
        assert_eq!((s.turn, s.branch, s.side_call), (None, None, false));
        let found = SessionTurn {
            id: "found-1".into(),
            index: 1,
            found: true,
            extends: Some("chatcmpl-0".into()),
            branch: 0,
            side_call: false,
        };
        let s = TurnSession::of(None, Some(found)).expect("found");
        assert_eq!(
            (s.id.as_str(), s.source, s.turn, s.extends.as_deref()),
            ("found-1", KeySource::Found, Some(1), Some("chatcmpl-0"))
        );
        assert_eq!(TurnSession::of(None, None), None);
    }

    #[test]
    fn sources_are_the_contracts_values() {
        let all = [
            KeySource::Header,
            KeySource::Conversation,
            KeySource::ResponseChain,
            KeySource::PromptCacheKey,
            KeySource::Metadata,
            KeySource::User,
            KeySource::Found,
        ];
        for s in all {
            let json = serde_json::to_value(s).expect("json");
            assert_eq!(json, s.as_str(), "{s:?}");
        }
    }
}
