//! The SQLite backend: one table, a response a row (its own part as JSON, its link in a column
//! of its own), written in WAL mode so that a committed response survives the process being
//! killed; every statement runs on the blocking pool, never on the async runtime.
//!
//! A save reads its parent's chain, stores its own part and trims, in one transaction; a
//! removal (eviction or delete) folds the removed part into its children in the same one, so a
//! reader never sees a chain half changed. Schema 1 (rows holding whole histories, no link
//! column) is migrated to schema 2 when the file is opened: its rows read as self-contained.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::chain::{self, MAX_CHAIN, Part};
use super::{StoreError, StoreLimits, StoredResponse, unix_now};

/// The schema's table and indexes (a file of schema 1 lacks the `link` column, added by
/// [`migrate`]).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    conversation TEXT,
    bytes INTEGER NOT NULL,
    body TEXT NOT NULL,
    link TEXT
);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created_at);
CREATE INDEX IF NOT EXISTS responses_by_conversation ON responses (conversation, created_at);
";

/// The schema version this code writes (`PRAGMA user_version`): 2 keeps a chain as links.
const SCHEMA_VERSION: i64 = 2;

/// Responses in SQLite.
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    limits: StoreLimits,
    in_memory: bool,
    /// The most responses a stored chain holds ([`MAX_CHAIN`]; smaller in tests).
    chain_limit: usize,
}

impl SqliteStore {
    /// Opens the file at `path` (made, with its directory, when missing), or an in-memory
    /// database for `None`.
    pub async fn open(path: Option<PathBuf>, limits: StoreLimits) -> Result<Self, StoreError> {
        let in_memory = path.is_none();
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection, StoreError> {
            let mut conn = match &path {
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
            // A damaged file (truncated, overwritten) is found now, not at some later read:
            // the engine then serves without the store and says why.
            let check: String = conn.query_row("PRAGMA quick_check(1)", [], |r| r.get(0))?;
            if check != "ok" {
                return Err(StoreError::Damaged(check));
            }
            migrate(&mut conn)?;
            Ok(conn)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))??;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            limits,
            in_memory,
            chain_limit: MAX_CHAIN,
        })
    }

    /// Whether nothing outlives the process.
    pub fn in_memory(&self) -> bool {
        self.in_memory
    }

    /// Runs `f` with the connection on the blocking pool.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, StoreLimits, usize) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = Arc::clone(&self.conn);
        let (limits, chain_limit) = (self.limits, self.chain_limit);
        tokio::task::spawn_blocking(move || {
            // A panic while holding the lock leaves a connection SQLite itself kept consistent.
            let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut c, limits, chain_limit)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }

    /// Stores `r` as its own part linked to its parent (when that is stored), then drops what
    /// is over the bounds (never `r` itself), in one transaction.
    pub async fn put(&self, r: &StoredResponse) -> Result<(), StoreError> {
        let r = r.clone();
        self.with(move |c, limits, chain_limit| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let parent = match &r.previous {
                Some(p) => linkable_parent(&tx, &r, p, chain_limit)?,
                None => None,
            };
            let part = Part::of(&r, parent.as_ref());
            // Replacing a response of the same id: its old part goes first, into its children.
            remove(&tx, &r.id)?;
            insert(&tx, &part)?;
            trim(&tx, &r.id, limits)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The response `id` whole (its chain walked), unless unknown or past the age bound.
    pub async fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        let id = id.to_string();
        self.with(move |c, limits, chain_limit| {
            // One read transaction: the chain is read as one moment saw it.
            let tx = c.transaction()?;
            if !stored_within_age(&tx, &id, limits)? {
                return Ok(None);
            }
            read_whole(&tx, &id, chain_limit)
        })
        .await
    }

    /// Deletes `id`, its part folded into its children; whether it was there.
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with(move |c, limits, _| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if !stored_within_age(&tx, &id, limits)? {
                return Ok(false);
            }
            remove(&tx, &id)?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    /// The newest response of `conversation`.
    pub async fn latest_in(&self, conversation: &str) -> Result<Option<String>, StoreError> {
        let conversation = conversation.to_string();
        self.with(move |c, limits, _| {
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

#[cfg(test)]
impl SqliteStore {
    /// The bytes `id`'s own part takes (0 when it is not stored).
    pub async fn stored_bytes(&self, id: &str) -> Result<u64, StoreError> {
        let id = id.to_string();
        self.with(move |c, _, _| {
            let bytes: Option<i64> = c
                .query_row(
                    "SELECT bytes FROM responses WHERE id = ?1",
                    params![id],
                    |row| row.get(0),
                )
                .optional()?;
            Ok(bytes.map_or(0, |b| u64::try_from(b).unwrap_or(0)))
        })
        .await
    }
}

/// Brings a file of an earlier schema to [`SCHEMA_VERSION`] (a new one is made at it), in one
/// transaction: schema 1's rows lack the `link` column and read as self-contained.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(SCHEMA)?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version < SCHEMA_VERSION {
        if !has_link_column(&tx)? {
            tx.execute_batch("ALTER TABLE responses ADD COLUMN link TEXT")?;
        }
        tx.execute_batch(&format!(
            "CREATE INDEX IF NOT EXISTS responses_by_link ON responses (link);
             PRAGMA user_version = {SCHEMA_VERSION};"
        ))?;
    }
    tx.commit()?;
    Ok(())
}

fn has_link_column(tx: &rusqlite::Transaction<'_>) -> Result<bool, StoreError> {
    let mut q = tx.prepare("SELECT 1 FROM pragma_table_info('responses') WHERE name = 'link'")?;
    Ok(q.exists([])?)
}

/// Whether `id` is stored and within the age bound.
fn stored_within_age(c: &Connection, id: &str, limits: StoreLimits) -> Result<bool, StoreError> {
    let mut q = c.prepare_cached("SELECT 1 FROM responses WHERE id = ?1 AND created_at >= ?2")?;
    Ok(q.exists(params![id, cutoff(limits)])?)
}

/// One stored part, its link from its column; `None` when `id` is not stored.
fn read_part(c: &Connection, id: &str) -> Result<Option<Part>, StoreError> {
    let mut q = c.prepare_cached("SELECT link, body FROM responses WHERE id = ?1")?;
    let row: Option<(Option<String>, String)> = q
        .query_row(params![id], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    row.map(|(link, body)| {
        let mut part: Part = serde_json::from_str(&body)?;
        part.link = link;
        Ok(part)
    })
    .transpose()
}

/// The chain of `id`, `id` first; `None` when it is not stored.
fn read_chain(c: &Connection, id: &str, limit: usize) -> Result<Option<Vec<Part>>, StoreError> {
    chain::walk(id, limit, |at| read_part(c, at))
}

/// The response `id` whole; `None` when it is not stored.
fn read_whole(
    c: &Connection,
    id: &str,
    limit: usize,
) -> Result<Option<StoredResponse>, StoreError> {
    read_chain(c, id, limit)?
        .map(|chain| chain::rebuild(&chain))
        .transpose()
}

/// The stored parent `previous` of `r`, whole, when `r` may link to it: `None` when it is not
/// stored, its chain is broken or at the limit, or it holds `r` (then `r` is stored
/// self-contained).
fn linkable_parent(
    c: &Connection,
    r: &StoredResponse,
    previous: &str,
    limit: usize,
) -> Result<Option<StoredResponse>, StoreError> {
    let chain = match read_chain(c, previous, limit) {
        Ok(Some(chain)) => chain,
        Ok(None) | Err(StoreError::Chain(_)) | Err(StoreError::Decode(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    if !chain::may_link(r, &chain, limit) {
        return Ok(None);
    }
    match chain::rebuild(&chain) {
        Ok(parent) => Ok(Some(parent)),
        Err(StoreError::Chain(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `part` (its id not stored).
fn insert(c: &Connection, part: &Part) -> Result<(), StoreError> {
    let body = serde_json::to_string(part)?;
    c.execute(
        "INSERT INTO responses (id, created_at, conversation, bytes, body, link)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            part.id,
            to_i64(part.created_at),
            part.conversation,
            to_i64(body.len() as u64),
            body,
            part.link
        ],
    )?;
    Ok(())
}

/// Removes `id`, its part folded into each stored child first; the bytes it freed, net of
/// what its children grew (0 when it was not stored). A part that does not decode is removed
/// all the same (its children keep their link to it, and reading them is an error): damage
/// never blocks the store.
fn remove(c: &Connection, id: &str) -> Result<i64, StoreError> {
    let Some(bytes) = c
        .query_row(
            "SELECT bytes FROM responses WHERE id = ?1",
            params![id],
            |row| row.get::<_, i64>(0),
        )
        .optional()?
    else {
        return Ok(0);
    };
    let grown = match read_part(c, id) {
        Ok(Some(parent)) => fold_into_children(c, &parent)?,
        Ok(None) | Err(StoreError::Decode(_)) => 0,
        Err(e) => return Err(e),
    };
    c.execute("DELETE FROM responses WHERE id = ?1", params![id])?;
    Ok(bytes - grown)
}

/// Folds `parent` (about to be removed) into each stored child; the bytes they grew by.
fn fold_into_children(c: &Connection, parent: &Part) -> Result<i64, StoreError> {
    let children: Vec<String> = {
        let mut q = c.prepare_cached("SELECT id FROM responses WHERE link = ?1 AND id != ?1")?;
        q.query_map(params![parent.id], |row| row.get(0))?
            .collect::<Result<_, _>>()?
    };
    let mut grown = 0;
    for id in children {
        let mut child = match read_part(c, &id) {
            Ok(Some(child)) => child,
            Ok(None) | Err(StoreError::Decode(_)) => continue,
            Err(e) => return Err(e),
        };
        if chain::fold_into(parent, &mut child) {
            grown += rewrite(c, &child)?;
        }
    }
    Ok(grown)
}

/// Writes `part` over its stored row; how many bytes it grew by.
fn rewrite(c: &Connection, part: &Part) -> Result<i64, StoreError> {
    let body = serde_json::to_string(part)?;
    let before: i64 = c.query_row(
        "SELECT bytes FROM responses WHERE id = ?1",
        params![part.id],
        |row| row.get(0),
    )?;
    let after = to_i64(body.len() as u64);
    c.execute(
        "UPDATE responses SET link = ?2, bytes = ?3, body = ?4 WHERE id = ?1",
        params![part.id, part.link, after, body],
    )?;
    Ok(after - before)
}

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

/// Waits for a lock held by another connection (a second engine on the same file) rather
/// than failing at once.
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
/// their bounds, oldest first, each folded into its children; `keep` (the response just
/// written) is never dropped.
fn trim(tx: &rusqlite::Transaction<'_>, keep: &str, limits: StoreLimits) -> Result<(), StoreError> {
    let past_age: Vec<String> = {
        let mut q = tx.prepare(
            "SELECT id FROM responses WHERE created_at < ?1 AND id != ?2
             ORDER BY created_at ASC, rowid ASC",
        )?;
        q.query_map(params![cutoff(limits), keep], |row| row.get(0))?
            .collect::<Result<_, _>>()?
    };
    for id in past_age {
        remove(tx, &id)?;
    }
    let (mut count, mut bytes): (i64, i64) = tx.query_row(
        "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM responses",
        [],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    let max_count = i64::try_from(limits.max_responses).unwrap_or(i64::MAX);
    let max_bytes = to_i64(limits.max_bytes);
    while count > max_count || bytes > max_bytes {
        let Some(oldest) = oldest_but(tx, keep)? else {
            break;
        };
        bytes -= remove(tx, &oldest)?;
        count -= 1;
    }
    Ok(())
}

/// The oldest stored response but `keep`.
fn oldest_but(c: &Connection, keep: &str) -> Result<Option<String>, StoreError> {
    let mut q = c.prepare_cached(
        "SELECT id FROM responses WHERE id != ?1 ORDER BY created_at ASC, rowid ASC LIMIT 1",
    )?;
    Ok(q.query_row(params![keep], |row| row.get(0)).optional()?)
}

#[cfg(test)]
mod tests {
    use super::super::chain::tests as chains;
    use super::super::tests::response;
    use super::super::{Backend, ResponseStore};
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

    async fn store(limits: StoreLimits) -> ResponseStore {
        let s = SqliteStore::open(None, limits).await.expect("open");
        ResponseStore::with(Backend::Sqlite(s))
    }

    #[tokio::test]
    async fn a_chain_is_kept_as_links_in_linear_bytes() {
        chains::a_chain_is_kept_in_linear_bytes(&store(limits(1_000, u64::MAX)).await).await;
    }

    #[tokio::test]
    async fn deleting_a_parent_keeps_its_children_exact() {
        chains::deleting_keeps_the_children_exact(&store(limits(1_000, u64::MAX)).await).await;
    }

    #[tokio::test]
    async fn evicting_a_parent_by_count_bytes_or_age_keeps_its_children_exact() {
        chains::evicting_by_count_keeps_the_rest_exact(&store(limits(5, u64::MAX)).await).await;
        let bound = 30_000;
        chains::evicting_by_bytes_keeps_the_rest_exact(&store(limits(1_000, bound)).await, bound)
            .await;
        chains::a_parent_past_its_age_is_swept_into_its_child(
            &store(limits(1_000, u64::MAX)).await,
        )
        .await;
    }

    /// The link column of `id` (`None` for none or not stored).
    async fn link_of(s: &SqliteStore, id: &str) -> Option<String> {
        let id = id.to_string();
        s.with(move |c, _, _| {
            Ok(c.query_row(
                "SELECT link FROM responses WHERE id = ?1",
                params![id],
                |row| row.get(0),
            )
            .optional()?
            .flatten())
        })
        .await
        .expect("link")
    }

    /// Runs one statement on the store's connection, as damage would.
    async fn damage(s: &SqliteStore, sql: &'static str) {
        s.with(move |c, _, _| Ok(c.execute_batch(sql)?))
            .await
            .expect("damage");
    }

    /// The earlier schema (1): rows of whole responses, no link.
    const SCHEMA_1: &str = "
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

    #[tokio::test]
    async fn a_file_of_the_earlier_form_reads_on_and_its_chains_continue() {
        let dir = std::env::temp_dir().join(format!("slotlight-resp-v1-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("folder");
        let path = dir.join("responses.db");
        let chain = chains::turns(3);
        // The first two as the earlier code wrote them: whole, without `previous`.
        let old: Vec<StoredResponse> = chain[..2]
            .iter()
            .map(|t| StoredResponse {
                previous: None,
                ..t.clone()
            })
            .collect();
        {
            let c = Connection::open(&path).expect("open");
            c.execute_batch(SCHEMA_1).expect("schema 1");
            for t in &old {
                let body = serde_json::to_string(t).expect("json");
                assert!(body.contains("\"history\":") && body.contains("\"prompt_tokens\":"));
                c.execute(
                    "INSERT INTO responses (id, created_at, conversation, bytes, body)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![
                        t.id,
                        to_i64(t.created_at),
                        t.conversation,
                        body.len() as i64,
                        body
                    ],
                )
                .expect("insert");
            }
        }
        let s = SqliteStore::open(Some(path.clone()), limits(1_000, u64::MAX))
            .await
            .expect("open");
        let version: i64 = s
            .with(|c, _, _| Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?))
            .await
            .expect("version");
        assert_eq!(version, SCHEMA_VERSION);
        for t in &old {
            assert_eq!(s.get(&t.id).await.expect("get").as_ref(), Some(t));
        }
        // A continuation of an old row links to it, and keeps its own part only.
        s.put(&chain[2]).await.expect("put");
        assert_eq!(link_of(&s, "resp_t3").await.as_deref(), Some("resp_t2"));
        assert_eq!(
            s.get("resp_t3").await.expect("get").as_ref(),
            Some(&chain[2])
        );
        // Removing the old parent folds it into its child.
        assert!(s.delete("resp_t2").await.expect("delete"));
        assert_eq!(link_of(&s, "resp_t3").await, None, "self-contained now");
        assert_eq!(
            s.get("resp_t3").await.expect("get").as_ref(),
            Some(&chain[2])
        );
        assert_eq!(s.get("resp_t1").await.expect("get").as_ref(), Some(&old[0]));
        drop(s);
        // Opened again: migrated once, everything as it was.
        let s = SqliteStore::open(Some(path), limits(1_000, u64::MAX))
            .await
            .expect("reopen");
        assert_eq!(
            s.get("resp_t3").await.expect("get").as_ref(),
            Some(&chain[2])
        );
        assert_eq!(s.get("resp_t2").await.expect("get"), None);
        drop(s);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_broken_chain_is_an_error_never_a_panic() {
        let s = SqliteStore::open(None, limits(1_000, u64::MAX))
            .await
            .expect("open");
        let chain = chains::turns(4);
        for t in &chain {
            s.put(t).await.expect("put");
        }
        // A parent removed without its fold.
        damage(&s, "DELETE FROM responses WHERE id = 'resp_t2'").await;
        let err = s.get("resp_t4").await.expect_err("a missing link");
        assert!(matches!(err, StoreError::Chain(_)), "{err:?}");
        assert!(
            err.to_string().contains("`resp_t2`, which is not stored"),
            "{err}"
        );
        assert_eq!(err.api_error().status.as_u16(), 500);
        assert_eq!(
            s.get("resp_t1").await.expect("get").as_ref(),
            Some(&chain[0])
        );
        // A cycle: resp_t3 links to its own child.
        damage(
            &s,
            "UPDATE responses SET link = 'resp_t4' WHERE id = 'resp_t3'",
        )
        .await;
        let err = s.get("resp_t4").await.expect_err("a cycle");
        assert!(err.to_string().contains("a cycle"), "{err}");
        // A continuation of a broken chain is stored self-contained, and the broken ones can
        // still be deleted and evicted.
        let mut next = chains::next_turn(Some(&chain[3]), "resp_t5", 5);
        next.previous = Some("resp_t4".into());
        s.put(&next).await.expect("put");
        assert_eq!(link_of(&s, "resp_t5").await, None);
        assert_eq!(s.get("resp_t5").await.expect("get").as_ref(), Some(&next));
        assert!(s.delete("resp_t3").await.expect("delete"));
        assert!(s.delete("resp_t4").await.expect("delete"));
        // A body that does not decode: reading it is an error, removing it is not.
        damage(&s, "UPDATE responses SET body = '{' WHERE id = 'resp_t1'").await;
        assert!(matches!(
            s.get("resp_t1").await.expect_err("damaged"),
            StoreError::Decode(_)
        ));
        assert!(s.delete("resp_t1").await.expect("delete"));
        assert_eq!(s.get("resp_t5").await.expect("get").as_ref(), Some(&next));
    }

    #[tokio::test]
    async fn a_chain_at_its_limit_goes_on_self_contained_and_a_longer_one_is_an_error() {
        let mut s = SqliteStore::open(None, limits(1_000, u64::MAX))
            .await
            .expect("open");
        s.chain_limit = 4;
        let chain = chains::turns(10);
        for t in &chain {
            s.put(t).await.expect("put");
        }
        for t in &chain {
            assert_eq!(s.get(&t.id).await.expect("get").as_ref(), Some(t));
        }
        assert_eq!(link_of(&s, "resp_t4").await.as_deref(), Some("resp_t3"));
        assert_eq!(
            link_of(&s, "resp_t5").await,
            None,
            "the chain was at its limit"
        );
        assert_eq!(link_of(&s, "resp_t9").await, None);
        s.chain_limit = 2;
        let err = s.get("resp_t4").await.expect_err("too long");
        assert!(err.to_string().contains("longer than 2"), "{err}");
    }
}
