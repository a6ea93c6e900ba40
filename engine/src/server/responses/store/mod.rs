//! The Responses store: every response created with `store` (OpenAI's default), kept with its
//! input and output items and the exact token ids of its prompt and reply, so that a later
//! request's `previous_response_id` continues from those tokens (never from a re-rendering of
//! their text) and `GET /v1/responses/{id}` answers it.
//!
//! Two backends behind one type: SQLite (embedded, WAL; a file, or `:memory:` to keep nothing
//! on disk), the default, and Redis (`redis://…`) for several replicas behind a gateway. Both
//! are bounded by count, bytes and age ([`StoreLimits`]): the oldest responses go first, and
//! a response older than the age bound is gone even if nothing pushed it out. A response is
//! written whole in one transaction (SQLite) or one atomic server-side script (Redis): a
//! reader never sees half of one. A finished response the store cannot save is returned all
//! the same, marked as not stored ([`Saved`]).
//!
//! **A chain is kept as links.** A continuation is stored as its own part only (its input and
//! output items, its reply's ids, and of its history and prompt only what it does not share
//! with its parent) with a link to its parent (module `chain`): a chain of n turns stores O(n)
//! bytes, and the bytes bound counts each response's own part. Reading a response walks the
//! links up and rebuilds its whole history and prompt ids (the same [`StoredResponse`] as the
//! full copy it replaces), at most 1,024 responses; a longer chain, a cycle or a
//! missing link is an error ([`StoreError::Chain`]), never a hang or a panic.
//!
//! **Removing a response keeps its chain alive.** When a response is removed, evicted by
//! count, bytes or age or deleted by `DELETE`, its part is folded into each stored child in
//! the same transaction (SQLite) or script (Redis): the child then links to the removed one's
//! parent, or is self-contained, and reads back exactly as before. So a deleted response is
//! gone for `GET`, `input_items`, `DELETE` and `previous_response_id` (a 404), but its
//! children's `GET`, `input_items` and continuations are unchanged; what a child still needs
//! of it (the items of its history, the ids of its prompt) now lives in the child. A child
//! that was damaged already (it asks its parent for more than the parent holds) keeps its
//! link to the removed parent, and reading it is an error.
//!
//! **Older stores read on.** A record written before chains were kept as links holds its
//! whole history and prompt: it is read as a self-contained part (an SQLite file is migrated
//! to schema 2 when opened, a column added; a Redis response of the earlier form is a string
//! key, read as before, and its continuations are stored self-contained).

mod chain;
mod redis;
mod saving;
mod sqlite;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::server::error::ApiError;
use crate::server::state::AppState;

pub use redis::RedisTimeouts;
pub use saving::{Pending, STORED_HEADER, Saved};

/// A stored response: what `GET` answers, and what a continuation needs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoredResponse {
    /// The response id (`resp_…`).
    pub id: String,
    /// When it was created, Unix seconds.
    pub created_at: u64,
    /// The session of its chain (the warm-resume key its continuations take).
    pub session: Option<String>,
    /// The conversation it belongs to (`conversation`), if any.
    pub conversation: Option<String>,
    /// The served model name it was created with.
    pub model: String,
    /// Its `instructions` (the system message its prompt began with), if any.
    pub instructions: Option<String>,
    /// The function tools it offered, as the engine took them (a continuation offering other
    /// tools renders its prompt anew).
    pub tools: Value,
    /// Its `text.format` and reasoning switch as the engine took them (likewise).
    pub format: Value,
    /// The stored response it continued (`previous_response_id`, or its conversation's
    /// latest), whose conversation its history continues: the store keeps it as a link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Every item of its chain before its own input: the earlier turns' inputs and outputs.
    pub history: Vec<Value>,
    /// Its own input items, as the client sent them (normalised to item objects).
    pub input: Vec<Value>,
    /// Its output items.
    pub output: Vec<Value>,
    /// The exact token ids of its prompt.
    pub prompt_tokens: Vec<u32>,
    /// The exact token ids of its reply, its end-of-turn token included.
    pub reply_tokens: Vec<u32>,
    /// The response object as it was returned.
    pub response: Value,
}

impl StoredResponse {
    /// The conversation as items: its history, its input, then its output.
    pub fn conversation_items(&self) -> Vec<Value> {
        let mut v = self.history.clone();
        v.extend(self.input.iter().cloned());
        v.extend(self.output.iter().cloned());
        v
    }
}

/// How much the store keeps: at most `max_responses` responses and `max_bytes` bytes of them,
/// none older than `max_age`; the oldest go first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Most responses kept.
    pub max_responses: usize,
    /// Most bytes of stored responses (their serialized size).
    pub max_bytes: u64,
    /// How long a response is kept.
    pub max_age: Duration,
}

impl Default for StoreLimits {
    fn default() -> Self {
        Self {
            max_responses: 10_000,
            max_bytes: 1 << 30,
            max_age: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// Why the store failed. A finished response the store fails to save is still returned,
/// marked as not stored ([`Saved`]); a read that fails is the request's error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed (opening, a statement, the disk).
    #[error("response store (SQLite): {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Redis failed (connecting, a command).
    #[error("response store (Redis): {0}")]
    Redis(#[from] ::redis::RedisError),
    /// A stored response did not decode (written by another version, or damaged).
    #[error("response store: a stored response does not decode: {0}")]
    Decode(#[from] serde_json::Error),
    /// The store's place cannot be used (its directory cannot be made).
    #[error("response store: {0}")]
    Io(#[from] std::io::Error),
    /// The SQLite file is damaged (its quick check's first finding).
    #[error("response store (SQLite): the file is damaged: {0}")]
    Damaged(String),
    /// A stored chain cannot be read back: a link to a response that is not stored, a
    /// cycle, a chain longer than 1,024 responses, or counts its parents cannot give.
    #[error("response store: {0}")]
    Chain(String),
    /// A blocking store task was lost.
    #[error("response store: {0}")]
    Task(String),
    /// The store could not be opened when the engine started (corrupt, unreadable, locked
    /// past the busy timeout); the engine serves on without it.
    #[error("the response store is unavailable: {0}")]
    Unavailable(String),
}

impl StoreError {
    /// The error a request that needs the store is answered with: 503 when the store could
    /// not be opened (the engine serves everything else) or its server does not answer (a
    /// Redis that is down or past its timeouts), else 500.
    pub fn api_error(&self) -> ApiError {
        match self {
            StoreError::Unavailable(_) => ApiError::unavailable(self.to_string()),
            StoreError::Redis(e) if e.is_io_error() || e.is_timeout() => {
                ApiError::unavailable(format!("the response store is not answering: {e}"))
            }
            _ => ApiError::internal(self.to_string()),
        }
    }
}

/// Where the store lives, as `--responses-db` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// An SQLite file.
    File(PathBuf),
    /// SQLite in memory: nothing outlives the process.
    Memory,
    /// A Redis server (`redis://…`, `rediss://…`, `redis+unix://…`).
    Redis(String),
}

impl StoreLocation {
    /// Reads `--responses-db`: `:memory:`, a `redis://` URL, or a path.
    pub fn parse(spec: &str) -> Self {
        if spec == ":memory:" {
            StoreLocation::Memory
        } else if spec.starts_with("redis://")
            || spec.starts_with("rediss://")
            || spec.starts_with("redis+unix://")
        {
            StoreLocation::Redis(spec.to_string())
        } else {
            StoreLocation::File(PathBuf::from(spec))
        }
    }

    /// The default: `responses.db` under the user's state directory (`$XDG_STATE_HOME/slotlight`,
    /// else `~/.local/state/slotlight`), else in memory when there is no home.
    pub fn default_file() -> Self {
        dirs::state_dir()
            .or_else(|| dirs::home_dir().map(|h| h.join(".local").join("state")))
            .map_or(StoreLocation::Memory, |d| {
                StoreLocation::File(d.join("slotlight").join("responses.db"))
            })
    }
}

/// The store's backend.
enum Backend {
    /// SQLite, in a file or in memory.
    Sqlite(sqlite::SqliteStore),
    /// Redis.
    Redis(redis::RedisStore),
    /// None: the store could not be opened, for this reason. Chat completions, completions
    /// and Messages are served as usual; a Responses request that needs the store is
    /// answered 503 naming the reason.
    Unavailable(String),
}

/// The store, whichever its backend, with the count of responses it failed to save.
pub struct ResponseStore {
    backend: Backend,
    not_stored: AtomicU64,
}

impl std::fmt::Debug for ResponseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

impl ResponseStore {
    fn with(backend: Backend) -> Self {
        Self {
            backend,
            not_stored: AtomicU64::new(0),
        }
    }

    /// The door's store, as the shared state holds it ([`AppState::responses`]). A state built
    /// with something else there is refused as an internal error, never a panic.
    pub fn of(st: &AppState) -> Result<Arc<Self>, ApiError> {
        Arc::clone(&st.responses)
            .downcast::<Self>()
            .map_err(|_| ApiError::internal("the Responses store is not set up"))
    }

    /// Opens (creates) the store at `location`, bounded by `limits`, with Redis's default
    /// timeouts.
    pub async fn open(location: &StoreLocation, limits: StoreLimits) -> Result<Self, StoreError> {
        Self::open_with(location, limits, RedisTimeouts::default()).await
    }

    /// Opens (creates) the store at `location`, bounded by `limits`; a Redis store waits
    /// for its server at most `timeouts`.
    pub async fn open_with(
        location: &StoreLocation,
        limits: StoreLimits,
        timeouts: RedisTimeouts,
    ) -> Result<Self, StoreError> {
        Ok(Self::with(match location {
            StoreLocation::File(p) => {
                Backend::Sqlite(sqlite::SqliteStore::open(Some(p.clone()), limits).await?)
            }
            StoreLocation::Memory => {
                Backend::Sqlite(sqlite::SqliteStore::open(None, limits).await?)
            }
            StoreLocation::Redis(url) => {
                Backend::Redis(redis::RedisStore::open(url, limits, timeouts).await?)
            }
        }))
    }

    /// A store that could not be opened, for `reason`: everything but the Responses requests
    /// that need it is served.
    pub fn unavailable(reason: String) -> Self {
        Self::with(Backend::Unavailable(reason))
    }

    /// A word for logs, `/health` and `/metrics`: `sqlite`, `memory`, `redis` or
    /// `unavailable`.
    pub fn describe(&self) -> &'static str {
        match &self.backend {
            Backend::Sqlite(s) if s.in_memory() => "memory",
            Backend::Sqlite(_) => "sqlite",
            Backend::Redis(_) => "redis",
            Backend::Unavailable(_) => "unavailable",
        }
    }

    /// Whether the store can be used: `Err` (its reason) when it could not be opened.
    pub fn available(&self) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Unavailable(reason) => Err(StoreError::Unavailable(reason.clone())),
            _ => Ok(()),
        }
    }

    /// What `/metrics` says of the store: its backend, why it could not be opened, and how
    /// many finished responses it failed to save.
    pub fn snapshot(&self) -> crate::metrics::StoreSnapshot {
        crate::metrics::StoreSnapshot {
            backend: self.describe(),
            unavailable: match &self.backend {
                Backend::Unavailable(reason) => Some(reason.clone()),
                _ => None,
            },
            not_stored: self.not_stored.load(Ordering::Relaxed),
        }
    }

    /// Stores `r` (replacing one of the same id) as its own part linked to `r.previous` when
    /// that is stored, then drops what is over the bounds.
    pub async fn put(&self, r: &StoredResponse) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Sqlite(s) => s.put(r).await,
            Backend::Redis(s) => s.put(r).await,
            Backend::Unavailable(reason) => Err(StoreError::Unavailable(reason.clone())),
        }
    }

    /// The response `id`, unless it is unknown or older than the age bound.
    pub async fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        match &self.backend {
            Backend::Sqlite(s) => s.get(id).await,
            Backend::Redis(s) => s.get(id).await,
            Backend::Unavailable(reason) => Err(StoreError::Unavailable(reason.clone())),
        }
    }

    /// Deletes the response `id`, its part folded into its stored children; whether there was
    /// one.
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Sqlite(s) => s.delete(id).await,
            Backend::Redis(s) => s.delete(id).await,
            Backend::Unavailable(reason) => Err(StoreError::Unavailable(reason.clone())),
        }
    }

    /// The latest stored response of `conversation`, if any.
    pub async fn latest_in(&self, conversation: &str) -> Result<Option<String>, StoreError> {
        match &self.backend {
            Backend::Sqlite(s) => s.latest_in(conversation).await,
            Backend::Redis(s) => s.latest_in(conversation).await,
            Backend::Unavailable(reason) => Err(StoreError::Unavailable(reason.clone())),
        }
    }
}

#[cfg(test)]
impl ResponseStore {
    /// The bytes the response `id`'s own part takes in the store (0 when it is not stored).
    pub(crate) async fn stored_bytes(&self, id: &str) -> Result<u64, StoreError> {
        match &self.backend {
            Backend::Sqlite(s) => s.stored_bytes(id).await,
            Backend::Redis(s) => s.stored_bytes(id).await,
            Backend::Unavailable(reason) => Err(StoreError::Unavailable(reason.clone())),
        }
    }
}

/// Unix seconds now.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A response of `id` whose body is about `pad` bytes.
    pub(crate) fn response(id: &str, conversation: Option<&str>, pad: usize) -> StoredResponse {
        StoredResponse {
            id: id.to_string(),
            created_at: unix_now(),
            session: Some("s".into()),
            conversation: conversation.map(str::to_string),
            model: "m".into(),
            instructions: Some("be brief".into()),
            tools: json!([]),
            format: json!({"type": "text"}),
            previous: None,
            history: vec![],
            input: vec![json!({"type": "message", "role": "user", "content": "x".repeat(pad)})],
            output: vec![json!({"type": "message", "role": "assistant", "content": []})],
            prompt_tokens: vec![1, 2, 3],
            reply_tokens: vec![4, 5, 2],
            response: json!({"id": id, "object": "response"}),
        }
    }

    #[test]
    fn locations_are_read_from_the_flag() {
        assert_eq!(StoreLocation::parse(":memory:"), StoreLocation::Memory);
        assert_eq!(
            StoreLocation::parse("redis://127.0.0.1:6379/0"),
            StoreLocation::Redis("redis://127.0.0.1:6379/0".into())
        );
        assert_eq!(
            StoreLocation::parse("state/responses.db"),
            StoreLocation::File(PathBuf::from("state/responses.db"))
        );
    }

    #[test]
    fn a_conversation_is_history_then_input_then_output() {
        let mut r = response("resp_1", None, 1);
        r.history = vec![json!({"n": 0})];
        let items = r.conversation_items();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0], json!({"n": 0}));
        assert_eq!(items[2]["role"], "assistant");
    }
}
