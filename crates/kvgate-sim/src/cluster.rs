//! The cluster event loop: N engine models with kvgate's router in front, in discrete time.
//!
//! The router is fed exactly as in production (DESIGN.md §6):
//! - pod metrics (`waiting`, `running`, KV usage) are refreshed every `scrape_interval_ms`
//!   (default 50 ms) from the engines, so the router sees them with a scrape delay;
//! - the router's own in-flight counters are exact (updated at dispatch, first token, finish);
//! - the prefix index is the routed (approximate) index, learning from where requests went;
//! - the predictor trains online from each completed request's features at dispatch, its TTFT
//!   and mean TPOT, as the gateway does.
//!
//! Events, in time order (ties: step ends, then scrapes, then arrivals; then by sequence), make
//! a run deterministic: the same workload, config and seed give the same result on any machine.
//!
//! Each busy pod has exactly one pending "step end" event. At a step end the step's emissions are
//! applied at the step's end time, and the engine's next step starts immediately if it has work.
//! An arrival at an idle pod starts a step at once.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use kvgate_core::decision::Branch;
use kvgate_core::index::PrefixIndex;
use kvgate_core::index::routed::RoutedIndex;
use kvgate_core::policy::{PolicyKind, RequestSlo};
use kvgate_core::predictor::{Features, LatencyPredictor, PredictorConfig};
use kvgate_core::{DecisionRng, PodId, PodSnapshot, Router, RouterConfig};
use rand::SeedableRng;

use crate::engine::{Engine, EngineRequest};
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
    index: RoutedIndex,
    predictor: LatencyPredictor,
    rng: DecisionRng,
    in_flight: Vec<Option<InFlightRequest>>,
    /// Pending step ends: (time key, pod). One per busy pod.
    steps: BinaryHeap<Reverse<(u64, u32)>>,
    busy: Vec<bool>,
    recorder: RunRecorder,
}

impl Cluster {
    fn new(config: &ClusterConfig, requests: usize) -> Self {
        let fleet = config.fleet();
        let pods = fleet.len() as u32;
        let engines: Vec<Engine> = fleet
            .iter()
            .map(|profile| Engine::new(profile, config.kv_blocks))
            .collect();
        let mut index = RoutedIndex::new();
        let snapshots = (0..pods)
            .zip(&fleet)
            .map(|(i, profile)| {
                let kv_blocks = config.kv_blocks.unwrap_or(profile.kv_blocks);
                index.set_capacity(PodId(i), kv_blocks);
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
            busy: vec![false; pods as usize],
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
        loop {
            let step = self.steps.peek().map(|Reverse((t, _))| *t);
            let arrival = requests.get(next_arrival).map(|r| time_key(arrival_ms(r)));
            // At equal times: step ends, then scrapes, then arrivals.
            let (is_step_end, at) = match (step, arrival) {
                (None, None) => break,
                (Some(s), None) => (true, s),
                (None, Some(a)) => (false, a),
                (Some(s), Some(a)) => (s <= a, s.min(a)),
            };
            // Scrapes happen at multiples of the interval while anything is pending.
            let scrape = time_key(next_scrape);
            if scrape < at || (scrape == at && !is_step_end) {
                self.scrape(next_scrape);
                next_scrape += interval;
                continue;
            }
            if is_step_end {
                if let Some(Reverse((t, pod))) = self.steps.pop() {
                    self.step_end(pod as usize, f64::from_bits(t));
                }
            } else if let Some(r) = requests.get(next_arrival) {
                next_arrival += 1;
                self.arrive(r, arrival_ms(r));
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
        metrics.gate_state = self.router.gate_state();
        metrics
    }

    fn scrape(&mut self, now_ms: f64) {
        for (snap, engine) in self.snapshots.iter_mut().zip(&self.engines) {
            let m = engine.metrics();
            snap.waiting = m.num_requests_waiting;
            snap.running = m.num_requests_running;
            snap.kv_usage = m.kv_cache_usage;
        }
        self.recorder.sample_pods(now_ms, &self.snapshots);
    }

    fn arrive(&mut self, r: &SimRequest, now: f64) {
        let decided = if self.config.slo_routing && self.config.slo != RequestSlo::default() {
            self.router.decide_with_slo(
                &r.blocks,
                r.input_tokens,
                self.config.slo,
                &self.snapshots,
                &self.index,
                &self.predictor,
                &mut self.rng,
            )
        } else {
            self.router.decide(
                &r.blocks,
                r.input_tokens,
                &self.snapshots,
                &self.index,
                &self.predictor,
                &mut self.rng,
            )
        };
        let decision = match decided {
            Ok(d) => d,
            Err(_) => {
                self.recorder.rejected(r.id);
                return;
            }
        };
        let pod = decision.pod_id.index();
        let chosen = decision
            .pods
            .iter()
            .position(|p| p.id == decision.pod)
            .and_then(|i| decision.pods.get(i));
        let (score, ttft, tpot) = chosen.map_or((0.0, 0.0, 0.0), |p| {
            (p.prefix_score, p.predicted_ttft_ms, p.predicted_tpot_ms)
        });
        self.recorder.decided(&decision);
        self.index.record_routed(decision.pod_id, &r.blocks);

        let snap = &mut self.snapshots[pod];
        let features = Features::new(snap, r.input_tokens, score);
        let cached_tokens =
            (score * r.blocks.len() as f64).round() * f64::from(SIM_BLOCK_SIZE_TOKENS);
        let prefill_charge = (f64::from(r.input_tokens) - cached_tokens).max(0.0) as u64;
        if self.engines[pod]
            .add_request(now, EngineRequest::from(r))
            .is_err()
        {
            self.recorder.rejected(r.id);
            return;
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
            });
        }
        self.recorder.dispatched(r.id, now);
        if !self.busy[pod] {
            self.start_step(pod, now);
        }
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
        self.steps
            .push(Reverse((time_key(outcome.end_ms), pod as u32)));
    }

    fn step_end(&mut self, pod: usize, now_ms: f64) {
        let outcome = self.engines[pod].last_outcome();
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
