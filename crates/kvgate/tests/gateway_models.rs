//! Model-aware fleets (issue 43's repro): two mock pods serving different models behind one
//! gateway. Every request reaches a pod serving its model, an unknown model is kvgate's own 404
//! with nothing charged or recorded, `/v1/models` says which pods serve each model, and a known
//! model whose pods are all down is a 503.

use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{PodConfig, RunningPod};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

async fn pod(model: &str) -> RunningPod {
    let config = PodConfig {
        time_scale: 10.0,
        model: model.to_string(),
        ..PodConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    kvgate_mock_pod::spawn_pod(config, listener).await.unwrap()
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The sum of the metric lines of `text` starting with `prefix`.
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum()
}

fn completion(model: &str, i: usize) -> Value {
    json!({"model": model, "prompt": format!("request {i} for {model}: tell me a story"), "max_tokens": 4})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_models_behind_one_gateway_each_request_reaches_a_pod_of_its_model() {
    let (pod_a, pod_b) = (pod("model-a").await, pod("model-b").await);
    let (url_a, url_b) = (pod_a.url(), pod_b.url());
    // A default gateway: nothing declared, the models are learnt from the pods.
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: vec![url_a.clone(), url_b.clone()],
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let shared = gw.shared().clone();
    wait_until("both pods' models learnt", || {
        [&url_a, &url_b].iter().all(|u| {
            shared
                .fleet
                .pods
                .by_url(u)
                .is_some_and(|p| p.served_models().is_some())
        })
    })
    .await;
    let base = format!("http://{}", gw.traffic_addr);
    let http = reqwest::Client::new();

    // 24 requests alternating models: every one 200, answered by a pod of its model.
    for i in 0..24 {
        let (model, want_pod) = if i % 2 == 0 {
            ("model-a", &url_a)
        } else {
            ("model-b", &url_b)
        };
        let resp = http
            .post(format!("{base}/v1/completions"))
            .json(&completion(model, i))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "request {i} for {model}");
        let served_by = resp.headers()["x-kvgate-pod"].to_str().unwrap().to_string();
        assert_eq!(&served_by, want_pod, "request {i} for {model}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["model"], model);
    }

    // An unknown model: kvgate's own 404, nothing charged, decided or sent to a pod.
    let decided = shared.telemetry.decisions.snapshot().len();
    let resp = http
        .post(format!("{base}/v1/completions"))
        .json(&completion("model-c", 0))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(body["error"]["type"], "NotFoundError");
    assert_eq!(body["error"]["param"], "model");
    assert_eq!(shared.telemetry.decisions.snapshot().len(), decided);
    for u in [&url_a, &url_b] {
        assert_eq!(gw.in_flight(u), Some(kvgate_core::InFlight::default()));
        let pod_metrics = http
            .get(format!("{u}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(
            metric(&pod_metrics, "kvgate_mock_pod_rejected_requests_total"),
            0.0,
            "pod {u} rejected nothing"
        );
    }
    let text = shared.metrics_text().unwrap();
    assert_eq!(
        metric(
            &text,
            "kvgate_rejected_requests_total{reason=\"model_not_found\"}"
        ),
        1.0
    );

    // /v1/models: both models, each with the pod that serves it.
    let models: Value = http
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let listed: Vec<(String, Value)> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                m["kvgate_pods"].clone(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![
            ("model-a".to_string(), json!([url_a])),
            ("model-b".to_string(), json!([url_b])),
        ]
    );

    // Model b's only pod goes down: its requests are 503, model a's still served.
    drop(pod_b);
    wait_until("pod b unhealthy", || gw.pod_healthy(&url_b) == Some(false)).await;
    let resp = http
        .post(format!("{base}/v1/completions"))
        .json(&completion("model-b", 99))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_healthy_pod");
    let resp = http
        .post(format!("{base}/v1/completions"))
        .json(&completion("model-a", 100))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-kvgate-pod"].to_str().unwrap(), url_a);
    drop(pod_a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_model_routes_before_the_pod_is_asked_and_a_pod_back_up_is_learnt_again() {
    // Pod b is declared as model-b; with a 1-hour refresh its list is read only when it comes
    // up (at start, and again after an outage).
    let pod_a = pod("model-a").await;
    let url_a = pod_a.url();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr_b = listener.local_addr().unwrap();
    drop(listener);
    let url_b = format!("http://{addr_b}");
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: vec![url_a.clone(), format!("{url_b},model=model-b")],
        models_refresh_interval_ms: Some(3_600_000),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let shared = gw.shared().clone();
    let served = |u: &str| shared.fleet.pods.by_url(u).and_then(|p| p.served_models());
    wait_until("pod a learnt", || served(&url_a).is_some()).await;
    let base = format!("http://{}", gw.traffic_addr);
    let http = reqwest::Client::new();
    // Pod b is down (nothing listens): model-b is known from the config, so 503, not 404.
    let resp = http
        .post(format!("{base}/v1/completions"))
        .json(&completion("model-b", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(
        served(&url_b),
        Some(std::sync::Arc::new(kvgate_core::ServedModels::declared(
            "model-b"
        )))
    );
    // The predictor learns each pod under its hardware class and its model.
    let class = |u: &str| shared.fleet.pods.by_url(u).unwrap().predictor_class();
    assert_eq!(&*class(&url_b), "default@model-b");

    // Pod b comes up serving model-b2 (not what was declared): its own list is learnt.
    let config = PodConfig {
        time_scale: 10.0,
        model: "model-b2".to_string(),
        ..PodConfig::default()
    };
    let listener = tokio::net::TcpListener::bind(addr_b).await.unwrap();
    let pod_b = kvgate_mock_pod::spawn_pod(config, listener).await.unwrap();
    wait_until("pod b's own list learnt", || {
        served(&url_b).is_some_and(|s| s.serves(kvgate_core::AdapterId::of("model-b2")))
    })
    .await;
    let resp = http
        .post(format!("{base}/v1/completions"))
        .json(&completion("model-b2", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-kvgate-pod"].to_str().unwrap(), url_b);
    let resp = http
        .post(format!("{base}/v1/completions"))
        .json(&completion("model-b", 3))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "no pod serves model-b any more");
    assert_eq!(&*class(&url_b), "default@model-b2", "the learnt base model");
    drop((pod_a, pod_b));
}
