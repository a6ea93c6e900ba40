//! The turn store against real SQLite files: idempotent writes, filters, cursors, retention,
//! and what survives reopening.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::records::spans::{Body, EngineSpan, RequestSpan};
use crate::records::turn::{TurnQuery, TurnStatus};
use crate::records::usage::UsageTiming;

/// A scratch directory under the system's temporary directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "slotlight-store-{name}-{}-{}",
            std::process::id(),
            crate::base::vocab::unix_now_ns()
        ));
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }

    fn db(&self) -> PathBuf {
        self.0.join("nested").join("turns.db")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A finished turn `id` of `session`, started at `start_ns`, ended 10 ns later.
fn turn(id: &str, session: Option<&str>, start_ns: i64, status: Option<&str>) -> Arc<TurnRecord> {
    let req = RequestSpan {
        name: "chat m".into(),
        status: status.map(str::to_string),
        usage: UsageTiming {
            e2e_ms: Some(1.5),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut trace = [0u8; 16];
    trace[..id.len().min(16)].copy_from_slice(&id.as_bytes()[..id.len().min(16)]);
    let root = EngineSpan {
        instance: Arc::from("i"),
        service_version: None,
        trace_id: trace,
        start_ns,
        end_ns: start_ns + 10,
        error: false,
        request_id: id.into(),
        session_id: session.map(Into::into),
        body: Body::Request(Box::new(req.clone())),
    };
    Arc::new(TurnRecord::build(&root, &req, vec![]))
}

fn rw(path: &Path) -> Connection {
    open_rw(path).expect("open")
}

fn read(path: &Path) -> TurnDb {
    TurnDb {
        path: Arc::from(path),
        conn: Arc::new(Mutex::new(
            Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("ro"),
        )),
    }
}

fn ids(page: &TurnPage) -> Vec<String> {
    page.turns
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(r.get()).expect("json");
            v["request_id"].as_str().expect("id").to_string()
        })
        .collect()
}

fn q(limit: usize) -> TurnQuery {
    TurnQuery {
        limit,
        ..Default::default()
    }
}

#[test]
fn a_turn_is_written_once_and_reads_back_byte_for_byte() {
    let dir = Scratch::new("once");
    let mut c = rw(&dir.db());
    let t = turn("a", Some("s"), 100, None);
    assert_eq!(
        write_batch(&mut c, &[t.clone(), t.clone()], 1).expect("write"),
        1
    );
    assert_eq!(
        write_batch(&mut c, std::slice::from_ref(&t), 2).expect("rewrite"),
        0
    );
    let db = read(&dir.db());
    assert_eq!(db.len().expect("len"), 1);
    let page = db.query(&q(10)).expect("query");
    assert_eq!(page.turns.len(), 1);
    assert_eq!(
        page.turns[0].get(),
        serde_json::to_string(&*t).expect("json"),
        "the stored item is the ring's JSON exactly"
    );
    assert_eq!(page.next_cursor, None);
}

#[test]
fn the_same_request_id_from_two_instances_is_two_turns() {
    let dir = Scratch::new("instances");
    let mut c = rw(&dir.db());
    let a = turn("a", None, 100, None);
    let mut b = (*a).clone();
    b.instance = Arc::from("j");
    let b = Arc::new(b);
    assert_eq!(
        write_batch(&mut c, &[a.clone(), b.clone(), a, b], 1).expect("write"),
        2
    );
    assert_eq!(read(&dir.db()).len().expect("len"), 2);
}

#[test]
fn filters_select_by_session_status_time_and_instance() {
    let dir = Scratch::new("filters");
    let mut c = rw(&dir.db());
    let batch = [
        turn("a1", Some("a"), 100, None),
        turn("b2", Some("b"), 300, Some("cancelled")),
        turn("b1", Some("b"), 200, None),
        turn("x", None, 400, Some("refused")),
        turn("b3", Some("b"), 500, None),
    ];
    write_batch(&mut c, &batch, 1).expect("write");
    let db = read(&dir.db());
    let all = db.query(&q(100)).expect("all");
    assert_eq!(
        ids(&all),
        ["b3", "x", "b1", "b2", "a1"],
        "completion order, newest first"
    );
    let session = TurnQuery {
        session_id: Some("b".into()),
        ..q(100)
    };
    assert_eq!(
        ids(&db.query(&session).expect("b")),
        ["b1", "b2", "b3"],
        "by start"
    );
    let cancelled = TurnQuery {
        status: Some(TurnStatus::Cancelled),
        ..q(100)
    };
    assert_eq!(ids(&db.query(&cancelled).expect("status")), ["b2"]);
    // Ends are start + 10: [since, until) on the end.
    let window = TurnQuery {
        since: Some(210),
        until: Some(411),
        ..q(100)
    };
    assert_eq!(ids(&db.query(&window).expect("window")), ["x", "b1", "b2"]);
    let elsewhere = TurnQuery {
        instance: Some("j".into()),
        ..q(100)
    };
    assert!(db.query(&elsewhere).expect("instance").turns.is_empty());
    let one = TurnQuery {
        request_id: Some("b1".into()),
        ..q(100)
    };
    assert_eq!(ids(&db.query(&one).expect("request")), ["b1"]);
}

#[test]
fn cursors_page_through_everything_once_in_both_orders() {
    let dir = Scratch::new("cursor");
    let mut c = rw(&dir.db());
    // Starts out of completion order, two at the same instant.
    let starts = [50, 10, 30, 30, 20, 70, 60];
    let batch: Vec<_> = starts
        .iter()
        .enumerate()
        .map(|(i, s)| turn(&format!("t{i}"), Some("s"), *s, None))
        .collect();
    write_batch(&mut c, &batch, 1).expect("write");
    let db = read(&dir.db());
    for session in [None, Some("s".to_string())] {
        let mut seen = Vec::new();
        let mut cursor = None;
        let mut pages = 0;
        loop {
            let page = db
                .query(&TurnQuery {
                    session_id: session.clone(),
                    cursor,
                    ..q(3)
                })
                .expect("page");
            pages += 1;
            assert!(page.turns.len() <= 3);
            let mut got = ids(&page);
            if session.is_some() {
                // Each page is oldest first; pages go back in time.
                got.reverse();
            }
            seen.extend(got);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(pages, 3, "{session:?}");
        let expected: Vec<String> = if session.is_some() {
            // Newest start first; the two at 30 by completion, later one first.
            ["t5", "t6", "t0", "t3", "t2", "t4", "t1"]
        } else {
            ["t6", "t5", "t4", "t3", "t2", "t1", "t0"]
        }
        .map(String::from)
        .to_vec();
        assert_eq!(seen, expected, "{session:?}");
    }
}

#[test]
fn the_ring_pages_like_the_store() {
    let ring = TurnStore::new(100);
    let starts = [50, 10, 30, 30, 20, 70, 60];
    for (i, s) in starts.iter().enumerate() {
        ring.push(turn(&format!("t{i}"), Some("s"), *s, None));
    }
    let dir = Scratch::new("ring");
    let mut c = rw(&dir.db());
    for (i, s) in starts.iter().enumerate() {
        write_batch(&mut c, &[turn(&format!("t{i}"), Some("s"), *s, None)], 1).expect("write");
    }
    let db = read(&dir.db());
    for session in [None, Some("s".to_string())] {
        let mut ring_cursor = None;
        let mut db_cursor = None;
        loop {
            let rq = TurnQuery {
                session_id: session.clone(),
                cursor: ring_cursor,
                ..q(2)
            };
            let (list, next) = ring.page(&rq);
            let page = db
                .query(&TurnQuery {
                    cursor: db_cursor,
                    ..rq
                })
                .expect("page");
            let ring_ids: Vec<String> = list.iter().map(|t| t.request_id.to_string()).collect();
            assert_eq!(ring_ids, ids(&page), "{session:?}");
            assert_eq!(next.is_some(), page.next_cursor.is_some());
            match (next, page.next_cursor) {
                (Some(a), Some(b)) => {
                    ring_cursor = Some(a);
                    db_cursor = Some(b);
                }
                _ => break,
            }
        }
    }
}

#[test]
fn retention_keeps_the_newest_and_the_recent() {
    let dir = Scratch::new("retention");
    let mut c = rw(&dir.db());
    for i in 0..10 {
        let t = turn(&format!("t{i}"), None, i, None);
        // Stored at i seconds.
        write_batch(&mut c, &[t], i * 1_000_000_000).expect("write");
    }
    let keep_all = Retention {
        max_age: Duration::from_secs(3600),
        max_rows: 100,
    };
    assert_eq!(
        apply_retention(&mut c, keep_all, 10_000_000_000).expect("none"),
        0
    );
    let by_count = Retention {
        max_age: Duration::from_secs(3600),
        max_rows: 6,
    };
    assert_eq!(
        apply_retention(&mut c, by_count, 10_000_000_000).expect("count"),
        4
    );
    let db = read(&dir.db());
    assert_eq!(
        ids(&db.query(&q(100)).expect("q")),
        ["t9", "t8", "t7", "t6", "t5", "t4"]
    );
    // At 10 s, an age of 3.5 s keeps what was stored at 7, 8 and 9 s.
    let by_age = Retention {
        max_age: Duration::from_millis(3500),
        max_rows: 100,
    };
    assert_eq!(
        apply_retention(&mut c, by_age, 10_000_000_000).expect("age"),
        3
    );
    assert_eq!(ids(&db.query(&q(100)).expect("q")), ["t9", "t8", "t7"]);
}

#[test]
fn the_writer_commits_what_it_is_offered_and_the_file_reopens() {
    let dir = Scratch::new("writer");
    let path = dir.db();
    let keep = Retention {
        max_age: Duration::from_secs(3600),
        max_rows: 1000,
    };
    let store = open(&path, keep).expect("open");
    for i in 0..50 {
        assert!(store.writer.offer(turn(&format!("t{i}"), None, i, None)));
    }
    let OpenStore { db, writer, thread } = store;
    drop(writer);
    thread.join().expect("writer thread");
    assert_eq!(db.len().expect("len"), 50);
    drop(db);
    // Reopened: the same rows, and a repeat of one of them is not doubled.
    let again = open(&path, keep).expect("reopen");
    assert!(again.writer.offer(turn("t7", None, 7, None)));
    let OpenStore { db, writer, thread } = again;
    drop(writer);
    thread.join().expect("writer thread");
    assert_eq!(db.len().expect("len"), 50);
    let c = Connection::open(&path).expect("open");
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity");
    assert_eq!(ok, "ok");
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = Scratch::new("newer");
    let path = dir.db();
    drop(rw(&path));
    let c = Connection::open(&path).expect("open");
    c.pragma_update(None, "user_version", schema::VERSION + 1)
        .expect("bump");
    drop(c);
    assert!(matches!(
        open_rw(&path),
        Err(StoreError::NewerSchema { found, .. }) if found == schema::VERSION + 1
    ));
}

#[test]
fn the_default_path_follows_xdg() {
    // Read-only checks of the rule; the environment is not changed (tests run in parallel).
    if let Some(p) = default_path() {
        assert!(p.ends_with("slotlight/turns.db"), "{}", p.display());
        assert!(p.is_absolute() || std::env::var_os("HOME").is_some());
    }
    assert_eq!(TurnsDb::from_flag(Some(":memory:")), TurnsDb::Memory);
    assert_eq!(
        TurnsDb::from_flag(Some("/x/t.db")),
        TurnsDb::File(PathBuf::from("/x/t.db"))
    );
}

/// A turn `id` of `session` from `start_s` to `end_s` seconds, with its resume outcome.
fn timed(
    id: &str,
    session: Option<&str>,
    start_s: i64,
    end_s: i64,
    extends: Option<&str>,
) -> Arc<TurnRecord> {
    const S: i64 = 1_000_000_000;
    let req = RequestSpan {
        name: "chat m".into(),
        usage: UsageTiming {
            e2e_ms: Some(((end_s - start_s) * 1000) as f64),
            queue_ms: Some(100.0),
            ttft_ms: Some(400.0),
            prompt_tokens: Some(100),
            cached_tokens: Some(50),
            resume: Some("full".into()),
            ..Default::default()
        },
        api: Some("chat.completions".into()),
        session_source: session.map(|_| "found".into()),
        session_extends: extends.map(str::to_string),
        ..Default::default()
    };
    let mut trace = [1u8; 16];
    trace[..id.len().min(16)].copy_from_slice(&id.as_bytes()[..id.len().min(16)]);
    let root = EngineSpan {
        instance: Arc::from("i"),
        service_version: None,
        trace_id: trace,
        start_ns: start_s * S,
        end_ns: end_s * S,
        error: false,
        request_id: id.into(),
        session_id: session.map(Into::into),
        body: Body::Request(Box::new(req.clone())),
    };
    Arc::new(TurnRecord::build(&root, &req, vec![]))
}

fn all_sessions(db: &TurnDb, now_ns: i64) -> Vec<crate::records::session::SessionRecord> {
    let q = crate::records::session::SessionQuery {
        limit: 100,
        ..Default::default()
    };
    db.sessions(&q, 60_000_000_000, now_ns).expect("sessions").0
}

#[test]
fn sessions_are_kept_with_their_turns_and_read_back_exactly_after_reopening() {
    let dir = Scratch::new("sessions");
    let path = dir.db();
    let mut c = rw(&path);
    // Turn 0 without a session; turn 1 found its session by extending it; turn 2 follows.
    write_batch(&mut c, &[timed("r0", None, 0, 2, None)], 1).expect("write");
    write_batch(&mut c, &[timed("r1", Some("f"), 5, 7, Some("r0"))], 2).expect("write");
    write_batch(&mut c, &[timed("r2", Some("f"), 10, 11, None)], 3).expect("write");
    let db = read(&path);
    let s = all_sessions(&db, 0);
    assert_eq!(s.len(), 1);
    let f = &s[0];
    assert_eq!((f.session_id.as_str(), f.turns), ("f", 3));
    assert_eq!(f.client_s, 6.0, "3 s before turn 1, 3 s before turn 2");
    assert_eq!(f.model_s, 5.0);
    assert_eq!((f.prompt_tokens, f.cached_tokens), (300, 150));
    assert_eq!(f.cache_hit_ratio, Some(0.5));
    // Turn 0 is filed under the session, as its turn 0.
    let (record, turns) = db
        .session("f", 60_000_000_000, 0)
        .expect("read")
        .expect("found");
    assert_eq!(&record, f);
    let ids: Vec<&str> = turns
        .iter()
        .map(|t| t["request_id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["r0", "r1", "r2"]);
    assert_eq!(turns[0]["session_id"], "f");
    assert_eq!(turns[0]["session_turn"], 0);
    assert_eq!(turns[0]["gap_before_s"], serde_json::Value::Null);
    assert_eq!(turns[1]["gap_before_s"], 3.0);
    let by_turn = db
        .query(&TurnQuery {
            session_id: Some("f".into()),
            limit: 10,
            ..Default::default()
        })
        .expect("turns");
    assert_eq!(by_turn.turns.len(), 3);
    // Live for the idle window after the last turn (60 s), and not after.
    assert!(all_sessions(&db, 70_000_000_000)[0].live);
    assert!(!all_sessions(&db, 71_000_000_000)[0].live);
    let live_only = |live: bool, now: i64| {
        let q = crate::records::session::SessionQuery {
            live: Some(live),
            limit: 10,
            ..Default::default()
        };
        db.sessions(&q, 60_000_000_000, now).expect("q").0.len()
    };
    assert_eq!((live_only(true, 0), live_only(false, 0)), (1, 0));
    assert_eq!(
        (
            live_only(true, 80_000_000_000),
            live_only(false, 80_000_000_000)
        ),
        (0, 1)
    );
    assert!(db.session("nope", 0, 0).expect("read").is_none());
    assert_eq!(
        db.live_sessions(60_000_000_000, 0).expect("live")[0]
            .1
            .len(),
        3
    );
    drop((c, db));
    // Reopened: the same answer, exactly.
    let again = rw(&path);
    let db = read(&path);
    assert_eq!(&all_sessions(&db, 0)[0], f);
    drop(again);
}

#[test]
fn retention_makes_sessions_again_from_the_turns_it_keeps() {
    let dir = Scratch::new("session-retention");
    let mut c = rw(&dir.db());
    write_batch(&mut c, &[timed("x", Some("gone"), 0, 1, None)], 0).expect("w");
    for (id, start) in [("a", 0), ("b", 10), ("c", 20)] {
        write_batch(&mut c, &[timed(id, Some("s"), start, start + 1, None)], 0).expect("w");
    }
    let keep_two = Retention {
        max_age: Duration::from_secs(3600),
        max_rows: 2,
    };
    assert_eq!(apply_retention(&mut c, keep_two, 10).expect("count"), 2);
    let db = read(&dir.db());
    let s = all_sessions(&db, 0);
    let ids: Vec<&str> = s.iter().map(|s| s.session_id.as_str()).collect();
    assert_eq!(ids, ["s"], "a session left with no turn is gone");
    assert_eq!((s[0].turns, s[0].first_turn_at), (2, 10_000_000_000));
}

#[test]
fn a_store_written_before_sessions_gets_them_from_its_turns() {
    let dir = Scratch::new("migrate");
    let path = dir.db();
    let mut c = rw(&path);
    write_batch(&mut c, &[timed("a", Some("s"), 0, 1, None)], 1).expect("w");
    c.execute("DELETE FROM sessions", [])
        .expect("as a version 1 store");
    c.pragma_update(None, "user_version", 1).expect("v1");
    drop(c);
    drop(rw(&path));
    assert_eq!(all_sessions(&read(&path), 0).len(), 1);
}

/// `timed`, whose request span stated speculative decoding's counts.
fn drafted(id: &str, session: &str, start_s: i64, counts: (i64, i64)) -> Arc<TurnRecord> {
    let mut t = (*timed(id, Some(session), start_s, start_s + 1, None)).clone();
    t.usage.speculation = Some(slotlight_otel::attr::value::SPECULATION_NGRAM.into());
    t.usage.drafts = Some(counts.0 / 4);
    t.usage.drafted_tokens = Some(counts.0);
    t.usage.accepted_tokens = Some(counts.1);
    Arc::new(t)
}

/// Draft counts survive the store (turns and sessions), and a store written before the sidecar
/// kept them still reads: its session records load with 0 drafted and no acceptance, and are
/// made again from old and new turns alike.
#[test]
fn draft_counts_round_trip_and_records_without_them_still_load() {
    let dir = Scratch::new("drafts");
    let path = dir.db();
    let mut c = rw(&path);
    write_batch(&mut c, &[drafted("d1", "spec", 0, (40, 30))], 1).expect("write");
    let db = read(&path);
    let page = db
        .query(&TurnQuery {
            request_id: Some("d1".into()),
            limit: 1,
            ..Default::default()
        })
        .expect("turns");
    let v: serde_json::Value = serde_json::from_str(page.turns[0].get()).expect("json");
    assert_eq!(
        v["speculation"],
        slotlight_otel::attr::value::SPECULATION_NGRAM
    );
    assert_eq!(
        (v["drafts"].as_i64(), v["drafted_tokens"].as_i64()),
        (Some(10), Some(40))
    );
    assert_eq!(v["accepted_tokens"], 30);
    let s = all_sessions(&db, 0);
    assert_eq!((s[0].drafted_tokens, s[0].accepted_tokens), (40, 30));
    assert_eq!(s[0].draft_acceptance, Some(0.75));

    // As an older sidecar wrote them: neither the turn nor the session has the fields.
    write_batch(&mut c, &[timed("o1", Some("old"), 0, 1, None)], 2).expect("write");
    c.execute(
        "UPDATE turns SET record = json_remove(record, '$.speculation', '$.drafts',
             '$.drafted_tokens', '$.accepted_tokens') WHERE request_id = 'o1'",
        [],
    )
    .expect("strip the turn");
    c.execute(
        "UPDATE sessions SET record = json_remove(record, '$.drafted_tokens',
             '$.accepted_tokens', '$.draft_acceptance') WHERE session_id = 'old'",
        [],
    )
    .expect("strip the session");
    let stripped: String = c
        .query_row(
            "SELECT record FROM sessions WHERE session_id = 'old'",
            [],
            |r| r.get(0),
        )
        .expect("row");
    assert!(!stripped.contains("drafted_tokens"), "{stripped}");
    let old = db
        .session("old", 60_000_000_000, 0)
        .expect("read")
        .expect("found")
        .0;
    assert_eq!((old.drafted_tokens, old.accepted_tokens), (0, 0));
    assert_eq!(old.draft_acceptance, None);
    // A new turn of that session: its record is made again from the old turn and the new.
    write_batch(&mut c, &[drafted("o2", "old", 5, (20, 5))], 3).expect("write");
    let again = db
        .session("old", 60_000_000_000, 0)
        .expect("read")
        .expect("found");
    assert_eq!((again.0.turns, again.0.drafted_tokens), (2, 20));
    assert_eq!(again.0.draft_acceptance, Some(0.25));
    assert_eq!(again.1[0]["request_id"], "o1");
    assert!(
        again.1[0].get("drafted_tokens").is_none(),
        "the old turn, as stored"
    );
    assert_eq!(again.1[1]["drafted_tokens"], 20);
}

#[test]
fn sessions_of_fewer_turns_than_asked_are_left_out() {
    let dir = Scratch::new("min-turns");
    let path = dir.db();
    let mut c = rw(&path);
    // A provisional session of one turn, and a session of two.
    write_batch(&mut c, &[timed("p0", Some("one"), 0, 1, None)], 1).expect("write");
    write_batch(&mut c, &[timed("t0", Some("two"), 2, 3, None)], 2).expect("write");
    write_batch(&mut c, &[timed("t1", Some("two"), 4, 5, None)], 3).expect("write");
    let db = read(&path);
    let listed = |min_turns: u64| {
        let q = crate::records::session::SessionQuery {
            min_turns,
            limit: 10,
            ..Default::default()
        };
        let (s, _) = db.sessions(&q, 60_000_000_000, 0).expect("sessions");
        s.into_iter().map(|s| s.session_id).collect::<Vec<_>>()
    };
    assert_eq!(listed(1), ["two", "one"]);
    assert_eq!(listed(2), ["two"]);
    assert!(listed(3).is_empty());
}

#[test]
fn a_session_grown_turn_by_turn_equals_one_made_from_all_its_turns() {
    let dir = Scratch::new("extend");
    let path = dir.db();
    let mut c = rw(&path);
    // Twenty turns one batch at a time (extended), a turn written twice (not counted again),
    // then a turn that arrived before the last ones (the record made again).
    for i in 0..20 {
        let start = 3 * i + i % 2;
        let t = timed(
            &format!("t{i:02}"),
            Some("g"),
            start,
            start + 2 + i % 3,
            None,
        );
        write_batch(&mut c, &[Arc::clone(&t)], i).expect("write");
        if i == 7 {
            write_batch(&mut c, &[t], i).expect("write again");
        }
    }
    let grown = all_sessions(&read(&path), 0);
    sessions::rebuild(&mut c).expect("rebuild");
    let remade = all_sessions(&read(&path), 0);
    assert_eq!(grown, remade);
    assert_eq!(grown[0].turns, 20);
    // A turn in order extends the record without reading the stored turns again: a change
    // made behind the store's back to an earlier turn's record is not seen...
    c.execute(
        "UPDATE turns SET record = json_set(record, '$.prompt_tokens', 100000) WHERE request_id = 't00'",
        [],
    )
    .expect("update");
    write_batch(&mut c, &[timed("t20", Some("g"), 70, 71, None)], 20).expect("write");
    let extended = all_sessions(&read(&path), 0);
    assert_eq!(
        extended[0].prompt_tokens,
        21 * 100,
        "the turns were not read again"
    );
    // ... until the record is made again from the turns.
    sessions::rebuild(&mut c).expect("rebuild");
    assert_eq!(
        all_sessions(&read(&path), 0)[0].prompt_tokens,
        20 * 100 + 100_000
    );
    c.execute(
        "UPDATE turns SET record = json_set(record, '$.prompt_tokens', 100) WHERE request_id = 't00'",
        [],
    )
    .expect("update");
    sessions::rebuild(&mut c).expect("rebuild");
    write_batch(&mut c, &[timed("late", Some("g"), 50, 51, None)], 30).expect("write");
    let with_late = all_sessions(&read(&path), 0);
    sessions::rebuild(&mut c).expect("rebuild");
    assert_eq!(with_late, all_sessions(&read(&path), 0));
    assert_eq!(with_late[0].turns, 22);
}
