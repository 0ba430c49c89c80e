//! Micro benchmark of the engine model: replays the Mooncake conversation trace on 16 pods
//! (round robin) and prints steps per second of wall time.
//!
//! `cargo run --release -p kvgate-sim --example engine_bench -- [trace.jsonl] [pods]`
//! (default trace: `shared/traces/mooncake_fast25_conversation_trace.jsonl`).
//!
//! Measured (release, one core of the dev container, engine stepping only, parsing excluded):
//! 16 pods 3.87 M steps in 1.24 s (3.1 M steps/s); 4 pods 1.50 M steps in 0.59 s; 1 pod
//! (overloaded: 4,918 preemptions) 117 k steps in 1.17 s.

use std::sync::Arc;
use std::time::Instant;

use kvgate_sim::engine::{Engine, EngineRequest};
use kvgate_sim::profiles::Profile;

#[derive(serde::Deserialize)]
struct Line {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or_else(|| "shared/traces/mooncake_fast25_conversation_trace.jsonl".into());
    let pods: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(16);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let mut reqs = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let l: Line = serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1))?;
        // One 512-token Mooncake block = 32 blocks of 16 tokens; its id is prefix-chained, so
        // (id, position within it) identifies a 16-token block.
        let blocks: Arc<[u64]> = (0..l.input_length / 16)
            .map(|j| match l.hash_ids.get((j / 32) as usize) {
                Some(&h) => h << 5 | u64::from(j % 32),
                None => (1 << 63) | (i as u64) << 20 | u64::from(j),
            })
            .collect();
        reqs.push((
            l.timestamp,
            EngineRequest {
                id: i as u64,
                blocks,
                input_tokens: l.input_length,
                output_tokens: l.output_length.max(1),
                adapter: None,
            },
        ));
    }
    let profile = Profile::default_profile();
    let mut engines: Vec<Engine> = (0..pods).map(|_| Engine::new(profile, None)).collect();
    let mut steps = 0u64;
    let mut rejected = 0u64;
    let start = Instant::now();
    for (i, (t, r)) in reqs.iter().enumerate() {
        let e = &mut engines[i % pods];
        while let Some(at) = e.next_step_time().filter(|&at| at <= *t) {
            e.step(at);
            steps += 1;
        }
        if e.add_request(*t, r.clone()).is_err() {
            rejected += 1;
        }
    }
    let mut end_ms: f64 = 0.0;
    for e in &mut engines {
        while let Some(at) = e.next_step_time() {
            end_ms = end_ms.max(e.step(at).end_ms);
            steps += 1;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let (mut q, mut h, mut pre, mut fin) = (0, 0, 0, 0);
    for e in &engines {
        let m = e.metrics();
        q += m.prefix_cache_queries_tokens;
        h += m.prefix_cache_hits_tokens;
        pre += m.preemptions;
        fin += m.requests_finished;
    }
    println!(
        "{} requests on {pods} pods: {fin} finished, {rejected} rejected, {steps} steps in {wall:.3} s \
         ({:.0} steps/s), simulated {:.0} s, prefix hit rate {:.3}, {pre} preemptions",
        reqs.len(),
        steps as f64 / wall,
        end_ms / 1000.0,
        h as f64 / q.max(1) as f64,
    );
    Ok(())
}
