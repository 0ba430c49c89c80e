//! The fixed work that `scripts/cost_guard.sh` counts instructions of (callgrind), so that a
//! change that makes the router's decision or the simulator dearer fails CI:
//!
//! - `decisions`: 200 decisions of the default affinity gate over 1,024 pods (a 32,000-character
//!   prompt cached on a quarter of them, an 8,000-character prompt of its own on every pod, a
//!   trained predictor: `kvgate_core::fixture`, the setup of `kvgate-core`'s `decision/full`
//!   bench);
//! - `sim`: `kvgate_sim::cluster::run` of the chat workload, 600 requests on 4 pods.
//!
//! Only [`decide_many`] and [`simulate`] are counted (callgrind `--toggle-collect`); the setup
//! around them is not. Each prints a checksum of what it computed, so the work cannot be
//! optimised away and a change of results shows.
//!
//! `cargo run --release -p kvgate-sim --example cost_guard -- decisions|sim`

use kvgate_core::fixture::{fleet, fleet_index, prompt, trained_predictor};
use kvgate_core::index::routed::RoutedIndex;
use kvgate_core::policy::PolicyKind;
use kvgate_core::predictor::LatencyPredictor;
use kvgate_core::{BlockHasher, DecisionRng, PodSnapshot, Router, RouterConfig};
use kvgate_sim::SimRequest;
use kvgate_sim::cluster::{ClusterConfig, run};
use kvgate_sim::workload::chat::{ChatParams, generate};
use rand::SeedableRng;

const PODS: u32 = 1024;
const DECISIONS: usize = 200;

#[inline(never)]
fn decide_many(
    router: &mut Router,
    text: &str,
    pods: &[PodSnapshot],
    index: &RoutedIndex,
    predictor: &LatencyPredictor,
) -> u64 {
    let hasher = BlockHasher::default();
    let seed = BlockHasher::chain_seed("llama3-8b", None);
    let mut rng = DecisionRng::seed_from_u64(1);
    let mut blocks = Vec::with_capacity(1024);
    let mut sum = 0u64;
    for _ in 0..DECISIONS {
        blocks.clear();
        hasher.hash_text(seed, text, &mut blocks);
        let d = router
            .decide(&blocks, 8000, pods, index, predictor, &mut rng)
            .expect("healthy pods");
        sum = sum.wrapping_mul(31).wrapping_add(u64::from(d.pod_id.0));
    }
    sum
}

fn decisions() -> u64 {
    let pods = fleet(PODS);
    let text = prompt(32_000, 1);
    let index = fleet_index(&pods, &text);
    let predictor = trained_predictor();
    let mut router = Router::new(RouterConfig::default(), PolicyKind::AffinityGate);
    decide_many(&mut router, &text, &pods, &index, &predictor)
}

#[inline(never)]
fn simulate(config: &ClusterConfig, requests: &[SimRequest]) -> u64 {
    let m = run(config, requests);
    m.completed ^ m.ttft_ms.p50.to_bits()
}

fn sim() -> u64 {
    let params = ChatParams {
        seed: 1,
        max_requests: 600,
        ..ChatParams::default()
    };
    let (_, requests) = generate(&params).expect("valid chat parameters");
    simulate(
        &ClusterConfig::new(4, PolicyKind::AffinityGate, 1),
        &requests,
    )
}

fn main() {
    let sum = match std::env::args().nth(1).as_deref() {
        Some("decisions") => decisions(),
        Some("sim") => sim(),
        _ => {
            eprintln!("usage: cost_guard decisions|sim");
            std::process::exit(2);
        }
    };
    println!("checksum {sum}");
}
