//! Decision-path benchmarks (criterion). Run: `cargo bench -p kvgate-core --bench decision`.
//!
//! - `decision/full/{16,64,256,1024,4096}`: one full decision — parse-free hashing of a 32,000-character
//!   prompt, prefix match over the routed index, predict for every pod, affinity gate — with
//!   the request's prefix cached on a quarter of the pods and a trained predictor.
//! - `decision/full/no_shared_prefix_epsilon/64`: the same without the prefix-popularity
//!   sketch (`shared_prefix_epsilon` 0), to compare with `decision/full/64`.
//! - `decision/driver/{decide_and_record,session_route}/64`: what a driver does per request,
//!   the old way (`Router::decide` over the routed index, then `record_routed`) and through the
//!   lifecycle (`RouterSession::route` — decision, record, features, ledger charge — then
//!   `finish`), side by side on the same pods, index content and predictor.
//! - `index/record_routed_500_blocks`: recording one routed request of 500 blocks.
//! - `predictor/predict`, `predictor/observe`: one prediction / one training sample.
//! - `models/pods_for_model/{one_model,two_models}/64`: which of 64 pods may take a request
//!   for its model (each pod's list known, one base model each): a fleet of one model, and a
//!   fleet of two (half the pods left out).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kvgate_core::index::PrefixIndex;
use kvgate_core::index::routed::RoutedIndex;
use kvgate_core::policy::PolicyKind;
use kvgate_core::predictor::Features;
use kvgate_core::{BlockHasher, DecisionRng, PodId, PodSnapshot, Router, RouterConfig};
use rand::SeedableRng;
use std::hint::black_box;

use kvgate_core::fixture::{CLASS, fleet, fleet_index, prompt, trained_predictor};

fn bench_decision(c: &mut Criterion) {
    let hasher = BlockHasher::default();
    let seed = BlockHasher::chain_seed("llama3-8b", None);
    let text = prompt(32_000, 1);
    let predictor = trained_predictor();
    let mut group = c.benchmark_group("decision/full");
    for pods_n in [16u32, 64, 256, 1024, 4096] {
        let pods = fleet(pods_n);
        let index = fleet_index(&pods, &text);
        // The default gate, and the same without the prefix-popularity sketch (shared-prefix
        // exploration off): their cost side by side.
        let no_popularity = RouterConfig {
            shared_prefix_epsilon: 0.0,
            ..RouterConfig::default()
        };
        for (name, config) in [
            ("fixed", RouterConfig::default()),
            ("no_popularity", no_popularity),
        ] {
            if name != "fixed" && pods_n != 64 {
                continue;
            }
            let mut router = Router::new(config, PolicyKind::AffinityGate);
            let mut rng = DecisionRng::seed_from_u64(1);
            let mut scratch = Vec::with_capacity(1024);
            let id = match name {
                "fixed" => BenchmarkId::from_parameter(pods_n),
                _ => BenchmarkId::new("no_shared_prefix_epsilon", pods_n),
            };
            group.bench_function(id, |b| {
                b.iter(|| {
                    scratch.clear();
                    hasher.hash_text(seed, black_box(&text), &mut scratch);
                    let d = router
                        .decide(&scratch, 8000, &pods, &index, &predictor, &mut rng)
                        .unwrap();
                    black_box(d.pod_id)
                })
            });
        }
    }
    group.finish();
}

/// Per request as a driver sees it: before the lifecycle (decide, then record the route) and
/// through `RouterSession` (route, finish), on copies of the same state.
fn bench_drivers(c: &mut Criterion) {
    let pods = &fleet(64)[..];
    let text = &prompt(32_000, 1)[..];
    let predictor = trained_predictor();
    let hasher = BlockHasher::default();
    let seed = BlockHasher::chain_seed("llama3-8b", None);
    let mut group = c.benchmark_group("decision/driver");
    let mut router = Router::new(RouterConfig::default(), PolicyKind::AffinityGate);
    let mut rng = DecisionRng::seed_from_u64(1);
    let mut routed = fleet_index(pods, text);
    let mut scratch = Vec::with_capacity(1024);
    group.bench_function(BenchmarkId::new("decide_and_record", pods.len()), |b| {
        b.iter(|| {
            scratch.clear();
            hasher.hash_text(seed, black_box(text), &mut scratch);
            let d = router
                .decide(&scratch, 8000, pods, &routed, &predictor, &mut rng)
                .unwrap();
            routed.record_routed(d.pod_id, &scratch);
            black_box(d.pod_id)
        })
    });
    let mut session = kvgate_core::fixture::session(pods, text);
    let mut snaps = pods.to_vec();
    group.bench_function(BenchmarkId::new("session_route", pods.len()), |b| {
        b.iter(|| {
            scratch.clear();
            hasher.hash_text(seed, black_box(text), &mut scratch);
            let request = kvgate_core::fixture::request(&scratch);
            let r = session.route(&request, &mut snaps, &[]).unwrap();
            let pod = r.decision.pod_id;
            session.finish(r.ticket, None);
            black_box(pod)
        })
    });
    group.finish();
}

fn bench_index(c: &mut Criterion) {
    let hasher = BlockHasher::default();
    let seed = BlockHasher::chain_seed("llama3-8b", None);
    let mut blocks = Vec::new();
    hasher.hash_text(seed, &prompt(32_000, 7), &mut blocks);
    let mut index = RoutedIndex::new();
    index.set_capacity(PodId(0), 29_000);
    let mut n = 0u64;
    c.bench_function("index/record_routed_500_blocks", |b| {
        b.iter(|| {
            // A fresh prompt each time so the LRU keeps inserting and evicting.
            n += 1;
            for h in blocks.iter_mut() {
                *h = h.wrapping_add(n);
            }
            index.record_routed(PodId(0), black_box(&blocks));
        })
    });
}

fn bench_predictor(c: &mut Criterion) {
    let mut predictor = trained_predictor();
    let mut pod = PodSnapshot::idle(0, CLASS, 29_000);
    pod.running = 5;
    pod.in_flight.prefill_tokens = 3000;
    let f = Features::new(&pod, 4000, 0.5);
    c.bench_function("predictor/predict", |b| {
        b.iter(|| black_box(predictor.predict(CLASS, black_box(&f))))
    });
    // Varied samples: the same sample repeated forever drives the RLS covariance towards
    // denormal numbers, which no real workload does.
    let samples: Vec<(Features, f64)> = (0..1024u32)
        .map(|i| {
            let mut pod = PodSnapshot::idle(0, CLASS, 29_000);
            pod.running = i % 23;
            pod.waiting = i % 3;
            pod.kv_usage = f64::from(i % 10) / 10.0;
            pod.in_flight.prefill_tokens = u64::from(i * 131 % 12_000);
            let f = Features::new(&pod, 500 + (i * 37) % 7000, f64::from(i % 5) / 5.0);
            let ttft =
                6.0 + f.uncached_prompt_tokens() * 0.018 + f.prefill_tokens_in_flight * 0.018;
            (f, ttft)
        })
        .collect();
    let mut next = 0;
    c.bench_function("predictor/observe", |b| {
        b.iter(|| {
            let (f, ttft) = &samples[next % samples.len()];
            next += 1;
            predictor.observe(CLASS, black_box(f), *ttft, Some(7.0))
        })
    });
}

fn bench_models(c: &mut Criterion) {
    use kvgate_core::{AdapterId, ServedModels, pods_for_model};
    let a = ServedModels::from_names(["model-a"]);
    let b = ServedModels::from_names(["model-b"]);
    let one: Vec<(PodId, &ServedModels)> = (0..64).map(|i| (PodId(i), &a)).collect();
    let two: Vec<(PodId, &ServedModels)> = (0..64)
        .map(|i| (PodId(i), if i % 2 == 0 { &a } else { &b }))
        .collect();
    let model = AdapterId::of("model-a");
    let mut group = c.benchmark_group("models/pods_for_model");
    for (name, fleet) in [("one_model", &one), ("two_models", &two)] {
        group.bench_function(BenchmarkId::new(name, 64), |bench| {
            bench.iter(|| {
                black_box(pods_for_model(
                    black_box(model),
                    fleet.iter().map(|(id, s)| (*id, Some(*s))),
                ))
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_decision,
    bench_drivers,
    bench_index,
    bench_predictor,
    bench_models
);
criterion_main!(benches);
