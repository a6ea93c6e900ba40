//! A zero-copy reader for OTLP trace export requests (protobuf wire format).
//!
//! The receivers' hot path: decoding into prost's owned types costs an allocation per
//! attribute key and value (about 2.6 µs per engine span, most of the ingest budget); this
//! reader borrows every string and byte field from the request buffer instead, and the
//! validation step ([`super::decode::convert`]) copies out only what it keeps.
//! It follows the wire rules prost applies: unknown fields (groups too) are skipped, malformed
//! varints or lengths are errors, strings the sidecar reads must be UTF-8.

/// Why a payload is not a valid protobuf message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid protobuf: {0}")]
pub struct WireError(pub &'static str);

/// One field's value on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Wire<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2 (bytes, string or embedded message).
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

/// Iterates the fields of one message.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    buf: &'a [u8],
}

impl<'a> Fields<'a> {
    /// The fields of the message encoded in `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Fields { buf }
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let Some((&b, rest)) = self.buf.split_first() else {
                return Err(WireError("truncated varint"));
            };
            self.buf = rest;
            if i == 9 && b > 1 {
                return Err(WireError("varint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(WireError("varint too long"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.buf.len() {
            return Err(WireError("length past the end of the message"));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    /// A field key: `(field number, wire type)`.
    fn key(&mut self) -> Result<(u32, u64), WireError> {
        let key = self.varint()?;
        let field = u32::try_from(key >> 3).map_err(|_| WireError("field number too large"))?;
        if field == 0 {
            return Err(WireError("field number 0"));
        }
        Ok((field, key & 7))
    }

    /// Skips the rest of a group that started with field `field` (deprecated proto2 groups:
    /// no OTLP field is one, so like any unknown field they are skipped, as prost does).
    fn skip_group(&mut self, field: u32, depth: u32) -> Result<(), WireError> {
        if depth >= MAX_GROUP_DEPTH {
            return Err(WireError("groups nested too deep"));
        }
        loop {
            if self.buf.is_empty() {
                return Err(WireError("group without its end"));
            }
            let (f, wire) = self.key()?;
            match wire {
                3 => self.skip_group(f, depth + 1)?,
                4 if f == field => return Ok(()),
                4 => return Err(WireError("group ends with another field number")),
                w => {
                    self.value(w)?;
                }
            }
        }
    }

    fn value(&mut self, wire: u64) -> Result<Wire<'a>, WireError> {
        Ok(match wire {
            0 => Wire::Varint(self.varint()?),
            1 => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Wire::Fixed64(u64::from_le_bytes(a))
            }
            2 => {
                let n = usize::try_from(self.varint()?)
                    .map_err(|_| WireError("length does not fit in memory"))?;
                Wire::Bytes(self.take(n)?)
            }
            5 => {
                let b = self.take(4)?;
                let mut a = [0u8; 4];
                a.copy_from_slice(b);
                Wire::Fixed32(u32::from_le_bytes(a))
            }
            _ => return Err(WireError("invalid wire type")),
        })
    }

    /// The next `(field number, value)`, `None` at the end. Groups are skipped.
    #[allow(clippy::should_implement_trait)] // fallible, so not `Iterator::next`
    pub fn next(&mut self) -> Result<Option<(u32, Wire<'a>)>, WireError> {
        loop {
            if self.buf.is_empty() {
                return Ok(None);
            }
            let (field, wire) = self.key()?;
            match wire {
                3 => self.skip_group(field, 0)?,
                4 => return Err(WireError("end of a group that never started")),
                w => return Ok(Some((field, self.value(w)?))),
            }
        }
    }
}

/// Deepest nesting of skipped groups (prost's recursion limit).
const MAX_GROUP_DEPTH: u32 = 100;

/// A field expected to be length-delimited.
pub fn bytes<'a>(w: Wire<'a>) -> Result<&'a [u8], WireError> {
    match w {
        Wire::Bytes(b) => Ok(b),
        _ => Err(WireError("wrong wire type for a length-delimited field")),
    }
}

/// A string field (UTF-8 checked).
pub fn string(w: Wire<'_>) -> Result<&str, WireError> {
    std::str::from_utf8(bytes(w)?).map_err(|_| WireError("string is not UTF-8"))
}

/// A varint field.
pub fn varint(w: Wire<'_>) -> Result<u64, WireError> {
    match w {
        Wire::Varint(v) => Ok(v),
        _ => Err(WireError("wrong wire type for a varint field")),
    }
}

/// A fixed64 field.
pub fn fixed64(w: Wire<'_>) -> Result<u64, WireError> {
    match w {
        Wire::Fixed64(v) => Ok(v),
        _ => Err(WireError("wrong wire type for a fixed64 field")),
    }
}

/// An `AnyValue`, borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    /// Text (`string_value`), borrowed from the request body.
    Str(&'a str),
    /// A flag (`bool_value`).
    Bool(bool),
    /// A signed integer (`int_value`): counts, indices, nanosecond timestamps.
    Int(i64),
    /// A float (`double_value`): durations in ms, rates, ratios.
    Double(f64),
    /// `array_value`: the encoded `ArrayValue`.
    Array(&'a [u8]),
    /// Anything else (kvlist, bytes, string index, or unset).
    Other,
}

impl<'a> Value<'a> {
    /// Decodes an encoded `AnyValue` (last field wins, as protobuf `oneof` does).
    pub fn decode(buf: &'a [u8]) -> Result<Self, WireError> {
        let mut f = Fields::new(buf);
        let mut v = Value::Other;
        while let Some((n, w)) = f.next()? {
            v = match n {
                1 => Value::Str(string(w)?),
                2 => Value::Bool(varint(w)? != 0),
                #[allow(clippy::cast_possible_wrap)] // int64 is two's complement on the wire
                3 => Value::Int(varint(w)? as i64),
                4 => Value::Double(f64::from_bits(fixed64(w)?)),
                5 => Value::Array(bytes(w)?),
                _ => Value::Other,
            };
        }
        Ok(v)
    }

    /// The string, if this is one.
    pub fn as_str(self) -> Option<&'a str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An int; a double holding a whole number also counts.
    pub fn as_i64(self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(i),
            #[allow(clippy::cast_possible_truncation)] // checked: whole and in range
            Value::Double(d)
                if d.is_finite() && d.fract() == 0.0 && d.abs() < 9.007_199_254_740_992e15 =>
            {
                Some(d as i64)
            }
            _ => None,
        }
    }

    /// A double; an int also counts.
    pub fn as_f64(self) -> Option<f64> {
        match self {
            Value::Double(d) => Some(d),
            #[allow(clippy::cast_precision_loss)] // token counts and ms are far below 2^53
            Value::Int(i) => Some(i as f64),
            _ => None,
        }
    }

    /// The value as a bool, when it is one.
    pub fn as_bool(self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The strings of an array (a lone string counts as one element); malformed arrays
    /// give what decoded.
    pub fn as_str_array(self) -> Vec<String> {
        match self {
            Value::Str(s) => vec![s.to_string()],
            Value::Array(buf) => {
                let mut out = Vec::new();
                let mut f = Fields::new(buf);
                while let Ok(Some((n, w))) = f.next() {
                    if n == 1
                        && let Ok(b) = bytes(w)
                        && let Ok(Value::Str(s)) = Value::decode(b)
                    {
                        out.push(s.to_string());
                    }
                }
                out
            }
            _ => Vec::new(),
        }
    }
}

/// One encoded `KeyValue`: its key's bytes (not UTF-8 checked: callers compare them with
/// known ASCII keys) and its encoded `AnyValue` (decode it with [`Value::decode`] when the
/// key is one the caller wants).
pub fn key_value(buf: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    let mut f = Fields::new(buf);
    let mut key: &[u8] = &[];
    let mut value: &[u8] = &[];
    while let Some((n, w)) = f.next()? {
        match n {
            1 => key = bytes(w)?,
            2 => value = bytes(w)?,
            _ => {}
        }
    }
    Ok((key, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value};
    use prost::Message;

    fn enc(v: any_value::Value) -> Vec<u8> {
        KeyValue {
            key: "k".into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn unknown_groups_are_skipped_as_prost_skips_them() {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        // Field 9 as a group holding a varint and a nested group, then field 1 (bytes "x").
        let msg = [0x4b, 0x08, 0x01, 0x53, 0x54, 0x4c, 0x0a, 0x01, b'x'];
        let mut f = Fields::new(&msg);
        assert_eq!(f.next(), Ok(Some((1, Wire::Bytes(b"x")))));
        assert_eq!(f.next(), Ok(None));
        // The fuzzer's find: prost decodes it, so the sidecar's reader must accept it too.
        let found = b"service.instan\x00e.idf\x94";
        assert!(ExportTraceServiceRequest::decode(&found[..]).is_ok());
        let mut stats = crate::metrics::spanmetrics::SpanBatch::default();
        assert!(crate::receiver::decode::convert(found, &mut stats).is_ok());
        // What prost refuses, the reader refuses: a stray end, a group left open, a mismatch.
        for bad in [&[0x4c][..], &[0x4b, 0x08, 0x01][..], &[0x4b, 0x54][..]] {
            assert!(ExportTraceServiceRequest::decode(bad).is_err());
            assert!(Fields::new(bad).next().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn values_round_trip_against_prost() {
        fn val(b: &[u8]) -> Value<'_> {
            let (_, raw) = key_value(b).expect("kv");
            Value::decode(raw).expect("value")
        }
        let b = enc(any_value::Value::IntValue(-5));
        assert_eq!(key_value(&b).expect("kv").0, b"k");
        assert_eq!(val(&b), Value::Int(-5));
        let b = enc(any_value::Value::DoubleValue(1.25));
        assert_eq!(val(&b), Value::Double(1.25));
        let b = enc(any_value::Value::StringValue("héllo".into()));
        assert_eq!(val(&b), Value::Str("héllo"));
        let b = enc(any_value::Value::BoolValue(true));
        assert_eq!(val(&b), Value::Bool(true));
        let arr = any_value::Value::ArrayValue(ArrayValue {
            values: ["a", "b"]
                .iter()
                .map(|s| AnyValue {
                    value: Some(any_value::Value::StringValue((*s).into())),
                })
                .collect(),
        });
        let b = enc(arr);
        assert_eq!(val(&b).as_str_array(), ["a", "b"]);
        assert_eq!(Value::Double(3.0).as_i64(), Some(3));
        assert_eq!(Value::Double(3.5).as_i64(), None);
    }

    #[test]
    fn malformed_input_is_an_error() {
        for bad in [
            &b"\xff\xff\xff\xff garbage"[..],
            b"\x0a\x05ab",                                   // length past the end
            b"\x0b",                                         // group
            b"\x00\x01",                                     // field 0
            b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02", // varint overflow
            b"\x0a\x02\xff\xfe",                             // bad UTF-8 as a string
        ] {
            let r = (|| -> Result<(), WireError> {
                let mut f = Fields::new(bad);
                while let Some((_, w)) = f.next()? {
                    if let Wire::Bytes(_) = w {
                        string(w)?;
                    }
                }
                Ok(())
            })();
            assert!(r.is_err(), "{bad:?}");
        }
    }

    /// The reader faces the network: mutated and random input must give `Ok` or `Err`,
    /// never a panic (a deterministic stand-in for a fuzzer).
    #[test]
    fn mutated_requests_never_panic() {
        let spans = crate::tools::synth::whole_request("r", 1, 1_000, Some(0), 2, 3);
        let good = crate::tools::synth::export("i", spans).encode_to_vec();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut rand = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let len = u64::try_from(good.len()).expect("len");
        for round in 0..3000u64 {
            let mut buf = good.clone();
            for _ in 0..(1 + round % 8) {
                let at = usize::try_from(rand() % len).expect("index");
                buf[at] = u8::try_from(rand() & 0xff).expect("byte");
            }
            if round % 3 == 0 {
                buf.truncate(usize::try_from(rand() % len).expect("index"));
            }
            let mut batch = crate::metrics::spanmetrics::SpanBatch::default();
            let _ = crate::receiver::decode::convert(&buf, &mut batch);
        }
        for n in 0..500usize {
            let junk: Vec<u8> = (0..n)
                .map(|_| u8::try_from(rand() & 0xff).expect("byte"))
                .collect();
            let mut batch = crate::metrics::spanmetrics::SpanBatch::default();
            let _ = crate::receiver::decode::convert(&junk, &mut batch);
        }
    }
}
