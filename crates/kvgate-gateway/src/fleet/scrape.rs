//! Pod `/metrics` scraping: a tolerant Prometheus text parser and the per-pod scrape loop.
//!
//! The parser picks out the few vLLM series the router needs (interfaces.md §2.1):
//! `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (older
//! name `vllm:gpu_cache_usage_perc`, used only when the new one is absent) and the labels
//! `block_size` / `num_gpu_blocks` of `vllm:cache_config_info`. Several series of one metric
//! (several engines or models) are summed for request counts and maxed for KV usage — except
//! for a data-parallel server (`dp=N`), scraped once for all its engines and split by the
//! `engine` label ([`parse_metrics_by_engine`]). LoRA
//! pods: the newest series of `vllm:lora_requests_info` (highest value: it is a timestamp, and
//! stale label sets linger) gives `max_lora` and `running_lora_adapters`, and
//! `vllm:num_requests_waiting_by_reason{reason="deferred"}` the requests waiting for a slot
//! (`kvgate_core::adapters`). Lines it
//! cannot parse are skipped and counted; one bad line never fails a scrape. It never panics on
//! any input (property test below).
//!
//! Bounds: a scrape reads at most [`MAX_SCRAPE_BYTES`] of body; a pod that sends more is treated
//! as a failed scrape. A scrape that takes longer than its timeout (4 scrape intervals, at least
//! [`MIN_SCRAPE_TIMEOUT`]) fails. A connection error, an error status or a bad body marks the
//! pod unhealthy at once; timeouts only when [`SCRAPE_TIMEOUTS_TO_UNHEALTHY`] come in a row
//! (≥ 10 s of silence with the 1 s floor): a busy vLLM CPU pod, whose API server shares its
//! core with the engine, answers `/metrics` in over 500 ms while it serves fine (two real pods
//! at ~1 request/s: 29 healthy ↔ unhealthy flips in 3 minutes when one timeout sufficed, and a
//! 503 when both flipped at once; still 3 flips in a minute, each sending every request to the
//! other pod, when 3 in a row sufficed). A slow answer is a busy pod, not a dead one: the
//! router keeps routing it on its last metrics and its own in-flight ledger, and a pod that
//! stops serving is caught by the proxy (connection errors, first-byte timeouts: the breaker).
//! Every failure is counted; the next successful scrape marks the pod healthy again. A timed-out
//! scrape's answer is still awaited apart (one per pod, at most [`LATE_SCRAPE_WAIT`]) and read
//! for the engine's progress counters only ([`crate::progress`]): a slow `/metrics` is a busy
//! pod's, and its queued requests keep waiting.

use crate::config::{GatewayConfig, IndexKind};
use crate::handles::session::SessionHandle;
use crate::metrics::Metrics;
use crate::pods::Pod;
pub use crate::pods::{LoraInfo, PodMetrics};
use crate::state::{Shared, UpstreamClient};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use kvgate_core::AdapterSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Shortest scrape timeout, whatever the scrape interval.
pub const MIN_SCRAPE_TIMEOUT: Duration = Duration::from_secs(1);
/// Scrape timeouts in a row that mark a pod unhealthy (other failures do at once).
pub const SCRAPE_TIMEOUTS_TO_UNHEALTHY: u32 = 10;
/// How long a timed-out scrape's answer is still awaited, apart from the scrape loop, for the
/// engine's progress counters only ([`crate::progress`]).
pub const LATE_SCRAPE_WAIT: Duration = Duration::from_secs(15);

/// Largest `/metrics` body read from a pod (vLLM's is tens of KiB).
pub const MAX_SCRAPE_BYTES: usize = 4 << 20;

/// One parsed sample line: name, raw label block (without braces), value.
struct Sample<'a> {
    name: &'a str,
    labels: &'a str,
    value: f64,
}

/// Parses a Prometheus/OpenMetrics text exposition, keeping only what the router reads.
pub fn parse_metrics(text: &str) -> PodMetrics {
    let mut m = Accumulated::default();
    for line in text.lines() {
        match sample_of(line) {
            Line::Sample(sample) => m.add(&sample),
            Line::Skipped => m.metrics.skipped_lines += 1,
            Line::Blank => {}
        }
    }
    m.finish()
}

/// The metrics of each engine of a data-parallel server (`dp=N`, vLLM `--data-parallel-size`):
/// vLLM repeats every series per `engine="0"`…`engine="N-1"`, so engine r's series make rank
/// r's metrics. A series without an `engine` label counts for every engine; one with an engine
/// outside `0..engines` (or not a number) for none. Skipped lines are counted once, on rank 0.
/// Always `engines` entries (at least one).
pub fn parse_metrics_by_engine(text: &str, engines: u32) -> Vec<PodMetrics> {
    let n = usize::try_from(engines.max(1)).unwrap_or(1);
    let mut per: Vec<Accumulated> = (0..n).map(|_| Accumulated::default()).collect();
    let mut skipped = 0;
    for line in text.lines() {
        let sample = match sample_of(line) {
            Line::Sample(sample) => sample,
            Line::Skipped => {
                skipped += 1;
                continue;
            }
            Line::Blank => continue,
        };
        match label_value(sample.labels, "engine") {
            None => per.iter_mut().for_each(|m| m.add(&sample)),
            Some(engine) => {
                if let Some(m) = engine.parse::<usize>().ok().and_then(|e| per.get_mut(e)) {
                    m.add(&sample);
                }
            }
        }
    }
    let mut out: Vec<PodMetrics> = per.into_iter().map(Accumulated::finish).collect();
    if let Some(first) = out.first_mut() {
        first.skipped_lines = skipped;
    }
    out
}

enum Line<'a> {
    Sample(Sample<'a>),
    Skipped,
    Blank,
}

fn sample_of(line: &str) -> Line<'_> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Line::Blank;
    }
    match parse_line(line) {
        Some(sample) => Line::Sample(sample),
        None => Line::Skipped,
    }
}

/// The series of one pod (or one engine) read so far.
#[derive(Default)]
struct Accumulated {
    metrics: PodMetrics,
    legacy_kv: Option<f64>,
}

impl Accumulated {
    fn add(&mut self, sample: &Sample<'_>) {
        let m = &mut self.metrics;
        match sample.name {
            "vllm:num_requests_running" => {
                add_count(&mut m.running, sample.value);
                if m.model_name.is_none() {
                    m.model_name = label_value(sample.labels, "model_name").map(str::to_string);
                }
            }
            "vllm:num_requests_waiting" => add_count(&mut m.waiting, sample.value),
            "vllm:num_requests_waiting_by_reason"
                if label_value(sample.labels, "reason") == Some("deferred") =>
            {
                add_count(&mut m.deferred, sample.value);
            }
            "vllm:lora_requests_info" => {
                let newer = m.lora.is_none_or(|l| sample.value > l.newest);
                let max_loras = label_value(sample.labels, "max_lora").and_then(|v| v.parse().ok());
                if newer
                    && sample.value.is_finite()
                    && let Some(max_loras) = max_loras
                {
                    let running = label_value(sample.labels, "running_lora_adapters").unwrap_or("");
                    m.lora = Some(LoraInfo {
                        max_loras,
                        running: AdapterSet::from_names(
                            running.split(',').map(str::trim).filter(|n| !n.is_empty()),
                        ),
                        newest: sample.value,
                    });
                }
            }
            "vllm:prompt_tokens_total"
            | "vllm:generation_tokens_total"
            | "vllm:iteration_tokens_total_count"
            | "sglang:prompt_tokens_total"
            | "sglang:generation_tokens_total"
                if sample.value.is_finite() =>
            {
                m.engine_counters = Some(m.engine_counters.unwrap_or(0.0) + sample.value);
            }
            "vllm:kv_cache_usage_perc" => max_fraction(&mut m.kv_usage, sample.value),
            "vllm:gpu_cache_usage_perc" => max_fraction(&mut self.legacy_kv, sample.value),
            "vllm:cache_config_info" => {
                if let Some(v) = label_value(sample.labels, "block_size") {
                    m.block_size = v.parse().ok().filter(|&b: &u32| b > 0).or(m.block_size);
                }
                if let Some(v) = label_value(sample.labels, "num_gpu_blocks") {
                    m.num_gpu_blocks = v.parse().ok().filter(|&b: &u32| b > 0).or(m.num_gpu_blocks);
                }
            }
            _ => {}
        }
    }

    fn finish(self) -> PodMetrics {
        let mut m = self.metrics;
        if m.kv_usage.is_none() {
            m.kv_usage = self.legacy_kv;
        }
        m
    }
}

fn add_count(slot: &mut Option<u32>, value: f64) {
    if value.is_finite() && value >= 0.0 {
        let v = value.min(u32::MAX as f64) as u32;
        *slot = Some(slot.unwrap_or(0).saturating_add(v));
    }
}

fn max_fraction(slot: &mut Option<f64>, value: f64) {
    if value.is_finite() {
        let v = value.clamp(0.0, 1.0);
        *slot = Some(slot.map_or(v, |old| old.max(v)));
    }
}

/// `name{labels} value [timestamp]` or `name value [timestamp]`.
fn parse_line(line: &str) -> Option<Sample<'_>> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let name = line.get(..name_end)?;
    if name.is_empty() {
        return None;
    }
    let rest = line.get(name_end..)?;
    let (labels, rest) = if let Some(after_brace) = rest.strip_prefix('{') {
        let close = label_block_end(after_brace)?;
        (after_brace.get(..close)?, after_brace.get(close + 1..)?)
    } else {
        ("", rest)
    };
    let value_text = rest.split_ascii_whitespace().next()?;
    let value = parse_value(value_text)?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// Index of the `}` closing a label block, skipping quoted values (with `\"` escapes).
fn label_block_end(s: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, b) in s.bytes().enumerate() {
        if escaped {
            escaped = false;
            continue;
        }
        match b {
            b'\\' if in_quotes => escaped = true,
            b'"' => in_quotes = !in_quotes,
            b'}' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// The raw (still escaped) value of label `key` in a label block, if present. Values the router
/// reads are numbers, so escapes never matter to it.
fn label_value<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if rest.is_empty() {
            return None;
        }
        let eq = rest.find('=')?;
        let k = rest.get(..eq)?.trim();
        let after = rest.get(eq + 1..)?.trim_start().strip_prefix('"')?;
        // Find the closing quote, skipping escapes.
        let mut end = None;
        let mut escaped = false;
        for (i, b) in after.bytes().enumerate() {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                end = Some(i);
                break;
            }
        }
        let end = end?;
        if k == key {
            return after.get(..end);
        }
        rest = after.get(end + 1..)?;
    }
}

/// Scrapes `pod` until it is removed from the table, every `scrape_interval` or less often
/// where its scrapes cost the pod more than [`crate::scrape_pace::MAX_DUTY`] of its time. The
/// engines of a data-parallel server share one `/metrics`: rank 0's loop scrapes it for all of
/// them, the other ranks' loops end at once.
pub async fn scrape_loop(shared: Arc<Shared>, pod: Arc<Pod>) {
    if pod.rank.is_some_and(|r| r > 0) {
        return;
    }
    let mut pace = crate::scrape_pace::ScrapePace::default();
    let mut next = tokio::time::Instant::now();
    while !pod.removed.load(Ordering::Relaxed) {
        tokio::time::sleep_until(next).await;
        if pod.removed.load(Ordering::Relaxed) {
            break;
        }
        let started = tokio::time::Instant::now();
        if scrape_once(&shared, &pod).await {
            pace.answered(started.elapsed());
        }
        let interval = pace.interval(shared.config().scrape_interval);
        shared
            .telemetry
            .metrics
            .scrape_interval_seconds
            .get_or_create(&pod.label())
            .set(interval.as_secs_f64());
        // A scrape that overran its interval is followed at once, as a ticker that delays would.
        next = (started + interval).max(tokio::time::Instant::now());
    }
}

/// One scrape: updates the pod's metrics, health and KV capacity, and the scrape counters. For
/// an engine of a data-parallel server, every engine of it is updated from the one scrape, each
/// with its own `engine` series ([`parse_metrics_by_engine`]). True when the pod answered.
pub async fn scrape_once(shared: &Arc<Shared>, pod: &Arc<Pod>) -> bool {
    let interval = shared.config().scrape_interval;
    let timeout = (interval * 4).max(MIN_SCRAPE_TIMEOUT);
    let ranks = match pod.rank {
        Some(_) => shared.fleet.pods.ranks_of(pod),
        None => Vec::new(),
    };
    let (client, p) = (shared.fleet.client.clone(), pod.clone());
    let mut fetch = Box::pin(async move { fetch_metrics(&client, &p).await });
    let result = tokio::time::timeout(timeout, &mut fetch).await;
    if result.is_err() {
        await_late_answer(pod, &ranks, fetch);
    }
    let answered = matches!(result, Ok(Ok(_)));
    let cfg = shared.config();
    let metrics = &shared.telemetry.metrics;
    let scraped = |pod: &Pod, m: &PodMetrics| scraped(&shared.session, metrics, &cfg, pod, m);
    if ranks.is_empty() {
        match result {
            Ok(Ok(text)) => scraped(pod, &parse_metrics(&text)),
            Ok(Err(why)) => scrape_failed(metrics, pod, &why),
            Err(_) => scrape_timed_out(metrics, cfg.scrape_interval, pod),
        }
        return answered;
    }
    match result {
        Ok(Ok(text)) => {
            let per = parse_metrics_by_engine(&text, pod.data_parallel_size);
            for rank in &ranks {
                let r = rank.rank.and_then(|r| usize::try_from(r).ok()).unwrap_or(0);
                if let Some(m) = per.get(r) {
                    scraped(rank, m);
                }
            }
        }
        Ok(Err(why)) => ranks.iter().for_each(|r| scrape_failed(metrics, r, &why)),
        Err(_) => ranks
            .iter()
            .for_each(|r| scrape_timed_out(metrics, cfg.scrape_interval, r)),
    }
    answered
}

/// A scrape of `pod` that timed out: its answer is still awaited apart (at most one per pod, at
/// most [`LATE_SCRAPE_WAIT`]), and the engine counters it brings count as progress only.
fn await_late_answer(
    pod: &Arc<Pod>,
    ranks: &[Arc<Pod>],
    fetch: std::pin::Pin<Box<impl Future<Output = Result<String, String>> + Send + 'static>>,
) {
    if !pod.progress.begin_late_scrape() {
        return;
    }
    let (pod, ranks) = (pod.clone(), ranks.to_vec());
    tokio::spawn(async move {
        if let Ok(Ok(text)) = tokio::time::timeout(LATE_SCRAPE_WAIT, fetch).await {
            let now = std::time::Instant::now();
            if ranks.is_empty() {
                if let Some(total) = parse_metrics(&text).engine_counters {
                    pod.progress.on_counters(total, now);
                }
            } else {
                let per = parse_metrics_by_engine(&text, pod.data_parallel_size);
                for rank in &ranks {
                    let r = rank.rank.and_then(|r| usize::try_from(r).ok()).unwrap_or(0);
                    if let Some(total) = per.get(r).and_then(|m| m.engine_counters) {
                        rank.progress.on_counters(total, now);
                    }
                }
            }
            tracing::debug!(pod = %pod.url, "a timed-out scrape answered late; its counters read for progress");
        }
        pod.progress.end_late_scrape();
    });
}

/// The size the routed index cuts a pod's prompts at: in token mode (`--index engine`) the
/// pod's own block size (its prompts are hashed at it, [`crate::routing::fleet_block_sizes`]);
/// in text mode the router's `block_size_tokens`, whatever the pod's.
fn routed_block_size(index: IndexKind, pod_size: u32, router_size: u32) -> u32 {
    match index {
        IndexKind::Engine => pod_size,
        IndexKind::Routed => router_size,
    }
}

/// A scrape of `pod` that answered `m`: the pod's KV capacity into the session's index.
fn scraped(
    session: &SessionHandle,
    metrics: &Metrics,
    cfg: &GatewayConfig,
    pod: &Pod,
    m: &PodMetrics,
) {
    if m.skipped_lines > 0 {
        metrics
            .scrape_skipped_lines
            .get_or_create(&pod.label())
            .inc_by(m.skipped_lines);
        tracing::debug!(pod = %pod.url, skipped = m.skipped_lines, "skipped malformed metrics lines");
    }
    if let Some(blocks) = m.num_gpu_blocks
        && pod.apply_capacity(blocks)
    {
        let router_size = cfg.router.block_size_tokens;
        let pod_size = m.block_size.unwrap_or(router_size);
        session.set_pod_kv(
            pod.id,
            blocks,
            pod_size,
            routed_block_size(cfg.index, pod_size, router_size),
        );
    }
    pod.scrape_timeouts_in_a_row.store(0, Ordering::Relaxed);
    if let Some(total) = m.engine_counters {
        pod.progress.on_counters(total, std::time::Instant::now());
    }
    pod.apply_metrics(m);
    crate::kv_events::on_scrape(session, cfg, pod, m);
    if !pod.healthy.swap(true, Ordering::Relaxed) {
        tracing::info!(pod = %pod.url, "pod is healthy");
    }
}

fn scrape_timed_out(metrics: &Metrics, interval: Duration, pod: &Pod) {
    let n = pod.scrape_timeouts_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
    // A pod still streaming tokens is busy, not gone: its slow `/metrics` does not take it out.
    let timeout = (interval * 4).max(MIN_SCRAPE_TIMEOUT);
    let streaming = pod.progress.within(
        std::time::Instant::now(),
        crate::progress::window(
            timeout.saturating_mul(SCRAPE_TIMEOUTS_TO_UNHEALTHY),
            interval,
        ),
    );
    if n >= SCRAPE_TIMEOUTS_TO_UNHEALTHY && !streaming {
        scrape_failed(metrics, pod, "scrape timed out, again");
    } else {
        metrics.scrape_errors.get_or_create(&pod.label()).inc();
        tracing::debug!(pod = %pod.url, in_a_row = n, "scrape timed out; pod kept healthy");
    }
}

fn scrape_failed(metrics: &Metrics, pod: &Pod, why: &str) {
    metrics.scrape_errors.get_or_create(&pod.label()).inc();
    if pod.mark_unhealthy() {
        tracing::warn!(pod = %pod.url, %why, "scrape failed; pod marked unhealthy");
    }
}

async fn fetch_metrics(client: &UpstreamClient, pod: &Pod) -> Result<String, String> {
    let uri = pod.uri_for("/metrics").map_err(|e| e.to_string())?;
    let req = http::Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("status {}", resp.status()));
    }
    let body = Limited::new(resp.into_body(), MAX_SCRAPE_BYTES)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    String::from_utf8(body.to_vec()).map_err(|_| "metrics body is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const VLLM_SAMPLE: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.25
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="29000"} 1.0
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
"#;

    #[test]
    fn reads_the_vllm_series_the_router_needs() {
        let m = parse_metrics(VLLM_SAMPLE);
        assert_eq!(m.running, Some(3));
        assert_eq!(m.waiting, Some(7));
        assert_eq!(m.kv_usage, Some(0.25));
        assert_eq!(m.block_size, Some(16));
        assert_eq!(m.num_gpu_blocks, Some(29000));
        assert_eq!(m.skipped_lines, 0);
    }

    #[test]
    fn the_engine_progress_counters_are_summed_and_absent_when_none_is_exported() {
        assert_eq!(parse_metrics(VLLM_SAMPLE).engine_counters, None);
        let text = r#"vllm:prompt_tokens_total{engine="0",model_name="tiny"} 1200.0
vllm:generation_tokens_total{engine="0",model_name="tiny"} 300.0
vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 40.0
vllm:iteration_tokens_total_sum{engine="0",model_name="tiny"} 1500.0
vllm:prompt_tokens_created{engine="0",model_name="tiny"} 1.76e+09
"#;
        assert_eq!(parse_metrics(text).engine_counters, Some(1540.0));
        let per = parse_metrics_by_engine(
            "vllm:generation_tokens_total{engine=\"0\"} 5\nvllm:generation_tokens_total{engine=\"1\"} 9\n",
            2,
        );
        assert_eq!(per[0].engine_counters, Some(5.0));
        assert_eq!(per[1].engine_counters, Some(9.0));
    }

    #[test]
    fn lora_info_comes_from_the_newest_series_and_deferred_from_its_reason() {
        let text = r#"vllm:lora_requests_info{max_lora="1",running_lora_adapters="a",waiting_lora_adapters="a"} 1.7640000052e+09
vllm:lora_requests_info{max_lora="1",running_lora_adapters="b",waiting_lora_adapters="b"} 1.7640000093e+09
vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 1.7640000011e+09
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="deferred"} 3.0
"#;
        let m = parse_metrics(text);
        let lora = m.lora.unwrap();
        assert_eq!(lora.max_loras, 1);
        assert_eq!(lora.running, AdapterSet::from_names(["b"]));
        assert_eq!(m.deferred, Some(3));
        let two = parse_metrics(
            "vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"a, b\",waiting_lora_adapters=\"\"} 5\n",
        );
        assert_eq!(
            two.lora.unwrap().running,
            AdapterSet::from_names(["a", "b"])
        );
        assert_eq!(parse_metrics(VLLM_SAMPLE).lora, None, "no LoRA: none");
    }

    #[test]
    fn a_lora_pod_snapshot_carries_its_slots_and_base_model() {
        let pod = crate::pods::Pod::new(kvgate_core::PodId(0), "http://127.0.0.1:1", "c", 100);
        let text = "vllm:num_requests_running{engine=\"0\",model_name=\"tiny\"} 0\nvllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a\",waiting_lora_adapters=\"a\"} 9\n";
        pod.apply_metrics(&parse_metrics(text));
        let slots = pod.snapshot().lora.unwrap();
        assert_eq!(slots.max_loras, 2);
        assert_eq!(slots.base_model, Some(kvgate_core::AdapterId::of("tiny")));
        assert!(slots.running.contains(kvgate_core::AdapterId::of("a")));
        assert_eq!(
            slots.fit(kvgate_core::AdapterId::of("tiny")),
            kvgate_core::AdapterFit::NoAdapter
        );
    }

    #[test]
    fn malformed_lines_are_skipped_and_counted_not_fatal() {
        let text = "vllm:num_requests_running{engine=\"0\" 3\ngarbage\nvllm:num_requests_waiting 2\n{} 4\nvllm:num_requests_running abc\n";
        let m = parse_metrics(text);
        assert_eq!(m.waiting, Some(2));
        assert_eq!(m.running, None);
        assert_eq!(m.skipped_lines, 4);
    }

    #[test]
    fn legacy_gpu_cache_usage_is_a_fallback_only() {
        assert_eq!(
            parse_metrics("vllm:gpu_cache_usage_perc 0.5\n").kv_usage,
            Some(0.5)
        );
        assert_eq!(
            parse_metrics("vllm:gpu_cache_usage_perc 0.5\nvllm:kv_cache_usage_perc 0.1\n").kv_usage,
            Some(0.1)
        );
    }

    #[test]
    fn several_engines_sum_requests_and_max_kv_usage() {
        let text = "vllm:num_requests_running{engine=\"0\"} 2\nvllm:num_requests_running{engine=\"1\"} 5\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.2\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.7\n";
        let m = parse_metrics(text);
        assert_eq!(m.running, Some(7));
        assert_eq!(m.kv_usage, Some(0.7));
    }

    #[test]
    fn a_data_parallel_servers_series_split_by_engine_label() {
        let text = "vllm:num_requests_running{engine=\"0\",model_name=\"tiny\"} 2\n\
vllm:num_requests_running{engine=\"1\",model_name=\"tiny\"} 5\n\
vllm:num_requests_waiting{engine=\"1\",model_name=\"tiny\"} 3\n\
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny\"} 0.2\n\
vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"tiny\"} 0.7\n\
vllm:cache_config_info{block_size=\"128\",engine=\"0\",num_gpu_blocks=\"1024\"} 1\n\
vllm:cache_config_info{block_size=\"128\",engine=\"1\",num_gpu_blocks=\"512\"} 1\n\
vllm:num_requests_running{engine=\"7\",model_name=\"tiny\"} 100\n\
vllm:num_requests_running{engine=\"x\",model_name=\"tiny\"} 100\n\
vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"a\",waiting_lora_adapters=\"a\"} 9\n\
garbage\n";
        let per = parse_metrics_by_engine(text, 2);
        assert_eq!(per.len(), 2);
        assert_eq!(
            (per[0].running, per[0].waiting, per[0].kv_usage),
            (Some(2), None, Some(0.2))
        );
        assert_eq!(
            (per[1].running, per[1].waiting, per[1].kv_usage),
            (Some(5), Some(3), Some(0.7))
        );
        assert_eq!(
            (per[0].num_gpu_blocks, per[1].num_gpu_blocks),
            (Some(1024), Some(512))
        );
        assert_eq!(
            (per[0].block_size, per[1].block_size),
            (Some(128), Some(128))
        );
        assert_eq!(per[1].model_name.as_deref(), Some("tiny"));
        // No engine label: every engine's; skipped lines counted once.
        assert!(per.iter().all(|m| m.lora.is_some_and(|l| l.max_loras == 1)));
        assert_eq!((per[0].skipped_lines, per[1].skipped_lines), (1, 0));
        // The whole-server view still sums them (and the out-of-range engine too).
        assert_eq!(parse_metrics(text).running, Some(207));
        assert_eq!(parse_metrics_by_engine(text, 0).len(), 1);
    }

    #[test]
    fn quoted_braces_and_escapes_in_labels_do_not_break_parsing() {
        let text = "vllm:num_requests_waiting{model_name=\"a}b\\\"c\"} 4 1700000000\n";
        assert_eq!(parse_metrics(text).waiting, Some(4));
    }

    #[test]
    fn out_of_range_values_are_clamped_or_ignored() {
        let text = "vllm:kv_cache_usage_perc 7\nvllm:num_requests_running -3\nvllm:num_requests_waiting NaN\n";
        let m = parse_metrics(text);
        assert_eq!(m.kv_usage, Some(1.0));
        assert_eq!(m.running, None);
        assert_eq!(m.waiting, None);
    }

    proptest! {
        #[test]
        fn parser_never_panics(text in "\\PC*", engines in 0u32..4) {
            let _ = parse_metrics(&text);
            prop_assert_eq!(parse_metrics_by_engine(&text, engines).len(), engines.max(1) as usize);
        }

        #[test]
        fn parser_never_panics_on_metric_like_lines(
            lines in proptest::collection::vec(
                "(vllm:[a-z_]{0,30})?(\\{([a-z_]{0,8}=\"[^\"\\n]{0,8}\"?,?){0,3}\\}?)? ?[-+0-9.eNaInf]{0,8}",
                0..20,
            )
        ) {
            let _ = parse_metrics(&lines.join("\n"));
        }
    }
}
