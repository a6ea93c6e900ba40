//! Where turn records are kept: durable, in the SQLite file behind `/v1/turns` (`--turns-db`),
//! or in memory, in a bounded ring ([`TurnStore`], `--turns-db :memory:`).
//!
//! The assembly hands each finished record to [`TurnWriter::offer`], which never blocks: a
//! bounded channel feeds one writer thread that commits whatever is queued in one
//! transaction (WAL mode), then applies the retention (`--turns-retention`, `--turns-max`).
//! `/v1/turns` reads the file through its own connection ([`TurnDb::query`]), so it only
//! ever returns committed rows: a turn it has returned survives a `kill -9` of the sidecar
//! (a committed WAL transaction is in the operating system's hands; only a power loss before
//! the next checkpoint could lose it, which `synchronous = NORMAL` accepts). A turn is written
//! once: the row is keyed by (engine instance, trace id, request id), as the assembly keys
//! requests, and a repeat is ignored.
//!
//! `:memory:` keeps no file: the views read the in-memory ring instead ([`TurnStore`]).
//!
//! Each session's record is kept beside its turns ([`sessions`]), made again from them in the
//! transaction that writes or deletes any of its turns: `/v1/sessions` reads only committed
//! rows too, and a restarted sidecar answers exactly what it wrote.

pub mod query;
pub mod ring;
pub mod schema;
pub mod sessions;

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, params};

use crate::records::session::{SessionCursor, SessionQuery, SessionRecord, TurnFacts};
use crate::records::turn::{TurnQuery, TurnRecord};
pub use query::TurnPage;
pub use ring::TurnStore;

/// Records waiting for the writer; more are not stored (counted in
/// `slotlight_sidecar_turns_not_stored_total`) rather than stall the assembly. A record is
/// about 1 KiB, so a full queue holds some 16 MiB.
const QUEUE: usize = 16_384;
/// Most records committed in one transaction.
const BATCH: usize = 4096;
/// How often the retention runs while records arrive.
const RETENTION_EVERY: Duration = Duration::from_secs(1);

/// Why the turn store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused an operation (open, schema, write or read).
    #[error("turn store {path}: {source}")]
    Sqlite {
        /// The turn store's file.
        path: String,
        /// What SQLite reported.
        #[source]
        source: rusqlite::Error,
    },
    /// The file's directory could not be created.
    #[error("turn store {path}: cannot create its directory: {source}")]
    Directory {
        /// The turn store's file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file was written by a newer sidecar (its schema version is higher than ours).
    #[error("turn store {path}: schema version {found} is newer than this sidecar's {VERSION}", VERSION = schema::VERSION)]
    NewerSchema {
        /// The turn store's file.
        path: String,
        /// Its `user_version`.
        found: i64,
    },
    /// A stored record is not valid JSON (the file was edited by hand or is damaged).
    #[error("turn store: the record of seq {seq} is not JSON: {source}")]
    BadRecord {
        /// The sequence number of the row that did not decode.
        seq: i64,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A stored session record is not valid JSON of a session (the file was edited by hand or
    /// is damaged).
    #[error("turn store: a stored session record does not read: {0}")]
    BadSession(String),
    /// The writer thread could not be started.
    #[error("turn store: cannot start the writer thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// How long records are kept.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Rows stored longer ago than this are deleted.
    pub max_age: Duration,
    /// At most this many rows are kept (the newest).
    pub max_rows: u64,
}

/// Where the store lives: a file, or nowhere (`:memory:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnsDb {
    /// No file: the in-memory ring, as before the store existed.
    Memory,
    /// This SQLite file.
    File(PathBuf),
}

impl TurnsDb {
    /// `--turns-db`: `:memory:`, a path, or (absent) the XDG state default.
    pub fn from_flag(flag: Option<&str>) -> Self {
        match flag {
            Some(":memory:") => TurnsDb::Memory,
            Some(p) => TurnsDb::File(PathBuf::from(p)),
            None => match default_path() {
                Some(p) => TurnsDb::File(p),
                None => {
                    tracing::warn!(
                        "TurnStore.NoStateDir: neither XDG_STATE_HOME nor HOME is set; keeping turns in memory"
                    );
                    TurnsDb::Memory
                }
            },
        }
    }
}

/// `$XDG_STATE_HOME/slotlight/turns.db`, else `$HOME/.local/state/slotlight/turns.db` (the
/// XDG base directory rule: a relative `XDG_STATE_HOME` is ignored).
pub fn default_path() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let state = env("XDG_STATE_HOME")
        .filter(|p| p.is_absolute())
        .or_else(|| env("HOME").map(|h| h.join(".local").join("state")))?;
    Some(state.join("slotlight").join("turns.db"))
}

fn sqlite(path: &Path) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
    move |source| StoreError::Sqlite {
        path: path.display().to_string(),
        source,
    }
}

/// Opens (creating) the file and its schema, in WAL mode.
fn open_rw(path: &Path) -> Result<Connection, StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Directory {
            path: path.display().to_string(),
            source,
        })?;
    }
    let c = Connection::open(path).map_err(sqlite(path))?;
    c.busy_timeout(Duration::from_secs(5))
        .map_err(sqlite(path))?;
    c.pragma_update(None, "journal_mode", "WAL")
        .map_err(sqlite(path))?;
    c.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite(path))?;
    // Checkpoint (and fsync) every 8192 pages (32 MiB of WAL) rather than SQLite's 1000: the
    // writer spends its time inserting, not syncing, under a burst of turns.
    c.pragma_update(None, "wal_autocheckpoint", 8192)
        .map_err(sqlite(path))?;
    let found: i64 = c
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(sqlite(path))?;
    if found > schema::VERSION {
        return Err(StoreError::NewerSchema {
            path: path.display().to_string(),
            found,
        });
    }
    let mut c = c;
    c.execute_batch(schema::CREATE).map_err(sqlite(path))?;
    if found < 2 {
        // A store written before sessions were kept: make them from its turns.
        sessions::rebuild(&mut c).map_err(sqlite(path))?;
    }
    c.pragma_update(None, "user_version", schema::VERSION)
        .map_err(sqlite(path))?;
    Ok(c)
}

/// The read side: `/v1/turns` queries, one at a time on their own connection.
#[derive(Debug, Clone)]
pub struct TurnDb {
    path: Arc<Path>,
    conn: Arc<Mutex<Connection>>,
}

impl TurnDb {
    /// The records matching `q`, one page of them (see [`query`]).
    pub fn query(&self, q: &TurnQuery) -> Result<TurnPage, StoreError> {
        let c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        query::run(&c, q).map_err(|e| match e {
            query::QueryError::Sqlite(source) => StoreError::Sqlite {
                path: self.path.display().to_string(),
                source,
            },
            query::QueryError::BadRecord { seq, source } => StoreError::BadRecord { seq, source },
        })
    }

    /// One page of `/v1/sessions`, `live` decided as of `now_ns` (sessions without the
    /// engine's KV keeping stay live `idle_ns` after their last turn).
    pub fn sessions(
        &self,
        q: &SessionQuery,
        idle_ns: i64,
        now_ns: i64,
    ) -> Result<(Vec<SessionRecord>, Option<SessionCursor>), StoreError> {
        let c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        sessions::page(&c, q, idle_ns, now_ns).map_err(|e| self.sessions_error(e))
    }

    /// Session `id` and its turns in order, each with `gap_before_s`; `None` when unknown.
    pub fn session(
        &self,
        id: &str,
        idle_ns: i64,
        now_ns: i64,
    ) -> Result<Option<(SessionRecord, Vec<serde_json::Value>)>, StoreError> {
        let c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        sessions::one(&c, id, idle_ns, now_ns).map_err(|e| self.sessions_error(e))
    }

    /// The sessions live at `now_ns`, with their turns (for the assembly's tracker).
    pub fn live_sessions(
        &self,
        idle_ns: i64,
        now_ns: i64,
    ) -> Result<Vec<(String, Vec<TurnFacts>)>, StoreError> {
        let c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        sessions::live(&c, idle_ns, now_ns).map_err(sqlite(&self.path))
    }

    fn sessions_error(&self, e: sessions::SessionsError) -> StoreError {
        match e {
            sessions::SessionsError::Sqlite(source) => StoreError::Sqlite {
                path: self.path.display().to_string(),
                source,
            },
            sessions::SessionsError::BadRecord(message) => StoreError::BadSession(message),
        }
    }

    /// How many turn records the store holds.
    pub fn len(&self) -> Result<u64, StoreError> {
        let c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let n: i64 = c
            .query_row("SELECT count(*) FROM turns", [], |r| r.get(0))
            .map_err(sqlite(&self.path))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// True when no row is stored.
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }
}

/// The write side: hands records to the writer thread without waiting for it.
#[derive(Debug, Clone)]
pub struct TurnWriter {
    tx: SyncSender<Arc<TurnRecord>>,
}

impl TurnWriter {
    /// Queues a record; false when the writer is behind (the record is dropped).
    pub fn offer(&self, t: Arc<TurnRecord>) -> bool {
        match self.tx.try_send(t) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }
}

/// An open store: its read side, its write side, and the writer thread (which ends, after
/// committing what is queued, once every [`TurnWriter`] is dropped).
#[derive(Debug)]
pub struct OpenStore {
    /// Where `/v1/turns` reads.
    pub db: TurnDb,
    /// Where the assembly writes.
    pub writer: TurnWriter,
    /// The writer thread.
    pub thread: JoinHandle<()>,
}

/// Opens `path` (creating it and its directory), starts the writer thread.
pub fn open(path: &Path, retention: Retention) -> Result<OpenStore, StoreError> {
    let w = open_rw(path)?;
    let r = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite(path))?;
    r.busy_timeout(Duration::from_secs(5))
        .map_err(sqlite(path))?;
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
    let shown: Arc<Path> = Arc::from(path);
    let thread_path = shown.clone();
    let thread = std::thread::Builder::new()
        .name("turn-store".into())
        .spawn(move || write_loop(w, &thread_path, rx, retention))
        .map_err(StoreError::Thread)?;
    Ok(OpenStore {
        db: TurnDb {
            path: shown,
            conn: Arc::new(Mutex::new(r)),
        },
        writer: TurnWriter { tx },
        thread,
    })
}

/// Commits what arrives, a transaction per batch, until the channel closes.
fn write_loop(mut c: Connection, path: &Path, rx: Receiver<Arc<TurnRecord>>, retention: Retention) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut last_retention: Option<Instant> = None;
    while let Ok(first) = rx.recv() {
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(t) => batch.push(t),
                Err(_) => break,
            }
        }
        if let Err(e) = write_batch(&mut c, &batch, crate::base::vocab::unix_now_ns()) {
            tracing::error!(error = %e, path = %path.display(), records = batch.len(), "TurnStore.WriteFailed");
        }
        batch.clear();
        if last_retention.is_none_or(|t| t.elapsed() >= RETENTION_EVERY) {
            if let Err(e) = apply_retention(&mut c, retention, crate::base::vocab::unix_now_ns()) {
                tracing::error!(error = %e, path = %path.display(), "TurnStore.RetentionFailed");
            }
            last_retention = Some(Instant::now());
        }
    }
}

/// Writes `batch` in one transaction, each record once; `now_ns` is its stored time.
pub fn write_batch(
    c: &mut Connection,
    batch: &[Arc<TurnRecord>],
    now_ns: i64,
) -> Result<usize, rusqlite::Error> {
    let tx = c.transaction()?;
    let mut written = 0;
    // The turns this batch stored (a record written before is not added to its session again).
    let mut stored: Vec<Arc<TurnRecord>> = Vec::with_capacity(batch.len());
    {
        let mut ins = tx.prepare_cached(schema::INSERT)?;
        for t in batch {
            let record = match serde_json::to_string(&**t) {
                Ok(j) => j,
                Err(e) => {
                    tracing::error!(error = %e, request_id = %t.request_id, "TurnStore.Unserializable");
                    continue;
                }
            };
            let n = ins.execute(params![
                t.trace_id,
                &*t.request_id,
                &*t.instance,
                t.session_id.as_deref(),
                t.status.as_str(),
                t.start_time_unix_nano,
                t.end_time_unix_nano,
                now_ns,
                record,
            ])?;
            if n > 0 {
                stored.push(Arc::clone(t));
            }
            written += n;
        }
    }
    sessions::after_write(&tx, &stored)?;
    tx.commit()?;
    Ok(written)
}

/// Deletes what the retention no longer keeps, and makes the records of the sessions that lost
/// turns again; returns the turn rows deleted.
pub fn apply_retention(
    c: &mut Connection,
    r: Retention,
    now_ns: i64,
) -> Result<usize, rusqlite::Error> {
    let age = i64::try_from(r.max_age.as_nanos()).unwrap_or(i64::MAX);
    let keep = i64::try_from(r.max_rows).unwrap_or(i64::MAX);
    let tx = c.transaction()?;
    let mut n = 0;
    let mut touched = Vec::new();
    for (cond, arg) in [
        (schema::OLDER, now_ns.saturating_sub(age)),
        (schema::BEYOND, keep),
    ] {
        touched.extend(sessions::sessions_of(&tx, cond, arg)?);
        n += tx.execute(&format!("DELETE FROM turns WHERE {cond}"), [arg])?;
    }
    if n > 0 {
        sessions::refresh(&tx, touched.iter().map(String::as_str))?;
    }
    tx.commit()?;
    Ok(n)
}

#[cfg(test)]
mod tests;
