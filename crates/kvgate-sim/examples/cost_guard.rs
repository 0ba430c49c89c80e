//! The fixed work that `scripts/cost_guard.sh` counts instructions of (callgrind), so that a
//! change that makes the router's decision or the simulator dearer fails CI:
//!
//! - `decisions`: 200 decisions of the default affinity gate over 1,024 pods (a 32,000-character
//!   prompt cached on a quarter of them, an 8,000-character prompt of its own on every pod, a
//!   trained predictor: the setup of `kvgate-core`'s `decision/full` bench);
//! - `sim`: `kvgate_sim::cluster::run` of the chat workload, 600 requests on 4 pods.
//!
//! Only [`decide_many`] and [`simulate`] are counted (callgrind `--toggle-collect`); the setup
//! around them is not. Each prints a checksum of what it computed, so the work cannot be
//! optimised away and a change of results shows.
//!
//! `cargo run --release -p kvgate-sim --example cost_guard -- decisions|sim`

use kvgate_core::index::PrefixIndex;
use kvgate_core::index::routed::RoutedIndex;
use kvgate_core::policy::PolicyKind;
use kvgate_core::predictor::{Features, LatencyPredictor, PredictorConfig};
use kvgate_core::{BlockHasher, DecisionRng, PodSnapshot, Router, RouterConfig};
use kvgate_sim::SimRequest;
use kvgate_sim::cluster::{ClusterConfig, run};
use kvgate_sim::workload::chat::{ChatParams, generate};
use rand::SeedableRng;

const CLASS: &str = "llama3-8b-h100";
const PODS: u32 = 1024;
const DECISIONS: usize = 200;

/// Deterministic pseudo-text: words drawn from a fixed list by an LCG.
fn prompt(chars: usize, salt: u64) -> String {
    const WORDS: [&str; 8] = [
        "cache ", "router ", "token ", "prefix ", "latency ", "pod ", "gate ", "block ",
    ];
    let mut s = String::with_capacity(chars + 16);
    let mut x = salt
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    while s.len() < chars {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s.push_str(WORDS[(x >> 61) as usize]);
    }
    s.truncate(chars);
    s
}

fn trained_predictor() -> LatencyPredictor {
    let mut p = LatencyPredictor::new(PredictorConfig::default());
    for i in 0..2000u64 {
        let mut pod = PodSnapshot::idle(0, CLASS, 29_000);
        pod.running = (i % 17) as u32;
        pod.waiting = (i % 5) as u32;
        pod.kv_usage = (i % 10) as f64 / 10.0;
        pod.in_flight.prefill_tokens = (i * 37) % 20_000;
        let f = Features::new(&pod, 1000 + (i as u32 * 13) % 8000, (i % 4) as f64 / 4.0);
        let ttft = 6.0 + f.uncached_prompt_tokens() * 0.018 + f.prefill_tokens_in_flight * 0.018;
        p.observe(CLASS, &f, ttft, Some(6.0 + 0.2 * f.running));
    }
    p
}

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
    let pods: Vec<PodSnapshot> = (0..PODS)
        .map(|i| {
            let mut p = PodSnapshot::idle(i, CLASS, 29_000);
            p.running = i % 7;
            p.kv_usage = f64::from(i % 10) / 10.0;
            p.in_flight.prefill_tokens = (u64::from(i) * 997) % 8000;
            p
        })
        .collect();
    let text = prompt(32_000, 1);
    let hasher = BlockHasher::default();
    let seed = BlockHasher::chain_seed("llama3-8b", None);
    let mut index = RoutedIndex::new();
    let (mut blocks, mut other) = (Vec::new(), Vec::new());
    hasher.hash_text(seed, &text, &mut blocks);
    for p in &pods {
        index.set_capacity(p.id, 29_000);
        if p.id.0 % 4 == 0 {
            index.record_routed(p.id, &blocks);
        }
        other.clear();
        hasher.hash_text(seed, &prompt(8_000, 100 + u64::from(p.id.0)), &mut other);
        index.record_routed(p.id, &other);
    }
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
