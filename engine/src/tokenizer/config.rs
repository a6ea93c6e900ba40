//! `tokenizer_config.json` of a Hugging Face model folder: special tokens and chat templates.

use std::path::Path;

use serde_json::Value;

use super::TokenizerError;

/// The parts of `tokenizer_config.json` the engine uses. Unknown fields are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerConfig {
    /// `bos_token`: a string, or an added-token object whose `content` is taken.
    pub bos_token: Option<String>,
    /// `eos_token`: a string, or an added-token object whose `content` is taken.
    pub eos_token: Option<String>,
    /// `add_bos_token`, when present (informational: the `tokenizer.json` post-processor is
    /// what adds BOS).
    pub add_bos_token: Option<bool>,
    /// `add_eos_token`, when present (informational, like `add_bos_token`).
    pub add_eos_token: Option<bool>,
    /// Chat templates by name. A plain string `chat_template` is stored as `"default"`; the
    /// list form (`[{"name": .., "template": ..}]`) keeps its names and order.
    pub chat_templates: Vec<(String, String)>,
}

impl TokenizerConfig {
    /// Reads `tokenizer_config.json`. When it has no `chat_template`, a sibling
    /// `chat_template.jinja` (how recent `transformers` saves it) or `chat_template.json`
    /// (`{"chat_template": ..}`) is used instead, if present.
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let text = read(path)?;
        let mut cfg = Self::parse(&text, &path.display().to_string())?;
        if cfg.chat_templates.is_empty() {
            let jinja = path.with_file_name("chat_template.jinja");
            let json = path.with_file_name("chat_template.json");
            if jinja.is_file() {
                cfg.chat_templates
                    .push(("default".to_owned(), read(&jinja)?));
            } else if json.is_file() {
                let v: Value =
                    serde_json::from_str(&read(&json)?).map_err(|e| TokenizerError::Parse {
                        path: json.display().to_string(),
                        message: e.to_string(),
                    })?;
                cfg.chat_templates =
                    templates(v.get("chat_template"), &json.display().to_string())?;
            }
        }
        Ok(cfg)
    }

    /// Parses the JSON text of a `tokenizer_config.json`.
    pub fn from_json_str(text: &str) -> Result<Self, TokenizerError> {
        Self::parse(text, "tokenizer_config.json")
    }

    fn parse(text: &str, path: &str) -> Result<Self, TokenizerError> {
        let parse_err = |message: String| TokenizerError::Parse {
            path: path.to_owned(),
            message,
        };
        let v: Value = serde_json::from_str(text).map_err(|e| parse_err(e.to_string()))?;
        if !v.is_object() {
            return Err(parse_err("expected a JSON object".into()));
        }
        let token = |key: &str| -> Result<Option<String>, TokenizerError> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(Value::Object(o)) => match o.get("content") {
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    _ => Err(parse_err(format!("{key} has no string \"content\""))),
                },
                Some(_) => Err(parse_err(format!(
                    "{key} must be a string or a token object"
                ))),
            }
        };
        let flag = |key: &str| -> Result<Option<bool>, TokenizerError> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(_) => Err(parse_err(format!("{key} must be true or false"))),
            }
        };
        Ok(Self {
            bos_token: token("bos_token")?,
            eos_token: token("eos_token")?,
            add_bos_token: flag("add_bos_token")?,
            add_eos_token: flag("add_eos_token")?,
            chat_templates: templates(v.get("chat_template"), path)?,
        })
    }

    /// The chat template to use by default: the one named `"default"`, else the first.
    pub fn chat_template(&self) -> Option<&str> {
        self.named_chat_template("default")
            .or_else(|| self.chat_templates.first().map(|(_, t)| t.as_str()))
    }

    /// A chat template by name (e.g. `"tool_use"`).
    pub fn named_chat_template(&self, name: &str) -> Option<&str> {
        self.chat_templates
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    }
}

fn read(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|e| TokenizerError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// `chat_template` as a string or a list of `{name, template}`.
fn templates(v: Option<&Value>, path: &str) -> Result<Vec<(String, String)>, TokenizerError> {
    let bad = |message: &str| TokenizerError::Parse {
        path: path.to_owned(),
        message: message.to_owned(),
    };
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![("default".to_owned(), s.clone())]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                match (
                    item.get("name").and_then(Value::as_str),
                    item.get("template").and_then(Value::as_str),
                ) {
                    (Some(n), Some(t)) => Ok((n.to_owned(), t.to_owned())),
                    _ => Err(bad(
                        "each chat_template entry needs string \"name\" and \"template\"",
                    )),
                }
            })
            .collect(),
        Some(_) => Err(bad("chat_template must be a string or a list")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_token_objects() {
        let c = TokenizerConfig::from_json_str(
            r#"{
                "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
                "eos_token": "</s>",
                "unk_token": null,
                "add_bos_token": true,
                "chat_template": "{{ messages }}",
                "model_max_length": 1000000000000000019884624838656
            }"#,
        )
        .expect("parses");
        assert_eq!(c.bos_token.as_deref(), Some("<s>"));
        assert_eq!(c.eos_token.as_deref(), Some("</s>"));
        assert_eq!(c.add_bos_token, Some(true));
        assert_eq!(c.add_eos_token, None);
        assert_eq!(c.chat_template(), Some("{{ messages }}"));
    }

    #[test]
    fn named_templates() {
        let c = TokenizerConfig::from_json_str(
            r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
        )
        .expect("parses");
        assert_eq!(c.chat_template(), Some("D"));
        assert_eq!(c.named_chat_template("tool_use"), Some("T"));
        assert_eq!(c.named_chat_template("rag"), None);
        let c = TokenizerConfig::from_json_str(
            r#"{"chat_template": [{"name": "only", "template": "O"}]}"#,
        )
        .expect("parses");
        assert_eq!(c.chat_template(), Some("O"));
        let c = TokenizerConfig::from_json_str("{}").expect("parses");
        assert_eq!(c, TokenizerConfig::default());
        assert_eq!(c.chat_template(), None);
    }

    #[test]
    fn malformed_configs_are_errors() {
        for bad in [
            "not json",
            "[]",
            r#"{"bos_token": 3}"#,
            r#"{"eos_token": {"special": true}}"#,
            r#"{"add_bos_token": "yes"}"#,
            r#"{"chat_template": 1}"#,
            r#"{"chat_template": [{"name": "x"}]}"#,
        ] {
            let err = TokenizerConfig::from_json_str(bad).expect_err(bad);
            assert!(
                matches!(err, TokenizerError::Parse { .. }),
                "{bad}: {err:?}"
            );
            assert!(
                err.to_string()
                    .starts_with("cannot parse tokenizer_config.json: ")
            );
        }
    }

    #[test]
    fn sibling_template_files() {
        let dir = std::env::temp_dir().join(format!("slotlight-tokcfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let cfg = dir.join("tokenizer_config.json");
        std::fs::write(&cfg, r#"{"eos_token": "<|im_end|>"}"#).expect("writes");
        assert_eq!(
            TokenizerConfig::from_file(&cfg)
                .expect("reads")
                .chat_template(),
            None
        );
        std::fs::write(dir.join("chat_template.json"), r#"{"chat_template": "J"}"#)
            .expect("writes");
        assert_eq!(
            TokenizerConfig::from_file(&cfg)
                .expect("reads")
                .chat_template(),
            Some("J")
        );
        std::fs::write(dir.join("chat_template.jinja"), "JINJA").expect("writes");
        assert_eq!(
            TokenizerConfig::from_file(&cfg)
                .expect("reads")
                .chat_template(),
            Some("JINJA")
        );
        std::fs::write(&cfg, r#"{"chat_template": "INLINE"}"#).expect("writes");
        assert_eq!(
            TokenizerConfig::from_file(&cfg)
                .expect("reads")
                .chat_template(),
            Some("INLINE")
        );
        std::fs::remove_dir_all(&dir).ok();
        let err = TokenizerConfig::from_file(&dir.join("tokenizer_config.json")).expect_err("gone");
        assert!(matches!(err, TokenizerError::Io { .. }));
    }
}
