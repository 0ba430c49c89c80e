//! The cluster event loop: N engine models with kvgate's router in front, in discrete time.
//!
//! The router is production's: one [`RouterSession`] (the core's request lifecycle, as the
//! gateway's proxy and ext_proc picker drive it) decides, charges the in-flight ledger and
//! trains the predictor; this loop only models the pods and the wire. It is fed exactly as in
//! production (DESIGN.md §6):
//! - pod metrics (`waiting`, `running`, KV usage) are refreshed every `scrape_interval_ms`
//!   (default 50 ms) from the engines, so the router sees them with a scrape delay;
//! - the router's own in-flight counters are exact (the session's ledger: dispatch, first token,
//!   every further token, finish);
//! - the prefix index is the session's hybrid index: routed (learning from where requests
//!   went), or (`ClusterConfig::index`) the engine index fed by the pods' KV events with a
//!   delay and a loss rate ([`crate::events`]);
//! - the predictor trains online from each completed request's features at dispatch, its TTFT
//!   and mean TPOT, as the gateway does.
//!
//! Events, in time order (ties: step ends, then scrapes, then arrivals; then by sequence), make
//! a run deterministic: the same workload, config and seed give the same result on any machine.
//!
//! Pod outages (`faults`, see [`crate::faults`]) are events too: at equal times they come after
//! step ends and before scrapes and arrivals.
//!
//! **Flow control** (`ClusterConfig::flow`, off by default; [`run_classified`] tags each request
//! with a [`SimClass`]): the gateway's queue, production's [`FlowQueue`] and saturation
//! detector, sits between arrival and routing. An arrival is offered with its class and the
//! fleet's headroom (the snapshots as last scraped, with the session's exact in-flight ledger;
//! the predicted-TTFT signal is not modelled); after every step end, scrape and arrival the loop
//! expires entries and releases as many as the headroom allows, each routed then. A request's
//! TTFT counts from its arrival (queue time included); the predictor trains on the pod's TTFT
//! (from its dispatch), as the gateway's does. Refused, evicted and expired requests count as
//! rejected; requests still queued when nothing else is left to happen expire then.
//! # Several router replicas (`replicas`, `sharing`)
//!
//! With `replicas` = R > 1, R routers (one [`RouterSession`] each, seeds `seed + i`) sit behind
//! a round-robin balancer: request `id` goes to replica `id mod R` (its retries too). Each
//! replica's in-flight ledger and routed index start knowing only its own requests, as
//! independent `kvgate serve` replicas. With `sharing` (the gateway's `--cluster`), each
//! replica runs the core's replica machine ([`kvgate_core::session::replica`], the code the
//! gateway runs) and [`crate::mesh`] carries its messages: every route (with the prompt's
//! blocks and its charge), first token, decode tokens in steps of 32, finish, training sample
//! and once-a-second snapshot reaches every other replica after `delay_ms`, each lost with
//! probability `loss`, and is applied when it arrives; leases expire as in the gateway. R = 1
//! runs exactly as before (no extra event, no extra random draw).
//!
//! # Prefill/decode disaggregation (`pod_roles`, `transfer_ms_per_token`)
//!
//! With a pod of a dedicated role, each request is routed by the core's
//! [`RouterSession::route_pd`], as the gateway's HTTP proxy does. A split request runs on the
//! prefill pod as a one-token request; its token ends the prefill ticket (trained on TTFT) and
//! starts the transfer: `transfer_ms_per_token` × prompt tokens later (default
//! [`DEFAULT_TRANSFER_MS_PER_TOKEN`]) the request enters the decode pod's engine with its prompt
//! already computed ([`Engine::add_transferred_request`]); its first token there is the client's
//! first token (TTFT from arrival), its ticket trains TPOT. A decode pod down when the transfer
//! lands (or refusing the request) is excluded and the request routed again with a fresh
//! prefill. Not modelled: replica sharing of split routes (each replica's own ledger still
//! holds them), and the transfer's load on either pod.
//!
//! # Mixed-model fleets (`models`)
//!
//! With [`ClusterConfig::models`] each pod serves one model and each request names one
//! ([`crate::models`]). Every decision excludes the pods of other models, through the core's
//! `pods_for_model` as the gateway's dispatch does (retries and flow-control releases too); a
//! request whose model no pod serves is rejected (the gateway's 404). Each pod's predictor
//! class is `profile@model` (all pods one class with `class_blind_predictor`). The
//! run's `models` gives each model's figures when there is more than one.
//!
//! Each busy pod has exactly one pending "step end" event. At a step end the step's emissions are
//! applied at the step's end time, and the engine's next step starts immediately if it has work.
//! An arrival at an idle pod starts a step at once.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use kvgate_core::decision::Branch;
use kvgate_core::policy::{PolicyKind, RequestSlo};
use kvgate_core::predictor::PredictorConfig;
use kvgate_core::{
    LoraSlots, Observed, PdRouted, PodId, PodRole, PodSnapshot, Route, RouteRequest, Routed,
    RouterConfig, RouterSession, Ticket,
};

use kvgate_core::flow::saturation::{pod_headroom, waiting_estimate};
use kvgate_core::flow::{
    Expiry, FleetRoom, FlowConfig, FlowQueue, FlowRequest, Offer, PredictedTtft, Rejection,
    Released, SaturationConfig, release,
};

use crate::engine::{Engine, EngineRequest, LoraConfig};
use crate::events::{IndexConfig, SimIndex};
use crate::faults::{FaultPlan, FaultRecorder, MAX_RETRIES};
use crate::mesh::Mesh;
pub use crate::mesh::Sharing;
use crate::models::ModelFleet;
use crate::models::recorder::ModelRecorder;
use crate::profiles::Profile;
use crate::report::{FlowRunReport, RunMetrics, RunRecorder};
use crate::{SIM_BLOCK_SIZE_TOKENS, SimRequest};

/// Default scrape interval of pod metrics, as the gateway's default.
pub const DEFAULT_SCRAPE_INTERVAL_MS: f64 = 50.0;

/// One replica's last scrape of one pod (staggered scrapes).
#[derive(Debug, Clone, Copy, Default)]
struct ScrapedMetrics {
    waiting: u32,
    running: u32,
    kv_usage: f64,
}

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
    /// The router's config. Its `predictor_ttft_at_first_token` decides when each TTFT is
    /// learnt, as in the gateway: at the first token ([`RouterSession::first_token_learnt`];
    /// the default profile) or when the request finishes (the seed profile). Default: the
    /// `default` profile.
    pub router: RouterConfig,
    /// The predictor's settings. Default [`PredictorConfig::for_router`] of the default
    /// `router`, as the gateway builds it (set it again after changing `router`'s predictor
    /// keys).
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
    /// against them; a policy that reads objectives (`llmd-chain`, as upstream) routes by them,
    /// as the gateway's does with `x-slo-*` headers.
    pub slo: RequestSlo,
    /// Keep every routed attempt in `RunMetrics::routes` (off by default: O(requests)).
    pub record_routes: bool,
    /// Flow control in front of the router (`enabled = false` by default: every arrival is
    /// routed at once).
    pub flow: FlowConfig,
    /// Router replicas behind a round-robin balancer (default 1).
    pub replicas: u32,
    /// How replicas share routing state; `None`: they do not (independent replicas).
    pub sharing: Option<Sharing>,
    /// With R > 1 replicas: each scrapes the pods on its own clock, replica k at
    /// k × interval / R past the shared schedule (as live replicas, each with its own scrape
    /// loop), instead of all reading one scrape. Default false (`--staggered-scrapes`).
    pub staggered_scrapes: bool,
    /// P/D disaggregation: pod i's role (`both` beyond the list; empty: every pod `both`, no
    /// request split).
    pub pod_roles: Vec<PodRole>,
    /// P/D: time to move one prompt token's KV from the prefill pod to the decode pod, ms.
    pub transfer_ms_per_token: f64,
    /// Every pod serves LoRA adapters with these slots and load time (`None`: no LoRA; requests'
    /// adapters are ignored by the engines). The scrape then reports each pod's slots, running
    /// adapters and deferred requests to the router, as the gateway reads them from vLLM.
    pub lora: Option<LoraConfig>,
    /// A mixed-model fleet: the model each pod serves and (after
    /// [`crate::models::assign`]) each request names; its pods' profiles go in `pod_profiles`
    /// ([`ModelFleet::pod_profiles`]). `None` (default): no model declared, every pod serves
    /// every request, each pod's class is its profile's name.
    pub models: Option<Arc<ModelFleet>>,
}

/// P/D transfer time per prompt token (ms): an 8B Llama-3's KV is 2 × 32 layers × 8 KV heads ×
/// 128 × 2 bytes = 128 KiB per token, over a 200 Gb/s (25 GB/s) RDMA link ≈ 5.2 µs. An
/// assumption from the model's shape and a link speed, not a measurement.
pub const DEFAULT_TRANSFER_MS_PER_TOKEN: f64 = 0.005;

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
            predictor: PredictorConfig::for_router(&RouterConfig::default()),
            seed,
            rate_scale: 1.0,
            faults: None,
            index: IndexConfig::default(),
            slo: RequestSlo::default(),
            record_routes: false,
            flow: FlowConfig::default(),
            replicas: 1,
            sharing: None,
            staggered_scrapes: false,
            pod_roles: Vec::new(),
            transfer_ms_per_token: DEFAULT_TRANSFER_MS_PER_TOKEN,
            lora: None,
            models: None,
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

/// A dispatched request until it finishes: its session ticket and what the loop measures.
#[derive(Debug)]
struct InFlightRequest {
    ticket: Ticket,
    first_token_ms: Option<f64>,
    /// 0 for the first attempt, then 1, 2, … after the pod died before the first token.
    attempt: u8,
    /// The replica that routed it.
    replica: u32,
    /// With sharing: the request's id in its replica's machine (`None`: not shared, as a P/D
    /// stage).
    shared_as: Option<u64>,
    /// P/D: on the prefill pod, the decode stage's ticket, held until the prefill's token.
    handoff: Option<Ticket>,
    /// When this stage was dispatched (the prefill stage's TTFT is from then).
    dispatched_ms: f64,
}

/// A P/D request's KV on its way to the decode pod.
#[derive(Debug)]
struct Transfer {
    ticket: Ticket,
    attempt: u8,
    replica: u32,
}

/// How routing one attempt of a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
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
    Transfer,
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

/// A request's flow-control class in a simulated run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimClass {
    pub priority: i32,
    pub tenant: u32,
}

/// [`run`] with every request tagged (`classes[id]`; a missing one is priority 0, tenant 0):
/// flow control (`config.flow`) sees the classes, and the report's `flow` keeps each request's
/// TTFT so a caller can take percentiles per class.
pub fn run_classified(
    config: &ClusterConfig,
    requests: &[SimRequest],
    classes: &[SimClass],
) -> RunMetrics {
    let mut cluster = Cluster::new(config, requests.len());
    cluster.classes = classes.to_vec();
    cluster.track_flow = true;
    cluster.run(requests)
}

struct Cluster {
    config: ClusterConfig,
    engines: Vec<Engine>,
    /// The pods' scraped state (the session fills in its in-flight counters when it routes).
    snapshots: Vec<PodSnapshot>,
    /// With staggered scrapes: each replica's own last scrape of every pod (waiting, running,
    /// KV usage), laid over `snapshots` while that replica routes; empty otherwise.
    replica_scrapes: Vec<Vec<ScrapedMetrics>>,
    /// Scrapes so far (with staggered scrapes, scrape n is replica n mod R's).
    scrapes_done: u64,
    /// One session per replica (index 0 is the only one with R = 1).
    sessions: Vec<RouterSession>,
    /// One event feed per replica (engine mode); index 0 also keeps the accuracy bookkeeping.
    indexes: Vec<SimIndex>,
    mesh: Option<Mesh>,
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
    routes: Vec<crate::report::RouteRecord>,
    /// Flow control: the queue (request id, arrival ms), classes, tenant names, dispatch times.
    flow_queue: FlowQueue<(u64, f64)>,
    classes: Vec<SimClass>,
    tenant_names: Vec<String>,
    dispatched_ms: Vec<f64>,
    track_flow: bool,
    flow_report: FlowRunReport,
    queue_ms_sum: f64,
    /// Flow control: each pod's latest predicted TTFT, from the decisions (the detector's
    /// `max_predicted_ttft_ms` signal, as in the gateway).
    predicted_ttft: PredictedTtft,
    /// P/D: some pod has a dedicated role, so requests go through `route_pd`.
    split: bool,
    /// P/D transfers in flight: (time key of arrival at the decode pod, request id).
    transfer_due: BinaryHeap<Reverse<(u64, u64)>>,
    transfers: Vec<Option<Transfer>>,
    /// A mixed-model fleet's models, and each model's completions (more than one model).
    models: Option<Arc<ModelFleet>>,
    /// Per model: the pods serving other models (`None`: no pod serves it), found once by the
    /// core's `pods_for_model` (the pods' models never change in a run).
    model_excluded: Vec<Option<Vec<PodId>>>,
    model_recorder: Option<ModelRecorder>,
}

impl Cluster {
    fn new(config: &ClusterConfig, requests: usize) -> Self {
        let fleet = config.fleet();
        let pods = fleet.len() as u32;
        let capacities: Vec<u32> = fleet
            .iter()
            .map(|profile| config.kv_blocks.unwrap_or(profile.kv_blocks))
            .collect();
        let replicas = config.replicas.max(1);
        let mut sessions = Vec::new();
        let mut indexes = Vec::new();
        for i in 0..u64::from(replicas) {
            let seed = config.seed.wrapping_add(i);
            let mut session =
                RouterSession::new(config.router, config.policy, config.predictor.clone(), seed);
            indexes.push(SimIndex::new(
                config.index,
                &capacities,
                seed,
                session.index_mut(),
            ));
            sessions.push(session);
        }
        let wants_events = indexes[0].wants_events();
        let mesh = config
            .sharing
            .filter(|_| replicas > 1)
            .map(|sharing| Mesh::new(sharing, replicas as usize, config.seed));
        let engines: Vec<Engine> = fleet
            .iter()
            .map(|profile| {
                let mut engine = Engine::for_profile(profile, config.kv_blocks);
                engine.set_record_kv_events(wants_events);
                engine.set_lora(config.lora);
                engine
            })
            .collect();
        let snapshots = (0..pods)
            .zip(&fleet)
            .map(|(i, profile)| {
                let kv_blocks = config.kv_blocks.unwrap_or(profile.kv_blocks);
                let class: Arc<str> = match &config.models {
                    _ if config.class_blind_predictor => CLASS_BLIND.into(),
                    Some(models) => models.pod_class(i as usize, profile.name),
                    None => profile.name.into(),
                };
                let mut snap = PodSnapshot::idle(i, &class, kv_blocks);
                snap.role = config
                    .pod_roles
                    .get(i as usize)
                    .copied()
                    .unwrap_or_default();
                snap.lora = config.lora.map(|l| LoraSlots {
                    max_loras: l.max_loras.max(1),
                    ..LoraSlots::default()
                });
                snap
            })
            .collect();
        let mut recorder = RunRecorder::new(pods as usize, requests);
        recorder.set_slo(config.slo);
        let replica_scrapes = if config.staggered_scrapes && config.replicas > 1 {
            vec![vec![ScrapedMetrics::default(); pods as usize]; config.replicas as usize]
        } else {
            Vec::new()
        };
        Cluster {
            sessions,
            engines,
            snapshots,
            replica_scrapes,
            scrapes_done: 0,
            indexes,
            mesh,
            in_flight: (0..requests).map(|_| None).collect(),
            steps: BinaryHeap::new(),
            step_due: vec![None; pods as usize],
            busy: vec![false; pods as usize],
            up: vec![true; pods as usize],
            fault_events: Vec::new(),
            next_fault: 0,
            faults: None,
            recorder,
            routes: Vec::new(),
            flow_queue: FlowQueue::new(),
            classes: Vec::new(),
            tenant_names: Vec::new(),
            dispatched_ms: vec![f64::NAN; requests],
            track_flow: config.flow.enabled,
            flow_report: FlowRunReport::default(),
            queue_ms_sum: 0.0,
            predicted_ttft: PredictedTtft::default(),
            split: config.pod_roles.iter().any(|r| *r != PodRole::Both),
            transfer_due: BinaryHeap::new(),
            transfers: (0..requests).map(|_| None).collect(),
            models: config.models.clone(),
            model_excluded: config.models.as_deref().map_or(Vec::new(), |m| {
                (0..m.models().len())
                    .map(|model| m.pods_excluded_for_model(model, pods as usize))
                    .collect()
            }),
            model_recorder: config
                .models
                .as_deref()
                .filter(|m| m.is_mixed())
                .map(ModelRecorder::new),
            config: config.clone(),
        }
    }

    fn run(mut self, requests: &[SimRequest]) -> RunMetrics {
        // With staggered scrapes the replicas' scrapes take turns, R per interval.
        let interval =
            self.config.scrape_interval_ms.max(0.001) / self.replica_scrapes.len().max(1) as f64;
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
        if self.track_flow {
            self.flow_report.enabled = self.config.flow.enabled;
            self.flow_report.ttft_ms_by_request = vec![f64::NAN; requests.len()];
            self.flow_report.queue_ms_by_request = vec![f64::NAN; requests.len()];
            let tenants = self.classes.iter().map(|c| c.tenant).max().unwrap_or(0);
            self.tenant_names = (0..=tenants).map(|t| format!("t{t}")).collect();
        }
        let flow_on = self.config.flow.enabled;
        loop {
            let step = self.steps.peek().map(|Reverse((t, _))| *t);
            let arrival = requests.get(next_arrival).map(|r| time_key(arrival_ms(r)));
            let transfer = self.transfer_due.peek().map(|Reverse((t, _))| *t);
            if step.is_none() && arrival.is_none() && transfer.is_none() {
                break;
            }
            let fault = self
                .fault_events
                .get(self.next_fault)
                .map(|e| time_key(e.at_ms));
            // At equal times: step ends, then faults, then transfers, then scrapes, then
            // arrivals.
            let mut next: Option<(u64, Next)> = None;
            for (t, kind) in [
                (step, Next::StepEnd),
                (fault, Next::Fault),
                (transfer, Next::Transfer),
                (arrival, Next::Arrival),
            ] {
                if let Some(t) = t
                    && next.is_none_or(|(best, _)| t < best)
                {
                    next = Some((t, kind));
                }
            }
            let Some((at, kind)) = next else { break };
            // The replicas' network: messages arriving, snapshots and lease checks due.
            if let Some(t) = self.mesh.as_ref().and_then(Mesh::next_due_ms)
                && time_key(t) < at
            {
                if let Some(mesh) = &mut self.mesh {
                    mesh.advance(t, &mut self.sessions, &self.snapshots);
                }
                continue;
            }
            // Scrapes happen at multiples of the interval while anything is pending.
            let scrape = time_key(next_scrape);
            if scrape < at || (scrape == at && kind == Next::Arrival) {
                if self.scrape(next_scrape) && flow_on {
                    self.flow_release(next_scrape, requests, arrival_ms);
                }
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
                        if flow_on {
                            self.flow_release(f64::from_bits(t), requests, arrival_ms);
                        }
                    }
                }
                Next::Transfer => {
                    if let Some(Reverse((t, id))) = self.transfer_due.pop() {
                        self.transfer_done(id, f64::from_bits(t), requests);
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
                        let now = arrival_ms(r);
                        if flow_on {
                            self.flow_arrive(r, now);
                            self.flow_release(now, requests, arrival_ms);
                        } else {
                            self.arrive(r, now);
                        }
                    }
                }
            }
        }
        // Nothing left to happen: whatever is still queued will never be served.
        for (left, _) in self.flow_queue.expire(f64::INFINITY) {
            self.flow_report.expired += 1;
            self.recorder.rejected(left.payload.0);
        }
        let engines: Vec<_> = self.engines.iter().map(Engine::metrics).collect();
        let mut metrics = self
            .recorder
            .finish(&engines, self.sessions[0].predictor().accuracy());
        // Own requests only: the peers' charges still held (events in transit, or lost with
        // no later snapshot) are released first.
        if let Some(mesh) = &mut self.mesh {
            mesh.forget_peers(&mut self.sessions);
        }
        metrics.in_flight_left = self.sessions.iter().map(|s| s.in_flight_total()).sum();
        metrics.faults = self.faults.map(FaultRecorder::finish);
        metrics.kv_index = Some(self.indexes[0].report());
        metrics.gate_state = self.sessions[0].router().gate_state();
        metrics.routes = self.routes;
        if let (Some(recorder), Some(models)) = (self.model_recorder, &self.models) {
            metrics.models = recorder.finish(models, &engines);
        }
        if self.track_flow {
            let released = self.flow_report.released.max(1) as f64;
            self.flow_report.mean_queue_ms = self.queue_ms_sum / released;
            metrics.flow = Some(self.flow_report);
        }
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
        for index in &mut self.indexes {
            index.restart(pod as u32, now);
        }
        if let Some(f) = &mut self.faults {
            f.dropped_by_crash += dropped.len() as u64;
        }
        for id in dropped {
            let Some(req) = self.in_flight.get_mut(id as usize).and_then(Option::take) else {
                continue;
            };
            if let Some(decode) = req.handoff {
                self.sessions[req.replica as usize].finish(decode, None);
            }
            self.sessions[req.replica as usize].finish(req.ticket, None);
            if let (Some(mesh), Some(shared_as)) = (&mut self.mesh, req.shared_as) {
                mesh.on(req.replica as usize, now, |m| m.finish(shared_as, None));
            }
            let arrival = self.recorder.arrival_ms(id).unwrap_or(now);
            let retry = req.first_token_ms.is_none() && req.attempt < MAX_RETRIES;
            let routed = match requests.get(id as usize) {
                Some(r) if retry => {
                    if let Some(f) = &mut self.faults {
                        f.retried += 1;
                    }
                    self.route(r, now, req.attempt + 1, &mut vec![PodId(pod as u32)])
                }
                _ => Outcome::OutOfRetries,
            };
            if routed != Outcome::Dispatched
                && let Some(f) = &mut self.faults
            {
                f.failed(arrival, req.first_token_ms.is_some());
            }
        }
    }

    /// One scrape; false when it was only a staggered replica's own (the shared snapshots,
    /// which flow control reads, were not refreshed).
    fn scrape(&mut self, now_ms: f64) -> bool {
        let turn = self.scrapes_done;
        self.scrapes_done += 1;
        let replicas = self.replica_scrapes.len() as u64;
        if replicas > 0 {
            let views = &mut self.replica_scrapes[(turn % replicas) as usize];
            for ((view, engine), up) in views.iter_mut().zip(&self.engines).zip(&self.up) {
                if *up {
                    let m = engine.metrics();
                    *view = ScrapedMetrics {
                        waiting: m.num_requests_waiting,
                        running: m.num_requests_running,
                        kv_usage: m.kv_cache_usage,
                    };
                }
            }
            // The shared snapshots (flow control, pod samples) keep the one-scrape schedule.
            if !turn.is_multiple_of(replicas) {
                return false;
            }
        }
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
            if let Some(slots) = &mut snap.lora {
                slots.running = m.lora_running;
                slots.deferred = m.num_requests_deferred;
            }
        }
        self.recorder.sample_pods(now_ms, &self.snapshots);
        true
    }

    /// An arrival under flow control: offered to the queue with its class.
    fn flow_arrive(&mut self, r: &SimRequest, now: f64) {
        let class = self.classes.get(r.id as usize).copied().unwrap_or_default();
        let cfg = self.config.flow;
        let room = self.flow_room().room();
        let tenant = self
            .tenant_names
            .get(class.tenant as usize)
            .map_or("t0", String::as_str);
        let req = FlowRequest {
            priority: class.priority,
            tenant,
            cost_tokens: u64::from(r.input_tokens) + u64::from(r.output_tokens),
            bytes: 0,
            deadline_ms: f64::INFINITY,
        };
        match self.flow_queue.offer(&cfg, req, room, now, (r.id, now)) {
            Offer::Dispatch(_) => {
                if let Some(q) = self.flow_report.queue_ms_by_request.get_mut(r.id as usize) {
                    *q = 0.0;
                }
                // At the door the router picks among every pod, as with flow control off:
                // routing only among pods with headroom here measured worse
                // (docs/decisions/flow-control.md; the cause not analysed).
                if let Some(f) = &mut self.faults {
                    f.arrived(now);
                }
                self.dispatch_arrival(r, now, now);
            }
            Offer::Queued(_, evicted) => {
                if let Some(f) = &mut self.faults {
                    f.arrived(now);
                }
                self.flow_report.queued += 1;
                self.flow_report.max_queue_len = self
                    .flow_report
                    .max_queue_len
                    .max(self.flow_queue.len() as u64);
                for e in evicted {
                    self.flow_report.evicted += 1;
                    self.recorder.rejected(e.payload.0);
                }
            }
            Offer::Rejected(why, _) => {
                let r_ = &mut self.flow_report;
                match why {
                    Rejection::Sheddable => r_.shed_sheddable += 1,
                    Rejection::TenantShare => r_.shed_tenant_share += 1,
                    Rejection::QueueFull => r_.shed_queue_full += 1,
                    Rejection::Unavailable => r_.shed_unavailable += 1,
                }
                self.recorder.rejected(r.id);
            }
        }
    }

    /// The fleet's room (the core's [`FleetRoom`], as the gateway's driver reads it): the
    /// snapshots as scraped with the session's exact ledger and the latest predicted TTFTs;
    /// nothing is being dispatched (a released request is routed at once).
    fn flow_room(&mut self) -> FleetRoom {
        for s in &mut self.snapshots {
            s.in_flight = self.sessions[0].in_flight(s.id);
        }
        FleetRoom::of(
            &self.config.flow.saturation,
            &self.snapshots,
            &self.predicted_ttft,
            0,
        )
    }

    /// Expires queued requests, then releases what the fleet's room lets go (the core's
    /// [`release`], the gateway's rule), each routed outside the pods closed to it.
    fn flow_release(
        &mut self,
        now: f64,
        requests: &[SimRequest],
        arrival_ms: impl Fn(&SimRequest) -> f64,
    ) {
        for (left, why) in self.flow_queue.expire(now) {
            debug_assert_eq!(why, Expiry::Ttl);
            self.flow_report.expired += 1;
            self.recorder.rejected(left.payload.0);
        }
        if self.flow_queue.is_empty() {
            return;
        }
        let room = self.flow_room();
        let sat = self.config.flow.saturation;
        self.note_detector(&sat);
        let mut released = Vec::new();
        release(
            &mut self.flow_queue,
            &self.config.flow,
            &room,
            now,
            |r, _| {
                released.push(r);
                true
            },
        );
        for Released { left, bulk } in released {
            self.flow_report.released += 1;
            self.queue_ms_sum += left.queued_ms;
            let (id, arrived) = left.payload;
            if let Some(q) = self.flow_report.queue_ms_by_request.get_mut(id as usize) {
                *q = left.queued_ms;
            }
            if let Some(r) = requests.get(id as usize) {
                debug_assert_eq!(arrival_ms(r), arrived);
                let mut closed = room.closed_to(bulk).to_vec();
                self.dispatch_arrival_excluding(r, now, arrived, &mut closed);
            }
        }
    }

    /// Counts what the saturation detector sees of each healthy pod (the report's
    /// `detector_*`), at a release check with requests queued.
    fn note_detector(&mut self, sat: &SaturationConfig) {
        for p in self.snapshots.iter().filter(|p| p.healthy) {
            let r = &mut self.flow_report;
            if p.kv_usage >= sat.kv_cache_util_threshold {
                r.detector_pods_kv += 1;
            } else if pod_headroom(sat, p, self.predicted_ttft.get(&p.name)) == 0 {
                r.detector_pods_queue += 1;
            } else {
                r.detector_pods_open += 1;
                r.detector_open_waiting += u64::from(waiting_estimate(p));
            }
        }
    }

    fn arrive(&mut self, r: &SimRequest, now: f64) {
        if let Some(f) = &mut self.faults {
            f.arrived(now);
        }
        self.dispatch_arrival(r, now, now);
    }

    fn dispatch_arrival(&mut self, r: &SimRequest, now: f64, arrived: f64) {
        self.dispatch_arrival_excluding(r, now, arrived, &mut Vec::new());
    }

    /// [`Self::dispatch_arrival`] with the `excluded` pods unavailable to the first decision.
    fn dispatch_arrival_excluding(
        &mut self,
        r: &SimRequest,
        now: f64,
        arrived: f64,
        excluded: &mut Vec<PodId>,
    ) {
        if let Some(d) = self.dispatched_ms.get_mut(r.id as usize) {
            *d = now;
        }
        match self.route(r, now, 0, excluded) {
            Outcome::Dispatched => self.recorder.dispatched(r.id, arrived),
            Outcome::NoPod => self.recorder.rejected(r.id),
            Outcome::OutOfRetries => {
                self.recorder.dispatched(r.id, arrived);
                if let Some(f) = &mut self.faults {
                    f.failed(arrived, false);
                }
            }
        }
    }

    /// Routes and dispatches one attempt of `r` (and the next ones while the chosen pod turns
    /// out to be down), with the `excluded` pods unavailable to it.
    /// [`Cluster::route_with_view`] with the replica's own scrape laid over the snapshots
    /// when scrapes are staggered.
    fn route(
        &mut self,
        r: &SimRequest,
        now: f64,
        attempt: u8,
        excluded: &mut Vec<PodId>,
    ) -> Outcome {
        if self.replica_scrapes.is_empty() {
            return self.route_with_view(r, now, attempt, excluded);
        }
        let replica = self.replica_of(r.id);
        let swap = |snaps: &mut [PodSnapshot], views: &mut [ScrapedMetrics]| {
            for (s, v) in snaps.iter_mut().zip(views.iter_mut()) {
                std::mem::swap(&mut s.waiting, &mut v.waiting);
                std::mem::swap(&mut s.running, &mut v.running);
                std::mem::swap(&mut s.kv_usage, &mut v.kv_usage);
            }
        };
        swap(&mut self.snapshots, &mut self.replica_scrapes[replica]);
        let outcome = self.route_with_view(r, now, attempt, excluded);
        swap(&mut self.snapshots, &mut self.replica_scrapes[replica]);
        outcome
    }

    fn route_with_view(
        &mut self,
        r: &SimRequest,
        now: f64,
        mut attempt: u8,
        excluded: &mut Vec<PodId>,
    ) -> Outcome {
        let replica = self.replica_of(r.id);
        if let Some(models) = &self.models {
            // The pods of other models are out of every decision (the gateway's
            // `served_models::not_serving`); no pod of its model: nothing to route to.
            let model = models.request_model(r.id);
            let Some(Some(others)) = self.model_excluded.get(model) else {
                return Outcome::NoPod;
            };
            for pod in others {
                if !excluded.contains(pod) {
                    excluded.push(*pod);
                }
            }
        }
        self.deliver(now);
        self.indexes[replica].advance(now, self.sessions[replica].index_mut());
        self.sessions[replica].advance_clock(now);
        let request = RouteRequest {
            blocks: &r.blocks,
            input_tokens: r.input_tokens,
            block_size_tokens: SIM_BLOCK_SIZE_TOKENS,
            other_sizes: &[],
            slo: self.config.slo,
            adapter: r.adapter,
        };
        loop {
            let route = if self.split {
                self.sessions[replica].route_pd(&request, &mut self.snapshots, excluded)
            } else {
                self.sessions[replica]
                    .route(&request, &mut self.snapshots, excluded)
                    .map(Route::Whole)
            };
            let routed = match route {
                Err(_) => return Outcome::NoPod,
                Ok(Route::Whole(routed)) => routed,
                Ok(Route::Disaggregated(pd)) => {
                    let prefill = pd.prefill_pod();
                    if !self.up[prefill.index()] {
                        self.sessions[replica].finish(pd.prefill, None);
                        self.sessions[replica].finish(pd.decode, None);
                        self.snapshots[prefill.index()].healthy = false;
                        excluded.push(prefill);
                        if attempt >= MAX_RETRIES {
                            return Outcome::OutOfRetries;
                        }
                        attempt += 1;
                        if let Some(f) = &mut self.faults {
                            f.retried += 1;
                        }
                        continue;
                    }
                    self.recorder.decided(&pd.decision);
                    if self.config.record_routes {
                        self.routes.push(crate::report::RouteRecord {
                            request: r.id,
                            pod: prefill.0,
                            branch: pd.decision.branch.as_str(),
                            charged_prefill_tokens: pd.prefill.prefill_tokens(),
                            decode_pod: Some(pd.decode_pod().0),
                        });
                    }
                    if self.track_flow {
                        self.predicted_ttft
                            .observe(&pd.decision, self.snapshots.len());
                    }
                    return self.dispatch_prefill(r, now, *pd, attempt, replica);
                }
            };
            let pod = routed.decision.pod_id;
            if !self.up[pod.index()] {
                // Connection refused: the attempt ends, the pod is marked unhealthy and the
                // request decided again (the gateway's retry).
                self.sessions[replica].finish(routed.ticket, None);
                self.snapshots[pod.index()].healthy = false;
                excluded.push(pod);
                if attempt >= MAX_RETRIES {
                    return Outcome::OutOfRetries;
                }
                attempt += 1;
                if let Some(f) = &mut self.faults {
                    f.retried += 1;
                }
                continue;
            }
            // Branches and scores count the attempts that reached a pod.
            self.recorder.decided(&routed.decision);
            if self.track_flow {
                self.predicted_ttft
                    .observe(&routed.decision, self.snapshots.len());
            }
            if self.config.record_routes {
                self.routes.push(crate::report::RouteRecord {
                    request: r.id,
                    pod: pod.0,
                    branch: routed.decision.branch.as_str(),
                    charged_prefill_tokens: routed.ticket.prefill_tokens(),
                    decode_pod: None,
                });
            }
            return self.dispatch(r, now, routed, attempt, replica);
        }
    }

    /// `r` as `pod`'s engine takes it, in blocks of its size.
    fn engine_request(&self, pod: usize, r: &SimRequest) -> EngineRequest {
        EngineRequest::for_block_size(r, self.engines[pod].block_size_tokens())
    }

    /// Sends `r` to the pod the session chose: the index's accuracy noted, the engine given
    /// the request (a refusal ends the attempt).
    fn dispatch(
        &mut self,
        r: &SimRequest,
        now: f64,
        routed: Routed,
        attempt: u8,
        replica: usize,
    ) -> Outcome {
        let Routed { decision, ticket } = routed;
        let pod = decision.pod_id.index();
        let index_blocks = self.sessions[replica]
            .router()
            .matched_blocks(decision.pod_id);
        // In 16-token blocks, as the index counts them (whole engine blocks only).
        let engine = &self.engines[pod];
        let stride = engine.block_size_tokens() / SIM_BLOCK_SIZE_TOKENS;
        let true_blocks = if stride <= 1 {
            engine.cached_prefix_blocks(&r.blocks) as u32
        } else {
            engine.cached_prefix_blocks(&self.engine_request(pod, r).blocks) as u32 * stride
        };
        self.indexes[0].observe(index_blocks, true_blocks);
        // The step-phase diagnostic: a stepping pod takes the request when its step ends.
        let phase_wait = match self.busy[pod] {
            true => self.engines[pod].next_step_time().map_or(0.0, |t| t - now),
            false => 0.0,
        };
        self.recorder.step_phase(r.id, phase_wait);
        let req = self.engine_request(pod, r);
        if self.engines[pod].add_request(now, req).is_err() {
            self.sessions[replica].finish(ticket, None);
            return Outcome::NoPod;
        }
        if let Some(slot) = self.in_flight.get_mut(r.id as usize) {
            let shared_as = self.mesh.as_mut().map(|mesh| {
                mesh.on(replica, now, |m| {
                    m.route(
                        decision.pod_id.index() as u64,
                        &r.blocks,
                        ticket.input_tokens(),
                        ticket.prefill_tokens(),
                    )
                })
            });
            *slot = Some(InFlightRequest {
                ticket,
                first_token_ms: None,
                attempt,
                replica: replica as u32,
                shared_as,
                handoff: None,
                dispatched_ms: now,
            });
        } else {
            self.sessions[replica].finish(ticket, None);
        }
        if !self.busy[pod] {
            self.start_step(pod, now);
        }
        Outcome::Dispatched
    }

    /// A split request's prefill stage: one token on the prefill pod, the decode ticket held
    /// until it comes.
    fn dispatch_prefill(
        &mut self,
        r: &SimRequest,
        now: f64,
        pd: PdRouted,
        attempt: u8,
        replica: usize,
    ) -> Outcome {
        let PdRouted {
            prefill, decode, ..
        } = pd;
        let pod = prefill.pod().index();
        let req = EngineRequest {
            output_tokens: 1,
            ..self.engine_request(pod, r)
        };
        let slot = self.in_flight.get_mut(r.id as usize);
        if slot.is_none() || self.engines[pod].add_request(now, req).is_err() {
            self.sessions[replica].finish(prefill, None);
            self.sessions[replica].finish(decode, None);
            return Outcome::NoPod;
        }
        if let Some(slot) = self.in_flight.get_mut(r.id as usize) {
            *slot = Some(InFlightRequest {
                ticket: prefill,
                first_token_ms: None,
                attempt,
                replica: replica as u32,
                shared_as: None,
                handoff: Some(decode),
                dispatched_ms: now,
            });
        }
        if !self.busy[pod] {
            self.start_step(pod, now);
        }
        Outcome::Dispatched
    }

    /// A P/D transfer landed at `now`: the request enters its decode pod with its prompt
    /// computed, or (decode pod down or refusing) is routed again from a fresh prefill.
    fn transfer_done(&mut self, id: u64, now: f64, requests: &[SimRequest]) {
        let Some(t) = self.transfers.get_mut(id as usize).and_then(Option::take) else {
            return;
        };
        let Some(r) = requests.get(id as usize) else {
            self.sessions[t.replica as usize].finish(t.ticket, None);
            return;
        };
        let pod = t.ticket.pod().index();
        let req = self.engine_request(pod, r);
        let added = self.up[pod] && self.engines[pod].add_transferred_request(now, req).is_ok();
        if !added {
            self.sessions[t.replica as usize].finish(t.ticket, None);
            if !self.up[pod] {
                self.snapshots[pod].healthy = false;
            }
            let arrival = self.recorder.arrival_ms(id).unwrap_or(now);
            let routed = if t.attempt < MAX_RETRIES {
                if let Some(f) = &mut self.faults {
                    f.retried += 1;
                }
                self.route(r, now, t.attempt + 1, &mut vec![PodId(pod as u32)])
            } else {
                Outcome::OutOfRetries
            };
            if routed != Outcome::Dispatched
                && let Some(f) = &mut self.faults
            {
                f.failed(arrival, false);
            }
            return;
        }
        if let Some(slot) = self.in_flight.get_mut(id as usize) {
            *slot = Some(InFlightRequest {
                ticket: t.ticket,
                first_token_ms: None,
                attempt: t.attempt,
                replica: t.replica,
                shared_as: None,
                handoff: None,
                dispatched_ms: now,
            });
        }
        if !self.busy[pod] {
            self.start_step(pod, now);
        }
    }

    fn replica_of(&self, request: u64) -> usize {
        (request % self.sessions.len() as u64) as usize
    }

    /// Applies every shared message due by `now` to its replica.
    fn deliver(&mut self, now: f64) {
        if let Some(mesh) = &mut self.mesh {
            mesh.deliver(now, &mut self.sessions, &self.snapshots);
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
        let due = time_key(outcome.end_ms);
        self.step_due[pod] = Some(due);
        self.steps.push(Reverse((due, pod as u32)));
    }

    fn step_end(&mut self, pod: usize, now_ms: f64) {
        let outcome = self.engines[pod].last_outcome();
        for index in &mut self.indexes {
            index.publish(pod as u32, now_ms, &outcome.kv_events);
        }
        self.recorder.preempted(outcome.preempted.len());
        for e in &outcome.emissions {
            let Some(Some(req)) = self.in_flight.get_mut(e.request_id as usize) else {
                continue;
            };
            if req.ticket.pod().index() != pod {
                continue;
            }
            if req.handoff.is_some() {
                // The prefill's only token: its stage ends, the KV leaves for the decode pod.
                let Some(mut req) = self.in_flight[e.request_id as usize].take() else {
                    continue;
                };
                let Some(decode) = req.handoff.take() else {
                    continue;
                };
                let due = now_ms
                    + self.config.transfer_ms_per_token.max(0.0) * f64::from(decode.input_tokens());
                self.sessions[req.replica as usize].finish(
                    req.ticket,
                    Some(Observed {
                        ttft_ms: now_ms - req.dispatched_ms,
                        tpot_ms: None,
                    }),
                );
                if let Some(slot) = self.transfers.get_mut(e.request_id as usize) {
                    *slot = Some(Transfer {
                        ticket: decode,
                        attempt: req.attempt,
                        replica: req.replica,
                    });
                    self.transfer_due
                        .push(Reverse((time_key(due), e.request_id)));
                }
                continue;
            }
            let replica = req.replica;
            if req.first_token_ms.is_none() {
                req.first_token_ms = Some(now_ms);
                // The same TTFT `finish` would train on (see there).
                let ttft = match self.dispatched_ms.get(e.request_id as usize) {
                    Some(&d) if self.config.flow.enabled && d.is_finite() => now_ms - d,
                    _ => self.recorder.ttft_ms(e.request_id, now_ms),
                };
                let session = &mut self.sessions[replica as usize];
                let sample = session.first_token_seen(&mut req.ticket, Some(ttft));
                if let (Some(mesh), Some(id)) = (&mut self.mesh, req.shared_as) {
                    let decode = req.ticket.decode_tokens();
                    mesh.on(replica as usize, now_ms, |m| {
                        m.first_token(id, decode, sample)
                    });
                }
            } else {
                self.sessions[replica as usize].tokens_generated(&mut req.ticket, 1);
                if let (Some(mesh), Some(id)) = (&mut self.mesh, req.shared_as) {
                    mesh.on(replica as usize, now_ms, |m| m.tokens(id, 1));
                }
            }
            if e.finished {
                let Some(req) = self.in_flight[e.request_id as usize].take() else {
                    continue;
                };
                let first = req.first_token_ms.unwrap_or(now_ms);
                let ttft = self.recorder.ttft_ms(e.request_id, first);
                if let Some(f) = &mut self.faults {
                    let arrival = self.recorder.arrival_ms(e.request_id).unwrap_or(first);
                    f.completed(arrival, ttft);
                }
                let tpot = (e.output_tokens_so_far > 1)
                    .then(|| (now_ms - first) / f64::from(e.output_tokens_so_far - 1));
                let predicted = (
                    req.ticket.predicted_ttft_ms(),
                    req.ticket.predicted_tpot_ms(),
                );
                let routed_to = req.ticket.pod().index();
                // The predictor learns the pod's TTFT: from dispatch, not from arrival (they
                // differ only for requests flow control queued).
                let pod_ttft = match self.dispatched_ms.get(e.request_id as usize) {
                    Some(&d) if self.config.flow.enabled && d.is_finite() => first - d,
                    _ => ttft,
                };
                if let Some(t) = self
                    .flow_report
                    .ttft_ms_by_request
                    .get_mut(e.request_id as usize)
                {
                    *t = ttft;
                }
                let replica = req.replica;
                let observed = Observed {
                    ttft_ms: pod_ttft,
                    tpot_ms: tpot,
                };
                if let (Some(mesh), Some(id)) = (&mut self.mesh, req.shared_as) {
                    let sample = req.ticket.training_sample(&observed);
                    mesh.on(replica as usize, now_ms, |m| m.finish(id, Some(sample)));
                }
                self.sessions[replica as usize].finish(req.ticket, Some(observed));
                if let (Some(recorder), Some(models)) = (&mut self.model_recorder, &self.models) {
                    recorder.completed(models, e.request_id, routed_to, ttft);
                }
                self.recorder.completed(
                    e.request_id,
                    routed_to,
                    ttft,
                    tpot,
                    now_ms,
                    e.output_tokens_so_far,
                    predicted,
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
