//! A request's usage and timing, declared once: the request span's token counts and times
//! (equal to the engine's HTTP `usage` block), its warm-resume outcome and its drafts. The span
//! record holds it as decoded ([`RequestSpan::usage`](super::spans::RequestSpan::usage)); the
//! turn record repeats it unchanged ([`TurnRecord::usage`](super::turn::TurnRecord::usage)),
//! its fields flattened among the record's own in JSON.
//!
//! Each field is declared with its attribute in the contract ([`slotlight_otel::attr`]):
//! [`UsageTiming::KEYS`] lists them in field order for the decoder, which reads the record
//! with [`UsageTiming::read`], and a test holds each field's type to the contract's.

use serde::ser::{Serialize, SerializeStruct, Serializer};
use slotlight_otel::{ValueType, attr};

/// One attribute's value as a decoder hands it to [`UsageTiming::read`].
pub trait AttrValue: Sized {
    /// The value as an int, if it is one.
    fn int(self) -> Option<i64>;
    /// The value as a double, if it is one.
    fn double(self) -> Option<f64>;
    /// The value as a string, if it is one.
    fn text(self) -> Option<String>;
}

/// A field's type: what it reads from an attribute, and its type in the contract.
pub trait FromAttr: Sized {
    /// The attribute's value type in the contract.
    const KIND: ValueType;
    /// The field's value, when the attribute has the right type.
    fn from_attr(v: impl AttrValue) -> Option<Self>;
}

impl FromAttr for i64 {
    const KIND: ValueType = ValueType::Int;
    fn from_attr(v: impl AttrValue) -> Option<Self> {
        v.int()
    }
}

impl FromAttr for f64 {
    const KIND: ValueType = ValueType::Double;
    fn from_attr(v: impl AttrValue) -> Option<Self> {
        v.double()
    }
}

impl FromAttr for String {
    const KIND: ValueType = ValueType::String;
    fn from_attr(v: impl AttrValue) -> Option<Self> {
        v.text()
    }
}

/// Declares [`UsageTiming`]: each field `name: type = ATTRIBUTE_CONSTANT`, optionally
/// `also alias` (a second JSON name written right after it, with the same value).
macro_rules! usage_timing {
    ($( $(#[doc = $doc:literal])+ $field:ident: $ty:ty = $key:ident $(, also $alias:ident)?; )*) => {
        /// A request's usage and timing, as its request span states them (see the module's
        /// documentation). A field is `None` (JSON `null`) when the span did not carry its
        /// attribute.
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct UsageTiming {
            $( $(#[doc = $doc])+ pub $field: Option<$ty>, )*
        }

        impl UsageTiming {
            /// The attribute of each field, in field order.
            pub const KEYS: &[&str] = &[$( attr::$key, )*];

            /// The contract's value type of each field's attribute, in field order (the test
            /// holds them to the contract).
            #[cfg(test)]
            const KINDS: &[ValueType] = &[$( <$ty as FromAttr>::KIND, )*];

            /// The JSON names, in order (an alias right after its field).
            const JSON: &[&str] = &[$( stringify!($field), $( stringify!($alias), )? )*];

            /// Reads the record: `get(i)` is the span's value of attribute [`Self::KEYS`]`[i]`.
            pub fn read<V: AttrValue>(mut get: impl FnMut(usize) -> Option<V>) -> Self {
                let mut i = 0;
                Self { $( $field: next(&mut get, &mut i), )* }
            }
        }

        impl Serialize for UsageTiming {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut st = s.serialize_struct("UsageTiming", Self::JSON.len())?;
                $(
                    st.serialize_field(stringify!($field), &self.$field)?;
                    $( st.serialize_field(stringify!($alias), &self.$field)?; )?
                )*
                st.end()
            }
        }
    };
}

/// The field at `*i`, read from `get`; moves `*i` on.
fn next<T: FromAttr, V: AttrValue>(
    get: &mut impl FnMut(usize) -> Option<V>,
    i: &mut usize,
) -> Option<T> {
    let v = get(*i).and_then(T::from_attr);
    *i += 1;
    v
}

usage_timing! {
    /// Prompt tokens, as in the response's `usage` (`gen_ai.usage.input_tokens`).
    prompt_tokens: i64 = GEN_AI_USAGE_INPUT_TOKENS;
    /// Prompt tokens reused from the KV cache (`gen_ai.usage.cache_read.input_tokens`).
    cached_tokens: i64 = GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS;
    /// Prompt tokens computed by the prefill (`slotlight.usage.prefilled_tokens`).
    prefilled_tokens: i64 = USAGE_PREFILLED_TOKENS;
    /// `slotlight.resume`: whether the turn reused its conversation's KV and, if not, why
    /// (`first`, `full`, `diverged`, `evicted`, `expired`, `window`, `other_group`; without a
    /// session `none` or `prefix`). Absent for a request never admitted (and from an engine
    /// that does not send it).
    resume: String = RESUME;
    /// `slotlight.resume.reusable_tokens`: what the session's last turn could have given (set
    /// beside `cached_tokens`, what was reused). Absent without a remembered last turn.
    reusable_tokens: i64 = RESUME_REUSABLE_TOKENS;
    /// `slotlight.resume.diverged_at`: the token index where the prompt departs from the
    /// session's last turn. Absent unless the history changed.
    diverged_at: i64 = RESUME_DIVERGED_AT;
    /// `slotlight.resume.evicted_tokens`: reusable tokens whose KV blocks had been reclaimed.
    /// Absent unless `resume` is `evicted`.
    evicted_tokens: i64 = RESUME_EVICTED_TOKENS;
    /// Generated tokens, as in the response's `usage` (`gen_ai.usage.output_tokens`).
    completion_tokens: i64 = GEN_AI_USAGE_OUTPUT_TOKENS;
    /// Generated tokens inside the reasoning block (`gen_ai.usage.reasoning.output_tokens`);
    /// absent unless the model's template is a thinking template.
    reasoning_tokens: i64 = GEN_AI_USAGE_REASONING_OUTPUT_TOKENS;
    /// How the request was drafted for (speculative decoding): `ngram`, `prediction` or `off`
    /// (`slotlight.speculation`).
    speculation: String = SPECULATION;
    /// Verification steps with a draft, over all choices (`slotlight.usage.drafts`).
    drafts: i64 = USAGE_DRAFTS;
    /// Draft tokens verified, over all choices (`slotlight.usage.drafted_tokens`).
    drafted_tokens: i64 = USAGE_DRAFTED_TOKENS;
    /// Of those, draft tokens taken as the model's own (`slotlight.usage.accepted_tokens`).
    accepted_tokens: i64 = USAGE_ACCEPTED_TOKENS;
    /// Time waiting for admission, ms (`slotlight.usage.queue_ms`).
    queue_ms: f64 = USAGE_QUEUE_MS;
    /// Time in the prefill, ms (`slotlight.usage.prefill_ms`).
    prefill_ms: f64 = USAGE_PREFILL_MS;
    /// Arrival to first token, ms (`slotlight.usage.ttft_ms`).
    ttft_ms: f64 = USAGE_TTFT_MS;
    /// Time decoding after the first token, ms (`slotlight.usage.decode_ms`).
    decode_ms: f64 = USAGE_DECODE_MS;
    /// First token to last, ms: the base of the time per output token
    /// (`slotlight.usage.generation_ms`).
    generation_ms: f64 = USAGE_GENERATION_MS;
    /// Arrival to the end of the answer, ms (`slotlight.usage.e2e_ms`); the JSON repeats it
    /// as `total_ms`.
    e2e_ms: f64 = USAGE_E2E_MS, also total_ms;
    /// Decode rate after the first token, tokens/s (`slotlight.usage.decode_tps`).
    decode_tps: f64 = USAGE_DECODE_TPS;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_has_its_attributes_type_in_the_contract() {
        assert_eq!(UsageTiming::KEYS.len(), UsageTiming::KINDS.len());
        for (key, kind) in UsageTiming::KEYS.iter().zip(UsageTiming::KINDS) {
            let entry = attr::ALL
                .iter()
                .find(|e| e.name == *key)
                .unwrap_or_else(|| panic!("{key} is not in the contract"));
            assert_eq!(entry.kind, kind.as_str(), "{key}");
        }
    }

    /// A value of the right type for each field.
    #[derive(Clone, Copy)]
    struct Given(ValueType, i64);

    impl AttrValue for Given {
        fn int(self) -> Option<i64> {
            (self.0 == ValueType::Int).then_some(self.1)
        }
        fn double(self) -> Option<f64> {
            #[allow(clippy::cast_precision_loss)] // small test numbers
            (self.0 == ValueType::Double).then_some(self.1 as f64 + 0.5)
        }
        fn text(self) -> Option<String> {
            (self.0 == ValueType::String).then(|| format!("s{}", self.1))
        }
    }

    #[test]
    fn reads_each_field_from_its_attribute_and_writes_it_in_order() {
        let usage = UsageTiming::read(|i| {
            Some(Given(
                UsageTiming::KINDS[i],
                i64::try_from(i).expect("small"),
            ))
        });
        assert_eq!(usage.prompt_tokens, Some(0));
        assert_eq!(usage.resume.as_deref(), Some("s3"));
        assert_eq!(usage.decode_tps, Some(19.5));
        let json = serde_json::to_value(&usage).expect("json");
        let mut names: Vec<&str> = json
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        names.sort_unstable();
        let mut want = UsageTiming::JSON.to_vec();
        want.sort_unstable();
        assert_eq!(names, want);
        assert_eq!(json["total_ms"], json["e2e_ms"]);
        let text = serde_json::to_string(&usage).expect("json");
        let at = |k: &str| text.find(&format!("\"{k}\":")).expect(k);
        for w in UsageTiming::JSON.windows(2) {
            assert!(at(w[0]) < at(w[1]), "{} before {}", w[0], w[1]);
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_is_absent() {
        let usage = UsageTiming::read(|_| Some(Given(ValueType::Bool, 1)));
        assert_eq!(usage, UsageTiming::default());
        let json = serde_json::to_value(&usage).expect("json");
        assert!(
            json.as_object()
                .expect("object")
                .values()
                .all(|v| v.is_null())
        );
    }
}
