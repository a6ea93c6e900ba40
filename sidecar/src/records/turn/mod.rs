//! A finished request as the sidecar keeps it: its record ([`TurnRecord`], one per request,
//! built from its spans) and the query that lists records ([`TurnQuery`], paged by a
//! [`Cursor`]). Types of their own, below the parts that use them: the assembly makes the
//! records, the store keeps them, the views and the metrics read them.

pub mod query;
pub mod record;

pub use query::{Cursor, TurnQuery};
pub use record::{PartialTurn, TurnLeg, TurnRecord, TurnStatus};
