//! Structured outputs: a per-step token mask from a JSON schema, a regular expression, a list
//! of choices or a Lark grammar, computed with `llguidance` (what vLLM and llama.cpp use).
//!
//! llguidance walks a token trie built from every token's bytes ([`TokenBytes`]); its
//! `toktrie_hf_tokenizers` companion pins another major version of `tokenizers`, so
//! [`TokenEnv`] implements toktrie's small `TokenizerEnv` trait over the engine's own tokenizer
//! instead. One [`Compiler`] per model holds the trie and the lexer slices shared by every
//! request; [`Compiler::compile`] turns a [`GrammarSpec`] into a [`Constraint`] (or a
//! [`ConstraintError`] that says why not, answered as a 400 before the request is queued).
//!
//! In the step loop a constrained sequence computes its mask while the forward step runs (on a
//! helper thread, so the mask costs the batch `max(forward, mask)`, not their sum), applies it
//! to its logits (disallowed tokens get `-inf`) before sampling, and feeds the sampled token
//! back; when the grammar is complete the sequence stops.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{self, SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::tokenizer::{TokenBytes, Tokenizer};

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON value valid against this JSON schema (`{"type": "object"}` for `json_object`).
    JsonSchema(Value),
    /// Text matching this regular expression (Rust `regex` syntax), as a whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax (may embed `%json {...}` schemas).
    Lark(String),
}

/// The kind of an output constraint: what the request asked for, named as the telemetry
/// contract names it (`slotlight.constraint.kind`) only where the attribute is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstraintKind {
    /// Any JSON object (`response_format` `json_object` without a schema).
    JsonObject,
    /// JSON valid against a schema.
    JsonSchema,
    /// Text matching a regular expression.
    Regex,
    /// One of a list of strings.
    Choice,
    /// A Lark grammar.
    Grammar,
    /// Enforced tool calls.
    Tools,
}

impl ConstraintKind {
    /// The contract's value of `slotlight.constraint.kind`.
    pub fn as_str(self) -> &'static str {
        use slotlight_otel::attr::value;
        match self {
            ConstraintKind::JsonObject => value::CONSTRAINT_JSON_OBJECT,
            ConstraintKind::JsonSchema => value::CONSTRAINT_JSON_SCHEMA,
            ConstraintKind::Regex => value::CONSTRAINT_REGEX,
            ConstraintKind::Choice => value::CONSTRAINT_CHOICE,
            ConstraintKind::Grammar => value::CONSTRAINT_GRAMMAR,
            ConstraintKind::Tools => value::CONSTRAINT_TOOLS,
        }
    }

    /// Whether the constrained output is JSON (`gen_ai.output.type` `json`).
    pub fn is_json(self) -> bool {
        matches!(
            self,
            ConstraintKind::JsonObject | ConstraintKind::JsonSchema
        )
    }
}

impl GrammarSpec {
    /// The kind of constraint this grammar makes.
    pub fn kind(&self) -> ConstraintKind {
        match self {
            GrammarSpec::JsonSchema(_) => ConstraintKind::JsonSchema,
            GrammarSpec::Regex(_) => ConstraintKind::Regex,
            GrammarSpec::Choice(_) => ConstraintKind::Choice,
            GrammarSpec::Lark(_) => ConstraintKind::Grammar,
        }
    }

    /// The JSON layout generated JSON takes unless the schema says otherwise (its own
    /// `x-guidance` object): compact, no free whitespace. Free whitespace lets a small model
    /// emit newlines forever inside a valid object; compact JSON is what every parser reads.
    pub fn json_defaults(mut schema: Value) -> Value {
        if let Value::Object(m) = &mut schema
            && !m.contains_key("x-guidance")
        {
            m.insert(
                "x-guidance".into(),
                json!({"whitespace_flexible": false, "item_separator": ",", "key_separator": ":"}),
            );
        }
        schema
    }

    fn to_grammar(&self) -> Result<TopLevelGrammar, ConstraintError> {
        match self {
            GrammarSpec::JsonSchema(schema) => {
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(ConstraintError::Invalid(
                        "a JSON schema must be an object".into(),
                    ));
                }
                Ok(TopLevelGrammar::from_json_schema(Self::json_defaults(
                    schema.clone(),
                )))
            }
            GrammarSpec::Regex(rx) => {
                if rx.is_empty() {
                    return Err(ConstraintError::Invalid("the regex is empty".into()));
                }
                Ok(TopLevelGrammar::from_regex(rx))
            }
            GrammarSpec::Choice(choices) => {
                if choices.is_empty() {
                    return Err(ConstraintError::Invalid("the choice list is empty".into()));
                }
                if choices.iter().any(String::is_empty) {
                    return Err(ConstraintError::Invalid(
                        "a choice is the empty string".into(),
                    ));
                }
                let alts: Vec<String> = choices.iter().map(|c| lark_string(c)).collect();
                Ok(TopLevelGrammar::from_lark(format!(
                    "start: {}",
                    alts.join(" | ")
                )))
            }
            GrammarSpec::Lark(g) => {
                if g.trim().is_empty() {
                    return Err(ConstraintError::Invalid("the grammar is empty".into()));
                }
                if g.contains("::=") {
                    return Err(ConstraintError::Invalid(
                        "GBNF grammars are not supported; write the grammar in Lark syntax (llguidance), e.g. `start: \"yes\" | \"no\"`".into(),
                    ));
                }
                Ok(TopLevelGrammar::from_lark(g.clone()))
            }
        }
    }
}

/// A string as a Lark literal: JSON string syntax (quotes and escapes) is what llguidance's
/// Lark lexer reads.
pub fn lark_string(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// Why a constraint could not be built or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// The schema, regex or grammar is invalid or unsupported (the caller's fault: a 400).
    #[error("{0}")]
    Invalid(String),
    /// The tokenizer could not be turned into a token trie (the model's fault).
    #[error("structured outputs are unavailable for this model: {0}")]
    Unavailable(String),
}

/// toktrie's view of the engine's tokenizer: the trie of every token's bytes, and
/// tokenization of bytes (for the tokens a grammar forces).
pub struct TokenEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenEnv {
    /// The environment of `tokenizer` for a model whose output layer has `vocab` rows. The
    /// end-of-sequence tokens the grammar may finish on are every stop token of the model
    /// (EOS and end-of-turn tokens).
    pub fn new(tokenizer: Arc<Tokenizer>, vocab: usize) -> Result<Self, ConstraintError> {
        let bytes: Arc<TokenBytes> = tokenizer.token_bytes();
        let words = if bytes.len() >= vocab {
            bytes.trie_words()
        } else {
            TokenBytes::new(&tokenizer, vocab).trie_words()
        };
        let n = u32::try_from(words.len())
            .map_err(|_| ConstraintError::Unavailable("vocabulary too large".into()))?;
        let stops: Vec<TokenId> = tokenizer
            .stop_token_ids()
            .iter()
            .copied()
            .filter(|&t| t < n)
            .collect();
        let Some(&eos) = stops.first() else {
            return Err(ConstraintError::Unavailable(
                "the model has no end-of-sequence token".into(),
            ));
        };
        let info = TokRxInfo {
            vocab_size: n,
            tok_eos: eos,
            tok_bos: tokenizer.bos_id().filter(|&b| b < n),
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        // toktrie asserts on malformed input; a vocabulary is model data, but a bad one must
        // turn into an error, not take the server down.
        let trie =
            std::panic::catch_unwind(|| TokTrie::from(&info, &words).with_eos_tokens(&stops))
                .map_err(|_| {
                    ConstraintError::Unavailable("the token trie could not be built".into())
                })?;
        Ok(Self { trie, tokenizer })
    }
}

impl TokenizerEnv for TokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode_with(text, false, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }

    fn tokenize_is_canonical(&self) -> bool {
        true
    }
}

/// Compiles grammars for one model. Build once (it walks the whole vocabulary), share behind
/// an `Arc`.
pub struct Compiler {
    factory: ParserFactory,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler").finish_non_exhaustive()
    }
}

impl Compiler {
    /// The compiler for `tokenizer` and an output layer of `vocab` rows.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab: usize) -> Result<Self, ConstraintError> {
        let env: TokEnv = Arc::new(TokenEnv::new(tokenizer, vocab)?);
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Unavailable(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            // Errors go back to the client: no parser state (it may hold the prompt).
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(Self { factory })
    }

    /// Compiles `spec`; an invalid or unsupported one is [`ConstraintError::Invalid`] with
    /// llguidance's reason.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, ConstraintError> {
        let grammar = spec.to_grammar()?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError::Invalid(one_line(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Invalid(one_line(&e)));
        }
        Ok(Constraint {
            matcher,
            kind: spec.kind(),
        })
    }

    /// Vocabulary size of the masks.
    pub fn vocab(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }
}

fn one_line(s: &str) -> String {
    let s = s.trim();
    let first = s.lines().next().unwrap_or(s);
    first.chars().take(600).collect()
}

/// A model's [`Compiler`], built on first use (it walks the whole vocabulary; requests without
/// a constraint never pay for it).
#[derive(Debug)]
pub struct Grammars {
    tokenizer: Arc<Tokenizer>,
    vocab: usize,
    compiler: std::sync::OnceLock<Result<Arc<Compiler>, ConstraintError>>,
}

impl Grammars {
    /// For `tokenizer` and an output layer of `vocab` rows.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab: usize) -> Self {
        Self {
            tokenizer,
            vocab,
            compiler: std::sync::OnceLock::new(),
        }
    }

    /// The compiler (built by the first caller; may take a moment, so call it off the async
    /// runtime).
    pub fn compiler(&self) -> Result<Arc<Compiler>, ConstraintError> {
        self.compiler
            .get_or_init(|| Compiler::new(Arc::clone(&self.tokenizer), self.vocab).map(Arc::new))
            .clone()
    }
}

/// One sequence's constraint: the grammar's state and the mask for its next token.
pub struct Constraint {
    matcher: Matcher,
    kind: ConstraintKind,
}

impl Clone for Constraint {
    /// An independent copy at the same state (a fork for another choice of the request).
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            kind: self.kind,
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// The kind of constraint (JSON schema, regular expression, choice, grammar, tools).
    pub fn kind(&self) -> ConstraintKind {
        self.kind
    }

    /// Names the kind for telemetry (`json_object` for a plain JSON object, `tools` for a
    /// tool call), when it differs from the grammar's own.
    pub fn with_kind(mut self, kind: ConstraintKind) -> Self {
        self.kind = kind;
        self
    }

    /// The tokens allowed next (the end-of-sequence tokens only, once the grammar is
    /// complete).
    pub fn compute_mask(&mut self) -> Result<SimpleVob, String> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| one_line(&e.to_string()))
    }

    /// Advances the grammar by the sampled token.
    pub fn consume(&mut self, token: u32) -> Result<(), String> {
        self.matcher
            .consume_token(token)
            .map_err(|e| one_line(&e.to_string()))
    }

    /// Whether the grammar is complete (nothing more may follow).
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// A constraint in a running sequence, with the mask computed for its next token and the time
/// spent computing masks.
#[derive(Debug)]
pub struct SeqConstraint {
    /// The grammar's state.
    pub constraint: Constraint,
    /// The mask for the next token, once computed this step.
    pub mask: Option<Result<SimpleVob, String>>,
    /// Time spent computing masks so far.
    pub mask_time: Duration,
    /// Masks computed so far.
    pub masks: u64,
}

impl SeqConstraint {
    /// Wraps a compiled constraint.
    pub fn new(constraint: Constraint) -> Self {
        Self {
            constraint,
            mask: None,
            mask_time: Duration::ZERO,
            masks: 0,
        }
    }

    /// Computes the mask for the next token (on the step's helper thread).
    pub fn prepare(&mut self) {
        let t = Instant::now();
        self.mask = Some(self.constraint.compute_mask());
        self.mask_time += t.elapsed();
        self.masks += 1;
    }

    /// Sets every disallowed token's logit to `-inf`. Errors when the mask could not be
    /// computed or allows nothing.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), String> {
        if self.mask.is_none() {
            self.prepare();
        }
        let mask = match self.mask.take() {
            Some(Ok(m)) => m,
            Some(Err(e)) => return Err(e),
            None => return Err("no mask".into()),
        };
        let mut any = false;
        for (i, l) in logits.iter_mut().enumerate() {
            let ok = u32::try_from(i).is_ok_and(|t| mask.is_allowed(t));
            if ok {
                any |= *l != f32::NEG_INFINITY;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        if any {
            Ok(())
        } else {
            Err("the grammar allows no token here".into())
        }
    }
}

/// Re-exported so callers need not name toktrie.
pub use toktrie::SimpleVob as TokenMask;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::gpt2_tokenizer;

    fn compiler() -> Compiler {
        let t = Arc::new(gpt2_tokenizer(Some("smollm")));
        let vocab = t.vocab_size();
        Compiler::new(t, vocab).expect("compiler")
    }

    /// Runs a constraint to completion like a model that wants to write `target`: at each step
    /// the allowed token covering the most of what is left of `target`, else the first allowed
    /// ordinary token. Returns the text written.
    fn follow(c: &mut Constraint, tok: &Tokenizer, target: &str) -> String {
        let bytes = tok.token_bytes();
        let mut out: Vec<u8> = Vec::new();
        for _ in 0..200 {
            if c.is_stopped() {
                break;
            }
            let mask = c.compute_mask().expect("mask");
            let allowed: Vec<u32> = mask
                .to_list()
                .into_iter()
                .filter(|&t| (t as usize) < bytes.len())
                .collect();
            let rest = target.as_bytes().get(out.len()..).unwrap_or_default();
            let pick = allowed
                .iter()
                .copied()
                .filter(|&t| {
                    let b = bytes.bytes(t);
                    !bytes.is_special(t) && !b.is_empty() && rest.starts_with(b)
                })
                .max_by_key(|&t| bytes.bytes(t).len())
                .or_else(|| {
                    rest.is_empty()
                        .then(|| allowed.iter().copied().find(|&t| tok.is_stop_token(t)))
                        .flatten()
                })
                .or_else(|| allowed.iter().copied().find(|&t| !bytes.is_special(t)))
                .or_else(|| allowed.first().copied())
                .expect("something is allowed");
            c.consume(pick).expect("consume");
            if tok.is_stop_token(pick) {
                break;
            }
            out.extend_from_slice(bytes.bytes(pick));
        }
        String::from_utf8(out).expect("utf-8")
    }

    fn allowed_first_bytes(c: &mut Constraint, tok: &Tokenizer) -> Vec<u8> {
        let bytes = tok.token_bytes();
        let mut v: Vec<u8> = c
            .compute_mask()
            .expect("mask")
            .to_list()
            .into_iter()
            .filter(|&t| (t as usize) < bytes.len() && !bytes.is_special(t))
            .filter_map(|t| bytes.bytes(t).first().copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    #[test]
    fn choices_regexes_and_schemas_constrain_the_output() {
        let comp = compiler();
        let tok = gpt2_tokenizer(Some("smollm"));
        let mut c = comp
            .compile(&GrammarSpec::Choice(vec!["hello".into(), "world".into()]))
            .expect("compiles");
        assert_eq!(allowed_first_bytes(&mut c, &tok), b"hw".to_vec());
        assert_eq!(follow(&mut c, &tok, "world"), "world");
        assert!(c.is_stopped());
        assert_eq!(c.kind().as_str(), "choice");

        let mut c = comp
            .compile(&GrammarSpec::Regex("a[0-9]{3}b".into()))
            .expect("compiles");
        // A model that wants to write something else is held to the pattern.
        let text = follow(&mut c, &tok, "a12xb");
        assert!(
            text.len() == 5 && text.starts_with("a12") && text.ends_with('b'),
            "{text}"
        );

        let schema = json!({
            "type": "object",
            "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
            "required": ["n", "ok"],
            "additionalProperties": false
        });
        let mut c = comp
            .compile(&GrammarSpec::JsonSchema(schema))
            .expect("compiles");
        let mut probe = c.clone();
        assert_eq!(allowed_first_bytes(&mut probe, &tok), b"{".to_vec());
        // Compact JSON: no whitespace after the brace, and `n` must come first.
        for t in tok.encode("{\"n\":", false).expect("encodes") {
            probe.consume(t).expect("valid so far");
        }
        let next = allowed_first_bytes(&mut probe, &tok);
        assert!(
            !next.contains(&b'"') && !next.contains(&b' ') && next.contains(&b'7'),
            "{next:?}"
        );
        let text = follow(&mut c, &tok, r#"{"n":12,"ok":true}"#);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(v, json!({"n": 12, "ok": true}));

        // A fork continues independently from the same state.
        let mut a = comp
            .compile(&GrammarSpec::Choice(vec!["hello".into(), "world".into()]))
            .expect("compiles");
        let mut b = a.clone();
        assert_eq!(follow(&mut a, &tok, "hello"), "hello");
        assert_eq!(follow(&mut b, &tok, "world"), "world");
    }

    #[test]
    fn bad_grammars_are_errors_that_say_why() {
        let comp = compiler();
        for (spec, want) in [
            (GrammarSpec::Regex("a(".into()), "regex"),
            (GrammarSpec::Lark("start: foo".into()), "foo"),
            (GrammarSpec::Lark("root ::= \"a\"".into()), "GBNF"),
            (
                GrammarSpec::JsonSchema(json!({"type": "nonsense"})),
                "nonsense",
            ),
            (GrammarSpec::JsonSchema(json!(3)), "object"),
            (GrammarSpec::Choice(vec![]), "empty"),
        ] {
            let e = comp.compile(&spec).expect_err("must not compile");
            let msg = e.to_string();
            assert!(
                msg.to_lowercase().contains(&want.to_lowercase()),
                "{spec:?}: {msg}"
            );
            assert!(!msg.contains('\n'));
        }
    }

    #[test]
    fn masks_ban_everything_else() {
        let comp = compiler();
        let tok = gpt2_tokenizer(Some("smollm"));
        let mut sc = SeqConstraint::new(
            comp.compile(&GrammarSpec::Choice(vec!["hello".into()]))
                .expect("compiles"),
        );
        sc.prepare();
        let mut logits = vec![1.0f32; tok.vocab_size()];
        sc.apply(&mut logits).expect("applies");
        let allowed: Vec<usize> = (0..logits.len())
            .filter(|&i| logits[i] > f32::NEG_INFINITY)
            .collect();
        assert!(!allowed.is_empty());
        let bytes = tok.token_bytes();
        for i in allowed {
            let b = bytes.bytes(u32::try_from(i).expect("id"));
            assert!(b"hello".starts_with(b), "{:?}", String::from_utf8_lossy(b));
        }
        assert_eq!(sc.masks, 1);
    }
}
