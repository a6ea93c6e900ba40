//! The `slotlight-sidecar` command line.
fn main() {}
