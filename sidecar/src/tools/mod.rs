//! Tools apart from the service: the benchmark (`slotlight-sidecar bench`) and the synthetic
//! engine-shaped spans it and the tests send. Nothing the serving sidecar runs imports them.

pub mod bench;
pub mod synth;
