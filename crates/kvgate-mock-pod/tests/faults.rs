//! Fault injection (`--fail-after`, `--hang`, `--garbage-metrics`), for reliability tests of what
//! sits in front of the pods.

mod common;

use std::time::Duration;

use common::{MODEL, client, pod};
use kvgate_mock_pod::PodConfig;
use kvgate_mock_pod::api::{Faults, GARBAGE_METRICS};
use serde_json::json;

fn with(faults: Faults) -> PodConfig {
    PodConfig {
        faults,
        ..PodConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_after_cuts_the_stream_after_n_tokens_without_done() {
    let pod = pod(with(Faults {
        fail_after_tokens: Some(2),
        ..Faults::default()
    }))
    .await;
    let body = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 8, "stream": true});
    let mut resp = client()
        .post(format!("{}/v1/completions", pod.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut text = String::new();
    let broken = loop {
        match resp.chunk().await {
            Ok(Some(c)) => text.push_str(&String::from_utf8_lossy(&c)),
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert!(broken, "the body must end with an error: {text}");
    assert_eq!(text.matches("data: {").count(), 2, "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_never_answers_completions_but_stays_healthy() {
    let pod = pod(with(Faults {
        hang: true,
        ..Faults::default()
    }))
    .await;
    let body = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 2});
    let r = client()
        .post(format!("{}/v1/completions", pod.url()))
        .json(&body)
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(r.unwrap_err().is_timeout());
    let health = client()
        .get(format!("{}/health", pod.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_metrics_answers_text_that_is_not_prometheus() {
    let pod = pod(with(Faults {
        garbage_metrics: true,
        ..Faults::default()
    }))
    .await;
    let text = client()
        .get(format!("{}/metrics", pod.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text, GARBAGE_METRICS);
}
