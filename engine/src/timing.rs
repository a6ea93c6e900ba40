//! Per-request clocks.
//!
//! A request's [`RequestTimings`] lives in its sequence, wherever the sequence runs (solo path
//! or a batch slot), survives every move between them, and travels back with the result on
//! the request's own channel. Nothing here is shared between requests: there is no "last
//! timing" anywhere in the engine.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use slotlight_otel::attr::value;

/// What became of a request's chance to reuse KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeOutcome {
    /// The session's first turn (or one the engine no longer remembers).
    First,
    /// Everything that could be reused was, to block granularity.
    Full,
    /// The history changed: the prompt departs from the last turn at `diverged_at`.
    Diverged,
    /// Blocks of the reusable prefix had been reclaimed by other traffic (`evicted_tokens`).
    /// With sliding-window layers kept windowed, these include the window-pool blocks a
    /// resume needs (the window before the reuse point), given back as the window passed them
    /// and reclaimed since: the prefix cache then reuses a shorter prefix, or none.
    Evicted,
    /// Blocks of the reusable prefix had been reclaimed after the session's KV stopped being
    /// kept: the turn came after the session's TTL (`--session-kv-ttl`) had passed.
    Expired,
    /// The sliding-window layers' blocks a resume needs had been recycled while the
    /// full-attention layers' KV of the whole reusable prefix was still there
    /// (`evicted_tokens`: the reusable tokens that could not be resumed): the window pool's
    /// churn, not the cache's, cost the turn.
    Window,
    /// The session's KV lives in another slot group than the one serving this turn.
    OtherGroup,
    /// No session, and nothing reused.
    None,
    /// No session; a prefix shared with some earlier request was reused.
    Prefix,
}

impl ResumeOutcome {
    /// The contract's value.
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeOutcome::First => value::RESUME_FIRST,
            ResumeOutcome::Full => value::RESUME_FULL,
            ResumeOutcome::Diverged => value::RESUME_DIVERGED,
            ResumeOutcome::Evicted => value::RESUME_EVICTED,
            ResumeOutcome::Expired => value::RESUME_EXPIRED,
            ResumeOutcome::Window => value::RESUME_WINDOW,
            ResumeOutcome::OtherGroup => value::RESUME_OTHER_GROUP,
            ResumeOutcome::None => value::RESUME_NONE,
            ResumeOutcome::Prefix => value::RESUME_PREFIX,
        }
    }
}

/// A request's resume facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Resume {
    /// What became of the request's chance to reuse its session's KV.
    pub outcome: ResumeOutcome,
    /// Tokens the request had in common with its session's last turn (absent without a
    /// remembered turn).
    pub reusable_tokens: Option<usize>,
    /// Tokens found in the prefix cache.
    pub cached_tokens: usize,
    /// Where the prompt departs from the last turn (`diverged`, and `evicted` when the
    /// history changed too).
    pub diverged_at: Option<usize>,
    /// Reusable tokens whose blocks had been reclaimed (`evicted`, `expired`), or could not be
    /// resumed for want of the window layers' blocks (`window`).
    pub evicted_tokens: Option<usize>,
}

/// Converts monotonic instants to wall-clock time, anchored once per process.
#[derive(Debug, Clone, Copy)]
pub struct TimeAnchor {
    mono: Instant,
    wall: SystemTime,
}

impl TimeAnchor {
    /// An anchor taken now: every later conversion is relative to this pair of clocks.
    pub fn now() -> Self {
        Self {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// The wall-clock time of `t`.
    pub fn system_time(&self, t: Instant) -> SystemTime {
        if t >= self.mono {
            self.wall + (t - self.mono)
        } else {
            self.wall - (self.mono - t)
        }
    }

    /// Nanoseconds since the Unix epoch at `t`.
    pub fn unix_nanos(&self, t: Instant) -> u64 {
        let d = self
            .system_time(t)
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The path a leg runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PathKind {
    /// The batch-1 solo path.
    Solo,
    /// A batch slot.
    Slot,
}

impl PathKind {
    /// The contract's value (`solo` or `slot`).
    pub fn as_str(self) -> &'static str {
        match self {
            PathKind::Solo => slotlight_otel::attr::value::PATH_SOLO,
            PathKind::Slot => slotlight_otel::attr::value::PATH_SLOT,
        }
    }
}

/// Why a leg ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LegEnd {
    /// The request moved to another path.
    Moved,
    /// The request finished.
    Finished,
    /// The request was preempted (its KV blocks were needed) and went back to the queue.
    Preempted,
    /// The request was cancelled or failed.
    Cancelled,
}

impl LegEnd {
    /// The contract's value of `slotlight.leg.end_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            LegEnd::Moved => value::LEG_END_MOVED,
            LegEnd::Finished => value::LEG_END_FINISHED,
            LegEnd::Preempted => value::LEG_END_PREEMPTED,
            LegEnd::Cancelled => value::LEG_END_CANCELLED,
        }
    }
}

/// One leg: a stretch on one path.
#[derive(Debug, Clone, PartialEq)]
pub struct LegRecord {
    /// Index within the request, from 0.
    pub index: usize,
    /// Solo path or batch slot: where the leg ran.
    pub path: PathKind,
    /// The device group whose step loop ran the leg (0 on one device).
    pub group: usize,
    /// Slot index (slot path only).
    pub slot: Option<usize>,
    /// When the leg started.
    pub start: Instant,
    /// When it ended.
    pub end: Option<Instant>,
    /// Reply tokens carried in.
    pub tokens_carried: usize,
    /// Tokens generated during the leg.
    pub tokens_generated: usize,
    /// Time in the forward steps of this leg.
    pub device: Duration,
    /// Forward steps of this leg.
    pub steps: u64,
    /// Largest batch among them.
    pub batch_max: usize,
    /// Draft tokens verified during the leg (speculative decoding).
    pub drafted_tokens: usize,
    /// Of those, the ones taken.
    pub accepted_tokens: usize,
    /// Sum of their batch sizes (for the mean).
    pub batch_sum: u64,
    /// Why it ended.
    pub end_reason: Option<LegEnd>,
}

impl LegRecord {
    /// Mean batch size over the leg's steps.
    #[allow(clippy::cast_precision_loss)]
    pub fn batch_mean(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.batch_sum as f64 / self.steps as f64
        }
    }
}

/// Why a prefill ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefillReason {
    /// The request's prompt.
    Initial,
    /// Recomputing prompt and reply after a preemption.
    Preempted,
}

impl PrefillReason {
    /// The contract's value of `slotlight.prefill.reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            PrefillReason::Initial => value::PREFILL_INITIAL,
            PrefillReason::Preempted => value::PREFILL_PREEMPTED,
        }
    }
}

/// How a prefill ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefillEnd {
    /// Its last chunk ran and produced a token.
    Finished,
    /// A preemption cut it short; the request prefills again when it is admitted again.
    Preempted,
    /// The request was cancelled or failed before the prefill's last chunk.
    Cancelled,
}

impl PrefillEnd {
    /// The contract's value of `slotlight.prefill.end_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            PrefillEnd::Finished => value::PREFILL_END_FINISHED,
            PrefillEnd::Preempted => value::PREFILL_END_PREEMPTED,
            PrefillEnd::Cancelled => value::PREFILL_END_CANCELLED,
        }
    }
}

/// One prefill, finished or cut short. The device time of every prefill step a request takes
/// part in lands in exactly one record, so the records' `device` add up to
/// [`RequestTimings::prefill_device`].
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillRecord {
    /// Start of its first chunk's step.
    pub start: Instant,
    /// End of its last chunk's step (when its token was produced, for a finished prefill).
    pub end: Instant,
    /// Tokens it had to have in the KV cache (prompt, plus reply after a preemption).
    pub prompt_tokens: usize,
    /// Of those, found in the prefix cache.
    pub cached_tokens: usize,
    /// Of those, computed.
    pub computed_tokens: usize,
    /// Forward steps the prefill was split into (one chunk per step).
    pub chunks: usize,
    /// Time in the forward steps of its chunks.
    pub device: Duration,
    /// Why it ran.
    pub reason: PrefillReason,
    /// How it ended.
    pub end_reason: PrefillEnd,
}

/// One prefill chunk done: where the prefill stands after it. Sent on the request's own
/// channel once per chunk (the `prompt_progress` of a stream, the prefill's progress windows,
/// and `/v1/requests` all read these counts).
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillChunkRecord {
    /// Start of the prefill's first chunk's step (the prefill's own clock starts here).
    pub prefill_start: Instant,
    /// Start of this chunk's step.
    pub start: Instant,
    /// End of this chunk's forward pass.
    pub end: Instant,
    /// Positions the prefill must have in the KV cache when done (prompt, plus the reply so far
    /// after a preemption): llama.cpp's `total`.
    pub total: usize,
    /// Of those, found in the prefix cache at admission: llama.cpp's `cache`.
    pub cached: usize,
    /// Positions in the KV cache after this chunk, the cached ones included: llama.cpp's
    /// `processed`. It grows by the chunk's tokens and reaches `total` with the last chunk.
    pub processed: usize,
    /// Positions this chunk computed.
    pub chunk_tokens: usize,
    /// Chunks run so far, this one included (from 1).
    pub chunk: usize,
    /// Time of this chunk's forward step.
    pub device: Duration,
}

impl PrefillChunkRecord {
    /// Tokens this prefill has computed so far (the cached ones are not computed).
    pub fn computed(&self) -> usize {
        self.processed.saturating_sub(self.cached)
    }

    /// Time since the prefill's first chunk started, to this chunk's end.
    pub fn elapsed(&self) -> Duration {
        self.end.saturating_duration_since(self.prefill_start)
    }

    /// The prefill's own rate so far: tokens computed per second since its first chunk
    /// started (`None` before any time has passed).
    pub fn tok_s(&self) -> Option<f64> {
        let t = self.elapsed().as_secs_f64();
        #[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
        (t > 0.0).then(|| self.computed() as f64 / t)
    }
}

/// What one verification step did with its draft (speculative decoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DraftCheck {
    /// Draft tokens verified.
    pub drafted: usize,
    /// Of those, the ones taken: the leading tokens that were the model's own choice.
    pub accepted: usize,
}

/// A request's drafts (speculative decoding), over its decode steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DraftCounts {
    /// Verification steps with a draft (each also one of [`RequestTimings::decode_steps`]).
    pub drafts: u64,
    /// Draft tokens verified.
    pub drafted_tokens: usize,
    /// Of those, the ones taken (each also one of [`RequestTimings::generated_tokens`]).
    pub accepted_tokens: usize,
}

impl DraftCounts {
    /// Draft tokens verified and not taken (OpenAI's `rejected_prediction_tokens`).
    pub fn rejected_tokens(&self) -> usize {
        self.drafted_tokens.saturating_sub(self.accepted_tokens)
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &DraftCounts) {
        self.drafts += other.drafts;
        self.drafted_tokens += other.drafted_tokens;
        self.accepted_tokens += other.accepted_tokens;
    }
}

/// A request's own clocks and counts.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestTimings {
    /// Arrival at the HTTP layer.
    pub received: Instant,
    /// Admission to a path (the end of queueing; the first admission if preempted later).
    pub admitted: Option<Instant>,
    /// The first token produced (by the last chunk of the first prefill).
    pub first_token: Option<Instant>,
    /// The last token produced.
    pub last_token: Option<Instant>,
    /// When the step loop finished the request (any reason); the end of `e2e_ms`.
    pub finished: Option<Instant>,
    /// Time in prefill forward steps (all prefills).
    pub prefill_device: Duration,
    /// Prefill forward steps taken (all prefills, all chunks).
    pub prefill_steps: u64,
    /// Time in decode forward steps.
    pub decode_device: Duration,
    /// Tokens of the prompt as submitted (`usage.prompt_tokens`).
    pub prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache by the first prefill.
    pub cached_tokens: usize,
    /// Tokens computed by all prefills.
    pub prefilled_tokens: usize,
    /// Tokens generated, from prefills and decode steps alike (`usage.completion_tokens`).
    pub generated_tokens: usize,
    /// Decode steps taken (a verification step of a draft is one). Each yields at least one
    /// token of this request; the other tokens (the first, and one per re-prefill after a
    /// preemption) come from prefill steps.
    pub decode_steps: u64,
    /// Tokens those decode steps yielded: one per plain step, the draft tokens taken and one
    /// more per verification step.
    pub decode_tokens: u64,
    /// The request's drafts (speculative decoding).
    pub drafts: DraftCounts,
    /// Legs, in order.
    pub legs: Vec<LegRecord>,
    /// Prefills, in order.
    pub prefills: Vec<PrefillRecord>,
    /// Whether the request reused its conversation's KV and, if not, why (decided at its
    /// first admission; `None` before).
    pub resume: Option<Resume>,
    /// How long after its finish the engine keeps the session's KV ahead of other cached
    /// prefixes (`Some(0)`: not kept); `None` for a request without a session.
    pub session_kv_ttl: Option<Duration>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The timing part of a response's `usage`, derived from one request's own clocks.
///
/// A value the request never had is `None` (JSON `null`), never zero: `queue_ms` without an
/// admission, `ttft_ms` and `generation_ms` without a token, `prefill_ms` without a prefill
/// step, `decode_ms` and `decode_tps` without a decode step, `e2e_ms` without a finish.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct UsageTimings {
    /// Arrival to admission (the first one), wall clock.
    pub queue_ms: Option<f64>,
    /// Device time: the sum of the prefill forward steps the request took part in (every
    /// prefill, cut ones included).
    pub prefill_ms: Option<f64>,
    /// Arrival to first token, wall clock.
    pub ttft_ms: Option<f64>,
    /// Device time: the sum of the decode forward steps the request took part in.
    pub decode_ms: Option<f64>,
    /// First to last token, wall clock.
    pub generation_ms: Option<f64>,
    /// Tokens produced by decode steps per second of `decode_ms`: `decode_tokens /
    /// (decode_ms / 1000)`. Numerator and denominator cover the same steps (a plain step yields
    /// one token of the request, a verification step the draft tokens taken and one more); the
    /// tokens prefills produce (the first, and one per re-prefill after a preemption) are in
    /// neither.
    pub decode_tps: Option<f64>,
    /// Arrival to finish, wall clock.
    pub e2e_ms: Option<f64>,
}

/// vLLM's request latencies (`gen_ai.latency.*`), with vLLM's meanings: wall-clock intervals
/// between the request's own instants, in seconds. `scheduled` is the first admission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VllmLatencies {
    /// Arrival to first token.
    pub time_to_first_token: Option<f64>,
    /// Arrival to finish.
    pub e2e: Option<f64>,
    /// Arrival to first scheduled.
    pub time_in_queue: Option<f64>,
    /// First scheduled to first token.
    pub time_in_model_prefill: Option<f64>,
    /// First token to last token.
    pub time_in_model_decode: Option<f64>,
    /// First scheduled to finish.
    pub time_in_model_inference: Option<f64>,
}

impl RequestTimings {
    /// A request that arrived at `received` with `prompt_tokens` prompt tokens.
    pub fn new(received: Instant, prompt_tokens: usize) -> Self {
        Self {
            received,
            admitted: None,
            first_token: None,
            last_token: None,
            finished: None,
            prefill_device: Duration::ZERO,
            prefill_steps: 0,
            decode_device: Duration::ZERO,
            prompt_tokens,
            cached_tokens: 0,
            prefilled_tokens: 0,
            generated_tokens: 0,
            decode_steps: 0,
            decode_tokens: 0,
            drafts: DraftCounts::default(),
            legs: Vec::new(),
            prefills: Vec::new(),
            resume: None,
            session_kv_ttl: None,
        }
    }

    /// Marks admission (only the first one counts as the end of queueing).
    pub fn mark_admitted(&mut self, at: Instant) {
        debug_assert!(at >= self.received);
        if self.admitted.is_none() {
            self.admitted = Some(at);
        }
    }

    /// Records a produced token at `at`, from a decode step (`from_decode`) or a prefill's last
    /// chunk.
    pub fn mark_token(&mut self, at: Instant, from_decode: bool) {
        debug_assert!(self.admitted.is_some(), "token before admission");
        if from_decode {
            self.decode_tokens += 1;
        }
        if self.first_token.is_none() {
            self.first_token = Some(at);
        }
        debug_assert!(self.last_token.is_none_or(|l| at >= l));
        self.last_token = Some(at);
        self.generated_tokens += 1;
        if let Some(leg) = self.legs.last_mut() {
            leg.tokens_generated += 1;
        }
    }

    /// Opens a leg at `at`.
    pub fn start_leg(
        &mut self,
        path: PathKind,
        group: usize,
        slot: Option<usize>,
        at: Instant,
    ) -> &LegRecord {
        debug_assert!(
            self.legs.last().is_none_or(|l| l.end.is_some()),
            "leg already open"
        );
        let index = self.legs.len();
        self.legs.push(LegRecord {
            index,
            path,
            group,
            slot,
            start: at,
            end: None,
            tokens_carried: self.generated_tokens,
            tokens_generated: 0,
            device: Duration::ZERO,
            steps: 0,
            batch_max: 0,
            batch_sum: 0,
            drafted_tokens: 0,
            accepted_tokens: 0,
            end_reason: None,
        });
        &self.legs[index]
    }

    /// Closes the open leg, if any, returning it.
    pub fn end_leg(&mut self, at: Instant, reason: LegEnd) -> Option<&LegRecord> {
        let leg = self.legs.last_mut().filter(|l| l.end.is_none())?;
        leg.end = Some(at.max(leg.start));
        leg.end_reason = Some(reason);
        Some(leg)
    }

    /// The open leg.
    pub fn current_leg(&self) -> Option<&LegRecord> {
        self.legs.last().filter(|l| l.end.is_none())
    }

    /// Accounts one forward step this request took part in.
    pub fn add_step(&mut self, device: Duration, batch: usize, prefill: bool) {
        if prefill {
            self.prefill_device += device;
            self.prefill_steps += 1;
        } else {
            self.decode_device += device;
            self.decode_steps += 1;
        }
        if let Some(leg) = self.legs.last_mut().filter(|l| l.end.is_none()) {
            leg.device += device;
            leg.steps += 1;
            leg.batch_max = leg.batch_max.max(batch);
            leg.batch_sum += batch as u64;
        }
    }

    /// Accounts a verification step's draft (the step itself is accounted by
    /// [`RequestTimings::add_step`]).
    pub fn add_draft(&mut self, check: DraftCheck) {
        self.drafts.drafts += 1;
        self.drafts.drafted_tokens += check.drafted;
        self.drafts.accepted_tokens += check.accepted;
        if let Some(leg) = self.legs.last_mut().filter(|l| l.end.is_none()) {
            leg.drafted_tokens += check.drafted;
            leg.accepted_tokens += check.accepted;
        }
    }

    /// Marks the finish at `at`: the end of the request's `e2e_ms`.
    pub fn mark_finished(&mut self, at: Instant) {
        self.finished = Some(at);
    }

    /// The request's rate since its first token, over all its legs, at `now`:
    /// `(generated - 1) / (last_token - first_token)`.
    #[allow(clippy::cast_precision_loss)]
    pub fn tok_s(&self) -> Option<f64> {
        let (first, last) = (self.first_token?, self.last_token?);
        let secs = (last - first).as_secs_f64();
        (self.generated_tokens > 1 && secs > 0.0).then(|| (self.generated_tokens - 1) as f64 / secs)
    }

    /// The usage timings; see [`UsageTimings`] for what is unknown when.
    #[allow(clippy::cast_precision_loss)] // step counts are far below 2^53
    pub fn usage(&self) -> UsageTimings {
        let at = |t: Option<Instant>| t.map(|t| ms(t.saturating_duration_since(self.received)));
        let decode_ms = (self.decode_steps > 0).then(|| ms(self.decode_device));
        UsageTimings {
            queue_ms: at(self.admitted),
            prefill_ms: (self.prefill_steps > 0).then(|| ms(self.prefill_device)),
            ttft_ms: at(self.first_token),
            decode_ms,
            generation_ms: self.first_to_last().map(ms),
            decode_tps: decode_ms
                .filter(|d| *d > 0.0)
                .map(|d| self.decode_tokens as f64 / (d / 1000.0)),
            e2e_ms: at(self.finished),
        }
    }

    /// First token to last token.
    fn first_to_last(&self) -> Option<Duration> {
        Some(
            self.last_token?
                .saturating_duration_since(self.first_token?),
        )
    }

    /// vLLM's latencies; see [`VllmLatencies`].
    pub fn vllm_latencies(&self) -> VllmLatencies {
        let secs = |from: Option<Instant>, to: Option<Instant>| {
            Some(to?.saturating_duration_since(from?).as_secs_f64())
        };
        let arrival = Some(self.received);
        VllmLatencies {
            time_to_first_token: secs(arrival, self.first_token),
            e2e: secs(arrival, self.finished),
            time_in_queue: secs(arrival, self.admitted),
            time_in_model_prefill: secs(self.admitted, self.first_token),
            time_in_model_decode: secs(self.first_token, self.last_token),
            time_in_model_inference: secs(self.admitted, self.finished),
        }
    }

    /// Wall-clock time of the prefills: the sum, over every prefill record, of its first
    /// chunk's start to its end. `None` without a prefill record.
    pub fn prefill_wall(&self) -> Option<Duration> {
        (!self.prefills.is_empty()).then(|| {
            self.prefills
                .iter()
                .map(|p| p.end.saturating_duration_since(p.start))
                .sum()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_keeps_the_request_clocks() {
        let t0 = Instant::now();
        let mut t = RequestTimings::new(t0, 10);
        t.mark_admitted(t0 + Duration::from_millis(5));
        t.start_leg(PathKind::Solo, 0, None, t0 + Duration::from_millis(5));
        t.add_step(Duration::from_millis(20), 1, true);
        for i in 0..50 {
            t.mark_token(t0 + Duration::from_millis(30 + 20 * i), i > 0);
            if i > 0 {
                t.add_step(Duration::from_millis(20), 1, false);
            }
        }
        let before = (t.received, t.first_token, t.tok_s());
        let moved_at = t0 + Duration::from_millis(1010);
        t.end_leg(moved_at, LegEnd::Moved);
        t.start_leg(PathKind::Slot, 0, Some(0), moved_at);
        t.mark_token(t0 + Duration::from_millis(1030), true);
        t.add_step(Duration::from_millis(20), 2, false);
        assert_eq!((t.received, t.first_token), (before.0, before.1));
        let rate = t.tok_s().expect("rate");
        assert!(
            (rate - 50.0).abs() < 1.0,
            "rate after the move is the request's own: {rate}"
        );
        let leg = t.current_leg().expect("leg");
        assert_eq!((leg.tokens_carried, leg.tokens_generated), (50, 1));
        let u = t.usage();
        assert_eq!(u.queue_ms, Some(5.0));
        assert_eq!(u.ttft_ms, Some(30.0));
        assert_eq!(u.prefill_ms, Some(20.0));
        assert_eq!(u.decode_ms, Some(1000.0));
        assert_eq!(u.decode_tps, Some(50.0));
    }

    #[test]
    fn what_a_request_never_had_is_unknown_not_zero() {
        let t0 = Instant::now();
        // Never admitted (refused by a full queue, or cancelled while queued).
        let mut t = RequestTimings::new(t0, 10);
        t.mark_finished(t0 + Duration::from_millis(7));
        let u = t.usage();
        assert_eq!(
            (u.queue_ms, u.prefill_ms, u.ttft_ms, u.decode_ms),
            (None, None, None, None)
        );
        assert_eq!((u.generation_ms, u.decode_tps), (None, None));
        assert_eq!(u.e2e_ms, Some(7.0));
        let json = serde_json::to_value(u).expect("json");
        assert!(
            json["queue_ms"].is_null() && json["ttft_ms"].is_null(),
            "{json}"
        );
        assert!(
            json.get("generation_ms").is_some(),
            "the field stays, as null"
        );
        let v = t.vllm_latencies();
        assert_eq!((v.time_in_queue, v.time_to_first_token), (None, None));
        assert_eq!(v.e2e, Some(0.007));
        // Admitted, then cancelled in its prefill: a queue time, no token.
        let mut t = RequestTimings::new(t0, 10);
        t.mark_admitted(t0 + Duration::from_millis(2));
        t.add_step(Duration::from_millis(3), 1, true);
        let u = t.usage();
        assert_eq!((u.queue_ms, u.prefill_ms), (Some(2.0), Some(3.0)));
        assert_eq!(
            (u.ttft_ms, u.generation_ms, u.decode_ms),
            (None, None, None)
        );
        // One token, from the prefill: generation is known (zero long), decoding is not.
        t.mark_token(t0 + Duration::from_millis(6), false);
        let u = t.usage();
        assert_eq!((u.ttft_ms, u.generation_ms), (Some(6.0), Some(0.0)));
        assert_eq!((u.decode_ms, u.decode_tps), (None, None));
    }

    /// A preempted request re-prefills its prompt and reply; that prefill's last chunk
    /// produces a token whose time is prefill time. `decode_tps` counts only the tokens of
    /// decode steps over the time of those same steps.
    #[test]
    fn decode_tps_after_a_preemption_counts_only_decode_steps() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = RequestTimings::new(t0, 10);
        t.mark_admitted(t0);
        t.add_step(ms(50), 1, true);
        t.mark_token(t0 + ms(50), false); // first token, from the prefill
        for i in 1..=10 {
            t.add_step(ms(20), 1, false);
            t.mark_token(t0 + ms(50 + 20 * i), true);
        }
        // Preempted; re-prefill of prompt and reply: 100 ms, one more token.
        t.add_step(ms(100), 2, true);
        t.mark_token(t0 + ms(400), false);
        for i in 1..=10 {
            t.add_step(ms(20), 2, false);
            t.mark_token(t0 + ms(400 + 20 * i), true);
        }
        let u = t.usage();
        assert_eq!(t.generated_tokens, 22);
        assert_eq!(u.decode_ms, Some(400.0));
        assert_eq!(u.prefill_ms, Some(150.0));
        // 20 decode steps in 400 ms: 50 tokens/s. Counting the 21 tokens after the first
        // would credit the re-prefill's token to decode time (52.5/s).
        let tps = u.decode_tps.expect("tps");
        assert!((tps - 50.0).abs() < 1e-9, "{tps}");
    }

    #[test]
    fn vllm_latencies_are_wall_clock_intervals() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = RequestTimings::new(t0, 10);
        t.mark_admitted(t0 + ms(100));
        t.add_step(ms(5), 8, true); // device time is far below the wall time under batching
        t.mark_token(t0 + ms(300), false);
        t.add_step(ms(5), 8, false);
        t.mark_token(t0 + ms(700), true);
        t.mark_finished(t0 + ms(750));
        let v = t.vllm_latencies();
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(close(v.time_in_queue, 0.1));
        assert!(close(v.time_to_first_token, 0.3));
        assert!(close(v.time_in_model_prefill, 0.2), "{v:?}");
        assert!(close(v.time_in_model_decode, 0.4), "{v:?}");
        assert!(close(v.time_in_model_inference, 0.65), "{v:?}");
        assert!(close(v.e2e, 0.75));
        assert_eq!(
            t.usage().prefill_ms,
            Some(5.0),
            "device time stays under slotlight's name"
        );
    }

    /// A verification step is one decode step: its device time counts once, and `decode_tps`
    /// counts every token it yields (the draft tokens taken and one more); the leg keeps the
    /// draft counts too.
    #[test]
    fn a_verification_step_is_one_decode_step_of_several_tokens() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = RequestTimings::new(t0, 10);
        t.mark_admitted(t0);
        t.start_leg(PathKind::Solo, 0, None, t0);
        t.add_step(ms(10), 1, true);
        t.mark_token(t0 + ms(10), false);
        // A plain decode step, then one verifying 4 draft tokens of which 3 are taken.
        t.add_step(ms(10), 1, false);
        t.mark_token(t0 + ms(20), true);
        t.add_step(ms(10), 1, false);
        t.add_draft(DraftCheck {
            drafted: 4,
            accepted: 3,
        });
        for _ in 0..4 {
            t.mark_token(t0 + ms(30), true);
        }
        assert_eq!(
            (t.decode_steps, t.decode_tokens, t.generated_tokens),
            (2, 5, 6)
        );
        let u = t.usage();
        assert_eq!(u.decode_ms, Some(20.0));
        let tps = u.decode_tps.expect("tps");
        assert!((tps - 250.0).abs() < 1e-9, "5 tokens in 20 ms: {tps}");
        assert_eq!(
            t.drafts,
            DraftCounts {
                drafts: 1,
                drafted_tokens: 4,
                accepted_tokens: 3
            }
        );
        assert_eq!(t.drafts.rejected_tokens(), 1);
        let leg = t.current_leg().expect("leg");
        assert_eq!((leg.drafted_tokens, leg.accepted_tokens), (4, 3));
        assert_eq!((leg.steps, leg.tokens_generated), (3, 6));
    }
}
