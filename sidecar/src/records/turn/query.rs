//! The query of `/v1/turns`: its filters ([`TurnQuery`]) and where a page ended ([`Cursor`]).
//! The in-memory ring and the SQLite store both answer it, in the same order.

use super::record::{TurnRecord, TurnStatus};

/// Filters of `/v1/turns`.
#[derive(Debug, Default, Clone)]
pub struct TurnQuery {
    /// Only this session; the answer then lists the session's turns oldest first, by
    /// request start.
    pub session_id: Option<String>,
    /// Only this request.
    pub request_id: Option<String>,
    /// Only this engine instance.
    pub instance: Option<String>,
    /// Only turns that ended this way.
    pub status: Option<TurnStatus>,
    /// Only turns that ended at or after this instant (Unix ns).
    pub since: Option<i64>,
    /// Only turns that ended before this instant (Unix ns).
    pub until: Option<i64>,
    /// Only turns past this point of the listing (a previous page's `next_cursor`).
    pub cursor: Option<Cursor>,
    /// At most this many: the newest ones.
    pub limit: usize,
}

impl TurnQuery {
    /// True when the answer lists oldest first: one session's turns, in the order its
    /// conversation ran.
    pub fn oldest_first(&self) -> bool {
        self.session_id.is_some()
    }

    /// True when `t` passes the filters (the cursor is a position, not a filter).
    pub fn matches(&self, t: &TurnRecord) -> bool {
        self.session_id
            .as_deref()
            .is_none_or(|s| t.session_id.as_deref() == Some(s))
            && self
                .request_id
                .as_deref()
                .is_none_or(|r| &*t.request_id == r)
            && self.instance.as_deref().is_none_or(|i| &*t.instance == i)
            && self.status.is_none_or(|s| t.status == s)
            && self.since.is_none_or(|n| t.end_time_unix_nano >= n)
            && self.until.is_none_or(|n| t.end_time_unix_nano < n)
    }

    /// True when the turn at `(seq, start_ns)` lies past the cursor in this listing's order.
    pub fn after_cursor(&self, seq: i64, start_ns: i64) -> bool {
        self.cursor.is_none_or(|c| {
            if self.oldest_first() {
                (start_ns, seq) < (c.start_ns, c.seq)
            } else {
                seq < c.seq
            }
        })
    }
}

/// Where a page ended: the last listed turn's completion number and request start. Written
/// `SEQ.START_NS` on the wire (`next_cursor`, `cursor=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The turn's completion number (the store's `seq`, or the ring's count).
    pub seq: i64,
    /// The turn's `start_time_unix_nano`.
    pub start_ns: i64,
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.seq, self.start_ns)
    }
}

impl std::str::FromStr for Cursor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("cursor {s:?} is not a next_cursor value (SEQ.START_NS)");
        let (seq, start) = s.split_once('.').ok_or_else(bad)?;
        Ok(Cursor {
            seq: seq.parse().map_err(|_| bad())?,
            start_ns: start.parse().map_err(|_| bad())?,
        })
    }
}
