//! What every part of the sidecar shares and nothing of it owns: the command line and its
//! configuration ([`config`]), the errors with their stable labels ([`error`]), the IP
//! networks of the allow list ([`net`]) and the shared vocabulary ([`vocab`]: trace ids, paths
//! and slots, the wall clock). The ground floor: it imports no other part.

pub mod config;
pub mod error;
pub mod net;
pub mod vocab;
