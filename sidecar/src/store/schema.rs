//! The turn store's SQLite schema (documented for `sqlite3` users in docs/api.md, "Turn
//! store"). One row per finished request; `record` is the `/v1/turns` item as JSON, byte for
//! byte, and the other columns are what the filters and the retention read.

/// `PRAGMA user_version` of the schema below; a file with a newer version is refused.
pub const VERSION: i64 = 1;

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
";

/// Writes one turn once: a second write of the same (instance, trace, request) changes
/// nothing.
pub const INSERT: &str = "
INSERT INTO turns (trace_id, request_id, instance, session_id, status,
                   start_time_unix_nano, end_time_unix_nano, stored_unix_nano, record)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (instance, trace_id, request_id) DO NOTHING
";

/// Retention by age: rows stored before `?1` (Unix ns).
pub const DELETE_OLDER: &str = "DELETE FROM turns WHERE stored_unix_nano < ?1";

/// Retention by count: all but the newest `?1` rows.
pub const DELETE_BEYOND: &str = "
DELETE FROM turns WHERE seq <= (SELECT seq FROM turns ORDER BY seq DESC LIMIT 1 OFFSET ?1)
";
