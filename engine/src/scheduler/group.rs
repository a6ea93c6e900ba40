//! The step loop of one device group.
//!
//! Step order (after llama.cpp's server): take commands; drop cancelled requests; admit from
//! the queue while slots and KV blocks allow; settle paths (one request alone runs solo, two
//! or more run in slots, and a request that changes path ends its leg and starts another,
//! carrying its reply); then one step: make room in the KV cache for every decoding request
//! (preempting the newest when full), plan the step (every decode plus prefill chunks within
//! a token budget), run the forward pass, then record each chunk and sample and emit, per
//! request, on its own channel; finally publish the group's gauges.
//!
//! A request leaves the queue through [`Loop::leave_queue`] only, and leaves the running set
//! through [`Loop::vacate`] only (shared by finishing and preemption): the queue counters and
//! the slot, block and leg bookkeeping each move in one place.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;

use super::keep::{KeepConfig, SessionKeeping};
use super::resume;
use super::sequence::{Phase, PrefillProgress, Seq};
use super::sessions::{FinishedTurn, SessionMemory};
use super::slots::Slots;
use super::{Command, EngineError, Event, FinishReason, InFlight, Placement, SchedulerConfig};
use crate::backend::{Backend, BackendError, SeqChunk};
use crate::constraint::SeqConstraint;
use crate::kv_cache::pools::Tail;
use crate::kv_cache::{KvPools, RELEASED};
use crate::kv_events::KvEventSink;
use crate::metrics::GroupMetrics;
use crate::metrics::group::KvUsage;
use crate::sampling::{TokenLogprobs, Verdict};
use crate::speculation::MAX_DRAFT_TOKENS;
use crate::timing::{DraftCheck, LegEnd, PathKind, PrefillEnd, PrefillReason};
use crate::tokenizer::Tokenizer;

/// Cumulative counters of one group (not per-request timing: those live in each request).
#[derive(Debug, Clone, Default, Serialize)]
pub struct GroupStats {
    /// Which device group (slot group) this is, from 0.
    pub group: usize,
    /// Requests admitted and running.
    pub active: usize,
    /// Requests waiting for admission to this group, new and preempted.
    pub queued: usize,
    /// KV blocks in all (of the full pool: every layer's KV, or the global layers' when the
    /// local layers have a window pool).
    pub kv_blocks: usize,
    /// KV blocks free, evictable, or held as sessions' tails (given back on demand).
    pub kv_blocks_available: usize,
    /// Positions a local layer sees, when the local layers keep only their window's KV in a
    /// pool of their own.
    pub kv_window: Option<usize>,
    /// Blocks of that window pool (0 without one).
    pub kv_window_blocks: usize,
    /// Of those, free, evictable, or held as sessions' tails.
    pub kv_window_blocks_available: usize,
    /// Bytes of KV storage, both pools.
    pub kv_bytes: usize,
    /// Cached prefix blocks evicted so far.
    pub kv_evictions: u64,
    /// Forward steps taken.
    pub steps: u64,
    /// Requests preempted so far.
    pub preemptions: u64,
}

struct Loop<'t> {
    group: usize,
    backend: Box<dyn Backend>,
    tok: &'t Tokenizer,
    cfg: SchedulerConfig,
    blocks: KvPools,
    /// Bytes of one block of the full pool and of the window pool.
    block_bytes: (usize, usize),
    slots: Slots,
    queue: VecDeque<Seq<'t>>,
    active: Vec<Seq<'t>>,
    queued_total: Arc<AtomicUsize>,
    load: Arc<AtomicUsize>,
    /// The group's own counters and gauges (read by `/metrics` at scrape time).
    metrics: Arc<GroupMetrics>,
    next_order: u64,
    next_family: u64,
    stats: GroupStats,
    logits: Vec<f32>,
    /// The engine's memory of sessions (shared by every group; held only briefly).
    sessions: Arc<Mutex<SessionMemory>>,
    /// The group's live sessions' KV, kept ahead of other cached prefixes.
    keeping: SessionKeeping,
    /// With a window pool: the live sessions' last window there (the window layers' blocks a
    /// resume from the turn's end needs) and the window before their prompt's end (a
    /// checkpoint), kept the same way, evicted last, so other sequences' churn in the small
    /// window pool does not cost a session its resume (`window`).
    window_keeping: Option<SessionKeeping>,
    /// Where the prefix cache's changes go, with the resync epoch this group last restated at.
    kv_events: Option<(KvEventSink, u64)>,
    /// Sessions' last turns' partly filled last blocks, by session and branch, until their
    /// keeping's TTL: the next turn continues in its tail rather than computing again the
    /// positions after the last whole block. At most [`MAX_TAILS`]; given back first when
    /// blocks run short.
    tails: HashMap<String, (Tail, Instant)>,
}

/// The most tails a group holds (one block each, in each pool).
const MAX_TAILS: usize = 64;

/// What a step loop shares with the engine handle.
pub(super) struct Shared {
    /// Requests waiting for admission, over all groups.
    pub queued_total: Arc<AtomicUsize>,
    /// Requests queued or admitted in this group.
    pub load: Arc<AtomicUsize>,
    /// The engine's memory of sessions.
    pub sessions: Arc<Mutex<SessionMemory>>,
    /// The group's counters and gauges.
    pub metrics: Arc<GroupMetrics>,
    /// Where the prefix cache's changes go (`--kv-events-endpoint`).
    pub kv_events: Option<KvEventSink>,
}

/// One chunk of a step: `len` positions of sequence `seq` from `start`.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    /// Index into the running set.
    seq: usize,
    /// First position computed.
    start: usize,
    /// How many of the sequence's positions have their KV computed.
    len: usize,
    /// Whether the chunk ends the sequence's known tokens, so it yields logits and a token.
    samples: bool,
    /// Draft tokens it verifies after the sequence's last token (0: a plain chunk). A
    /// verification chunk yields logits at every position.
    draft: usize,
}

impl Chunk {
    /// Rows of logits the chunk yields.
    fn rows(&self) -> usize {
        match (self.samples, self.draft) {
            (false, _) => 0,
            (true, 0) => 1,
            (true, k) => k + 1,
        }
    }
}

/// What a step's forward pass reads of one sequence.
struct SeqView<'a> {
    /// Its tokens (prompt and reply).
    tokens: &'a [u32],
    /// Its full-pool block table.
    full: &'a [u32],
    /// Its window-pool block table (empty without a window pool).
    window: &'a [u32],
    /// Its verification chunk's tokens (the last token, then the draft).
    verify: &'a [u32],
}

/// How a token came out of its step.
#[derive(Debug, Clone, Copy)]
struct Made {
    /// A prefill's last chunk made it (else a decode step).
    from_prefill: bool,
    /// An earlier token of the same step came first.
    same_step: bool,
    /// In a verification step: its draft so far (the tokens taken up to this one), and
    /// whether this is the step's last candidate token.
    draft: Option<(DraftCheck, bool)>,
}

/// What the forward pass of a step took.
#[derive(Debug, Clone, Copy)]
struct Ran {
    /// Device time of the step (charged whole to every request in it).
    device: Duration,
    /// When the step started.
    started: Instant,
    /// When its forward pass returned.
    stepped: Instant,
}

/// Runs the loop until shutdown.
pub(super) fn run(
    group: usize,
    backend: Box<dyn Backend>,
    tokenizer: Arc<crate::tokenizer::Tokenizer>,
    cfg: SchedulerConfig,
    mut rx: mpsc::UnboundedReceiver<Command>,
    shared: Shared,
) {
    let Shared {
        queued_total,
        load,
        sessions,
        metrics,
        kv_events,
    } = shared;
    let tok: &Tokenizer = &tokenizer;
    let mut cfg = cfg;
    // A draft's verification stays within the rows the backend computes exactly as one-token
    // steps, so drafts never change greedy output.
    let spec = &mut cfg.speculation;
    spec.max_tokens = spec
        .max_tokens
        .min(MAX_DRAFT_TOKENS)
        .min(backend.exact_rows().saturating_sub(1));
    let windowed = backend.windowed_kv();
    let blocks = match windowed {
        Some(w) => KvPools::windowed(
            backend.num_blocks(),
            backend.block_size(),
            w.window,
            w.blocks,
        ),
        None => KvPools::whole(backend.num_blocks(), backend.block_size()),
    };
    let mut blocks = blocks;
    if kv_events.is_some() {
        blocks.record_events();
    }
    let kv_events = kv_events.map(|s| {
        let epoch = s.epoch();
        (s, epoch)
    });
    let block_bytes = (
        backend.kv_block_bytes(),
        windowed.map_or(0, |w| w.block_bytes),
    );
    let keeping = SessionKeeping::new(cfg.session_kv, backend.num_blocks(), cfg.max_sessions);
    // Each kept session holds a few windows there (its last window, its prompt's checkpoint
    // and its latest checkpoints inside its reply), evicted last when the pool runs out:
    // bounded by the pool, not a share of it (the pool has room for the running sequences'
    // windows and `session_windows.room` more).
    let window_keeping = windowed.map(|w| {
        let share = if cfg.session_kv.share > 0.0 { 1.0 } else { 0.0 };
        SessionKeeping::new(
            KeepConfig {
                share,
                ..cfg.session_kv
            },
            w.blocks,
            cfg.max_sessions,
        )
    });
    // Waits for a command, or for the next keeping's expiry, while idle.
    let waiter = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .ok();
    let mut lp = Loop {
        group,
        keeping,
        window_keeping,
        block_bytes,
        slots: Slots::new(cfg.batch),
        backend,
        tok,
        cfg,
        blocks,
        queue: VecDeque::new(),
        active: Vec::new(),
        queued_total,
        load,
        metrics,
        next_order: 0,
        next_family: 0,
        stats: GroupStats {
            group,
            ..GroupStats::default()
        },
        logits: Vec::new(),
        sessions,
        kv_events,
        tails: HashMap::new(),
    };
    lp.publish();
    loop {
        // Commands: wait when idle, otherwise take what is there.
        let mut shutdown = false;
        if lp.active.is_empty() && lp.queue.is_empty() {
            match idle_wait(&mut rx, waiter.as_ref(), lp.keeping.next_expiry()) {
                Idle::Command(c) => shutdown |= lp.command(c),
                Idle::Closed => shutdown = true,
                Idle::Expiry => {}
            }
        }
        while let Ok(c) = rx.try_recv() {
            shutdown |= lp.command(c);
        }
        if shutdown {
            lp.abort_all(&EngineError::ShuttingDown);
            return;
        }
        lp.drop_cancelled();
        lp.expire_keepings();
        lp.admit();
        lp.settle_paths();
        if let Err(e) = lp.step() {
            tracing::error!(group, error = %e, "Scheduler.StepFailed");
            lp.abort_all(&EngineError::Step(e.to_string()));
        }
        lp.hand_off_kv_events();
        lp.publish();
    }
}

/// What ended an idle wait.
enum Idle {
    /// A command arrived.
    Command(Command),
    /// Every sender is gone.
    Closed,
    /// A session's keeping is due to expire.
    Expiry,
}

/// Waits for the next command, or until `expiry` (a keeping's TTL) when one is due.
fn idle_wait(
    rx: &mut mpsc::UnboundedReceiver<Command>,
    waiter: Option<&tokio::runtime::Runtime>,
    expiry: Option<Instant>,
) -> Idle {
    let next = match (waiter, expiry) {
        // The timer is made inside the runtime, which drives it.
        (Some(rt), Some(at)) => rt.block_on(async {
            tokio::time::timeout_at(tokio::time::Instant::from_std(at), rx.recv()).await
        }),
        _ => Ok(rx.blocking_recv()),
    };
    match next {
        Ok(Some(c)) => Idle::Command(c),
        Ok(None) => Idle::Closed,
        Err(_) => Idle::Expiry,
    }
}

impl<'t> Loop<'t> {
    /// Handles one command; returns true on shutdown.
    fn command(&mut self, c: Command) -> bool {
        match c {
            Command::Submit(mut req, channels, prior) => {
                let family = self.next_family;
                self.next_family += 1;
                let constraint = req.constraint.take();
                let seed = req.sampling.seed;
                for (choice, events) in channels.into_iter().enumerate() {
                    let mut r = req.clone();
                    // Each choice its own random stream: seed + index (vLLM's rule), so
                    // choice 0 equals the same request with n = 1.
                    r.sampling.seed = seed.map(|s| s.wrapping_add(choice as u64));
                    // The stop strings were checked once, where the request was validated:
                    // each choice takes a copy of the matcher.
                    let decoder = self.tok.decoder_after(&r.prompt);
                    self.queue.push_back(Seq::new(
                        r,
                        events,
                        decoder,
                        family,
                        choice,
                        constraint.clone().map(SeqConstraint::new),
                        prior.clone(),
                        &self.cfg.speculation,
                    ));
                }
                false
            }
            Command::Snapshot(reply) => {
                let _ = reply.send((self.in_flight(), self.group_stats()));
                false
            }
            Command::AbortAll => {
                self.abort_all(&EngineError::ShuttingDown);
                false
            }
            Command::Shutdown => true,
        }
    }

    /// Hands the prefix cache's changes since the last hand-off to the KV-event publisher
    /// (never waits: see [`KvEventSink::submit`]).
    fn hand_off_kv_events(&mut self) {
        let Some((sink, epoch)) = self.kv_events.as_mut() else {
            return;
        };
        let started = Instant::now();
        let events = self.blocks.take_events();
        let blocks = &self.blocks;
        sink.submit(epoch, events, || blocks.restate());
        sink.record_handoff(started.elapsed());
    }

    fn group_stats(&self) -> GroupStats {
        GroupStats {
            active: self.active.len(),
            queued: self.queue.len(),
            kv_blocks: self.blocks.full().total(),
            // Sessions' tails are given back before any request waits: available.
            kv_blocks_available: self.blocks.available() + self.tails.len(),
            kv_window: self.blocks.window(),
            kv_window_blocks: self.blocks.window_pool().map_or(0, |w| w.total()),
            kv_window_blocks_available: self
                .blocks
                .window_pool()
                .map_or(0, |w| w.available() + self.tails.len()),
            kv_bytes: self.kv_usage().total_bytes,
            kv_evictions: self.blocks.full().evictions(),
            ..self.stats.clone()
        }
    }

    fn in_flight(&self) -> Vec<InFlight> {
        let now = Instant::now();
        let view = |s: &Seq<'_>, state: &'static str| {
            let leg = s.timings.current_leg();
            let in_leg = leg.map(|l| now.saturating_duration_since(l.start).as_secs_f64());
            let leg_tokens = leg.map_or(0, |l| l.tokens_generated);
            let prefill = s
                .prefill
                .as_ref()
                .filter(|_| state == "prefill")
                .map(PrefillProgress::progress);
            InFlight {
                id: s.req.id.clone(),
                state,
                path: s.placement.map(|p| p.path),
                group: self.group,
                slot: s.placement.and_then(|p| p.slot),
                generated_tokens: s.timings.generated_tokens,
                elapsed_s: now
                    .saturating_duration_since(s.timings.received)
                    .as_secs_f64(),
                tok_s: s.timings.tok_s(),
                legs: s.timings.legs.len(),
                in_leg_s: in_leg,
                leg_tokens,
                #[allow(clippy::cast_precision_loss)]
                leg_tok_s: in_leg.filter(|t| *t > 0.0).map(|t| leg_tokens as f64 / t),
                drafted_tokens: s.timings.drafts.drafted_tokens,
                accepted_tokens: s.timings.drafts.accepted_tokens,
                session_id: s.req.session.clone(),
                prompt_progress: prefill.map(|p| p.0),
                prefill_tok_s: prefill.and_then(|p| p.1),
            }
        };
        self.active
            .iter()
            .map(|s| {
                view(
                    s,
                    if s.phase == Phase::Prefill {
                        "prefill"
                    } else {
                        "decoding"
                    },
                )
            })
            .chain(self.queue.iter().map(|s| view(s, "queued")))
            .collect()
    }

    /// A request leaves the queue (admitted, cancelled, refused or aborted). `first` says it
    /// was never admitted before: only then does it give back its place under `--max-queue`
    /// (a preempted request waits again without taking a new place).
    fn leave_queue(&self, first: bool) {
        self.metrics.leave_queue();
        if first {
            self.queued_total.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A running request stops running, finished or preempted: a prefill in progress is
    /// recorded as cut short with `prefill_end`, its leg ends with `leg_end`, its slot is
    /// freed, and its KV blocks go back to the pool (the full ones stay as prefix cache).
    /// Returns the positions whose KV it had computed. A request that never ran (still
    /// queued) has none of these, and this changes nothing for it.
    fn vacate(
        &mut self,
        seq: &mut Seq<'t>,
        prefill_end: PrefillEnd,
        leg_end: LegEnd,
        now: Instant,
    ) -> usize {
        seq.cut_prefill(prefill_end);
        seq.draft = None;
        if let Some(leg) = seq.timings.end_leg(now, leg_end).cloned() {
            seq.emit(Event::LegEnded(leg));
        }
        if let Some(slot) = seq.placement.and_then(|p| p.slot) {
            self.slots.free(slot);
        }
        let computed = seq.computed;
        self.blocks
            .register_full(&mut seq.blocks, &seq.tokens, computed);
        self.blocks.release(&mut seq.blocks);
        computed
    }

    /// Ends a request (running or queued; a queued one has left the queue already) and sends
    /// its completion with its own timings.
    fn finish(&mut self, mut seq: Seq<'t>, reason: FinishReason) {
        let now = Instant::now();
        let leg_end = match reason {
            FinishReason::Stop | FinishReason::Length => LegEnd::Finished,
            _ => LegEnd::Cancelled,
        };
        let table = seq.blocks.full.table.clone();
        let window_table = seq.blocks.window.table.clone();
        // A finished turn of a session that keeps its KV leaves its partly filled last block
        // for the next turn.
        // (Not a keyless turn's provisional session: it keeps no KV until a later turn
        // extends it.)
        let tail = match (&seq.req.session, leg_end) {
            (Some(session), LegEnd::Finished)
                if seq.choice == 0
                    && !self.keeping.ttl_for(seq.req.session_ttl).is_zero()
                    && !self.sessions.lock().is_ok_and(|m| m.is_candidate(session)) =>
            {
                self.blocks
                    .detach_tail(&mut seq.blocks, &seq.tokens, seq.computed)
            }
            _ => None,
        };
        let computed = self.vacate(&mut seq, PrefillEnd::Cancelled, leg_end, now);
        self.remember_turn(&mut seq, [&table, &window_table], computed, now);
        if let Some(tail) = tail {
            let ttl = self.keeping.ttl_for(seq.req.session_ttl);
            self.keep_tail(&seq, tail, now + ttl);
        }
        seq.timings.mark_finished(now);
        let mut tail = seq.decoder.flush();
        if !seq.stop.is_stopped() {
            tail = seq.stop.push(&tail).text;
            tail.push_str(&seq.stop.finish());
        } else {
            tail.clear();
        }
        self.load.fetch_sub(1, Ordering::Relaxed);
        self.metrics.count_finished(&reason);
        // The blocks this request left in the cache are on the stream before its answer, so
        // a client that then reads `/health`'s sequence number can wait for them.
        self.hand_off_kv_events();
        seq.answer(reason, tail, self.group);
    }

    /// Remembers a finished turn for its session's next one, and keeps its KV: the session's
    /// next turn is compared with the tokens whose KV this one left behind (choice 0's; the
    /// others fork from the same prompt), remembered before the completion is sent so that a
    /// client's next turn always finds it. A keyless request that looks for its session is
    /// remembered as a turn a later prompt may extend. `tables` are the turn's full-pool and
    /// window-pool blocks, `computed` its positions with KV.
    fn remember_turn(
        &mut self,
        seq: &mut Seq<'t>,
        [table, window_table]: [&[u32]; 2],
        computed: usize,
        now: Instant,
    ) {
        let finished = FinishedTurn {
            tokens: &seq.tokens[..computed],
            prompt_len: seq.req.prompt.len().min(computed),
            group: self.group,
            request_id: &seq.req.id,
            branch: seq.req.session_branch,
        };
        let Some(session) = seq.req.session.clone() else {
            if seq.req.find_session
                && seq.choice == 0
                && computed > 0
                && let Ok(mut m) = self.sessions.lock()
            {
                m.remember(None, finished);
            }
            return;
        };
        // A keyless first turn's provisional session keeps no KV until a later turn extends
        // it (only then is it known to be a conversation).
        let candidate = self.sessions.lock().is_ok_and(|m| m.is_candidate(&session));
        if candidate {
            if seq.choice == 0
                && computed > 0
                && let Ok(mut m) = self.sessions.lock()
            {
                m.remember(Some(&session), finished);
            }
            return;
        }
        let ttl = self.keeping.ttl_for(seq.req.session_ttl);
        if seq.choice != 0 || computed == 0 {
            seq.timings.session_kv_ttl = Some(ttl);
            return;
        }
        // A side call is remembered on its own branch; the session's kept KV stays the main
        // conversation's.
        let main = self.sessions.lock().is_ok_and(|mut m| {
            m.remember(Some(&session), finished);
            m.is_main(&session, finished.branch)
        });
        if !main {
            seq.timings.session_kv_ttl = Some(self.keeping.kept_for(&session, now));
            return;
        }
        seq.timings.session_kv_ttl = Some(ttl);
        let full = (computed / self.blocks.block_size()).min(table.len());
        self.keeping
            .keep(&session, &table[..full], ttl, now, self.blocks.full_mut());
        // The window blocks still held at the turn's end: the last window, which a resume
        // from the turn's end reads (the ones the window passed were given back before).
        if let (Some(wk), Some(pool)) =
            (self.window_keeping.as_mut(), self.blocks.window_pool_mut())
        {
            wk.keep(&session, held_window(window_table, full), ttl, now, pool);
        }
    }

    /// The key of the tail a sequence leaves or continues: its session and branch.
    fn tail_key(seq: &Seq<'t>) -> Option<String> {
        let session = seq.req.session.as_deref()?;
        Some(format!("{session}\u{0}{}", seq.req.session_branch))
    }

    /// Holds `tail` for the next turn of `seq`'s session and branch until `until`, in place
    /// of an earlier one; the oldest goes beyond [`MAX_TAILS`].
    fn keep_tail(&mut self, seq: &Seq<'t>, tail: Tail, until: Instant) {
        let Some(key) = Self::tail_key(seq) else {
            self.blocks.release_tail(tail);
            return;
        };
        if let Some((old, _)) = self.tails.insert(key, (tail, until)) {
            self.blocks.release_tail(old);
        }
        while self.tails.len() > MAX_TAILS {
            let Some(oldest) = self
                .tails
                .iter()
                .min_by_key(|(_, (_, until))| *until)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((t, _)) = self.tails.remove(&oldest) {
                self.blocks.release_tail(t);
            }
        }
    }

    /// Gives back every tail whose time has passed (`all`: every tail).
    fn release_tails(&mut self, now: Instant, all: bool) {
        let gone: Vec<String> = self
            .tails
            .iter()
            .filter(|(_, (_, until))| all || *until <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            if let Some((t, _)) = self.tails.remove(&k) {
                self.blocks.release_tail(t);
            }
        }
    }

    /// Ends the keepings of sessions whose TTL has passed.
    fn expire_keepings(&mut self) {
        let now = Instant::now();
        self.release_tails(now, false);
        self.keeping.expire(now, self.blocks.full_mut());
        if let (Some(wk), Some(pool)) =
            (self.window_keeping.as_mut(), self.blocks.window_pool_mut())
        {
            wk.expire(now, pool);
        }
    }

    /// Ends every request, running and queued, with `why`.
    fn abort_all(&mut self, why: &EngineError) {
        let running: Vec<Seq<'t>> = self.active.drain(..).collect();
        for s in running {
            self.finish(s, FinishReason::Error(why.clone()));
        }
        let queued: Vec<Seq<'t>> = self.queue.drain(..).collect();
        for s in queued {
            self.leave_queue(s.timings.admitted.is_none());
            self.finish(s, FinishReason::Error(why.clone()));
        }
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].is_cancelled() {
                let s = self.active.swap_remove(i);
                self.finish(s, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.queue.len() {
            if self.queue[i].is_cancelled() {
                if let Some(s) = self.queue.remove(i) {
                    self.leave_queue(s.timings.admitted.is_none());
                    self.finish(s, FinishReason::Cancelled);
                }
            } else {
                i += 1;
            }
        }
    }

    /// Publishes the gauges: requests running on each path and the KV cache's state.
    fn publish(&self) {
        let slot = self
            .active
            .iter()
            .filter(|s| s.placement.is_some_and(|p| p.path == PathKind::Slot))
            .count();
        self.metrics.publish(
            self.active.len() - slot,
            slot,
            &self.kv_usage(),
            self.blocks.full().evictions(),
        );
        self.metrics
            .publish_session_kv(&self.keeping.stats(self.blocks.full()));
    }

    /// What the KV pools hold now: blocks in each pool and bytes, in all and held by running
    /// requests (neither free nor evictable).
    fn kv_usage(&self) -> KvUsage {
        // Sessions' tails (a block in each pool) are held, but given back before any request
        // waits for blocks: not "used" by a running request.
        let tails = self.tails.len();
        let full = self.blocks.full();
        let (full_total, full_used) = (
            full.total(),
            (full.total() - full.available()).saturating_sub(tails),
        );
        let (window_total, window_used, window_kept) =
            self.blocks.window_pool().map_or((0, 0, 0), |w| {
                (
                    w.total(),
                    (w.total() - w.available()).saturating_sub(tails),
                    w.kept_blocks(),
                )
            });
        let (fb, wb) = self.block_bytes;
        KvUsage {
            blocks: full_total,
            blocks_used: full_used,
            window_blocks: window_total,
            window_blocks_used: window_used,
            window_blocks_kept: window_kept,
            total_bytes: full_total * fb + window_total * wb,
            used_bytes: full_used * fb + window_used * wb,
        }
    }

    fn admit(&mut self) {
        while self.active.len() < self.cfg.batch {
            let Some(front) = self.queue.front() else {
                break;
            };
            // A fork waits for choice 0 to finish prefilling the shared prompt, then takes its
            // blocks from the prefix cache.
            if front.choice > 0
                && self
                    .active
                    .iter()
                    .any(|s| s.family == front.family && s.choice == 0 && s.phase == Phase::Prefill)
            {
                break;
            }
            let len = front.tokens.len();
            let need = self.blocks.blocks_for(len + 1);
            // And room in the window pool for its first chunk's window.
            let window_short = |lp: &Self| match (lp.blocks.window_pool(), lp.blocks.window()) {
                (Some(pool), Some(window)) => {
                    let first = (window + lp.cfg.prefill_chunk).min(len + 1);
                    pool.blocks_for(first) + 1 > pool.available()
                }
                _ => false,
            };
            // Tails are given back first when blocks run short.
            if !self.tails.is_empty() && (need > self.blocks.available() || window_short(self)) {
                self.release_tails(Instant::now(), true);
            }
            if need > self.blocks.available() && !self.active.is_empty() {
                break; // wait for blocks to free up
            }
            if window_short(self) && !self.active.is_empty() {
                break;
            }
            let Some(mut seq) = self.queue.pop_front() else {
                break;
            };
            let first = seq.timings.admitted.is_none();
            self.leave_queue(first);
            let (mut blocks, mut cached) = self.blocks.match_prefix(&seq.tokens);
            // The session's last turn's tail, when this prompt goes on from it.
            if let Some((tail, until)) = Self::tail_key(&seq).and_then(|k| self.tails.remove(&k)) {
                match self
                    .blocks
                    .attach_tail(&mut blocks, &seq.tokens, cached, tail)
                {
                    Ok(n) => cached += n,
                    Err(tail) => {
                        if let Some(k) = Self::tail_key(&seq) {
                            self.tails.insert(k, (tail, until));
                        }
                    }
                }
            }
            self.metrics.count_prefix_lookup(seq.tokens.len(), cached);
            if let Err(e) = self.blocks.reserve(&mut blocks, seq.tokens.len() + 1) {
                // Only possible when alone: the pool is smaller than this sequence.
                self.blocks.release(&mut blocks);
                self.finish(seq, FinishReason::Error(EngineError::KvCacheExhausted(e)));
                continue;
            }
            let now = Instant::now();
            if first {
                if seq.choice == 0 {
                    // Once per request, as `usage` counts them (the other choices fork).
                    self.metrics.count_prompt(seq.req.prompt.len(), cached);
                }
                seq.timings.cached_tokens = cached;
                let expired = seq
                    .req
                    .session
                    .as_deref()
                    .is_some_and(|s| self.keeping.expired_intact(s));
                // A keyless first turn's provisional session is no session to resume yet:
                // its outcome is the prefix cache's (`none`, `prefix`), as without one.
                let session = seq
                    .req
                    .session
                    .as_deref()
                    .is_some_and(|s| !self.sessions.lock().is_ok_and(|m| m.is_candidate(s)));
                // What the full pool alone held (looked up again only when the window pool
                // may have cut the resume short).
                let full = if session && self.blocks.window().is_some() {
                    self.blocks.full_cached(&seq.tokens).max(cached)
                } else {
                    cached
                };
                seq.timings.resume = Some(resume::decide(
                    session,
                    seq.prior.as_ref(),
                    self.group,
                    resume::Found { cached, full },
                    seq.tokens.len(),
                    self.blocks.block_size(),
                    expired,
                ));
            }
            seq.blocks = blocks;
            seq.computed = cached;
            seq.phase = Phase::Prefill;
            seq.prefill = Some(PrefillProgress::new(
                seq.tokens.len(),
                cached,
                if first {
                    PrefillReason::Initial
                } else {
                    PrefillReason::Preempted
                },
            ));
            seq.timings.mark_admitted(now);
            seq.order = self.next_order;
            self.next_order += 1;
            self.active.push(seq);
        }
    }

    /// One request alone runs solo; two or more run in slots.
    fn settle_paths(&mut self) {
        let n = self.active.len();
        let now = Instant::now();
        for i in 0..n {
            let seq = &self.active[i];
            let want = if n == 1 && (self.cfg.return_to_solo || !seq.ever_slotted) {
                PathKind::Solo
            } else {
                PathKind::Slot
            };
            if seq.placement.is_some_and(|p| p.path == want) {
                continue;
            }
            let seq = &mut self.active[i];
            if let Some(leg) = seq.timings.end_leg(now, LegEnd::Moved).cloned() {
                seq.emit(Event::LegEnded(leg));
            }
            if let Some(slot) = seq.placement.and_then(|p| p.slot) {
                self.slots.free(slot);
            }
            let slot = match want {
                PathKind::Slot => self.slots.take(),
                PathKind::Solo => None,
            };
            let placement = Placement {
                path: if slot.is_some() {
                    PathKind::Slot
                } else {
                    PathKind::Solo
                },
                group: self.group,
                slot,
            };
            seq.ever_slotted |= slot.is_some();
            let first_admission = seq.placement.is_none() && seq.timings.legs.is_empty();
            seq.placement = Some(placement);
            if first_admission && let Some(at) = seq.timings.admitted {
                seq.emit(Event::Admitted { at, placement });
            }
            let leg = seq
                .timings
                .start_leg(placement.path, self.group, slot, now)
                .clone();
            seq.emit(Event::LegStarted(leg));
        }
    }

    /// Frees KV blocks by preempting the newest request other than `keep` (an admission
    /// order); it goes back to the front of the queue and re-prefills when admitted again.
    fn preempt_newest_except(&mut self, keep: u64) -> bool {
        let victim = self
            .active
            .iter()
            .enumerate()
            .filter(|(_, s)| s.order != keep)
            .max_by_key(|(_, s)| s.order)
            .map(|(i, _)| i);
        let Some(v) = victim else { return false };
        let mut seq = self.active.swap_remove(v);
        // A prefill cut here is recorded, so its steps' device time has a prefill span.
        self.vacate(
            &mut seq,
            PrefillEnd::Preempted,
            LegEnd::Preempted,
            Instant::now(),
        );
        seq.placement = None;
        seq.computed = 0;
        self.stats.preemptions += 1;
        self.metrics.count_preemption();
        self.metrics.enter_queue(1);
        self.queue.push_front(seq);
        true
    }

    /// One step: room for every decode, the plan (with the window pool's blocks for each
    /// chunk), the forward pass, then each chunk's bookkeeping and sampling; finished requests
    /// end.
    fn step(&mut self) -> Result<(), BackendError> {
        if self.active.is_empty() {
            return Ok(());
        }
        self.plan_drafts();
        self.reserve_decode_room();
        self.settle_paths();
        let mut plan = self.plan_step();
        while !self.reserve_windows(&plan) {
            plan = self.plan_step();
        }
        self.settle_paths();
        if self.active.is_empty() {
            return Ok(());
        }
        let ran = self.forward(&plan)?;
        self.stats.steps += 1;
        self.metrics.observe_step(ran.device, plan.len());
        let mut done: Vec<(usize, FinishReason)> = Vec::new();
        let mut row = 0;
        for c in &plan {
            self.record_chunk(c, plan.len(), &ran);
            if !c.samples {
                continue;
            }
            let logits = row;
            row += c.rows();
            let finished = if c.draft > 0 {
                self.verify_and_emit(c, logits, &ran)
            } else {
                self.sample_and_emit(c, logits, &ran)
            };
            if let Some(reason) = finished {
                done.push((c.seq, reason));
            }
        }
        done.sort_by_key(|d| std::cmp::Reverse(d.0));
        for (i, reason) in done {
            let s = self.active.swap_remove(i);
            self.finish(s, reason);
        }
        Ok(())
    }

    /// Plans each decoding sequence's draft for this step, within what its request may still
    /// generate and the context holds: the step then yields at most every draft token and one
    /// more.
    fn plan_drafts(&mut self) {
        let context = self.backend.config().context;
        for s in &mut self.active {
            if s.phase != Phase::Decode {
                s.draft = None;
                continue;
            }
            let generated = s.tokens.len() - s.req.prompt.len();
            let room = s
                .req
                .max_tokens
                .saturating_sub(generated + 1)
                .min(context.saturating_sub(s.tokens.len() + 1));
            s.plan_draft(room);
        }
    }

    /// Makes sure every decoding sequence has room for one more position (and its draft's,
    /// when the cache has them free: a draft never preempts anyone, it is dropped instead),
    /// preempting the newest other request when the cache is full (or ending the sequence when
    /// nothing is left to preempt).
    fn reserve_decode_room(&mut self) {
        let decoding: Vec<u64> = self
            .active
            .iter()
            .filter(|s| s.phase == Phase::Decode)
            .map(|s| s.order)
            .collect();
        for order in decoding {
            while let Some(i) = self.active.iter().position(|s| s.order == order) {
                let drafted = self.active[i].draft_len();
                let need = self.active[i].computed + 1 + drafted;
                let mut blocks = std::mem::take(&mut self.active[i].blocks);
                let reserved = self.blocks.reserve(&mut blocks, need);
                self.active[i].blocks = blocks;
                let Err(out_of_blocks) = reserved else {
                    break;
                };
                if drafted > 0 {
                    self.active[i].draft = None;
                    continue;
                }
                if !self.preempt_newest_except(order) {
                    let s = self.active.swap_remove(i);
                    let e = EngineError::KvCacheExhausted(out_of_blocks);
                    self.finish(s, FinishReason::Error(e));
                    break;
                }
            }
        }
    }

    /// Gives each chunk of `plan` its window-pool blocks (after giving back what the window
    /// has passed). When the pool is full, the newest request is preempted (or, alone, the
    /// chunk's request ends) and this returns false: the plan must be made again. True when
    /// every chunk has its blocks (always without a window pool, and always with one sized by
    /// [`crate::runtime::window_pool_blocks`] for this loop's settings).
    fn reserve_windows(&mut self, plan: &[Chunk]) -> bool {
        for c in plan {
            let mut kv = std::mem::take(&mut self.active[c.seq].blocks);
            let reserved = self
                .blocks
                .reserve_window(&mut kv, c.start, c.start + c.len);
            self.active[c.seq].blocks = kv;
            let Err(out_of_blocks) = reserved else {
                continue;
            };
            if self.active.len() == 1 {
                let s = self.active.swap_remove(c.seq);
                let e = EngineError::KvCacheExhausted(out_of_blocks);
                self.finish(s, FinishReason::Error(e));
            } else {
                // The newest request waits, this one if it is the newest: the oldest always
                // goes on.
                self.preempt_newest_except(u64::MAX);
            }
            return false;
        }
        true
    }

    /// The step's chunks: every decode first, then prefill chunks in admission order within
    /// the token budget (smaller while others decode, to keep their token rate steady).
    fn plan_step(&self) -> Vec<Chunk> {
        let decoding = self.active.iter().any(|s| s.phase == Phase::Decode);
        let mut budget = if decoding {
            self.cfg.mixed_prefill_chunk
        } else {
            self.cfg.prefill_chunk
        }
        .max(1);
        let chunk = |seq: usize, start: usize, len: usize| Chunk {
            seq,
            start,
            len,
            samples: start + len == self.active[seq].tokens.len(),
            draft: 0,
        };
        let mut plan: Vec<Chunk> = Vec::new();
        for (i, s) in self.active.iter().enumerate() {
            if s.phase == Phase::Decode {
                let draft = s.draft_len();
                plan.push(Chunk {
                    len: 1 + draft,
                    samples: true,
                    draft,
                    ..chunk(i, s.computed, 1)
                });
            }
        }
        let mut order: Vec<usize> = (0..self.active.len())
            .filter(|&i| self.active[i].phase == Phase::Prefill)
            .collect();
        order.sort_by_key(|&i| self.active[i].order);
        for i in order {
            if budget == 0 {
                break;
            }
            let s = &self.active[i];
            let len = (s.tokens.len() - s.computed).min(budget);
            plan.push(chunk(i, s.computed, len));
            budget -= len;
        }
        plan
    }

    /// Runs the forward pass over `plan`, leaving one row of logits per sampling chunk in
    /// `self.logits`. A constrained sequence that samples computes its grammar mask on a
    /// helper thread meanwhile.
    fn forward(&mut self, plan: &[Chunk]) -> Result<Ran, BackendError> {
        let mut wants_mask = vec![false; self.active.len()];
        for c in plan {
            wants_mask[c.seq] = c.samples;
        }
        let mut views: Vec<SeqView<'_>> = Vec::with_capacity(self.active.len());
        let mut jobs: Vec<&mut SeqConstraint> = Vec::new();
        for (i, s) in self.active.iter_mut().enumerate() {
            let Seq {
                tokens,
                blocks,
                constraint,
                verify,
                ..
            } = s;
            views.push(SeqView {
                tokens,
                full: &blocks.full.table,
                window: &blocks.window.table,
                verify,
            });
            if wants_mask[i]
                && let Some(c) = constraint.as_mut()
            {
                jobs.push(c);
            }
        }
        let chunks: Vec<SeqChunk<'_>> = plan
            .iter()
            .map(|c| SeqChunk {
                // A verification chunk: the last token, then the draft.
                tokens: if c.draft > 0 {
                    views[c.seq].verify
                } else {
                    &views[c.seq].tokens[c.start..c.start + c.len]
                },
                start_pos: c.start,
                blocks: views[c.seq].full,
                all_logits: c.draft > 0,
                no_logits: !c.samples,
            })
            .collect();
        // Without a window pool, no tables: the backend keeps every layer whole.
        let windows: Vec<&[u32]> = if self.blocks.window().is_some() {
            plan.iter().map(|c| views[c.seq].window).collect()
        } else {
            Vec::new()
        };
        self.logits.clear();
        let started = Instant::now();
        let stats = if jobs.is_empty() {
            self.backend
                .forward_windowed(&chunks, &windows, &mut self.logits)
        } else {
            let backend = &mut self.backend;
            let logits = &mut self.logits;
            std::thread::scope(|sc| {
                let masks = sc.spawn(move || {
                    for c in jobs {
                        c.prepare();
                    }
                });
                let r = backend.forward_windowed(&chunks, &windows, logits);
                // A mask that panicked is left unset and recomputed (and reported) at sampling.
                let _ = masks.join();
                r
            })
        }?;
        Ok(Ran {
            device: stats.device_time,
            started,
            stepped: Instant::now(),
        })
    }

    /// A chunk ran: its positions are computed, its step is on the request's clocks (and on
    /// its prefill's, when prefilling), its full blocks join the prefix cache, and the window
    /// pool's blocks its window has now passed go back.
    /// A verification chunk's positions are settled once its draft is decided
    /// ([`Loop::verify_and_emit`]).
    fn record_chunk(&mut self, c: &Chunk, batch: usize, ran: &Ran) {
        let s = &mut self.active[c.seq];
        let is_prefill = s.phase == Phase::Prefill;
        s.timings.add_step(ran.device, batch, is_prefill);
        if c.draft > 0 {
            return;
        }
        s.computed = c.start + c.len;
        if is_prefill && let Some(p) = s.prefill.as_mut() {
            let progress = p.chunk_done(ran.started, ran.stepped, ran.device, s.computed, c.len);
            s.emit(Event::PrefillChunk(progress));
        }
        self.commit_kv(c.seq);
    }

    /// Sequence `i`'s computed positions are settled: its full blocks join the prefix cache,
    /// and the window pool's blocks its window has passed go back.
    fn commit_kv(&mut self, i: usize) {
        let s = &mut self.active[i];
        let computed = s.computed;
        self.blocks
            .register_full(&mut s.blocks, &s.tokens, computed);
        self.checkpoint_prompt(i);
        self.checkpoint_reply(i);
        let s = &mut self.active[i];
        self.blocks.slide(&mut s.blocks, computed);
    }

    /// With a window pool: once sequence `i`'s prompt is computed, keeps the window before the
    /// prompt's end (its last whole block) as a checkpoint of its session's main conversation,
    /// for the session's TTL, before the window slides past it during the reply. A next turn
    /// that departs inside this reply (a client that resends it otherwise) can then resume
    /// from the prompt's end whatever the window pool's churn.
    fn checkpoint_prompt(&mut self, i: usize) {
        let s = &self.active[i];
        if s.prompt_checkpointed || s.choice != 0 || s.computed < s.req.prompt.len() {
            return;
        }
        let (Some(session), branch) = (s.req.session.clone(), s.req.session_branch) else {
            return;
        };
        self.active[i].prompt_checkpointed = true;
        let end = self.active[i].req.prompt.len();
        self.keep_checkpoint(i, &session, branch, "prompt", end);
    }

    /// Keeps sequence `i`'s window before the last block boundary at or before position
    /// `at`, under `session`'s checkpoint `name`, for the session's TTL, when the sequence is
    /// its session's main conversation (never a provisional session's).
    fn keep_checkpoint(&mut self, i: usize, session: &str, branch: u32, name: &str, at: usize) {
        let main = self
            .sessions
            .lock()
            .is_ok_and(|m| !m.is_candidate(session) && m.is_main(session, branch));
        if !main {
            return;
        }
        let ttl = self.keeping.ttl_for(self.active[i].req.session_ttl);
        let (Some(wk), Some(pool)) = (self.window_keeping.as_mut(), self.blocks.window_pool_mut())
        else {
            return;
        };
        let end = at / pool.block_size();
        wk.keep(
            &format!("{session}\u{0}{name}"),
            held_window(&self.active[i].blocks.window.table, end),
            ttl,
            Instant::now(),
            pool,
        );
    }

    /// With a window pool: every [`super::SessionWindows::checkpoint_every`] positions of sequence
    /// `i`'s reply, keeps the window before the last block boundary as a checkpoint of its
    /// session's main conversation (the session's latest
    /// [`super::SessionWindows::reply_checkpoints`] are kept), before the window slides past it. A
    /// next turn that departs late in a long reply then resumes from the checkpoint before
    /// the departure rather than from the prompt's end.
    fn checkpoint_reply(&mut self, i: usize) {
        let windows = self.cfg.session_windows;
        let s = &self.active[i];
        let due = s.req.prompt.len() + windows.checkpoint_every * (s.reply_checkpoints + 1);
        if windows.checkpoint_every == 0
            || windows.reply_checkpoints == 0
            || s.choice != 0
            || s.computed < due
            || self.window_keeping.is_none()
        {
            return;
        }
        let (Some(session), branch) = (s.req.session.clone(), s.req.session_branch) else {
            return;
        };
        let n = s.reply_checkpoints;
        let (passed, at) = (
            (s.computed - s.req.prompt.len()) / windows.checkpoint_every,
            s.computed,
        );
        self.active[i].reply_checkpoints = passed;
        let name = format!("reply{}", n % windows.reply_checkpoints);
        self.keep_checkpoint(i, &session, branch, &name, at);
    }

    /// Decides sequence `i`'s next token from logits row `row`: its grammar's mask, then a
    /// plain draw, or the verdict on `draft` when there is one. The token's log-probabilities
    /// come from the model's own distribution, before any mask, bias, penalty or sampling
    /// filter. A grammar that allows nothing ends the sequence.
    fn choose_token(
        &mut self,
        i: usize,
        row: usize,
        draft: Option<u32>,
    ) -> Result<(Verdict, Option<Box<TokenLogprobs>>), FinishReason> {
        let vocab = self.backend.config().vocab;
        let s = &mut self.active[i];
        let logits = &mut self.logits[row * vocab..(row + 1) * vocab];
        let raw = s.req.logprobs.map(|_| logits.to_vec());
        if let Some(c) = s.constraint.as_mut()
            && let Err(e) = c.apply(logits)
        {
            return Err(FinishReason::Error(EngineError::StructuredOutput(
                e.to_string(),
            )));
        }
        let verdict = match draft {
            Some(d) => s.sampler.verify(logits, d),
            None => Verdict {
                token: s.sampler.sample(logits),
                accepted: false,
            },
        };
        let logprobs = raw.map(|r| {
            Box::new(crate::sampling::logprobs(
                &r,
                verdict.token,
                s.req.logprobs.unwrap_or(0),
            ))
        });
        Ok((verdict, logprobs))
    }

    /// Samples the next token of a chunk's sequence from logits row `row`, emits it (ending
    /// a finished prefill first), and says whether the sequence is done and why.
    fn sample_and_emit(&mut self, c: &Chunk, row: usize, ran: &Ran) -> Option<FinishReason> {
        let (verdict, logprobs) = match self.choose_token(c.seq, row, None) {
            Ok(v) => v,
            Err(reason) => return Some(reason),
        };
        let made = Made {
            from_prefill: self.active[c.seq].phase == Phase::Prefill,
            same_step: false,
            draft: None,
        };
        let finished = self.emit_token(c.seq, verdict.token, logprobs, made, ran);
        let s = &mut self.active[c.seq];
        if let Some(d) = s.drafter.as_mut() {
            d.observe(verdict.token, &s.tokens);
        }
        finished
    }

    /// Decides a verification chunk's draft from its logits rows `first..`, in order: each
    /// draft token the model takes is emitted and the next row decides the next one; the first
    /// one it does not take is replaced by its own choice, and a draft taken whole earns the
    /// token of its last row. Then the KV cache keeps only the positions of the tokens taken
    /// (the rest were never computed, as far as the sequence and the prefix cache know), and
    /// the drafter learns how the draft fared.
    fn verify_and_emit(&mut self, c: &Chunk, first: usize, ran: &Ran) -> Option<FinishReason> {
        let Some(draft) = self.active[c.seq].draft.take() else {
            // Unreachable: a verification chunk is planned from its sequence's draft.
            return self.sample_and_emit(c, first, ran);
        };
        let drafted = draft.tokens.len();
        let mut check = DraftCheck {
            drafted,
            accepted: 0,
        };
        let mut finished = None;
        let mut next = None;
        for r in 0..=drafted {
            let (verdict, logprobs) =
                match self.choose_token(c.seq, first + r, draft.tokens.get(r).copied()) {
                    Ok(v) => v,
                    Err(reason) => {
                        finished = Some(reason);
                        break;
                    }
                };
            if verdict.accepted {
                check.accepted += 1;
            } else {
                next = Some(verdict.token);
            }
            let last = !verdict.accepted || r == drafted;
            let made = Made {
                from_prefill: false,
                same_step: r > 0,
                draft: Some((check, last)),
            };
            finished = self.emit_token(c.seq, verdict.token, logprobs, made, ran);
            if finished.is_some() || last {
                break;
            }
        }
        self.metrics.count_draft(drafted, check.accepted);
        let s = &mut self.active[c.seq];
        s.timings.add_draft(check);
        // Positions of the last token and of the draft tokens taken hold their KV; the next
        // position's, if any was computed, belongs to a token not taken.
        s.computed = c.start + 1 + check.accepted;
        if let Some(d) = s.drafter.as_mut() {
            d.record(&draft, check.accepted, next, &s.tokens);
        }
        self.commit_kv(c.seq);
        finished
    }

    /// Emits token `id` of sequence `i`, made as `made` in step `ran` (ending a finished
    /// prefill first), and says whether the sequence is done and why: an end-of-sequence
    /// token, a stop string, a complete grammar, its length, or a failure.
    fn emit_token(
        &mut self,
        i: usize,
        id: u32,
        logprobs: Option<Box<TokenLogprobs>>,
        made: Made,
        ran: &Ran,
    ) -> Option<FinishReason> {
        let context = self.backend.config().context;
        let s = &mut self.active[i];
        let now = Instant::now();
        if made.from_prefill {
            if let Some(mut p) = s.prefill.take() {
                p.last_end = Some(now);
                let rec = p.record(s.computed, PrefillEnd::Finished);
                s.timings.prefilled_tokens += rec.computed_tokens;
                s.timings.prefills.push(rec.clone());
                s.emit(Event::Prefilled(rec));
            }
            s.phase = Phase::Decode;
        }
        s.tokens.push(id);
        s.timings.mark_token(now, !made.from_prefill);
        self.metrics.count_token();
        let is_eos = !s.req.ignore_eos && self.tok.is_stop_token(id);
        // A token that does not decode ends the choice with an error (after its token event,
        // so that the token is counted where it was generated), never a silently empty text.
        let (delta, undecodable) = if is_eos {
            (String::new(), None)
        } else {
            match s.decoder.push(id) {
                Ok(text) => (text, None),
                Err(e) => {
                    tracing::error!(token = id, error = %e, "Decode.Failed");
                    (String::new(), Some(e))
                }
            }
        };
        let out = s.stop.push(&delta);
        // The grammar follows the token; once complete, nothing more may come.
        let grammar = match s.constraint.as_mut() {
            None => Ok(false),
            Some(c) => c.constraint.consume(id).map(|()| c.constraint.is_stopped()),
        };
        let generated = s.tokens.len() - s.req.prompt.len();
        let finished = if let Some(e) = undecodable {
            Some(FinishReason::Error(EngineError::Decode(e.to_string())))
        } else {
            match grammar {
                Err(e) => Some(FinishReason::Error(EngineError::StructuredOutput(
                    e.to_string(),
                ))),
                Ok(_) if is_eos || out.matched.is_some() => Some(FinishReason::Stop),
                Ok(true) => Some(FinishReason::Stop),
                Ok(false) if generated >= s.req.max_tokens || s.tokens.len() >= context => {
                    Some(FinishReason::Length)
                }
                Ok(false) => None,
            }
        };
        // A sequence in a step always has a placement; the fallback only keeps a broken
        // invariant from panicking the step loop.
        let placement = s.placement.unwrap_or(Placement {
            path: PathKind::Solo,
            group: self.group,
            slot: None,
        });
        // The step's draft goes with its last token (the last candidate, or the one that ended
        // the sequence), once what was taken is known.
        let draft = made
            .draft
            .filter(|&(_, last)| last || finished.is_some())
            .map(|(check, _)| check);
        s.emit(Event::Token {
            id,
            text: out.text,
            at: now,
            generated: s.timings.generated_tokens,
            step_device: ran.device,
            from_prefill: made.from_prefill,
            same_step: made.same_step,
            draft,
            placement,
            logprobs,
        });
        finished
    }
}

/// The window-pool blocks of `table` (a sequence's window table) before block `end` that the
/// sequence still holds: those the window passed were given back ([`RELEASED`]).
fn held_window(table: &[u32], end: usize) -> &[u32] {
    let end = end.min(table.len());
    let held = table[..end]
        .iter()
        .position(|&b| b != RELEASED)
        .unwrap_or(end);
    &table[held..end]
}
