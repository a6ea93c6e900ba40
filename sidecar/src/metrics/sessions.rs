//! The session histograms: each session observed once, when it stops being live (the
//! assembly's [`crate::assembly::sessions::SessionTracker`] says when), from its record as
//! `/v1/sessions` gives it. No labels: a session has no one model or API.

use slotlight_otel::metric::buckets;

use super::histogram::{self, TraceHistogram};
use crate::records::session::SessionRecord;

/// The four session histograms.
#[derive(Debug)]
pub struct SessionMetrics {
    /// Turns per session.
    pub turns: TraceHistogram,
    /// First turn's arrival to last turn's end, seconds.
    pub duration: TraceHistogram,
    /// Cached over prompt tokens (sessions with prompt tokens).
    pub cache_hit_ratio: TraceHistogram,
    /// The client's share of the session's time (sessions of two turns or more).
    pub client_share: TraceHistogram,
}

impl Default for SessionMetrics {
    fn default() -> Self {
        Self {
            turns: histogram::new(buckets::SESSION_TURNS),
            duration: histogram::new(buckets::SESSION_DURATION),
            cache_hit_ratio: histogram::new(buckets::RATIO),
            client_share: histogram::new(buckets::RATIO),
        }
    }
}

impl SessionMetrics {
    /// Observes one session that ended, at `now_ns` (Unix ns).
    #[allow(clippy::cast_precision_loss)] // turn counts are far below 2^53
    pub fn observe(&self, s: &SessionRecord, now_ns: i64) {
        // A keyless request no later turn continued is the engine's provisional session of
        // one turn, not a conversation: not observed.
        if s.turns < 2
            && s.source.as_deref() == Some(slotlight_otel::attr::value::SESSION_SOURCE_FOUND)
        {
            return;
        }
        let ts = u64::try_from(now_ns).unwrap_or(0);
        histogram::observe(&self.turns, s.turns as f64, None, ts);
        histogram::observe(&self.duration, s.duration_s, None, ts);
        if let Some(r) = s.cache_hit_ratio {
            histogram::observe(&self.cache_hit_ratio, r, None, ts);
        }
        if s.turns >= 2
            && let Some(c) = s.client_share()
        {
            histogram::observe(&self.client_share, c, None, ts);
        }
    }
}
