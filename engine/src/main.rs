//! The `slotlight-engine` command line.
fn main() {}
