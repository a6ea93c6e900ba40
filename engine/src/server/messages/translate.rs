//! What only the Messages API has, mapped onto the shared request: the thinking switch and
//! effort as template variables, the fingerprints the
//! cache diagnostics compare, and the session key (Claude Code's `session_id` inside
//! `metadata.user_id`), offered in this door's order.

use serde_json::{Map, Value};

use super::types::{MessagesRequest, SectionsSent, Thinking};
use crate::diagnostics::{Fingerprint, Sections};
use crate::server::request::session::{KeySource, Offered};

/// The template variables a request's `thinking` and `output_config.effort` set, for a
/// template that reads them: `enable_thinking` (on unless `disabled`) and `reasoning_effort`
/// (`low`, `medium` or `high`; `xhigh` and `max` are `high`).
pub fn template_kwargs(
    template: &str,
    thinking: Option<Thinking>,
    effort: Option<&str>,
) -> Map<String, Value> {
    let mut kw = Map::new();
    if let Some(t) = thinking
        && template.contains("enable_thinking")
    {
        kw.insert("enable_thinking".into(), Value::Bool(t.mode.on()));
    }
    if let Some(e) = effort
        && template.contains("reasoning_effort")
    {
        let e = match e {
            "low" | "medium" => e,
            _ => "high",
        };
        kw.insert("reasoning_effort".into(), Value::String(e.into()));
    }
    kw
}

/// The fingerprints of what a prompt was built from.
pub fn sections(model: &str, s: &SectionsSent) -> Sections {
    Sections {
        model: model.to_string(),
        system: Fingerprint::of(&s.system),
        tools: Fingerprint::of_json(&s.tools),
        format: Fingerprint::of(&s.format.as_ref().map(Value::to_string)),
        options: Fingerprint::of_json(&s.options),
    }
}

/// The session key a Messages body offers: `metadata.user_id`, or the session inside it when
/// it holds Claude Code's ([`claude_session`]).
pub fn session_keys(m: &MessagesRequest) -> [Offered<'_>; 1] {
    [user_id_key(m.user_id.as_deref())]
}

/// The key a `metadata.user_id` offers.
fn user_id_key(user_id: Option<&str>) -> Offered<'_> {
    (
        user_id.map(|u| claude_session(u).unwrap_or(u)),
        KeySource::Metadata,
    )
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
            .filter(|s| !s.is_empty());
    }
    user_id
        .strip_prefix("user_")
        .and_then(|rest| rest.rsplit_once("_session_"))
        .map(|(_, session)| session)
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::messages::types::ThinkingMode;

    #[test]
    fn thinking_and_effort_reach_templates_that_read_them() {
        let on = Thinking {
            mode: ThinkingMode::Adaptive,
            omitted: false,
        };
        let off = Thinking {
            mode: ThinkingMode::Disabled,
            omitted: false,
        };
        let qwen = "{% if enable_thinking is defined and enable_thinking is false %}";
        assert_eq!(
            template_kwargs(qwen, Some(off), None).get("enable_thinking"),
            Some(&Value::Bool(false))
        );
        assert_eq!(
            template_kwargs(qwen, Some(on), Some("max")).get("enable_thinking"),
            Some(&Value::Bool(true))
        );
        // A template without the switch gets nothing (its own default stands).
        assert!(template_kwargs("{{ messages }}", Some(off), Some("low")).is_empty());
        let oss = "Reasoning: {{ reasoning_effort }}";
        assert_eq!(
            template_kwargs(oss, None, Some("xhigh")).get("reasoning_effort"),
            Some(&Value::String("high".into()))
        );
        assert_eq!(
            template_kwargs(oss, None, Some("low")).get("reasoning_effort"),
            Some(&Value::String("low".into()))
        );
        // No thinking field: the template's default stands.
        assert!(template_kwargs(qwen, None, None).is_empty());
    }

    #[test]
    fn messages_take_claude_codes_session_id_else_the_user_id() {
        use crate::server::request::session::{SessionKey, resolve};
        let none = axum::http::HeaderMap::new();
        let key = |user_id| resolve(&none, [user_id_key(user_id)]);
        let metadata = |id: &str| SessionKey::new(id, KeySource::Metadata);
        let claude = r#"{"device_id":"d1","account_uuid":"","session_id":"3f2a-77"}"#;
        assert_eq!(key(Some(claude)), metadata("3f2a-77"));
        let legacy = "user_ab12_account_9c_session_5e6f-aa";
        assert_eq!(key(Some(legacy)), metadata("5e6f-aa"));
        assert_eq!(key(Some("alice")), metadata("alice"));
        // A JSON object without a session id is an opaque string like any other.
        let no_session = r#"{"device_id":"d1"}"#;
        assert_eq!(key(Some(no_session)), metadata(no_session));
        assert_eq!(key(Some("")), None);
        assert_eq!(key(None), None);
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
}
