//! The slot view: one row per (engine instance, group, path, slot index).
//!
//! A row holds at most one request (its *occupant*). Rates are always the request's own:
//! `tok_s` is `(tokens_generated − 1) / (last_token_time − first_token_time)` over all its legs,
//! so a request that moves from the solo path into a slot keeps its rate and its `elapsed_s`
//! (from `slotlight.request.start_time_unix_nano`). The current leg's figures (`in_slot_s`,
//! `leg_tok_s`) are reported beside them, never mixed in. Speculative decoding changes none of
//! these definitions: a verification step that takes several draft tokens just produces them
//! sooner. Its own figures (draft tokens verified and taken so far, and their ratio,
//! `acceptance`) are the sums of the request's decode windows, reported beside the rates.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::Serialize;

use crate::base::vocab::{Path, SlotKey, TraceId, acceptance, hex};

/// Rate samples kept per row for the page's sparkline.
pub const HISTORY_LEN: usize = 60;

/// What a row is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RowState {
    /// No request.
    Idle,
    /// Admitted, no decode window yet.
    Prefill,
    /// Decoding (at least one decode window seen).
    Decoding,
}

/// The request a row currently holds.
#[derive(Debug, Clone)]
pub struct Occupant {
    /// Prefill or decoding.
    pub state: RowState,
    /// The engine's request id (also the response id) (`slotlight.request.id`).
    pub request_id: Arc<str>,
    /// The request's trace.
    pub trace_id: TraceId,
    /// The conversation the request belongs to, when the client named one (`slotlight.session.id`).
    pub session_id: Option<Arc<str>>,
    /// When this occupancy began (admission or leg start): of two requests claiming one row,
    /// the later one holds it.
    pub since_ns: i64,
    /// The leg this row shows.
    pub leg_index: i64,
    /// The request's own start (never reset by a move).
    pub request_start_ns: i64,
    /// The request's first token.
    pub first_token_ns: Option<i64>,
    /// The latest token seen.
    pub last_token_ns: Option<i64>,
    /// When the current leg started.
    pub leg_start_ns: i64,
    /// Tokens generated so far over all legs.
    pub tokens_generated: i64,
    /// Tokens the request carried into the current leg.
    pub tokens_carried: i64,
    /// Where its prefill stands, while it prefills and its prefill windows say.
    pub prefill: Option<PrefillProgress>,
    /// Draft tokens verified so far, over its decode windows (`slotlight.decode.drafted_tokens`
    /// summed); `None` until a window states it.
    pub drafted_tokens: Option<i64>,
    /// Of those, draft tokens taken (`slotlight.decode.accepted_tokens` summed).
    pub accepted_tokens: Option<i64>,
}

/// A running prefill, from its latest `slotlight.prefill.window`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillProgress {
    /// Positions of the prompt.
    pub total: i64,
    /// Positions whose KV came from the cache.
    pub cached: i64,
    /// Positions in the KV cache after the latest chunk, the cached ones included.
    pub processed: i64,
    /// When the prefill's first chunk started, Unix ns.
    pub start_ns: i64,
    /// When its latest chunk ended, Unix ns.
    pub last_chunk_ns: i64,
}

impl PrefillProgress {
    /// The prefill's own rate: positions computed (not the cached ones) over the time from its
    /// first chunk's start to its latest chunk's end.
    pub fn tok_s(&self) -> Option<f64> {
        let computed = self.processed - self.cached;
        let dt = self.last_chunk_ns - self.start_ns;
        (computed > 0 && dt > 0).then(|| tokens(computed) / secs(dt))
    }
}

/// `prompt_progress` of a row: the engine's (and llama.cpp's) shape.
#[derive(Debug, Serialize)]
pub struct PromptProgressView {
    /// Positions of the prompt.
    pub total: i64,
    /// Positions whose KV came from the cache.
    pub cache: i64,
    /// Positions in the KV cache so far, the cached ones included.
    pub processed: i64,
    /// Milliseconds from the prefill's first chunk to its latest chunk's end.
    pub time_ms: f64,
}

fn secs(ns: i64) -> f64 {
    #[allow(clippy::cast_precision_loss)] // ns differences of a live view fit easily
    let s = ns as f64 / 1e9;
    s
}

#[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
fn tokens(n: i64) -> f64 {
    n as f64
}

impl Occupant {
    /// The request's own rate since its first token, over all its legs.
    pub fn tok_s(&self) -> Option<f64> {
        let (first, last) = (self.first_token_ns?, self.last_token_ns?);
        if self.tokens_generated < 2 || last <= first {
            return None;
        }
        Some(tokens(self.tokens_generated - 1) / secs(last - first))
    }

    /// The current leg's rate: tokens of this leg over the time since the leg started.
    pub fn leg_tok_s(&self) -> Option<f64> {
        let last = self.last_token_ns?;
        let n = self.tokens_generated - self.tokens_carried;
        if n < 1 || last <= self.leg_start_ns {
            return None;
        }
        Some(tokens(n) / secs(last - self.leg_start_ns))
    }

    /// Arrival to first token, ms.
    pub fn ttft_ms(&self) -> Option<f64> {
        self.first_token_ns
            .map(|f| secs(f - self.request_start_ns) * 1e3)
    }

    /// The request's acceptance rate so far: draft tokens taken over draft tokens verified;
    /// `None` before any draft was verified.
    pub fn acceptance(&self) -> Option<f64> {
        acceptance(self.drafted_tokens?, self.accepted_tokens.unwrap_or(0))
    }
}

/// One row of the slot view.
#[derive(Debug, Clone)]
pub struct Row {
    /// Group, path and index.
    pub key: SlotKey,
    /// The request it holds, if any.
    pub occupant: Option<Occupant>,
    /// When the row last changed (sidecar clock, Unix ns).
    pub updated_ns: i64,
    /// Recent decode-window rates (tokens/s), oldest first.
    pub history: VecDeque<f64>,
}

impl Row {
    /// An idle row.
    pub fn new(key: SlotKey, now_ns: i64) -> Self {
        Row {
            key,
            occupant: None,
            updated_ns: now_ns,
            history: VecDeque::with_capacity(HISTORY_LEN),
        }
    }

    /// Puts `occ` in the row unless a different request that started its occupancy later
    /// holds it (a late span of an earlier request must not take the row back).
    pub fn occupy(&mut self, occ: Occupant, now_ns: i64) -> bool {
        if let Some(cur) = &self.occupant
            && cur.request_id != occ.request_id
            && cur.since_ns > occ.since_ns
        {
            return false;
        }
        self.occupant = Some(occ);
        self.updated_ns = now_ns;
        true
    }

    /// Empties the row if it holds `request_id` (and, when given, that leg).
    pub fn release(&mut self, request_id: &str, leg_index: Option<i64>, now_ns: i64) -> bool {
        let held = self.occupant.as_ref().is_some_and(|o| {
            &*o.request_id == request_id && leg_index.is_none_or(|l| l == o.leg_index)
        });
        if held {
            self.occupant = None;
            self.updated_ns = now_ns;
        }
        held
    }

    /// Records one rate sample for the sparkline.
    pub fn push_rate(&mut self, rate: f64) {
        if self.history.len() == HISTORY_LEN {
            self.history.pop_front();
        }
        self.history.push_back(rate);
    }

    /// The row as served, with times relative to `now_ns`.
    pub fn view(&self, now_ns: i64) -> RowView<'_> {
        let o = self.occupant.as_ref();
        RowView {
            group: self.key.group,
            path: self.key.path,
            index: self.key.index,
            state: o.map_or(RowState::Idle, |o| o.state),
            request_id: o.map(|o| &*o.request_id),
            trace_id: o.map(|o| hex(&o.trace_id)),
            session_id: o.and_then(|o| o.session_id.as_deref()),
            leg_index: o.map(|o| o.leg_index),
            tokens_generated: o.map(|o| o.tokens_generated),
            elapsed_s: o.map(|o| secs(now_ns - o.request_start_ns).max(0.0)),
            tok_s: o.and_then(Occupant::tok_s),
            in_slot_s: o.map(|o| secs(now_ns - o.leg_start_ns).max(0.0)),
            leg_tok_s: o.and_then(Occupant::leg_tok_s),
            ttft_ms: o.and_then(Occupant::ttft_ms),
            drafted_tokens: o.and_then(|o| o.drafted_tokens),
            accepted_tokens: o.and_then(|o| o.accepted_tokens),
            acceptance: o.and_then(Occupant::acceptance),
            prompt_progress: o.and_then(|o| o.prefill).map(|p| PromptProgressView {
                total: p.total,
                cache: p.cached,
                processed: p.processed,
                time_ms: secs(p.last_chunk_ns - p.start_ns).max(0.0) * 1e3,
            }),
            prefill_tok_s: o.and_then(|o| o.prefill).and_then(|p| p.tok_s()),
            age_s: secs(now_ns - self.updated_ns).max(0.0),
            history: &self.history,
        }
    }
}

/// A row as JSON (`/v1/slots`).
#[derive(Debug, Serialize)]
pub struct RowView<'a> {
    /// The device group (slot group) of the slot.
    pub group: i64,
    /// `solo` or `slot`.
    pub path: Path,
    /// Slot index; null on the solo path.
    pub index: Option<i64>,
    /// idle, prefill or decoding.
    pub state: RowState,
    /// The request's id.
    pub request_id: Option<&'a str>,
    /// The request's trace id (hex).
    pub trace_id: Option<String>,
    /// The request's session.
    pub session_id: Option<&'a str>,
    /// The leg shown.
    pub leg_index: Option<i64>,
    /// Tokens generated so far, all legs.
    pub tokens_generated: Option<i64>,
    /// Seconds since the request's own start.
    pub elapsed_s: Option<f64>,
    /// The request's rate since its first token, all legs.
    pub tok_s: Option<f64>,
    /// Seconds in the current leg.
    pub in_slot_s: Option<f64>,
    /// The current leg's rate.
    pub leg_tok_s: Option<f64>,
    /// Arrival to first token, ms.
    pub ttft_ms: Option<f64>,
    /// Draft tokens verified so far (speculative decoding), over the request's decode windows;
    /// null until a window states it.
    pub drafted_tokens: Option<i64>,
    /// Of those, draft tokens taken.
    pub accepted_tokens: Option<i64>,
    /// `accepted_tokens / drafted_tokens`; null while nothing was drafted.
    pub acceptance: Option<f64>,
    /// While prefilling: where the prefill stands (tokens done of total), from its latest
    /// progress window.
    pub prompt_progress: Option<PromptProgressView>,
    /// While prefilling: the prefill's own rate, computed positions per second.
    pub prefill_tok_s: Option<f64>,
    /// Seconds since the row last changed.
    pub age_s: f64,
    /// Recent window rates, oldest first.
    pub history: &'a VecDeque<f64>,
}

/// One engine instance in a snapshot.
#[derive(Debug, Clone)]
pub struct InstanceSnapshot {
    /// The engine process, as its resource names it (`service.instance.id`).
    pub instance: Arc<str>,
    /// The engine's version (`service.version`).
    pub service_version: Option<Arc<str>>,
    /// When the sidecar last heard from it.
    pub last_seen_ns: i64,
    /// The share of request traces it keeps, as its latest request span stated.
    pub sampling_ratio: Option<f64>,
    /// Requests admitted and not finished.
    pub running: u64,
    /// Its rows, sorted by group, path, index.
    pub rows: Vec<Row>,
}

/// What the assembly task publishes for the views.
#[derive(Debug, Clone, Default)]
pub struct SlotsSnapshot {
    /// Engine instances, sorted by id.
    pub instances: Vec<InstanceSnapshot>,
}

/// `/v1/slots` as JSON.
#[derive(Debug, Serialize)]
pub struct SlotsView<'a> {
    /// The sidecar's clock when rendered.
    pub now_unix_nano: i64,
    /// Every engine instance heard from, one entry each.
    pub instances: Vec<InstanceView<'a>>,
}

/// One instance as JSON.
#[derive(Debug, Serialize)]
pub struct InstanceView<'a> {
    /// The engine process, as its resource names it (`service.instance.id`).
    pub instance: &'a str,
    /// The engine's version (`service.version`).
    pub service_version: Option<&'a str>,
    /// Seconds since the sidecar last heard from it.
    pub last_seen_s: f64,
    /// The share of request traces the engine keeps (its latest request span's
    /// `slotlight.trace.sampling_ratio`); below 1, every count here is of sampled requests.
    pub sampling_ratio: Option<f64>,
    /// Requests admitted and not finished.
    pub running: u64,
    /// The instance's rows: one per slot and solo path of each group.
    pub slots: Vec<RowView<'a>>,
}

impl SlotsSnapshot {
    /// The view at `now_ns`.
    pub fn view(&self, now_ns: i64) -> SlotsView<'_> {
        SlotsView {
            now_unix_nano: now_ns,
            instances: self
                .instances
                .iter()
                .map(|i| InstanceView {
                    instance: &i.instance,
                    service_version: i.service_version.as_deref(),
                    last_seen_s: secs(now_ns - i.last_seen_ns).max(0.0),
                    sampling_ratio: i.sampling_ratio,
                    running: i.running,
                    slots: i.rows.iter().map(|r| r.view(now_ns)).collect(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn occ(id: &str, since: i64) -> Occupant {
        Occupant {
            state: RowState::Decoding,
            request_id: Arc::from(id),
            trace_id: [1; 16],
            session_id: None,
            since_ns: since,
            leg_index: 0,
            request_start_ns: 0,
            first_token_ns: Some(S),
            last_token_ns: Some(3 * S),
            leg_start_ns: 0,
            tokens_generated: 101,
            tokens_carried: 0,
            prefill: None,
            drafted_tokens: None,
            accepted_tokens: None,
        }
    }

    fn key() -> SlotKey {
        SlotKey {
            group: 0,
            path: Path::Slot,
            index: Some(0),
        }
    }

    #[test]
    fn rate_is_the_requests_own() {
        let o = occ("a", 0);
        assert_eq!(o.tok_s(), Some(50.0));
        assert_eq!(o.ttft_ms(), Some(1000.0));
        let mut moved = o.clone();
        moved.leg_start_ns = 2 * S;
        moved.tokens_carried = 51;
        assert_eq!(moved.tok_s(), Some(50.0), "a move does not change the rate");
        assert_eq!(moved.leg_tok_s(), Some(50.0));
    }

    #[test]
    fn later_occupant_keeps_the_row() {
        let mut r = Row::new(key(), 0);
        assert!(r.occupy(occ("new", 10), 1));
        assert!(
            !r.occupy(occ("old", 5), 2),
            "late span of an earlier request"
        );
        assert!(r.occupy(occ("new", 10), 3));
        assert!(!r.release("old", None, 4));
        assert!(!r.release("new", Some(7), 4), "another leg");
        assert!(r.release("new", Some(0), 5));
        assert_eq!(r.view(5 * S).state, RowState::Idle);
    }

    #[test]
    fn view_counts_from_request_start() {
        let mut r = Row::new(key(), 0);
        r.occupy(occ("a", 0), 3 * S);
        let v = r.view(4 * S);
        assert_eq!(v.elapsed_s, Some(4.0));
        assert_eq!(v.age_s, 1.0);
        for i in 0..(HISTORY_LEN + 5) {
            r.push_rate(i as f64);
        }
        assert_eq!(r.history.len(), HISTORY_LEN);
    }

    #[test]
    fn acceptance_is_accepted_over_drafted_and_leaves_the_rate_alone() {
        let mut o = occ("a", 0);
        assert_eq!(o.acceptance(), None, "no window stated drafts");
        o.drafted_tokens = Some(0);
        o.accepted_tokens = Some(0);
        assert_eq!(o.acceptance(), None, "nothing drafted");
        o.drafted_tokens = Some(80);
        o.accepted_tokens = Some(60);
        assert_eq!(o.acceptance(), Some(0.75));
        assert_eq!(o.tok_s(), Some(50.0), "still the request's own rate");
        let mut r = Row::new(key(), 0);
        r.occupy(o, 0);
        let v = serde_json::to_value(r.view(S)).expect("json");
        assert_eq!(v["drafted_tokens"], 80);
        assert_eq!(v["accepted_tokens"], 60);
        assert_eq!(v["acceptance"], 0.75);
        let idle = serde_json::to_value(Row::new(key(), 0).view(S)).expect("json");
        assert_eq!(idle["acceptance"], serde_json::Value::Null);
    }
}
