//! SLO headers (validated and recorded; the `llmd-chain` policy routes by them, kvgate's gate does not), predictor metrics and the gate's parameters in front of four
//! real mock pods (in process, 127.0.0.1 ephemeral ports), seen from outside: requests over
//! HTTP, `/debug/decisions` and `/metrics` from the admin listener.

use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

async fn fleet(config_file: Option<std::path::PathBuf>) -> (Vec<RunningPod>, Gateway) {
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
        config: config_file,
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Healthy, and their models learnt: the predictor's class then names the model.
    let ready = |url: &str| {
        gw.pod_healthy(url) == Some(true)
            && gw
                .shared()
                .fleet
                .pods
                .by_url(url)
                .is_some_and(|p| p.served_models().is_some())
    };
    while !pods.iter().all(|p| ready(&p.url())) {
        assert!(Instant::now() < deadline, "pods not healthy in 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (pods, gw)
}

/// The pods' predictor class: the default hardware class and the mock pods' model.
fn predictor_class() -> String {
    format!("default@{DEFAULT_MODEL}")
}

fn chat(turn: u32) -> Value {
    json!({
        "model": DEFAULT_MODEL,
        "max_tokens": 8,
        // Streams: the gateway measures TTFT (and so trains the predictor) on streams.
        "stream": true,
        "messages": [{"role": "user", "content": format!("Question {turn}: what is a KV cache?")}],
    })
}

async fn post(gw: &Gateway, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", gw.traffic_addr))
        .timeout(Duration::from_secs(30))
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

async fn decisions(gw: &Gateway) -> Vec<Value> {
    reqwest::get(format!("http://{}/debug/decisions", gw.admin_addr))
        .await
        .unwrap()
        .json::<Vec<Value>>()
        .await
        .unwrap()
}

async fn metrics(gw: &Gateway) -> String {
    reqwest::get(format!("http://{}/metrics", gw.admin_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the first `/metrics` line starting with `series` (name and labels).
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

/// A config file with `router_toml` as its `[router]` table.
fn router_config(name: &str, router_toml: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-slo-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.toml");
    std::fs::write(&path, format!("[router]\n{router_toml}\n")).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objectives_are_validated_and_recorded_but_do_not_route_the_gate() {
    let (_pods, gw) = fleet(None).await;
    let r = post(&gw, &chat(1), &[("x-slo-ttft-ms", "0.001")]).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let r = post(&gw, &chat(2), &[("x-slo-ttft-ms", "-5")]).await;
    assert_eq!(r.status(), 400);
    let d = decisions(&gw).await;
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(d[0]["slo_ttft_ms"], 0.001);
    assert!(d[0].get("slo").is_none(), "{:#?}", d[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slo_headers_route_a_policy_that_reads_them_and_bad_ones_are_400() {
    // The llm-d chain model routes by objectives, as upstream (kvgate's gate does not: its SLO
    // mode was removed, docs/decisions/slo-routing.md).
    let dir = std::env::temp_dir().join(format!("kvgate-slo-chain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.toml");
    std::fs::write(&path, "policy = \"llmd-chain\"\n").unwrap();
    let (_pods, gw) = fleet(Some(path)).await;

    // Loose objectives: every pod meets them, the explanation says so.
    let r = post(
        &gw,
        &chat(1),
        &[("x-slo-ttft-ms", "60000"), ("x-slo-tpot-ms", "1000")],
    )
    .await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    // An objective no pod can meet (llm-d's header name): still routed, to an idle pod first.
    let r = post(&gw, &chat(2), &[("x-llm-d-slo-ttft-ms", "0.001")]).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    // No header: nothing to explain.
    let r = post(&gw, &chat(3), &[]).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    // Not a number of milliseconds > 0: 400, no decision.
    let r = post(&gw, &chat(4), &[("x-slo-ttft-ms", "soon")]).await;
    assert_eq!(r.status(), 400);
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "invalid_slo_header");
    assert_eq!(err["error"]["param"], "x-slo-ttft-ms");
    assert_eq!(err["error"]["type"], "invalid_request_error");

    let d = decisions(&gw).await;
    assert_eq!(d.len(), 3, "{d:#?}");
    let loose = &d[0]["slo"];
    assert_eq!(loose["ttft_ms"], 60000.0);
    assert_eq!(loose["tpot_ms"], 1000.0);
    assert_eq!(loose["predicted_to_meet"], true);
    assert!(loose["headroom_ttft_ms"].as_f64().unwrap() > 0.0);
    let tight = &d[1]["slo"];
    assert_eq!(tight["ttft_ms"], 0.001);
    assert_eq!(tight["tpot_ms"], Value::Null);
    assert_eq!(tight["predicted_to_meet"], false);
    assert!(tight["headroom_ttft_ms"].as_f64().unwrap() < 0.0);
    assert!(d[2].get("slo").is_none(), "{:#?}", d[2]);
    let text = metrics(&gw).await;
    assert_eq!(
        metric(
            &text,
            "kvgate_rejected_requests_total{reason=\"invalid_slo_header\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predictor_metrics_per_class_move_after_requests_and_the_gate_parameters_are_exposed() {
    let path = router_config("tau-0.7", "affinity_gate_tau = 0.7");
    let (_pods, gw) = fleet(Some(path)).await;

    let before = metrics(&gw).await;
    assert_eq!(metric(&before, "kvgate_affinity_gate_tau "), Some(0.7));
    assert_eq!(
        metric(&before, "kvgate_epsilon_explore_sticky "),
        Some(0.01)
    );
    assert_eq!(
        metric(
            &before,
            &format!(
                "kvgate_predictor_class_ttft_samples{{class=\"{}\"}}",
                predictor_class()
            )
        ),
        None,
        "no class has learnt yet"
    );
    for turn in 0..40 {
        let r = post(&gw, &chat(turn), &[]).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    // Training happens when the body ends; wait for the 40th sample.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = metrics(&gw).await;
        if metric(
            &text,
            &format!(
                "kvgate_predictor_class_ttft_samples{{class=\"{}\"}}",
                predictor_class()
            ),
        ) == Some(40.0)
        {
            break text;
        }
        assert!(Instant::now() < deadline, "no 40 samples:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let class = |name: &str| metric(&text, &format!("{name}{{class=\"{}\"}}", predictor_class()));
    // A TPOT needs two output tokens; the mock pod ends some answers after one.
    let tpot_samples = class("kvgate_predictor_class_tpot_samples").unwrap();
    assert!((1.0..=40.0).contains(&tpot_samples), "{tpot_samples}");
    let coverage = class("kvgate_predictor_class_ttft_p90_coverage").unwrap();
    assert!(coverage > 0.0 && coverage <= 1.0, "{coverage}");
    // Past the 32 cold-start samples the class's errors are scored: real latencies are never
    // predicted exactly, so the recent error is above 0 (and finite).
    let mape = class("kvgate_predictor_class_ttft_mape").unwrap();
    assert!(mape > 0.0 && mape.is_finite(), "{mape}");
    let drift = class("kvgate_predictor_class_drift").unwrap();
    assert!(drift == 0.0 || drift == 1.0, "{drift}");
    assert!(class("kvgate_predictor_class_drift_episodes_total").is_some());
    assert_eq!(decisions(&gw).await.len(), 40);
    assert_eq!(metric(&text, "kvgate_affinity_gate_tau "), Some(0.7));
}
