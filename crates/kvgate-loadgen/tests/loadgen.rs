//! `kvgate loadgen` against in-process mock pods on 127.0.0.1.

mod common;

use common::{args, mooncake_trace};
use kvgate_loadgen::prompt;
use kvgate_mock_pod::tokenizer::PromptTokenizer;
use kvgate_mock_pod::{PodConfig, spawn_pods};

#[test]
fn every_synthetic_word_is_one_cl100k_token() {
    let tok = PromptTokenizer::cl100k();
    for w in prompt::WORDS {
        assert_eq!(tok.encode(&format!(" {w}")).len(), 1, "{w:?}");
    }
    // Whole prompts: one token per word, so lengths come out exactly.
    let text = prompt::mooncake_prompt(&[3, 4, 5], 1300);
    assert_eq!(tok.encode(&text).len(), 1300);
    let text = prompt::blocks_prompt(&[9, 8, 7], 60, 3);
    assert_eq!(tok.encode(&text).len(), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_against_a_mock_pod_completes_every_request_and_writes_sim_keys() {
    let config = PodConfig {
        time_scale: 20.0,
        ..PodConfig::default()
    };
    let pods = spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 1)
        .await
        .unwrap();
    let trace = mooncake_trace("pod");
    let json = trace.with_extension("report.json");
    let per_request = trace.with_extension("requests.jsonl");
    let mut a = args(pods[0].url(), trace.clone());
    a.json = Some(json.clone());
    a.requests_jsonl = Some(per_request.clone());
    let before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64;
    let report = kvgate_loadgen::run(a).await.unwrap();
    // One line per request, in send order, with wall-clock send times and the same TTFTs.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&per_request)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 12);
    let sent: Vec<f64> = lines
        .iter()
        .map(|l| l["sent_unix_ms"].as_f64().unwrap())
        .collect();
    assert!(sent[0] >= before_ms - 1.0, "{} < {before_ms}", sent[0]);
    assert!(sent.windows(2).all(|w| w[0] <= w[1]), "{sent:?}");
    assert!(lines.iter().all(|l| l["error"].is_null()));
    assert!(lines.iter().all(|l| l["ttft_ms"].as_f64().unwrap() > 0.0));
    // A pod says no routing headers: no `pod`, `branch` or `queue_ms` key; the prompt's size
    // is there.
    assert!(lines.iter().all(|l| l.get("pod").is_none()
        && l.get("branch").is_none()
        && l.get("queue_ms").is_none()));
    assert!(
        lines
            .iter()
            .all(|l| l["input_tokens"].as_u64().unwrap() > 0)
    );
    let _ = std::fs::remove_file(per_request);
    assert_eq!(report.requests, 12);
    assert_eq!(report.completed, 12, "errors: {:?}", report.errors);
    assert!(report.errors.is_empty());
    // Outputs are 5..=8 tokens with ignore_eos: exactly Σ over 3 turns.
    assert_eq!(report.output_tokens, 3 * (5 + 6 + 7 + 8));
    assert_eq!(report.input_tokens_sent, 4 * (1124 + 1636 + 2148));
    let (t, p, e) = (report.ttft_ms, report.tpot_ms, report.e2e_ms);
    assert!(t.p50 > 0.0 && t.p50 <= t.p90 && t.p90 <= t.p99, "{t:?}");
    assert!(p.p50 > 0.0 && p.p50 <= p.p99, "{p:?}");
    assert!(e.p50 >= t.p50 && e.p99 >= t.p99, "{e:?}");
    // The target is a pod: its own /metrics gives the hit rate. Turns 2 and 3 reuse history.
    let hit = report.prefix_hit_rate.expect("pod exposes prefix counters");
    assert!(hit > 0.3 && hit < 1.0, "{hit}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for key in [
        "requests",
        "completed",
        "prefix_hit_rate",
        "output_tok_per_s",
        "errors",
    ] {
        assert!(v.get(key).is_some(), "{key} missing");
    }
    for key in ["ttft_ms", "tpot_ms", "e2e_ms"] {
        for q in ["mean", "p50", "p90", "p99"] {
            assert!(v[key][q].as_f64().is_some(), "{key}.{q}");
        }
    }
    let _ = std::fs::remove_file(trace);
    let _ = std::fs::remove_file(json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_targets_count_as_connect_errors() {
    let trace = mooncake_trace("dead");
    let mut a = args("http://127.0.0.1:9".into(), trace.clone());
    a.model = Some("m".into());
    a.rate_scale = 100.0;
    let report = kvgate_loadgen::run(a).await.unwrap();
    assert_eq!(report.completed, 0);
    assert_eq!(report.errors.get("connect"), Some(&12));
    assert_eq!(report.prefix_hit_rate, None);
    let _ = std::fs::remove_file(trace);
}

/// `--token-prompts`: prompts go as token ids, so the pod sees exactly the planned lengths (its
/// own prompt-token counter equals the plan's) and the turns still share their history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_prompts_reach_the_pod_with_exactly_the_planned_lengths() {
    let config = PodConfig {
        time_scale: 20.0,
        ..PodConfig::default()
    };
    let pods = spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 1)
        .await
        .unwrap();
    let trace = mooncake_trace("tokens");
    let mut a = args(pods[0].url(), trace.clone());
    a.token_prompts = true;
    let report = kvgate_loadgen::run(a).await.unwrap();
    assert_eq!(report.completed, 12, "errors: {:?}", report.errors);
    let metrics = reqwest::get(format!("{}/metrics", pods[0].url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prompt_tokens: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("vllm:prompt_tokens_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(prompt_tokens as u64, 4 * (1124 + 1636 + 2148));
    let hit = report.prefix_hit_rate.expect("pod exposes prefix counters");
    assert!(hit > 0.3 && hit < 1.0, "{hit}");
    let _ = std::fs::remove_file(trace);
}
