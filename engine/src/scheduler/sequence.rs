//! One request inside a step loop: its tokens, KV blocks, sampler, detokenizer and clocks.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::resume::Prior;
use super::{Event, GenerateRequest, Placement};
use crate::constraint::SeqConstraint;
use crate::kv_cache::SeqKv;
use crate::sampling::Sampler;
use crate::stop::StopMatcher;
use crate::timing::{PrefillEnd, PrefillReason, PrefillRecord, RequestTimings};
use crate::tokenizer::StreamDecoder;

/// What the sequence does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Computing `tokens[computed..]` into the KV cache; the last chunk samples a token.
    Prefill,
    /// Feeding the last sampled token and sampling the next.
    Decode,
}

/// A prefill in progress.
#[derive(Debug, Clone)]
pub struct PrefillProgress {
    /// Start of its first chunk's step (`None` before the first chunk).
    pub start: Option<Instant>,
    /// End of its latest chunk's step.
    pub last_end: Option<Instant>,
    /// Positions it must have in the KV cache when done (prompt, plus reply after a preemption).
    pub target: usize,
    /// Of those, found in the prefix cache at admission.
    pub cached: usize,
    /// Chunks run so far.
    pub chunks: usize,
    /// Time in the forward steps of those chunks.
    pub device: Duration,
    /// Why it runs.
    pub reason: PrefillReason,
}

impl PrefillProgress {
    /// The record of this prefill, ended with `end_reason` when `computed` positions are in
    /// the cache.
    pub fn record(&self, computed: usize, end_reason: PrefillEnd) -> PrefillRecord {
        let start = self.start.or(self.last_end).unwrap_or_else(Instant::now);
        PrefillRecord {
            start,
            end: self.last_end.unwrap_or(start),
            prompt_tokens: self.target,
            cached_tokens: self.cached,
            computed_tokens: computed.saturating_sub(self.cached),
            chunks: self.chunks,
            device: self.device,
            reason: self.reason,
            end_reason,
        }
    }
}

/// A request admitted to (or waiting in) a step loop.
pub struct Seq<'t> {
    pub req: Box<GenerateRequest>,
    pub events: mpsc::UnboundedSender<Event>,
    pub timings: RequestTimings,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    /// Positions whose keys and values are in the cache.
    pub computed: usize,
    /// Its KV blocks, in the full pool and (with one) the window pool.
    pub blocks: SeqKv,
    pub sampler: Sampler,
    pub decoder: StreamDecoder<'t>,
    pub stop: StopMatcher,
    pub phase: Phase,
    pub placement: Option<Placement>,
    pub prefill: Option<PrefillProgress>,
    /// Admission order within the group (preemption takes the newest).
    pub order: u64,
    /// Whether any leg was on a slot.
    pub ever_slotted: bool,
    /// The request's choices share a family id within the group; choice 0 prefills the
    /// prompt, the others wait for it and fork from the prefix cache.
    pub family: u64,
    /// Which choice this is, from 0.
    pub choice: usize,
    /// The grammar this choice must follow, with its mask for the next token.
    pub constraint: Option<SeqConstraint>,
    /// What the engine remembered of the request's session when it arrived.
    pub prior: Option<Prior>,
}

impl Seq<'_> {
    /// Tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.req.prompt.len()..]
    }

    /// Whether the client has gone away or asked to cancel.
    pub fn is_cancelled(&self) -> bool {
        self.events.is_closed() || self.req.cancel.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends an event; a closed channel is noticed at the next step as a cancellation.
    pub fn emit(&self, e: Event) {
        let _ = self.events.send(e);
    }

    /// Ends a prefill in progress before its last chunk (preemption, cancellation, failure).
    /// A prefill that ran at least one chunk is recorded and emitted, so the device time of
    /// its steps (already in the request's prefill time) has a prefill record of its own.
    pub fn cut_prefill(&mut self, end_reason: PrefillEnd) {
        let Some(p) = self.prefill.take() else {
            return;
        };
        if p.chunks == 0 {
            return;
        }
        let rec = p.record(self.computed, end_reason);
        self.timings.prefilled_tokens += rec.computed_tokens;
        self.timings.prefills.push(rec.clone());
        self.emit(Event::Prefilled(rec));
    }
}
