//! Per-request clocks.
//!
//! A request's [`RequestTimings`] lives in its sequence, wherever the sequence runs (solo path
//! or a batch slot), survives every move between them, and travels back with the result on
//! the request's own channel. Nothing here is shared between requests: there is no "last
//! timing" anywhere in the engine.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use slotlight_otel::attr::value;

/// Converts monotonic instants to wall-clock time, anchored once per process.
#[derive(Debug, Clone, Copy)]
pub struct TimeAnchor {
    mono: Instant,
    wall: SystemTime,
}

impl TimeAnchor {
    /// Anchors now.
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
    /// Label.
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
    /// Path.
    pub path: PathKind,
    /// Device group.
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
    /// Label.
    pub fn as_str(self) -> &'static str {
        match self {
            PrefillReason::Initial => value::PREFILL_INITIAL,
            PrefillReason::Preempted => value::PREFILL_PREEMPTED,
        }
    }
}

/// One prefill.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillRecord {
    /// Start of its first chunk's step.
    pub start: Instant,
    /// End of its last chunk's step.
    pub end: Instant,
    /// Tokens it had to have in the KV cache (prompt, plus reply after a preemption).
    pub prompt_tokens: usize,
    /// Of those, found in the prefix cache.
    pub cached_tokens: usize,
    /// Of those, computed.
    pub computed_tokens: usize,
    /// Chunks.
    pub chunks: usize,
    /// Time in the forward steps of its chunks.
    pub device: Duration,
    /// Why it ran.
    pub reason: PrefillReason,
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
    /// Finish.
    pub finished: Option<Instant>,
    /// Time in prefill forward steps (all prefills).
    pub prefill_device: Duration,
    /// Time in decode forward steps.
    pub decode_device: Duration,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache by the first prefill.
    pub cached_tokens: usize,
    /// Tokens computed by all prefills.
    pub prefilled_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Decode steps taken (each yields one token after the first).
    pub decode_steps: u64,
    /// Legs, in order.
    pub legs: Vec<LegRecord>,
    /// Prefills, in order.
    pub prefills: Vec<PrefillRecord>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The timing part of a response's `usage`, derived from one request's own clocks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct UsageTimings {
    /// Arrival to admission.
    pub queue_ms: f64,
    /// Time in prefill forward steps.
    pub prefill_ms: f64,
    /// Arrival to first token.
    pub ttft_ms: f64,
    /// Time in decode forward steps.
    pub decode_ms: f64,
    /// First to last token.
    pub generation_ms: f64,
    /// `(completion_tokens - 1) / decode_ms`, per second; `None` with no decode step.
    pub decode_tps: Option<f64>,
    /// Arrival to finish.
    pub e2e_ms: f64,
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
            decode_device: Duration::ZERO,
            prompt_tokens,
            cached_tokens: 0,
            prefilled_tokens: 0,
            generated_tokens: 0,
            decode_steps: 0,
            legs: Vec::new(),
            prefills: Vec::new(),
        }
    }

    /// Marks admission (only the first one counts as the end of queueing).
    pub fn mark_admitted(&mut self, at: Instant) {
        debug_assert!(at >= self.received);
        if self.admitted.is_none() {
            self.admitted = Some(at);
        }
    }

    /// Records a produced token at `at`.
    pub fn mark_token(&mut self, at: Instant) {
        debug_assert!(self.admitted.is_some(), "token before admission");
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

    /// Marks the finish.
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

    /// The usage timings.
    #[allow(clippy::cast_precision_loss)]
    pub fn usage(&self) -> UsageTimings {
        let at =
            |t: Option<Instant>| t.map_or(0.0, |t| ms(t.saturating_duration_since(self.received)));
        let decode_ms = ms(self.decode_device);
        UsageTimings {
            queue_ms: at(self.admitted),
            prefill_ms: ms(self.prefill_device),
            ttft_ms: at(self.first_token),
            decode_ms,
            generation_ms: match (self.first_token, self.last_token) {
                (Some(f), Some(l)) => ms(l - f),
                _ => 0.0,
            },
            decode_tps: (self.decode_steps > 0 && decode_ms > 0.0)
                .then(|| self.generated_tokens.saturating_sub(1) as f64 / (decode_ms / 1000.0)),
            e2e_ms: at(self.finished),
        }
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
            t.mark_token(t0 + Duration::from_millis(30 + 20 * i));
            if i > 0 {
                t.add_step(Duration::from_millis(20), 1, false);
            }
        }
        let before = (t.received, t.first_token, t.tok_s());
        let moved_at = t0 + Duration::from_millis(1010);
        t.end_leg(moved_at, LegEnd::Moved);
        t.start_leg(PathKind::Slot, 0, Some(0), moved_at);
        t.mark_token(t0 + Duration::from_millis(1030));
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
        assert_eq!(u.queue_ms, 5.0);
        assert_eq!(u.ttft_ms, 30.0);
        assert_eq!(u.prefill_ms, 20.0);
        assert_eq!(u.decode_ms, 1000.0);
        assert_eq!(u.decode_tps, Some(50.0));
    }
}
