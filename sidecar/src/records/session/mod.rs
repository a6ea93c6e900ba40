//! Sessions: an agent's turns seen whole. A session's record ([`SessionRecord`]) is made from
//! its turn records alone ([`summarize`]): its token counts, its cache-hit ratio, where its time
//! went (the model's queue, prefill and decode, and the client's own time between turns) and
//! whether it is still live. Types of their own beside the turn records: the store keeps them
//! with the turns, the views list them, the assembly's tracker observes each session once it
//! ends ([`crate::assembly::sessions`]).

pub mod query;
pub mod record;

pub use query::{SessionCursor, SessionQuery};
pub use record::{SessionRecord, TurnFacts, detail, summarize};
