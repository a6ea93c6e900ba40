//! The views: `/v1/slots`, `/v1/turns` (JSON and SSE), `/v1/sessions`, `/metrics`, and the
//! live page `/`.
//!
//! Handlers only read what the assembly task published (a `watch` snapshot, the turn ring, a
//! broadcast of new turns); they never wait on the assembly. With `--token`, `/v1/*` and
//! `/metrics` need `Authorization: Bearer <token>` or `?token=<token>` (the page is static and
//! passes its own `?token=` on to the API).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use futures_util::{Stream, StreamExt};
use serde::Deserialize;
use subtle::ConstantTimeEq;
use tokio::sync::watch;
use tokio_stream::wrappers::BroadcastStream;

use crate::assembly::Published;
use crate::base::error::ViewError;
use crate::metrics::{Metrics, negotiate};
use crate::records::turn::{Cursor, TurnQuery, TurnRecord, TurnStatus};
use crate::store::TurnDb;

/// The live page (self-contained: no external script, style or font).
pub const PAGE: &str = include_str!("page/index.html");

/// How often a slot stream re-sends an unchanged snapshot (so ages and elapsed times move).
const SLOTS_REFRESH: Duration = Duration::from_secs(1);

mod sessions;

/// Default `limit` of `/v1/turns`.
const DEFAULT_TURNS: usize = 100;

/// The largest `limit` of `/v1/turns` and `/v1/sessions`: a bigger page is read with
/// `cursor`, so one request never asks the store for an unbounded answer.
pub const MAX_LIMIT: usize = 1000;

/// `limit` as asked (else `default`), refused outside 1..=[`MAX_LIMIT`].
fn page_limit(asked: Option<usize>, default: usize) -> Result<usize, ViewError> {
    match asked {
        None => Ok(default),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        Some(n) => Err(ViewError::InvalidQuery {
            param: Some("limit"),
            message: format!(
                "limit is {n}; it must be from 1 to {MAX_LIMIT} (read further pages with `cursor`)"
            ),
        }),
    }
}

/// What the view handlers read.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The assembly's publications.
    pub published: Published,
    /// The turn store `/v1/turns` reads (`None` with `--turns-db :memory:`: the ring).
    pub store: Option<TurnDb>,
    /// Every metric the sidecar serves on `/metrics`.
    pub metrics: Arc<Metrics>,
    /// How long a session without the engine's KV keeping stays live (`--session-idle-s`).
    pub session_idle_ns: i64,
    /// The bearer token the views require (`--token`); `None`: the views are open.
    pub token: Option<Arc<str>>,
    /// Becomes true on shutdown; streams end then.
    pub shutdown: watch::Receiver<bool>,
}

/// The views' routes.
pub fn router(state: ApiState) -> Router {
    let protected = Router::new()
        .route("/v1/slots", get(slots))
        .route("/v1/slots/stream", get(slots_stream))
        .route("/v1/turns", get(turns))
        .route("/v1/turns/stream", get(turns_stream))
        .route("/v1/sessions", get(sessions::list))
        .route("/v1/sessions/{id}", get(sessions::one))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/", get(page))
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(protected)
        .with_state(state)
}

#[derive(Debug, Deserialize)]
struct TokenParam {
    token: Option<String>,
}

async fn require_token(
    State(st): State<ApiState>,
    Query(q): Query<TokenParam>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    let Some(expected) = &st.token else {
        return next.run(req).await;
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let given = bearer.or(q.token.as_deref()).unwrap_or("");
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "a valid bearer token is required\n",
        )
            .into_response()
    }
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

pub(crate) fn json_response(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A view as JSON, or the reason it could not be written (reported, never an empty body).
pub(crate) fn to_json(view: &impl serde::Serialize) -> Result<String, String> {
    serde_json::to_string(view).map_err(|e| {
        tracing::error!(error = %e, "Api.Unserializable");
        format!("the view did not serialize: {e}")
    })
}

async fn slots(State(st): State<ApiState>) -> Response {
    let snap = st.published.slots.borrow().clone();
    match to_json(&snap.view(crate::base::vocab::unix_now_ns())) {
        Ok(body) => json_response(body),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    }
}

async fn until_shutdown(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

async fn slots_stream(
    State(st): State<ApiState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = st.published.slots.clone();
    let stream = futures_util::stream::unfold((rx, true), |(mut rx, first)| async move {
        if !first {
            tokio::select! {
                r = rx.changed() => if r.is_err() { return None },
                _ = tokio::time::sleep(SLOTS_REFRESH) => {}
            }
        }
        let snap = rx.borrow_and_update().clone();
        let event = match to_json(&snap.view(crate::base::vocab::unix_now_ns())) {
            Ok(json) => Event::default().event("slots").data(json),
            Err(e) => Event::default().event("error").data(e),
        };
        Some((Ok(event), (rx, false)))
    });
    Sse::new(stream.take_until(until_shutdown(st.shutdown.clone())))
        .keep_alive(KeepAlive::default())
}

/// `/v1/turns` and `/v1/turns/stream` query parameters.
#[derive(Debug, Deserialize, Default)]
pub struct TurnsParams {
    /// Only this session (then oldest first, by request start).
    pub session_id: Option<String>,
    /// Only this request.
    pub request_id: Option<String>,
    /// Only this engine instance.
    pub instance: Option<String>,
    /// Only turns that ended this way: `ok`, `cancelled`, `refused` or `error`.
    pub status: Option<String>,
    /// Only turns that ended at or after this instant (Unix ns).
    pub since: Option<i64>,
    /// Only turns that ended before this instant (Unix ns).
    pub until: Option<i64>,
    /// The page after this one: a previous answer's `next_cursor`.
    pub cursor: Option<String>,
    /// At most this many (default 100, at most 1,000): the newest ones.
    pub limit: Option<usize>,
}

impl TurnsParams {
    /// The validated query: a query string that does not parse, a filter present with an
    /// empty value (which no turn has), an unknown `status` or a `cursor` that no answer gave
    /// is a [`ViewError::InvalidQuery`].
    fn query(parsed: Result<Query<Self>, QueryRejection>) -> Result<TurnQuery, ViewError> {
        let Query(p) = parsed.map_err(|r| ViewError::InvalidQuery {
            param: None,
            message: r.body_text(),
        })?;
        for (param, v) in [
            ("session_id", &p.session_id),
            ("request_id", &p.request_id),
            ("instance", &p.instance),
            ("status", &p.status),
            ("cursor", &p.cursor),
        ] {
            if v.as_deref().is_some_and(str::is_empty) {
                return Err(ViewError::InvalidQuery {
                    param: Some(param),
                    message: format!("{param} must not be empty"),
                });
            }
        }
        let status = p
            .status
            .as_deref()
            .map(|s| {
                TurnStatus::parse(s).ok_or_else(|| ViewError::InvalidQuery {
                    param: Some("status"),
                    message: format!("status {s:?} is not one of ok, cancelled, refused, error"),
                })
            })
            .transpose()?;
        let cursor = p
            .cursor
            .as_deref()
            .map(|c| {
                c.parse::<Cursor>()
                    .map_err(|message| ViewError::InvalidQuery {
                        param: Some("cursor"),
                        message,
                    })
            })
            .transpose()?;
        Ok(TurnQuery {
            session_id: p.session_id,
            request_id: p.request_id,
            instance: p.instance,
            status,
            since: p.since,
            until: p.until,
            cursor,
            limit: page_limit(p.limit, DEFAULT_TURNS)?,
        })
    }
}

/// The `/v1/turns` answer: `turns` are records (from the ring) or stored JSON (from the
/// store), the same shape either way.
#[derive(serde::Serialize)]
struct TurnsBody<T> {
    count: usize,
    turns: Vec<T>,
    /// The `cursor=` of the next page; null when this page is the last.
    next_cursor: Option<String>,
}

/// `GET /v1/turns`: `{"count", "turns": [record, ...], "next_cursor"}`, filtered by
/// `session_id`, `request_id`, `instance`, `status`, `since` and `until`, from the turn store
/// (`--turns-db`), or with `:memory:` from the ring of the last `--turns` finished requests.
///
/// Without `session_id`: the newest `limit` (default 100) records, newest first. With
/// `session_id=S`: that session's turns in the order its conversation ran, oldest first by
/// request start, each with its outcome (`status`, `finish_reason`, `resume`); the latest
/// `limit` of them. When more match, `next_cursor` is set: pass it as `cursor=` (with the
/// same filters) for the next, older page. An unknown session is an empty list (200). A
/// malformed query, or an empty filter value, is a 400 [`ViewError`]; a store that cannot be
/// read is a 500 one.
async fn turns(
    State(st): State<ApiState>,
    params: Result<Query<TurnsParams>, QueryRejection>,
) -> Result<Response, ViewError> {
    let q = TurnsParams::query(params)?;
    let body = match st.store {
        Some(db) => {
            let page = tokio::task::spawn_blocking(move || db.query(&q))
                .await
                .map_err(|e| ViewError::Store(format!("the turn store query stopped: {e}")))?
                .map_err(|e| {
                    tracing::error!(error = %e, "TurnStore.ReadFailed");
                    ViewError::Store(e.to_string())
                })?;
            to_json(&TurnsBody {
                count: page.turns.len(),
                turns: page.turns,
                next_cursor: page.next_cursor.map(|c| c.to_string()),
            })
        }
        None => {
            let (list, next) = st.published.turns.page(&q);
            to_json(&TurnsBody::<Arc<TurnRecord>> {
                count: list.len(),
                turns: list,
                next_cursor: next.map(|c| c.to_string()),
            })
        }
    };
    Ok(json_response(body.map_err(ViewError::Store)?))
}

/// `GET /v1/turns/stream`: each new record matching the filters (as `/v1/turns`), as SSE
/// event `turn`, in completion order.
async fn turns_stream(
    State(st): State<ApiState>,
    params: Result<Query<TurnsParams>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ViewError> {
    let q = TurnsParams::query(params)?;
    let rx = st.published.turn_events.subscribe();
    let stream = BroadcastStream::new(rx).filter_map(move |r| {
        let out = match r {
            Ok(t) if q.matches(&t) => Some(Ok(match to_json(&*t) {
                Ok(j) => Event::default().event("turn").data(j),
                Err(e) => Event::default().event("error").data(e),
            })),
            _ => None,
        };
        std::future::ready(out)
    });
    Ok(
        Sse::new(stream.take_until(until_shutdown(st.shutdown.clone())))
            .keep_alive(KeepAlive::default()),
    )
}

async fn metrics(State(st): State<ApiState>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (openmetrics, ctype) = negotiate(accept);
    let snap = st.published.slots.borrow().clone();
    let body = st.metrics.render(&snap, openmetrics);
    ([(header::CONTENT_TYPE, ctype)], body).into_response()
}
