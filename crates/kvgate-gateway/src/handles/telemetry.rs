//! [`Telemetry`]: what the gateway tells about itself — its Prometheus metrics, the rate limit
//! of per-request log lines, the `/debug/decisions` ring (and `--decisions-log`), the live
//! page's history, `--capture` and the OpenTelemetry tracer.
//!
//! Memory: decision ring ≤ `decision_log_size` records, `--decisions-log` queue ≤
//! [`crate::jsonl::QUEUE`] records, `--capture` queue ≤ [`crate::capture::CAPTURE_QUEUE`],
//! live history 5 minutes at one sample per 5 s, span queue ≤ 2,048; metric families one
//! series per pod, class or label value.

use crate::capture::Capture;
use crate::decisions::DecisionLog;
use crate::live::LiveHistory;
use crate::log_limit::LogLimiter;
use crate::metrics::Metrics;
use crate::otel::Tracing;
use std::sync::Arc;

/// Metrics, logs and traces; see the module docs.
pub struct Telemetry {
    pub metrics: Metrics,
    /// The rate limit of per-request log lines (the counters in `metrics` stay exact).
    pub log_limit: LogLimiter,
    pub decisions: DecisionLog,
    /// The live page's branch counters and sampled history ([`crate::live`]).
    pub live: LiveHistory,
    /// `--capture FILE`, when given.
    pub capture: Option<Arc<Capture>>,
    /// `[tracing]`: the OpenTelemetry tracer when tracing is on ([`crate::otel`]); none, every
    /// tracing hook is a no-op.
    pub otel: Option<Tracing>,
}
