//! The cluster event loop: N engine models with kvgate's router in front, in discrete time.
//!
//! The router is fed exactly as in production (DESIGN.md §6):
//! - pod metrics (`waiting`, `running`, KV usage) are refreshed every `scrape_interval_ms`
//!   (default 50 ms) from the engines, so the router sees them with a scrape delay;
//! - the router's own in-flight counters are exact (updated at dispatch, first token, finish);
//! - the prefix index is the routed (approximate) index, learning from where requests went, or
//!   (`ClusterConfig::index`) the engine index fed by the pods' KV events with a delay and a
//!   loss rate ([`crate::events`]);
//! - the predictor trains online from each completed request's features at dispatch, its TTFT
//!   and mean TPOT, as the gateway does.
//!
//! Events, in time order (ties: step ends, then scrapes, then arrivals; then by sequence), make
//! a run deterministic: the same workload, config and seed give the same result on any machine.
//!
//! Pod outages (`faults`, see [`crate::faults`]) are events too: at equal times they come after
//! step ends and before scrapes and arrivals.
//!
//! Each busy pod has exactly one pending "step end" event. At a step end the step's emissions are
//! applied at the step's end time, and the engine's next step starts immediately if it has work.
//! An arrival at an idle pod starts a step at once.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use kvgate_core::decision::Branch;
use kvgate_core::policy::{PolicyKind, RequestSlo};
use kvgate_core::predictor::{Features, LatencyPredictor, PredictorConfig};
use kvgate_core::{DecisionRng, PodSnapshot, Router, RouterConfig};
use rand::SeedableRng;

use crate::engine::{Engine, EngineRequest};
use crate::events::{IndexConfig, SimIndex};
use crate::faults::{FaultPlan, FaultRecorder, MAX_RETRIES};
use crate::profiles::Profile;
use crate::report::{RunMetrics, RunRecorder};
use crate::{SIM_BLOCK_SIZE_TOKENS, SimRequest};

/// Default scrape interval of pod metrics, as the gateway's default.
pub const DEFAULT_SCRAPE_INTERVAL_MS: f64 = 50.0;

/// One simulated run: a fleet, a policy, a seed.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub pods: u32,
    pub profile: &'static Profile,
    /// A mixed fleet: one profile per pod, overriding `pods` × `profile` when not empty. Each
    /// pod's `PodSnapshot::class` is its profile's name, so the predictor keeps one model per
    /// profile.
    pub pod_profiles: Vec<&'static Profile>,
    /// Ablation: every pod reports the same class, so one predictor model serves the whole
    /// (possibly mixed) fleet.
    pub class_blind_predictor: bool,
    /// Overrides the profile's KV blocks per pod.
    pub kv_blocks: Option<u32>,
    pub scrape_interval_ms: f64,
    pub policy: PolicyKind,
    pub router: RouterConfig,
    pub predictor: PredictorConfig,
    /// Seeds the decision RNG (exploration, random policies).
    pub seed: u64,
    /// Multiplies the workload's arrival rate (arrival times are divided by it).
    pub rate_scale: f64,
    /// Pod outages during the run (`--faults`); `None`: every pod stays up.
    pub faults: Option<FaultPlan>,
    /// The router's prefix index: routed, or engine events with delay and loss.
    pub index: IndexConfig,
    /// Latency objectives every request carries (none by default). The run reports goodput
    /// against them; with `slo_routing` the router decides with them
    /// (`Router::decide_with_slo`, the gateway's `x-slo-*` headers).
    pub slo: RequestSlo,
    pub slo_routing: bool,
}

impl ClusterConfig {
    pub fn new(pods: u32, policy: PolicyKind, seed: u64) -> Self {
        ClusterConfig {
            pods,
            profile: Profile::default_profile(),
            pod_profiles: Vec::new(),
            class_blind_predictor: false,
            kv_blocks: None,
            scrape_interval_ms: DEFAULT_SCRAPE_INTERVAL_MS,
            policy,
            router: RouterConfig::default(),
            predictor: PredictorConfig::default(),
            seed,
            rate_scale: 1.0,
            faults: None,
            index: IndexConfig::default(),
            slo: RequestSlo::default(),
            slo_routing: true,
        }
    }

    /// The profile of each pod: `pod_profiles`, or `pods` (at least 1) × `profile`.
    pub fn fleet(&self) -> Vec<&'static Profile> {
        if self.pod_profiles.is_empty() {
            vec![self.profile; self.pods.max(1) as usize]
        } else {
            self.pod_profiles.clone()
        }
    }
}

/// The class every pod reports under `class_blind_predictor`.
pub const CLASS_BLIND: &str = "all";

/// What the router remembers about a dispatched request until it finishes.
#[derive(Debug, Clone, Copy)]
struct InFlightRequest {
    pod: u32,
    features: Features,
    predicted_ttft_ms: f64,
    predicted_tpot_ms: f64,
    /// Uncached prompt tokens charged to the pod's `in_flight.prefill_tokens` until first token.
    prefill_charge: u64,
    /// Tokens charged to the pod's `in_flight.decode_tokens` since the first token.
    decode_charge: u64,
    first_token_ms: Option<f64>,
    /// 0 for the first attempt, then 1, 2, … after the pod died before the first token.
    attempt: u8,
}

/// How routing one attempt of a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routed {
    Dispatched,
    /// No pod could take it (no healthy pod, or the engine refused it).
    NoPod,
    /// Every attempt hit a dead pod.
    OutOfRetries,
}

/// What happens next in the event loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    StepEnd,
    Fault,
    Arrival,
}

/// A pod going down (`down`) or coming back, at `at_ms`.
#[derive(Debug, Clone, Copy)]
struct FaultEvent {
    at_ms: f64,
    pod: u32,
    down: bool,
}

/// Time as an orderable key: non-negative finite f64 bit patterns sort like the numbers.
fn time_key(ms: f64) -> u64 {
    ms.max(0.0).to_bits()
}

/// Runs `requests` (in arrival order) through the fleet and returns the run's metrics.
pub fn run(config: &ClusterConfig, requests: &[SimRequest]) -> RunMetrics {
    Cluster::new(config, requests.len()).run(requests)
}

struct Cluster {
    config: ClusterConfig,
    engines: Vec<Engine>,
    snapshots: Vec<PodSnapshot>,
    router: Router,
    index: SimIndex,
    predictor: LatencyPredictor,
    rng: DecisionRng,
    in_flight: Vec<Option<InFlightRequest>>,
    /// Pending step ends: (time key, pod). One per busy pod, plus stale ones of crashed pods.
    steps: BinaryHeap<Reverse<(u64, u32)>>,
    /// The time key of each pod's pending step end; a popped entry that differs is stale.
    step_due: Vec<Option<u64>>,
    busy: Vec<bool>,
    /// False while the pod is down (an outage).
    up: Vec<bool>,
    fault_events: Vec<FaultEvent>,
    next_fault: usize,
    faults: Option<FaultRecorder>,
    recorder: RunRecorder,
}

impl Cluster {
    fn new(config: &ClusterConfig, requests: usize) -> Self {
        let fleet = config.fleet();
        let pods = fleet.len() as u32;
        let capacities: Vec<u32> = fleet
            .iter()
            .map(|profile| config.kv_blocks.unwrap_or(profile.kv_blocks))
            .collect();
        let index = SimIndex::new(config.index, &capacities, config.seed);
        let engines: Vec<Engine> = fleet
            .iter()
            .map(|profile| {
                let mut engine = Engine::new(profile, config.kv_blocks);
                engine.set_record_kv_events(index.wants_events());
                engine
            })
            .collect();
        let snapshots = (0..pods)
            .zip(&fleet)
            .map(|(i, profile)| {
                let kv_blocks = config.kv_blocks.unwrap_or(profile.kv_blocks);
                let class = if config.class_blind_predictor {
                    CLASS_BLIND
                } else {
                    profile.name
                };
                PodSnapshot::idle(i, class, kv_blocks)
            })
            .collect();
        let mut recorder = RunRecorder::new(pods as usize, requests);
        recorder.set_slo(config.slo);
        Cluster {
            router: Router::new(config.router, config.policy),
            predictor: LatencyPredictor::new(config.predictor.clone()),
            rng: DecisionRng::seed_from_u64(config.seed),
            engines,
            snapshots,
            index,
            in_flight: vec![None; requests],
            steps: BinaryHeap::new(),
            step_due: vec![None; pods as usize],
            busy: vec![false; pods as usize],
            up: vec![true; pods as usize],
            fault_events: Vec::new(),
            next_fault: 0,
            faults: None,
            recorder,
            config: config.clone(),
        }
    }

    fn run(mut self, requests: &[SimRequest]) -> RunMetrics {
        let interval = self.config.scrape_interval_ms.max(0.001);
        let mut next_scrape = 0.0_f64;
        let mut next_arrival = 0usize;
        let scale = if self.config.rate_scale > 0.0 {
            self.config.rate_scale
        } else {
            1.0
        };
        let arrival_ms = |r: &SimRequest| r.arrival_ms / scale;
        let last_arrival = requests.last().map_or(0.0, arrival_ms);
        self.recorder.set_sample_stride(last_arrival / interval);
        self.plan_faults(last_arrival);
        loop {
            let step = self.steps.peek().map(|Reverse((t, _))| *t);
            let arrival = requests.get(next_arrival).map(|r| time_key(arrival_ms(r)));
            if step.is_none() && arrival.is_none() {
                break;
            }
            let fault = self
                .fault_events
                .get(self.next_fault)
                .map(|e| time_key(e.at_ms));
            // At equal times: step ends, then faults, then scrapes, then arrivals.
            let mut next: Option<(u64, Next)> = None;
            for (t, kind) in [
                (step, Next::StepEnd),
                (fault, Next::Fault),
                (arrival, Next::Arrival),
            ] {
                if let Some(t) = t
                    && next.is_none_or(|(best, _)| t < best)
                {
                    next = Some((t, kind));
                }
            }
            let Some((at, kind)) = next else { break };
            // Scrapes happen at multiples of the interval while anything is pending.
            let scrape = time_key(next_scrape);
            if scrape < at || (scrape == at && kind == Next::Arrival) {
                self.scrape(next_scrape);
                next_scrape += interval;
                continue;
            }
            match kind {
                Next::StepEnd => {
                    if let Some(Reverse((t, pod))) = self.steps.pop()
                        && self.step_due[pod as usize] == Some(t)
                    {
                        self.step_due[pod as usize] = None;
                        self.step_end(pod as usize, f64::from_bits(t));
                    }
                }
                Next::Fault => {
                    let e = self.fault_events[self.next_fault];
                    self.next_fault += 1;
                    if e.down {
                        self.pod_down(e.pod as usize, e.at_ms, requests);
                    } else {
                        self.up[e.pod as usize] = true;
                    }
                }
                Next::Arrival => {
                    if let Some(r) = requests.get(next_arrival) {
                        next_arrival += 1;
                        self.arrive(r, arrival_ms(r));
                    }
                }
            }
        }
        let engines: Vec<_> = self.engines.iter().map(Engine::metrics).collect();
        let leaked: u64 = self
            .snapshots
            .iter()
            .map(|s| {
                u64::from(s.in_flight.requests)
                    + s.in_flight.prefill_tokens
                    + s.in_flight.decode_tokens
            })
            .sum();
        let mut metrics = self.recorder.finish(&engines, self.predictor.accuracy());
        metrics.in_flight_left = leaked;
        metrics.faults = self.faults.map(FaultRecorder::finish);
        metrics.kv_index = Some(self.index.report());
        metrics.gate_state = self.router.gate_state();
        metrics
    }

    /// Turns the configured fault plan into down/up events up to the last arrival.
    fn plan_faults(&mut self, last_arrival_ms: f64) {
        let Some(plan) = &self.config.faults else {
            return;
        };
        let outages = plan.outages(self.engines.len() as u32, last_arrival_ms);
        for o in &outages {
            self.fault_events.push(FaultEvent {
                at_ms: o.down_ms,
                pod: o.pod,
                down: true,
            });
            self.fault_events.push(FaultEvent {
                at_ms: o.up_ms,
                pod: o.pod,
                down: false,
            });
        }
        // By time; at equal times a pod comes back before another goes down.
        self.fault_events
            .sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms).then(a.down.cmp(&b.down)));
        self.faults = Some(FaultRecorder::new(outages, last_arrival_ms));
    }

    /// A pod dies: its engine drops everything; requests without a first token are retried on
    /// another pod, streaming ones fail. The router's charges for them are released.
    fn pod_down(&mut self, pod: usize, now: f64, requests: &[SimRequest]) {
        self.up[pod] = false;
        self.busy[pod] = false;
        self.step_due[pod] = None;
        let dropped = self.engines[pod].crash(now);
        self.index.restart(pod as u32, now);
        if let Some(f) = &mut self.faults {
            f.dropped_by_crash += dropped.len() as u64;
        }
        for id in dropped {
            let Some(req) = self.in_flight.get_mut(id as usize).and_then(Option::take) else {
                continue;
            };
            let snap = &mut self.snapshots[pod];
            snap.in_flight.requests = snap.in_flight.requests.saturating_sub(1);
            if req.first_token_ms.is_none() {
                snap.in_flight.prefill_tokens = snap
                    .in_flight
                    .prefill_tokens
                    .saturating_sub(req.prefill_charge);
            } else {
                snap.in_flight.decode_tokens = snap
                    .in_flight
                    .decode_tokens
                    .saturating_sub(req.decode_charge);
            }
            let arrival = self.recorder.arrival_ms(id).unwrap_or(now);
            let retry = req.first_token_ms.is_none() && req.attempt < MAX_RETRIES;
            let routed = match requests.get(id as usize) {
                Some(r) if retry => {
                    if let Some(f) = &mut self.faults {
                        f.retried += 1;
                    }
                    self.route(r, now, req.attempt + 1, &mut vec![pod as u32])
                }
                _ => Routed::OutOfRetries,
            };
            if routed != Routed::Dispatched
                && let Some(f) = &mut self.faults
            {
                f.failed(arrival, req.first_token_ms.is_some());
            }
        }
    }

    fn scrape(&mut self, now_ms: f64) {
        for ((snap, engine), up) in self.snapshots.iter_mut().zip(&self.engines).zip(&self.up) {
            // A down pod's scrape fails: unhealthy, its last figures kept.
            snap.healthy = *up;
            if !up {
                continue;
            }
            let m = engine.metrics();
            snap.waiting = m.num_requests_waiting;
            snap.running = m.num_requests_running;
            snap.kv_usage = m.kv_cache_usage;
        }
        self.recorder.sample_pods(now_ms, &self.snapshots);
    }

    fn arrive(&mut self, r: &SimRequest, now: f64) {
        if let Some(f) = &mut self.faults {
            f.arrived(now);
        }
        match self.route(r, now, 0, &mut Vec::new()) {
            Routed::Dispatched => self.recorder.dispatched(r.id, now),
            Routed::NoPod => self.recorder.rejected(r.id),
            Routed::OutOfRetries => {
                self.recorder.dispatched(r.id, now);
                if let Some(f) = &mut self.faults {
                    f.failed(now, false);
                }
            }
        }
    }

    /// Decides and dispatches one attempt of `r` (and the next ones while the chosen pod turns
    /// out to be down), with the `excluded` pods unavailable to it.
    fn route(
        &mut self,
        r: &SimRequest,
        now: f64,
        mut attempt: u8,
        excluded: &mut Vec<u32>,
    ) -> Routed {
        self.index.advance(now);
        loop {
            let healthy: Vec<bool> = excluded
                .iter()
                .map(|&p| std::mem::replace(&mut self.snapshots[p as usize].healthy, false))
                .collect();
            let decided = if self.config.slo_routing && self.config.slo != RequestSlo::default() {
                self.router.decide_with_slo(
                    &r.blocks,
                    r.input_tokens,
                    self.config.slo,
                    &self.snapshots,
                    self.index.index(),
                    &self.predictor,
                    &mut self.rng,
                )
            } else {
                self.router.decide(
                    &r.blocks,
                    r.input_tokens,
                    &self.snapshots,
                    self.index.index(),
                    &self.predictor,
                    &mut self.rng,
                )
            };
            for (&p, h) in excluded.iter().zip(healthy) {
                self.snapshots[p as usize].healthy = h;
            }
            let Ok(decision) = decided else {
                return Routed::NoPod;
            };
            let pod = decision.pod_id.index();
            if !self.up[pod] {
                // Connection refused: the pod is marked unhealthy and the request decided again.
                self.snapshots[pod].healthy = false;
                excluded.push(pod as u32);
                if attempt >= MAX_RETRIES {
                    return Routed::OutOfRetries;
                }
                attempt += 1;
                if let Some(f) = &mut self.faults {
                    f.retried += 1;
                }
                continue;
            }
            // Branches and scores count the attempts that reached a pod.
            self.recorder.decided(&decision);
            return self.dispatch(r, now, &decision, attempt);
        }
    }

    /// Sends `r` to the pod `decision` chose: index, router charges, engine.
    fn dispatch(
        &mut self,
        r: &SimRequest,
        now: f64,
        decision: &kvgate_core::decision::Decision,
        attempt: u8,
    ) -> Routed {
        let pod = decision.pod_id.index();
        let chosen = decision
            .pods
            .iter()
            .position(|p| p.id == decision.pod)
            .and_then(|i| decision.pods.get(i));
        let (score, ttft, tpot) = chosen.map_or((0.0, 0.0, 0.0), |p| {
            (p.prefix_score, p.predicted_ttft_ms, p.predicted_tpot_ms)
        });
        let index_blocks = (score * r.blocks.len() as f64).round() as u32;
        let true_blocks = self.engines[pod].cached_prefix_blocks(&r.blocks) as u32;
        self.index.observe(index_blocks, true_blocks);
        self.index
            .index_mut()
            .record_routed(decision.pod_id, &r.blocks);

        let snap = &mut self.snapshots[pod];
        let features = Features::new(snap, r.input_tokens, score);
        let cached_tokens =
            (score * r.blocks.len() as f64).round() * f64::from(SIM_BLOCK_SIZE_TOKENS);
        let prefill_charge = (f64::from(r.input_tokens) - cached_tokens).max(0.0) as u64;
        if self.engines[pod]
            .add_request(now, EngineRequest::from(r))
            .is_err()
        {
            return Routed::NoPod;
        }
        snap.in_flight.requests += 1;
        snap.in_flight.prefill_tokens += prefill_charge;
        if let Some(slot) = self.in_flight.get_mut(r.id as usize) {
            *slot = Some(InFlightRequest {
                pod: pod as u32,
                features,
                predicted_ttft_ms: ttft,
                predicted_tpot_ms: tpot,
                prefill_charge,
                decode_charge: 0,
                first_token_ms: None,
                attempt,
            });
        }
        if !self.busy[pod] {
            self.start_step(pod, now);
        }
        Routed::Dispatched
    }

    fn start_step(&mut self, pod: usize, now_ms: f64) {
        let engine = &mut self.engines[pod];
        if engine.next_step_time().is_none() {
            self.busy[pod] = false;
            return;
        }
        let outcome = engine.step(now_ms);
        if outcome.scheduled_seqs == 0 {
            // Nothing could be scheduled (cannot happen with admission checks); wait for the
            // next arrival rather than spin at the same instant.
            self.busy[pod] = false;
            self.recorder.stalled();
            return;
        }
        self.busy[pod] = true;
        let due = time_key(outcome.end_ms);
        self.step_due[pod] = Some(due);
        self.steps.push(Reverse((due, pod as u32)));
    }

    fn step_end(&mut self, pod: usize, now_ms: f64) {
        let outcome = self.engines[pod].last_outcome();
        self.index.publish(pod as u32, now_ms, &outcome.kv_events);
        self.recorder.preempted(outcome.preempted.len());
        for e in &outcome.emissions {
            let Some(Some(req)) = self.in_flight.get_mut(e.request_id as usize) else {
                continue;
            };
            let snap = &mut self.snapshots[pod];
            if req.first_token_ms.is_none() {
                req.first_token_ms = Some(now_ms);
                snap.in_flight.prefill_tokens = snap
                    .in_flight
                    .prefill_tokens
                    .saturating_sub(req.prefill_charge);
                req.decode_charge = req.features.input_tokens as u64;
                snap.in_flight.decode_tokens += req.decode_charge;
            }
            req.decode_charge += 1;
            snap.in_flight.decode_tokens += 1;
            if e.finished {
                snap.in_flight.requests = snap.in_flight.requests.saturating_sub(1);
                snap.in_flight.decode_tokens = snap
                    .in_flight
                    .decode_tokens
                    .saturating_sub(req.decode_charge);
                let req = *req;
                self.in_flight[e.request_id as usize] = None;
                let first = req.first_token_ms.unwrap_or(now_ms);
                let ttft = self.recorder.ttft_ms(e.request_id, first);
                if let Some(f) = &mut self.faults {
                    let arrival = self.recorder.arrival_ms(e.request_id).unwrap_or(first);
                    f.completed(arrival, ttft);
                }
                let tpot = (e.output_tokens_so_far > 1)
                    .then(|| (now_ms - first) / f64::from(e.output_tokens_so_far - 1));
                self.predictor
                    .observe(&self.snapshots[pod].class, &req.features, ttft, tpot);
                self.recorder.completed(
                    e.request_id,
                    req.pod as usize,
                    ttft,
                    tpot,
                    now_ms,
                    e.output_tokens_so_far,
                    (req.predicted_ttft_ms, req.predicted_tpot_ms),
                );
            }
        }
        self.start_step(pod, now_ms);
    }
}

/// Counts of the affinity gate's branches (zeros for other policies).
pub fn gate_counts(branches: &BTreeMap<String, u64>) -> [(Branch, u64); 4] {
    [
        Branch::Explore,
        Branch::Exploit,
        Branch::NoSticky,
        Branch::LoadBreak,
    ]
    .map(|b| (b, branches.get(b.as_str()).copied().unwrap_or(0)))
}
