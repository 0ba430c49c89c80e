//! The pod conformance suite (`scripts/conformance/pod_conformance.py`, the same one that runs
//! against a real vLLM 0.32) against an in-process mock pod with KV events, at the mock's
//! default block size (16, vLLM's CUDA default) and at vLLM CPU's 128. Needs the venv that
//! `scripts/test` creates (`KVGATE_PYTHON`).

mod common;

use common::{MODEL, pod, run_python_at};
use kvgate_mock_pod::PodConfig;

async fn suite_passes_at_block_size(block_size_tokens: u32) {
    let pod = pod(PodConfig {
        block_size_tokens,
        kv_events: Some("tcp://127.0.0.1:0".into()),
        kv_events_replay: Some("tcp://127.0.0.1:0".into()),
        ..PodConfig::default()
    })
    .await;
    let url = pod.url();
    let events = pod.kv_events_endpoint.clone().unwrap();
    let replay = pod.kv_events_replay_endpoint.clone().unwrap();
    let suite = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/conformance/pod_conformance.py");
    let block_size = block_size_tokens.to_string();
    let out = tokio::task::spawn_blocking(move || {
        run_python_at(
            &suite,
            &[
                &url,
                "--events",
                &events,
                "--replay",
                &replay,
                "--model",
                MODEL,
                "--block-size",
                &block_size,
            ],
        )
    })
    .await
    .unwrap();
    println!("{out}");
    assert!(!out.contains("FAIL"), "{out}");
    assert!(out.contains(" checks passed"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_passes_against_the_mock_pod_with_16_token_blocks() {
    suite_passes_at_block_size(16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_passes_against_the_mock_pod_with_128_token_blocks() {
    suite_passes_at_block_size(128).await;
}
