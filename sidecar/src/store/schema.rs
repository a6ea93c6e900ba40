//! The turn store's SQLite schema (documented for `sqlite3` users in docs/api.md, "Turn
//! store"). One row per finished request; `record` is the `/v1/turns` item as JSON, byte for
//! byte, and the other columns are what the filters and the retention read. One row per
//! session, its `/v1/sessions` item as JSON (`live` decided when read), made from its turns
//! ([`super::sessions`]), and the instances that served it.

/// `PRAGMA user_version` of the schema below; a file with a newer version is refused. Version
/// 2 added the sessions; a version 1 file gets them made from its turns when opened.
pub const VERSION: i64 = 2;

/// Creates the table and its indexes when absent (idempotent).
pub const CREATE: &str = "
CREATE TABLE IF NOT EXISTS turns (
    seq                  INTEGER PRIMARY KEY AUTOINCREMENT,
    trace_id             TEXT    NOT NULL,
    request_id           TEXT    NOT NULL,
    instance             TEXT    NOT NULL,
    session_id           TEXT,
    status               TEXT    NOT NULL,
    start_time_unix_nano INTEGER NOT NULL,
    end_time_unix_nano   INTEGER NOT NULL,
    stored_unix_nano     INTEGER NOT NULL,
    record               TEXT    NOT NULL,
    UNIQUE (instance, trace_id, request_id)
);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns (session_id, start_time_unix_nano, seq);
CREATE INDEX IF NOT EXISTS turns_by_end ON turns (end_time_unix_nano);
CREATE INDEX IF NOT EXISTS turns_by_stored ON turns (stored_unix_nano);
CREATE TABLE IF NOT EXISTS sessions (
    session_id    TEXT    PRIMARY KEY,
    first_turn_at INTEGER NOT NULL,
    last_turn_at  INTEGER NOT NULL,
    kv_ttl_ns     INTEGER NOT NULL,
    record        TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_last ON sessions (last_turn_at, session_id);
CREATE TABLE IF NOT EXISTS session_instances (
    session_id TEXT NOT NULL,
    instance   TEXT NOT NULL,
    PRIMARY KEY (session_id, instance)
);
CREATE INDEX IF NOT EXISTS session_instances_by_instance ON session_instances (instance);
";

/// Writes one turn once: a second write of the same (instance, trace, request) changes
/// nothing.
pub const INSERT: &str = "
INSERT INTO turns (trace_id, request_id, instance, session_id, status,
                   start_time_unix_nano, end_time_unix_nano, stored_unix_nano, record)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (instance, trace_id, request_id) DO NOTHING
";

/// Retention by age: the rows stored before `?1` (Unix ns), as a condition.
pub const OLDER: &str = "stored_unix_nano < ?1";

/// Retention by count: all but the newest `?1` rows, as a condition.
pub const BEYOND: &str = "seq <= (SELECT seq FROM turns ORDER BY seq DESC LIMIT 1 OFFSET ?1)";
