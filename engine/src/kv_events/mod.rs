//! KV-cache events in vLLM's wire format, for cache-aware routers (llm-d's precise
//! prefix-cache scorer) and anyone else who mirrors the prefix cache.
//!
//! The step loops record prefix-cache changes where they happen ([`crate::kv_cache`]) and,
//! after each step (and before answering a request), hand them to a bounded channel with
//! `try_send` ([`KvEventSink::submit`]): the loop never waits on the network. The publisher
//! thread ([`publisher`]) owns the ZMQ sockets: it encodes each batch, sends it on the PUB
//! socket as `[topic, sequence (8 bytes big-endian), msgpack EventBatch]`, keeps the latest
//! batches for replay and answers replay requests on the ROUTER socket.
//!
//! Sequence numbers are taken when a batch is handed over, so a batch dropped because the
//! channel is full still takes its number: subscribers see the gap. The next batch each
//! group hands over is then `AllBlocksCleared` (from the first group only) followed by the
//! group's whole cache, so a subscriber that could not replay resynchronises. The wire layout
//! and the block hash are documented in docs/api.md.

pub mod publisher;
pub mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::mpsc;

use crate::kv_cache::KvEvent;

/// Batches the channel to the publisher holds; beyond it a batch is dropped (and counted).
pub const QUEUE_BATCHES: usize = 4096;

/// Batches kept for replay.
pub const REPLAY_BATCHES: usize = 10_000;

/// Where and how the engine publishes its KV events.
#[derive(Debug, Clone)]
pub struct KvEventsConfig {
    /// The PUB socket: `tcp://*:PORT` (or `0.0.0.0`, `[::]`) binds; any other host is
    /// connected to (a subscriber that binds, as llm-d's endpoint picker does).
    pub endpoint: String,
    /// The ROUTER socket that resends batches from a sequence number (always binds).
    pub replay_endpoint: Option<String>,
    /// The first frame of every message.
    pub topic: String,
    /// The third element of every batch.
    pub data_parallel_rank: u32,
    /// The block size every `BlockStored` carries.
    pub block_size: usize,
}

/// The topic llm-d expects: `kv@<instance>@<model>`, where the instance names the pod as the
/// router addresses it (llm-d's precise scorer: `<pod IP>:<port>`).
pub fn default_topic(instance: &str, model: &str) -> String {
    format!("kv@{instance}@{model}")
}

/// One batch as handed to the publisher.
#[derive(Debug)]
pub struct Batch {
    /// Its sequence number.
    pub seq: u64,
    /// Seconds since the Unix epoch when it was handed over.
    pub ts: f64,
    /// Its events, in order.
    pub events: Vec<KvEvent>,
}

/// What `/health` says of the stream.
#[derive(Debug, Clone, Serialize)]
pub struct KvEventsStatus {
    /// The topic.
    pub topic: String,
    /// The sequence number of the latest batch handed over (published or dropped).
    pub sequence: u64,
    /// Batches dropped because the publisher fell behind.
    pub dropped: u64,
    /// Batches the publisher could not send: handed over while the endpoint's connect form
    /// was not connected yet (the subscriber not up), or whose send failed. They are kept for
    /// replay all the same.
    pub unsent: u64,
    /// Whether the PUB socket is bound or connected.
    pub connected: bool,
    /// Time the step loops have spent handing their changes over (taking them from the
    /// block manager and submitting them), in seconds: what publishing costs decode.
    pub handoff_seconds: f64,
}

#[derive(Debug)]
struct State {
    next_seq: u64,
    /// Whether the current resync epoch's `AllBlocksCleared` was sent.
    cleared: bool,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::Sender<Batch>,
    state: Mutex<State>,
    /// Bumped on every dropped batch: each group restates its cache when it sees a new epoch.
    epoch: AtomicU64,
    dropped: AtomicU64,
    /// Nanoseconds the step loops spent in hand-offs ([`KvEventSink::record_handoff`]).
    handoff_ns: AtomicU64,
    topic: String,
    /// What the publisher could not send, and whether its socket is up.
    delivery: Arc<publisher::Delivery>,
}

/// The step loops' end of the stream (cheap to clone).
#[derive(Debug, Clone)]
pub struct KvEventSink {
    inner: Arc<Inner>,
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl KvEventSink {
    /// A sink over `tx`; its first batch (sequence 0) is `AllBlocksCleared`, so a subscriber
    /// that sees it knows the engine started empty.
    pub fn new(tx: mpsc::Sender<Batch>, topic: String) -> Self {
        Self::reporting(tx, topic, Arc::default())
    }

    /// A sink over `tx` whose publisher reports its deliveries to `delivery`.
    pub(crate) fn reporting(
        tx: mpsc::Sender<Batch>,
        topic: String,
        delivery: Arc<publisher::Delivery>,
    ) -> Self {
        let s = Self {
            inner: Arc::new(Inner {
                tx,
                state: Mutex::new(State {
                    next_seq: 0,
                    cleared: true,
                }),
                epoch: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                handoff_ns: AtomicU64::new(0),
                topic,
                delivery,
            }),
        };
        let mut epoch = 0;
        s.submit(&mut epoch, vec![KvEvent::Cleared], Vec::new);
        s
    }

    /// The current resync epoch (a group starts at it).
    pub fn epoch(&self) -> u64 {
        self.inner.epoch.load(Ordering::Acquire)
    }

    /// Hands over a group's `events`. When a batch was dropped since the group last restated
    /// (`group_epoch` behind), its cache as `restate` gives it replaces the events (it already
    /// holds their effect), after an `AllBlocksCleared` if no group has sent one for this
    /// drop yet. Never blocks on the publisher.
    pub fn submit(
        &self,
        group_epoch: &mut u64,
        events: Vec<KvEvent>,
        restate: impl FnOnce() -> Vec<KvEvent>,
    ) {
        let inner = &*self.inner;
        if events.is_empty() && inner.epoch.load(Ordering::Acquire) == *group_epoch {
            return;
        }
        let Ok(mut st) = inner.state.lock() else {
            return;
        };
        let epoch = inner.epoch.load(Ordering::Acquire);
        let events = if epoch == *group_epoch {
            events
        } else {
            *group_epoch = epoch;
            let mut all = Vec::new();
            if !st.cleared {
                all.push(KvEvent::Cleared);
                st.cleared = true;
            }
            all.extend(restate());
            all
        };
        if events.is_empty() {
            return;
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let batch = Batch {
            seq,
            ts: now_s(),
            events,
        };
        if inner.tx.try_send(batch).is_err() {
            // The number is spent: subscribers see a gap, then the restatement.
            st.cleared = false;
            inner.epoch.fetch_add(1, Ordering::AcqRel);
            if inner.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(seq, "KvEvents.BatchDropped");
            }
        }
    }

    /// Adds one step loop hand-off's duration to [`KvEventsStatus::handoff_seconds`].
    pub fn record_handoff(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.inner.handoff_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The stream's topic, latest sequence number and drops.
    pub fn status(&self) -> KvEventsStatus {
        let next = self.inner.state.lock().map_or(0, |s| s.next_seq);
        KvEventsStatus {
            topic: self.inner.topic.clone(),
            sequence: next.saturating_sub(1),
            dropped: self.inner.dropped.load(Ordering::Relaxed),
            unsent: self.inner.delivery.unsent.load(Ordering::Relaxed),
            connected: self.inner.delivery.ready.load(Ordering::Relaxed),
            handoff_seconds: Duration::from_nanos(self.inner.handoff_ns.load(Ordering::Relaxed))
                .as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(h: u64) -> KvEvent {
        KvEvent::Stored {
            hashes: vec![h],
            parent: None,
            tokens: vec![1, 2],
        }
    }

    #[test]
    fn sequence_numbers_are_taken_by_dropped_batches_and_a_restatement_follows() {
        let (tx, mut rx) = mpsc::channel(2);
        let sink = KvEventSink::new(tx, "kv@a@m".into());
        let mut epoch = sink.epoch();
        // Nothing to say: no batch, no number.
        sink.submit(&mut epoch, Vec::new(), Vec::new);
        sink.submit(&mut epoch, vec![stored(1)], Vec::new);
        // The channel (2) is full: this one is dropped, but takes number 2.
        sink.submit(&mut epoch, vec![stored(2)], Vec::new);
        assert_eq!(sink.status().sequence, 2);
        assert_eq!(sink.status().dropped, 1);
        let b0 = rx.try_recv().expect("batch 0");
        assert_eq!((b0.seq, b0.events.clone()), (0, vec![KvEvent::Cleared]));
        let b1 = rx.try_recv().expect("batch 1");
        assert_eq!((b1.seq, b1.events), (1, vec![stored(1)]));
        // The next hand-over, even with nothing new, clears and restates the cache.
        sink.submit(&mut epoch, Vec::new(), || vec![stored(1), stored(2)]);
        let b3 = rx.try_recv().expect("batch 3");
        assert_eq!(b3.seq, 3);
        assert_eq!(b3.events, vec![KvEvent::Cleared, stored(1), stored(2)]);
        // Back in step: a second group restates without clearing again.
        let mut other = 0;
        sink.submit(&mut other, Vec::new(), || vec![stored(7)]);
        assert_eq!(rx.try_recv().expect("batch 4").events, vec![stored(7)]);
        sink.submit(&mut epoch, vec![stored(3)], || panic!("no restatement"));
        assert_eq!(rx.try_recv().expect("batch 5").events, vec![stored(3)]);
    }

    #[test]
    fn hand_off_time_adds_up_across_step_loops() {
        let (tx, _rx) = mpsc::channel(2);
        let sink = KvEventSink::new(tx, "kv@a@m".into());
        assert_eq!(sink.status().handoff_seconds, 0.0);
        let other = sink.clone();
        sink.record_handoff(Duration::from_micros(1500));
        other.record_handoff(Duration::from_micros(500));
        assert!((sink.status().handoff_seconds - 0.002).abs() < 1e-12);
    }
}
