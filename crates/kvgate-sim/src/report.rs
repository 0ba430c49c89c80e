//! What a simulated run measured: the recorder the event loop feeds, and the serialisable
//! [`RunMetrics`] (`kvgate sim --json` keys; the load generator uses the same names).
//!
//! Memory is bounded by the workload: one small record per request; pod time series keep at most
//! [`MAX_POD_SAMPLES`] samples per pod, the TTFT CDF [`CDF_POINTS`] points.

use std::collections::BTreeMap;

use kvgate_core::decision::{Decision, GateState};
use kvgate_core::pod::PodSnapshot;
use kvgate_core::policy::RequestSlo;
use kvgate_core::predictor::AccuracyReport;
use serde::Serialize;

use crate::engine::EngineMetrics;
use crate::stats::nearest_rank;

/// Samples kept per pod for the KV-usage / queue-length plots.
pub const MAX_POD_SAMPLES: usize = 400;
/// Points of the TTFT CDF kept for plots.
pub const CDF_POINTS: usize = 200;
/// Bins of the prefix-score histogram over [0, 1] (the last bin includes 1.0).
pub const SCORE_BINS: usize = 20;

/// Mean and percentiles of a latency, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Percentiles {
    /// From unsorted samples (sorted in place); nearest-rank percentiles; zeros when empty.
    pub fn of(samples: &mut [f64]) -> Self {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_by(f64::total_cmp);
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        Percentiles {
            mean,
            p50: nearest_rank(samples, 0.50),
            p90: nearest_rank(samples, 0.90),
            p99: nearest_rank(samples, 0.99),
        }
    }
}

/// What flow control did in a run (`RunMetrics::flow`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FlowRunReport {
    pub enabled: bool,
    /// Arrivals that waited in the queue.
    pub queued: u64,
    /// Of those, released to a pod.
    pub released: u64,
    pub shed_sheddable: u64,
    pub shed_tenant_share: u64,
    pub shed_queue_full: u64,
    pub shed_unavailable: u64,
    pub evicted: u64,
    pub expired: u64,
    pub max_queue_len: u64,
    /// Mean time released requests waited, ms.
    pub mean_queue_ms: f64,
    /// What the saturation detector saw at each release check with requests queued, summed
    /// over pods: pods closed by KV usage, closed by their queue (or in-flight cap), open.
    pub detector_pods_kv: u64,
    pub detector_pods_queue: u64,
    pub detector_pods_open: u64,
    /// Of the open pods at those checks, the engine queue they had (sum of `waiting_estimate`).
    pub detector_open_waiting: u64,
    /// Per request (by id): its TTFT in ms, NaN when it was not served.
    #[serde(skip)]
    pub ttft_ms_by_request: Vec<f64>,
    /// Per request (by id): the time it waited in the flow queue, ms (0 when dispatched at
    /// once, NaN when never dispatched).
    #[serde(skip)]
    pub queue_ms_by_request: Vec<f64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GateCounts {
    pub explore: u64,
    pub exploit: u64,
    pub no_sticky: u64,
    pub load_break: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PredictorMetrics {
    /// Mean |predicted − observed| / observed of the chosen pod's TTFT, as a fraction.
    pub ttft_mape: f64,
    pub tpot_mape: f64,
    /// Fraction of requests whose TTFT was at or below the chosen pod's predicted TTFT: about
    /// 0.5 for a central model such as the predictor's.
    pub ttft_coverage: f64,
    /// The predictor's own running report (recent window, p90 coverage).
    pub online: AccuracyReport,
    /// How much of the TTFT error is the pod's step phase (see [`StepPhase`]).
    pub step_phase: StepPhase,
    /// [`PredictorMetrics::ttft_mape`] of each tenth of the completed requests in arrival
    /// order: the first tenths show the cold start (predictions made before the pod class had
    /// learnt from enough finished requests), the last ones the predictor once warm
    /// (docs/decisions/predictor-ttft-at-first-token.md). Zeros with fewer than 10 completed requests.
    pub ttft_mape_by_tenth: [f64; 10],
}

/// The step-phase diagnostic: a request sent to a pod in the middle of a step waits for that
/// step to end before the engine schedules it — a wait in `[0, step time)` that no feature the
/// router has at dispatch tells. Over the requests dispatched to a pod that was stepping
/// (`busy_requests`; to an idle pod the wait is 0), `mean_wait_ms` is that wait's mean and
/// `mean_wait_share` its mean fraction of the observed TTFT. `ttft_mape` is the chosen pod's
/// TTFT error over every request with a recorded phase (as [`PredictorMetrics::ttft_mape`],
/// on that subset) and `ttft_mape_phase_known` the error the same predictions would have if
/// they knew the wait: each busy pod's prediction moved by (its wait − the mean wait), which
/// removes the phase's spread and leaves the bias the predictor learned. Their difference is
/// the part of the error only the step phase explains.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepPhase {
    pub requests: u64,
    pub busy_requests: u64,
    pub mean_wait_ms: f64,
    pub mean_wait_share: f64,
    pub ttft_mape: f64,
    pub ttft_mape_phase_known: f64,
}

impl StepPhase {
    /// From (predicted TTFT, step-phase wait, observed TTFT) per request; a wait of 0 is a
    /// dispatch to an idle pod.
    pub fn of(samples: &[(f64, f64, f64)]) -> StepPhase {
        let scored: Vec<_> = samples.iter().filter(|s| s.2 > 0.0).collect();
        let busy: Vec<_> = scored.iter().filter(|s| s.1 > 0.0).collect();
        if scored.is_empty() {
            return StepPhase::default();
        }
        let n = scored.len() as f64;
        let mean_wait = if busy.is_empty() {
            0.0
        } else {
            busy.iter().map(|s| s.1).sum::<f64>() / busy.len() as f64
        };
        let known = |s: &&(f64, f64, f64)| {
            let (pred, wait, obs) = **s;
            let moved = if wait > 0.0 {
                pred + wait - mean_wait
            } else {
                pred
            };
            (moved - obs).abs() / obs
        };
        StepPhase {
            requests: scored.len() as u64,
            busy_requests: busy.len() as u64,
            mean_wait_ms: mean_wait,
            mean_wait_share: if busy.is_empty() {
                0.0
            } else {
                busy.iter().map(|s| s.1 / s.2).sum::<f64>() / busy.len() as f64
            },
            ttft_mape: scored.iter().map(|s| (s.0 - s.2).abs() / s.2).sum::<f64>() / n,
            ttft_mape_phase_known: scored.iter().map(known).sum::<f64>() / n,
        }
    }
}

/// One pod's state at a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PodSample {
    pub t_ms: f64,
    pub kv_usage: f64,
    pub waiting: u32,
    pub running: u32,
}

/// Everything one run measured. The first keys are the contract of `kvgate sim --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunMetrics {
    pub policy: String,
    pub rate_scale: f64,
    pub seed: u64,
    pub requests: u64,
    pub completed: u64,
    pub preemptions: u64,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    pub e2e_ms: Percentiles,
    /// Prompt tokens served from the prefix cache / prompt tokens, 0..1 (engine counters).
    pub prefix_hit_rate: f64,
    pub output_tok_per_s: f64,
    /// Coefficient of variation of per-pod busy time.
    pub load_imbalance_cv: f64,
    pub gate: GateCounts,
    pub predictor: PredictorMetrics,
    /// Wall-clock seconds the run took (the only non-deterministic field).
    pub sim_wall_s: f64,
    // ---- extras ----
    /// Requests no pod could take (engine admission refused, or no pod).
    pub rejected: u64,
    /// Decision branches/reasons as counted (all policies).
    pub branches: BTreeMap<String, u64>,
    /// Mean busy fraction of the pods over the run (busy time / makespan).
    pub mean_pod_busy: f64,
    pub makespan_s: f64,
    /// Histogram of the prefix scores of every (request, pod) pair at decision time.
    pub score_histogram: Vec<u64>,
    /// TTFT CDF: (ttft_ms, fraction ≤) points.
    pub ttft_cdf: Vec<(f64, f64)>,
    /// Per-pod KV usage and queue over time.
    pub pod_samples: Vec<Vec<PodSample>>,
    pub stalled_steps: u64,
    /// Sum of the router's in-flight counters after the run (0 unless accounting leaks).
    pub in_flight_left: u64,
    /// What pod outages did (runs with `--faults` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<crate::faults::FaultReport>,
    /// LoRA adapter loads over every pod (runs with `--max-loras` only): each one a slot
    /// changing adapter, so fewer loads is steadier residency.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub lora_loads: u64,
    /// The prefix index's mode, KV-event counts and accuracy ([`crate::events`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_index: Option<crate::events::IndexReport>,
    /// With SLOs (`kvgate sim --slo-ttft-ms/--slo-tpot-ms`): the share of all requests that
    /// completed meeting every objective (TTFT ≤ its SLO and mean TPOT ≤ its SLO; a request
    /// with one output token has no TPOT and meets that one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo_goodput: Option<f64>,
    /// The affinity gate's τ and ε at the end of the run (they move when `auto`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate_state: Option<GateState>,
    /// Every attempt that reached a pod, in order, when `ClusterConfig::record_routes` is on
    /// (empty otherwise; O(requests)).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteRecord>,
    /// Flow control's account (`ClusterConfig::flow` on, or classes given); see
    /// [`FlowRunReport`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowRunReport>,
    /// A fleet of more than one model (`ClusterConfig::models`): each model's figures, in the
    /// order the models were given (empty otherwise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelMetrics>,
}

/// One model of a mixed fleet in a run ([`crate::models`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelMetrics {
    pub model: String,
    /// Pods serving it, and their profile.
    pub pods: u32,
    pub profile: String,
    /// Requests naming it, and of those completed.
    pub requests: u64,
    pub completed: u64,
    pub ttft_ms: Percentiles,
    /// Prompt tokens served from the prefix cache / prompt tokens on its pods.
    pub prefix_hit_rate: f64,
    /// Its requests that completed on a pod of another model: 0, as the routing rule says.
    pub served_by_other_model: u64,
}

/// One routed attempt: the request, the pod, the gate's branch and the session's charge.
/// A P/D request's `pod` is its prefill pod, and `decode_pod` its decode pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteRecord {
    pub request: u64,
    pub pod: u32,
    pub branch: &'static str,
    pub charged_prefill_tokens: u64,
    pub decode_pod: Option<u32>,
}

/// Collects a run's events; turns them into [`RunMetrics`] at the end.
#[derive(Debug)]
pub struct RunRecorder {
    arrival_ms: Vec<f64>,
    ttft: Vec<f64>,
    tpot: Vec<f64>,
    e2e: Vec<f64>,
    ttft_ape: (f64, u64),
    tpot_ape: (f64, u64),
    /// Per request: its step-phase wait at dispatch ([`StepPhase`]); NaN while unknown.
    phase_wait_ms: Vec<f64>,
    /// (predicted TTFT, step-phase wait, observed TTFT) of the completed requests with a phase.
    phase_samples: Vec<(f64, f64, f64)>,
    /// (arrival, absolute percentage error of the TTFT prediction) per completed request.
    ttft_ape_by_arrival: Vec<(f64, f64)>,
    /// (requests with TTFT ≤ predicted, requests scored).
    ttft_covered: (f64, u64),
    branches: BTreeMap<&'static str, u64>,
    score_histogram: Vec<u64>,
    pod_samples: Vec<Vec<PodSample>>,
    sample_stride: u64,
    scrapes: u64,
    requests: u64,
    rejected: u64,
    preemptions: u64,
    first_arrival_ms: Option<f64>,
    last_finish_ms: f64,
    output_tokens: u64,
    stalled: u64,
    /// Objectives for the goodput; none = no goodput.
    slo: RequestSlo,
    slo_met: u64,
}

impl RunRecorder {
    pub fn new(pods: usize, requests: usize) -> Self {
        RunRecorder {
            arrival_ms: vec![0.0; requests],
            ttft: Vec::with_capacity(requests),
            tpot: Vec::with_capacity(requests),
            e2e: Vec::with_capacity(requests),
            ttft_ape: (0.0, 0),
            tpot_ape: (0.0, 0),
            phase_wait_ms: vec![f64::NAN; requests],
            phase_samples: Vec::new(),
            ttft_ape_by_arrival: Vec::with_capacity(requests),
            ttft_covered: (0.0, 0),
            branches: BTreeMap::new(),
            score_histogram: vec![0; SCORE_BINS],
            pod_samples: vec![Vec::new(); pods],
            sample_stride: 1,
            scrapes: 0,
            requests: 0,
            rejected: 0,
            preemptions: 0,
            first_arrival_ms: None,
            last_finish_ms: 0.0,
            output_tokens: 0,
            stalled: 0,
            slo: RequestSlo::default(),
            slo_met: 0,
        }
    }

    /// Measure goodput against these objectives.
    pub fn set_slo(&mut self, slo: RequestSlo) {
        self.slo = slo.sanitized();
    }

    /// Keep one pod sample every `stride` scrapes so that `expected_scrapes` fit the bound.
    pub fn set_sample_stride(&mut self, expected_scrapes: f64) {
        let stride = (expected_scrapes / MAX_POD_SAMPLES as f64).ceil();
        self.sample_stride = if stride.is_finite() && stride >= 1.0 {
            stride as u64
        } else {
            1
        };
    }

    pub fn sample_pods(&mut self, t_ms: f64, pods: &[PodSnapshot]) {
        self.scrapes += 1;
        if !(self.scrapes - 1).is_multiple_of(self.sample_stride) {
            return;
        }
        for (samples, p) in self.pod_samples.iter_mut().zip(pods) {
            if samples.len() < MAX_POD_SAMPLES {
                samples.push(PodSample {
                    t_ms,
                    kv_usage: p.kv_usage,
                    waiting: p.waiting,
                    running: p.running,
                });
            }
        }
    }

    pub fn decided(&mut self, d: &Decision) {
        *self.branches.entry(d.branch.as_str()).or_default() += 1;
        for p in &d.pods {
            let bin = ((p.prefix_score * SCORE_BINS as f64) as usize).min(SCORE_BINS - 1);
            self.score_histogram[bin] += 1;
        }
    }

    pub fn dispatched(&mut self, id: u64, arrival_ms: f64) {
        self.requests += 1;
        self.first_arrival_ms.get_or_insert(arrival_ms);
        if let Some(a) = self.arrival_ms.get_mut(id as usize) {
            *a = arrival_ms;
        }
    }

    pub fn rejected(&mut self, _id: u64) {
        self.requests += 1;
        self.rejected += 1;
    }

    pub fn preempted(&mut self, n: usize) {
        self.preemptions += n as u64;
    }

    pub fn stalled(&mut self) {
        self.stalled += 1;
    }

    /// Request `id` was dispatched to a pod whose current step ends `wait_ms` later (0: the
    /// pod was idle); see [`StepPhase`].
    pub fn step_phase(&mut self, id: u64, wait_ms: f64) {
        if let Some(w) = self.phase_wait_ms.get_mut(id as usize) {
            *w = wait_ms.max(0.0);
        }
    }

    /// When request `id` arrived (as dispatched), if it was.
    pub fn arrival_ms(&self, id: u64) -> Option<f64> {
        self.arrival_ms.get(id as usize).copied()
    }

    /// TTFT of a request whose first token came at `first_token_ms`.
    pub fn ttft_ms(&self, id: u64, first_token_ms: f64) -> f64 {
        first_token_ms
            - self
                .arrival_ms
                .get(id as usize)
                .copied()
                .unwrap_or(first_token_ms)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn completed(
        &mut self,
        id: u64,
        _pod: usize,
        ttft_ms: f64,
        tpot_ms: Option<f64>,
        now_ms: f64,
        output_tokens: u32,
        (predicted_ttft_ms, predicted_tpot_ms): (f64, f64),
    ) {
        let arrival = self.arrival_ms.get(id as usize).copied().unwrap_or(now_ms);
        let meets_ttft = self.slo.ttft_ms.is_none_or(|s| ttft_ms <= s);
        let meets_tpot = self
            .slo
            .tpot_ms
            .is_none_or(|s| tpot_ms.is_none_or(|t| t <= s));
        if meets_ttft && meets_tpot {
            self.slo_met += 1;
        }
        self.ttft.push(ttft_ms);
        self.e2e.push(now_ms - arrival);
        self.output_tokens += u64::from(output_tokens);
        self.last_finish_ms = self.last_finish_ms.max(now_ms);
        if let Some(w) = self.phase_wait_ms.get(id as usize).filter(|w| !w.is_nan()) {
            self.phase_samples.push((predicted_ttft_ms, *w, ttft_ms));
        }
        if ttft_ms > 0.0 {
            let ape = (predicted_ttft_ms - ttft_ms).abs() / ttft_ms;
            self.ttft_ape_by_arrival.push((arrival, ape));
            self.ttft_ape.0 += ape;
            self.ttft_ape.1 += 1;
            self.ttft_covered.0 += f64::from(u8::from(ttft_ms <= predicted_ttft_ms));
            self.ttft_covered.1 += 1;
        }
        if let Some(tpot) = tpot_ms {
            self.tpot.push(tpot);
            if tpot > 0.0 {
                self.tpot_ape.0 += (predicted_tpot_ms - tpot).abs() / tpot;
                self.tpot_ape.1 += 1;
            }
        }
    }

    pub fn finish(mut self, engines: &[EngineMetrics], accuracy: AccuracyReport) -> RunMetrics {
        let completed = self.ttft.len() as u64;
        let makespan_ms = (self.last_finish_ms - self.first_arrival_ms.unwrap_or(0.0)).max(0.0);
        let busy: Vec<f64> = engines.iter().map(|m| m.busy_ms).collect();
        let mean_busy = busy.iter().sum::<f64>() / busy.len().max(1) as f64;
        let var =
            busy.iter().map(|b| (b - mean_busy).powi(2)).sum::<f64>() / busy.len().max(1) as f64;
        let queries: u64 = engines.iter().map(|m| m.prefix_cache_queries_tokens).sum();
        let hits: u64 = engines.iter().map(|m| m.prefix_cache_hits_tokens).sum();
        let ttft = Percentiles::of(&mut self.ttft);
        let ttft_cdf = cdf_points(&self.ttft);
        let count = |b: &str| self.branches.get(b).copied().unwrap_or(0);
        RunMetrics {
            policy: String::new(),
            rate_scale: 1.0,
            seed: 0,
            requests: self.requests,
            completed,
            preemptions: engines.iter().map(|m| m.preemptions).sum(),
            lora_loads: engines.iter().map(|m| m.lora_loads).sum(),
            ttft_ms: ttft,
            tpot_ms: Percentiles::of(&mut self.tpot),
            e2e_ms: Percentiles::of(&mut self.e2e),
            prefix_hit_rate: if queries > 0 {
                hits as f64 / queries as f64
            } else {
                0.0
            },
            output_tok_per_s: if makespan_ms > 0.0 {
                self.output_tokens as f64 / (makespan_ms / 1000.0)
            } else {
                0.0
            },
            load_imbalance_cv: if mean_busy > 0.0 {
                var.sqrt() / mean_busy
            } else {
                0.0
            },
            gate: GateCounts {
                explore: count("explore"),
                exploit: count("exploit"),
                no_sticky: count("no_sticky"),
                load_break: count("load_break"),
            },
            predictor: PredictorMetrics {
                ttft_mape: ratio(self.ttft_ape),
                tpot_mape: ratio(self.tpot_ape),
                ttft_coverage: ratio(self.ttft_covered),
                online: accuracy,
                step_phase: StepPhase::of(&self.phase_samples),
                ttft_mape_by_tenth: mape_by_tenth(&mut self.ttft_ape_by_arrival),
            },
            sim_wall_s: 0.0,
            rejected: self.rejected,
            branches: self
                .branches
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            mean_pod_busy: if makespan_ms > 0.0 {
                mean_busy / makespan_ms
            } else {
                0.0
            },
            makespan_s: makespan_ms / 1000.0,
            score_histogram: self.score_histogram,
            ttft_cdf,
            pod_samples: self.pod_samples,
            stalled_steps: self.stalled,
            slo_goodput: (self.slo != RequestSlo::default())
                .then(|| self.slo_met as f64 / self.requests.max(1) as f64),
            gate_state: None,
            routes: Vec::new(),
            flow: None,
            models: Vec::new(),
            in_flight_left: 0,
            faults: None,
            kv_index: None,
        }
    }
}

/// Mean of the errors in each tenth of `(arrival, error)` sorted by arrival (equal counts, the
/// remainder spread over the first tenths); zeros with fewer than 10 samples.
fn mape_by_tenth(samples: &mut [(f64, f64)]) -> [f64; 10] {
    let mut tenths = [0.0; 10];
    if samples.len() < tenths.len() {
        return tenths;
    }
    samples.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = samples.len();
    for (i, t) in tenths.iter_mut().enumerate() {
        let part = &samples[i * n / 10..(i + 1) * n / 10];
        *t = part.iter().map(|s| s.1).sum::<f64>() / part.len() as f64;
    }
    tenths
}

fn ratio((sum, n): (f64, u64)) -> f64 {
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// Up to [`CDF_POINTS`] evenly spaced points of the CDF of sorted samples.
fn cdf_points(sorted: &[f64]) -> Vec<(f64, f64)> {
    if sorted.is_empty() {
        return Vec::new();
    }
    let n = sorted.len();
    (1..=CDF_POINTS.min(n))
        .map(|i| {
            let q = i as f64 / CDF_POINTS.min(n) as f64;
            (nearest_rank(sorted, q), q)
        })
        .collect()
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_phase_diagnostic_removes_the_waits_spread_and_keeps_the_bias() {
        // Two busy dispatches waiting 2 and 8 ms (mean 5) and one to an idle pod; each
        // prediction is right but for the wait's spread: moved by (wait − 5) it is exact.
        let samples = [(10.0, 2.0, 7.0), (10.0, 8.0, 13.0), (4.0, 0.0, 5.0)];
        let p = StepPhase::of(&samples);
        assert_eq!((p.requests, p.busy_requests), (3, 2));
        assert!((p.mean_wait_ms - 5.0).abs() < 1e-12);
        assert!((p.mean_wait_share - (2.0 / 7.0 + 8.0 / 13.0) / 2.0).abs() < 1e-12);
        let plain = (3.0 / 7.0 + 3.0 / 13.0 + 1.0 / 5.0) / 3.0;
        assert!((p.ttft_mape - plain).abs() < 1e-12);
        // Only the idle pod's miss (the bias) is left.
        assert!((p.ttft_mape_phase_known - (1.0 / 5.0) / 3.0).abs() < 1e-12);
        assert_eq!(StepPhase::of(&[]), StepPhase::default());
    }

    #[test]
    fn the_mape_by_tenth_follows_arrival_order_not_completion_order() {
        let mut r = RunRecorder::new(1, 20);
        // Completed in reverse: request i arrives at i ms, the first two are 100 % off.
        for id in (0..20u64).rev() {
            r.dispatched(id, id as f64);
            let predicted = if id < 2 { 20.0 } else { 10.0 };
            r.completed(id, 0, 10.0, None, 100.0, 1, (predicted, 5.0));
        }
        let m = r.finish(&[], AccuracyReport::default());
        let mut expect = [0.0; 10];
        expect[0] = 1.0;
        assert_eq!(m.predictor.ttft_mape_by_tenth, expect);
    }

    #[test]
    fn nearest_rank_percentiles_are_exact_on_small_samples() {
        let mut s: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&mut s);
        assert_eq!((p.p50, p.p90, p.p99), (50.0, 90.0, 99.0));
        assert_eq!(p.mean, 50.5);
        assert_eq!(Percentiles::of(&mut []), Percentiles::default());
    }

    #[test]
    fn ttft_coverage_counts_requests_at_or_below_their_prediction() {
        let mut r = RunRecorder::new(1, 4);
        for (id, (actual, predicted)) in [(10.0, 12.0), (10.0, 10.0), (10.0, 9.0), (20.0, 30.0)]
            .into_iter()
            .enumerate()
        {
            r.dispatched(id as u64, 0.0);
            r.completed(id as u64, 0, actual, None, 50.0, 1, (predicted, 5.0));
        }
        let m = r.finish(&[], AccuracyReport::default());
        assert_eq!(m.predictor.ttft_coverage, 0.75);
        assert_eq!(
            m.predictor.ttft_mape_by_tenth, [0.0; 10],
            "too few to split"
        );
        assert!((m.predictor.ttft_mape - (0.2 + 0.0 + 0.1 + 0.5) / 4.0).abs() < 1e-12);
    }
}
