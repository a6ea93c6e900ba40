//! One request inside a step loop: its tokens, KV blocks, sampler, detokenizer and clocks.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::resume::Prior;
use super::{
    Completion, EngineError, Event, FinishReason, GenerateRequest, MaskStats, Placement,
    PromptProgress,
};
use crate::constraint::SeqConstraint;
use crate::kv_cache::SeqKv;
use crate::sampling::Sampler;
use crate::speculation::{Draft, Drafter, SpeculationConfig, SpeculationMode};
use crate::stop::StopMatcher;
use crate::timing::{
    LegEnd, PrefillChunkRecord, PrefillEnd, PrefillReason, PrefillRecord, RequestTimings,
};
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
    /// Where it stood after its latest chunk (`None` before the first chunk).
    pub latest: Option<PrefillChunkRecord>,
}

impl PrefillProgress {
    /// A prefill of `target` positions, `cached` of them found in the prefix cache, that has
    /// run no chunk yet.
    pub fn new(target: usize, cached: usize, reason: PrefillReason) -> Self {
        Self {
            start: None,
            last_end: None,
            target,
            cached,
            chunks: 0,
            device: Duration::ZERO,
            reason,
            latest: None,
        }
    }

    /// A chunk of `chunk_tokens` positions ran in the step that started at `started`, whose
    /// forward pass returned at `stepped` after `device`; `computed` positions are now in the
    /// cache. Puts the chunk on the prefill's clocks and returns where the prefill stands.
    pub fn chunk_done(
        &mut self,
        started: Instant,
        stepped: Instant,
        device: Duration,
        computed: usize,
        chunk_tokens: usize,
    ) -> PrefillChunkRecord {
        let prefill_start = *self.start.get_or_insert(started);
        self.last_end = Some(stepped);
        self.chunks += 1;
        self.device += device;
        let rec = PrefillChunkRecord {
            prefill_start,
            start: started,
            end: stepped,
            total: self.target,
            cached: self.cached,
            processed: computed.min(self.target),
            chunk_tokens,
            chunk: self.chunks,
            device,
        };
        self.latest = Some(rec.clone());
        rec
    }

    /// Where the prefill stands, as of its latest chunk (before the first: only the cached
    /// positions, and no time), and its own rate so far.
    pub fn progress(&self) -> (PromptProgress, Option<f64>) {
        match &self.latest {
            Some(rec) => (PromptProgress::from(rec), rec.tok_s()),
            None => (
                PromptProgress {
                    total: self.target,
                    cache: self.cached,
                    processed: self.cached,
                    time_ms: 0,
                },
                None,
            ),
        }
    }

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
    /// How the sequence drafts (`None`: it never does).
    pub drafter: Option<Drafter>,
    /// How it was drafted for (its counts are in `timings.drafts`).
    pub speculation: SpeculationMode,
    /// The draft the next step verifies, planned with the step (`None`: a plain decode).
    pub draft: Option<Draft>,
    /// The verification chunk's tokens: the last token, then the draft's.
    pub verify: Vec<u32>,
    /// Whether its completion was sent. A sequence dropped before that (its step loop
    /// panicked or went away) sends one itself, as lost, with its own clocks.
    pub answered: bool,
    /// Whether the window before its prompt's end was kept as its session's checkpoint (or
    /// found not to be due).
    pub prompt_checkpointed: bool,
    /// Checkpoints of its window kept inside its reply so far.
    pub reply_checkpoints: usize,
}

impl<'t> Seq<'t> {
    /// Choice `choice` of request `req` (of request family `family`), waiting to be admitted:
    /// its events go to `events`, its text through `decoder`, its output follows `constraint`
    /// when it has one, and it drafts as `speculation` says.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        req: Box<GenerateRequest>,
        events: mpsc::UnboundedSender<Event>,
        decoder: StreamDecoder<'t>,
        family: u64,
        choice: usize,
        constraint: Option<SeqConstraint>,
        prior: Option<Prior>,
        speculation: &SpeculationConfig,
    ) -> Self {
        let timings = RequestTimings::new(req.received, req.prompt.len());
        let sampler = Sampler::new(req.sampling.clone(), &req.prompt);
        let drafter = Drafter::new(speculation, req.prediction.as_deref());
        let mode = if drafter.is_some() {
            SpeculationMode::of(speculation, req.prediction.is_some())
        } else {
            SpeculationMode::Off
        };
        let tokens = req.prompt.clone();
        let stop = req.stop.clone();
        Self {
            req,
            events,
            timings,
            tokens,
            computed: 0,
            blocks: SeqKv::default(),
            sampler,
            decoder,
            stop,
            phase: Phase::Prefill,
            placement: None,
            prefill: None,
            order: 0,
            ever_slotted: false,
            family,
            choice,
            constraint,
            prior,
            drafter,
            speculation: mode,
            draft: None,
            verify: Vec::new(),
            answered: false,
            prompt_checkpointed: false,
            reply_checkpoints: 0,
        }
    }

    /// Sends the sequence's completion, ending with `reason` in group `group`, with its own
    /// clocks and `tail_text` (the text held back until the end).
    pub fn answer(&mut self, reason: FinishReason, tail_text: String, group: usize) {
        let completion = Completion {
            finish_reason: reason,
            tokens: self.generated().to_vec(),
            tail_text,
            timings: self.timings.clone(),
            group,
            choice: self.choice,
            mask: self.constraint.as_ref().map(|c| MaskStats {
                time: c.mask_time,
                masks: c.masks,
            }),
            speculation: self.speculation,
        };
        self.emit(Event::Done(Box::new(completion)));
        self.answered = true;
    }
}

impl Drop for Seq<'_> {
    /// A sequence its step loop lets go of without finishing it (the loop panicked, or was
    /// dropped) still answers: an error, with the clocks the engine kept for it, its open leg
    /// ended now, so the request's span, log line and metrics say what really happened.
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let now = Instant::now();
        if let Some(leg) = self.timings.end_leg(now, LegEnd::Cancelled).cloned() {
            self.emit(Event::LegEnded(leg));
        }
        self.timings.mark_finished(now);
        let group = self.placement.map_or(0, |p| p.group);
        self.answer(FinishReason::Error(EngineError::Lost), String::new(), group);
    }
}

impl Seq<'_> {
    /// Plans the next step's draft of at most `room` tokens (fills [`Seq::draft`] and
    /// [`Seq::verify`]); returns its length (0: a plain decode).
    pub fn plan_draft(&mut self, room: usize) -> usize {
        self.draft = None;
        let (Some(drafter), Some(&last)) = (self.drafter.as_mut(), self.tokens.last()) else {
            return 0;
        };
        let Some(draft) = drafter.propose(&self.tokens, room) else {
            return 0;
        };
        self.verify.clear();
        self.verify.push(last);
        self.verify.extend_from_slice(&draft.tokens);
        let k = draft.tokens.len();
        self.draft = Some(draft);
        k
    }

    /// The length of the draft planned for the next step (0: none).
    pub fn draft_len(&self) -> usize {
        self.draft.as_ref().map_or(0, |d| d.tokens.len())
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::PathKind;
    use crate::tokenizer::tests::gpt2_tokenizer;

    /// A sequence its step loop drops unfinished answers as lost with the clocks the engine
    /// kept (its admission, its leg, ended now); one that was answered sends nothing more.
    #[test]
    fn a_dropped_sequence_answers_with_its_own_clocks() {
        let tok = gpt2_tokenizer(Some("smollm"));
        let req = GenerateRequest::new("r", vec![1, 2, 3], 4);
        let admitted = req.received;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut seq = Seq::new(
            Box::new(req.clone()),
            tx,
            tok.decoder_after(&[1, 2, 3]),
            0,
            0,
            None,
            None,
            &SpeculationConfig::default(),
        );
        seq.timings.mark_admitted(admitted);
        seq.timings.start_leg(PathKind::Solo, 2, None, admitted);
        seq.placement = Some(Placement {
            path: PathKind::Solo,
            group: 2,
            slot: None,
        });
        drop(seq);
        let Ok(Event::LegEnded(leg)) = rx.try_recv() else {
            panic!("the open leg ends first");
        };
        assert!(leg.end.is_some());
        let Ok(Event::Done(c)) = rx.try_recv() else {
            panic!("a completion");
        };
        assert_eq!(c.finish_reason, FinishReason::Error(EngineError::Lost));
        assert_eq!(c.timings.admitted, Some(admitted));
        assert!(c.timings.finished.is_some_and(|f| f >= admitted));
        assert_eq!(c.group, 2);
        assert!(rx.try_recv().is_err(), "one completion only");

        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut seq = Seq::new(
            Box::new(req),
            tx,
            tok.decoder_after(&[1, 2, 3]),
            0,
            0,
            None,
            None,
            &SpeculationConfig::default(),
        );
        seq.answer(FinishReason::Stop, String::new(), 0);
        drop(seq);
        let Ok(Event::Done(c)) = rx.try_recv() else {
            panic!("a completion");
        };
        assert_eq!(c.finish_reason, FinishReason::Stop);
        assert!(
            rx.try_recv().is_err(),
            "an answered sequence sends nothing more"
        );
    }
}
