//! A data-parallel server behind the gateway: one in-process mock pod with
//! `--data-parallel-size 2` (two engines behind one port, as vLLM's `--data-parallel-size`
//! runs them: `X-data-parallel-rank` pins, `/metrics` per `engine` label, KV events per rank on
//! port + rank) and `kvgate serve --pod URL,dp=2`, which routes it as two engines `URL#dp0`,
//! `URL#dp1`. The same checks run against a real vLLM DP server in `real_vllm_dp.rs`.

use kvgate_core::tokenizer::PromptTokenizer;
use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn dp_pod(events: bool) -> RunningPod {
    let endpoint = events.then(|| "tcp://127.0.0.1:0".to_string());
    let config = PodConfig {
        time_scale: 10.0,
        data_parallel_size: 2,
        kv_events: endpoint.clone(),
        kv_events_replay: endpoint,
        ..PodConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    kvgate_mock_pod::spawn_pod(config, listener).await.unwrap()
}

async fn gateway(pod: &RunningPod) -> Gateway {
    let mut arg = format!("{},dp=2", pod.url());
    let index = match (&pod.kv_events_endpoint, &pod.kv_events_replay_endpoint) {
        (Some(e), Some(r)) => {
            arg.push_str(&format!(",events={e},replay={r}"));
            Some(kvgate_gateway::config::IndexKind::Engine)
        }
        _ => None,
    };
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: vec![arg],
        index,
        scrape_interval_ms: Some(20),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    wait_until("both engines healthy", || {
        let pods = gw.shared().fleet.pods.all();
        pods.len() == 2 && pods.iter().all(|p| p.is_healthy())
    })
    .await;
    gw
}

/// A completion through `base`: (`x-kvgate-pod`, or `x-mock-pod` when sent straight).
async fn complete(base: &str, prompt: &str, rank: Option<u32>) -> String {
    let mut req = client()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 3}));
    if let Some(r) = rank {
        req = req.header("X-data-parallel-rank", r.to_string());
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.headers()
        .get("x-kvgate-pod")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// Each engine's `vllm:prefix_cache_hits_total` on the mock pod, in rank order.
async fn engine_hits(pod: &RunningPod) -> [f64; 2] {
    let text = client()
        .get(format!("{}/metrics", pod.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut out = [0.0; 2];
    for (rank, slot) in out.iter_mut().enumerate() {
        let engine = format!("engine=\"{rank}\"");
        *slot = text
            .lines()
            .filter(|l| l.starts_with("vllm:prefix_cache_hits_total{") && l.contains(&engine))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
    }
    out
}

fn conversation_prefix(c: usize) -> String {
    (0..60)
        .map(|i| format!(" Conversation {c} opens with line {i} of its own long context."))
        .collect()
}

fn turn(prefix: &str, n: usize) -> String {
    let mut s = prefix.to_string();
    for t in 1..=n {
        s.push_str(&format!(" Question {t}: and what follows from line {t}?"));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_engine_of_a_dp_server_keeps_its_conversations_and_serves_them_from_its_cache() {
    let pod = dp_pod(false).await;
    let gw = gateway(&pod).await;
    let base = format!("http://{}", gw.traffic_addr);
    let names: Vec<String> = gw
        .shared()
        .fleet
        .pods
        .all()
        .iter()
        .map(|p| p.url.clone())
        .collect();
    assert_eq!(
        names,
        [format!("{}#dp0", pod.url()), format!("{}#dp1", pod.url())]
    );
    // /debug/config shows the server once, with its engine count.
    let config: serde_json::Value = client()
        .get(format!("http://{}/debug/config", gw.admin_addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let shown: Vec<(&str, u64)> = config["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["url"].as_str().unwrap(),
                p["data_parallel_size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shown, [(pod.url().as_str(), 2)]);
    // The scrape splits the server's metrics by engine: each gets its own block size.
    wait_until("each engine's block size scraped", || {
        gw.shared()
            .fleet
            .pods
            .all()
            .iter()
            .all(|p| p.block_size_tokens() == Some(16))
    })
    .await;
    const CONVERSATIONS: usize = 6;
    const TURNS: usize = 3;
    // The first turns at once: the in-flight ledger spreads them over the engines.
    let mut tasks = Vec::new();
    for c in 0..CONVERSATIONS {
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            complete(&base, &turn(&conversation_prefix(c), 0), None).await
        }));
    }
    let mut home = Vec::new();
    for task in tasks {
        let pod = task.await.unwrap();
        assert!(names.contains(&pod), "{pod}");
        home.push(pod);
    }
    // Then the later turns, one conversation at a time: each stays on its engine.
    for (c, pod) in home.iter().enumerate() {
        for n in 1..TURNS {
            let got = complete(&base, &turn(&conversation_prefix(c), n), None).await;
            assert_eq!(&got, pod, "conversation {c} turn {n} moved");
        }
    }
    let used: BTreeSet<&String> = home.iter().collect();
    assert_eq!(used.len(), 2, "both engines serve conversations: {home:?}");
    // One more turn each, one at a time: the chosen engine's cache hits, the other's not.
    for (c, pod_name) in home.iter().enumerate() {
        let before = engine_hits(&pod).await;
        let got = complete(&base, &turn(&conversation_prefix(c), TURNS), None).await;
        assert_eq!(&got, pod_name, "conversation {c}");
        let after = engine_hits(&pod).await;
        for rank in 0..2 {
            let delta = after[rank] - before[rank];
            if *pod_name == names[rank] {
                assert!(
                    delta >= 160.0,
                    "conversation {c}: chosen engine {rank} hit {delta}"
                );
            } else {
                assert_eq!(
                    delta, 0.0,
                    "conversation {c}: engine {rank} (not chosen) hit"
                );
            }
        }
    }
    // The in-flight ledger is back to zero on both engines.
    let session = gw.shared().session.lock();
    for p in gw.shared().fleet.pods.all().iter() {
        assert_eq!(session.in_flight(p.id).requests, 0, "{}", p.url);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_ranks_kv_events_reach_only_that_engines_index_entry() {
    let pod = dp_pod(true).await;
    let gw = gateway(&pod).await;
    let base = format!("http://{}", gw.traffic_addr);
    let pods = gw.shared().fleet.pods.all().clone();
    let ids: Vec<_> = pods.iter().map(|p| p.id).collect();
    wait_until("both engines followed by the engine index", || {
        let session = gw.shared().session.lock();
        ids.iter().all(|&id| session.index().engine.is_live(id))
    })
    .await;
    let tokenizer = PromptTokenizer::cl100k();
    for rank in [1usize, 0] {
        let prompt = conversation_prefix(100 + rank);
        let full_blocks = tokenizer.encode(&prompt).len() / 16;
        let other = 1 - rank;
        let blocks = |id| gw.shared().session.lock().index().engine.pod_blocks(id);
        let (mine_before, other_before) = (blocks(ids[rank]), blocks(ids[other]));
        // Straight to the server, pinned: the gateway learns it from that rank's events only.
        complete(&pod.url(), &prompt, Some(rank as u32)).await;
        wait_until("the pinned engine's BlockStored events applied", || {
            blocks(ids[rank]) >= mine_before + full_blocks
        })
        .await;
        // Give a stray batch on the other stream time to arrive: none may.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            blocks(ids[other]),
            other_before,
            "engine {other} learnt rank {rank}'s prompt"
        );
        // Through the gateway, the prompt's next turn goes to the engine holding it.
        let before = engine_hits(&pod).await;
        let got = complete(&base, &format!("{prompt} And then?"), None).await;
        assert_eq!(got, pods[rank].url);
        let after = engine_hits(&pod).await;
        assert!(after[rank] - before[rank] >= (full_blocks * 16) as f64);
        assert_eq!(after[other], before[other]);
    }
}
