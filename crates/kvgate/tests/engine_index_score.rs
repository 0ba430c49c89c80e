//! `kvgate serve --index engine` in front of four in-process mock pods that publish vLLM KV
//! events (ZeroMQ on 127.0.0.1, ephemeral ports): the gateway's prefix score comes from what
//! the pods report they hold, not from where requests were routed.
//!
//! The first request goes to one pod **directly**, bypassing the gateway, so the gateway has
//! no routing history for it; only the pod's `BlockStored` events can tell it where the prompt
//! lives. The prompt has N tokens (cl100k, as the mock pod and the gateway's token mode cut
//! it) with N mod 16 ≠ 0: the pod caches the ⌊N/16⌋ full blocks and not the partial last one.
//! Then, through the gateway:
//! - the same prompt scores exactly 1.0 on that pod and 0.0 on the others (the score counts
//!   full blocks: ⌊N/16⌋ of ⌊N/16⌋), and the pod reports ⌊N/16⌋ × 16 = N − (N mod 16) cached
//!   tokens: the whole prompt minus its last partial block;
//! - the prompt extended to M tokens scores exactly ⌊N/16⌋ / ⌊M/16⌋ on that pod.

use kvgate_core::index::PrefixIndex;
use kvgate_core::tokenizer::PromptTokenizer;
use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const BLOCK: usize = 16;

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `POST {base}/v1/completions`; returns (response headers' `x-mock-pod`, body).
async fn complete(client: &reqwest::Client, base: &str, prompt: &str) -> (String, Value) {
    let resp = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let served_by = resp
        .headers()
        .get("x-mock-pod")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (served_by, resp.json().await.unwrap())
}

/// The gateway's last logged decision, from the admin listener's `/debug/decisions`.
async fn last_decision(client: &reqwest::Client, gw: &Gateway) -> Value {
    let url = format!("http://{}/debug/decisions", gw.admin_addr);
    let all: Vec<Value> = client.get(url).send().await.unwrap().json().await.unwrap();
    all.last().cloned().expect("no decision logged")
}

/// `prefix_score` per pod id of a logged decision.
fn scores(decision: &Value) -> Vec<(String, f64)> {
    decision["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_string(),
                p["prefix_score"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn prompt_text(sentences: std::ops::Range<u32>) -> String {
    sentences
        .map(|i| format!(" Sentence {i} of the shared document says something plain."))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_after_a_request_is_one_minus_the_last_partial_block_from_events_alone() {
    let config = PodConfig {
        time_scale: 10.0,
        kv_events: Some("tcp://127.0.0.1:0".into()),
        kv_events_replay: Some("tcp://127.0.0.1:0".into()),
        ..PodConfig::default()
    };
    let pods = kvgate_mock_pod::spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 4)
        .await
        .unwrap();
    let pod_args: Vec<String> = pods
        .iter()
        .map(|p| {
            format!(
                "{},events={},replay={}",
                p.url(),
                p.kv_events_endpoint.as_deref().unwrap(),
                p.kv_events_replay_endpoint.as_deref().unwrap()
            )
        })
        .collect();
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pod_args,
        index: Some(kvgate_gateway::config::IndexKind::Engine),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let urls: Vec<String> = pods.iter().map(RunningPod::url).collect();
    let ids: Vec<_> = urls
        .iter()
        .map(|u| gw.shared().fleet.pods.by_url(u).unwrap().id)
        .collect();
    wait_until("every pod healthy and followed by the engine index", || {
        let session = gw.shared().session.lock();
        urls.iter().all(|u| gw.pod_healthy(u) == Some(true))
            && ids.iter().all(|&id| session.index().engine.is_live(id))
    })
    .await;

    let tokenizer = PromptTokenizer::cl100k();
    let mut prompt = prompt_text(0..40);
    while tokenizer.encode(&prompt).len().is_multiple_of(BLOCK) {
        prompt.push_str(" x");
    }
    let n = tokenizer.encode(&prompt).len();
    let full_blocks = n / BLOCK;
    assert!(full_blocks >= 10 && !n.is_multiple_of(BLOCK), "N = {n}");

    // Straight to pod 2: no routing history in the gateway.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let home = 2;
    let (_, direct) = complete(&client, &urls[home], &prompt).await;
    assert_eq!(direct["usage"]["prompt_tokens"].as_u64(), Some(n as u64));
    wait_until("the pod's BlockStored events applied", || {
        gw.shared()
            .session
            .lock()
            .index()
            .engine
            .pod_blocks(ids[home])
            == full_blocks
    })
    .await;
    assert_eq!(
        gw.shared().session.lock().index().routed.indexed_blocks(),
        0,
        "the routed index must know nothing yet"
    );

    // The same prompt through the gateway.
    let base = format!("http://{}", gw.traffic_addr);
    let (served_by, body) = complete(&client, &base, &prompt).await;
    let decision = last_decision(&client, &gw).await;
    let expected: Vec<(String, f64)> = urls
        .iter()
        .enumerate()
        .map(|(i, u)| (u.clone(), if i == home { 1.0 } else { 0.0 }))
        .collect();
    assert_eq!(scores(&decision), expected, "decision: {decision}");
    assert_eq!(decision["pod"].as_str(), Some(urls[home].as_str()));
    assert_eq!(format!("http://{served_by}"), urls[home]);
    // The pod's own prefix cache agrees: every token but the last partial block was cached.
    assert_eq!(
        body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some((n - n % BLOCK) as u64)
    );

    // The prompt extended: ⌊N/16⌋ of its ⌊M/16⌋ blocks are cached on that pod.
    let longer = format!("{prompt}{}", prompt_text(100..120));
    let m = tokenizer.encode(&longer).len();
    assert_eq!(
        tokenizer.encode(&longer)[..n],
        tokenizer.encode(&prompt)[..],
        "the extension must keep the prompt's tokens"
    );
    complete(&client, &base, &longer).await;
    let decision = last_decision(&client, &gw).await;
    let expected: Vec<(String, f64)> = urls
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let s = if i == home {
                full_blocks as f64 / (m / BLOCK) as f64
            } else {
                0.0
            };
            (u.clone(), s)
        })
        .collect();
    assert_eq!(scores(&decision), expected, "decision: {decision}");
}

/// Bursts of `siblings` requests sharing a new prefix of ~2,000 words, each burst sent at once
/// through `kvgate serve --index engine` in front of four event-publishing mock pods. Returns,
/// per burst, the pods its requests reached and how many of the later decisions scored a
/// pending route, and the prompt tokens the pods served from their prefix caches in all.
async fn bursts(
    pending_ttl_ms: Option<f64>,
    n_bursts: u32,
    siblings: u32,
) -> (Vec<(usize, usize)>, u64) {
    let config = PodConfig {
        time_scale: 10.0,
        kv_events: Some("tcp://127.0.0.1:0".into()),
        ..PodConfig::default()
    };
    let pods = kvgate_mock_pod::spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 4)
        .await
        .unwrap();
    let pod_args: Vec<String> = pods
        .iter()
        .map(|p| {
            format!(
                "{},events={}",
                p.url(),
                p.kv_events_endpoint.as_deref().unwrap()
            )
        })
        .collect();
    let dir = std::env::temp_dir().join(format!(
        "kvgate-pending-{}-{}",
        std::process::id(),
        pending_ttl_ms.is_some()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let config_file = dir.join("kvgate.toml");
    let router = match pending_ttl_ms {
        // Predictions that count the pending prefix as uncached (`predict_computed_prefix`,
        // the default) let the load gate move siblings to idle pods; this test is about where
        // the pending routes alone put them.
        Some(ms) => {
            format!("[router]\nengine_pending_ttl_ms = {ms}\npredict_computed_prefix = false\n")
        }
        None => String::new(),
    };
    std::fs::write(&config_file, router).unwrap();
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pod_args,
        config: Some(config_file),
        index: Some(kvgate_gateway::config::IndexKind::Engine),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let urls: Vec<String> = pods.iter().map(RunningPod::url).collect();
    let ids: Vec<_> = urls
        .iter()
        .map(|u| gw.shared().fleet.pods.by_url(u).unwrap().id)
        .collect();
    wait_until("every pod healthy and followed by the engine index", || {
        let session = gw.shared().session.lock();
        urls.iter().all(|u| gw.pod_healthy(u) == Some(true))
            && ids.iter().all(|&id| session.index().engine.is_live(id))
    })
    .await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let base = format!("http://{}", gw.traffic_addr);
    let mut out = Vec::new();
    let mut cached = 0;
    for burst in 0..n_bursts {
        let shared: String = (0..200)
            .map(|i| format!(" Burst {burst} document line {i} reads plainly."))
            .collect();
        let mut calls = tokio::task::JoinSet::new();
        for k in 0..siblings {
            let prompt = format!("{shared} Question {k}?");
            let (client, base) = (client.clone(), base.clone());
            calls.spawn(async move { complete(&client, &base, &prompt).await });
        }
        let mut served = std::collections::BTreeSet::new();
        for (pod, body) in calls.join_all().await {
            served.insert(pod);
            cached += body["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
        }
        let url = format!("http://{}/debug/decisions", gw.admin_addr);
        let all: Vec<Value> = client.get(url).send().await.unwrap().json().await.unwrap();
        let pending = all
            .iter()
            .rev()
            .take(siblings as usize)
            .filter(|d| {
                d["pods"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["pending_blocks"].as_u64().unwrap_or(0) > 0)
            })
            .count();
        out.push((served.len(), pending));
        // The burst's blocks settle (stored, pending confirmed) before the next one.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (out, cached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_sharing_a_new_prefix_stays_on_one_pod_with_pending_routes() {
    let (with, cached_with) = bursts(Some(2000.0), 4, 4).await;
    let (without, cached_without) = bursts(Some(0.0), 4, 4).await;
    eprintln!(
        "pods per burst, pending decisions: with {with:?}, without {without:?}; \
         cached prompt tokens: with {cached_with}, without {cached_without}"
    );
    // Each burst on one pod; some siblings decided before the first one's events confirmed
    // its blocks (the rest came after, and scored the stored blocks).
    assert!(
        with.iter().all(|&(pods, _)| pods == 1),
        "with pending routes: {with:?}"
    );
    assert!(with.iter().any(|&(_, pending)| pending > 0), "{with:?}");
    // Off: no decision scores a pending route (where the bursts go then depends on how soon
    // the events arrive; on an idle machine they spread over 3 of the 4 pods).
    assert!(
        without.iter().all(|&(_, pending)| pending == 0),
        "{without:?}"
    );
}
