//! kvgate's own Prometheus metrics (prometheus-client, OpenMetrics text on the admin listener).
//!
//! Label sets are bounded: `pod` is one of the configured pods, `policy` one of the policy
//! names, `branch` one of the policies' fixed reasons, `status` one of [`Status`], `reason` one
//! of the fixed rejection reasons, `class` one of the predictor's pod classes (≤ 64, the
//! predictor's `max_classes`).
//!
//! The metric sets of the traffic connections, flow control, P/D and `--cluster` are defined
//! here too (their modules fill them).

use crate::pods::{Pod, PodLabel, PodSeries};
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
    /// The affinity gate's τ and ε in force (unset for other policies).
    pub affinity_gate_tau: Gauge<f64, AtomicU64>,
    pub epsilon_explore_sticky: Gauge<f64, AtomicU64>,
    pub index_blocks: Gauge,
    pub index_bytes: Gauge,
    pub scrape_errors: Family<PodLabel, Counter>,
    /// Failed reads of a pod's `/v1/models` ([`crate::served_models`]).
    pub models_refresh_errors: Family<PodLabel, Counter>,
    /// The interval each pod is scraped at now ([`crate::scrape_pace`]).
    pub scrape_interval_seconds: Family<PodLabel, Gauge<f64, AtomicU64>>,
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
    /// `--decisions-log` records dropped because the writer fell behind or stopped.
    pub decisions_log_dropped: Counter,
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
    /// 1 while the pod's breaker holds it in a failure cooldown ([`crate::breaker`]).
    pub pod_breaker_open: Family<PodLabel, Gauge>,
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
    /// Seconds since the pod's last KV-event batch was applied (only pods that sent one).
    pub kv_events_last_batch_age_seconds: Family<PodLabel, Gauge<f64, AtomicU64>>,
    /// Per pod: TTFT from the attempt's dispatch and TPOT (streams), and the prompt tokens
    /// routed to it with those its index held ([`PodSeries`], cached on the pod).
    pub pod_ttft_ms: Family<PodLabel, Histogram, fn() -> Histogram>,
    pub pod_tpot_ms: Family<PodLabel, Histogram, fn() -> Histogram>,
    pub pod_prompt_tokens: Family<PodLabel, Counter>,
    pub pod_cached_prompt_tokens: Family<PodLabel, Counter>,
    /// The traffic listener's connections ([`crate::listener`]).
    pub connections: ConnectionMetrics,
    /// `--cluster`'s metrics ([`crate::cluster`]; zeros without it).
    pub cluster: ClusterMetrics,
    pub registry: Registry,
    /// `kvgate_flow_*` ([`crate::flow`]).
    pub flow: FlowMetrics,
    /// `kvgate_pd_*` ([`crate::pd`]).
    pub pd: PdMetrics,
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
            &self.models_refresh_errors,
            &self.pod_cooldowns,
            &self.pod_cooldowns_withheld,
            &self.scrape_skipped_lines,
            &self.kv_events_batches,
            &self.kv_events_rejected,
            &self.kv_events_gaps,
            &self.kv_events_replay_failures,
            &self.kv_events_restarts,
            &self.pod_prompt_tokens,
            &self.pod_cached_prompt_tokens,
        ] {
            family.remove(label);
        }
        self.pod_ttft_ms.remove(label);
        self.pod_tpot_ms.remove(label);
        self.kv_events_last_batch_age_seconds.remove(label);
        for family in [
            &self.pod_healthy,
            &self.pod_breaker_open,
            &self.in_flight_requests,
            &self.in_flight_prefill_tokens,
            &self.in_flight_decode_tokens,
            &self.kv_events_stale,
        ] {
            family.remove(label);
        }
        self.scrape_interval_seconds.remove(label);
    }

    /// The pod's per-request series, created at its first request and kept on the pod: the
    /// proxy's path then updates them without building a label or locking the families.
    /// A pod removed meanwhile has its new series dropped again (`forget_pod` may have run
    /// before they were created), so a request outliving its pod leaves no series behind.
    pub fn pod_series<'a>(&self, pod: &'a Pod) -> &'a PodSeries {
        pod.series.get_or_init(|| {
            let label = pod.label();
            let series = PodSeries {
                ttft_ms: self.pod_ttft_ms.get_or_create(&label).clone(),
                tpot_ms: self.pod_tpot_ms.get_or_create(&label).clone(),
                prompt_tokens: self.pod_prompt_tokens.get_or_create(&label).clone(),
                cached_prompt_tokens: self.pod_cached_prompt_tokens.get_or_create(&label).clone(),
            };
            // `removed` is set before `forget_pod` runs, and the families' locks order the two.
            if pod.removed.load(std::sync::atomic::Ordering::Acquire) {
                self.pod_ttft_ms.remove(&label);
                self.pod_tpot_ms.remove(&label);
                self.pod_prompt_tokens.remove(&label);
                self.pod_cached_prompt_tokens.remove(&label);
            }
            series
        })
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
            models_refresh_errors: Family::default(),
            scrape_interval_seconds: Family::default(),
            pod_cooldowns: Family::default(),
            pod_cooldowns_withheld: Family::default(),
            scrape_skipped_lines: Family::default(),
            config_reload_errors: Counter::default(),
            discovery_errors: Counter::default(),
            discovered_pods: Gauge::default(),
            capture_dropped: Counter::default(),
            decisions_log_dropped: Counter::default(),
            tokenizer_errors: Counter::default(),
            tokenizations: Counter::default(),
            tokenization_reused_bytes: Counter::default(),
            tokenization_tokenized_bytes: Counter::default(),
            active_requests: Gauge::default(),
            queued_requests: Gauge::default(),
            pod_healthy: Family::default(),
            pod_breaker_open: Family::default(),
            in_flight_requests: Family::default(),
            in_flight_prefill_tokens: Family::default(),
            in_flight_decode_tokens: Family::default(),
            kv_events_batches: Family::default(),
            kv_events_rejected: Family::default(),
            kv_events_gaps: Family::default(),
            kv_events_replay_failures: Family::default(),
            kv_events_restarts: Family::default(),
            kv_events_stale: Family::default(),
            kv_events_last_batch_age_seconds: Family::default(),
            pod_ttft_ms: Family::new_with_constructor(latency_buckets as fn() -> Histogram),
            pod_tpot_ms: Family::new_with_constructor(latency_buckets as fn() -> Histogram),
            pod_prompt_tokens: Family::default(),
            pod_cached_prompt_tokens: Family::default(),
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
            "kv_events_last_batch_age_seconds",
            "Seconds since the pod's last KV-event batch was applied (pods that sent one; an idle engine sends none)",
            self.kv_events_last_batch_age_seconds.clone(),
        );
        r.register(
            "pod_ttft_ms",
            "Observed time to first token per pod, from the attempt's dispatch (streams), ms",
            self.pod_ttft_ms.clone(),
        );
        r.register(
            "pod_tpot_ms",
            "Observed time per output token per pod (streams of 2+ tokens), ms",
            self.pod_tpot_ms.clone(),
        );
        r.register(
            "pod_prompt_tokens",
            "Prompt tokens of the requests routed to the pod (each attempt)",
            self.pod_prompt_tokens.clone(),
        );
        r.register(
            "pod_cached_prompt_tokens",
            "Prompt tokens routed to the pod that the router's prefix index held there (prompt minus charged prefill): kvgate's view of the prefix hit rate",
            self.pod_cached_prompt_tokens.clone(),
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
            "1 while the class's TTFT or TPOT model is in a drift episode (its recent error far above its usual)",
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
            "The affinity gate's threshold in force (affinity_gate_tau)",
            self.affinity_gate_tau.clone(),
        );
        r.register(
            "epsilon_explore_sticky",
            "The affinity gate's explore rate in force (epsilon_explore_sticky)",
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
            "scrape_interval_seconds",
            "The interval each pod's /metrics is scraped at now: scrape_interval_ms, or longer where a scrape costs the pod more than 4 % of its time",
            self.scrape_interval_seconds.clone(),
        );
        r.register(
            "scrape_errors",
            "Failed pod /metrics scrapes",
            self.scrape_errors.clone(),
        );
        r.register(
            "models_refresh_errors",
            "Failed reads of a pod's /v1/models (the models it serves), by pod",
            self.models_refresh_errors.clone(),
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
            "decisions_log_dropped",
            "Decision records not written to --decisions-log because its writer fell behind or stopped",
            self.decisions_log_dropped.clone(),
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
            "Requests waiting for a slot (at most max_waiting_requests)",
            self.queued_requests.clone(),
        );
        r.register(
            "pod_healthy",
            "1 when the pod's last scrape succeeded",
            self.pod_healthy.clone(),
        );
        r.register(
            "pod_breaker_open",
            "1 while the pod is in a failure cooldown (its breaker avoids it), else 0",
            self.pod_breaker_open.clone(),
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

// The metric sets below are filled by their modules: connections (`crate::listener`), flow
// control (`crate::flow`), P/D (`crate::pd`), `--cluster` (`crate::cluster`).

/// The traffic listener's connection metrics (registered with the gateway's).
#[derive(Default)]
pub struct ConnectionMetrics {
    /// Connections open now.
    pub open: Gauge,
    /// Connections closed at accept because `max_connections` were open.
    pub refused: Counter,
    /// Connections closed by a timeout, by kind: `header_read`, `idle` or `client_write`.
    pub timeouts: Family<TimeoutLabel, Counter>,
    /// Errors of `accept` itself (each pauses accepting briefly).
    pub accept_errors: Counter,
}

impl ConnectionMetrics {
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "open_connections",
            "Connections open on the traffic listener",
            self.open.clone(),
        );
        r.register(
            "connections_refused",
            "Traffic connections closed at accept because max_connections were open",
            self.refused.clone(),
        );
        r.register(
            "connection_timeouts",
            "Traffic connections closed by a timeout: header_read (no whole request head in time), idle (keep-alive with nothing in flight) or client_write (the client accepted no bytes)",
            self.timeouts.clone(),
        );
        r.register(
            "accept_errors",
            "Errors accepting traffic connections (e.g. too many open files); each pauses accepting briefly",
            self.accept_errors.clone(),
        );
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub band: String,
    pub tenant: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DispatchLabels {
    pub band: String,
    pub tenant: String,
    pub path: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShedLabels {
    pub band: String,
    pub tenant: String,
    pub reason: String,
}

fn queue_time_buckets() -> Histogram {
    // 1 ms … ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The `kvgate_flow_*` metrics (see [`crate::flow`]'s docs).
pub struct FlowMetrics {
    pub queued: Family<ClassLabels, Gauge>,
    pub queue_time_seconds: Family<ClassLabels, Histogram, fn() -> Histogram>,
    pub dispatched: Family<DispatchLabels, Counter>,
    pub shed: Family<ShedLabels, Counter>,
    pub cancelled: Counter,
}

impl Default for FlowMetrics {
    fn default() -> Self {
        FlowMetrics {
            queued: Family::default(),
            queue_time_seconds: Family::new_with_constructor(
                queue_time_buckets as fn() -> Histogram,
            ),
            dispatched: Family::default(),
            shed: Family::default(),
            cancelled: Counter::default(),
        }
    }
}

/// Every reason `kvgate_flow_shed_total` counts.
const SHED_REASONS: [&str; 7] = [
    "flow_unavailable",
    "flow_shed",
    "flow_tenant_share",
    "flow_queue_full",
    "flow_evicted",
    "flow_queue_ttl",
    "request_timeout",
];

impl FlowMetrics {
    /// Drops every series of a tenant the queue forgot (its place went to a newcomer), so
    /// the label sets stay bounded by `max_tenants` + 1 names however many come and go.
    pub fn forget_tenant(&self, tenant: &str) {
        let tenant = tenant.to_string();
        for band in kvgate_core::flow::MIN_PRIORITY..=kvgate_core::flow::MAX_PRIORITY {
            let class = ClassLabels {
                band: band_label(band),
                tenant: tenant.clone(),
            };
            self.queued.remove(&class);
            self.queue_time_seconds.remove(&class);
            for path in ["direct", "queued"] {
                self.dispatched.remove(&DispatchLabels {
                    band: class.band.clone(),
                    tenant: tenant.clone(),
                    path: path.into(),
                });
            }
            for reason in SHED_REASONS {
                self.shed.remove(&ShedLabels {
                    band: class.band.clone(),
                    tenant: tenant.clone(),
                    reason: reason.into(),
                });
            }
        }
    }

    pub fn register(&self, r: &mut Registry) {
        r.register(
            "flow_queued",
            "Requests in the flow queue by priority band and tenant",
            self.queued.clone(),
        );
        r.register(
            "flow_queue_time_seconds",
            "Time requests released from the flow queue waited, by band and tenant",
            self.queue_time_seconds.clone(),
        );
        r.register(
            "flow_dispatched",
            "Requests flow control let through, by band, tenant and path (direct or queued)",
            self.dispatched.clone(),
        );
        r.register(
            "flow_shed",
            "Requests flow control refused or dropped, by band, tenant and reason",
            self.shed.clone(),
        );
        r.register(
            "flow_cancelled",
            "Queued requests whose client went away",
            self.cancelled.clone(),
        );
    }
}

pub(crate) fn band_label(band: i32) -> String {
    band.to_string()
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: &'static str,
    pub outcome: &'static str,
}

/// `kvgate_pd_*`; see [`crate::pd`]'s docs.
pub struct PdMetrics {
    pub requests: Family<RouteLabel, Counter>,
    pub stages: Family<StageLabels, Counter>,
    pub prefill_ms: Histogram,
}

impl Default for PdMetrics {
    fn default() -> Self {
        PdMetrics {
            requests: Family::default(),
            stages: Family::default(),
            // 0.5 ms … ~16 s, as the other latency histograms.
            prefill_ms: Histogram::new(exponential_buckets(0.5, 2.0, 16)),
        }
    }
}

impl PdMetrics {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "pd_requests",
            "Routing decisions in a fleet with P/D roles: split (prefill pod + decode pod) or whole (one pod)",
            self.requests.clone(),
        );
        r.register(
            "pd_stage",
            "P/D stages by outcome: prefill ok | failed | no_transfer_params | client_error, decode ok | failed",
            self.stages.clone(),
        );
        r.register(
            "pd_prefill_ms",
            "Duration of P/D prefill calls that returned transfer parameters, ms",
            self.prefill_ms.clone(),
        );
    }

    pub fn route(&self, route: &'static str) {
        self.requests.get_or_create(&RouteLabel { route }).inc();
    }

    pub fn stage(&self, stage: &'static str, outcome: &'static str) {
        self.stages
            .get_or_create(&StageLabels { stage, outcome })
            .inc();
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterReasonLabel {
    pub reason: &'static str,
}

/// `kvgate_cluster_*` (all zero with no `--cluster`).
#[derive(Debug, Default, Clone)]
pub struct ClusterMetrics {
    pub connected: Gauge,
    pub peers: Gauge,
    pub remote_requests: Gauge,
    pub divergence_seconds: Gauge<f64, AtomicU64>,
    pub messages_sent: Counter,
    pub bytes_sent: Counter,
    pub messages_received: Counter,
    pub events_dropped: Family<ClusterReasonLabel, Counter>,
    pub events_applied: Counter,
    pub duplicates: Counter,
    pub repairs: Counter,
    pub expired_peers: Counter,
    pub expired_requests: Counter,
    pub decode_errors: Counter,
    pub unknown_pod: Counter,
    pub retired_events: Counter,
    pub index_blocks_received: Counter,
    pub samples_applied: Counter,
    pub reconnects: Counter,
    pub delivery_seconds: DeliveryHistogram,
}

/// [`ClusterMetrics::delivery_seconds`]: a histogram with buckets from 100 µs to 3.3 s.
#[derive(Debug, Clone)]
pub struct DeliveryHistogram(pub Histogram);

impl Default for DeliveryHistogram {
    fn default() -> Self {
        DeliveryHistogram(Histogram::new(exponential_buckets(0.000_1, 2.0, 16)))
    }
}

impl ClusterMetrics {
    pub fn register(&self, r: &mut Registry) {
        let r = r.sub_registry_with_prefix("cluster");
        r.register(
            "connected",
            "1 while connected to the cluster's NATS server",
            self.connected.clone(),
        );
        r.register(
            "peers",
            "Other replicas heard from within their lease",
            self.peers.clone(),
        );
        r.register(
            "remote_requests",
            "Other replicas' requests charged to this replica's in-flight ledger",
            self.remote_requests.clone(),
        );
        r.register(
            "divergence_seconds",
            "How stale the view of the other replicas may be: seconds since the NATS disconnect, else since the stalest peer was heard from",
            self.divergence_seconds.clone(),
        );
        r.register(
            "messages_sent",
            "Cluster messages published",
            self.messages_sent.clone(),
        );
        r.register(
            "bytes_sent",
            "Payload bytes of the cluster messages published",
            self.bytes_sent.clone(),
        );
        r.register(
            "messages_received",
            "Cluster messages received from other replicas",
            self.messages_received.clone(),
        );
        r.register(
            "events_dropped",
            "Routing events not published: queue_full or disconnected",
            self.events_dropped.clone(),
        );
        r.register(
            "events_applied",
            "Other replicas' routing events applied",
            self.events_applied.clone(),
        );
        r.register(
            "duplicates",
            "Cluster messages refused as already seen",
            self.duplicates.clone(),
        );
        r.register(
            "repairs",
            "Corrections made by other replicas' snapshots (divergence found)",
            self.repairs.clone(),
        );
        r.register(
            "expired_peers",
            "Replicas whose lease ran out (their charges returned)",
            self.expired_peers.clone(),
        );
        r.register(
            "expired_requests",
            "Requests returned by lease expiry",
            self.expired_requests.clone(),
        );
        r.register(
            "decode_errors",
            "Cluster messages that did not decode (skipped)",
            self.decode_errors.clone(),
        );
        r.register(
            "unknown_pod",
            "Other replicas' events naming a pod this replica does not have (skipped)",
            self.unknown_pod.clone(),
        );
        r.register(
            "retired_events",
            "Other replicas' events of a kind this version no longer reads (session affinity's \
             records from versions before 2026-12-07; skipped)",
            self.retired_events.clone(),
        );
        r.register(
            "index_blocks_received",
            "Routed-index blocks received from other replicas' warm-up answers",
            self.index_blocks_received.clone(),
        );
        r.register(
            "samples_applied",
            "Other replicas' training samples the predictor learnt from",
            self.samples_applied.clone(),
        );
        r.register(
            "reconnects",
            "Connections to NATS made after the first",
            self.reconnects.clone(),
        );
        r.register(
            "delivery_seconds",
            "Time from a peer queueing the oldest event of a message to the message arriving here (wall clocks: across machines it includes their skew)",
            self.delivery_seconds.0.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_core::PodId;

    fn encoded(m: &Metrics) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &m.registry).unwrap();
        text
    }

    #[test]
    fn pod_series_are_shared_with_the_registry_and_forgotten_with_the_pod() {
        let m = Metrics::new();
        let pod = Pod::new(PodId(0), "http://10.0.0.1:8000", "c", 100);
        let series = m.pod_series(&pod);
        series.ttft_ms.observe(12.0);
        series.prompt_tokens.inc_by(100);
        series.cached_prompt_tokens.inc_by(64);
        // The second call is the same handle (no new label built).
        assert!(std::ptr::eq(series, m.pod_series(&pod)));
        let text = encoded(&m);
        assert!(text.contains("kvgate_pod_prompt_tokens_total{pod=\"http://10.0.0.1:8000\"} 100"));
        assert!(
            text.contains("kvgate_pod_cached_prompt_tokens_total{pod=\"http://10.0.0.1:8000\"} 64")
        );
        assert!(text.contains("kvgate_pod_ttft_ms_count{pod=\"http://10.0.0.1:8000\"} 1"));
        m.forget_pod(&pod.label());
        assert!(!encoded(&m).contains("10.0.0.1"));
    }

    #[test]
    fn a_removed_pods_first_request_leaves_no_series() {
        let m = Metrics::new();
        let pod = Pod::new(PodId(0), "http://10.0.0.2:8000", "c", 100);
        pod.removed
            .store(true, std::sync::atomic::Ordering::Release);
        m.forget_pod(&pod.label());
        // A request that outlived its pod ends now: its series are created and dropped again.
        m.pod_series(&pod).ttft_ms.observe(5.0);
        assert!(!encoded(&m).contains("10.0.0.2"));
    }
}
