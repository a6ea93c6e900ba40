//! Stand-in for the CUDA backend when the `cuda` feature is off: every entry point reports
//! that this build has no CUDA support.

/// Why CUDA cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("this slotlight-engine was built without CUDA support (rebuild with `--features cuda`)")]
pub struct NotCompiled;

/// Checks whether a CUDA device could be used; always fails in this build.
pub fn probe(_ordinal: usize) -> Result<String, NotCompiled> {
    Err(NotCompiled)
}
