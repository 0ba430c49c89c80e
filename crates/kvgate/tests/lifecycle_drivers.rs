//! The three drivers of the core request lifecycle route alike: one scripted sequence of
//! requests (four conversations growing turn by turn, one request at a time on idle pods) goes
//! through `kvgate_core::RouterSession` directly, through the simulator's cluster loop and
//! through the gateway's HTTP proxy in front of three real mock pods (127.0.0.1), and every
//! request gets the same pod, the same branch and the same prefill charge in all three.
//!
//! What differs between the drivers is held equal so that only the lifecycle is compared: the
//! pods are idle at every decision (requests are sequential, the gateway waits for a fresh
//! scrape), the predictor stays on its analytic cold start (the gateway trains only on streams
//! and these are not; the simulator's regressor is never trusted, `min_samples` 10⁶; the core
//! run finishes without observations), the seed is the same, and the blocks are the ones the
//! gateway cuts from the prompt text.
//!
//! The gateway's other transport, the ext_proc endpoint picker behind a real Envoy, routes the
//! same script like the core too (skipped with a loud message without an Envoy binary;
//! scripts/test installs one). So does a disaggregated fleet (two prefill and two decode pods):
//! every driver hands each request over through the core's `route_pd`, and all three give the
//! same prefill pod, branch, charge and decode pod. Two gateway replicas over a real NATS route
//! like the simulator's two replicas. And with flow control on and the pod overloaded, the
//! gateway serves a backlog of two priorities in the simulator's order.

#[path = "common/envoy.rs"]
#[allow(dead_code)] // the harness's `workspace()` is for other tests
mod envoy_harness;
#[path = "../../kvgate-gateway/tests/common/nats.rs"]
mod nats;

use envoy_harness::{Envoy, envoy_binary};
use kvgate_core::Route;
use kvgate_core::flow::{FlowConfig, SaturationConfig};
use kvgate_core::policy::{PolicyKind, RequestSlo};
use kvgate_core::predictor::PredictorConfig;
use kvgate_core::request::parse_request_value;
use kvgate_core::{BlockHasher, PodRole, PodSnapshot, RouteRequest, RouterConfig, RouterSession};
use kvgate_gateway::cluster::Cluster;
use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::api::KvRole;
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use kvgate_sim::SimRequest;
use kvgate_sim::cluster::{self, ClusterConfig, SimClass};
use kvgate_sim::mesh::Sharing;
use kvgate_sim::profiles::Profile;
use nats::Nats;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const PODS: u32 = 3;
/// The disaggregated fleet: pods 0 and 1 prefill, 2 and 3 decode.
const PD_ROLES: [PodRole; 4] = [
    PodRole::Prefill,
    PodRole::Prefill,
    PodRole::Decode,
    PodRole::Decode,
];
const SEED: u64 = 11;
const BLOCK_CHARS: usize = 64;

/// (pod, branch, charged prefill tokens, decode pod) per request; a P/D request's pod is its
/// prefill pod.
type Routes = Vec<(u32, String, u64, Option<u32>)>;

/// Every pod `both` (no request split).
fn whole(pods: u32) -> Vec<PodRole> {
    vec![PodRole::Both; pods as usize]
}

/// `len` characters of text unique to `tag` (a multiple of 64, so text blocks are whole).
fn text(tag: &str, len: usize) -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!("{tag} word {i}; "));
        i += 1;
    }
    s.truncate(len);
    s
}

/// Four conversations, five turns each, interleaved: every turn resends the history.
fn script() -> Vec<Value> {
    script_of(4)
}

/// `conversations` conversations, five turns each, interleaved.
fn script_of(conversations: usize) -> Vec<Value> {
    let mut bodies = Vec::new();
    let mut history: Vec<String> = (0..conversations)
        .map(|c| text(&format!("system prompt {c}"), 12 * BLOCK_CHARS))
        .collect();
    for turn in 0..5 {
        for (c, h) in history.iter_mut().enumerate() {
            h.push_str(&text(&format!("conv {c} turn {turn}"), BLOCK_CHARS));
            bodies.push(json!({"model": DEFAULT_MODEL, "prompt": h.clone(), "max_tokens": 3}));
        }
    }
    bodies
}

/// The blocks and input tokens the gateway (routed index, text mode) cuts from a body.
fn blocks_of(body: &Value, router: &RouterConfig) -> (Vec<u64>, u32) {
    let parsed = parse_request_value("/v1/completions", body).unwrap();
    let mut blocks = Vec::new();
    BlockHasher {
        block_size_tokens: router.block_size_tokens,
        chars_per_token: router.chars_per_token,
    }
    .hash_request(&parsed, &mut blocks);
    (blocks, parsed.estimated_input_tokens())
}

fn through_the_core(
    bodies: &[Value],
    router: RouterConfig,
    kv_blocks: u32,
    roles: &[PodRole],
) -> Routes {
    let mut session = RouterSession::new(
        router,
        PolicyKind::AffinityGate,
        PredictorConfig::default(),
        SEED,
    );
    let mut pods: Vec<PodSnapshot> = (0..roles.len() as u32)
        .map(|i| PodSnapshot {
            role: roles[i as usize],
            ..PodSnapshot::idle(i, "default", kv_blocks)
        })
        .collect();
    bodies
        .iter()
        .map(|body| {
            let (blocks, input_tokens) = blocks_of(body, &router);
            let request = RouteRequest {
                blocks: &blocks,
                input_tokens,
                block_size_tokens: router.block_size_tokens,
                other_sizes: &[],
                slo: RequestSlo::default(),
                adapter: None,
            };
            match session.route_pd(&request, &mut pods, &[]).unwrap() {
                Route::Whole(routed) => {
                    let route = (
                        routed.decision.pod_id.0,
                        routed.decision.branch.as_str().to_string(),
                        routed.ticket.prefill_tokens(),
                        None,
                    );
                    let mut ticket = routed.ticket;
                    session.first_token(&mut ticket);
                    session.finish(ticket, None);
                    route
                }
                Route::Disaggregated(pd) => {
                    let route = (
                        pd.prefill_pod().0,
                        pd.decision.branch.as_str().to_string(),
                        pd.prefill.prefill_tokens(),
                        Some(pd.decode_pod().0),
                    );
                    let pd = *pd;
                    session.finish(pd.prefill, None);
                    let mut decode = pd.decode;
                    session.first_token(&mut decode);
                    session.finish(decode, None);
                    route
                }
            }
        })
        .collect()
}

fn through_the_simulator(
    bodies: &[Value],
    router: RouterConfig,
    profile: &'static Profile,
    roles: &[PodRole],
    replicas: u32,
) -> Routes {
    let requests: Vec<SimRequest> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            let (blocks, input_tokens) = blocks_of(body, &router);
            assert_eq!(blocks.len() as u32 * 16, input_tokens, "whole blocks only");
            SimRequest {
                id: i as u64,
                arrival_ms: i as f64 * 5_000.0,
                input_tokens,
                output_tokens: 3,
                blocks,
                adapter: None,
                session: None,
            }
        })
        .collect();
    let config = ClusterConfig {
        profile,
        router,
        predictor: PredictorConfig {
            min_samples: 1_000_000,
            ..PredictorConfig::default()
        },
        record_routes: true,
        pod_roles: roles.to_vec(),
        replicas,
        // NATS on one host: the messages of a request are applied well before the next one.
        sharing: (replicas > 1).then_some(Sharing {
            delay_ms: 1.0,
            loss: 0.0,
            samples: true,
        }),
        ..ClusterConfig::new(roles.len() as u32, PolicyKind::AffinityGate, SEED)
    };
    let run = cluster::run(&config, &requests);
    assert_eq!(run.completed, requests.len() as u64);
    run.routes
        .iter()
        .map(|r| {
            (
                r.pod,
                r.branch.to_string(),
                r.charged_prefill_tokens,
                r.decode_pod,
            )
        })
        .collect()
}

/// How requests reach the gateway.
#[derive(Clone, Copy)]
enum Transport {
    /// Its HTTP proxy (the traffic listener).
    Http,
    /// A real Envoy, with kvgate as its ext_proc endpoint picker.
    Envoy,
}

/// Mock pods of `roles` (in that order: pod i is the gateway's pod id i), model time 10× wall
/// time.
async fn mock_pods(roles: &[PodRole]) -> (Vec<RunningPod>, Vec<String>) {
    mock_pods_at(roles, 10.0).await
}

async fn mock_pods_at(roles: &[PodRole], time_scale: f64) -> (Vec<RunningPod>, Vec<String>) {
    let mut pods = Vec::new();
    for role in roles {
        let config = PodConfig {
            time_scale,
            kv_role: match role {
                PodRole::Both => None,
                PodRole::Prefill => Some(KvRole::Producer),
                PodRole::Decode => Some(KvRole::Consumer),
            },
            ..PodConfig::default()
        };
        pods.extend(
            kvgate_mock_pod::spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 1)
                .await
                .unwrap(),
        );
    }
    let urls = pods
        .iter()
        .zip(roles)
        .map(|(p, role)| match role {
            PodRole::Both => p.url(),
            PodRole::Prefill => format!("{},role=prefill", p.url()),
            PodRole::Decode => format!("{},role=decode", p.url()),
        })
        .collect();
    (pods, urls)
}

fn gateway_args(pods: &[String]) -> ServeArgs {
    ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods.to_vec(),
        scrape_interval_ms: Some(10),
        seed: Some(SEED),
        ..ServeArgs::default()
    }
}

/// Every pod of `gw` healthy, idle on its last scrape, and nothing in flight in its session.
fn idle(gw: &Gateway, pods: usize) -> bool {
    let all = gw.shared().fleet.pods.all();
    let session = gw.shared().session.lock();
    all.len() == pods
        && all.iter().all(|p| {
            let s = p.snapshot();
            s.healthy
                && s.waiting == 0
                && s.running == 0
                && s.kv_usage == 0.0
                && session.in_flight(p.id) == kvgate_core::InFlight::default()
        })
}

/// Waits until `ready` holds, then two scrapes more so the snapshots are fresh.
async fn settle(mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(Instant::now() < deadline, "pods not idle in 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
}

async fn send(client: &reqwest::Client, base: &str, body: &Value) {
    let r = client
        .post(format!("{base}/v1/completions"))
        .timeout(Duration::from_secs(30))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
}

/// The routes in `gw`'s decision log, oldest first.
fn logged_routes(gw: &Gateway) -> Routes {
    gw.shared()
        .telemetry
        .decisions
        .snapshot()
        .iter()
        .map(|d| {
            (
                d.decision.pod_id.0,
                d.decision.branch.as_str().to_string(),
                d.charged_prefill_tokens,
                d.decision.decode.as_ref().map(|e| e.pod_id.0),
            )
        })
        .collect()
}

async fn through_the_gateway(
    bodies: &[Value],
    transport: Transport,
    roles: &[PodRole],
) -> (Routes, u32) {
    let (_pods, urls) = mock_pods(roles).await;
    let gw = Gateway::start(ServeArgs {
        ext_proc_listen: matches!(transport, Transport::Envoy)
            .then(|| "127.0.0.1:0".parse().unwrap()),
        ..gateway_args(&urls)
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let (base, _envoy) = match transport {
        Transport::Http => (format!("http://{}", gw.traffic_addr), None),
        Transport::Envoy => {
            let bin = envoy_binary()
                .filter(|p| p.exists())
                .expect("an Envoy binary (checked by the test)");
            let mut envoy = Envoy::start(&bin, gw.ext_proc_addr.unwrap().port());
            envoy.wait_ready(&client).await;
            (format!("http://127.0.0.1:{}", envoy.listen), Some(envoy))
        }
    };
    for body in bodies {
        settle(|| idle(&gw, roles.len())).await;
        send(&client, &base, body).await;
    }
    let kv_blocks = gw.shared().fleet.pods.all()[0].snapshot().kv_blocks;
    (logged_routes(&gw), kv_blocks)
}

/// Two gateway replicas sharing routing state over a real NATS (`--cluster`), in lockstep:
/// request i goes to replica i mod 2 (the simulator's assignment), and each request waits
/// until both replicas are idle and hold the same routed index, so every message of the one
/// before has been applied. The replicas' seeds are set to the simulator's (seed + k).
async fn through_two_replicas(bodies: &[Value], nats: &Nats) -> Routes {
    let (_pods, urls) = mock_pods(&whole(PODS)).await;
    let mut replicas = Vec::new();
    for k in 0..2 {
        let gw = Gateway::start(ServeArgs {
            cluster: Some(nats.url()),
            cluster_name: Some("equivalence".into()),
            ..gateway_args(&urls)
        })
        .await
        .unwrap();
        replicas.push((gw, k));
    }
    for (gw, k) in &replicas {
        let cluster = Cluster::of(&gw.shared().session).expect("cluster on");
        settle(|| cluster.is_connected() && cluster.peer_stats().peers >= 1).await;
        gw.shared().session.lock().reseed(SEED + k);
    }
    let routed_blocks = |gw: &Gateway| {
        let session = gw.shared().session.lock();
        (0..PODS)
            .map(|i| session.index().routed.pod_blocks(kvgate_core::PodId(i)))
            .collect::<Vec<_>>()
    };
    let client = reqwest::Client::new();
    for (i, body) in bodies.iter().enumerate() {
        let (a, b) = (&replicas[0].0, &replicas[1].0);
        settle(|| {
            idle(a, PODS as usize) && idle(b, PODS as usize) && routed_blocks(a) == routed_blocks(b)
        })
        .await;
        let gw = &replicas[i % 2].0;
        send(&client, &format!("http://{}", gw.traffic_addr), body).await;
    }
    let logs: Vec<Routes> = replicas.iter().map(|(gw, _)| logged_routes(gw)).collect();
    (0..bodies.len())
        .map(|i| logs[i % 2][i / 2].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_core_the_simulator_and_the_gateway_route_a_scripted_sequence_alike() {
    let bodies = script();
    let router = RouterConfig::default();
    let profile = Profile::default_profile();
    let (gateway, kv_blocks) = through_the_gateway(&bodies, Transport::Http, &whole(PODS)).await;
    assert_eq!(
        kv_blocks, profile.kv_blocks,
        "the mock pods report the profile's KV"
    );
    let core = through_the_core(&bodies, router, kv_blocks, &whole(PODS));
    let sim = through_the_simulator(&bodies, router, profile, &whole(PODS), 1);

    assert_eq!(core.len(), bodies.len());
    assert_eq!(sim, core, "simulator vs core");
    assert_eq!(gateway, core, "gateway vs core");
    // The script exercises the gate: first turns are cold (charged 13 blocks), later turns
    // stay on their conversation's pod and are charged their one new block.
    assert!(core.iter().take(4).all(|r| r.2 == 13 * 16), "{core:?}");
    let exploits: Vec<_> = core.iter().filter(|(_, b, _, _)| b == "exploit").collect();
    assert!(exploits.len() >= 12, "{core:?}");
    assert!(
        exploits.iter().all(|(_, _, charge, _)| *charge == 16),
        "{core:?}"
    );
    for c in 0..4 {
        let pods: Vec<u32> = core.iter().skip(c).step_by(4).map(|r| r.0).collect();
        assert!(
            pods.windows(2).filter(|w| w[0] == w[1]).count() >= 3,
            "{pods:?}"
        );
    }
}

/// The same script through Envoy: the ext_proc picker runs the same pipeline, so it routes
/// every request as the core does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ext_proc_picker_behind_envoy_routes_the_scripted_sequence_like_the_core() {
    if envoy_binary().filter(|p| p.exists()).is_none() {
        eprintln!(
            "\n\n!!!!!!!! SKIPPED the_ext_proc_picker_behind_envoy_routes_the_scripted_sequence_like_the_core: \
             no Envoy binary (set KVGATE_ENVOY, or run scripts/test) !!!!!!!!\n\n"
        );
        return;
    }
    let bodies = script();
    let router = RouterConfig::default();
    let (envoy, kv_blocks) = through_the_gateway(&bodies, Transport::Envoy, &whole(PODS)).await;
    let core = through_the_core(&bodies, router, kv_blocks, &whole(PODS));
    assert_eq!(envoy, core, "ext_proc behind Envoy vs core");
}

/// A disaggregated fleet: the HTTP proxy splits every request into a prefill on pod 0 or 1 and
/// a decode on pod 2 or 3, as the core's `route_pd` and the simulator's P/D driver do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_three_drivers_split_a_scripted_sequence_over_prefill_and_decode_pods_alike() {
    let bodies = script();
    let router = RouterConfig::default();
    let profile = Profile::default_profile();
    let (gateway, kv_blocks) = through_the_gateway(&bodies, Transport::Http, &PD_ROLES).await;
    let core = through_the_core(&bodies, router, kv_blocks, &PD_ROLES);
    let sim = through_the_simulator(&bodies, router, profile, &PD_ROLES, 1);
    assert_eq!(sim, core, "simulator vs core");
    assert_eq!(gateway, core, "gateway vs core");
    // Every request was split: prefilled on a prefill pod, decoded on a decode pod.
    assert!(
        core.iter()
            .all(|(p, _, _, d)| *p < 2 && d.is_some_and(|d| d >= 2)),
        "{core:?}"
    );
    // The prefill pick keeps the gate's affinity: later turns are charged their new block.
    assert!(
        core.iter().filter(|(_, b, _, _)| b == "exploit").count() >= 12,
        "{core:?}"
    );
}

/// Two replicas sharing routing state: the gateway's replicas over a real NATS route the
/// script as the simulator's two replicas do, both running the core's replica machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_replicas_over_nats_route_a_scripted_sequence_like_the_simulators_two() {
    let Some(nats) = Nats::start() else { return };
    // Three conversations over two replicas: each conversation's turns alternate replicas.
    let bodies = script_of(3);
    let router = RouterConfig::default();
    let profile = Profile::default_profile();
    let gateway = through_two_replicas(&bodies, &nats).await;
    let sim = through_the_simulator(&bodies, router, profile, &whole(PODS), 2);
    assert_eq!(gateway, sim, "two gateway replicas vs the simulator's two");
    // Sharing is what keeps a conversation on its pod: each turn goes to the other replica,
    // which follows the pod the first replica chose for the turn before.
    let exploits = sim.iter().filter(|(_, b, _, _)| b == "exploit").count();
    assert!(exploits >= 9, "{sim:?}");
}

/// Flow control on, one pod that takes one request at a time (`max_in_flight_per_pod = 1`): a
/// long request holds it while a backlog of short ones arrives, bulk (priority 0) and urgent
/// (priority 5) mixed; each waits in the flow queue and is released when the one before ends.
const FLOW_PRIORITIES: [i32; 7] = [0, 0, 0, 5, 0, 5, 5];

fn flow_config() -> FlowConfig {
    FlowConfig {
        enabled: true,
        saturation: SaturationConfig {
            max_in_flight_per_pod: 1,
            ..SaturationConfig::default()
        },
        ..FlowConfig::default()
    }
}

/// Request 0 is the long one (100 output tokens), then the backlog (3 each).
fn flow_script() -> Vec<Value> {
    (0..FLOW_PRIORITIES.len())
        .map(|i| {
            let prompt = text(&format!("flow request {i}"), 4 * BLOCK_CHARS);
            let max_tokens = if i == 0 { 100 } else { 3 };
            json!({"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": max_tokens})
        })
        .collect()
}

/// The requests (script index) in the order the simulator routed them.
fn flow_order_in_the_simulator(bodies: &[Value], profile: &'static Profile) -> Vec<u64> {
    let router = RouterConfig::default();
    let requests: Vec<SimRequest> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            let (blocks, input_tokens) = blocks_of(body, &router);
            SimRequest {
                id: i as u64,
                // The backlog arrives while the long request runs, 1 ms apart.
                arrival_ms: i as f64,
                input_tokens,
                output_tokens: body["max_tokens"].as_u64().unwrap() as u32,
                blocks,
                adapter: None,
                session: None,
            }
        })
        .collect();
    let classes: Vec<SimClass> = FLOW_PRIORITIES
        .iter()
        .map(|&priority| SimClass {
            priority,
            tenant: 0,
        })
        .collect();
    let config = ClusterConfig {
        profile,
        router,
        flow: flow_config(),
        record_routes: true,
        predictor: PredictorConfig {
            min_samples: 1_000_000,
            ..PredictorConfig::default()
        },
        ..ClusterConfig::new(1, PolicyKind::AffinityGate, SEED)
    };
    let run = cluster::run_classified(&config, &requests, &classes);
    assert_eq!(run.completed, requests.len() as u64);
    run.routes.iter().map(|r| r.request).collect()
}

/// The same through the gateway's HTTP proxy: each backlog request is sent once the one before
/// waits in the flow queue; the order is the decision log's.
async fn flow_order_in_the_gateway(bodies: &[Value]) -> Vec<u64> {
    // Model time at wall time: the long request runs ~0.7 s, the backlog is queued in a few ms.
    let (_pods, urls) = mock_pods_at(&[PodRole::Both], 1.0).await;
    let dir = std::env::temp_dir().join(format!("kvgate-equivalence-flow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("kvgate.toml");
    std::fs::write(
        &file,
        "[flow_control]\nenabled = true\n[flow_control.saturation]\nmax_in_flight_per_pod = 1\n",
    )
    .unwrap();
    let gw = Gateway::start(ServeArgs {
        config: Some(file),
        ..gateway_args(&urls)
    })
    .await
    .unwrap();
    assert_eq!(gw.shared().config().flow, flow_config());
    settle(|| idle(&gw, 1)).await;
    let client = reqwest::Client::new();
    let base = format!("http://{}", gw.traffic_addr);
    let mut sent = Vec::new();
    for (i, (body, priority)) in bodies.iter().zip(FLOW_PRIORITIES).enumerate() {
        let request = client
            .post(format!("{base}/v1/completions"))
            .header("x-request-id", format!("flow-{i}"))
            .header("x-kvgate-priority", priority.to_string())
            .timeout(Duration::from_secs(30))
            .json(body);
        sent.push(tokio::spawn(async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
        }));
        // The long request is routed; each of the backlog waits in the queue.
        let deadline = Instant::now() + Duration::from_secs(10);
        while (gw.shared().telemetry.decisions.snapshot().len()
            + gw.shared().admission.flow.queued())
            < i + 1
        {
            assert!(
                Instant::now() < deadline,
                "request {i} neither routed nor queued"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(
            gw.shared().telemetry.decisions.snapshot().len(),
            1,
            "the pod has no room"
        );
    }
    for s in sent {
        s.await.unwrap();
    }
    gw.shared()
        .telemetry
        .decisions
        .snapshot()
        .iter()
        .map(|d| d.request_id.trim_start_matches("flow-").parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_serves_an_overloaded_pods_backlog_of_two_priorities_like_the_simulator() {
    let bodies = flow_script();
    let gateway = flow_order_in_the_gateway(&bodies).await;
    let sim = flow_order_in_the_simulator(&bodies, Profile::default_profile());
    assert_eq!(
        gateway, sim,
        "gateway vs simulator: the order requests were routed in"
    );
    // Urgent first (in arrival order), then bulk (in arrival order).
    assert_eq!(sim, vec![0, 3, 5, 6, 1, 2, 4]);
}
