//! `GET /v1/sessions` and `GET /v1/sessions/{id}`: sessions made from their turn records, from
//! the turn store (`--turns-db`), or with `:memory:` from the turns the ring holds.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use serde::Deserialize;

use super::{ApiState, json_response, to_json};
use crate::base::error::ViewError;
use crate::records::session::{SessionCursor, SessionQuery, SessionRecord};

/// Default `limit` of `/v1/sessions`.
const DEFAULT_SESSIONS: usize = 100;

/// Default `min_turns` of `/v1/sessions`.
const DEFAULT_MIN_TURNS: u64 = 2;

/// `/v1/sessions` query parameters.
#[derive(Debug, Deserialize, Default)]
pub struct SessionsParams {
    /// Only sessions active at or after this instant (Unix ns): their last turn ended then or
    /// later.
    pub since: Option<i64>,
    /// Only sessions active before this instant (Unix ns): their first turn arrived earlier.
    pub until: Option<i64>,
    /// Only sessions with a turn served by this engine instance.
    pub instance: Option<String>,
    /// `true`: only live sessions; `false`: only ended ones.
    pub live: Option<bool>,
    /// Only sessions of at least this many turns (default 2: every keyless request starts a
    /// provisional session, listed once a later turn extends it; 1 lists every session).
    pub min_turns: Option<u64>,
    /// The page after this one: a previous answer's `next_cursor`.
    pub cursor: Option<String>,
    /// At most this many (default 100, at most 1,000).
    pub limit: Option<usize>,
}

impl SessionsParams {
    fn query(parsed: Result<Query<Self>, QueryRejection>) -> Result<SessionQuery, ViewError> {
        let Query(p) = parsed.map_err(|r| ViewError::InvalidQuery {
            param: None,
            message: r.body_text(),
        })?;
        for (param, v) in [("instance", &p.instance), ("cursor", &p.cursor)] {
            if v.as_deref().is_some_and(str::is_empty) {
                return Err(ViewError::InvalidQuery {
                    param: Some(param),
                    message: format!("{param} must not be empty"),
                });
            }
        }
        let cursor = p
            .cursor
            .as_deref()
            .map(|c| {
                c.parse::<SessionCursor>()
                    .map_err(|message| ViewError::InvalidQuery {
                        param: Some("cursor"),
                        message,
                    })
            })
            .transpose()?;
        Ok(SessionQuery {
            since: p.since,
            until: p.until,
            instance: p.instance,
            live: p.live,
            min_turns: p.min_turns.unwrap_or(DEFAULT_MIN_TURNS),
            cursor,
            limit: super::page_limit(p.limit, DEFAULT_SESSIONS)?,
        })
    }
}

/// The `/v1/sessions` answer.
#[derive(serde::Serialize)]
struct SessionsBody {
    count: usize,
    sessions: Vec<SessionRecord>,
    /// The `cursor=` of the next page; null when this page is the last.
    next_cursor: Option<String>,
}

fn store_error(e: impl std::fmt::Display) -> ViewError {
    tracing::error!(error = %e, "TurnStore.ReadFailed");
    ViewError::Store(e.to_string())
}

/// `GET /v1/sessions`: `{"count", "sessions": [session, ...], "next_cursor"}`, the sessions
/// with the latest activity first (by `last_turn_at`), filtered by `since`, `until`,
/// `instance`, `live` and `min_turns` (default 2); at most `limit` (default 100), then `next_cursor` to pass as
/// `cursor=`. Each session: its id, turns, first and last turn, whether it is live, its token
/// counts, cache-hit ratio and draft counts, where its time went (`model_s` = `queue_s` +
/// `prefill_s` + `decode_s`, and `client_s`), its turns by resume outcome and the APIs it used.
/// A malformed query is a 400 [`ViewError`]; a store that cannot be read a 500 one.
pub async fn list(
    State(st): State<ApiState>,
    params: Result<Query<SessionsParams>, QueryRejection>,
) -> Result<Response, ViewError> {
    let q = SessionsParams::query(params)?;
    let now = crate::base::vocab::unix_now_ns();
    let idle = st.session_idle_ns;
    let (sessions, next) = match st.store {
        Some(db) => tokio::task::spawn_blocking(move || db.sessions(&q, idle, now))
            .await
            .map_err(store_error)?
            .map_err(store_error)?,
        None => st.published.turns.sessions(&q, idle, now),
    };
    let body = to_json(&SessionsBody {
        count: sessions.len(),
        sessions,
        next_cursor: next.map(|c| c.to_string()),
    })
    .map_err(ViewError::Store)?;
    Ok(json_response(body))
}

/// The `/v1/sessions/{id}` answer: the session's record and a page of its turns.
#[derive(serde::Serialize)]
struct SessionBody {
    #[serde(flatten)]
    session: SessionRecord,
    /// Its turn records in the order the conversation ran (by arrival), each with
    /// `gap_before_s`: at most `limit` of them, from `cursor`.
    turn_records: Vec<serde_json::Value>,
    /// The `cursor=` of the next page of turn records; null when this page is the last.
    next_cursor: Option<String>,
}

/// `/v1/sessions/{id}` query parameters: a page of its turn records.
#[derive(Debug, Deserialize, Default)]
pub struct SessionParams {
    /// The page after this one: a previous answer's `next_cursor`.
    pub cursor: Option<String>,
    /// At most this many turn records (default 100, at most 1,000).
    pub limit: Option<usize>,
}

/// The first turn record of a page: `turn:<index>`, as `next_cursor` writes it.
fn turn_cursor(c: &str) -> Result<usize, ViewError> {
    c.strip_prefix("turn:")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| ViewError::InvalidQuery {
            param: Some("cursor"),
            message: format!("cursor {c:?} is not one a previous answer gave"),
        })
}

/// `GET /v1/sessions/{id}`: the session's record (as in `/v1/sessions`) and `turn_records`,
/// its turn records in order, each with `gap_before_s` (the time from the previous turns'
/// end to its arrival; null for the first), at most `limit` (default 100) from `cursor`, with
/// `next_cursor` for the next page. An unknown session is a 404 [`ViewError`].
pub async fn one(
    State(st): State<ApiState>,
    Path(id): Path<String>,
    params: Result<Query<SessionParams>, QueryRejection>,
) -> Result<Response, ViewError> {
    let Query(p) = params.map_err(|r| ViewError::InvalidQuery {
        param: None,
        message: r.body_text(),
    })?;
    let limit = super::page_limit(p.limit, DEFAULT_SESSIONS)?;
    let from = p
        .cursor
        .as_deref()
        .map(turn_cursor)
        .transpose()?
        .unwrap_or(0);
    let now = crate::base::vocab::unix_now_ns();
    let idle = st.session_idle_ns;
    let key = id.clone();
    let found = match st.store {
        Some(db) => tokio::task::spawn_blocking(move || db.session(&key, idle, now))
            .await
            .map_err(store_error)?
            .map_err(store_error)?,
        None => st.published.turns.session(&key, idle, now),
    };
    let Some((session, turn_records)) = found else {
        return Err(ViewError::NotFound(format!("no session {id:?}")));
    };
    let total = turn_records.len();
    let page: Vec<serde_json::Value> = turn_records.into_iter().skip(from).take(limit).collect();
    let next = from + page.len();
    let body = to_json(&SessionBody {
        session,
        turn_records: page,
        next_cursor: (next < total).then(|| format!("turn:{next}")),
    })
    .map_err(ViewError::Store)?;
    Ok(json_response(body))
}
