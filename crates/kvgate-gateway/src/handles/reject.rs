//! A request the gateway answers itself, counted and logged: [`log_reject`] (the counter, the
//! rate-limited log line), [`reject`] (that, then the answer). The error bodies are in
//! [`crate::errors`].

use crate::errors::ApiError;
use crate::handles::telemetry::Telemetry;
use axum::response::Response;

/// Counts (`kvgate_rejected_requests{reason}`, every one) and logs a request the gateway answers
/// itself: client errors at info, the gateway's and the pods' failures at warn, at most
/// [`crate::log_limit::LINES_PER_WINDOW`] lines a second per `code` (a flood of 429s or 503s
/// must not flood the log; the suppressed lines are reported as a count).
pub fn log_reject(telemetry: &Telemetry, err: &ApiError, request_id: &str) {
    telemetry.metrics.reject(err.code);
    if !telemetry.log_limit.allow(err.code) {
        return;
    }
    match err.status.as_u16() {
        400..=499 => {
            tracing::info!(%request_id, code = err.code, message = %err.message, "request rejected")
        }
        _ => tracing::warn!(%request_id, code = err.code, message = %err.message, "request failed"),
    }
}

/// [`log_reject`], then the error as the client's answer.
pub fn reject(telemetry: &Telemetry, err: ApiError, request_id: &str) -> Response {
    log_reject(telemetry, &err, request_id);
    err.into_response(request_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::no_healthy_pod;
    use std::sync::{Arc, Mutex};

    /// Log output captured in memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_flood_of_rejections_is_counted_exactly_and_logged_at_most_n_times_a_second_per_code() {
        let shared = crate::state::Shared::new(
            crate::config::GatewayConfig::from_args(&crate::config::ServeArgs::default()).unwrap(),
        );
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::INFO)
            .finish();
        let too_many = crate::limits::too_many_requests(&shared.admission.slots);
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..2000 {
                log_reject(&shared.telemetry, &too_many, &format!("r{i}"));
                log_reject(&shared.telemetry, &no_healthy_pod(), &format!("n{i}"));
            }
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines = |what: &str| text.lines().filter(|l| l.contains(what)).count();
        // Within a second (the loop takes milliseconds): the first lines of each code only.
        let n = crate::log_limit::LINES_PER_WINDOW as usize;
        assert_eq!(lines("too_many_requests"), n, "{text}");
        assert_eq!(lines("no_healthy_pod"), n, "{text}");
        let text = shared.metrics_text().unwrap();
        for reason in ["too_many_requests", "no_healthy_pod"] {
            let series = format!("kvgate_rejected_requests_total{{reason=\"{reason}\"}} 2000");
            assert!(text.contains(&series), "{series} in {text}");
        }
    }
}
