//! Helpers of the loadgen tests.
#![allow(dead_code)]

use std::path::PathBuf;

use kvgate_loadgen::LoadgenArgs;

/// A small Mooncake trace: 4 conversations of 3 turns each sharing a 1-span system prompt.
pub fn mooncake_trace(dir_tag: &str) -> PathBuf {
    let mut lines = String::new();
    let mut next_id = 100u64;
    for turn in 0..3u64 {
        for conv in 0..4u64 {
            // ids: [0 (shared system prompt), conv-specific history..., new turn]
            let mut ids = vec![0, 10 + conv];
            for t in 0..turn {
                ids.push(1000 + conv * 10 + t);
            }
            ids.push(next_id);
            next_id += 1;
            let input = 512 * (ids.len() as u64 - 1) + 100;
            lines.push_str(&format!(
                "{{\"timestamp\": {}, \"input_length\": {input}, \"output_length\": {}, \"hash_ids\": {ids:?}}}\n",
                turn * 300 + conv * 20,
                5 + conv
            ));
        }
    }
    let path = std::env::temp_dir().join(format!(
        "kvgate-loadgen-{dir_tag}-{}.jsonl",
        std::process::id()
    ));
    std::fs::write(&path, lines).unwrap();
    path
}

pub fn args(target: String, trace: PathBuf) -> LoadgenArgs {
    LoadgenArgs {
        target,
        trace: Some(trace),
        workload: None,
        preset: "A".into(),
        workload_seed: 1,
        max_context_tokens: None,
        rate_scale: 1.0,
        max_requests: None,
        max_concurrency: 64,
        stream: true,
        token_prompts: false,
        model: None,
        pod_metrics: Vec::new(),
        timeout_s: 60.0,
        json: None,
        requests_jsonl: None,
        quiet: true,
        classes: false,
        class_seed: 1,
        high_share: 0.2,
        high_priority: 1,
        tenants: 10,
        noisy_factor: 10.0,
        noisy_keep: 1.0,
        agent_compact_every: 0,
        session_header: None,
    }
}
