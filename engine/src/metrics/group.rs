//! One slot group's counters and gauges, owned by its step loop.
//!
//! The step loop is the only writer of everything here except [`GroupMetrics::enter_queue`],
//! which the engine handle calls when it routes a request to the group (the request waits
//! from then on, even before the loop has taken it from its channel). Readers (the `/metrics`
//! handler, the OTLP reader) load the atomics at scrape time. Nothing here is per request: a
//! request's own timing travels with it, never through these.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use slotlight_otel::attr::value;
use slotlight_otel::metric::{buckets, engine};

use super::histogram::{AtomicHistogram, HistogramSnapshot};
use super::instruments::GroupInstruments;
use crate::finish::FinishReason;
use crate::speculation::MAX_DRAFT_TOKENS;

/// How a request left a step loop: `(finish_reason, error_type)`. Every label pair
/// [`GroupMetrics`] can count, so that each is exported from the start.
pub const OUTCOMES: [(&str, Option<&str>); 7] = [
    (value::FINISH_STOP, None),
    (value::FINISH_LENGTH, None),
    (value::FINISH_CANCELLED, Some(value::ERROR_CANCELLED)),
    (value::FINISH_ERROR, Some(value::ERROR_SHUTDOWN)),
    (value::FINISH_ERROR, Some(value::ERROR_INTERNAL)),
    (value::FINISH_ERROR, Some(value::ERROR_KV_CACHE_EXHAUSTED)),
    // No step loop refuses a request any more (stop strings are checked once, by the HTTP
    // layer), but the series stays exported, at zero, so that the wire does not change.
    (value::FINISH_ERROR, Some(value::ERROR_VALIDATION)),
];

fn outcome_index(finish_reason: &str, error_type: Option<&str>) -> usize {
    let key = (finish_reason, error_type);
    // An error label not listed above counts as internal (the list covers every label
    // `EngineError::label` gives today).
    OUTCOMES.iter().position(|o| *o == key).unwrap_or(4)
}

/// The counters and gauges of one slot group.
#[derive(Debug)]
pub struct GroupMetrics {
    group: usize,
    batch_slots: usize,
    /// Positions a draft may have (the per-position series exported).
    draft_positions: usize,
    waiting: AtomicI64,
    running_solo: AtomicU64,
    running_slot: AtomicU64,
    kv_blocks: AtomicU64,
    kv_blocks_used: AtomicU64,
    kv_window_blocks: AtomicU64,
    kv_window_blocks_used: AtomicU64,
    session_kv_window_blocks: AtomicU64,
    kv_bytes: AtomicU64,
    kv_bytes_used: AtomicU64,
    kv_evicted: AtomicU64,
    preemptions: AtomicU64,
    prefix_queried: AtomicU64,
    prefix_hits: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    spec_drafts: AtomicU64,
    spec_draft_tokens: AtomicU64,
    spec_accepted_tokens: AtomicU64,
    /// Draft tokens taken at each position of their draft.
    spec_accepted_per_pos: [AtomicU64; MAX_DRAFT_TOKENS],
    finished: [AtomicU64; OUTCOMES.len()],
    step_duration: AtomicHistogram,
    step_batch: AtomicHistogram,
    /// Live sessions' kept KV ([`SessionKv`]).
    session_kv_blocks: AtomicU64,
    session_kv_expiries: AtomicU64,
    session_kv_evicted_pressure: AtomicU64,
    session_kv_evicted_share: AtomicU64,
    /// The OTLP histograms, once OTLP metrics are on (set once, before serving).
    otel: OnceLock<GroupInstruments>,
}

/// A per-group series read from a snapshot.
pub type GroupValue = fn(&GroupSnapshot) -> u64;

/// The per-group gauges both exporters (`/metrics` and OTLP) publish as they are.
pub const GROUP_GAUGES: [(&str, GroupValue); 10] = [
    (engine::REQUESTS_WAITING, |g| g.waiting),
    (engine::BATCH_SLOTS, |g| g.batch_slots as u64),
    (engine::KV_BLOCKS, |g| g.kv_blocks),
    (engine::KV_BLOCKS_USED, |g| g.kv_blocks_used),
    (engine::KV_WINDOW_BLOCKS, |g| g.kv_window_blocks),
    (engine::KV_WINDOW_BLOCKS_USED, |g| g.kv_window_blocks_used),
    (engine::KV_BYTES, |g| g.kv_bytes),
    (engine::KV_BYTES_USED, |g| g.kv_bytes_used),
    (engine::SESSION_KV_BLOCKS, |g| g.session_kv.blocks as u64),
    (engine::SESSION_KV_WINDOW_BLOCKS, |g| {
        g.session_kv_window_blocks
    }),
];

/// What a group's KV pools hold, as the step loop publishes it.
#[derive(Debug, Clone, Copy, Default)]
pub struct KvUsage {
    /// Blocks of the full pool (every layer's KV, or the global layers' with a window pool).
    pub blocks: usize,
    /// Of those, held by running requests (neither free nor evictable).
    pub blocks_used: usize,
    /// Blocks of the window pool, the local layers' (0 without one).
    pub window_blocks: usize,
    /// Of those, held by running requests.
    pub window_blocks_used: usize,
    /// Of those, kept for live sessions (their windows and checkpoints; evictable, last).
    pub window_blocks_kept: usize,
    /// Bytes of both pools.
    pub total_bytes: usize,
    /// Bytes of the blocks held by running requests.
    pub used_bytes: usize,
}

/// What a group keeps for live sessions ([`crate::scheduler::keep`]), as its step loop
/// publishes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionKv {
    /// Blocks kept now.
    pub blocks: usize,
    /// Keepings that ended at their TTL.
    pub expiries: u64,
    /// Kept blocks reclaimed because nothing else was evictable (`reason="pressure"`).
    pub evicted_pressure: u64,
    /// Kept blocks let go before their TTL to stay within the share (`reason="share"`).
    pub evicted_share: u64,
}

impl SessionKv {
    /// The kept blocks lost before their TTL, by `reason` label value.
    pub fn by_reason(&self) -> [(&'static str, u64); 2] {
        use slotlight_otel::metric::reason;
        [
            (reason::PRESSURE, self.evicted_pressure),
            (reason::SHARE, self.evicted_share),
        ]
    }
}

/// The per-group counters both exporters publish.
pub const GROUP_COUNTERS: [(&str, GroupValue); 11] = [
    (engine::KV_EVICTED_BLOCKS, |g| g.kv_evicted),
    (engine::PREEMPTIONS, |g| g.preemptions),
    (engine::PREFIX_CACHE_QUERIED_TOKENS, |g| g.prefix_queried),
    (engine::PREFIX_CACHE_HIT_TOKENS, |g| g.prefix_hits),
    (engine::PROMPT_TOKENS, |g| g.prompt_tokens),
    (engine::CACHED_TOKENS, |g| g.cached_tokens),
    (engine::GENERATION_TOKENS, |g| g.generation_tokens),
    (engine::SPEC_DECODE_DRAFTS, |g| g.spec_drafts),
    (engine::SPEC_DECODE_DRAFT_TOKENS, |g| g.spec_draft_tokens),
    (engine::SPEC_DECODE_ACCEPTED_TOKENS, |g| {
        g.spec_accepted_tokens
    }),
    (engine::SESSION_KV_EXPIRIES, |g| g.session_kv.expiries),
];

/// What a group's metrics held when they were read.
#[derive(Debug, Clone)]
pub struct GroupSnapshot {
    /// The group's index (`slot_group`).
    pub group: usize,
    /// Batch slots (`--batch`).
    pub batch_slots: usize,
    /// Requests waiting for admission (new and preempted).
    pub waiting: u64,
    /// Requests running on the solo path.
    pub running_solo: u64,
    /// Requests running in batch slots.
    pub running_slot: u64,
    /// KV blocks in all.
    pub kv_blocks: u64,
    /// KV blocks held by running requests.
    pub kv_blocks_used: u64,
    /// Window-pool blocks (the local layers' KV; 0 without a window pool).
    pub kv_window_blocks: u64,
    /// Window-pool blocks held by running requests.
    pub kv_window_blocks_used: u64,
    /// Window-pool blocks kept for live sessions.
    pub session_kv_window_blocks: u64,
    /// Bytes of KV storage, both pools.
    pub kv_bytes: u64,
    /// Bytes of the KV blocks held by running requests, both pools.
    pub kv_bytes_used: u64,
    /// Cached prefix blocks evicted.
    pub kv_evicted: u64,
    /// Requests preempted (sent back to the queue to free KV blocks) so far.
    pub preemptions: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queried: u64,
    /// Of those, found.
    pub prefix_hits: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Prompt tokens served from the cache at first admission.
    pub cached_tokens: u64,
    /// Tokens generated by the group's step loop so far.
    pub generation_tokens: u64,
    /// Verification steps with a draft (speculative decoding).
    pub spec_drafts: u64,
    /// Draft tokens verified.
    pub spec_draft_tokens: u64,
    /// Of those, the ones taken.
    pub spec_accepted_tokens: u64,
    /// Draft tokens taken at each position of their draft (index 0: a draft's first token).
    pub spec_accepted_per_pos: [u64; MAX_DRAFT_TOKENS],
    /// Positions a draft may have: the first this many of `spec_accepted_per_pos` are
    /// exported.
    pub draft_positions: usize,
    /// Requests finished, one count per entry of [`OUTCOMES`].
    pub finished: [u64; OUTCOMES.len()],
    /// Forward step durations, seconds.
    pub step_duration: HistogramSnapshot,
    /// Requests per forward step.
    pub step_batch: HistogramSnapshot,
    /// What the group keeps for live sessions.
    pub session_kv: SessionKv,
}

impl GroupSnapshot {
    /// KV usage: bytes held over bytes in all, both pools (with one pool, blocks used over
    /// blocks in all); 0 without KV storage.
    #[allow(clippy::cast_precision_loss)] // byte counts are far below 2^53
    pub fn kv_usage(&self) -> f64 {
        if self.kv_bytes == 0 {
            0.0
        } else {
            self.kv_bytes_used as f64 / self.kv_bytes as f64
        }
    }
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn add(a: &AtomicU64, n: usize) {
    a.fetch_add(n as u64, Ordering::Relaxed);
}

impl GroupMetrics {
    /// Empty metrics of group `group`, which has `batch_slots` slots.
    pub fn new(group: usize, batch_slots: usize) -> Self {
        Self {
            group,
            batch_slots,
            draft_positions: 0,
            waiting: AtomicI64::new(0),
            running_solo: AtomicU64::new(0),
            running_slot: AtomicU64::new(0),
            kv_blocks: AtomicU64::new(0),
            kv_blocks_used: AtomicU64::new(0),
            kv_window_blocks: AtomicU64::new(0),
            kv_window_blocks_used: AtomicU64::new(0),
            session_kv_window_blocks: AtomicU64::new(0),
            kv_bytes: AtomicU64::new(0),
            kv_bytes_used: AtomicU64::new(0),
            kv_evicted: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            prefix_queried: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            spec_drafts: AtomicU64::new(0),
            spec_draft_tokens: AtomicU64::new(0),
            spec_accepted_tokens: AtomicU64::new(0),
            spec_accepted_per_pos: Default::default(),
            finished: Default::default(),
            step_duration: AtomicHistogram::new(buckets::STEP_DURATION),
            step_batch: AtomicHistogram::new(buckets::STEP_BATCH_SIZE),
            session_kv_blocks: AtomicU64::new(0),
            session_kv_expiries: AtomicU64::new(0),
            session_kv_evicted_pressure: AtomicU64::new(0),
            session_kv_evicted_share: AtomicU64::new(0),
            otel: OnceLock::new(),
        }
    }

    /// The same metrics, exporting the taken draft tokens of `n` positions (the longest draft,
    /// at most [`MAX_DRAFT_TOKENS`]).
    pub fn with_draft_positions(mut self, n: usize) -> Self {
        self.draft_positions = n.min(MAX_DRAFT_TOKENS);
        self
    }

    /// Records each step into OTLP histograms too, from now on (the first call wins).
    pub fn export_to(&self, instruments: GroupInstruments) {
        let _ = self.otel.set(instruments);
    }

    /// The group's index.
    pub fn group(&self) -> usize {
        self.group
    }

    /// `n` requests join the group's queue (routed to it, or preempted back into it).
    pub fn enter_queue(&self, n: usize) {
        self.waiting
            .fetch_add(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    /// One request leaves the group's queue (admitted, cancelled, refused or aborted).
    pub fn leave_queue(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// Publishes what runs now and the KV cache's state (the step loop, once per iteration).
    pub fn publish(&self, solo: usize, slot: usize, kv: &KvUsage, evicted: u64) {
        let set = |a: &AtomicU64, v: usize| a.store(v as u64, Ordering::Relaxed);
        set(&self.running_solo, solo);
        set(&self.running_slot, slot);
        set(&self.kv_blocks, kv.blocks);
        set(&self.kv_blocks_used, kv.blocks_used);
        set(&self.kv_window_blocks, kv.window_blocks);
        set(&self.kv_window_blocks_used, kv.window_blocks_used);
        set(&self.session_kv_window_blocks, kv.window_blocks_kept);
        set(&self.kv_bytes, kv.total_bytes);
        set(&self.kv_bytes_used, kv.used_bytes);
        self.kv_evicted.store(evicted, Ordering::Relaxed);
    }

    /// Publishes what the group keeps for live sessions (the step loop, once per iteration).
    pub fn publish_session_kv(&self, kv: &SessionKv) {
        self.session_kv_blocks
            .store(kv.blocks as u64, Ordering::Relaxed);
        for (a, v) in [
            (&self.session_kv_expiries, kv.expiries),
            (&self.session_kv_evicted_pressure, kv.evicted_pressure),
            (&self.session_kv_evicted_share, kv.evicted_share),
        ] {
            a.store(v, Ordering::Relaxed);
        }
    }

    /// A request is preempted.
    pub fn count_preemption(&self) {
        add(&self.preemptions, 1);
    }

    /// An admission looked up `queried` prompt tokens in the prefix cache and found `hits`.
    pub fn count_prefix_lookup(&self, queried: usize, hits: usize) {
        add(&self.prefix_queried, queried);
        add(&self.prefix_hits, hits);
    }

    /// A request's first admission: its prompt, and what of it the cache held.
    pub fn count_prompt(&self, prompt: usize, cached: usize) {
        add(&self.prompt_tokens, prompt);
        add(&self.cached_tokens, cached);
    }

    /// One token sampled.
    pub fn count_token(&self) {
        add(&self.generation_tokens, 1);
    }

    /// A verification step checked a draft of `drafted` tokens and took the first `accepted`.
    pub fn count_draft(&self, drafted: usize, accepted: usize) {
        add(&self.spec_drafts, 1);
        add(&self.spec_draft_tokens, drafted);
        add(&self.spec_accepted_tokens, accepted);
        for pos in &self.spec_accepted_per_pos[..accepted.min(MAX_DRAFT_TOKENS)] {
            add(pos, 1);
        }
    }

    /// A request (one choice) finished with `reason`, counted under its labels in
    /// [`OUTCOMES`] (its `finish_reason` and, when it did not run to its end, `error_type`).
    pub fn count_finished(&self, reason: &FinishReason) {
        add(
            &self.finished[outcome_index(reason.as_str(), reason.error_type())],
            1,
        );
    }

    /// One forward step of `batch` requests took `duration`.
    #[allow(clippy::cast_precision_loss)] // batch sizes are far below 2^53
    pub fn observe_step(&self, duration: Duration, batch: usize) {
        let (secs, batch) = (duration.as_secs_f64(), batch as f64);
        self.step_duration.observe(secs);
        self.step_batch.observe(batch);
        if let Some(o) = self.otel.get() {
            o.step_duration.record(secs, &o.attrs);
            o.step_batch.record(batch, &o.attrs);
        }
    }

    /// A copy of every gauge and counter of the group as it stands now.
    pub fn snapshot(&self) -> GroupSnapshot {
        GroupSnapshot {
            group: self.group,
            batch_slots: self.batch_slots,
            // Unsigned for readers: a read between a request's admission and the matching
            // routing increment on another thread could see one less than zero.
            waiting: u64::try_from(self.waiting.load(Ordering::Relaxed)).unwrap_or(0),
            running_solo: load(&self.running_solo),
            running_slot: load(&self.running_slot),
            kv_blocks: load(&self.kv_blocks),
            kv_blocks_used: load(&self.kv_blocks_used),
            kv_window_blocks: load(&self.kv_window_blocks),
            kv_window_blocks_used: load(&self.kv_window_blocks_used),
            session_kv_window_blocks: load(&self.session_kv_window_blocks),
            kv_bytes: load(&self.kv_bytes),
            kv_bytes_used: load(&self.kv_bytes_used),
            kv_evicted: load(&self.kv_evicted),
            preemptions: load(&self.preemptions),
            prefix_queried: load(&self.prefix_queried),
            prefix_hits: load(&self.prefix_hits),
            prompt_tokens: load(&self.prompt_tokens),
            cached_tokens: load(&self.cached_tokens),
            generation_tokens: load(&self.generation_tokens),
            spec_drafts: load(&self.spec_drafts),
            spec_draft_tokens: load(&self.spec_draft_tokens),
            spec_accepted_tokens: load(&self.spec_accepted_tokens),
            spec_accepted_per_pos: std::array::from_fn(|i| load(&self.spec_accepted_per_pos[i])),
            draft_positions: self.draft_positions,
            finished: std::array::from_fn(|i| load(&self.finished[i])),
            step_duration: self.step_duration.snapshot(),
            step_batch: self.step_batch.snapshot(),
            session_kv: SessionKv {
                blocks: usize::try_from(load(&self.session_kv_blocks)).unwrap_or(usize::MAX),
                expiries: load(&self.session_kv_expiries),
                evicted_pressure: load(&self.session_kv_evicted_pressure),
                evicted_share: load(&self.session_kv_evicted_share),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finish::EngineError;

    fn count(m: &GroupMetrics, r: &FinishReason) {
        m.count_finished(r);
    }

    #[test]
    fn every_finish_reason_has_its_own_outcome() {
        let m = GroupMetrics::new(0, 4);
        count(&m, &FinishReason::Stop);
        count(&m, &FinishReason::Cancelled);
        count(&m, &FinishReason::Error(EngineError::ShuttingDown));
        count(&m, &FinishReason::Error(EngineError::Lost));
        let f = m.snapshot().finished;
        assert_eq!(f, [1, 0, 1, 1, 1, 0, 0]);
    }

    /// Each draft counts once, its tokens and the ones taken, and each taken token at its
    /// position (a draft's tokens are taken from its first on).
    #[test]
    fn drafts_count_their_tokens_and_each_position_taken() {
        let m = GroupMetrics::new(0, 4).with_draft_positions(99);
        m.count_draft(4, 2);
        m.count_draft(3, 0);
        m.count_draft(2, 2);
        let g = m.snapshot();
        assert_eq!(
            (g.spec_drafts, g.spec_draft_tokens, g.spec_accepted_tokens),
            (3, 9, 4)
        );
        assert_eq!(g.spec_accepted_per_pos[..3], [2, 2, 0]);
        assert_eq!(g.draft_positions, MAX_DRAFT_TOKENS);
    }

    #[test]
    fn the_queue_gauge_follows_entries_and_exits() {
        let m = GroupMetrics::new(0, 4);
        m.enter_queue(3);
        m.leave_queue();
        assert_eq!(m.snapshot().waiting, 2);
        m.leave_queue();
        m.leave_queue();
        assert_eq!(m.snapshot().waiting, 0);
    }
}
