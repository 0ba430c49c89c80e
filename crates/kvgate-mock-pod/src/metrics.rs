//! The pod's `/metrics`: vLLM's metric names and types in the Prometheus text format (0.0.4).
//!
//! Names, types and labels follow what vLLM 0.32 serves (observed, reference/real-vllm.md):
//! every `vllm:` series carries `engine="0"` and `model_name`; a counter `X_total` is followed
//! by `X_created` (TYPE gauge, the Unix time the pod started), as `prometheus_client` writes
//! them, and so is each histogram; histograms use vLLM's bucket bounds
//! (`vllm/v1/metrics/loggers.py`). Series a router reads: `vllm:num_requests_running`,
//! `vllm:num_requests_waiting`, `vllm:num_requests_waiting_by_reason{reason="capacity"|
//! "deferred"}` (the mock's waiting requests all wait for capacity), `vllm:kv_cache_usage_perc`,
//! `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total` and
//! `vllm:prompt_tokens_cached_total` (= the hits, in tokens: whole blocks only),
//! `vllm:prompt_tokens_by_source_total{source="local_compute"|"local_cache_hit"|
//! "external_kv_transfer"}` (the last: a P/D decode stage's prompt, `--kv-role`), and
//! `vllm:cache_config_info` (value 1, no `model_name`) whose labels carry `block_size`,
//! `num_gpu_blocks`, `enable_prefix_caching`, `prefix_caching_hash_algo`, `sliding_window`,
//! `kv_cache_size_tokens`, `engine` and a few more of vLLM's (not all of its ~35).
//! Gauges come from the engine model's [`EngineMetrics`] after
//! each step; latencies are measured in wall-clock time by the driver when a token is handed to
//! the HTTP layer (so they include the `--time-scale` speed-up). Written by hand rather than
//! with `prometheus-client`, whose OpenMetrics output differs from what vLLM serves.
//!
//! Also as vLLM 0.32: `vllm:iteration_tokens_total` (tokens scheduled per engine step) and the
//! per-request phase histograms `vllm:request_queue_time_seconds` (arrival → first scheduled),
//! `vllm:request_prefill_time_seconds` (→ first token) and `vllm:request_decode_time_seconds`
//! (first → last token), with vLLM's request-latency buckets.
//!
//! Mock-only series (prefix `kvgate_mock_pod_`): rejected requests by reason, requests aborted
//! because their client went away, KV event batches dropped, and steps the driver ran late.
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

/// vLLM's `vllm:iteration_tokens_total` buckets (tokens scheduled in one engine step).
const ITERATION_TOKENS_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
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

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str, created: &str) {
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
        let _ = writeln!(
            out,
            "# HELP {name}_created {help}\n# TYPE {name}_created gauge\n{name}_created{{{labels}}} {created}"
        );
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
    /// Tokens scheduled per step (prefill + decode), `vllm:iteration_tokens_total`.
    pub iteration_tokens: Histogram,
    /// Arrival → first scheduled, `vllm:request_queue_time_seconds`.
    pub queue_time: Histogram,
    /// First scheduled → first token, `vllm:request_prefill_time_seconds`.
    pub prefill_time: Histogram,
    /// First token → last token, `vllm:request_decode_time_seconds`.
    pub decode_time: Histogram,
    pub requests_finished_length: u64,
    /// Requests aborted because their client went away (mock-only series).
    pub requests_aborted: u64,
    /// Tokens per KV block (the `block_size` label of `vllm:cache_config_info`).
    pub block_size_tokens: u32,
    /// When the pod started, Unix seconds: the value of every `_created` sample.
    pub created_unix_s: f64,
    /// The `engine` label: the data-parallel rank of the engine these metrics are of (0 for a
    /// pod with one engine).
    pub engine_rank: u32,
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
            iteration_tokens: Histogram::new(ITERATION_TOKENS_BUCKETS),
            queue_time: Histogram::new(E2E_BUCKETS),
            prefill_time: Histogram::new(E2E_BUCKETS),
            decode_time: Histogram::new(E2E_BUCKETS),
            requests_finished_length: 0,
            requests_aborted: 0,
            block_size_tokens: kvgate_core::blocks::DEFAULT_BLOCK_SIZE_TOKENS,
            engine_rank: 0,
            created_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
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
    /// The `/metrics` of a data-parallel pod: every engine's series of a family together
    /// under its one `# HELP` / `# TYPE`, engine 0 first, as vLLM writes them (its text repeats
    /// every series per `engine` label). One engine: [`PodMetrics::render`].
    pub fn render_engines(engines: &[PodMetrics], model: &str, max_model_len: u32) -> String {
        let texts: Vec<String> = engines
            .iter()
            .map(|m| m.render(model, max_model_len))
            .collect();
        // Each text as families: a family starts at its `# HELP` line; every engine writes the
        // same families in the same order.
        let families = |text: &str| -> Vec<(String, String)> {
            let mut out: Vec<(String, String)> = Vec::new();
            for line in text.lines() {
                if line.starts_with("# HELP ") || out.is_empty() {
                    out.push((String::new(), String::new()));
                }
                if let Some((head, body)) = out.last_mut() {
                    let part = if line.starts_with('#') { head } else { body };
                    part.push_str(line);
                    part.push('\n');
                }
            }
            out
        };
        let split: Vec<Vec<(String, String)>> = texts.iter().map(|t| families(t)).collect();
        let mut out = String::with_capacity(texts.iter().map(String::len).sum());
        for (i, (head, _)) in split
            .first()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            out.push_str(head);
            for engine in &split {
                if let Some((_, body)) = engine.get(i) {
                    out.push_str(body);
                }
            }
        }
        out
    }

    pub fn render(&self, model: &str, max_model_len: u32) -> String {
        let rank = self.engine_rank;
        let labels = format!("engine=\"{rank}\",model_name=\"{}\"", escape(model));
        let e = &self.engine;
        let mut out = String::with_capacity(8192);
        let created = format!("{:?}", self.created_unix_s);
        let gauge = |out: &mut String, name: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {value}"
            );
        };
        // `X_total` then `X_created`, as prometheus_client writes a counter.
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{labels}}} {value}\n\
                 # HELP {name}_created {help}\n# TYPE {name}_created gauge\n{name}_created{{{labels}}} {created}"
            );
        };
        gauge(
            &mut out,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            e.num_requests_running.to_string(),
        );
        gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            e.num_requests_waiting.to_string(),
        );
        let _ = writeln!(
            out,
            "# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints.\n\
             # TYPE vllm:num_requests_waiting_by_reason gauge\n\
             vllm:num_requests_waiting_by_reason{{{labels},reason=\"capacity\"}} {}\n\
             vllm:num_requests_waiting_by_reason{{{labels},reason=\"deferred\"}} 0",
            e.num_requests_waiting
        );
        gauge(
            &mut out,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            format!("{:?}", e.kv_cache_usage),
        );
        counter(
            &mut out,
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            e.prefix_cache_queries_tokens,
        );
        counter(
            &mut out,
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            e.prefix_cache_hits_tokens,
        );
        counter(
            &mut out,
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            e.preemptions,
        );
        counter(
            &mut out,
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            e.prompt_tokens,
        );
        counter(
            &mut out,
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local prefix cache hits).",
            e.prefix_cache_hits_tokens,
        );
        // Where each prompt token's KV came from (vLLM's sources; `local_cache_hit` are the
        // prefix hits, `external_kv_transfer` a P/D decode stage's pulled prompt).
        let local_compute = e
            .prompt_tokens
            .saturating_sub(e.prefix_cache_hits_tokens)
            .saturating_sub(e.prompt_tokens_transferred);
        let name = "vllm:prompt_tokens_by_source";
        let help = "Number of prompt tokens by source.";
        let _ = writeln!(
            out,
            "# HELP {name}_total {help}\n# TYPE {name}_total counter"
        );
        for (source, v) in [
            ("local_compute", local_compute),
            ("local_cache_hit", e.prefix_cache_hits_tokens),
            ("external_kv_transfer", e.prompt_tokens_transferred),
        ] {
            let _ = writeln!(out, "{name}_total{{{labels},source=\"{source}\"}} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP {name}_created {help}\n# TYPE {name}_created gauge"
        );
        for source in ["local_compute", "local_cache_hit", "external_kv_transfer"] {
            let _ = writeln!(
                out,
                "{name}_created{{{labels},source=\"{source}\"}} {created}"
            );
        }
        counter(
            &mut out,
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            e.generation_tokens,
        );
        // vLLM 0.32 lists these five reasons; a request whose client went away is not counted
        // under "abort" (observed: that label counts engine-side aborts only), so here it is
        // counted by the mock-only `kvgate_mock_pod_aborted_requests_total`.
        let finished = [
            ("stop", 0),
            ("length", self.requests_finished_length),
            ("abort", 0),
            ("error", 0),
            ("repetition", 0),
        ];
        let _ = writeln!(
            out,
            "# HELP vllm:request_success_total Count of successfully processed requests.\n\
             # TYPE vllm:request_success_total counter"
        );
        for (reason, n) in finished {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{labels},finished_reason=\"{reason}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP vllm:request_success_created Count of successfully processed requests.\n\
             # TYPE vllm:request_success_created gauge"
        );
        for (reason, _) in finished {
            let _ = writeln!(
                out,
                "vllm:request_success_created{{{labels},finished_reason=\"{reason}\"}} {created}"
            );
        }
        let block_size = self.block_size_tokens;
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"{block_size}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",\
             engine=\"{rank}\",gpu_memory_utilization=\"0.9\",kv_cache_size_tokens=\"{}\",max_model_len=\"{max_model_len}\",\
             num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",prefix_caching_hash_algo=\"sha256\",sliding_window=\"None\"}} 1",
            u64::from(e.kv_blocks_total) * u64::from(block_size),
            e.kv_blocks_total
        );
        self.ttft.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &labels,
            &created,
        );
        self.itl.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &labels,
            &created,
        );
        self.e2e.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &labels,
            &created,
        );
        self.iteration_tokens.render(
            &mut out,
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            &labels,
            &created,
        );
        self.queue_time.render(
            &mut out,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &labels,
            &created,
        );
        self.prefill_time.render(
            &mut out,
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            &labels,
            &created,
        );
        self.decode_time.render(
            &mut out,
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            &labels,
            &created,
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
            "# HELP kvgate_mock_pod_aborted_requests_total Requests aborted because their client went away.\n\
             # TYPE kvgate_mock_pod_aborted_requests_total counter\n\
             kvgate_mock_pod_aborted_requests_total{{{labels}}} {}",
            self.requests_aborted
        );
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
        h.render(&mut out, "x", "help", "a=\"b\"", "1.5");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.1\"} 2\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"1.0\"} 3\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"+Inf\"} 4\n"));
        assert!(out.contains("x_count{a=\"b\"} 4\n"));
        assert!(out.contains("# TYPE x_created gauge\nx_created{a=\"b\"} 1.5\n"));
    }

    #[test]
    fn model_names_with_quotes_are_escaped_in_labels() {
        let text = PodMetrics::default().render("a\"b", 100);
        assert!(text.contains("model_name=\"a\\\"b\""));
    }

    #[test]
    fn step_tokens_and_request_phase_histograms_are_served_under_vllms_names() {
        let mut m = PodMetrics::default();
        m.iteration_tokens.observe(2048.0);
        m.iteration_tokens.observe(3.0);
        m.queue_time.observe(0.2);
        m.prefill_time.observe(0.45);
        m.decode_time.observe(1.25);
        let text = m.render("tiny", 4096);
        let l = "engine=\"0\",model_name=\"tiny\"";
        for line in [
            "# TYPE vllm:iteration_tokens_total histogram".to_owned(),
            format!("vllm:iteration_tokens_total_bucket{{{l},le=\"8.0\"}} 1"),
            format!("vllm:iteration_tokens_total_bucket{{{l},le=\"2048.0\"}} 2"),
            format!("vllm:iteration_tokens_total_sum{{{l}}} 2051.0"),
            format!("vllm:request_queue_time_seconds_bucket{{{l},le=\"0.3\"}} 1"),
            format!("vllm:request_prefill_time_seconds_bucket{{{l},le=\"0.3\"}} 0"),
            format!("vllm:request_prefill_time_seconds_bucket{{{l},le=\"0.5\"}} 1"),
            format!("vllm:request_decode_time_seconds_sum{{{l}}} 1.25"),
            format!("vllm:request_decode_time_seconds_count{{{l}}} 1"),
        ] {
            assert!(
                text.lines().any(|x| x == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn counters_have_created_samples_and_cache_config_info_carries_the_block_size() {
        let mut m = PodMetrics {
            block_size_tokens: 128,
            created_unix_s: 1_700_000_000.5,
            ..PodMetrics::default()
        };
        m.engine.kv_blocks_total = 512;
        m.engine.prefix_cache_hits_tokens = 896;
        m.engine.num_requests_waiting = 3;
        let text = m.render("tiny", 4096);
        let l = "engine=\"0\",model_name=\"tiny\"";
        for line in [
            "# TYPE vllm:prefix_cache_hits_total counter".to_owned(),
            format!("vllm:prefix_cache_hits_total{{{l}}} 896"),
            "# TYPE vllm:prefix_cache_hits_created gauge".to_owned(),
            format!("vllm:prefix_cache_hits_created{{{l}}} 1700000000.5"),
            format!("vllm:prompt_tokens_cached_total{{{l}}} 896"),
            format!("vllm:prefix_cache_queries_created{{{l}}} 1700000000.5"),
            format!("vllm:num_requests_waiting_by_reason{{{l},reason=\"capacity\"}} 3"),
            format!("vllm:num_requests_waiting_by_reason{{{l},reason=\"deferred\"}} 0"),
            format!("vllm:request_success_total{{{l},finished_reason=\"abort\"}} 0"),
            format!("vllm:time_to_first_token_seconds_created{{{l}}} 1700000000.5"),
        ] {
            assert!(
                text.lines().any(|x| x == line),
                "missing {line:?} in\n{text}"
            );
        }
        let info = text
            .lines()
            .find(|x| x.starts_with("vllm:cache_config_info{"))
            .unwrap();
        for label in [
            "block_size=\"128\"",
            "num_gpu_blocks=\"512\"",
            "kv_cache_size_tokens=\"65536\"",
            "enable_prefix_caching=\"True\"",
            "prefix_caching_hash_algo=\"sha256\"",
            "engine=\"0\"",
        ] {
            assert!(info.contains(label), "{label} not in {info}");
        }
        assert!(!info.contains("model_name"));
    }
}
