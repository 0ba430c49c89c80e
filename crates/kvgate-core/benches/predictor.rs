//! Predictor model benchmarks (criterion). Run: `cargo bench -p kvgate-core --bench predictor`.
//!
//! - `predictor_model/predict/{rls,gbdt,gbdt-p90,analytic}`: one TTFT + TPOT prediction for one
//!   pod (what the router pays per pod per decision), each model trained on the same 5,000
//!   synthetic samples first.
//! - `predictor_model/observe/{…}`: one training sample (for the tree models, the amortised
//!   cost includes the inline retrains).
//! - `predictor_model/train_gbdt/{N}_observed_{M}_stored`: one retrain of the TTFT and TPOT
//!   trees from the bucketed snapshot (M samples kept of N observed; what the trainer pays).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kvgate_core::PodSnapshot;
use kvgate_core::predictor::{Features, LatencyPredictor, ModelKind, PredictorConfig};
use std::hint::black_box;

const CLASS: &str = "llama3-8b-h100";

/// Deterministic, varied features and a plausible TTFT/TPOT for sample `i`.
fn sample(i: u64) -> (Features, f64, f64) {
    let mut pod = PodSnapshot::idle(0, CLASS, 29_000);
    pod.running = (i % 17) as u32;
    pod.waiting = (i % 5) as u32;
    pod.kv_usage = (i % 10) as f64 / 10.0;
    pod.in_flight.prefill_tokens = (i * 37) % 20_000;
    pod.in_flight.decode_tokens = (i * 101) % 60_000;
    let f = Features::new(
        &pod,
        1000 + (i as u32).wrapping_mul(13) % 8000,
        (i % 4) as f64 / 4.0,
    );
    let ttft = 6.0 + f.uncached_prompt_tokens() * 0.018 + f.prefill_tokens_in_flight * 0.018;
    (f, ttft, 6.0 + 0.2 * f.running)
}

fn trained(model: ModelKind, n: u64, background: bool) -> LatencyPredictor {
    let mut p = LatencyPredictor::new(PredictorConfig {
        model,
        gbdt_background_training: background,
        ..PredictorConfig::default()
    });
    for i in 0..n {
        let (f, ttft, tpot) = sample(i);
        p.observe(CLASS, &f, ttft, Some(tpot));
    }
    p
}

fn bench_models(c: &mut Criterion) {
    let mut group = c.benchmark_group("predictor_model");
    let probe: Vec<Features> = (0..64).map(|i| sample(i * 7919).0).collect();
    for model in ModelKind::ALL {
        let p = trained(model, 5000, false);
        let mut i = 0;
        group.bench_function(BenchmarkId::new("predict", model.name()), |b| {
            b.iter(|| {
                i = (i + 1) % probe.len();
                black_box(p.predict(CLASS, black_box(&probe[i])))
            })
        });
        let mut p = trained(model, 5000, false);
        let mut j = 5000;
        group.bench_function(BenchmarkId::new("observe", model.name()), |b| {
            b.iter(|| {
                j += 1;
                let (f, ttft, tpot) = sample(j);
                p.observe(CLASS, black_box(&f), ttft, Some(tpot));
            })
        });
    }
    group.sample_size(10);
    for n in [1000u64, 5000, 20_000] {
        let mut p = trained(ModelKind::Gbdt, n, true);
        // Take whatever is pending, then make one more due with the full store.
        let _ = p.take_training_jobs();
        let mut k = n;
        let job = loop {
            let (f, ttft, tpot) = sample(k);
            p.observe(CLASS, &f, ttft, Some(tpot));
            k += 1;
            if let Some((_, job)) = p.take_training_jobs().pop() {
                break job;
            }
        };
        group.bench_function(
            BenchmarkId::new("train_gbdt", format!("{n}_observed_{}_stored", job.len())),
            |b| b.iter(|| black_box(job.train())),
        );
    }
    group.finish();
}

criterion_group!(benches, bench_models);
criterion_main!(benches);
