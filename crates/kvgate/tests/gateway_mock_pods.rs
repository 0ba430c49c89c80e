//! The gateway in front of real mock pods (in process, 127.0.0.1 ephemeral ports): the official
//! `openai` client, conversation affinity, and a pod that dies. In-flight counters return to
//! zero after each.

use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Four mock pods (model time 10× wall time) and a gateway in front of them, all healthy.
async fn fleet() -> (Vec<RunningPod>, Gateway) {
    let config = PodConfig {
        time_scale: 10.0,
        ..PodConfig::default()
    };
    let pods = kvgate_mock_pod::spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 4)
        .await
        .unwrap();
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods.iter().map(RunningPod::url).collect(),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    wait_until("every pod healthy", || {
        pods.iter().all(|p| gw.pod_healthy(&p.url()) == Some(true))
    })
    .await;
    (pods, gw)
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn assert_in_flight_returns_to_zero(gw: &Gateway, urls: &[String]) {
    wait_until("in-flight counters back to zero", || {
        urls.iter().all(|u| {
            gw.in_flight(u)
                .is_none_or(|f| f == kvgate_core::InFlight::default())
        })
    })
    .await;
}

/// `kvgate_requests_total` by status, summed over pods, policies and branches.
fn requests_by_status(gw: &Gateway, status: &str) -> u64 {
    let text = gw.shared().metrics_text().unwrap();
    let needle = format!("status=\"{status}\"}} ");
    text.lines()
        .filter(|l| l.starts_with("kvgate_requests_total{"))
        .filter_map(|l| l.split_once(&needle))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// `KVGATE_PYTHON`, else `<workspace>/.venv/bin/python`; panics with how to create it.
fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("KVGATE_PYTHON") {
        return p.into();
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(
        venv.exists(),
        "no Python venv for the end-to-end tests: run `scripts/test` (it creates .venv with \
         openai, pyzmq and msgpack and sets KVGATE_PYTHON), or set KVGATE_PYTHON"
    );
    venv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_client_through_the_gateway_to_four_mock_pods() {
    let (pods, gw) = fleet().await;
    let urls: Vec<String> = pods.iter().map(RunningPod::url).collect();
    let base = format!("http://{}", gw.traffic_addr);
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/openai_gateway.py");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python())
            .arg(script)
            .args([base.as_str(), DEFAULT_MODEL])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "openai_gateway.py failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_in_flight_returns_to_zero(&gw, &urls).await;
    // Six routed requests (completions and chat: non-stream, stream, stream with usage), each
    // ended as `ok` — none as a client abort — and the malformed one touched no pod.
    assert_eq!(requests_by_status(&gw, "ok"), 6);
    assert_eq!(requests_by_status(&gw, "client_abort"), 0);
}

/// A long system prompt (real ones are), so later turns' prompts are mostly the cached history.
fn system_prompt(conversation: u32) -> String {
    (0..120)
        .map(|i| format!("Rule {i} of conversation {conversation}: answer precisely. "))
        .collect()
}

/// Sends one chat turn; returns (pod, branch, answer).
async fn turn(
    client: &reqwest::Client,
    base: &str,
    messages: &[Value],
) -> (String, String, String) {
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": DEFAULT_MODEL, "messages": messages, "max_tokens": 8}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let header = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (pod, branch) = (header("x-kvgate-pod"), header("x-kvgate-branch"));
    let body: Value = resp.json().await.unwrap();
    let answer = body
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    (pod, branch, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversation_stays_on_its_pod_after_the_first_turn_while_new_ones_spread() {
    let (pods, gw) = fleet().await;
    let urls: Vec<String> = pods.iter().map(RunningPod::url).collect();
    let base = format!("http://{}", gw.traffic_addr);
    let client = client();

    // Eight new conversations at once: the in-flight load spreads them.
    let mut firsts = tokio::task::JoinSet::new();
    for conversation in 0..8u32 {
        let (client, base) = (client.clone(), base.clone());
        firsts.spawn(async move {
            let messages = vec![
                json!({"role": "system", "content": system_prompt(conversation)}),
                json!({"role": "user", "content": "Hello"}),
            ];
            let (home, _, answer) = turn(&client, &base, &messages).await;
            (conversation, messages, home, answer)
        });
    }
    let mut first_pods = HashSet::new();
    let mut started = Vec::new();
    while let Some(r) = firsts.join_next().await {
        let (conversation, messages, home, answer) = r.unwrap();
        assert!(urls.contains(&home), "unknown pod {home}");
        first_pods.insert(home.clone());
        started.push((conversation, messages, home, answer));
    }
    started.sort_by_key(|s| s.0);
    // Then each of the first three continues for four more turns, one at a time.
    for (conversation, mut messages, home, mut answer) in started.into_iter().take(3) {
        for t in 1..5 {
            messages.push(json!({"role": "assistant", "content": answer}));
            messages.push(json!({"role": "user", "content": format!("And then {t}?")}));
            let (pod, branch, next) = turn(&client, &base, &messages).await;
            assert_eq!(
                (pod.as_str(), branch.as_str()),
                (home.as_str(), "exploit"),
                "conversation {conversation} turn {t}"
            );
            answer = next;
        }
    }
    assert!(
        first_pods.len() >= 3,
        "8 new conversations went to only {first_pods:?}"
    );
    assert_in_flight_returns_to_zero(&gw, &urls).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_pod_gets_no_more_requests_once_detected() {
    let (mut pods, gw) = fleet().await;
    let urls: Vec<String> = pods.iter().map(RunningPod::url).collect();
    let base = format!("http://{}", gw.traffic_addr);
    let client = client();
    let body = |i: u32| {
        json!({"model": DEFAULT_MODEL, "messages": [
            {"role": "system", "content": system_prompt(100 + i)},
            {"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": true})
    };
    for i in 0..8 {
        let resp = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&body(i))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    }

    let dead = pods.remove(0);
    let dead_url = dead.url();
    drop(dead);
    wait_until("the killed pod marked unhealthy", || {
        gw.pod_healthy(&dead_url) == Some(false)
    })
    .await;

    for i in 8..32 {
        let resp = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&body(i))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let pod = resp
            .headers()
            .get("x-kvgate-pod")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert_ne!(pod, dead_url, "request {i} went to the killed pod");
        assert!(resp.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    }
    assert_in_flight_returns_to_zero(&gw, &urls).await;
    assert_eq!(requests_by_status(&gw, "ok"), 32);
}
