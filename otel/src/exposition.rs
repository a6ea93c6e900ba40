//! The two text formats a `/metrics` endpoint answers in, and how a scraper's `Accept`
//! header picks one. The engine and the sidecar both negotiate with [`negotiate`], so they
//! answer the same `Accept` the same way.

/// `Content-Type` of the Prometheus text format 0.0.4 (the default).
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `Content-Type` of OpenMetrics 1.0 text (with exemplars and `# EOF`).
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The format for an `Accept` header: `(true, OpenMetrics content type)` when it names
/// `application/openmetrics-text`, else `(false, Prometheus text content type)`.
pub fn negotiate(accept: Option<&str>) -> (bool, &'static str) {
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (true, OPENMETRICS_TEXT)
    } else {
        (false, PROMETHEUS_TEXT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked_for() {
        assert_eq!(
            negotiate(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
            )),
            (true, OPENMETRICS_TEXT)
        );
        assert_eq!(negotiate(Some("text/plain")), (false, PROMETHEUS_TEXT));
        assert_eq!(negotiate(Some("*/*")), (false, PROMETHEUS_TEXT));
        assert_eq!(negotiate(None), (false, PROMETHEUS_TEXT));
    }
}
