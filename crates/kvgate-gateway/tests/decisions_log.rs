//! `--decisions-log FILE`: every routed request's decision, completed with what happened.

mod common;
use common::*;

/// The file's lines once `n` of them went to `pod`.
fn lines(path: &std::path::Path, pod: &str, n: usize) -> Vec<serde_json::Value> {
    for _ in 0..300 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let all: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if all.iter().filter(|l| l["pod"] == pod).count() >= n {
            return all;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!(
        "fewer than {n} lines in {}: {:?}",
        path.display(),
        std::fs::read_to_string(path)
    );
}

#[tokio::test]
async fn each_routed_request_is_logged_with_its_prediction_its_load_and_its_observed_ttft() {
    let a = FakePod::start(Behavior::Normal {
        chunks: 3,
        delay_ms: 5,
    })
    .await;
    let b = FakePod::start(Behavior::Fail500).await;
    let path = std::env::temp_dir().join(format!("kvgate-decisions-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut args = args(&[&a, &b]);
    args.decisions_log = Some(path.clone());
    let gw = kvgate_gateway::Gateway::start(args).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let c = client();
    for (i, stream) in [true, false, true].into_iter().enumerate() {
        let r = send(
            &c,
            post(
                &gw,
                "/v1/chat/completions",
                &chat_body(&format!("q{i}"), stream),
            ),
        )
        .await;
        assert_eq!(r.status, http::StatusCode::OK, "{}", r.text());
    }
    // Three answered requests; attempts on the failing pod were logged too, without an outcome.
    let logged = lines(&path, &a.url, 3);
    let answered: Vec<_> = logged
        .iter()
        .filter(|l| l["pod"] == a.url.as_str())
        .collect();
    assert_eq!(answered.len(), 3, "{logged:#?}");
    // Streams carry their TTFT; a whole-body answer has none (its first byte is its end).
    let observed: Vec<f64> = answered
        .iter()
        .filter_map(|l| l["observed"]["ttft_ms"].as_f64())
        .collect();
    assert_eq!(observed.len(), 2, "{answered:#?}");
    assert!(
        observed.iter().all(|t| *t >= 0.0 && *t < 5_000.0),
        "{observed:?}"
    );
    for l in &answered {
        assert!(l["ended_ms"].as_u64().unwrap() >= l["timestamp_ms"].as_u64().unwrap());
        assert!(l["branch"].is_string(), "{l}");
        // A retry's decision weighs only the pods not tried yet.
        let pods = l["pods"].as_array().unwrap();
        assert!(!pods.is_empty(), "{l}");
        assert!(pods.iter().all(|p| p["predicted_ttft_ms"].is_number()));
        let load = l["load"].as_array().unwrap();
        assert_eq!(load.len(), 2, "{l}");
        assert!(load.iter().all(|p| p["in_flight_requests"].is_number()));
    }
    for l in logged.iter().filter(|l| l["pod"] == b.url.as_str()) {
        assert!(
            l["observed"].is_null(),
            "a failed attempt has no outcome: {l}"
        );
        assert!(l["ended_ms"].is_number());
    }
    let ids: std::collections::HashSet<_> = answered.iter().map(|l| &l["request_id"]).collect();
    assert_eq!(ids.len(), 3);
    assert_idle(&gw, &[&a, &b]).await;
    let _ = std::fs::remove_file(&path);
}

/// A pod that caches in 128-token blocks (vLLM on CPU) holds 8 times as many of the router's
/// 16-token blocks: the routed index must remember its conversations for that long, not evict
/// them after an eighth of its cache.
#[tokio::test]
async fn a_pod_with_128_token_blocks_keeps_a_conversation_for_its_whole_cache() {
    let a = FakePod::start(Behavior::Normal {
        chunks: 1,
        delay_ms: 1,
    })
    .await;
    // 4 blocks of 128 tokens: 512 tokens, 32 of the router's blocks (16 tokens × 4 chars).
    *a.state.cache_config.lock().unwrap() = (128, 4);
    let path = std::env::temp_dir().join(format!(
        "kvgate-decisions-capacity-{}.jsonl",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let mut args = args(&[&a]);
    args.decisions_log = Some(path.clone());
    let gw = kvgate_gateway::Gateway::start(args).await.unwrap();
    eventually("the pod's cache size is scraped", || {
        a.state
            .metrics_requests
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 2
    })
    .await;
    let c = client();
    // Five distinct prompts of ~6 router blocks each (~30 blocks in all), then the first again.
    let prompt = |i: usize| format!("{i} ").repeat(200)[..400].to_string();
    for i in [0, 1, 2, 3, 4, 0] {
        let r = send(
            &c,
            post(&gw, "/v1/chat/completions", &chat_body(&prompt(i), false)),
        )
        .await;
        assert_eq!(r.status, http::StatusCode::OK, "{}", r.text());
    }
    let logged = lines(&path, &a.url, 6);
    let last = logged
        .iter()
        .max_by_key(|l| l["timestamp_ms"].as_u64())
        .unwrap();
    let score = last["pods"][0]["prefix_score"].as_f64().unwrap();
    assert!(
        score > 0.8,
        "the repeated prompt scores {score}: its blocks were evicted early ({logged:#?})"
    );
}
