//! The `signature` of a `thinking` block: a keyed hash of the block's text, checked when the
//! block comes back in a later request, and the text itself when the reply's thinking was
//! not shown (`thinking.display: "omitted"`), so that the conversation's prompt is rebuilt
//! with the exact reasoning the model produced.
//!
//! A signature reads `sl1.<mac>` or `sl1.<mac>.<text>`: `mac` is the first 16 bytes of
//! SHA-256 over the key, the text's length and the text, in hex; `text` is the thinking's
//! UTF-8 bytes in hex. The key is derived from `--api-key` (when set) and the served model's
//! name, so a signature stays valid across restarts of the same engine; without an API key
//! anyone can compute it, and it guards against edits only, not forgery.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The signatures' version prefix.
const PREFIX: &str = "sl1.";

/// Bytes of the hash kept in a signature.
const MAC_BYTES: usize = 16;

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// Not a signature this engine writes.
    #[error("is not a signature this engine wrote (they start with `{PREFIX}`)")]
    Malformed,
    /// The text does not match the signature: it was edited, or signed with another key (by
    /// another engine, or under another API key or model name).
    #[error(
        "does not match the thinking text: the block was edited, or was signed by another engine (another API key or model)"
    )]
    Mismatch,
}

/// Signs and checks thinking blocks with one key.
#[derive(Clone)]
pub struct Signer {
    key: [u8; 32],
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer { .. }")
    }
}

impl Signer {
    /// The signer of an engine with `api_key` serving `model`.
    pub fn new(api_key: Option<&str>, model: &str) -> Self {
        let mut h = Sha256::new();
        h.update(b"slotlight thinking signature\0");
        h.update(api_key.unwrap_or("").as_bytes());
        h.update(b"\0");
        h.update(model.as_bytes());
        Self {
            key: h.finalize().into(),
        }
    }

    fn mac(&self, text: &str) -> [u8; MAC_BYTES] {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update((text.len() as u64).to_le_bytes());
        h.update(text.as_bytes());
        let full: [u8; 32] = h.finalize().into();
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(&full[..MAC_BYTES]);
        out
    }

    /// The signature of `text`; with `carry` it holds the text too (for a block whose text is
    /// not shown).
    pub fn sign(&self, text: &str, carry: bool) -> String {
        let mut s = format!("{PREFIX}{}", hex(&self.mac(text)));
        if carry {
            s.push('.');
            s.push_str(&hex(text.as_bytes()));
        }
        s
    }

    /// Checks a block's `thinking` against its `signature`: the text the block stands for (its
    /// own, or the one its signature carries when the block's is empty), or why not.
    pub fn verify(&self, thinking: &str, signature: &str) -> Result<String, SignatureError> {
        let rest = signature
            .strip_prefix(PREFIX)
            .ok_or(SignatureError::Malformed)?;
        let (mac, carried) = match rest.split_once('.') {
            Some((m, t)) => (m, Some(t)),
            None => (rest, None),
        };
        let mac = unhex(mac).ok_or(SignatureError::Malformed)?;
        let carried = match carried {
            None => None,
            Some(t) => Some(
                unhex(t)
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or(SignatureError::Malformed)?,
            ),
        };
        let text = match carried {
            Some(c) if thinking.is_empty() => c,
            Some(c) if c != thinking => return Err(SignatureError::Mismatch),
            _ => thinking.to_string(),
        };
        let ok: bool = self.mac(&text)[..].ct_eq(&mac[..]).into();
        if ok {
            Ok(text)
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|p| u8::from_str_radix(p, 16).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_its_own_text_only() {
        let s = Signer::new(None, "m");
        let sig = s.sign("Two and two is four.", false);
        assert!(sig.starts_with("sl1."));
        assert_eq!(
            s.verify("Two and two is four.", &sig).as_deref(),
            Ok("Two and two is four.")
        );
        assert_eq!(
            s.verify("Two and two is five.", &sig),
            Err(SignatureError::Mismatch)
        );
        // Another key (API key or model) does not verify it.
        assert_eq!(
            Signer::new(Some("k"), "m").verify("Two and two is four.", &sig),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            Signer::new(None, "other").verify("Two and two is four.", &sig),
            Err(SignatureError::Mismatch)
        );
        // The same engine after a restart does.
        assert!(
            Signer::new(None, "m")
                .verify("Two and two is four.", &sig)
                .is_ok()
        );
        for bad in ["", "EqHK", "sl1.zz", "sl1.abc", "sl2.00"] {
            assert_eq!(s.verify("x", bad), Err(SignatureError::Malformed), "{bad}");
        }
    }

    #[test]
    fn a_carried_text_comes_back_when_the_block_is_empty() {
        let s = Signer::new(Some("key"), "m");
        let sig = s.sign("héllo 👋", true);
        assert_eq!(s.verify("", &sig).as_deref(), Ok("héllo 👋"));
        assert_eq!(s.verify("héllo 👋", &sig).as_deref(), Ok("héllo 👋"));
        assert_eq!(s.verify("other", &sig), Err(SignatureError::Mismatch));
        // A carried text that was changed no longer matches the hash.
        let (head, _) = sig.rsplit_once('.').expect("carried");
        let forged = format!("{head}.{}", hex("other".as_bytes()));
        assert_eq!(s.verify("", &forged), Err(SignatureError::Mismatch));
    }
}
