//! Continuous batching: a request starts alone on the **solo path** and moves into a **batch
//! slot**, carrying its reply so far, when others arrive.
//!
//! Each device group runs one step loop on its own thread (`group`); the loop owns the
//! backend (model and KV storage), the block manager and every sequence. The HTTP side talks
//! to it only through channels: [`EngineHandle::submit`] returns the request's own event
//! channel, on which its tokens, its leg and prefill records, and finally its completion with
//! its own [`RequestTimings`] arrive.

mod group;
pub mod keep;
pub mod resume;
mod sequence;
pub mod sessions;
mod slots;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::backend::Backend;
use crate::constraint::Constraint;
use crate::metrics::GroupMetrics;
use crate::sampling::{SamplingParams, TokenLogprobs};
use crate::speculation::{SpeculationConfig, SpeculationMode};
use crate::stop::StopMatcher;
use crate::timing::{
    DraftCheck, LegRecord, PathKind, PrefillChunkRecord, PrefillRecord, RequestTimings,
};
use crate::tokenizer::Tokenizer;

pub use crate::finish::{EngineError, FinishReason};
use crate::kv_events::KvEventSink;
pub use group::GroupStats;
pub use keep::KeepConfig;
use sessions::SessionMemory;
pub use sessions::SessionTurn;

/// How the step loops run: batch slots, queue bound, prefill chunks, the return to the solo
/// path and the sessions remembered for warm resume.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Batch slots per group.
    pub batch: usize,
    /// Requests that may wait for admission, over all groups.
    pub max_queue: usize,
    /// Prefill tokens per step while nothing else is decoding.
    pub prefill_chunk: usize,
    /// Prefill tokens per step while other requests decode (keeps their token rate steady).
    pub mixed_prefill_chunk: usize,
    /// Return a request to the solo path when the batch drains to it.
    pub return_to_solo: bool,
    /// Sessions whose last turn the engine remembers for warm resume (least recently used
    /// dropped first; 0 remembers none).
    pub max_sessions: usize,
    /// The most bytes of those sessions' remembered tokens (least recently used dropped
    /// first).
    pub session_memory_bytes: usize,
    /// How decoding sequences draft tokens to verify (speculative decoding).
    pub speculation: SpeculationConfig,
    /// How long, and within what share of each group's blocks, live sessions' KV is kept.
    pub session_kv: KeepConfig,
    /// With sliding-window layers: how their KV is kept for live sessions.
    pub session_windows: SessionWindows,
}

/// How a model with sliding-window layers keeps their KV for live sessions: the window pool
/// holds only the running sequences' windows, so a session's next turn can resume only from a
/// window kept apart (its last turn's end, its prompt's end, or a checkpoint inside a long
/// reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionWindows {
    /// Windows the window pool holds beyond the running sequences', per group, for live
    /// sessions (0: they are kept only in the pool's free room).
    pub room: usize,
    /// Positions between checkpoints inside a reply (0: none inside replies).
    pub checkpoint_every: usize,
    /// Checkpoints inside replies each session keeps (its latest).
    pub reply_checkpoints: usize,
}

impl SessionWindows {
    /// The defaults for `batch` slots: two windows a slot, a checkpoint every 2,048 positions
    /// of a reply, the latest two kept.
    pub fn for_batch(batch: usize) -> Self {
        Self {
            room: 2 * batch.max(1),
            checkpoint_every: 2048,
            reply_checkpoints: 2,
        }
    }

    /// Nothing kept apart and no checkpoints inside replies (a run without sessions).
    pub fn off() -> Self {
        Self {
            room: 0,
            checkpoint_every: 0,
            reply_checkpoints: 0,
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            batch: 8,
            max_queue: 256,
            prefill_chunk: 512,
            mixed_prefill_chunk: 64,
            return_to_solo: true,
            max_sessions: 4096,
            session_memory_bytes: 256 << 20,
            speculation: SpeculationConfig::default(),
            session_kv: KeepConfig::default(),
            session_windows: SessionWindows::for_batch(8),
        }
    }
}

/// A validated generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The request id (also the response id).
    pub id: String,
    /// Prompt token ids, already templated and tokenized.
    pub prompt: Vec<u32>,
    /// Most tokens to generate; the request ends with `length` there.
    pub max_tokens: usize,
    /// How tokens are drawn (validated), with the request's own seed.
    pub sampling: SamplingParams,
    /// Stop strings, already checked: the request ends with `stop` at the first, which is
    /// never sent.
    pub stop: StopMatcher,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Session (affinity to a group, for warm resume).
    pub session: Option<String>,
    /// Without a session: look for the session whose remembered turn the prompt extends, and
    /// remember this turn as one a later prompt may extend ([`sessions`]).
    pub find_session: bool,
    /// The session branch the turn extends or starts ([`SessionTurn::branch`]): set when the
    /// request is submitted, whatever the caller put here.
    pub session_branch: u32,
    /// How long after this turn its session's KV should be kept, when the request asked
    /// (Responses `prompt_cache_options.ttl`, Messages `cache_control.ttl`); clamped to
    /// `--session-kv-ttl-max`. `None`: `--session-kv-ttl`.
    pub session_ttl: Option<Duration>,
    /// Arrival at the HTTP layer: the start of every one of the request's clocks.
    pub received: Instant,
    /// Set by the caller to cancel the request; checked at every step.
    pub cancel: Arc<AtomicBool>,
    /// Choices (`n`, at least 1). Each has its own event channel and its own random stream
    /// (seed + choice index); they share the prompt's KV: choice 0 prefills the prompt, the
    /// others wait for that prefill and fork from it through the prefix cache, computing only
    /// the prompt's last, partial block.
    pub n: usize,
    /// Log-probabilities of each generated token, with this many most likely alternatives
    /// (`None`: none at all).
    pub logprobs: Option<usize>,
    /// A grammar the output must follow (structured outputs, enforced tool calls); each
    /// choice gets its own copy.
    pub constraint: Option<Constraint>,
    /// The tokens the client expects the reply to be (OpenAI's Predicted Outputs): drafted
    /// from first, verified like any draft, so they never change the output.
    pub prediction: Option<Vec<u32>>,
}

impl GenerateRequest {
    /// A request for `max_tokens` tokens after `prompt`, with default everything else.
    pub fn new(id: impl Into<String>, prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            id: id.into(),
            prompt,
            max_tokens,
            sampling: SamplingParams::default(),
            stop: StopMatcher::default(),
            ignore_eos: false,
            session: None,
            find_session: false,
            session_branch: 0,
            session_ttl: None,
            received: Instant::now(),
            cancel: Arc::new(AtomicBool::new(false)),
            n: 1,
            logprobs: None,
            constraint: None,
            prediction: None,
        }
    }
}

/// A request the engine took: one event channel per choice, and the turn's place in its
/// session (`None` for a request without one).
#[derive(Debug)]
pub struct Submitted {
    /// The events of choice `i` arrive on the `i`-th channel.
    pub events: Vec<mpsc::UnboundedReceiver<Event>>,
    /// The turn's session, index and (for a found session) the turn it extends.
    pub session: Option<SessionTurn>,
}

/// Where a request was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Solo path or batch slot.
    pub path: PathKind,
    /// The device group (slot group) the request runs on.
    pub group: usize,
    /// Slot (slot path only).
    pub slot: Option<usize>,
}

/// What a request's channel carries, in order.
#[derive(Debug, Clone)]
pub enum Event {
    /// Admitted at `at` (first admission only).
    Admitted {
        /// When it was admitted: the end of its queue time.
        at: Instant,
        /// The path, group and slot it was admitted to.
        placement: Placement,
    },
    /// A leg started.
    LegStarted(LegRecord),
    /// A leg ended.
    LegEnded(LegRecord),
    /// A chunk of a prefill ran (one event per chunk, before the prefill's own record).
    PrefillChunk(PrefillChunkRecord),
    /// A prefill finished.
    Prefilled(PrefillRecord),
    /// A token was produced.
    Token {
        /// The token's id in the model's vocabulary.
        id: u32,
        /// Text it completes (may be empty; stop strings are held back and never sent).
        text: String,
        /// When it was produced.
        at: Instant,
        /// Tokens generated so far, this one included.
        generated: usize,
        /// Time of the forward step that produced it.
        step_device: Duration,
        /// Whether a prefill step produced it (the first token, or the one after a
        /// preemption's re-prefill) rather than a decode step.
        from_prefill: bool,
        /// Whether an earlier token of the same step came before it (a verification step
        /// yields the draft tokens taken and one more): the step, its device time and its
        /// draft are counted with the first.
        same_step: bool,
        /// On the last token of a verification step (its last candidate, or the token that
        /// ended the request): what the step did with its draft.
        draft: Option<DraftCheck>,
        /// The path, group and slot it was admitted to.
        placement: Placement,
        /// Its log-probabilities, when the request asked for them.
        logprobs: Option<Box<TokenLogprobs>>,
    },
    /// The request finished; its own timings come with it.
    Done(Box<Completion>),
}

/// Time spent on a sequence's grammar masks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MaskStats {
    /// Time computing masks.
    pub time: Duration,
    /// How many token masks the grammar computed.
    pub masks: u64,
}

/// A finished request.
#[derive(Debug, Clone)]
pub struct Completion {
    /// Why it finished.
    pub finish_reason: FinishReason,
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Text held back at the end (flushed from the detokenizer and the stop matcher).
    pub tail_text: String,
    /// The request's own clocks.
    pub timings: RequestTimings,
    /// Group it finished on.
    pub group: usize,
    /// Which choice of the request this is, from 0.
    pub choice: usize,
    /// Grammar mask statistics, for a constrained request.
    pub mask: Option<MaskStats>,
    /// How the choice was drafted for (its counts are in `timings.drafts`).
    pub speculation: SpeculationMode,
}

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The queue is full.
    #[error("the queue is full ({0} requests waiting); retry later")]
    QueueFull(usize),
    /// The engine is shutting down.
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// The prompt plus `max_tokens` does not fit the context.
    #[error(
        "prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds the context length of {context} tokens"
    )]
    ContextOverflow {
        /// Tokens of the prompt.
        prompt: usize,
        /// Requested completion tokens.
        max_tokens: usize,
        /// The model's context length, in tokens, that prompt and reply must fit.
        context: usize,
    },
    /// The prompt is empty.
    #[error("the prompt is empty")]
    EmptyPrompt,
}

/// One request in flight, as the step loop sees it.
#[derive(Debug, Clone, Serialize)]
pub struct InFlight {
    /// The request id (also the response id and `slotlight.request.id`).
    pub id: String,
    /// `queued`, `prefill` or `decoding`.
    pub state: &'static str,
    /// `solo` or `slot` (absent while queued).
    pub path: Option<PathKind>,
    /// The device group (slot group) the request runs on.
    pub group: usize,
    /// The batch slot it holds (none on the solo path).
    pub slot: Option<usize>,
    /// Tokens generated so far.
    pub generated_tokens: usize,
    /// Seconds since the request's own arrival.
    pub elapsed_s: f64,
    /// The request's own rate since its first token, over all its legs.
    pub tok_s: Option<f64>,
    /// Legs so far.
    pub legs: usize,
    /// Seconds in the current leg.
    pub in_leg_s: Option<f64>,
    /// Tokens generated in the current leg.
    pub leg_tokens: usize,
    /// The current leg's own rate (its tokens over its time so far).
    pub leg_tok_s: Option<f64>,
    /// Draft tokens verified so far (speculative decoding).
    pub drafted_tokens: usize,
    /// Of those, the ones taken.
    pub accepted_tokens: usize,
    /// The request's session (`x-session-id` or `user`), if any.
    pub session_id: Option<String>,
    /// Where its prefill stands, while it prefills (llama.cpp's `prompt_progress` counts).
    pub prompt_progress: Option<PromptProgress>,
    /// The prefill's own rate so far: tokens computed per second since its first chunk
    /// started, as of its latest chunk (cached tokens are not counted).
    pub prefill_tok_s: Option<f64>,
}

/// Where a prefill stands, in llama.cpp's `prompt_progress` shape: the stream's progress
/// chunks and `/v1/requests` carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PromptProgress {
    /// Positions the prefill puts in the KV cache (the prompt; after a preemption, the prompt
    /// and the reply so far).
    pub total: usize,
    /// Of those, reused from the prefix cache.
    pub cache: usize,
    /// Of those, in the KV cache so far, the reused ones included: it reaches `total` with the
    /// prefill's last chunk (tokens computed so far are `processed - cache`).
    pub processed: usize,
    /// Milliseconds from the start of the prefill's first chunk to the end of its latest.
    pub time_ms: u64,
}

impl From<&PrefillChunkRecord> for PromptProgress {
    fn from(r: &PrefillChunkRecord) -> Self {
        Self {
            total: r.total,
            cache: r.cached,
            processed: r.processed,
            time_ms: u64::try_from(r.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }
}

enum Command {
    /// A request, one event channel per choice, and what the engine remembered of its session.
    Submit(
        Box<GenerateRequest>,
        Vec<mpsc::UnboundedSender<Event>>,
        Option<resume::Prior>,
    ),
    Snapshot(oneshot::Sender<(Vec<InFlight>, GroupStats)>),
    AbortAll,
    Shutdown,
}

struct GroupHandle {
    tx: mpsc::UnboundedSender<Command>,
    load: Arc<AtomicUsize>,
    /// The group's counters and gauges (its step loop writes them).
    metrics: Arc<GroupMetrics>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The engine as the HTTP layer sees it: submit requests, look at what is in flight.
pub struct EngineHandle {
    groups: Vec<GroupHandle>,
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    context: usize,
    batch: usize,
    sessions: Arc<Mutex<SessionMemory>>,
    shutting_down: AtomicBool,
    kv_events: Option<KvEventSink>,
}

/// The engine's memory of sessions, for `/v1/requests` and metrics.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SessionStats {
    /// Sessions whose last turn is remembered now.
    pub remembered: usize,
    /// Keyless turns remembered in case a later prompt extends them (a session of one turn
    /// no one has named yet).
    pub candidates: usize,
    /// The most sessions and candidates it remembers (`--max-sessions`).
    pub capacity: usize,
    /// Sessions dropped (least recently used) to stay within the capacity.
    pub dropped: u64,
    /// Sessions found so far from their prompts (no key).
    pub found: u64,
    /// Bytes of the remembered turns' tokens now.
    pub bytes: usize,
    /// The most bytes remembered (`--session-memory-mib`).
    pub max_bytes: usize,
}

impl EngineHandle {
    /// Starts one step loop per backend (one per device group).
    pub fn start(
        backends: Vec<Box<dyn Backend>>,
        tokenizer: Arc<Tokenizer>,
        cfg: SchedulerConfig,
    ) -> Self {
        Self::start_with_events(backends, tokenizer, cfg, None)
    }

    /// Starts one step loop per backend, each handing its prefix-cache changes to `kv_events`.
    pub fn start_with_events(
        backends: Vec<Box<dyn Backend>>,
        tokenizer: Arc<Tokenizer>,
        cfg: SchedulerConfig,
        kv_events: Option<KvEventSink>,
    ) -> Self {
        let queued = Arc::new(AtomicUsize::new(0));
        let sessions = Arc::new(Mutex::new(SessionMemory::with_bytes(
            cfg.max_sessions,
            cfg.session_memory_bytes,
        )));
        let context = backends
            .iter()
            .map(|b| b.config().context)
            .min()
            .unwrap_or(0);
        let groups = backends
            .into_iter()
            .enumerate()
            .map(|(g, backend)| {
                let (tx, rx) = mpsc::unbounded_channel();
                let load = Arc::new(AtomicUsize::new(0));
                let metrics = Arc::new(
                    GroupMetrics::new(g, cfg.batch)
                        .with_draft_positions(cfg.speculation.max_tokens),
                );
                let tok = Arc::clone(&tokenizer);
                let cfg = cfg.clone();
                let shared = group::Shared {
                    queued_total: Arc::clone(&queued),
                    load: Arc::clone(&load),
                    sessions: Arc::clone(&sessions),
                    metrics: Arc::clone(&metrics),
                    kv_events: kv_events.clone(),
                };
                let thread = std::thread::Builder::new()
                    .name(format!("slotlight-group-{g}"))
                    .spawn(move || group::run(g, backend, tok, cfg, rx, shared))
                    .expect("spawn step loop thread");
                GroupHandle {
                    tx,
                    load,
                    metrics,
                    thread: Some(thread),
                }
            })
            .collect();
        Self {
            groups,
            queued,
            max_queue: cfg.max_queue,
            context,
            batch: cfg.batch,
            sessions,
            shutting_down: AtomicBool::new(false),
            kv_events,
        }
    }

    /// The KV-event stream's topic and latest sequence number, when it is on.
    pub fn kv_events_status(&self) -> Option<crate::kv_events::KvEventsStatus> {
        self.kv_events.as_ref().map(KvEventSink::status)
    }

    /// The context length (the smallest over groups).
    pub fn context(&self) -> usize {
        self.context
    }

    /// Number of device groups.
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// Requests waiting for admission.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Each group's counters and gauges, in group order (read them at scrape time).
    pub fn group_metrics(&self) -> Vec<Arc<GroupMetrics>> {
        self.groups.iter().map(|g| Arc::clone(&g.metrics)).collect()
    }

    /// Submits a request of one choice; its events arrive on the returned channel.
    pub fn submit(
        &self,
        mut req: GenerateRequest,
    ) -> Result<mpsc::UnboundedReceiver<Event>, SubmitError> {
        req.n = 1;
        let mut rx = self.submit_choices(req)?;
        rx.pop().ok_or(SubmitError::ShuttingDown)
    }

    /// Submits a request of `req.n` choices; the events of choice `i` arrive on the `i`-th
    /// channel. Each choice takes a place in the queue.
    pub fn submit_choices(
        &self,
        req: GenerateRequest,
    ) -> Result<Vec<mpsc::UnboundedReceiver<Event>>, SubmitError> {
        self.submit_turn(req).map(|s| s.events)
    }

    /// Submits a request of `req.n` choices, as [`EngineHandle::submit_choices`], and says
    /// which turn of which session it is: its key's session, or, for a request without a key
    /// that looks for one (`find_session`), the session whose last turn its prompt extends.
    pub fn submit_turn(&self, mut req: GenerateRequest) -> Result<Submitted, SubmitError> {
        req.n = req.n.max(1);
        let n = req.n;
        if self.shutting_down.load(Ordering::Relaxed) {
            return Err(SubmitError::ShuttingDown);
        }
        if req.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if req.prompt.len() + req.max_tokens > self.context {
            return Err(SubmitError::ContextOverflow {
                prompt: req.prompt.len(),
                max_tokens: req.max_tokens,
                context: self.context,
            });
        }
        // Admission control: reserve a queue place or refuse.
        let reserved = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + n <= self.max_queue).then_some(q + n)
            });
        if reserved.is_err() {
            return Err(SubmitError::QueueFull(self.max_queue));
        }
        let (g, prior, turn) = self.route(&req);
        if let Some(t) = turn.as_ref().filter(|t| t.found) {
            req.session = Some(t.id.clone());
        }
        req.session_branch = turn.as_ref().map_or(0, |t| t.branch);
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::unbounded_channel()).unzip();
        self.groups[g].load.fetch_add(n, Ordering::Relaxed);
        // The request waits in its group from now on, even before the loop takes it.
        self.groups[g].metrics.enter_queue(n);
        if self.groups[g]
            .tx
            .send(Command::Submit(Box::new(req), txs, prior))
            .is_err()
        {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            self.groups[g].load.fetch_sub(n, Ordering::Relaxed);
            for _ in 0..n {
                self.groups[g].metrics.leave_queue();
            }
            return Err(SubmitError::ShuttingDown);
        }
        Ok(Submitted {
            events: rxs,
            session: turn,
        })
    }

    /// Picks the group for a request, and returns what the engine remembers of its session.
    ///
    /// A session stays on the group that holds its last turn's KV, unless that group is full
    /// (as many requests in it as it has slots) while another has room: then the turn goes to
    /// the least loaded group and its resume outcome says `other_group`. A new session, or a
    /// request without one, goes to the least loaded group (the lowest index on a tie).
    /// The request's turn in its session is decided here too (found, for a keyless request
    /// that looks for its session).
    fn route(&self, req: &GenerateRequest) -> (usize, Option<resume::Prior>, Option<SessionTurn>) {
        let load = |g: usize| self.groups[g].load.load(Ordering::Relaxed);
        let least = (0..self.groups.len()).min_by_key(|&g| load(g)).unwrap_or(0);
        let opened =
            self.sessions.lock().ok().and_then(|mut m| {
                m.open_turn(req.session.as_deref(), req.find_session, &req.prompt)
            });
        let Some((turn, prior)) = opened else {
            return (least, None, None);
        };
        let g = match &prior {
            Some(p) if p.group < self.groups.len() => {
                if load(p.group) >= self.batch && load(least) < self.batch {
                    least
                } else {
                    p.group
                }
            }
            _ => least,
        };
        (g, prior, Some(turn))
    }

    /// The engine's memory of sessions.
    pub fn session_stats(&self) -> SessionStats {
        let m = self.sessions.lock();
        SessionStats {
            remembered: m.as_ref().map_or(0, |m| m.len()),
            candidates: m.as_ref().map_or(0, |m| m.candidates()),
            capacity: m.as_ref().map_or(0, |m| m.capacity()),
            dropped: m.as_ref().map_or(0, |m| m.dropped()),
            found: m.as_ref().map_or(0, |m| m.found()),
            bytes: m.as_ref().map_or(0, |m| m.bytes().0),
            max_bytes: m.as_ref().map_or(0, |m| m.bytes().1),
        }
    }

    /// The requests in flight and per-group statistics, as each step loop reports them.
    pub async fn snapshot(&self) -> (Vec<InFlight>, Vec<GroupStats>) {
        let mut all = Vec::new();
        let mut stats = Vec::new();
        for g in &self.groups {
            let (tx, rx) = oneshot::channel();
            if g.tx.send(Command::Snapshot(tx)).is_ok()
                && let Ok((mut v, s)) = rx.await
            {
                all.append(&mut v);
                stats.push(s);
            }
        }
        (all, stats)
    }

    /// Cancels every request in flight (they finish with an error: the engine is shutting
    /// down); used when a drain times out.
    pub fn abort_all(&self) {
        for g in &self.groups {
            let _ = g.tx.send(Command::AbortAll);
        }
    }

    /// Stops accepting requests; the loops finish what they hold, then exit.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    /// Requests currently admitted or queued, over all groups.
    pub fn in_flight(&self) -> usize {
        self.groups
            .iter()
            .map(|g| g.load.load(Ordering::Relaxed))
            .sum()
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        for g in &self.groups {
            let _ = g.tx.send(Command::Shutdown);
        }
        for g in &mut self.groups {
            if let Some(t) = g.thread.take() {
                let _ = t.join();
            }
        }
    }
}
