//! Sessions in the turn store: each session's record kept beside its turns, made again from
//! them whenever one of its turns is written or deleted, in the same transaction, so the
//! `sessions` table always agrees with `turns` (and a restarted sidecar reads exactly what it
//! wrote). `live` is decided when read: the row keeps the last turn's end and the engine's KV
//! keeping, the reader adds `--session-idle-s` for sessions without it.
//!
//! A found session's turn 1 (`session_extends`) files the keyless turn it extends under the
//! session as its turn 0: that turn's row and record take the session's id.
//!
//! A live session grows one turn at a time: when a batch's turns of a session all arrived after
//! every turn stored before (the usual case), its record is extended with them
//! ([`SessionRecord::extend`], exactly what making it again would give) instead of being made
//! again from all its turns, so a turn costs the same at turn 1,000 as at turn 2. Otherwise (a
//! turn that arrived late, a found session's turn 0 filed, a retention that deleted turns)
//! the record is made again from the stored turns.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::types::Value as Sql;
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::query::filter_and_limit;
use crate::records::session::{
    SessionCursor, SessionQuery, SessionRecord, TurnFacts, detail, summarize,
};
use crate::records::turn::TurnRecord;

/// Writes `session_id` into the keyless turn `request_id` of `instance` (a found session's
/// turn 0): its row and its record. Nothing when that turn is not stored or already has a
/// session.
pub fn link(
    tx: &Transaction<'_>,
    instance: &str,
    request_id: &str,
    session_id: &str,
) -> Result<bool, rusqlite::Error> {
    let found: Option<(i64, String)> = tx
        .query_row(
            "SELECT seq, record FROM turns
             WHERE instance = ?1 AND request_id = ?2 AND session_id IS NULL",
            params![instance, request_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((seq, record)) = found else {
        return Ok(false);
    };
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&record) else {
        return Ok(false);
    };
    if let Some(o) = v.as_object_mut() {
        o.insert("session_id".into(), session_id.into());
        o.insert(
            "session_source".into(),
            slotlight_otel::attr::value::SESSION_SOURCE_FOUND.into(),
        );
        o.insert("session_turn".into(), 0.into());
    }
    tx.execute(
        "UPDATE turns SET session_id = ?1, record = ?2 WHERE seq = ?3",
        params![session_id, v.to_string(), seq],
    )?;
    Ok(true)
}

/// The facts of every stored turn of `id`.
fn facts(c: &Connection, id: &str) -> Result<Vec<TurnFacts>, rusqlite::Error> {
    let mut st = c.prepare_cached("SELECT record FROM turns WHERE session_id = ?1")?;
    let rows = st.query_map([id], |r| r.get::<_, String>(0))?;
    let mut out = Vec::new();
    for json in rows {
        if let Ok(f) = serde_json::from_str::<TurnFacts>(&json?) {
            out.push(f);
        }
    }
    Ok(out)
}

/// Makes the records of sessions `ids` again from their stored turns (deleting a session left
/// with none).
pub fn refresh<'a>(
    tx: &Transaction<'_>,
    ids: impl IntoIterator<Item = &'a str>,
) -> Result<(), rusqlite::Error> {
    for id in ids {
        tx.execute("DELETE FROM session_instances WHERE session_id = ?1", [id])?;
        let Some(r) = summarize(id, facts(tx, id)?, 0, 0) else {
            tx.execute("DELETE FROM sessions WHERE session_id = ?1", [id])?;
            continue;
        };
        write(tx, id, &r)?;
    }
    Ok(())
}

/// Files `batch`'s found turns' turn 0 under their sessions and brings the record of every
/// session the batch touched up to date: extended with the batch's turns, or made again (see
/// the module's documentation). `batch` holds the turns just stored, in the same transaction.
pub fn after_write(
    tx: &Transaction<'_>,
    batch: &[std::sync::Arc<TurnRecord>],
) -> Result<(), rusqlite::Error> {
    let mut touched: BTreeMap<&str, Vec<TurnFacts>> = BTreeMap::new();
    let mut remake: BTreeSet<&str> = BTreeSet::new();
    for t in batch {
        let Some(id) = t.session_id.as_deref() else {
            continue;
        };
        if let Some(extends) = t.session_extends.as_deref()
            && link(tx, &t.instance, extends, id)?
        {
            remake.insert(id);
        }
        touched.entry(id).or_default().push(TurnFacts::from(&**t));
    }
    for (id, turns) in touched {
        if remake.contains(id) || !extend(tx, id, turns)? {
            refresh(tx, [id])?;
        }
    }
    Ok(())
}

/// Session `id`'s stored record (JSON), if the store holds it.
fn stored_record(c: &Connection, id: &str) -> Result<Option<String>, rusqlite::Error> {
    c.query_row(
        "SELECT record FROM sessions WHERE session_id = ?1",
        [id],
        |r| r.get(0),
    )
    .optional()
}

/// Extends session `id`'s stored record with `turns` (just stored) when every one of them
/// arrived after each turn stored before; whether it did.
fn extend(tx: &Transaction<'_>, id: &str, turns: Vec<TurnFacts>) -> Result<bool, rusqlite::Error> {
    let Some(first) = turns.iter().map(|t| t.start_time_unix_nano).min() else {
        return Ok(true);
    };
    let json = stored_record(tx, id)?;
    let Some(mut record) = json.and_then(|j| serde_json::from_str::<SessionRecord>(&j).ok()) else {
        return Ok(false);
    };
    // The stored turns that start no earlier than the batch's first: the batch itself, unless
    // an earlier-stored turn arrived after it (then the order of the sums would differ).
    let later: i64 = tx.query_row(
        "SELECT COUNT(*) FROM turns WHERE session_id = ?1 AND start_time_unix_nano >= ?2",
        params![id, first],
        |r| r.get(0),
    )?;
    if usize::try_from(later).ok() != Some(turns.len()) {
        return Ok(false);
    }
    record.extend(turns, 0, 0);
    write(tx, id, &record)?;
    Ok(true)
}

/// Stores session `id`'s record and the instances that served it.
fn write(tx: &Transaction<'_>, id: &str, r: &SessionRecord) -> Result<(), rusqlite::Error> {
    let Ok(json) = serde_json::to_string(r) else {
        return Ok(());
    };
    let kv_ttl_ns = r.keep_ns(0);
    tx.execute(
        "INSERT INTO sessions (session_id, first_turn_at, last_turn_at, kv_ttl_ns, record)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (session_id) DO UPDATE SET first_turn_at = ?2, last_turn_at = ?3,
             kv_ttl_ns = ?4, record = ?5",
        params![id, r.first_turn_at, r.last_turn_at, kv_ttl_ns, json],
    )?;
    for i in &r.instances {
        tx.execute(
            "INSERT OR IGNORE INTO session_instances (session_id, instance) VALUES (?1, ?2)",
            params![id, i],
        )?;
    }
    Ok(())
}

/// The sessions of the turns rows `cond` selects (before they are deleted).
pub fn sessions_of(c: &Connection, cond: &str, arg: i64) -> Result<Vec<String>, rusqlite::Error> {
    let sql =
        format!("SELECT DISTINCT session_id FROM turns WHERE session_id IS NOT NULL AND {cond}");
    let mut st = c.prepare(&sql)?;
    let rows = st.query_map([arg], |r| r.get::<_, String>(0))?;
    rows.collect()
}

/// Makes every session's record from the stored turns (a store written before sessions were
/// kept).
pub fn rebuild(c: &mut Connection) -> Result<(), rusqlite::Error> {
    let tx = c.transaction()?;
    let ids: Vec<String> = {
        let mut st =
            tx.prepare("SELECT DISTINCT session_id FROM turns WHERE session_id IS NOT NULL")?;
        let rows = st.query_map([], |r| r.get::<_, String>(0))?;
        rows.collect::<Result<_, _>>()?
    };
    refresh(&tx, ids.iter().map(String::as_str))?;
    tx.commit()
}

/// Why a sessions query failed.
#[derive(Debug)]
pub enum SessionsError {
    /// SQLite refused the query.
    Sqlite(rusqlite::Error),
    /// A stored record is not JSON of its kind.
    BadRecord(String),
}

impl From<rusqlite::Error> for SessionsError {
    fn from(e: rusqlite::Error) -> Self {
        SessionsError::Sqlite(e)
    }
}

fn read(json: &str, idle_ns: i64, now_ns: i64) -> Result<SessionRecord, SessionsError> {
    serde_json::from_str::<SessionRecord>(json)
        .map(|r| r.at(idle_ns, now_ns))
        .map_err(|e| SessionsError::BadRecord(e.to_string()))
}

/// One page of `/v1/sessions` from the store, `live` decided as of `now_ns`.
pub fn page(
    c: &Connection,
    q: &SessionQuery,
    idle_ns: i64,
    now_ns: i64,
) -> Result<(Vec<SessionRecord>, Option<SessionCursor>), SessionsError> {
    let mut conds: Vec<&str> = Vec::new();
    let mut args: Vec<Sql> = Vec::new();
    if let Some(t) = q.since {
        conds.push("last_turn_at >= ?");
        args.push(Sql::Integer(t));
    }
    if let Some(t) = q.until {
        conds.push("first_turn_at < ?");
        args.push(Sql::Integer(t));
    }
    if let Some(i) = &q.instance {
        conds.push("session_id IN (SELECT session_id FROM session_instances WHERE instance = ?)");
        args.push(Sql::Text(i.clone()));
    }
    if let Some(live) = q.live {
        conds.push(if live {
            "last_turn_at + (CASE WHEN kv_ttl_ns > 0 THEN kv_ttl_ns ELSE ? END) > ?"
        } else {
            "last_turn_at + (CASE WHEN kv_ttl_ns > 0 THEN kv_ttl_ns ELSE ? END) <= ?"
        });
        args.push(Sql::Integer(idle_ns));
        args.push(Sql::Integer(now_ns));
    }
    if q.min_turns > 1 {
        conds.push("json_extract(record, '$.turns') >= ?");
        args.push(Sql::Integer(i64::try_from(q.min_turns).unwrap_or(i64::MAX)));
    }
    if let Some(cur) = &q.cursor {
        conds.push("(last_turn_at, session_id) < (?, ?)");
        args.push(Sql::Integer(cur.last_turn_at));
        args.push(Sql::Text(cur.session_id.clone()));
    }
    let filter = filter_and_limit(&conds, &mut args, q.limit);
    let sql = format!(
        "SELECT record FROM sessions {filter} ORDER BY last_turn_at DESC, session_id DESC LIMIT ?"
    );
    let mut st = c.prepare_cached(&sql)?;
    let rows = st.query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(0))?;
    let mut found = Vec::new();
    for json in rows {
        found.push(read(&json?, idle_ns, now_ns)?);
    }
    let more = found.len() > q.limit;
    found.truncate(q.limit);
    let next = more
        .then(|| found.last().map(SessionCursor::after))
        .flatten();
    Ok((found, next))
}

/// Session `id`'s record and its turn records in session order (each with `gap_before_s`),
/// `live` decided as of `now_ns`; `None` for a session the store does not hold.
pub fn one(
    c: &Connection,
    id: &str,
    idle_ns: i64,
    now_ns: i64,
) -> Result<Option<(SessionRecord, Vec<serde_json::Value>)>, SessionsError> {
    let json = stored_record(c, id)?;
    let Some(json) = json else {
        return Ok(None);
    };
    let record = read(&json, idle_ns, now_ns)?;
    let mut st = c.prepare_cached("SELECT record FROM turns WHERE session_id = ?1")?;
    let rows = st.query_map([id], |r| r.get::<_, String>(0))?;
    let mut turns = Vec::new();
    for json in rows {
        let v =
            serde_json::from_str(&json?).map_err(|e| SessionsError::BadRecord(e.to_string()))?;
        turns.push(v);
    }
    Ok(Some((record, detail(turns))))
}

/// The sessions live at `now_ns`, with their turns' facts (the assembly's tracker takes them up
/// at start).
pub fn live(
    c: &Connection,
    idle_ns: i64,
    now_ns: i64,
) -> Result<Vec<(String, Vec<TurnFacts>)>, rusqlite::Error> {
    let ids: Vec<String> = {
        let mut st = c.prepare(
            "SELECT session_id FROM sessions
             WHERE last_turn_at + (CASE WHEN kv_ttl_ns > 0 THEN kv_ttl_ns ELSE ?1 END) > ?2",
        )?;
        let rows = st.query_map(params![idle_ns, now_ns], |r| r.get::<_, String>(0))?;
        rows.collect::<Result<_, _>>()?
    };
    ids.into_iter()
        .map(|id| {
            let f = facts(c, &id)?;
            Ok((id, f))
        })
        .collect()
}
