//! `prediction` (OpenAI's Predicted Outputs): the reply the client expects, which the engine
//! drafts from. Chat completions and completions take it as OpenAI documents it; the Responses
//! and Messages doors take the same object as an extension.

use serde_json::Value;

use crate::server::body::Fields;
use crate::server::error::ApiError;
use crate::server::request::input::Content;

/// `prediction`: `{"type": "content", "content": ...}`, the content a string or a list of
/// `{"type": "text", "text": ...}` parts (joined), as OpenAI's Predicted Outputs take it.
pub fn parse_prediction(v: Value) -> Result<String, ApiError> {
    let mut b = Fields::new(v, "prediction.")?;
    let kind: Option<String> = b.take("type")?;
    if kind.as_deref() != Some("content") {
        return Err(ApiError::invalid_param(
            "prediction.type",
            format!(
                "`prediction.type` must be `content`, not `{}`",
                kind.unwrap_or_default()
            ),
        ));
    }
    let text = match b.take::<Content>("content")? {
        None => {
            return Err(ApiError::invalid_param(
                "prediction.content",
                "`prediction` needs a `content`",
            ));
        }
        Some(Content::Text(t)) => t,
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (i, p) in parts.into_iter().enumerate() {
                match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    _ => {
                        return Err(ApiError::invalid_param(
                            &format!("prediction.content[{i}]"),
                            "a prediction's content parts must be `{\"type\": \"text\", \"text\": ...}`",
                        ));
                    }
                }
            }
            text
        }
    };
    b.finish()?;
    Ok(text)
}
