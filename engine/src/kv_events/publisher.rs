//! The publisher thread: owns the PUB and ROUTER sockets, numbers nothing (the sink did),
//! encodes, sends, and keeps the latest batches for replay.
//!
//! Replay, as vLLM's: a client (DEALER or REQ) sends the first sequence number it wants as 8
//! bytes big-endian; the ROUTER socket receives `[identity, "", start]` and answers, for each
//! kept batch from `start` on, `[identity, "", sequence, payload]`, then
//! `[identity, "", -1 (8 bytes, signed), ""]` to end.

use std::collections::VecDeque;

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

async fn open(cfg: &KvEventsConfig) -> Result<(PubSocket, Option<RouterSocket>), PublisherError> {
    let mut publ = PubSocket::new();
    match bind_target(&cfg.endpoint) {
        Some(addr) => {
            publ.bind(&addr)
                .await
                .map_err(|source| PublisherError::Socket {
                    what: "bind",
                    endpoint: cfg.endpoint.clone(),
                    source,
                })?;
        }
        None => {
            publ.connect(&cfg.endpoint)
                .await
                .map_err(|source| PublisherError::Socket {
                    what: "connect",
                    endpoint: cfg.endpoint.clone(),
                    source,
                })?;
        }
    }
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

async fn run(
    cfg: KvEventsConfig,
    mut publ: PubSocket,
    mut router: Option<RouterSocket>,
    mut rx: mpsc::Receiver<Batch>,
) {
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    let mut ring = Ring::new(REPLAY_BATCHES);
    loop {
        tokio::select! {
            batch = rx.recv() => {
                let Some(batch) = batch else { break };
                let payload = Bytes::from(wire::encode(&batch, cfg.block_size, cfg.data_parallel_rank));
                let seq = Bytes::copy_from_slice(&batch.seq.to_be_bytes());
                if let Ok(msg) = ZmqMessage::try_from(vec![topic.clone(), seq, payload.clone()])
                    && let Err(e) = publ.send(msg).await
                {
                    tracing::debug!(error = %e, "KvEvents.SendFailed");
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

/// Opens the sockets and starts the publisher thread; the sink feeds it.
pub fn start(cfg: KvEventsConfig) -> Result<KvEventSink, PublisherError> {
    let (tx, rx) = mpsc::channel(QUEUE_BATCHES);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let topic = cfg.topic.clone();
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
                        let _ = ready_tx.send(Ok(()));
                        run(cfg, publ, router, rx).await;
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
    Ok(KvEventSink::new(tx, topic))
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
