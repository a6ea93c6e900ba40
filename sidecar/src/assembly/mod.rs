//! Assembly: the one task that owns every per-instance and per-request map.
//!
//! Receivers send validated batches ([`Batch`]) over a bounded channel; [`run`] applies them
//! to an [`Assembler`] and publishes what the views read: a [`SlotsSnapshot`] over a `watch`
//! channel (at most every `--publish-interval-ms`), and each finished request's
//! [`TurnRecord`] into the ring, the broadcast channel, the metrics, the turn store's writer
//! (`--turns-db`) and the stdout log.
//!
//! [`Assembler`] itself is synchronous and takes the clock as an argument (`now_ns`), so the
//! tests drive it deterministically.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, broadcast, mpsc, watch};

pub mod sessions;

use crate::base::vocab::TraceId;
use crate::metrics::{EvictReason, Metrics};
use crate::records::slots::{
    InstanceSnapshot, Occupant, PrefillProgress, Row, RowState, SlotsSnapshot,
};
use crate::records::spans::{Body, DecodeSpan, EngineSpan, PrefillWindowSpan, SlotKey};
use crate::records::turn::{PartialTurn, TurnLeg, TurnRecord};
use crate::store::{TurnStore, TurnWriter};
use sessions::SessionTracker;

/// Live sessions tracked at once (beyond, the one idle longest is observed early).
pub const MAX_LIVE_SESSIONS: usize = 65_536;

/// Engine instances tracked at once.
pub const MAX_INSTANCES: usize = 256;
/// Rows (slots and solo paths) per instance.
pub const MAX_ROWS: usize = 4096;

/// A validated batch from one export request, with its share of the ingest queue.
#[derive(Debug)]
pub struct Batch {
    /// The engine's spans.
    pub spans: Vec<EngineSpan>,
    /// Returned to the ingest queue when the batch is applied.
    pub permit: Option<OwnedSemaphorePermit>,
}

/// Limits of the assembly.
#[derive(Debug, Clone)]
pub struct AssemblyConfig {
    /// Requests assembled at once; the oldest is evicted beyond this.
    pub max_requests: usize,
    /// A request silent this long is evicted.
    pub request_ttl_ns: i64,
    /// How long a finished request waits for missing legs.
    pub legs_wait_ns: i64,
    /// An instance with nothing in flight is forgotten after this long.
    pub instance_ttl_ns: i64,
    /// Finished request ids remembered per instance, so late spans do not resurrect them.
    pub finished_memory: usize,
    /// How long a session without the engine's KV keeping stays live after its last turn.
    pub session_idle_ns: i64,
}

impl AssemblyConfig {
    /// Limits from the command line.
    pub fn from_config(c: &crate::base::config::Config) -> Self {
        let ns = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        AssemblyConfig {
            max_requests: c.max_traces.max(1),
            request_ttl_ns: ns(Duration::from_secs(c.trace_ttl_s)),
            legs_wait_ns: ns(c.legs_wait()),
            instance_ttl_ns: ns(Duration::from_secs(c.instance_ttl_s)),
            finished_memory: 8192,
            session_idle_ns: c.session_idle_ns(),
        }
    }
}

impl Default for AssemblyConfig {
    fn default() -> Self {
        AssemblyConfig::from_config(&crate::base::config::Config::ephemeral())
    }
}

/// What applying spans or a tick produced.
#[derive(Debug, Default)]
pub struct Outputs {
    /// Finished requests, in completion order.
    pub turns: Vec<TurnRecord>,
    /// Requests evicted because the map was full.
    pub evicted_capacity: u64,
    /// Requests evicted because they went silent.
    pub evicted_ttl: u64,
    /// Spans that came after what they describe was over (a span of a request already
    /// finished, a decode window of a leg already ended): applied to no view.
    pub late_spans: u64,
}

struct RequestState {
    request_id: Arc<str>,
    session_id: Option<Arc<str>>,
    seq: u64,
    updated_ns: i64,
    /// The row this request holds, if any.
    row: Option<SlotKey>,
    /// Timestamp of the newest queue/decode update applied to the rows.
    as_of_ns: i64,
    /// The newest decode window's tokens generated, first token and last token times: a
    /// re-prefill after a preemption shows the reply so far.
    decoded: Option<(i64, Option<i64>, i64)>,
    /// Draft tokens verified and taken so far: the sums over the decode windows applied (each
    /// window counts its own steps once), `None` until a window states them.
    drafts: DraftSums,
    admitted: bool,
    /// The legs that ended (their spans arrived), kept until the turn record is written: a
    /// decode window of one of them arriving late must not bring its row back.
    legs: Vec<TurnLeg>,
    root: Option<Box<EngineSpan>>,
    /// The trace its spans belong to, and the interval they covered (for a record without
    /// the request span).
    trace_id: TraceId,
    first_start_ns: i64,
    last_end_ns: i64,
}

/// Draft tokens verified and taken so far, summed over a request's decode windows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct DraftSums {
    drafted: Option<i64>,
    accepted: Option<i64>,
}

impl DraftSums {
    /// Adds one window's counts (an absent count adds nothing and leaves an unknown sum
    /// unknown).
    fn add(&mut self, d: &DecodeSpan) {
        let sum = |acc: Option<i64>, v: Option<i64>| match v {
            Some(v) => Some(acc.unwrap_or(0).saturating_add(v)),
            None => acc,
        };
        self.drafted = sum(self.drafted, d.drafted_tokens);
        self.accepted = sum(self.accepted, d.accepted_tokens);
    }
}

impl RequestState {
    /// Whether the leg `index` has ended (its leg span arrived).
    fn leg_ended(&self, index: i64) -> bool {
        self.legs.iter().any(|l| l.index == index)
    }
}

struct Instance {
    version: Option<Arc<str>>,
    last_seen_ns: i64,
    /// The sampling ratio its latest request span stated (`slotlight.trace.sampling_ratio`).
    sampling_ratio: Option<f64>,
    rows: BTreeMap<SlotKey, Row>,
    requests: HashMap<Arc<str>, RequestState>,
    finished: HashSet<Arc<str>>,
    finished_order: VecDeque<Arc<str>>,
}

impl Instance {
    fn new(now_ns: i64) -> Self {
        Instance {
            version: None,
            last_seen_ns: now_ns,
            sampling_ratio: None,
            rows: BTreeMap::new(),
            requests: HashMap::new(),
            finished: HashSet::new(),
            finished_order: VecDeque::new(),
        }
    }

    fn remember_finished(&mut self, id: Arc<str>, cap: usize) {
        if self.finished.insert(id.clone()) {
            self.finished_order.push_back(id);
        }
        while self.finished_order.len() > cap {
            if let Some(old) = self.finished_order.pop_front() {
                self.finished.remove(&old);
            }
        }
    }

    fn release_row(&mut self, st: &RequestState, now_ns: i64) {
        if let Some(k) = st.row
            && let Some(row) = self.rows.get_mut(&k)
        {
            row.release(&st.request_id, None, now_ns);
        }
    }
}

/// The assembly state machine. See the module doc.
pub struct Assembler {
    cfg: AssemblyConfig,
    instances: BTreeMap<Arc<str>, Instance>,
    /// Creation order of requests, for capacity eviction (stale entries skipped by `seq`).
    order: VecDeque<(Arc<str>, Arc<str>, u64)>,
    /// Finished requests waiting for legs: (deadline, instance, request).
    waiting: VecDeque<(i64, Arc<str>, Arc<str>)>,
    in_flight: usize,
    next_seq: u64,
    dirty: bool,
    last_sweep_ns: i64,
}

impl Assembler {
    /// An empty assembly.
    pub fn new(cfg: AssemblyConfig) -> Self {
        Assembler {
            cfg,
            instances: BTreeMap::new(),
            order: VecDeque::new(),
            waiting: VecDeque::new(),
            in_flight: 0,
            next_seq: 0,
            dirty: true,
            last_sweep_ns: 0,
        }
    }

    /// Requests being assembled.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// True (once) when the slot view changed since the last call.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// Applies spans received at `now_ns` (sidecar clock).
    pub fn apply(&mut self, spans: Vec<EngineSpan>, now_ns: i64, out: &mut Outputs) {
        for s in spans {
            self.apply_one(s, now_ns, out);
        }
    }

    fn apply_one(&mut self, s: EngineSpan, now_ns: i64, out: &mut Outputs) {
        if !self.instances.contains_key(&s.instance) && self.instances.len() >= MAX_INSTANCES {
            // Make room by forgetting the quietest instance with nothing in flight; when every
            // instance is busy, the newcomer waits (its spans are dropped as late).
            let quietest = self
                .instances
                .iter()
                .filter(|(_, i)| i.requests.is_empty())
                .min_by_key(|(_, i)| i.last_seen_ns)
                .map(|(id, _)| id.clone());
            match quietest {
                Some(id) => {
                    self.instances.remove(&id);
                }
                None => {
                    out.late_spans += 1;
                    return;
                }
            }
        }
        let inst = self
            .instances
            .entry(s.instance.clone())
            .or_insert_with(|| Instance::new(now_ns));
        inst.last_seen_ns = now_ns;
        if s.service_version.is_some() && inst.version != s.service_version {
            inst.version = s.service_version.clone();
        }
        if inst.finished.contains(&*s.request_id) {
            out.late_spans += 1;
            return;
        }
        if !inst.requests.contains_key(&*s.request_id) {
            if self.in_flight >= self.cfg.max_requests {
                self.evict_oldest(now_ns, out);
            }
            self.insert_request(&s, now_ns);
        }
        let Some(inst) = self.instances.get_mut(&s.instance) else {
            return;
        };
        let Some(st) = inst.requests.get_mut(&*s.request_id) else {
            return;
        };
        st.updated_ns = now_ns;
        st.first_start_ns = st.first_start_ns.min(s.start_ns);
        st.last_end_ns = st.last_end_ns.max(s.end_ns);
        if st.session_id.is_none() {
            st.session_id = s.session_id.as_deref().map(Arc::from);
        }
        match &s.body {
            Body::Queue(q) => {
                st.admitted = true;
                let as_of = s.end_ns;
                if as_of >= st.as_of_ns {
                    st.as_of_ns = as_of;
                    let occ = Occupant {
                        state: RowState::Prefill,
                        request_id: st.request_id.clone(),
                        trace_id: s.trace_id,
                        session_id: st.session_id.clone(),
                        since_ns: s.end_ns,
                        leg_index: 0,
                        request_start_ns: s.start_ns,
                        first_token_ns: None,
                        last_token_ns: None,
                        leg_start_ns: s.end_ns,
                        tokens_generated: 0,
                        tokens_carried: 0,
                        prefill: None,
                        drafted_tokens: st.drafts.drafted,
                        accepted_tokens: st.drafts.accepted,
                    };
                    move_to_row(inst, st_key(&s), q.key, occ, None, now_ns);
                    self.dirty = true;
                }
            }
            Body::Prefill(_) => {
                st.admitted = true;
            }
            Body::PrefillWindow(p) => {
                st.admitted = true;
                if st.root.is_some() {
                    out.late_spans += 1;
                } else if p.last_chunk_ns >= st.as_of_ns
                    && let Some(key) = p.key.or(st.row)
                {
                    st.as_of_ns = p.last_chunk_ns;
                    let held = st
                        .row
                        .and_then(|k| inst.rows.get(&k))
                        .and_then(|r| r.occupant.as_ref())
                        .filter(|o| o.request_id == st.request_id);
                    let occ = prefill_occupant(st, &s, p, held);
                    move_to_row(inst, st_key(&s), key, occ, None, now_ns);
                    self.dirty = true;
                }
            }
            Body::Decode(d) => {
                st.admitted = true;
                if st.root.is_some() || st.leg_ended(d.leg_index) {
                    // Its leg (or the whole request) is over: the row has moved on.
                    out.late_spans += 1;
                } else {
                    // Every window counts its own steps' drafts, whatever order windows
                    // arrive in (of two choices, say); only the newest moves the row.
                    st.drafts.add(d);
                    if d.last_token_ns >= st.as_of_ns {
                        st.as_of_ns = d.last_token_ns;
                        st.decoded = Some((d.tokens_generated, d.first_token_ns, d.last_token_ns));
                        let occ = decode_occupant(st, &s, d);
                        let rate = window_rate(&s, d);
                        move_to_row(inst, st_key(&s), d.key, occ, rate, now_ns);
                        self.dirty = true;
                    } else if let Some(o) = st
                        .row
                        .and_then(|k| inst.rows.get_mut(&k))
                        .and_then(|r| r.occupant.as_mut())
                        .filter(|o| o.request_id == st.request_id)
                    {
                        o.drafted_tokens = st.drafts.drafted;
                        o.accepted_tokens = st.drafts.accepted;
                        self.dirty = true;
                    }
                }
            }
            Body::Leg(l) => {
                st.legs.push(TurnLeg::from_span(l, s.start_ns, s.end_ns));
                // The leg is over: its row no longer holds the request (a later leg, or the
                // request span, takes over).
                if let Some(row) = inst.rows.get_mut(&l.key)
                    && row.release(&s.request_id, Some(l.leg_index), now_ns)
                {
                    self.dirty = true;
                }
                if st.root.is_some() && legs_complete(st) {
                    let id = st.request_id.clone();
                    self.finish(&s.instance, &id, now_ns, out);
                }
            }
            Body::Request(r) => {
                if r.sampling_ratio.is_some() && r.sampling_ratio != inst.sampling_ratio {
                    inst.sampling_ratio = r.sampling_ratio;
                    self.dirty = true;
                }
                let st_row = st.row.take();
                if let Some(k) = st_row
                    && let Some(row) = inst.rows.get_mut(&k)
                    && row.release(&s.request_id, None, now_ns)
                {
                    self.dirty = true;
                }
                st.root = Some(Box::new(s.clone()));
                let id = st.request_id.clone();
                if legs_complete(st) {
                    self.finish(&s.instance, &id, now_ns, out);
                } else {
                    let deadline = now_ns.saturating_add(self.cfg.legs_wait_ns);
                    self.waiting.push_back((deadline, s.instance.clone(), id));
                }
            }
        }
    }

    fn insert_request(&mut self, s: &EngineSpan, now_ns: i64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let id: Arc<str> = Arc::from(&*s.request_id);
        let Some(inst) = self.instances.get_mut(&s.instance) else {
            return;
        };
        inst.requests.insert(
            id.clone(),
            RequestState {
                request_id: id.clone(),
                session_id: s.session_id.as_deref().map(Arc::from),
                seq,
                updated_ns: now_ns,
                row: None,
                as_of_ns: i64::MIN,
                decoded: None,
                drafts: DraftSums::default(),
                admitted: false,
                legs: Vec::new(),
                root: None,
                trace_id: s.trace_id,
                first_start_ns: s.start_ns,
                last_end_ns: s.end_ns,
            },
        );
        self.in_flight += 1;
        self.order.push_back((s.instance.clone(), id, seq));
        // Entries of requests that finished normally stay in `order` until popped; keep the
        // queue proportional to what is live.
        if self.order.len() > 2 * self.cfg.max_requests + 1024 {
            let instances = &self.instances;
            self.order.retain(|(i, r, seq)| {
                instances
                    .get(i)
                    .and_then(|inst| inst.requests.get(r))
                    .is_some_and(|st| st.seq == *seq)
            });
        }
    }

    /// Writes the request's turn record and forgets it.
    fn finish(&mut self, instance: &Arc<str>, request_id: &str, now_ns: i64, out: &mut Outputs) {
        let cap = self.cfg.finished_memory;
        let Some(inst) = self.instances.get_mut(instance) else {
            return;
        };
        let Some(mut st) = inst.requests.remove(request_id) else {
            return;
        };
        self.in_flight -= 1;
        inst.release_row(&st, now_ns);
        inst.remember_finished(st.request_id.clone(), cap);
        if let Some(root) = st.root.take()
            && let Body::Request(req) = &root.body
        {
            out.turns
                .push(TurnRecord::build(&root, req, std::mem::take(&mut st.legs)));
        }
        self.dirty = true;
    }

    fn evict(&mut self, instance: &Arc<str>, request_id: &str, now_ns: i64, out: &mut Outputs) {
        let has_root = self
            .instances
            .get(instance)
            .and_then(|i| i.requests.get(request_id))
            .is_some_and(|st| st.root.is_some());
        if has_root {
            // Its request span is here: write the record with the legs we have.
            self.finish(instance, request_id, now_ns, out);
            return;
        }
        let cap = self.cfg.finished_memory;
        let Some(inst) = self.instances.get_mut(instance) else {
            return;
        };
        if let Some(st) = inst.requests.remove(request_id) {
            self.in_flight -= 1;
            inst.release_row(&st, now_ns);
            inst.remember_finished(st.request_id.clone(), cap);
            self.dirty = true;
            // Its request span never came: a record of what did, marked incomplete.
            let seen = PartialTurn {
                instance: instance.clone(),
                service_version: inst.version.clone(),
                request_id: st.request_id.clone(),
                session_id: st.session_id.clone(),
                trace_id: st.trace_id,
                start_ns: st.first_start_ns,
                end_ns: st.last_end_ns,
            };
            out.turns.push(TurnRecord::partial(seen, st.legs));
        }
    }

    fn evict_oldest(&mut self, now_ns: i64, out: &mut Outputs) {
        while let Some((inst, req, seq)) = self.order.pop_front() {
            let live = self
                .instances
                .get(&inst)
                .and_then(|i| i.requests.get(&req))
                .is_some_and(|st| st.seq == seq);
            if live {
                self.evict(&inst, &req, now_ns, out);
                out.evicted_capacity += 1;
                return;
            }
        }
    }

    /// Time-driven work: records whose legs did not all arrive, TTL eviction, forgotten
    /// instances. Call it every publish interval.
    pub fn tick(&mut self, now_ns: i64, out: &mut Outputs) {
        while self.waiting.front().is_some_and(|(d, _, _)| *d <= now_ns) {
            if let Some((_, inst, req)) = self.waiting.pop_front() {
                self.finish(&inst, &req, now_ns, out);
            }
        }
        if now_ns - self.last_sweep_ns < 1_000_000_000 {
            return;
        }
        self.last_sweep_ns = now_ns;
        let ttl = self.cfg.request_ttl_ns;
        let stale: Vec<(Arc<str>, Arc<str>)> = self
            .instances
            .iter()
            .flat_map(|(id, inst)| {
                inst.requests
                    .values()
                    .filter(move |st| now_ns - st.updated_ns > ttl)
                    .map(move |st| (id.clone(), st.request_id.clone()))
            })
            .collect();
        for (inst, req) in stale {
            self.evict(&inst, &req, now_ns, out);
            out.evicted_ttl += 1;
        }
        let before = self.instances.len();
        let ittl = self.cfg.instance_ttl_ns;
        self.instances
            .retain(|_, i| !i.requests.is_empty() || now_ns - i.last_seen_ns <= ittl);
        if self.instances.len() != before {
            self.dirty = true;
        }
    }

    /// The slot view as of now.
    pub fn snapshot(&self) -> SlotsSnapshot {
        SlotsSnapshot {
            instances: self
                .instances
                .iter()
                .map(|(id, inst)| InstanceSnapshot {
                    instance: id.clone(),
                    service_version: inst.version.clone(),
                    last_seen_ns: inst.last_seen_ns,
                    sampling_ratio: inst.sampling_ratio,
                    running: inst
                        .requests
                        .values()
                        .filter(|st| st.admitted && st.root.is_none())
                        .count() as u64,
                    rows: inst.rows.values().cloned().collect(),
                })
                .collect(),
        }
    }
}

fn st_key(s: &EngineSpan) -> &str {
    &s.request_id
}

/// Whether every leg the request span announces has arrived, counting distinct leg indices
/// (a leg span sent twice is one leg), as the turn record does.
fn legs_complete(st: &RequestState) -> bool {
    let Some(root) = &st.root else {
        return false;
    };
    let Body::Request(req) = &root.body else {
        return true;
    };
    let distinct = st
        .legs
        .iter()
        .map(|l| l.index)
        .collect::<HashSet<i64>>()
        .len();
    req.legs
        .is_none_or(|n| i64::try_from(distinct).unwrap_or(i64::MAX) >= n)
}

fn decode_occupant(st: &RequestState, s: &EngineSpan, d: &DecodeSpan) -> Occupant {
    Occupant {
        state: RowState::Decoding,
        request_id: st.request_id.clone(),
        trace_id: s.trace_id,
        session_id: st.session_id.clone(),
        since_ns: d.leg_start_ns,
        leg_index: d.leg_index,
        request_start_ns: d.request_start_ns,
        first_token_ns: d.first_token_ns,
        last_token_ns: Some(d.last_token_ns),
        leg_start_ns: d.leg_start_ns,
        tokens_generated: d.tokens_generated,
        tokens_carried: d.tokens_carried,
        prefill: None,
        drafted_tokens: st.drafts.drafted,
        accepted_tokens: st.drafts.accepted,
    }
}

/// A prefilling request's occupancy from its latest prefill window. What the request's decode
/// windows said (its tokens so far and first token, before a preemption's re-prefill) stays.
fn prefill_occupant(
    st: &RequestState,
    s: &EngineSpan,
    p: &PrefillWindowSpan,
    held: Option<&Occupant>,
) -> Occupant {
    Occupant {
        state: RowState::Prefill,
        request_id: st.request_id.clone(),
        trace_id: s.trace_id,
        session_id: st.session_id.clone(),
        since_ns: held.map_or(p.prefill_start_ns, |o| o.since_ns),
        leg_index: p.leg_index,
        request_start_ns: p.request_start_ns,
        first_token_ns: st.decoded.and_then(|d| d.1),
        last_token_ns: st.decoded.map(|d| d.2),
        leg_start_ns: held.map_or(p.prefill_start_ns, |o| o.leg_start_ns),
        tokens_generated: st
            .decoded
            .map_or(p.tokens_carried, |d| d.0.max(p.tokens_carried)),
        tokens_carried: p.tokens_carried,
        prefill: Some(PrefillProgress {
            total: p.total,
            cached: p.cached,
            processed: p.processed,
            start_ns: p.prefill_start_ns,
            last_chunk_ns: p.last_chunk_ns,
        }),
        drafted_tokens: st.drafts.drafted,
        accepted_tokens: st.drafts.accepted,
    }
}

/// The window's own rate (tokens in the window over its length), for the sparkline.
fn window_rate(s: &EngineSpan, d: &DecodeSpan) -> Option<f64> {
    let n = d.window_tokens?;
    let dt = d.last_token_ns - s.start_ns;
    if n < 1 || dt <= 0 {
        return None;
    }
    #[allow(clippy::cast_precision_loss)] // counts and ns of one window
    Some(n as f64 / (dt as f64 / 1e9))
}

/// Puts the request in row `key`, releasing the row it held before.
fn move_to_row(
    inst: &mut Instance,
    request_id: &str,
    key: SlotKey,
    occ: Occupant,
    rate: Option<f64>,
    now_ns: i64,
) {
    let Some(st) = inst.requests.get_mut(request_id) else {
        return;
    };
    if let Some(prev) = st.row
        && prev != key
        && let Some(row) = inst.rows.get_mut(&prev)
    {
        row.release(request_id, None, now_ns);
    }
    if !inst.rows.contains_key(&key) && inst.rows.len() >= MAX_ROWS {
        // A sender inventing slot indices cannot grow the view without bound.
        st.row = None;
        return;
    }
    let row = inst
        .rows
        .entry(key)
        .or_insert_with(|| Row::new(key, now_ns));
    if row.occupy(occ, now_ns) {
        st.row = Some(key);
        if let Some(r) = rate {
            row.push_rate(r);
        }
    } else {
        st.row = None;
    }
}

/// Where the assembly task publishes.
#[derive(Debug, Clone)]
pub struct Published {
    /// The latest slot snapshot.
    pub slots: watch::Receiver<Arc<SlotsSnapshot>>,
    /// The ring of recent turns.
    pub turns: Arc<TurnStore>,
    /// Each new turn, as it is written.
    pub turn_events: broadcast::Sender<Arc<TurnRecord>>,
}

/// The assembly task's ends.
pub struct Assembly {
    /// The assembler that applies each batch of converted spans to the slots and turns.
    pub assembler: Assembler,
    /// Where each new snapshot of the slots is published for the views.
    pub slots_tx: watch::Sender<Arc<SlotsSnapshot>>,
    /// Where views read.
    pub published: Published,
    /// The live sessions, each observed once when it ends.
    pub sessions: SessionTracker,
}

impl Assembly {
    /// A new assembly with its publication channels.
    pub fn new(cfg: AssemblyConfig, turns_capacity: usize) -> Self {
        let (slots_tx, slots_rx) = watch::channel(Arc::new(SlotsSnapshot::default()));
        let (turn_events, _) = broadcast::channel(1024);
        Assembly {
            sessions: SessionTracker::new(cfg.session_idle_ns, MAX_LIVE_SESSIONS),
            assembler: Assembler::new(cfg),
            slots_tx,
            published: Published {
                slots: slots_rx,
                turns: Arc::new(TurnStore::new(turns_capacity)),
                turn_events,
            },
        }
    }
}

/// Writes one JSON line per turn on stdout from its own thread, so a stalled stdout never
/// stalls the assembly (lines are dropped, with a warning, when it falls behind).
#[derive(Debug, Clone)]
pub struct TurnLog {
    tx: std::sync::mpsc::SyncSender<Arc<TurnRecord>>,
}

impl TurnLog {
    /// Starts the writer thread.
    pub fn stdout() -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Arc<TurnRecord>>(4096);
        std::thread::Builder::new()
            .name("turn-log".into())
            .spawn(move || {
                use std::io::Write;
                let stdout = std::io::stdout();
                let mut w = std::io::BufWriter::new(stdout.lock());
                while let Ok(t) = rx.recv() {
                    if !write_line(&mut w, &t) {
                        return;
                    }
                    // Flush whenever the queue is drained, so lines appear promptly.
                    while let Ok(t) = rx.try_recv() {
                        if !write_line(&mut w, &t) {
                            return;
                        }
                    }
                    if w.flush().is_err() {
                        return;
                    }
                }
            })?;
        Ok(TurnLog { tx })
    }

    /// Queues a record; false when the writer is behind (the line is dropped).
    pub fn offer(&self, t: Arc<TurnRecord>) -> bool {
        self.tx.try_send(t).is_ok()
    }
}

/// Writes one turn as a JSON line; false when stdout is gone. A record that does not
/// serialize is reported (with its request id) and skipped, never written as an empty line.
fn write_line(w: &mut impl std::io::Write, t: &TurnRecord) -> bool {
    match serde_json::to_vec(t) {
        Ok(mut line) => {
            line.push(b'\n');
            w.write_all(&line).is_ok()
        }
        Err(e) => {
            tracing::error!(error = %e, request_id = %t.request_id, "TurnLog.Unserializable");
            true
        }
    }
}

/// The assembly task: applies batches until the channel closes.
pub async fn run(
    mut rx: mpsc::Receiver<Batch>,
    assembly: Assembly,
    metrics: Arc<Metrics>,
    turn_log: Option<TurnLog>,
    store: Option<TurnWriter>,
    publish_interval: Duration,
) {
    let Assembly {
        mut assembler,
        slots_tx,
        published,
        mut sessions,
    } = assembly;
    let mut tick = tokio::time::interval(publish_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Outputs::default();
    let mut warned_log = false;
    let mut warned_store = false;
    // Leading-edge throttle: a change is published at once when the last publication is older
    // than the interval (an idle sidecar shows a window within milliseconds), otherwise at the
    // next tick (a busy one publishes at most once per interval).
    let mut last_publish = tokio::time::Instant::now();
    let publish = |asm: &mut Assembler, last: &mut tokio::time::Instant| {
        if asm.take_dirty() {
            slots_tx.send_replace(Arc::new(asm.snapshot()));
            *last = tokio::time::Instant::now();
        }
    };
    loop {
        tokio::select! {
            batch = rx.recv() => {
                let Some(batch) = batch else { break };
                assembler.apply(batch.spans, crate::base::vocab::unix_now_ns(), &mut out);
                drop(batch.permit);
                if last_publish.elapsed() >= publish_interval {
                    publish(&mut assembler, &mut last_publish);
                }
            }
            _ = tick.tick() => {
                let now = crate::base::vocab::unix_now_ns();
                assembler.tick(now, &mut out);
                publish(&mut assembler, &mut last_publish);
                metrics.set_traces_in_flight(assembler.in_flight());
                for s in sessions.ended(now) {
                    metrics.observe_session(&s, now);
                }
            }
        }
        if out.evicted_capacity + out.evicted_ttl > 0 {
            metrics.count_evicted(EvictReason::Capacity, out.evicted_capacity);
            metrics.count_evicted(EvictReason::Ttl, out.evicted_ttl);
            out.evicted_capacity = 0;
            out.evicted_ttl = 0;
        }
        metrics.count_late(std::mem::take(&mut out.late_spans));
        for t in out.turns.drain(..) {
            metrics.observe_turn(&t);
            if let (Some(session), Some(extends)) = (&t.session_id, &t.session_extends) {
                published.turns.link(&t.instance, extends, session);
            }
            let now = crate::base::vocab::unix_now_ns();
            for s in sessions.record(&t, now) {
                metrics.observe_session(&s, now);
            }
            let t = Arc::new(t);
            published.turns.push(t.clone());
            let _ = published.turn_events.send(t.clone());
            if let Some(w) = &store
                && !w.offer(t.clone())
            {
                metrics.count_turn_not_stored();
                if !warned_store {
                    warned_store = true;
                    tracing::warn!(
                        "TurnStore.Behind: the store is not keeping up; turns not stored are counted in slotlight_sidecar_turns_not_stored_total"
                    );
                }
            }
            if let Some(log) = &turn_log
                && !log.offer(t)
                && !warned_log
            {
                warned_log = true;
                tracing::warn!("TurnLog.Behind: stdout is not keeping up; dropping turn lines");
            }
        }
    }
    assembler.dirty = true;
    publish(&mut assembler, &mut last_publish);
}

#[cfg(test)]
mod tests;
