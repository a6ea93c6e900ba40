//! End-to-end test support for slotlight.
