//! Chat completions' and completions' bodies into the shared request. Their bodies are the
//! shared request's own JSON shape ([`crate::server::request::parse`]): read, validated into a
//! [`ValidRequest`], and their session keys offered in this door's order.

use serde_json::Value;

use crate::server::error::ApiError;
use crate::server::request::input::{ChatRequest, CompletionRequest};
use crate::server::request::session::{KeySource, Offered};
use crate::server::request::{Api, ValidRequest};
use crate::server::state::AppState;

/// The two generation APIs of this door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
}

impl Kind {
    /// The API it is on the request path.
    pub fn api(self) -> Api {
        match self {
            Kind::Chat => Api::Chat,
            Kind::Completions => Api::Completions,
        }
    }
}

/// The valid request of a body of `kind`: read, checked, its prompt built and its grammar
/// compiled, or refused.
pub async fn valid_request(st: &AppState, kind: Kind, v: Value) -> Result<ValidRequest, ApiError> {
    match kind {
        Kind::Chat => ValidRequest::chat(st, Api::Chat, ChatRequest::from_json(v)?).await,
        Kind::Completions => ValidRequest::completion(st, CompletionRequest::from_json(v)?).await,
    }
}

/// The session keys a chat completions or completions body offers, in this door's order:
/// `prompt_cache_key`, then `user` (or `safety_identifier`).
pub fn session_keys(req: &ValidRequest) -> [Offered<'_>; 2] {
    let o = &req.opts;
    [
        (o.prompt_cache_key.as_deref(), KeySource::PromptCacheKey),
        (o.user.as_deref(), KeySource::User),
    ]
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderMap;

    use super::*;
    use crate::server::request::session::{SessionKey, resolve};

    fn key(id: &str, source: KeySource) -> Option<SessionKey> {
        SessionKey::new(id, source)
    }

    #[test]
    fn chat_takes_the_cache_key_then_the_user() {
        let none = HeaderMap::new();
        let offered = |pck, user| [(pck, KeySource::PromptCacheKey), (user, KeySource::User)];
        assert_eq!(
            resolve(&none, offered(Some("pck"), Some("u"))),
            key("pck", KeySource::PromptCacheKey)
        );
        assert_eq!(
            resolve(&none, offered(Some(""), Some("u"))),
            key("u", KeySource::User)
        );
        assert_eq!(resolve(&none, offered(None, None)), None);
    }
}
