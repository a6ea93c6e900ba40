//! The query of `/v1/sessions`: its filters ([`SessionQuery`]) and where a page ended
//! ([`SessionCursor`]). Sessions are listed by latest activity first (`last_turn_at`, then
//! session id, both descending); the ring and the store answer in the same order.

use super::record::SessionRecord;

/// Filters of `/v1/sessions`.
#[derive(Debug, Default, Clone)]
pub struct SessionQuery {
    /// Only sessions active at or after this instant (Unix ns): `last_turn_at >= since`.
    pub since: Option<i64>,
    /// Only sessions active before this instant (Unix ns): `first_turn_at < until`.
    pub until: Option<i64>,
    /// Only sessions with a turn served by this engine instance.
    pub instance: Option<String>,
    /// Only live sessions (`true`) or ended ones (`false`).
    pub live: Option<bool>,
    /// Only sessions of at least this many turns (`/v1/sessions` asks 2 unless told: every
    /// keyless request starts a provisional session of one turn).
    pub min_turns: u64,
    /// Only sessions past this point of the listing (a previous page's `next_cursor`).
    pub cursor: Option<SessionCursor>,
    /// At most this many.
    pub limit: usize,
}

impl SessionQuery {
    /// True when `s` (its `live` decided) passes the filters; the cursor is a position, not a
    /// filter.
    pub fn matches(&self, s: &SessionRecord) -> bool {
        self.since.is_none_or(|n| s.last_turn_at >= n)
            && self.until.is_none_or(|n| s.first_turn_at < n)
            && self
                .instance
                .as_deref()
                .is_none_or(|i| s.instances.iter().any(|x| x == i))
            && self.live.is_none_or(|l| s.live == l)
            && s.turns >= self.min_turns
    }

    /// True when `s` lies past the cursor in the listing's order.
    pub fn after_cursor(&self, s: &SessionRecord) -> bool {
        self.cursor.as_ref().is_none_or(|c| {
            (s.last_turn_at, s.session_id.as_str()) < (c.last_turn_at, c.session_id.as_str())
        })
    }
}

/// Where a page of sessions ended: the last listed session's `last_turn_at` and id. Written
/// `LAST_TURN_AT.HEX(SESSION_ID)` on the wire (`next_cursor`, `cursor=`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionCursor {
    /// The session's `last_turn_at`.
    pub last_turn_at: i64,
    /// The session's id.
    pub session_id: String,
}

impl SessionCursor {
    /// The cursor after `s`.
    pub fn after(s: &SessionRecord) -> Self {
        Self {
            last_turn_at: s.last_turn_at,
            session_id: s.session_id.clone(),
        }
    }
}

impl std::fmt::Display for SessionCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{}",
            self.last_turn_at,
            crate::base::vocab::hex(self.session_id.as_bytes())
        )
    }
}

impl std::str::FromStr for SessionCursor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("cursor {s:?} is not a next_cursor value of /v1/sessions");
        let (at, id) = s.split_once('.').ok_or_else(bad)?;
        if id.len() % 2 != 0 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let bytes: Option<Vec<u8>> = (0..id.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&id[i..i + 2], 16).ok())
            .collect();
        Ok(SessionCursor {
            last_turn_at: at.parse().map_err(|_| bad())?,
            session_id: String::from_utf8(bytes.ok_or_else(bad)?).map_err(|_| bad())?,
        })
    }
}

/// One page of `sessions` (any order, `live` decided) for `q`: the matching ones past the
/// cursor, in listing order, at most `q.limit`, and the cursor of the next page when there may
/// be one.
pub fn page(
    q: &SessionQuery,
    mut sessions: Vec<SessionRecord>,
) -> (Vec<SessionRecord>, Option<SessionCursor>) {
    sessions.retain(|s| q.matches(s) && q.after_cursor(s));
    sessions.sort_by(|a, b| {
        (b.last_turn_at, b.session_id.as_str()).cmp(&(a.last_turn_at, a.session_id.as_str()))
    });
    let more = sessions.len() > q.limit;
    sessions.truncate(q.limit);
    let next = more
        .then(|| sessions.last().map(SessionCursor::after))
        .flatten();
    (sessions, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::session::record::{TurnFacts, summarize};

    fn session(id: &str, start: i64, end: i64, instance: &str) -> SessionRecord {
        let t = TurnFacts {
            instance: instance.into(),
            request_id: format!("{id}-r"),
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            ..TurnFacts::default()
        };
        summarize(id, vec![t], 100, 0).expect("record")
    }

    #[test]
    fn filters_and_pages_newest_activity_first() {
        let all = vec![
            session("a", 0, 10, "i1"),
            session("b", 5, 30, "i2"),
            session("c", 20, 40, "i1"),
            session("d", 20, 40, "i1"),
        ];
        let q = SessionQuery {
            limit: 2,
            ..SessionQuery::default()
        };
        let (p1, next) = page(&q, all.clone());
        let ids: Vec<&str> = p1.iter().map(|s| s.session_id.as_str()).collect();
        assert_eq!(ids, ["d", "c"]);
        let cursor: SessionCursor = next.expect("more").to_string().parse().expect("cursor");
        let q2 = SessionQuery {
            cursor: Some(cursor),
            ..q.clone()
        };
        let (p2, next) = page(&q2, all.clone());
        let ids: Vec<&str> = p2.iter().map(|s| s.session_id.as_str()).collect();
        assert_eq!((ids, next), (vec!["b", "a"], None));
        let only = |q: SessionQuery| {
            page(&SessionQuery { limit: 10, ..q }, all.clone())
                .0
                .into_iter()
                .map(|s| s.session_id)
                .collect::<Vec<_>>()
        };
        let i1 = only(SessionQuery {
            instance: Some("i1".into()),
            ..SessionQuery::default()
        });
        assert_eq!(i1, ["d", "c", "a"]);
        let window = only(SessionQuery {
            since: Some(30),
            until: Some(20),
            ..SessionQuery::default()
        });
        assert_eq!(window, ["b"]);
        let live = only(SessionQuery {
            live: Some(true),
            ..SessionQuery::default()
        });
        assert_eq!(live.len(), 4, "live until 100 ns after their end, as of 0");
    }

    #[test]
    fn cursors_round_trip_any_session_id() {
        let c = SessionCursor {
            last_turn_at: 42,
            session_id: "a.b/c é".into(),
        };
        let back: SessionCursor = c.to_string().parse().expect("parse");
        assert_eq!(back, c);
        assert!("42".parse::<SessionCursor>().is_err());
        assert!("x.00".parse::<SessionCursor>().is_err());
        assert!("1.0g".parse::<SessionCursor>().is_err());
        assert!("1.ff".parse::<SessionCursor>().is_err(), "not UTF-8");
    }
}
