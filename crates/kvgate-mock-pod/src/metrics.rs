//! The pod's `/metrics`: vLLM's metric names and types in the Prometheus text format (0.0.4).
//!
//! Names, types and labels follow vLLM v1 (`reference/interfaces.md` §2.1): every series carries
//! `model_name` and `engine="0"`; counters end in `_total`; histograms use vLLM's bucket bounds
//! (`vllm/v1/metrics/loggers.py`). Gauges come from the engine model's [`EngineMetrics`] after
//! each step; latencies are measured in wall-clock time by the driver when a token is handed to
//! the HTTP layer (so they include the `--time-scale` speed-up). Written by hand rather than
//! with `prometheus-client`, whose OpenMetrics output differs from what vLLM serves.
//!
//! Mock-only series (prefix `kvgate_mock_pod_`): rejected requests by reason, KV event batches
//! dropped, and steps the driver ran late.
//!
//! Memory: fixed — one counter per bucket, a fixed set of rejection reasons.

use std::fmt::Write as _;

use kvgate_sim::engine::EngineMetrics;

/// vLLM's `vllm:time_to_first_token_seconds` buckets.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's `vllm:inter_token_latency_seconds` buckets.
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request-latency buckets (`vllm:e2e_request_latency_seconds`).
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A cumulative Prometheus histogram with fixed bounds.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative counts per bucket; the last one is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        let i = self.bounds.partition_point(|&b| b < value);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum += value;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            cumulative += count;
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{bound:?}\"}} {cumulative}"
            );
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// Why the HTTP layer refused a request (label `reason` of the rejection counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    InvalidJson,
    InvalidRequest,
    UnknownModel,
    TooLong,
    Overloaded,
}

impl RejectReason {
    const ALL: [RejectReason; 5] = [
        RejectReason::InvalidJson,
        RejectReason::InvalidRequest,
        RejectReason::UnknownModel,
        RejectReason::TooLong,
        RejectReason::Overloaded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::InvalidJson => "invalid_json",
            RejectReason::InvalidRequest => "invalid_request",
            RejectReason::UnknownModel => "unknown_model",
            RejectReason::TooLong => "too_long",
            RejectReason::Overloaded => "overloaded",
        }
    }
}

/// Everything `/metrics` shows, behind one mutex shared by the driver and the HTTP layer.
#[derive(Debug, Clone)]
pub struct PodMetrics {
    pub engine: EngineMetrics,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub requests_finished_length: u64,
    rejected: [u64; 5],
    pub kv_event_batches_dropped: u64,
    pub late_steps: u64,
}

impl Default for PodMetrics {
    fn default() -> Self {
        PodMetrics {
            engine: EngineMetrics::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            requests_finished_length: 0,
            rejected: [0; 5],
            kv_event_batches_dropped: 0,
            late_steps: 0,
        }
    }
}

impl PodMetrics {
    pub fn reject(&mut self, reason: RejectReason) {
        if let Some(i) = RejectReason::ALL.iter().position(|&r| r == reason)
            && let Some(c) = self.rejected.get_mut(i)
        {
            *c += 1;
        }
    }

    pub fn rejected(&self, reason: RejectReason) -> u64 {
        RejectReason::ALL
            .iter()
            .position(|&r| r == reason)
            .and_then(|i| self.rejected.get(i).copied())
            .unwrap_or(0)
    }

    /// The Prometheus text exposition.
    pub fn render(&self, model: &str, max_model_len: u32) -> String {
        let labels = format!("engine=\"0\",model_name=\"{}\"", escape(model));
        let e = &self.engine;
        let mut out = String::with_capacity(8192);
        let mut scalar = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
            );
        };
        scalar(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            e.num_requests_running.to_string(),
        );
        scalar(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            e.num_requests_waiting.to_string(),
        );
        scalar(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            format!("{:?}", e.kv_cache_usage),
        );
        scalar(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            e.prefix_cache_queries_tokens.to_string(),
        );
        scalar(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            e.prefix_cache_hits_tokens.to_string(),
        );
        scalar(
            "vllm:num_preemptions_total",
            "counter",
            "Cumulative number of preemption from the engine.",
            e.preemptions.to_string(),
        );
        scalar(
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            e.prompt_tokens.to_string(),
        );
        scalar(
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            e.generation_tokens.to_string(),
        );
        let _ = writeln!(
            out,
            "# HELP vllm:request_success_total Count of successfully processed requests.\n\
             # TYPE vllm:request_success_total counter\n\
             vllm:request_success_total{{{labels},finished_reason=\"length\"}} {}",
            self.requests_finished_length
        );
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",\
             engine=\"0\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"{}\",max_model_len=\"{max_model_len}\"}} 1",
            e.kv_blocks_total
        );
        self.ttft.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &labels,
        );
        self.itl.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &labels,
        );
        self.e2e.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &labels,
        );
        let _ = writeln!(
            out,
            "# HELP kvgate_mock_pod_rejected_requests_total Requests refused before reaching the engine.\n\
             # TYPE kvgate_mock_pod_rejected_requests_total counter"
        );
        for reason in RejectReason::ALL {
            let _ = writeln!(
                out,
                "kvgate_mock_pod_rejected_requests_total{{{labels},reason=\"{}\"}} {}",
                reason.as_str(),
                self.rejected(reason)
            );
        }
        let _ = writeln!(
            out,
            "# HELP kvgate_mock_pod_kv_event_batches_dropped_total KV event batches dropped because the publisher queue was full.\n\
             # TYPE kvgate_mock_pod_kv_event_batches_dropped_total counter\n\
             kvgate_mock_pod_kv_event_batches_dropped_total{{{labels}}} {}",
            self.kv_event_batches_dropped
        );
        let _ = writeln!(
            out,
            "# HELP kvgate_mock_pod_late_steps_total Steps that ended over 50 ms (wall) behind the engine model's schedule; the schedule was then moved to now.\n\
             # TYPE kvgate_mock_pod_late_steps_total counter\n\
             kvgate_mock_pod_late_steps_total{{{labels}}} {}",
            self.late_steps
        );
        out
    }
}

/// Escapes a Prometheus label value.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_inf() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.1);
        h.observe(0.5);
        h.observe(5.0);
        let mut out = String::new();
        h.render(&mut out, "x", "help", "a=\"b\"");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.1\"} 2\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"1.0\"} 3\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"+Inf\"} 4\n"));
        assert!(out.contains("x_count{a=\"b\"} 4\n"));
    }

    #[test]
    fn model_names_with_quotes_are_escaped_in_labels() {
        let text = PodMetrics::default().render("a\"b", 100);
        assert!(text.contains("model_name=\"a\\\"b\""));
    }
}
