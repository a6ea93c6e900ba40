//! The publisher thread: owns the PUB and ROUTER sockets, numbers nothing (the sink did),
//! encodes, sends, and keeps the latest batches for replay.
//!
//! Replay, as vLLM's: a client (DEALER or REQ) sends the first sequence number it wants as 8
//! bytes big-endian; the ROUTER socket receives `[identity, "", start]` and answers, for each
//! kept batch from `start` on, `[identity, "", sequence, payload]`, then
//! `[identity, "", -1 (8 bytes, signed), ""]` to end.
//!
//! An endpoint in its connect form (a central subscriber that binds, as llm-d's endpoint
//! picker does) need not be up when the engine starts: like libzmq's connect, the publisher
//! starts at once and keeps trying in the background (every [`RETRY`]); the batches handed
//! over meanwhile are kept for replay and counted as not sent (`/health`'s
//! `kv_events.unsent`). A bind that fails still stops the engine: that endpoint is its own.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::{Batch, KvEventSink, KvEventsConfig, QUEUE_BATCHES, REPLAY_BATCHES, wire};

/// The publisher could not start.
#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    /// A socket could not bind or connect.
    #[error("KV events: {what} {endpoint}: {source}")]
    Socket {
        /// `bind` or `connect`.
        what: &'static str,
        /// The endpoint.
        endpoint: String,
        /// Why.
        source: zeromq::ZmqError,
    },
    /// The thread or its runtime could not start.
    #[error("KV events: {0}")]
    Start(String),
}

/// Whether the PUB socket binds `endpoint` (a wildcard host) rather than connecting to it,
/// and the address to use (`*` becomes `0.0.0.0`).
pub fn bind_target(endpoint: &str) -> Option<String> {
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, port) = rest.rsplit_once(':')?;
    match host {
        "*" | "0.0.0.0" => Some(format!("tcp://0.0.0.0:{port}")),
        "[::]" | "::" => Some(format!("tcp://[::]:{port}")),
        _ => None,
    }
}

/// The ROUTER socket's bind address (`*` becomes `0.0.0.0`).
fn replay_target(endpoint: &str) -> String {
    match endpoint.strip_prefix("tcp://*:") {
        Some(port) => format!("tcp://0.0.0.0:{port}"),
        None => endpoint.to_owned(),
    }
}

/// The batches kept for replay, oldest first.
#[derive(Debug, Default)]
pub struct Ring {
    kept: VecDeque<(u64, Bytes)>,
    cap: usize,
}

impl Ring {
    /// A ring of at most `cap` batches.
    pub fn new(cap: usize) -> Self {
        Self {
            kept: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// Keeps batch `seq`, dropping the oldest beyond the capacity.
    pub fn push(&mut self, seq: u64, payload: Bytes) {
        if self.kept.len() == self.cap {
            self.kept.pop_front();
        }
        self.kept.push_back((seq, payload));
    }

    /// The kept batches from `start` on.
    pub fn from(&self, start: u64) -> impl Iterator<Item = &(u64, Bytes)> {
        self.kept.iter().filter(move |(s, _)| *s >= start)
    }
}

/// The end-of-replay marker's sequence frame.
pub const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// The frames that answer replay request `req` (`[identity, "", start]`, or
/// `[identity, start]` without the delimiter), or none when it is not one.
pub fn replay_reply(ring: &Ring, req: &ZmqMessage) -> Vec<ZmqMessage> {
    let frames: Vec<&Bytes> = req.iter().collect();
    let (identity, delimited, start) = match frames.as_slice() {
        [id, empty, start] if empty.is_empty() => (*id, true, *start),
        [id, start] => (*id, false, *start),
        _ => return Vec::new(),
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
        return Vec::new();
    };
    let start = u64::from_be_bytes(start);
    let frame = |seq: Bytes, payload: Bytes| {
        let mut v = vec![identity.clone()];
        if delimited {
            v.push(Bytes::new());
        }
        v.push(seq);
        v.push(payload);
        // Unwrap is safe: the frames are never empty.
        ZmqMessage::try_from(v).expect("frames")
    };
    ring.from(start)
        .map(|(seq, payload)| frame(Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()))
        .chain(std::iter::once(frame(
            Bytes::from_static(&END_SEQ),
            Bytes::new(),
        )))
        .collect()
}

/// How long the publisher waits between two attempts to connect.
pub const RETRY: Duration = Duration::from_secs(1);

/// The PUB socket: bound now, or connecting in the background.
enum Pub {
    /// Ready to send (bound, or connected).
    Ready(PubSocket),
    /// Connecting: the task ends with the connected socket.
    Connecting(tokio::task::JoinHandle<PubSocket>),
}

/// Connects a PUB socket to `endpoint`, trying again every [`RETRY`] until it is up.
async fn connect(endpoint: String) -> PubSocket {
    let mut warned = false;
    loop {
        let mut publ = PubSocket::new();
        match publ.connect(&endpoint).await {
            Ok(()) => {
                tracing::info!(endpoint, "KvEvents.Connected");
                return publ;
            }
            Err(e) => {
                if !warned {
                    warned = true;
                    tracing::warn!(endpoint, error = %e, "KvEvents.NotConnected");
                }
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

async fn open(cfg: &KvEventsConfig) -> Result<(Pub, Option<RouterSocket>), PublisherError> {
    let publ = match bind_target(&cfg.endpoint) {
        Some(addr) => {
            let mut publ = PubSocket::new();
            publ.bind(&addr)
                .await
                .map_err(|source| PublisherError::Socket {
                    what: "bind",
                    endpoint: cfg.endpoint.clone(),
                    source,
                })?;
            Pub::Ready(publ)
        }
        None => Pub::Connecting(tokio::spawn(connect(cfg.endpoint.clone()))),
    };
    let mut router = None;
    if let Some(ep) = &cfg.replay_endpoint {
        let mut r = RouterSocket::new();
        r.bind(&replay_target(ep))
            .await
            .map_err(|source| PublisherError::Socket {
                what: "bind",
                endpoint: ep.clone(),
                source,
            })?;
        router = Some(r);
    }
    Ok((publ, router))
}

async fn recv_replay(router: &mut Option<RouterSocket>) -> Option<ZmqMessage> {
    match router {
        Some(r) => r.recv().await.ok(),
        None => std::future::pending().await,
    }
}

/// What the publisher tells the sink: batches it could not send, and whether its PUB socket
/// is up.
#[derive(Debug, Default)]
pub struct Delivery {
    /// Batches not sent: handed over while the connect form was not connected yet, or whose
    /// send failed.
    pub unsent: AtomicU64,
    /// Whether the PUB socket is bound or connected.
    pub ready: AtomicBool,
}

async fn connected(publ: &mut Pub) -> Option<PubSocket> {
    match publ {
        Pub::Connecting(task) => task.await.ok(),
        Pub::Ready(_) => std::future::pending().await,
    }
}

async fn run(
    cfg: KvEventsConfig,
    mut publ: Pub,
    mut router: Option<RouterSocket>,
    mut rx: mpsc::Receiver<Batch>,
    delivery: Arc<Delivery>,
) {
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    let mut ring = Ring::new(REPLAY_BATCHES);
    loop {
        tokio::select! {
            socket = connected(&mut publ) => {
                match socket {
                    Some(s) => {
                        publ = Pub::Ready(s);
                        delivery.ready.store(true, Ordering::Relaxed);
                    }
                    // The connecting task cannot fail; if it ever stops, try again.
                    None => publ = Pub::Connecting(tokio::spawn(connect(cfg.endpoint.clone()))),
                }
            }
            batch = rx.recv() => {
                let Some(batch) = batch else { break };
                let payload = Bytes::from(wire::encode(&batch, cfg.block_size, cfg.data_parallel_rank));
                let seq = Bytes::copy_from_slice(&batch.seq.to_be_bytes());
                let sent = match &mut publ {
                    Pub::Ready(p) => match ZmqMessage::try_from(vec![topic.clone(), seq, payload.clone()]) {
                        Ok(msg) => p.send(msg).await.map_err(|e| tracing::debug!(error = %e, "KvEvents.SendFailed")).is_ok(),
                        Err(_) => false,
                    },
                    Pub::Connecting(_) => false,
                };
                if !sent {
                    delivery.unsent.fetch_add(1, Ordering::Relaxed);
                }
                ring.push(batch.seq, payload);
            }
            req = recv_replay(&mut router) => {
                let Some(req) = req else { continue };
                if let Some(r) = router.as_mut() {
                    for msg in replay_reply(&ring, &req) {
                        if r.send(msg).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    }
}

/// Opens the sockets and starts the publisher thread; the sink feeds it. A PUB socket in its
/// connect form connects in the background; a bind that fails is an error.
pub fn start(cfg: KvEventsConfig) -> Result<KvEventSink, PublisherError> {
    let (tx, rx) = mpsc::channel(QUEUE_BATCHES);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let topic = cfg.topic.clone();
    let delivery = Arc::new(Delivery::default());
    let shared = Arc::clone(&delivery);
    std::thread::Builder::new()
        .name("slotlight-kv-events".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(PublisherError::Start(e.to_string())));
                    return;
                }
            };
            rt.block_on(async move {
                match open(&cfg).await {
                    Ok((publ, router)) => {
                        shared
                            .ready
                            .store(matches!(publ, Pub::Ready(_)), Ordering::Relaxed);
                        let _ = ready_tx.send(Ok(()));
                        run(cfg, publ, router, rx, shared).await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
        })
        .map_err(|e| PublisherError::Start(e.to_string()))?;
    ready_rx
        .recv()
        .map_err(|e| PublisherError::Start(e.to_string()))??;
    Ok(KvEventSink::reporting(tx, topic, delivery))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(frames: &[&[u8]]) -> ZmqMessage {
        ZmqMessage::try_from(
            frames
                .iter()
                .map(|f| Bytes::copy_from_slice(f))
                .collect::<Vec<_>>(),
        )
        .expect("frames")
    }

    #[test]
    fn replay_resends_from_the_asked_sequence_then_ends() {
        let mut ring = Ring::new(3);
        for s in 0..5u64 {
            ring.push(s, Bytes::copy_from_slice(&s.to_be_bytes()));
        }
        // Batches 0 and 1 fell out of the ring; asking from 1 gets 2, 3, 4 and the end.
        let reply = replay_reply(&ring, &req(&[b"id", b"", &1u64.to_be_bytes()]));
        let got: Vec<Vec<Vec<u8>>> = reply
            .iter()
            .map(|m| m.iter().map(|f| f.to_vec()).collect())
            .collect();
        let frame = |s: u64| {
            vec![
                b"id".to_vec(),
                Vec::new(),
                s.to_be_bytes().to_vec(),
                s.to_be_bytes().to_vec(),
            ]
        };
        assert_eq!(
            got,
            vec![
                frame(2),
                frame(3),
                frame(4),
                vec![b"id".to_vec(), Vec::new(), END_SEQ.to_vec(), Vec::new()],
            ]
        );
        assert_eq!(i64::from_be_bytes(END_SEQ), -1);
        // Without the delimiter the reply has none; a malformed request gets nothing.
        let bare = replay_reply(&ring, &req(&[b"id", &4u64.to_be_bytes()]));
        assert_eq!(bare.len(), 2);
        assert_eq!(bare[0].len(), 3);
        assert!(replay_reply(&ring, &req(&[b"id", b"", b"short"])).is_empty());
    }

    /// A free TCP port on 127.0.0.1 (nothing listens on it once this returns).
    fn free_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    }

    #[test]
    fn a_subscriber_not_up_yet_does_not_stop_the_engine() {
        let port = free_port();
        let endpoint = format!("tcp://127.0.0.1:{port}");
        let sink = start(KvEventsConfig {
            endpoint: endpoint.clone(),
            replay_endpoint: None,
            topic: "kv@t@m".into(),
            data_parallel_rank: 0,
            block_size: 16,
        })
        .expect("starts with nothing listening");
        // The first batch (AllBlocksCleared) was handed over with no one to send it to.
        let status = || sink.status();
        for _ in 0..400 {
            if status().unsent > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let s = status();
        assert!(!s.connected, "{s:?}");
        assert_eq!(s.unsent, 1, "{s:?}");
        // The subscriber comes up: the publisher connects on its own and batches flow.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            use zeromq::SubSocket;
            let mut sub = SubSocket::new();
            sub.bind(&endpoint).await.expect("bind the subscriber");
            sub.subscribe("kv@").await.expect("subscribe");
            let mut epoch = sink.epoch();
            let got = tokio::time::timeout(Duration::from_secs(60), async {
                loop {
                    // Batches go out once connected (a PUB drops them while no peer has
                    // subscribed): hand one over until one arrives.
                    sink.submit(
                        &mut epoch,
                        vec![crate::kv_cache::KvEvent::Cleared],
                        Vec::new,
                    );
                    if let Ok(Ok(m)) =
                        tokio::time::timeout(Duration::from_millis(200), sub.recv()).await
                    {
                        return m;
                    }
                }
            })
            .await
            .expect("a batch reached the subscriber");
            assert_eq!(got.get(0).map(|f| f.to_vec()), Some(b"kv@t@m".to_vec()));
        });
        assert!(sink.status().connected);
    }

    #[test]
    fn wildcard_hosts_bind_and_others_connect() {
        assert_eq!(
            bind_target("tcp://*:5557").as_deref(),
            Some("tcp://0.0.0.0:5557")
        );
        assert_eq!(bind_target("tcp://epp.default.svc:5557"), None);
        assert_eq!(bind_target("tcp://127.0.0.1:5557"), None);
    }
}
