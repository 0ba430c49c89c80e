//! The live page on the admin listener, `/ui`: one static HTML file with its script
//! (`ui/index.html`, embedded; no build step, no outside assets), and the JSON it reads, built
//! from the handles each view reads (the pods, the session, admission) and the history in
//! [`crate::live`]: `/debug/pods`, `/debug/branches`,
//! `/debug/predictor`, `/debug/queue` (and `/debug/decisions`, [`crate::decisions`]).

use crate::config::GatewayConfig;
use crate::live::{LiveHistory, SAMPLE_INTERVAL, Sample};
use crate::pods::PodTable;
use crate::state::{AdmissionHandle, SessionHandle, Shared};
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The page itself.
pub const PAGE_HTML: &str = include_str!("ui/index.html");

/// Takes a sample now: the predictor's accuracy, the branch counts, the queues.
pub fn sample(session: &SessionHandle, admission: &AdmissionHandle, live: &LiveHistory) -> Sample {
    let acc = session.accuracy();
    Sample {
        t_ms: crate::decisions::unix_ms(),
        branch_totals: live.branch_totals(),
        ttft_mape: acc.ttft_mape,
        tpot_mape: acc.tpot_mape,
        ttft_p90_coverage: acc.ttft_p90_coverage,
        predictor_samples: acc.samples,
        active_requests: admission.slots.active(),
        admission_queued: admission.slots.queued(),
        flow_queued: admission.flow.queued(),
    }
}

/// Samples the history every [`SAMPLE_INTERVAL`] (the first at once), until the task is
/// aborted.
pub async fn sample_loop(shared: Arc<Shared>) {
    let mut ticker = tokio::time::interval(SAMPLE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        shared.telemetry.live.push(sample(
            &shared.session,
            &shared.admission,
            &shared.telemetry.live,
        ));
    }
}

/// `/debug/pods`: one entry per pod.
#[derive(Debug, Serialize)]
pub struct PodView {
    pub pod: String,
    pub class: String,
    pub role: &'static str,
    pub healthy: bool,
    /// In a failure cooldown: the breaker avoids it.
    pub breaker_open: bool,
    /// Last scrape: the engine's waiting and running requests and KV-cache use (0–1).
    pub waiting: u32,
    pub running: u32,
    pub kv_usage: f64,
    /// kvgate's ledger: its requests on the pod, and their uncached prompt tokens before first
    /// token.
    pub in_flight_requests: u32,
    pub in_flight_prefill_tokens: u64,
    /// Prompt tokens routed to the pod since start, and those kvgate's index held there.
    pub prompt_tokens: u64,
    pub cached_prompt_tokens: u64,
    /// `cached_prompt_tokens / prompt_tokens`; `null` before the first request.
    pub hit_rate: Option<f64>,
    /// `--index engine`: the engine index of the pod is stale (the routed index stands in).
    pub kv_events_stale: bool,
    /// Seconds since its last KV-event batch; `null` when none came.
    pub kv_events_last_batch_age_seconds: Option<f64>,
}

pub fn pods(pods: &PodTable, session: &SessionHandle) -> Vec<PodView> {
    let pods = pods.all();
    let (in_flight, stale): (Vec<_>, Vec<_>) = {
        let session = session.lock();
        pods.iter()
            .map(|p| {
                (
                    session.in_flight(p.id),
                    session.index().engine.is_stale(p.id),
                )
            })
            .unzip()
    };
    let now = std::time::Instant::now();
    let now_ms = crate::decisions::unix_ms();
    pods.iter()
        .zip(in_flight.into_iter().zip(stale))
        .map(|(p, (f, stale))| {
            let snap = p.snapshot();
            let (prompt, cached) = p.series.get().map_or((0, 0), |s| {
                (s.prompt_tokens.get(), s.cached_prompt_tokens.get())
            });
            let last = p.last_kv_batch_unix_ms.load(Ordering::Relaxed);
            PodView {
                pod: p.url.clone(),
                class: p.predictor_class().to_string(),
                role: p.role.name(),
                healthy: p.is_healthy(),
                breaker_open: p.breaker.is_open(now),
                waiting: snap.waiting,
                running: snap.running,
                kv_usage: snap.kv_usage,
                in_flight_requests: f.requests,
                in_flight_prefill_tokens: f.prefill_tokens,
                prompt_tokens: prompt,
                cached_prompt_tokens: cached,
                hit_rate: (prompt > 0).then(|| cached as f64 / prompt as f64),
                kv_events_stale: stale,
                kv_events_last_batch_age_seconds: (last > 0)
                    .then(|| now_ms.saturating_sub(last) as f64 / 1e3),
            }
        })
        .collect()
}

/// `/debug/branches`.
#[derive(Debug, Serialize)]
pub struct BranchesView {
    pub interval_s: u64,
    /// Decisions per branch since start.
    pub totals: std::collections::BTreeMap<&'static str, u64>,
    /// Per sampling interval (between consecutive samples, oldest first): its end and the
    /// decisions per branch in it.
    pub intervals: Vec<BranchInterval>,
}

#[derive(Debug, Serialize)]
pub struct BranchInterval {
    pub t_ms: u64,
    pub counts: std::collections::BTreeMap<&'static str, u64>,
}

pub fn branches(live: &LiveHistory) -> BranchesView {
    let samples = live.samples();
    let intervals = samples
        .windows(2)
        .map(|w| {
            let before = |name: &str| {
                w[0].branch_totals
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or(0, |e| e.1)
            };
            BranchInterval {
                t_ms: w[1].t_ms,
                counts: w[1]
                    .branch_totals
                    .iter()
                    .map(|&(n, total)| (n, total.saturating_sub(before(n))))
                    .collect(),
            }
        })
        .collect();
    BranchesView {
        interval_s: SAMPLE_INTERVAL.as_secs(),
        totals: live.branch_totals().into_iter().collect(),
        intervals,
    }
}

/// `/debug/predictor`.
#[derive(Debug, Serialize)]
pub struct PredictorView {
    pub now: kvgate_core::predictor::AccuracyReport,
    pub classes: Vec<kvgate_core::predictor::ClassAccuracy>,
    /// Oldest first: `t_ms`, `ttft_mape`, `tpot_mape`, `ttft_p90_coverage`, `predictor_samples`.
    pub history: Vec<PredictorPoint>,
}

#[derive(Debug, Serialize)]
pub struct PredictorPoint {
    pub t_ms: u64,
    pub ttft_mape: f64,
    pub tpot_mape: f64,
    pub ttft_p90_coverage: f64,
    pub predictor_samples: u64,
}

pub fn predictor(session: &SessionHandle, live: &LiveHistory) -> PredictorView {
    let (now, classes) = {
        let session = session.lock();
        (
            session.predictor().accuracy(),
            session.predictor().class_reports(),
        )
    };
    PredictorView {
        now,
        classes,
        history: live
            .samples()
            .into_iter()
            .map(|s| PredictorPoint {
                t_ms: s.t_ms,
                ttft_mape: s.ttft_mape,
                tpot_mape: s.tpot_mape,
                ttft_p90_coverage: s.ttft_p90_coverage,
                predictor_samples: s.predictor_samples,
            })
            .collect(),
    }
}

/// `/debug/queue`.
#[derive(Debug, Serialize)]
pub struct QueueView {
    pub active_requests: usize,
    pub admission_queued: usize,
    pub flow_control: bool,
    /// Flow control's queue now, per band and tenant.
    pub flow: Vec<FlowClassView>,
    /// Oldest first: `t_ms`, `active_requests`, `admission_queued`, `flow_queued`.
    pub history: Vec<QueuePoint>,
}

#[derive(Debug, Serialize)]
pub struct FlowClassView {
    pub band: i32,
    pub tenant: String,
    pub queued: usize,
}

#[derive(Debug, Serialize)]
pub struct QueuePoint {
    pub t_ms: u64,
    pub active_requests: usize,
    pub admission_queued: usize,
    pub flow_queued: usize,
}

pub fn queue(admission: &AdmissionHandle, live: &LiveHistory, cfg: &GatewayConfig) -> QueueView {
    let flow = {
        let q = admission.flow.queue.lock();
        q.queued_by_class()
            .into_iter()
            .map(|(band, tenant, queued)| FlowClassView {
                band,
                tenant: q.tenant_name(tenant).to_string(),
                queued,
            })
            .collect()
    };
    QueueView {
        active_requests: admission.slots.active(),
        admission_queued: admission.slots.queued(),
        flow_control: cfg.flow.enabled,
        flow,
        history: live
            .samples()
            .into_iter()
            .map(|s| QueuePoint {
                t_ms: s.t_ms,
                active_requests: s.active_requests,
                admission_queued: s.admission_queued,
                flow_queued: s.flow_queued,
            })
            .collect(),
    }
}
