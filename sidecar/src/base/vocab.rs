//! The sidecar's shared vocabulary: trace ids, where a request runs (path and slot), the
//! acceptance rate of drafts, and the wall clock. A leaf: the span decoder, the assembly, the store, the views and the metrics
//! all import it.

use serde::Serialize;
use slotlight_otel::attr;

/// A trace id (16 bytes).
pub type TraceId = [u8; 16];

/// Lowercase hex of a trace or span id.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// Draft tokens taken over draft tokens verified (speculative decoding's acceptance rate);
/// `None` when none was verified, never 0.
pub fn acceptance(drafted: i64, accepted: i64) -> Option<f64> {
    #[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
    let ratio = |a: i64, d: i64| a as f64 / d as f64;
    (drafted > 0).then(|| ratio(accepted, drafted))
}

/// A decode path: the batch-1 solo path or a batch slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// The solo path (`slotlight.leg.path = solo`).
    Solo,
    /// A batch slot (`slotlight.leg.path = slot`).
    Slot,
}

impl Path {
    /// Parses a `slotlight.leg.path` value.
    pub fn parse(s: &str) -> Option<Path> {
        match s {
            attr::value::PATH_SOLO => Some(Path::Solo),
            attr::value::PATH_SLOT => Some(Path::Slot),
            _ => None,
        }
    }

    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Solo => attr::value::PATH_SOLO,
            Path::Slot => attr::value::PATH_SLOT,
        }
    }
}

/// Where a request runs: a row of the slot view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotKey {
    /// The device group (`slotlight.slot.group`, 0 on one device).
    pub group: i64,
    /// Solo path or slot.
    pub path: Path,
    /// The slot index within its group; `None` on the solo path.
    pub index: Option<i64>,
}

/// Wall-clock time in nanoseconds since the Unix epoch (the unit of every OTLP timestamp).
pub fn unix_now_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lowercase() {
        assert_eq!(hex(&[0x0a, 0xff]), "0aff");
    }
}
