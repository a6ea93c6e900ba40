//! One request inside a step loop: its tokens, KV blocks, sampler, detokenizer and clocks.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::{Event, GenerateRequest, Placement};
use crate::constraint::SeqConstraint;
use crate::kv_cache::SeqBlocks;
use crate::sampling::Sampler;
use crate::stop::StopMatcher;
use crate::timing::{PrefillReason, RequestTimings};
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
    pub start: Option<Instant>,
    pub target: usize,
    pub cached: usize,
    pub chunks: usize,
    pub device: Duration,
    pub reason: PrefillReason,
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
    pub blocks: SeqBlocks,
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
}
