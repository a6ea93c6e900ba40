//! The slotlight telemetry contract.
//!
//! Every span name, attribute key and metric name that the engine emits or the sidecar reads
//! is a documented constant in this crate, and nothing else in the workspace spells them.
//! `CONTRACT.md` beside this crate is rendered from [`render_contract`]; a test fails when the
//! two drift apart (run `SLOTLIGHT_BLESS=1 cargo test -p slotlight-otel` to re-render it).
//!
//! The crate is `std` only so that any producer or consumer can depend on it cheaply.

#![warn(missing_docs)]

pub mod attr;
pub mod exposition;
pub mod metric;
pub mod span;

mod render;

pub use render::render_contract;

/// The kind of value an attribute carries on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// A UTF-8 string.
    String,
    /// A signed 64-bit integer.
    Int,
    /// A 64-bit float.
    Double,
    /// A boolean.
    Bool,
    /// An array of strings.
    StringArray,
}

impl ValueType {
    /// The name used in `CONTRACT.md`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ValueType::String => "string",
            ValueType::Int => "int",
            ValueType::Double => "double",
            ValueType::Bool => "bool",
            ValueType::StringArray => "string[]",
        }
    }
}

/// One documented entry of the contract (a span name, an attribute key or a metric name).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// The Rust constant's name.
    pub ident: &'static str,
    /// The wire name.
    pub name: &'static str,
    /// The value type (attributes), or the metric type (metrics), or "span".
    pub kind: &'static str,
    /// Unit, empty where none applies.
    pub unit: &'static str,
    /// What it means.
    pub doc: &'static str,
}

/// Declares documented constants and an `ALL` table listing them.
macro_rules! contract {
    ($( #[doc = $doc:expr] $ident:ident = $name:expr, $kind:expr, $unit:expr; )*) => {
        $(
            #[doc = $doc]
            pub const $ident: &str = $name;
        )*
        /// Every entry of this module, in declaration order.
        pub const ALL: &[$crate::Entry] = &[
            $( $crate::Entry { ident: stringify!($ident), name: $name, kind: $kind, unit: $unit, doc: $doc }, )*
        ];
    };
}
pub(crate) use contract;
