//! The SQLite backend: one table, a response a row (its JSON), written in WAL mode so that a
//! committed response survives the process being killed; every statement runs on the blocking
//! pool, never on the async runtime.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use super::{StoreError, StoreLimits, StoredResponse, unix_now};

/// The schema; `user_version` says which one a file holds.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    conversation TEXT,
    bytes INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created_at);
CREATE INDEX IF NOT EXISTS responses_by_conversation ON responses (conversation, created_at);
PRAGMA user_version = 1;
";

/// Responses in SQLite.
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    limits: StoreLimits,
    in_memory: bool,
}

impl SqliteStore {
    /// Opens the file at `path` (made, with its directory, when missing), or an in-memory
    /// database for `None`.
    pub async fn open(path: Option<PathBuf>, limits: StoreLimits) -> Result<Self, StoreError> {
        let in_memory = path.is_none();
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection, StoreError> {
            let conn = match &path {
                Some(p) => {
                    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                        private_dir(dir)?;
                    }
                    private_file(p)?;
                    let c = Connection::open(p)?;
                    // Before any statement: a lock another process holds at start-up is waited
                    // for, not a failure at the first pragma.
                    c_busy(&c)?;
                    // WAL: a committed transaction is in the log before `put` returns, so a
                    // kill -9 of the engine loses nothing that was stored.
                    c.pragma_update(None, "journal_mode", "WAL")?;
                    c.pragma_update(None, "synchronous", "NORMAL")?;
                    c
                }
                None => Connection::open_in_memory()?,
            };
            c_busy(&conn)?;
            conn.execute_batch(SCHEMA)?;
            // A damaged file (truncated, overwritten) is found now, not at some later read:
            // the engine then serves without the store and says why.
            let check: String = conn.query_row("PRAGMA quick_check(1)", [], |r| r.get(0))?;
            if check != "ok" {
                return Err(StoreError::Damaged(check));
            }
            Ok(conn)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))??;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            limits,
            in_memory,
        })
    }

    /// Whether nothing outlives the process.
    pub fn in_memory(&self) -> bool {
        self.in_memory
    }

    /// Runs `f` with the connection on the blocking pool.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, StoreLimits) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = Arc::clone(&self.conn);
        let limits = self.limits;
        tokio::task::spawn_blocking(move || {
            // A panic while holding the lock leaves a connection SQLite itself kept consistent.
            let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut c, limits)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }

    /// Stores `r` whole, then drops what is over the bounds (never `r` itself).
    pub async fn put(&self, r: &StoredResponse) -> Result<(), StoreError> {
        let body = serde_json::to_string(r)?;
        let (id, created, conversation) = (r.id.clone(), r.created_at, r.conversation.clone());
        self.with(move |c, limits| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT OR REPLACE INTO responses (id, created_at, conversation, bytes, body)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    id,
                    to_i64(created),
                    conversation,
                    to_i64(body.len() as u64),
                    body
                ],
            )?;
            trim(&tx, &id, limits)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The response `id`, unless unknown or past the age bound.
    pub async fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        let id = id.to_string();
        self.with(move |c, limits| {
            let body: Option<String> = c
                .query_row(
                    "SELECT body FROM responses WHERE id = ?1 AND created_at >= ?2",
                    params![id, cutoff(limits)],
                    |row| row.get(0),
                )
                .optional()?;
            Ok(body.map(|b| serde_json::from_str(&b)).transpose()?)
        })
        .await
    }

    /// Deletes `id`; whether it was there.
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with(move |c, limits| {
            let n = c.execute(
                "DELETE FROM responses WHERE id = ?1 AND created_at >= ?2",
                params![id, cutoff(limits)],
            )?;
            Ok(n > 0)
        })
        .await
    }

    /// The newest response of `conversation`.
    pub async fn latest_in(&self, conversation: &str) -> Result<Option<String>, StoreError> {
        let conversation = conversation.to_string();
        self.with(move |c, limits| {
            Ok(c.query_row(
                "SELECT id FROM responses WHERE conversation = ?1 AND created_at >= ?2
                 ORDER BY created_at DESC, rowid DESC LIMIT 1",
                params![conversation, cutoff(limits)],
                |row| row.get(0),
            )
            .optional()?)
        })
        .await
    }
}

/// Waits for a lock held by another connection (a second engine on the same file) rather
/// than failing at once.
/// Makes the store's folder (and any missing above it) readable by the engine's user alone
/// (0700); a folder that already exists keeps its permissions (it may be shared, as `/tmp`).
fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

/// Makes the store's file readable and writable by the engine's user alone (0600), whether
/// it is new or was there (SQLite gives its WAL and shared-memory files the same mode): the
/// stored conversations are no other local account's to read.
fn private_file(path: &std::path::Path) -> std::io::Result<()> {
    let mut o = std::fs::OpenOptions::new();
    o.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let f = o.open(path)?;
    #[cfg(unix)]
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    drop(f);
    Ok(())
}

fn c_busy(c: &Connection) -> Result<(), rusqlite::Error> {
    c.busy_timeout(std::time::Duration::from_secs(5))
}

/// The oldest creation time still kept.
fn cutoff(limits: StoreLimits) -> i64 {
    to_i64(unix_now().saturating_sub(limits.max_age.as_secs()))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Drops responses past the age bound, then the oldest until count and bytes are within
/// their bounds; `keep` (the response just written) is never dropped.
fn trim(tx: &rusqlite::Transaction<'_>, keep: &str, limits: StoreLimits) -> Result<(), StoreError> {
    tx.execute(
        "DELETE FROM responses WHERE created_at < ?1 AND id != ?2",
        params![cutoff(limits), keep],
    )?;
    let (count, bytes): (i64, i64) = tx.query_row(
        "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM responses",
        [],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    let max_count = i64::try_from(limits.max_responses).unwrap_or(i64::MAX);
    let max_bytes = to_i64(limits.max_bytes);
    if count <= max_count && bytes <= max_bytes {
        return Ok(());
    }
    let mut oldest = tx.prepare(
        "SELECT id, bytes FROM responses WHERE id != ?1 ORDER BY created_at ASC, rowid ASC",
    )?;
    let rows = oldest.query_map(params![keep], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
    })?;
    let (mut count, mut bytes) = (count, bytes);
    let mut drop = Vec::new();
    for row in rows {
        if count <= max_count && bytes <= max_bytes {
            break;
        }
        let (id, b) = row?;
        count -= 1;
        bytes -= b;
        drop.push(id);
    }
    drop_rows(tx, &drop)
}

fn drop_rows(tx: &rusqlite::Transaction<'_>, ids: &[String]) -> Result<(), StoreError> {
    let mut del = tx.prepare("DELETE FROM responses WHERE id = ?1")?;
    for id in ids {
        del.execute(params![id])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::response;
    use super::*;
    use std::time::Duration;

    fn limits(max_responses: usize, max_bytes: u64) -> StoreLimits {
        StoreLimits {
            max_responses,
            max_bytes,
            max_age: Duration::from_secs(3600),
        }
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn the_file_and_its_new_folder_are_the_engines_users_alone() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("slotlight-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let path = root.join("private").join("responses.db");
        let s = SqliteStore::open(Some(path.clone()), StoreLimits::default())
            .await
            .expect("open");
        s.put(&response("resp_a", None, 10)).await.expect("put");
        let mode = |p: &std::path::Path| {
            std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777
        };
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().expect("folder")), 0o700);
        assert_eq!(mode(&root), 0o700, "a folder made for it");
        let wal = path.with_extension("db-wal");
        if wal.exists() {
            assert_eq!(mode(&wal), 0o600);
        }
        drop(s);
        // A file that was there, readable by others, is made private when opened.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let s = SqliteStore::open(Some(path.clone()), StoreLimits::default())
            .await
            .expect("reopen");
        assert_eq!(
            s.get("resp_a").await.expect("get").map(|r| r.id).as_deref(),
            Some("resp_a")
        );
        assert_eq!(mode(&path), 0o600);
        drop(s);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn a_response_comes_back_whole_and_goes_when_deleted() {
        let s = SqliteStore::open(None, StoreLimits::default())
            .await
            .expect("open");
        let r = response("resp_a", Some("conv_1"), 10);
        s.put(&r).await.expect("put");
        assert_eq!(s.get("resp_a").await.expect("get"), Some(r));
        assert_eq!(
            s.latest_in("conv_1").await.expect("latest").as_deref(),
            Some("resp_a")
        );
        assert!(s.delete("resp_a").await.expect("delete"));
        assert!(!s.delete("resp_a").await.expect("delete twice"));
        assert_eq!(s.get("resp_a").await.expect("get"), None);
    }

    #[tokio::test]
    async fn the_oldest_go_first_beyond_the_count_and_the_bytes() {
        let s = SqliteStore::open(None, limits(2, u64::MAX))
            .await
            .expect("open");
        for id in ["r1", "r2", "r3"] {
            s.put(&response(id, None, 10)).await.expect("put");
        }
        assert!(s.get("r1").await.expect("get").is_none(), "over the count");
        assert!(s.get("r3").await.expect("get").is_some());
        // Each response is well over 1,000 bytes: a bound of 3,000 keeps two at most.
        let s = SqliteStore::open(None, limits(100, 3_000))
            .await
            .expect("open");
        for id in ["b1", "b2", "b3"] {
            s.put(&response(id, None, 1_000)).await.expect("put");
        }
        assert!(s.get("b1").await.expect("get").is_none(), "over the bytes");
        assert!(s.get("b3").await.expect("get").is_some());
        // The response just written stays, even alone over the bound.
        s.put(&response("huge", None, 10_000)).await.expect("put");
        assert!(s.get("huge").await.expect("get").is_some());
    }

    #[tokio::test]
    async fn a_response_past_its_age_is_gone() {
        let s = SqliteStore::open(None, limits(10, u64::MAX))
            .await
            .expect("open");
        let mut old = response("old", Some("c"), 1);
        old.created_at = unix_now() - 7200;
        s.put(&old).await.expect("put");
        assert!(s.get("old").await.expect("get").is_none());
        assert!(s.latest_in("c").await.expect("latest").is_none());
    }

    #[tokio::test]
    async fn a_file_keeps_responses_across_openings() {
        let dir = std::env::temp_dir().join(format!("slotlight-resp-{}", std::process::id()));
        let path = dir.join("nested").join("responses.db");
        {
            let s = SqliteStore::open(Some(path.clone()), StoreLimits::default())
                .await
                .expect("open");
            s.put(&response("kept", None, 5)).await.expect("put");
        }
        let s = SqliteStore::open(Some(path), StoreLimits::default())
            .await
            .expect("reopen");
        assert!(s.get("kept").await.expect("get").is_some());
        let _ = std::fs::remove_dir_all(dir);
    }
}
