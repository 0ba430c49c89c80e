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
//! scripts/test installs one).

#[path = "common/envoy.rs"]
#[allow(dead_code)] // the harness's `workspace()` is for other tests
mod envoy_harness;

use envoy_harness::{Envoy, envoy_binary};
use kvgate_core::policy::{PolicyKind, RequestSlo};
use kvgate_core::predictor::PredictorConfig;
use kvgate_core::request::parse_request_value;
use kvgate_core::{BlockHasher, PodSnapshot, RouteRequest, RouterConfig, RouterSession};
use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use kvgate_sim::SimRequest;
use kvgate_sim::cluster::{self, ClusterConfig};
use kvgate_sim::profiles::Profile;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const PODS: u32 = 3;
const SEED: u64 = 11;
const BLOCK_CHARS: usize = 64;

/// (pod, branch, charged prefill tokens) per request.
type Routes = Vec<(u32, String, u64)>;

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
    let mut bodies = Vec::new();
    let mut history: Vec<String> = (0..4)
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

fn through_the_core(bodies: &[Value], router: RouterConfig, kv_blocks: u32) -> Routes {
    let mut session = RouterSession::new(
        router,
        PolicyKind::AffinityGate,
        PredictorConfig::default(),
        SEED,
    );
    let mut pods: Vec<PodSnapshot> = (0..PODS)
        .map(|i| PodSnapshot::idle(i, "default", kv_blocks))
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
                session: None,
            };
            let routed = session.route(&request, &mut pods, &[]).unwrap();
            let route = (
                routed.decision.pod_id.0,
                routed.decision.branch.as_str().to_string(),
                routed.ticket.prefill_tokens(),
            );
            let mut ticket = routed.ticket;
            session.first_token(&mut ticket);
            session.finish(ticket, None);
            route
        })
        .collect()
}

fn through_the_simulator(
    bodies: &[Value],
    router: RouterConfig,
    profile: &'static Profile,
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
        ..ClusterConfig::new(PODS, PolicyKind::AffinityGate, SEED)
    };
    let run = cluster::run(&config, &requests);
    assert_eq!(run.completed, requests.len() as u64);
    run.routes
        .iter()
        .map(|r| (r.pod, r.branch.to_string(), r.charged_prefill_tokens))
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

async fn through_the_gateway(bodies: &[Value], transport: Transport) -> (Routes, u32) {
    let config = PodConfig {
        time_scale: 10.0,
        ..PodConfig::default()
    };
    let pods = kvgate_mock_pod::spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), PODS as u16)
        .await
        .unwrap();
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods.iter().map(RunningPod::url).collect(),
        ext_proc_listen: matches!(transport, Transport::Envoy)
            .then(|| "127.0.0.1:0".parse().unwrap()),
        scrape_interval_ms: Some(10),
        seed: Some(SEED),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let idle = || {
        let all = gw.shared().pods.all();
        let session = gw.shared().session.lock();
        all.len() == PODS as usize
            && all.iter().all(|p| {
                let s = p.snapshot();
                s.healthy
                    && s.waiting == 0
                    && s.running == 0
                    && s.kv_usage == 0.0
                    && session.in_flight(p.id) == kvgate_core::InFlight::default()
            })
    };
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
        let deadline = Instant::now() + Duration::from_secs(10);
        while !idle() {
            assert!(Instant::now() < deadline, "pods not idle in 10 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Two scrapes after the pods went idle, so the snapshot is fresh.
        tokio::time::sleep(Duration::from_millis(30)).await;
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
    let kv_blocks = gw.shared().pods.all()[0].snapshot().kv_blocks;
    let routes = gw
        .shared()
        .decisions
        .snapshot()
        .iter()
        .map(|d| {
            (
                d.decision.pod_id.0,
                d.decision.branch.as_str().to_string(),
                d.charged_prefill_tokens,
            )
        })
        .collect();
    (routes, kv_blocks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_core_the_simulator_and_the_gateway_route_a_scripted_sequence_alike() {
    let bodies = script();
    let router = RouterConfig::default();
    let profile = Profile::default_profile();
    let (gateway, kv_blocks) = through_the_gateway(&bodies, Transport::Http).await;
    assert_eq!(
        kv_blocks, profile.kv_blocks,
        "the mock pods report the profile's KV"
    );
    let core = through_the_core(&bodies, router, kv_blocks);
    let sim = through_the_simulator(&bodies, router, profile);

    assert_eq!(core.len(), bodies.len());
    assert_eq!(sim, core, "simulator vs core");
    assert_eq!(gateway, core, "gateway vs core");
    // The script exercises the gate: first turns are cold (charged 13 blocks), later turns
    // stay on their conversation's pod and are charged their one new block.
    assert!(core.iter().take(4).all(|r| r.2 == 13 * 16), "{core:?}");
    let exploits: Vec<_> = core.iter().filter(|(_, b, _)| b == "exploit").collect();
    assert!(exploits.len() >= 12, "{core:?}");
    assert!(
        exploits.iter().all(|(_, _, charge)| *charge == 16),
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
    let (envoy, kv_blocks) = through_the_gateway(&bodies, Transport::Envoy).await;
    let core = through_the_core(&bodies, router, kv_blocks);
    assert_eq!(envoy, core, "ext_proc behind Envoy vs core");
}
