//! `/v1/turns` against the store: the filters of a [`TurnQuery`] as SQL, one page at a time.
//!
//! Order and paging are the ring's: without a session, newest first by completion (`seq`);
//! with `session_id`, the session's latest turns by request start, listed oldest first. A
//! page that may have more after it carries a [`Cursor`]; passing it back as `cursor=` gives
//! the next (older) page.

use rusqlite::Connection;
use rusqlite::types::Value as Sql;
use serde_json::value::RawValue;

use crate::records::turn::{Cursor, TurnQuery};

/// One page of stored records, each the `/v1/turns` item exactly as it was written.
#[derive(Debug, Default)]
pub struct TurnPage {
    /// The records, in the listing's order.
    pub turns: Vec<Box<RawValue>>,
    /// Where the next page starts, when there may be one.
    pub next_cursor: Option<Cursor>,
}

/// Why a query failed.
#[derive(Debug)]
pub enum QueryError {
    /// SQLite refused the query.
    Sqlite(rusqlite::Error),
    /// A stored record is not JSON.
    BadRecord {
        /// The sequence number of the row that did not decode.
        seq: i64,
        /// The parse error.
        source: serde_json::Error,
    },
}

impl From<rusqlite::Error> for QueryError {
    fn from(e: rusqlite::Error) -> Self {
        QueryError::Sqlite(e)
    }
}

/// A page's `WHERE` clause of `conds` (empty without any), with its `LIMIT ?` argument pushed
/// onto `args`: one more row than `limit`, which tells whether another page follows.
pub(super) fn filter_and_limit(conds: &[&str], args: &mut Vec<Sql>, limit: usize) -> String {
    args.push(Sql::Integer(
        i64::try_from(limit)
            .unwrap_or(i64::MAX - 1)
            .saturating_add(1),
    ));
    if conds.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conds.join(" AND "))
    }
}

/// Runs `q` on `c`.
pub fn run(c: &Connection, q: &TurnQuery) -> Result<TurnPage, QueryError> {
    let mut conds: Vec<&str> = Vec::new();
    let mut args: Vec<Sql> = Vec::new();
    let mut text = |cond: &'static str, v: &Option<String>, args: &mut Vec<Sql>| {
        if let Some(v) = v {
            conds.push(cond);
            args.push(Sql::Text(v.clone()));
        }
    };
    text("session_id = ?", &q.session_id, &mut args);
    text("request_id = ?", &q.request_id, &mut args);
    text("instance = ?", &q.instance, &mut args);
    if let Some(s) = q.status {
        conds.push("status = ?");
        args.push(Sql::Text(s.as_str().into()));
    }
    if let Some(t) = q.since {
        conds.push("end_time_unix_nano >= ?");
        args.push(Sql::Integer(t));
    }
    if let Some(t) = q.until {
        conds.push("end_time_unix_nano < ?");
        args.push(Sql::Integer(t));
    }
    let by_session = q.oldest_first();
    if let Some(cur) = q.cursor {
        if by_session {
            conds.push("(start_time_unix_nano, seq) < (?, ?)");
            args.push(Sql::Integer(cur.start_ns));
        } else {
            conds.push("seq < ?");
        }
        args.push(Sql::Integer(cur.seq));
    }
    let order = if by_session {
        "start_time_unix_nano DESC, seq DESC"
    } else {
        "seq DESC"
    };
    let filter = filter_and_limit(&conds, &mut args, q.limit);
    let sql = format!(
        "SELECT seq, start_time_unix_nano, record FROM turns {filter} ORDER BY {order} LIMIT ?"
    );
    let mut st = c.prepare_cached(&sql)?;
    let rows = st.query_map(rusqlite::params_from_iter(args), |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, String>(2)?,
        ))
    })?;
    let mut found = Vec::new();
    for row in rows {
        found.push(row?);
    }
    let more = found.len() > q.limit;
    found.truncate(q.limit);
    let next_cursor = found
        .last()
        .filter(|_| more)
        .map(|(seq, start_ns, _)| Cursor {
            seq: *seq,
            start_ns: *start_ns,
        });
    if by_session {
        found.reverse();
    }
    let turns = found
        .into_iter()
        .map(|(seq, _, json)| {
            RawValue::from_string(json).map_err(|source| QueryError::BadRecord { seq, source })
        })
        .collect::<Result<_, _>>()?;
    Ok(TurnPage { turns, next_cursor })
}
