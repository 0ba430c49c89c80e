//! How many concurrent streaming requests one mock pod serves while keeping token timing close
//! to the engine model's schedule.
//!
//! For each concurrency N: start a fresh pod in this process (time scale 1), open N streaming
//! completions at once (distinct 512-token prompts given as token ids, 128 output tokens),
//! record each request's end-to-end time at the client, and compare it with the same N requests
//! run through the sans-IO engine model offline (all arriving at t = 0). Prints the mean and
//! worst relative error between the sorted e2e latencies (quantile by quantile: the HTTP
//! arrival order differs from the model's), and the mean TTFT of both. Client and pod share
//! this process and its cores.
//!
//! `cargo run --release -p kvgate-mock-pod --example stream_capacity -- 1 16 64 256 512`

use std::time::{Duration, Instant};

use kvgate_core::BlockHasher;
use kvgate_mock_pod::{PodConfig, spawn_pod};
use kvgate_sim::engine::{Engine, EngineRequest};
use serde_json::json;

const PROMPT_TOKENS: u32 = 512;
const OUTPUT_TOKENS: u32 = 128;

fn prompt(doc: u32) -> Vec<u32> {
    (0..PROMPT_TOKENS)
        .map(|i| (doc * 7919 + i * 31) % 100_000)
        .collect()
}

/// (ttft_ms, e2e_ms) per request from the engine model, all requests arriving at 0.
fn model_schedule(config: &PodConfig, n: u32) -> Vec<(f64, f64)> {
    let mut engine = Engine::new(&config.profile, config.kv_blocks);
    let seed = BlockHasher::chain_seed(&config.model, None);
    for id in 0..n {
        let mut blocks = Vec::new();
        BlockHasher::default().hash_tokens(seed, &prompt(id), &mut blocks);
        let r = EngineRequest {
            id: u64::from(id),
            blocks: blocks.into(),
            input_tokens: PROMPT_TOKENS,
            output_tokens: OUTPUT_TOKENS,
            adapter: None,
        };
        if engine.add_request(0.0, r).is_err() {
            panic!("engine refused request {id}");
        }
    }
    let mut out = vec![(0.0, 0.0); n as usize];
    while let Some(t) = engine.next_step_time() {
        let o = engine.step(t);
        for e in &o.emissions {
            let slot = &mut out[e.request_id as usize];
            if e.is_first() {
                slot.0 = o.end_ms;
            }
            if e.finished {
                slot.1 = o.end_ms;
            }
        }
    }
    out
}

async fn one(client: reqwest::Client, url: String, doc: u32) -> (f64, f64) {
    let start = Instant::now();
    let body = json!({"model": kvgate_mock_pod::DEFAULT_MODEL, "prompt": prompt(doc),
        "max_tokens": OUTPUT_TOKENS, "stream": true});
    let mut resp = client.post(url).json(&body).send().await.expect("request");
    let mut ttft = None;
    while let Some(chunk) = resp.chunk().await.expect("chunk") {
        if ttft.is_none() && !chunk.is_empty() {
            ttft = Some(start.elapsed());
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (ms(ttft.unwrap_or_default()), ms(start.elapsed()))
}

#[tokio::main]
async fn main() {
    let levels: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let levels = if levels.is_empty() {
        vec![1, 16, 64, 256]
    } else {
        levels
    };
    let config = PodConfig::default();
    println!(
        "concurrency | model e2e mean ms | observed e2e mean ms | e2e error mean | e2e error worst | model TTFT mean ms | observed TTFT mean ms"
    );
    for n in levels {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let pod = spawn_pod(config.clone(), listener).await.expect("pod");
        let url = format!("{}/v1/completions", pod.url());
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(2048)
            .build()
            .expect("client");
        let tasks: Vec<_> = (0..n)
            .map(|doc| tokio::spawn(one(client.clone(), url.clone(), doc)))
            .collect();
        let mut observed = Vec::with_capacity(n as usize);
        for t in tasks {
            observed.push(t.await.expect("task"));
        }
        // Arrival order over HTTP differs from request ids, so compare the sorted e2e
        // distributions (quantile by quantile), not request by request.
        let mut model = model_schedule(&config, n);
        model.sort_by(|a, b| a.1.total_cmp(&b.1));
        observed.sort_by(|a, b| a.1.total_cmp(&b.1));
        let errors: Vec<f64> = observed
            .iter()
            .zip(&model)
            .map(|(o, m)| (o.1 - m.1).abs() / m.1)
            .collect();
        let mean = |v: &mut dyn Iterator<Item = f64>| {
            let (s, c) = v.fold((0.0, 0.0), |(s, c), x| (s + x, c + 1.0));
            s / c
        };
        println!(
            "{n} | {:.1} | {:.1} | {:.2} % | {:.2} % | {:.1} | {:.1}",
            mean(&mut model.iter().map(|m| m.1)),
            mean(&mut observed.iter().map(|o| o.1)),
            100.0 * mean(&mut errors.iter().copied()),
            100.0 * errors.iter().copied().fold(0.0, f64::max),
            mean(&mut model.iter().map(|m| m.0)),
            mean(&mut observed.iter().map(|o| o.0)),
        );
        let late = pod.metrics.lock().map(|m| m.late_steps).unwrap_or(0);
        if late > 0 {
            println!("  (driver fell > 50 ms behind and resynced {late} times)");
        }
    }
}
