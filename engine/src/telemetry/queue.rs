//! The span export queue: the engine's own span processor, which holds every ended span until
//! the collector has taken it, within explicit bounds, and counts exactly what it loses.
//!
//! - **Bounded** by span count and by bytes (an estimate of each span's encoded size), both
//!   configurable ([`QueueLimits`]). A span that would pass either bound is dropped at once and
//!   counted; nothing already queued is pushed out for it.
//! - **Retried**: a batch the exporter could not deliver stays at the head of the queue and is
//!   sent again after a backoff (doubling from 250 ms to 30 s, with jitter), until it is
//!   delivered, the collector refuses it for good, or shutdown's deadline passes. Within one
//!   attempt the OTLP exporter itself retries as the OTLP specification says (HTTP 429, 502,
//!   503, 504 and gRPC `UNAVAILABLE`, `RESOURCE_EXHAUSTED` with `RetryInfo` and the other
//!   retryable codes, honouring `Retry-After` and `RetryInfo` within the export timeout).
//! - **Refused for good** (an HTTP status or gRPC code the specification calls non-retryable,
//!   such as 400 or 401): the batch is dropped and counted; retrying would only repeat it.
//! - **Never in the way**: `on_end` takes a lock for a push; export runs on the queue's own
//!   thread, so a dead collector never slows serving.
//!
//! Every span is accounted for: `ended = exported + dropped + held` at every moment, where
//! `held` is what is queued or being sent.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry::Value;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

use super::ExportStats;

/// Bounds and timing of the span export queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Spans held at most (queued or being sent): `--otlp-queue-spans`, else
    /// `OTEL_BSP_MAX_QUEUE_SIZE`, else 65,536.
    pub max_spans: usize,
    /// Estimated encoded bytes held at most: `--otlp-queue-bytes`, else 64 MiB.
    pub max_bytes: usize,
    /// Spans per export request: `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, else 512.
    pub max_batch: usize,
    /// The longest a span waits for a batch to fill: `OTEL_BSP_SCHEDULE_DELAY` (ms), else 200 ms.
    pub delay: Duration,
}

impl Default for QueueLimits {
    fn default() -> Self {
        Self {
            max_spans: 65_536,
            max_bytes: 64 << 20,
            max_batch: 512,
            delay: Duration::from_millis(200),
        }
    }
}

impl QueueLimits {
    /// The defaults, overridden by the batch processor's standard variables where set.
    pub fn from_env() -> Self {
        let d = Self::default();
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
        };
        Self {
            max_spans: var("OTEL_BSP_MAX_QUEUE_SIZE").unwrap_or(d.max_spans).max(1),
            max_bytes: d.max_bytes,
            max_batch: var("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
                .unwrap_or(d.max_batch)
                .max(1),
            delay: var("OTEL_BSP_SCHEDULE_DELAY").map_or(d.delay, |ms| {
                Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
            }),
        }
    }
}

/// The longest `force_flush` waits for the queue to empty (a collector that is down keeps it
/// from emptying; the spans stay queued).
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// The first wait after a failed export, and the longest.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(30));

/// What the queue holds, under one lock.
#[derive(Default)]
struct State {
    queue: VecDeque<(SpanData, usize)>,
    /// Spans queued or being sent, and their estimated bytes.
    held: usize,
    held_bytes: usize,
    /// Flush generations: asked for, and done (every span ended before the ask was sent or lost).
    flush_asked: u64,
    flush_done: u64,
    /// Shutdown's deadline, once it began.
    shutdown: Option<Instant>,
    /// Whether a queue-full drop was already logged (cleared when the queue has room again).
    full_logged: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the export thread (a full batch, a flush, shutdown).
    wake: Condvar,
    /// Wakes flushers when a flush generation is done.
    done: Condvar,
    limits: QueueLimits,
    stats: Arc<ExportStats>,
    endpoint: String,
    /// Set by `on_end` when the queue first refuses a span; the export thread logs it.
    full_to_log: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Logs `Telemetry.QueueFull` once `on_end` has asked for it (on the export thread).
    fn log_full(&self) {
        if self.full_to_log.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                endpoint = %self.endpoint,
                max_spans = self.limits.max_spans,
                max_bytes = self.limits.max_bytes,
                "Telemetry.QueueFull: spans beyond the export queue's bound are dropped and counted (logged once until it has room)"
            );
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The span processor of an exporting engine (see the module documentation).
pub struct ExportQueue {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for ExportQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportQueue")
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

impl ExportQueue {
    /// Starts the queue's export thread around `exporter` (its resource already set).
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        limits: QueueLimits,
        stats: Arc<ExportStats>,
        endpoint: String,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            done: Condvar::new(),
            limits,
            stats,
            endpoint,
            full_to_log: std::sync::atomic::AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("slotlight-span-export".into())
            .spawn(move || run(&s, exporter))?;
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }
}

impl SpanProcessor for ExportQueue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let sh = &*self.shared;
        let bytes = encoded_size(&span);
        sh.stats.ended.fetch_add(1, Ordering::Relaxed);
        let mut st = sh.lock();
        if st.shutdown.is_some()
            || st.held + 1 > sh.limits.max_spans
            || st.held_bytes + bytes > sh.limits.max_bytes
        {
            sh.stats.dropped.fetch_add(1, Ordering::Relaxed);
            // Logged by the export thread, never here: `on_end` can run with the span's own
            // lock held, and a warning inside a request is copied onto its request span.
            if !std::mem::replace(&mut st.full_logged, true) {
                sh.full_to_log.store(true, Ordering::Relaxed);
            }
            return;
        }
        st.queue.push_back((span, bytes));
        st.held += 1;
        st.held_bytes += bytes;
        sh.stats.held.store(st.held as u64, Ordering::Relaxed);
        if st.queue.len() >= sh.limits.max_batch {
            sh.wake.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        let sh = &*self.shared;
        let mut st = sh.lock();
        st.flush_asked += 1;
        let asked = st.flush_asked;
        sh.wake.notify_one();
        let deadline = Instant::now() + FLUSH_WAIT;
        while st.flush_done < asked {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(OTelSdkError::Timeout(FLUSH_WAIT));
            }
            st = sh
                .done
                .wait_timeout(st, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        {
            let mut st = self.shared.lock();
            if st.shutdown.is_some() {
                return Err(OTelSdkError::AlreadyShutdown);
            }
            st.shutdown = Some(Instant::now() + timeout);
            self.shared.wake.notify_one();
        }
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(h) = handle {
            h.join()
                .map_err(|_| OTelSdkError::InternalFailure("the export thread panicked".into()))?;
        }
        Ok(())
    }
}

/// The export thread: batches, sends, retries, until shutdown.
fn run<E: SpanExporter>(sh: &Shared, exporter: E) {
    while let Some(batch) = next_batch(sh) {
        sh.log_full();
        let (n, bytes) = (batch.len(), batch.iter().map(|(_, b)| b).sum::<usize>());
        let spans: Vec<SpanData> = batch.into_iter().map(|(s, _)| s).collect();
        deliver(sh, &exporter, spans);
        let mut st = sh.lock();
        st.held -= n;
        st.held_bytes -= bytes;
        sh.stats.held.store(st.held as u64, Ordering::Relaxed);
        if st.held < sh.limits.max_spans {
            st.full_logged = false;
        }
    }
    sh.log_full();
    let _ = exporter.shutdown();
}

/// Waits for a batch to send: a full one, or whatever is queued once the delay has passed, a
/// flush is asked for, or shutdown began. Marks flushes done when nothing is held. `None`
/// when shut down with nothing left.
fn next_batch(sh: &Shared) -> Option<Vec<(SpanData, usize)>> {
    let mut st = sh.lock();
    let mut waited_since = Instant::now();
    loop {
        if st.held == 0 && st.flush_done < st.flush_asked {
            st.flush_done = st.flush_asked;
            sh.done.notify_all();
        }
        let flushing = st.flush_done < st.flush_asked;
        let due = st.queue.len() >= sh.limits.max_batch
            || flushing
            || st.shutdown.is_some()
            || waited_since.elapsed() >= sh.limits.delay;
        if due && !st.queue.is_empty() {
            let k = st.queue.len().min(sh.limits.max_batch);
            return Some(st.queue.drain(..k).collect());
        }
        if st.shutdown.is_some() {
            return None;
        }
        if waited_since.elapsed() >= sh.limits.delay {
            waited_since = Instant::now();
        }
        let left = sh.limits.delay.saturating_sub(waited_since.elapsed());
        st = sh
            .wake
            .wait_timeout(st, left.max(Duration::from_millis(1)))
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
}

/// Sends one batch until it is delivered, refused for good, or shutdown's deadline passes;
/// counts the outcome.
fn deliver<E: SpanExporter>(sh: &Shared, exporter: &E, spans: Vec<SpanData>) {
    let n = spans.len() as u64;
    let mut backoff = BACKOFF.0;
    loop {
        let result = futures_executor::block_on(exporter.export(spans.clone()));
        let err = match result {
            Ok(()) => {
                sh.stats.exported.fetch_add(n, Ordering::Relaxed);
                if sh.stats.logged.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %sh.endpoint, "Telemetry.ExportRecovered");
                }
                return;
            }
            Err(e) => e,
        };
        sh.stats.failures.fetch_add(1, Ordering::Relaxed);
        sh.log_full();
        let message = err.to_string();
        let permanent = refused_for_good(&message);
        if !sh.stats.logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                endpoint = %sh.endpoint,
                error = %message,
                retried = !permanent,
                "Telemetry.ExportFailed: spans wait in the export queue and are sent again until the collector takes them (logged once)"
            );
        }
        if permanent {
            sh.stats.dropped.fetch_add(n, Ordering::Relaxed);
            return;
        }
        // Wait before the next try, unless shutdown's deadline comes first.
        let wait = backoff + jitter(backoff / 4);
        let mut st = sh.lock();
        let until = Instant::now() + wait;
        loop {
            let now = Instant::now();
            if st.shutdown.is_some_and(|d| now >= d) {
                sh.stats.dropped.fetch_add(n, Ordering::Relaxed);
                // Shutdown's deadline passed: what is still queued is lost too.
                let left = st.queue.len();
                let gone: usize = st.queue.drain(..).map(|(_, b)| b).sum();
                st.held -= left;
                st.held_bytes -= gone;
                sh.stats.dropped.fetch_add(left as u64, Ordering::Relaxed);
                return;
            }
            if now >= until {
                break;
            }
            let stop = st.shutdown.map_or(until, |d| d.min(until));
            st = sh
                .wake
                .wait_timeout(st, stop.saturating_duration_since(now))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        drop(st);
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

/// Whether an export error says the collector will never take the batch: an HTTP status or a
/// gRPC code that the OTLP specification does not retry. Anything else (a refused connection,
/// a timeout, 429, 502, 503, 504, `UNAVAILABLE`…) is tried again.
pub fn refused_for_good(message: &str) -> bool {
    if let Some(rest) = message.split("status code: ").nth(1) {
        let code: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(code) = code.parse::<u16>() {
            return !matches!(code, 429 | 502 | 503 | 504);
        }
    }
    if let Some(rest) = message.split("gRPC code: ").nth(1) {
        let code: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
        return !matches!(
            code.as_str(),
            "Cancelled"
                | "DeadlineExceeded"
                | "ResourceExhausted"
                | "Aborted"
                | "OutOfRange"
                | "Unavailable"
                | "DataLoss"
                | "Unknown"
        );
    }
    false
}

/// Up to `max` of jitter, from the clock's low bits.
fn jitter(max: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let max_ns = u32::try_from(max.as_nanos()).unwrap_or(u32::MAX).max(1);
    Duration::from_nanos(u64::from(nanos % max_ns))
}

/// An estimate of a span's size in an OTLP export request: its ids, times and fixed fields,
/// its name, and its attributes', events' and links' keys and values.
pub fn encoded_size(s: &SpanData) -> usize {
    fn value(v: &Value) -> usize {
        match v {
            Value::String(s) => s.as_str().len() + 2,
            Value::Array(a) => match a {
                opentelemetry::Array::String(v) => v.iter().map(|s| s.as_str().len() + 4).sum(),
                opentelemetry::Array::I64(v) => v.len() * 9,
                opentelemetry::Array::F64(v) => v.len() * 9,
                opentelemetry::Array::Bool(v) => v.len() * 2,
                _ => 16,
            },
            _ => 9,
        }
    }
    let attrs = |kvs: &[opentelemetry::KeyValue]| -> usize {
        kvs.iter()
            .map(|kv| kv.key.as_str().len() + value(&kv.value) + 6)
            .sum()
    };
    let events: usize = s
        .events
        .iter()
        .map(|e| e.name.len() + attrs(&e.attributes) + 24)
        .sum();
    let links: usize = s.links.iter().map(|l| attrs(&l.attributes) + 40).sum();
    // trace id, span id, parent id, kind, two times, status, flags: about 80 bytes.
    80 + s.name.len() + attrs(&s.attributes) + events + links
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_errors_are_told_from_refusals() {
        for m in [
            "HTTP export failed with status code: 503",
            "HTTP export failed with status code: 429",
            "HTTP export failed: network error",
            "TonicTracesClient export failed with gRPC code: Unavailable: connection refused",
            "some timeout",
        ] {
            assert!(!refused_for_good(m), "{m}");
        }
        for m in [
            "HTTP export failed with status code: 400",
            "HTTP export failed with status code: 401",
            "HTTP export failed with status code: 500",
            "TonicTracesClient export failed with gRPC code: InvalidArgument",
            "TonicTracesClient export failed with gRPC code: Unauthenticated",
        ] {
            assert!(refused_for_good(m), "{m}");
        }
    }

    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::atomic::AtomicUsize;

    /// An exporter that fails its first `fail` attempts with `error`, then takes everything.
    #[derive(Debug)]
    struct Flaky {
        fail: usize,
        error: &'static str,
        attempts: Arc<AtomicUsize>,
        taken: Arc<AtomicUsize>,
    }

    impl SpanExporter for Flaky {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            if self.attempts.fetch_add(1, Ordering::SeqCst) < self.fail {
                return Err(OTelSdkError::InternalFailure(self.error.into()));
            }
            self.taken.fetch_add(batch.len(), Ordering::SeqCst);
            Ok(())
        }
    }

    struct Rig {
        provider: SdkTracerProvider,
        stats: Arc<ExportStats>,
        taken: Arc<AtomicUsize>,
        attempts: Arc<AtomicUsize>,
    }

    fn rig(fail: usize, error: &'static str, max_spans: usize) -> Rig {
        let (taken, attempts) = (Arc::default(), Arc::default());
        let stats: Arc<ExportStats> = Arc::default();
        let exporter = Flaky {
            fail,
            error,
            attempts: Arc::clone(&attempts),
            taken: Arc::clone(&taken),
        };
        let limits = QueueLimits {
            max_spans,
            delay: Duration::from_millis(10),
            ..QueueLimits::default()
        };
        let queue = ExportQueue::start(exporter, limits, Arc::clone(&stats), "test".into())
            .expect("export thread");
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .build();
        Rig {
            provider,
            stats,
            taken,
            attempts,
        }
    }

    fn end_spans(r: &Rig, n: usize) {
        let tracer = r.provider.tracer("test");
        for i in 0..n {
            drop(tracer.start(format!("span {i}")));
        }
    }

    fn counts(r: &Rig) -> (u64, u64, u64, u64) {
        let s = &r.stats;
        (
            s.ended.load(Ordering::SeqCst),
            s.exported.load(Ordering::SeqCst),
            s.dropped.load(Ordering::SeqCst),
            s.held.load(Ordering::SeqCst),
        )
    }

    #[test]
    fn failed_exports_are_retried_until_the_collector_takes_every_span() {
        let r = rig(3, "HTTP export failed with status code: 503", 1000);
        end_spans(&r, 40);
        // Three failures, then the batch goes through: flush waits for it.
        let mut flushed = r.provider.force_flush();
        for _ in 0..5 {
            if flushed.is_ok() {
                break;
            }
            flushed = r.provider.force_flush();
        }
        assert!(flushed.is_ok(), "{flushed:?}");
        assert_eq!(counts(&r), (40, 40, 0, 0));
        assert_eq!(r.taken.load(Ordering::SeqCst), 40);
        assert!(r.stats.failures.load(Ordering::SeqCst) >= 3);
        assert!(r.provider.shutdown().is_ok());
    }

    #[test]
    fn spans_beyond_the_bound_are_dropped_and_counted_exactly() {
        // The collector never answers: the queue fills to its bound and holds it.
        let r = rig(usize::MAX, "HTTP export failed: network error", 8);
        end_spans(&r, 20);
        let (ended, exported, dropped, held) = counts(&r);
        assert_eq!((ended, exported), (20, 0));
        assert_eq!(dropped, 12, "everything past the 8 held");
        assert_eq!(held, 8);
        assert_eq!(ended, exported + dropped + held);
        // Shutdown's deadline passes with the collector still away: the held spans are lost,
        // and counted.
        let _ = r.provider.shutdown_with_timeout(Duration::from_millis(50));
        let (ended, exported, dropped, held) = counts(&r);
        assert_eq!((ended, exported, dropped, held), (20, 0, 20, 0));
    }

    #[test]
    fn a_refusal_for_good_drops_the_batch_without_retrying() {
        let r = rig(1, "HTTP export failed with status code: 400", 1000);
        end_spans(&r, 5);
        let mut flushed = r.provider.force_flush();
        if flushed.is_err() {
            flushed = r.provider.force_flush();
        }
        assert!(flushed.is_ok(), "{flushed:?}");
        assert_eq!(counts(&r), (5, 0, 5, 0));
        assert_eq!(r.attempts.load(Ordering::SeqCst), 1, "not retried");
        // The next batch goes through.
        end_spans(&r, 3);
        assert!(r.provider.force_flush().is_ok());
        assert_eq!(counts(&r), (8, 3, 5, 0));
        assert!(r.provider.shutdown().is_ok());
    }

    #[test]
    fn span_sizes_grow_with_their_contents() {
        let r = rig(0, "", 100);
        let tracer = r.provider.tracer("test");
        drop(tracer.start("a"));
        assert!(r.provider.force_flush().is_ok());
        let small = SpanData {
            name: "a".into(),
            ..test_span()
        };
        let big = SpanData {
            name: "a".repeat(1000).into(),
            attributes: vec![opentelemetry::KeyValue::new("k", "v".repeat(500))],
            ..test_span()
        };
        assert!(encoded_size(&big) >= encoded_size(&small) + 1500);
        assert!(r.provider.shutdown().is_ok());
    }

    fn test_span() -> SpanData {
        SpanData {
            span_context: opentelemetry::trace::SpanContext::empty_context(),
            parent_span_id: opentelemetry::trace::SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: opentelemetry::trace::SpanKind::Internal,
            name: "".into(),
            start_time: std::time::SystemTime::UNIX_EPOCH,
            end_time: std::time::SystemTime::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: opentelemetry_sdk::trace::SpanEvents::default(),
            links: opentelemetry_sdk::trace::SpanLinks::default(),
            status: opentelemetry::trace::Status::Unset,
            instrumentation_scope: opentelemetry::InstrumentationScope::default(),
        }
    }

    #[test]
    fn limits_come_from_the_standard_variables_or_defaults() {
        let d = QueueLimits::default();
        assert_eq!((d.max_spans, d.max_batch), (65_536, 512));
        assert_eq!(d.delay, Duration::from_millis(200));
        assert_eq!(d.max_bytes, 64 << 20);
    }
}
