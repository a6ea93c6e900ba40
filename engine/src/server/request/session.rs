//! A request's session key, and how it was found.
//!
//! Every front door resolves its requests' keys here, in one order: the `x-session-id` header
//! first; then what the door's own body says, in that door's order (Responses:
//! `conversation`, the session of the `previous_response_id` chain, `prompt_cache_key`;
//! Messages: `metadata.user_id`, its `session_id` when it holds Claude Code's JSON object;
//! chat and completions: `prompt_cache_key`, `user`, `safety_identifier`). A request with no
//! key may still join a session: the engine finds it when the prompt extends the whole of an
//! earlier turn ([`crate::scheduler::resume`]), and the key's source is then
//! [`KeySource::Found`].

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
            }),
            (Some(k), t) => Some(Self {
                id: k.id,
                source: k.source,
                turn: t.map(|t| t.index),
                extends: None,
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

/// The first usable key of `candidates`, in order.
fn first<'a>(
    candidates: impl IntoIterator<Item = (Option<&'a str>, KeySource)>,
) -> Option<SessionKey> {
    candidates
        .into_iter()
        .find_map(|(id, source)| id.and_then(|id| SessionKey::new(id, source)))
}

/// What a chat completions or completions body offers as a key.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatKeys<'a> {
    /// `prompt_cache_key`.
    pub prompt_cache_key: Option<&'a str>,
    /// `user`.
    pub user: Option<&'a str>,
    /// `safety_identifier` (OpenAI's replacement for `user`).
    pub safety_identifier: Option<&'a str>,
}

/// The key of a chat completions or completions request: the header, else
/// `prompt_cache_key`, else `user`, else `safety_identifier`.
pub fn chat(headers: &HeaderMap, body: ChatKeys<'_>) -> Option<SessionKey> {
    from_header(headers).or_else(|| {
        first([
            (body.prompt_cache_key, KeySource::PromptCacheKey),
            (body.user, KeySource::User),
            (body.safety_identifier, KeySource::User),
        ])
    })
}

/// What a Responses body offers as a key.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponsesKeys<'a> {
    /// `conversation` (its id, whether the body gave a string or `{"id": ...}`).
    pub conversation: Option<&'a str>,
    /// The session of the stored response named by `previous_response_id` (the response
    /// store remembers each chain's session).
    pub chain: Option<&'a str>,
    /// `prompt_cache_key`.
    pub prompt_cache_key: Option<&'a str>,
    /// `user`, else `safety_identifier`.
    pub user: Option<&'a str>,
}

/// The key of a Responses request: the header, else `conversation`, else the chain's
/// session, else `prompt_cache_key`, else `user`.
pub fn responses(headers: &HeaderMap, body: ResponsesKeys<'_>) -> Option<SessionKey> {
    from_header(headers).or_else(|| {
        first([
            (body.conversation, KeySource::Conversation),
            (body.chain, KeySource::ResponseChain),
            (body.prompt_cache_key, KeySource::PromptCacheKey),
            (body.user, KeySource::User),
        ])
    })
}

/// The key of a Messages request: the header, else `metadata.user_id` ([`claude_session`]).
pub fn messages(headers: &HeaderMap, metadata_user_id: Option<&str>) -> Option<SessionKey> {
    from_header(headers).or_else(|| {
        let user_id = metadata_user_id?;
        let id = claude_session(user_id).unwrap_or(user_id);
        SessionKey::new(id, KeySource::Metadata)
    })
}

/// The session inside a Messages `metadata.user_id` as Claude Code writes it: a JSON object
/// with a string `session_id` (`{"device_id": …, "account_uuid": …, "session_id": …}`), or
/// the older `user_<hash>_account_<uuid>_session_<uuid>`. `None` for anything else (the
/// string itself is then the key).
pub fn claude_session(user_id: &str) -> Option<&str> {
    let trimmed = user_id.trim_start();
    if trimmed.starts_with('{') {
        // Borrowed from the input: Claude Code's ids are plain ASCII, never escaped.
        #[derive(serde::Deserialize)]
        struct Ids<'a> {
            #[serde(borrow)]
            session_id: Option<&'a str>,
        }
        return serde_json::from_str::<Ids<'_>>(trimmed)
            .ok()
            .and_then(|ids| ids.session_id)
            .and_then(usable);
    }
    user_id
        .strip_prefix("user_")
        .and_then(|rest| rest.rsplit_once("_session_"))
        .map(|(_, session)| session)
        .and_then(usable)
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
    fn chat_takes_the_header_then_the_body_in_order() {
        let all = ChatKeys {
            prompt_cache_key: Some("pck"),
            user: Some("u"),
            safety_identifier: Some("si"),
        };
        assert_eq!(chat(&header("h"), all), key("h", KeySource::Header));
        let none = HeaderMap::new();
        assert_eq!(chat(&none, all), key("pck", KeySource::PromptCacheKey));
        let user = ChatKeys {
            prompt_cache_key: Some(""),
            ..all
        };
        assert_eq!(chat(&none, user), key("u", KeySource::User));
        let safety = ChatKeys {
            safety_identifier: Some("si"),
            ..ChatKeys::default()
        };
        assert_eq!(chat(&none, safety), key("si", KeySource::User));
        assert_eq!(chat(&none, ChatKeys::default()), None);
        // An empty or oversized header is no key: the body's is taken.
        assert_eq!(
            chat(&header(""), all),
            key("pck", KeySource::PromptCacheKey)
        );
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        assert_eq!(
            chat(&header(&long), all),
            key("pck", KeySource::PromptCacheKey)
        );
        assert_eq!(
            chat(&header(&long[1..]), all).map(|k| k.id.len()),
            Some(MAX_KEY_BYTES)
        );
    }

    #[test]
    fn responses_take_conversation_then_chain_then_cache_key_then_user() {
        let none = HeaderMap::new();
        let all = ResponsesKeys {
            conversation: Some("conv_1"),
            chain: Some("chain-s"),
            prompt_cache_key: Some("codex-thread"),
            user: Some("u"),
        };
        assert_eq!(responses(&header("h"), all), key("h", KeySource::Header));
        assert_eq!(
            responses(&none, all),
            key("conv_1", KeySource::Conversation)
        );
        let chain = ResponsesKeys {
            conversation: None,
            ..all
        };
        assert_eq!(
            responses(&none, chain),
            key("chain-s", KeySource::ResponseChain)
        );
        let codex = ResponsesKeys {
            conversation: None,
            chain: None,
            ..all
        };
        assert_eq!(
            responses(&none, codex),
            key("codex-thread", KeySource::PromptCacheKey)
        );
        let user = ResponsesKeys {
            user: Some("u"),
            ..ResponsesKeys::default()
        };
        assert_eq!(responses(&none, user), key("u", KeySource::User));
        assert_eq!(responses(&none, ResponsesKeys::default()), None);
    }

    #[test]
    fn messages_take_claude_codes_session_id_else_the_user_id() {
        let none = HeaderMap::new();
        let claude = r#"{"device_id":"d1","account_uuid":"","session_id":"3f2a-77"}"#;
        assert_eq!(
            messages(&none, Some(claude)),
            key("3f2a-77", KeySource::Metadata)
        );
        let legacy = "user_ab12_account_9c_session_5e6f-aa";
        assert_eq!(
            messages(&none, Some(legacy)),
            key("5e6f-aa", KeySource::Metadata)
        );
        assert_eq!(
            messages(&none, Some("alice")),
            key("alice", KeySource::Metadata)
        );
        // A JSON object without a session id is an opaque string like any other.
        let no_session = r#"{"device_id":"d1"}"#;
        assert_eq!(
            messages(&none, Some(no_session)),
            key(no_session, KeySource::Metadata)
        );
        assert_eq!(messages(&none, Some("")), None);
        assert_eq!(messages(&none, None), None);
        assert_eq!(
            messages(&header("h"), Some(claude)),
            key("h", KeySource::Header)
        );
    }

    #[test]
    fn claude_session_reads_only_claude_codes_shapes() {
        assert_eq!(claude_session(r#" {"session_id":"s"}"#), Some("s"));
        assert_eq!(claude_session(r#"{"session_id":""}"#), None);
        assert_eq!(claude_session(r#"{"session_id":7}"#), None);
        assert_eq!(claude_session("{not json"), None);
        assert_eq!(claude_session("user_x_session_"), None);
        assert_eq!(claude_session("someone_session_s"), None);
    }

    #[test]
    fn a_turn_session_is_the_key_or_the_found_session() {
        let k = key("k", KeySource::Header);
        let keyed = SessionTurn {
            id: "k".into(),
            index: 3,
            found: false,
            extends: None,
        };
        let s = TurnSession::of(k.clone(), Some(keyed)).expect("session");
        assert_eq!(
            (s.id.as_str(), s.source, s.turn),
            ("k", KeySource::Header, Some(3))
        );
        // Refused by the engine: the key, no turn.
        let s = TurnSession::of(k, None).expect("session");
        assert_eq!(s.turn, None);
        let found = SessionTurn {
            id: "found-1".into(),
            index: 1,
            found: true,
            extends: Some("chatcmpl-0".into()),
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
