//! Request latencies and refusals, owned by the HTTP layer: each request's task observes its
//! own finished usage once, and each refusal is counted where it is answered.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use opentelemetry::KeyValue;
use slotlight_otel::attr;

use slotlight_otel::metric::buckets;

use super::histogram::{AtomicHistogram, HistogramSnapshot};
use super::instruments::{RequestInstruments, genai_attrs};

/// Most distinct (API, operation, request model, response model) series; more go to one
/// `_overflow` series. The request model is checked against the served names before a request
/// is counted, so only a refusal could bring a new one, and refusals carry none.
const MAX_SERIES: usize = 32;

/// Label value of the series beyond `MAX_SERIES`.
pub const OVERFLOW: &str = "_overflow";

/// One finished or refused request, as its latency histograms see it.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// The API the request came through (`slotlight.api`).
    pub api: &'static str,
    /// The GenAI operation (`gen_ai.operation.name`): `chat` or `text_completion`.
    pub operation: &'static str,
    /// `gen_ai.request.model`, when known (a refusal may come before the body was read).
    pub request_model: Option<&'a str>,
    /// The model that served the request (`gen_ai.response.model`).
    pub response_model: &'a str,
    /// `error.type` of a request that did not succeed; `None` for a successful one.
    pub error_type: Option<&'static str>,
    /// Arrival to first token, seconds (successful requests only).
    pub ttft: Option<f64>,
    /// Time per output token after the first, seconds (successful requests only).
    pub tpot: Option<f64>,
    /// Arrival to finish or refusal, seconds.
    pub duration: f64,
    /// Arrival to first admission, seconds (admitted requests only).
    pub queue: Option<f64>,
}

/// The labels of one series: the API, and the GenAI operation, request model (empty when
/// unknown) and response model.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SeriesKey {
    /// The API the requests came through (`slotlight.api`).
    pub api: &'static str,
    /// `gen_ai.operation.name`.
    pub operation: &'static str,
    /// `gen_ai.request.model` (empty when unknown).
    pub request_model: String,
    /// `gen_ai.response.model`.
    pub response_model: String,
}

#[derive(Debug)]
struct Series {
    ttft: AtomicHistogram,
    tpot: AtomicHistogram,
    duration: BTreeMap<Option<&'static str>, AtomicHistogram>,
    queue: AtomicHistogram,
}

impl Series {
    fn new() -> Self {
        Self {
            ttft: AtomicHistogram::new(buckets::TIME_TO_FIRST_TOKEN),
            tpot: AtomicHistogram::new(buckets::TIME_PER_OUTPUT_TOKEN),
            duration: BTreeMap::new(),
            queue: AtomicHistogram::new(buckets::REQUEST_DURATION),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    series: BTreeMap<SeriesKey, Series>,
    refused: BTreeMap<&'static str, u64>,
}

/// The request-level metrics of the HTTP layer.
#[derive(Debug, Default)]
pub struct RequestMetrics {
    inner: Mutex<Inner>,
    /// The OTLP histograms, once OTLP metrics are on (set once, before serving).
    otel: OnceLock<RequestInstruments>,
}

/// One series of [`RequestSnapshot`].
#[derive(Debug, Clone)]
pub struct SeriesSnapshot {
    /// Its GenAI labels.
    pub key: SeriesKey,
    /// Time to first token.
    pub ttft: HistogramSnapshot,
    /// Time per output token.
    pub tpot: HistogramSnapshot,
    /// Request duration by `error_type` (`None`: successful requests).
    pub duration: Vec<(Option<&'static str>, HistogramSnapshot)>,
    /// Arrival to first admission of admitted requests (`slotlight_engine_queue_time_seconds`).
    pub queue: HistogramSnapshot,
}

/// What [`RequestMetrics`] held when read.
#[derive(Debug, Clone, Default)]
pub struct RequestSnapshot {
    /// The latency histograms, one series per combination of labels.
    pub series: Vec<SeriesSnapshot>,
    /// Refusals by `error_type`.
    pub refused: Vec<(&'static str, u64)>,
}

impl RequestMetrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves counts that are still counts.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Observes one finished (or refused) request. Only what the request had is observed: a
    /// time it never had is never recorded as zero.
    pub fn observe(&self, o: &Observation<'_>) {
        let key = SeriesKey {
            api: o.api,
            operation: o.operation,
            request_model: o.request_model.unwrap_or("").to_string(),
            response_model: o.response_model.to_string(),
        };
        let mut g = self.lock();
        let key = if g.series.len() >= MAX_SERIES && !g.series.contains_key(&key) {
            SeriesKey {
                api: OVERFLOW,
                operation: OVERFLOW,
                request_model: OVERFLOW.to_string(),
                response_model: OVERFLOW.to_string(),
            }
        } else {
            key
        };
        let otel_attrs = self.otel.get().map(|_| {
            genai_attrs(
                key.api,
                key.operation,
                &key.request_model,
                &key.response_model,
            )
        });
        let s = g.series.entry(key).or_insert_with(Series::new);
        if o.error_type.is_none() {
            if let Some(v) = o.ttft {
                s.ttft.observe(v);
            }
            if let Some(v) = o.tpot {
                s.tpot.observe(v);
            }
        }
        s.duration
            .entry(o.error_type)
            .or_insert_with(|| AtomicHistogram::new(buckets::REQUEST_DURATION))
            .observe(o.duration);
        if let Some(v) = o.queue {
            s.queue.observe(v);
        }
        drop(g);
        if let (Some(i), Some(mut a)) = (self.otel.get(), otel_attrs) {
            if o.error_type.is_none() {
                if let Some(v) = o.ttft {
                    i.ttft.record(v, &a);
                }
                if let Some(v) = o.tpot {
                    i.tpot.record(v, &a);
                }
            }
            if let Some(v) = o.queue {
                i.queue.record(v, &a);
            }
            if let Some(e) = o.error_type {
                a.push(KeyValue::new(attr::ERROR_TYPE, e));
            }
            i.duration.record(o.duration, &a);
        }
    }

    /// Records each observation into OTLP histograms too, from now on (the first call wins).
    pub fn export_to(&self, instruments: RequestInstruments) {
        let _ = self.otel.set(instruments);
    }

    /// Refusals by `error_type` so far.
    pub fn refusals(&self) -> Vec<(&'static str, u64)> {
        self.lock().refused.iter().map(|(k, v)| (*k, *v)).collect()
    }

    /// Counts a request refused before reaching a step loop.
    pub fn count_refused(&self, error_type: &'static str) {
        *self.lock().refused.entry(error_type).or_default() += 1;
    }

    /// A copy of every request metric as it stands now (for `/metrics` and the tests).
    pub fn snapshot(&self) -> RequestSnapshot {
        let g = self.lock();
        RequestSnapshot {
            series: g
                .series
                .iter()
                .map(|(k, s)| SeriesSnapshot {
                    key: k.clone(),
                    ttft: s.ttft.snapshot(),
                    tpot: s.tpot.snapshot(),
                    duration: s.duration.iter().map(|(e, h)| (*e, h.snapshot())).collect(),
                    queue: s.queue.snapshot(),
                })
                .collect(),
            refused: g.refused.iter().map(|(k, v)| (*k, *v)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Observation<'static> {
        Observation {
            api: "chat.completions",
            operation: "chat",
            request_model: Some("m"),
            response_model: "m",
            error_type: None,
            ttft: Some(0.03),
            tpot: Some(0.01),
            duration: 1.5,
            queue: Some(0.001),
        }
    }

    #[test]
    fn failures_have_a_duration_but_no_ttft_or_tpot() {
        let m = RequestMetrics::default();
        m.observe(&ok());
        m.observe(&Observation {
            error_type: Some("cancelled"),
            queue: None,
            ..ok()
        });
        let s = m.snapshot();
        let one = &s.series[0];
        assert_eq!((one.ttft.count, one.tpot.count, one.queue.count), (1, 1, 1));
        let by: Vec<_> = one.duration.iter().map(|(e, h)| (*e, h.count)).collect();
        assert_eq!(by, vec![(None, 1), (Some("cancelled"), 1)]);
    }

    #[test]
    fn series_are_capped() {
        let m = RequestMetrics::default();
        let names: Vec<String> = (0..MAX_SERIES + 5).map(|i| format!("m{i}")).collect();
        for n in &names {
            m.observe(&Observation {
                response_model: n,
                ..ok()
            });
        }
        let s = m.snapshot();
        assert_eq!(s.series.len(), MAX_SERIES + 1);
        assert!(s.series.iter().any(|x| x.key.operation == OVERFLOW));
    }
}
