//! Reading a request body: whole, bounded in size and time, parsed as JSON; and taking a
//! JSON object apart field by field ([`Fields`]), so that nothing is silently ignored: every
//! field is taken by name with its own type check, and what is left is refused, naming it.

use axum::body::Body;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::ApiError;

/// Reads the body up to `limit` bytes within `deadline` and parses it as JSON; errors typed
/// ([`ApiError`]), answered in the shape of the API that reads it. The deadline stops a client that sends its body a byte at a time from
/// holding a connection and its task forever (408 `request_timeout`); nothing is admitted to
/// the scheduler before the body is whole, so a slow sender never holds a slot.
pub async fn read_json<T: DeserializeOwned>(
    body: Body,
    limit: usize,
    deadline: std::time::Duration,
) -> Result<T, ApiError> {
    let read = tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await;
    let Ok(read) = read else {
        return Err(ApiError::request_timeout(deadline));
    };
    let bytes = match read {
        Ok(b) => b,
        Err(e) => {
            // axum documents the limit's error as the source: a type, not a message.
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return Err(if too_large {
                ApiError::too_large(limit)
            } else {
                ApiError::invalid(format!("could not read the request body: {e}"))
            });
        }
    };
    if bytes.is_empty() {
        return Err(ApiError::invalid(
            "the request body is empty; send a JSON object",
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                "malformed JSON"
            }
            _ => "invalid request",
        };
        ApiError::invalid(format!("{what}: {e}"))
    })
}

/// A request body's fields being taken apart.
#[derive(Debug)]
pub struct Fields {
    map: Map<String, Value>,
    /// The path of this object in the request (`""` at the top, `stream_options.` inside).
    prefix: String,
}

impl Fields {
    /// The body, which must be a JSON object.
    pub fn new(v: Value, prefix: &str) -> Result<Self, ApiError> {
        match v {
            Value::Object(map) => Ok(Self {
                map,
                prefix: prefix.to_string(),
            }),
            other => {
                let what = if prefix.is_empty() {
                    "the request body".to_string()
                } else {
                    format!("`{}`", prefix.trim_end_matches('.'))
                };
                let err = format!("{what} must be a JSON object, not {}", kind_of(&other));
                if prefix.is_empty() {
                    Err(ApiError::invalid(err))
                } else {
                    Err(ApiError::invalid_param(prefix.trim_end_matches('.'), err))
                }
            }
        }
    }

    fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Takes `key` as a `T`; absent or `null` is `None`, a wrong type is a 400 naming it.
    pub fn take<T: DeserializeOwned>(&mut self, key: &str) -> Result<Option<T>, ApiError> {
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => serde_json::from_value(v).map(Some).map_err(|e| {
                let p = self.path(key);
                ApiError::invalid_param(&p, format!("`{p}`: {e}"))
            }),
        }
    }

    /// Takes `key` as a raw JSON value (absent or `null` is `None`).
    pub fn take_value(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    /// Takes `key`, refusing it unless `accepted` holds for its value.
    pub fn refuse_unless(
        &mut self,
        key: &str,
        accepted: impl Fn(&Value) -> bool,
        why: &str,
    ) -> Result<(), ApiError> {
        match self.map.remove(key) {
            Some(v) if !v.is_null() && !accepted(&v) => {
                let p = self.path(key);
                let mut e = ApiError::invalid_param(&p, format!("`{p}`: {why}"));
                e.code = Some("unsupported_parameter");
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// Refuses whatever is left, as unknown fields.
    pub fn finish(self) -> Result<(), ApiError> {
        self.finish_with(&[])
    }

    /// Refuses whatever is left: fields of `refused` (top level only) with their reason,
    /// others as unknown.
    pub fn finish_with(mut self, refused: &[(&str, &str)]) -> Result<(), ApiError> {
        self.map.retain(|_, v| !v.is_null());
        let Some(key) = self.map.keys().next().cloned() else {
            return Ok(());
        };
        let p = self.path(&key);
        let why = refused
            .iter()
            .find(|(k, _)| self.prefix.is_empty() && *k == key)
            .map_or_else(
                || {
                    format!(
                        "unknown field `{p}`: slotlight refuses fields it does not implement rather than ignore them"
                    )
                },
                |(_, why)| format!("`{p}`: {why}"),
            );
        let mut e = ApiError::invalid_param(&p, why);
        e.code = Some("unsupported_parameter");
        Err(e)
    }
}

/// What kind of JSON value `v` is, for error messages (`a string`, `an array`).
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
