//! kvgate's own Prometheus metrics (prometheus-client, OpenMetrics text on the admin listener).
//!
//! Label sets are bounded: `pod` is one of the configured pods, `policy` one of the policy
//! names, `branch` one of the policies' fixed reasons, `status` one of [`Status`], `reason` one
//! of the fixed rejection reasons, `class` one of the predictor's pod classes (≤ 64, the
//! predictor's `max_classes`).

use crate::pods::PodLabel;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// How a routed request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// The pod answered with an error status that was passed to the client (4xx).
    UpstreamStatus,
    /// The upstream failed mid-response.
    UpstreamError,
    /// The client went away before the response ended.
    ClientAbort,
    /// Connect error or 5xx before any byte reached the client; retried elsewhere or 502.
    AttemptFailed,
    /// The gateway's request timeout (`--request-timeout-ms`) ended the response.
    RequestTimeout,
    /// The end of the shutdown grace (`--shutdown-grace-ms`) ended the response.
    Shutdown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::UpstreamStatus => "upstream_status",
            Status::UpstreamError => "upstream_error",
            Status::ClientAbort => "client_abort",
            Status::AttemptFailed => "attempt_failed",
            Status::RequestTimeout => "request_timeout",
            Status::Shutdown => "shutdown",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub pod: String,
    pub policy: String,
    pub branch: String,
    pub status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// `kind`: `first_byte` (no response headers in time), `idle_chunk` (silence mid-body) or
/// `request` (the total request timeout).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TimeoutLabel {
    pub kind: String,
}

/// A predictor pod class (`PodSnapshot::class`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub class: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabel {
    pub stream: String,
}

fn latency_buckets() -> Histogram {
    // 0.5 ms … ~16 s.
    Histogram::new(exponential_buckets(0.5, 2.0, 16))
}

pub struct Metrics {
    pub requests: Family<RequestLabels, Counter>,
    /// Requests rejected before any pod was involved or after retries (400, 413, 404, 503, 502).
    pub rejected: Family<ReasonLabel, Counter>,
    pub retries: Counter,
    /// Retries not made because the retry budget was spent ([`crate::retry_budget`]).
    pub retries_refused: Counter,
    /// Upstream timeouts by kind.
    pub upstream_timeouts: Family<TimeoutLabel, Counter>,
    /// Silences forgiven because the pod progressed ([`crate::progress`]), by the timeout that
    /// ran out (`first_byte`, `idle_chunk`).
    pub busy_waits: Family<TimeoutLabel, Counter>,
    /// Decisions made in panic mode: every usable pod avoided by its breaker ([`crate::breaker`]).
    pub panic_routes: Counter,
    pub ttft_ms: Histogram,
    pub tpot_ms: Histogram,
    pub predicted_ttft_ms: Histogram,
    pub predicted_tpot_ms: Histogram,
    /// End-to-end latency by stream mode.
    pub e2e_ms: Family<StreamLabel, Histogram, fn() -> Histogram>,
    pub predictor_ttft_mape: Gauge<f64, AtomicU64>,
    pub predictor_tpot_mape: Gauge<f64, AtomicU64>,
    pub predictor_ttft_p90_coverage: Gauge<f64, AtomicU64>,
    pub predictor_samples: Gauge,
    /// Per predictor class: recent TTFT / TPOT error (fractions), recent p90 coverage, drift
    /// state, drift episodes and samples learnt.
    pub predictor_class_ttft_mape: Family<ClassLabel, Gauge<f64, AtomicU64>>,
    pub predictor_class_tpot_mape: Family<ClassLabel, Gauge<f64, AtomicU64>>,
    pub predictor_class_ttft_p90_coverage: Family<ClassLabel, Gauge<f64, AtomicU64>>,
    pub predictor_class_drift: Family<ClassLabel, Gauge>,
    pub predictor_class_drift_episodes: Family<ClassLabel, Counter>,
    pub predictor_class_ttft_samples: Family<ClassLabel, Gauge>,
    pub predictor_class_tpot_samples: Family<ClassLabel, Gauge>,
    /// The affinity gate's τ and ε in force (they move with `auto`; unset for other policies).
    pub affinity_gate_tau: Gauge<f64, AtomicU64>,
    pub epsilon_explore_sticky: Gauge<f64, AtomicU64>,
    pub index_blocks: Gauge,
    pub index_bytes: Gauge,
    pub scrape_errors: Family<PodLabel, Counter>,
    /// Times a pod was put in a failure cooldown ([`crate::breaker`]).
    pub pod_cooldowns: Family<PodLabel, Counter>,
    /// Cooldowns not started because as many pods as may be avoided at once already were.
    pub pod_cooldowns_withheld: Family<PodLabel, Counter>,
    pub scrape_skipped_lines: Family<PodLabel, Counter>,
    pub config_reload_errors: Counter,
    /// `--discovery kubernetes`: watch errors (the watcher retries with backoff).
    pub discovery_errors: Counter,
    /// `--discovery kubernetes`: ready pods the watcher currently knows.
    pub discovered_pods: Gauge,
    /// `--capture` records dropped because the writer fell behind (0 without `--capture`).
    pub capture_dropped: Counter,
    /// Prompts the `--tokenizer` could not encode (they score cold).
    pub tokenizer_errors: Counter,
    /// Prompts tokenized in token mode (one per request; a prompt rejected by its length alone
    /// is not).
    pub tokenizations: Counter,
    /// Token mode: prompt bytes whose token ids were reused from the tokenization cache.
    pub tokenization_reused_bytes: Counter,
    /// Token mode: prompt bytes tokenized (not found in the tokenization cache).
    pub tokenization_tokenized_bytes: Counter,
    /// Requests holding a slot of the traffic listener.
    pub active_requests: Gauge,
    /// Requests waiting for a slot.
    pub queued_requests: Gauge,
    pub pod_healthy: Family<PodLabel, Gauge>,
    pub in_flight_requests: Family<PodLabel, Gauge>,
    pub in_flight_prefill_tokens: Family<PodLabel, Gauge>,
    pub in_flight_decode_tokens: Family<PodLabel, Gauge>,
    pub kv_events_batches: Family<PodLabel, Counter>,
    pub kv_events_rejected: Family<PodLabel, Counter>,
    pub kv_events_gaps: Family<PodLabel, Counter>,
    pub kv_events_replay_failures: Family<PodLabel, Counter>,
    pub kv_events_restarts: Family<PodLabel, Counter>,
    /// 1 while a pod's engine index is stale (the routed index stands in).
    pub kv_events_stale: Family<PodLabel, Gauge>,
    /// The traffic listener's connections ([`crate::listener`]).
    pub connections: crate::listener::ConnectionMetrics,
    /// `--cluster`'s metrics ([`crate::cluster`]; zeros without it).
    pub cluster: crate::cluster::ClusterMetrics,
    pub registry: Registry,
    /// `kvgate_flow_*` ([`crate::flow`]).
    pub flow: crate::flow::FlowMetrics,
    /// `kvgate_pd_*` ([`crate::pd`]).
    pub pd: crate::pd::PdMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Drops a removed pod's per-pod series, so that pods coming and going (reloads, Kubernetes
    /// rescheduling with new IPs) do not grow the registry without bound or show gone pods as
    /// healthy. `kvgate_requests_total`'s pod label is kept: it is a history of what was served.
    pub fn forget_pod(&self, label: &PodLabel) {
        for family in [
            &self.scrape_errors,
            &self.pod_cooldowns,
            &self.pod_cooldowns_withheld,
            &self.scrape_skipped_lines,
            &self.kv_events_batches,
            &self.kv_events_rejected,
            &self.kv_events_gaps,
            &self.kv_events_replay_failures,
            &self.kv_events_restarts,
        ] {
            family.remove(label);
        }
        for family in [
            &self.pod_healthy,
            &self.in_flight_requests,
            &self.in_flight_prefill_tokens,
            &self.in_flight_decode_tokens,
            &self.kv_events_stale,
        ] {
            family.remove(label);
        }
    }

    pub fn new() -> Self {
        let m = Metrics {
            requests: Family::default(),
            rejected: Family::default(),
            retries: Counter::default(),
            retries_refused: Counter::default(),
            upstream_timeouts: Family::default(),
            busy_waits: Family::default(),
            panic_routes: Counter::default(),
            ttft_ms: latency_buckets(),
            tpot_ms: latency_buckets(),
            predicted_ttft_ms: latency_buckets(),
            predicted_tpot_ms: latency_buckets(),
            e2e_ms: Family::new_with_constructor(latency_buckets as fn() -> Histogram),
            predictor_ttft_mape: Gauge::default(),
            predictor_tpot_mape: Gauge::default(),
            predictor_ttft_p90_coverage: Gauge::default(),
            predictor_samples: Gauge::default(),
            predictor_class_ttft_mape: Family::default(),
            predictor_class_tpot_mape: Family::default(),
            predictor_class_ttft_p90_coverage: Family::default(),
            predictor_class_drift: Family::default(),
            predictor_class_drift_episodes: Family::default(),
            predictor_class_ttft_samples: Family::default(),
            predictor_class_tpot_samples: Family::default(),
            affinity_gate_tau: Gauge::default(),
            epsilon_explore_sticky: Gauge::default(),
            index_blocks: Gauge::default(),
            index_bytes: Gauge::default(),
            scrape_errors: Family::default(),
            pod_cooldowns: Family::default(),
            pod_cooldowns_withheld: Family::default(),
            scrape_skipped_lines: Family::default(),
            config_reload_errors: Counter::default(),
            discovery_errors: Counter::default(),
            discovered_pods: Gauge::default(),
            capture_dropped: Counter::default(),
            tokenizer_errors: Counter::default(),
            tokenizations: Counter::default(),
            tokenization_reused_bytes: Counter::default(),
            tokenization_tokenized_bytes: Counter::default(),
            active_requests: Gauge::default(),
            queued_requests: Gauge::default(),
            pod_healthy: Family::default(),
            in_flight_requests: Family::default(),
            in_flight_prefill_tokens: Family::default(),
            in_flight_decode_tokens: Family::default(),
            kv_events_batches: Family::default(),
            kv_events_rejected: Family::default(),
            kv_events_gaps: Family::default(),
            kv_events_replay_failures: Family::default(),
            kv_events_restarts: Family::default(),
            kv_events_stale: Family::default(),
            connections: Default::default(),
            flow: Default::default(),
            pd: Default::default(),
            cluster: Default::default(),
            registry: Registry::with_prefix("kvgate"),
        };
        m.register()
    }

    fn register(mut self) -> Self {
        let r = &mut self.registry;
        self.connections.register(r);
        self.flow.register(r);
        self.pd.register(r);
        self.cluster.register(r);
        r.register(
            "requests",
            "Routed requests by pod, policy, branch and outcome",
            self.requests.clone(),
        );
        r.register(
            "rejected_requests",
            "Requests answered with an error by the gateway, by reason",
            self.rejected.clone(),
        );
        r.register(
            "kv_events_batches",
            "KV-event batches applied to the engine index, by pod",
            self.kv_events_batches.clone(),
        );
        r.register(
            "kv_events_rejected",
            "KV-event messages skipped as garbage (bad frames or undecodable msgpack), by pod",
            self.kv_events_rejected.clone(),
        );
        r.register(
            "kv_events_gaps",
            "KV-event sequence gaps seen, by pod",
            self.kv_events_gaps.clone(),
        );
        r.register(
            "kv_events_replay_failures",
            "KV-event gaps the replay socket could not fill (the pod went stale), by pod",
            self.kv_events_replay_failures.clone(),
        );
        r.register(
            "kv_events_restarts",
            "KV-event sequences that restarted from 0 (engine restart: the pod's entries cleared), by pod",
            self.kv_events_restarts.clone(),
        );
        r.register(
            "kv_events_stale",
            "1 while the pod's engine index is stale and the routed index stands in",
            self.kv_events_stale.clone(),
        );
        r.register(
            "retries",
            "Requests re-sent to another pod before any byte reached the client",
            self.retries.clone(),
        );
        r.register(
            "retries_refused",
            "Retries not made because retries in flight were at the retry budget (20 % of the requests in flight, at least 3)",
            self.retries_refused.clone(),
        );
        r.register(
            "busy_waits",
            "Silences not counted as the pod's failure because the pod progressed (engine counters moved or tokens streamed): the request kept waiting, by the timeout that ran out",
            self.busy_waits.clone(),
        );
        r.register(
            "panic_routes",
            "Decisions made in panic mode: every usable pod was avoided by its breaker but still answered its scrape",
            self.panic_routes.clone(),
        );
        r.register(
            "upstream_timeouts",
            "Pod responses that timed out: first_byte (no headers in time, retried or 502) or idle_chunk (silence mid-body)",
            self.upstream_timeouts.clone(),
        );
        r.register(
            "ttft_ms",
            "Observed time to first token (streams), ms",
            self.ttft_ms.clone(),
        );
        r.register(
            "tpot_ms",
            "Observed time per output token (streams), ms",
            self.tpot_ms.clone(),
        );
        r.register(
            "predicted_ttft_ms",
            "Predicted TTFT of the chosen pod at dispatch, ms",
            self.predicted_ttft_ms.clone(),
        );
        r.register(
            "predicted_tpot_ms",
            "Predicted TPOT of the chosen pod at dispatch, ms",
            self.predicted_tpot_ms.clone(),
        );
        r.register(
            "e2e_ms",
            "End-to-end latency of completed requests, ms",
            self.e2e_ms.clone(),
        );
        r.register(
            "predictor_ttft_mape",
            "Predictor TTFT mean absolute percentage error (fraction, recent window)",
            self.predictor_ttft_mape.clone(),
        );
        r.register(
            "predictor_tpot_mape",
            "Predictor TPOT mean absolute percentage error (fraction, recent window)",
            self.predictor_tpot_mape.clone(),
        );
        r.register(
            "predictor_ttft_p90_coverage",
            "Fraction of TTFTs at or below the predicted p90",
            self.predictor_ttft_p90_coverage.clone(),
        );
        r.register(
            "predictor_samples",
            "TTFT samples the predictor learnt from",
            self.predictor_samples.clone(),
        );
        r.register(
            "predictor_class_ttft_mape",
            "Recent TTFT absolute percentage error of the class's model (fraction; weighted mean of about the last 20 samples, after its first 32)",
            self.predictor_class_ttft_mape.clone(),
        );
        r.register(
            "predictor_class_tpot_mape",
            "Recent TPOT absolute percentage error of the class's model (fraction; as the TTFT one)",
            self.predictor_class_tpot_mape.clone(),
        );
        r.register(
            "predictor_class_ttft_p90_coverage",
            "Recent fraction of the class's TTFTs at or below the predicted p90 (about the last 100; ideal 0.9)",
            self.predictor_class_ttft_p90_coverage.clone(),
        );
        r.register(
            "predictor_class_drift",
            "1 while the class's TTFT or TPOT model is in a drift episode (adapting faster)",
            self.predictor_class_drift.clone(),
        );
        r.register(
            "predictor_class_drift_episodes",
            "Drift episodes started for the class (TTFT and TPOT)",
            self.predictor_class_drift_episodes.clone(),
        );
        r.register(
            "predictor_class_ttft_samples",
            "TTFT samples the class's model learnt",
            self.predictor_class_ttft_samples.clone(),
        );
        r.register(
            "predictor_class_tpot_samples",
            "TPOT samples the class's model learnt",
            self.predictor_class_tpot_samples.clone(),
        );
        r.register(
            "affinity_gate_tau",
            "The affinity gate's threshold in force (moves with affinity_gate_tau = auto)",
            self.affinity_gate_tau.clone(),
        );
        r.register(
            "epsilon_explore_sticky",
            "The affinity gate's explore rate in force (moves with epsilon_explore_sticky = auto)",
            self.epsilon_explore_sticky.clone(),
        );
        r.register(
            "index_blocks",
            "Blocks in the routed prefix index (all pods)",
            self.index_blocks.clone(),
        );
        r.register(
            "index_bytes",
            "Upper bound of the routed prefix index's memory, bytes",
            self.index_bytes.clone(),
        );
        r.register(
            "pod_cooldowns",
            "Times a pod was avoided for a cooldown after responses died mid-body in a row, by pod",
            self.pod_cooldowns.clone(),
        );
        r.register(
            "pod_cooldowns_withheld",
            "Cooldowns not started because half of the pods answering their scrape (at least one) were avoided already, by pod",
            self.pod_cooldowns_withheld.clone(),
        );
        r.register(
            "scrape_errors",
            "Failed pod /metrics scrapes",
            self.scrape_errors.clone(),
        );
        r.register(
            "scrape_skipped_lines",
            "Malformed pod /metrics lines skipped",
            self.scrape_skipped_lines.clone(),
        );
        r.register(
            "config_reload_errors",
            "Config file reloads rejected (old config kept)",
            self.config_reload_errors.clone(),
        );
        r.register(
            "discovery_errors",
            "Kubernetes discovery watch errors (the watch is retried with backoff)",
            self.discovery_errors.clone(),
        );
        r.register(
            "discovered_pods",
            "Ready pods found by Kubernetes discovery",
            self.discovered_pods.clone(),
        );
        r.register(
            "capture_dropped",
            "Captured requests not written because the capture writer fell behind",
            self.capture_dropped.clone(),
        );
        r.register(
            "tokenizer_errors",
            "Prompts the --tokenizer could not encode, or chat prompts its chat template could not render, in token mode (scored cold)",
            self.tokenizer_errors.clone(),
        );
        r.register(
            "tokenizations",
            "Prompts tokenized in token mode (a prompt rejected over max_prompt_tokens by its byte length alone is not)",
            self.tokenizations.clone(),
        );
        r.register(
            "tokenization_reused_bytes",
            "Token mode: prompt bytes whose token ids came from the tokenization cache (--tokenization-cache-mib)",
            self.tokenization_reused_bytes.clone(),
        );
        r.register(
            "tokenization_tokenized_bytes",
            "Token mode: prompt bytes tokenized (not in the tokenization cache)",
            self.tokenization_tokenized_bytes.clone(),
        );
        r.register(
            "active_requests",
            "Requests being served by the traffic listener (at most max_concurrent_requests)",
            self.active_requests.clone(),
        );
        r.register(
            "queued_requests",
            "Requests waiting for a slot (at most max_queued_requests)",
            self.queued_requests.clone(),
        );
        r.register(
            "pod_healthy",
            "1 when the pod's last scrape succeeded",
            self.pod_healthy.clone(),
        );
        r.register(
            "in_flight_requests",
            "Requests dispatched to the pod and not finished",
            self.in_flight_requests.clone(),
        );
        r.register(
            "in_flight_prefill_tokens",
            "Uncached prompt tokens dispatched and before first token",
            self.in_flight_prefill_tokens.clone(),
        );
        r.register(
            "in_flight_decode_tokens",
            "Prompt + generated tokens of requests past first token",
            self.in_flight_decode_tokens.clone(),
        );
        self
    }

    pub fn reject(&self, reason: &str) {
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }
}

/// The `kind` label of `kvgate_upstream_timeouts_total`.
pub fn timeout_label(kind: &'static str) -> TimeoutLabel {
    TimeoutLabel {
        kind: kind.to_string(),
    }
}
