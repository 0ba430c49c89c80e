//! Prefill/decode disaggregation through the gateway's HTTP proxy, in front of mock pods that
//! speak vLLM's `NixlConnector` protocol (`--kv-role`): each request is prefilled on a prefill
//! pod, handed over with its `kv_transfer_params` and decoded on a decode pod that computes no
//! prompt token; failures of either stage are survived.

use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::api::{Faults, KvRole};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

async fn mock_pod(kv_role: Option<KvRole>, faults: Faults) -> RunningPod {
    let config = PodConfig {
        time_scale: 10.0,
        kv_role,
        faults,
        ..PodConfig::default()
    };
    kvgate_mock_pod::spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 1)
        .await
        .unwrap()
        .remove(0)
}

fn gateway_args(pods: &[(&RunningPod, &str)]) -> ServeArgs {
    ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods
            .iter()
            .map(|(p, role)| format!("{},role={role}", p.url()))
            .collect(),
        ..ServeArgs::default()
    }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn assert_idle(gw: &Gateway, pods: &[&RunningPod]) {
    wait_until("in-flight counters and slots back to zero", || {
        gw.shared().admission.slots.active() == 0
            && pods.iter().all(|p| {
                gw.in_flight(&p.url())
                    .is_none_or(|f| f == kvgate_core::InFlight::default())
            })
    })
    .await;
}

fn metric(gw: &Gateway, series: &str) -> f64 {
    gw.shared()
        .metrics_text()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn pod_metric(pod: &RunningPod, series: &str) -> f64 {
    reqwest::get(format!("{}/metrics", pod.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn source(s: &str) -> String {
    format!(
        "vllm:prompt_tokens_by_source_total{{engine=\"0\",model_name=\"{DEFAULT_MODEL}\",source=\"{s}\"}}"
    )
}

/// A prompt of ~400 cl100k tokens, distinct per `doc`.
fn prompt(doc: u32) -> String {
    (0..100).map(|i| format!("doc{doc} w{i} ")).collect()
}

/// One request through the gateway: (status, x-kvgate-pod, x-kvgate-prefill-pod, body).
async fn send(
    gw: &Gateway,
    chat: bool,
    stream: bool,
    doc: u32,
) -> (u16, String, Option<String>, String) {
    let (path, body) = if chat {
        (
            "/v1/chat/completions",
            json!({"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": prompt(doc)}],
                "max_tokens": 5, "stream": stream}),
        )
    } else {
        (
            "/v1/completions",
            json!({"model": DEFAULT_MODEL, "prompt": prompt(doc), "max_tokens": 5,
                "stream": stream}),
        )
    };
    let r = reqwest::Client::new()
        .post(format!("http://{}{path}", gw.traffic_addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
    let (pod, prefill) = (
        header("x-kvgate-pod").unwrap_or_default(),
        header("x-kvgate-prefill-pod"),
    );
    let status = r.status().as_u16();
    (status, pod, prefill, r.text().await.unwrap())
}

/// The generated text of a response (stream or not, completion or chat).
fn generated(body: &str, stream: bool) -> String {
    let pick = |v: &Value| {
        let c = &v["choices"][0];
        c["text"]
            .as_str()
            .or(c["message"]["content"].as_str())
            .or(c["delta"]["content"].as_str())
            .unwrap_or("")
            .to_string()
    };
    if !stream {
        return pick(&serde_json::from_str(body).unwrap());
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| pick(&serde_json::from_str(d).unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_chat_stream_and_not_are_prefilled_on_one_pod_and_decoded_on_another() {
    let p = mock_pod(Some(KvRole::Producer), Faults::default()).await;
    let d = mock_pod(Some(KvRole::Consumer), Faults::default()).await;
    let gw = Gateway::start(gateway_args(&[(&p, "prefill"), (&d, "decode")]))
        .await
        .unwrap();
    let mut doc = 0;
    for chat in [false, true] {
        for stream in [false, true] {
            doc += 1;
            let (status, pod, prefill, body) = send(&gw, chat, stream, doc).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(pod, d.url(), "decoded on the decode pod");
            assert_eq!(prefill.as_deref(), Some(p.url().as_str()));
            // Five tokens of the mock's text, whatever the stage split.
            assert_eq!(
                generated(&body, stream),
                " the quick brown fox jumps",
                "{body}"
            );
        }
    }
    assert_eq!(
        metric(
            &gw,
            "kvgate_pd_stage_total{stage=\"prefill\",outcome=\"ok\"}"
        ),
        4.0
    );
    assert_eq!(
        metric(
            &gw,
            "kvgate_pd_stage_total{stage=\"decode\",outcome=\"ok\"}"
        ),
        4.0
    );
    assert_eq!(
        metric(&gw, "kvgate_pd_requests_total{route=\"split\"}"),
        4.0
    );
    assert_eq!(metric(&gw, "kvgate_pd_prefill_ms_count"), 4.0);
    // The decode pod computed no prompt token: all came by transfer.
    assert_eq!(pod_metric(&d, &source("local_compute")).await, 0.0);
    assert!(pod_metric(&d, &source("external_kv_transfer")).await > 1000.0);
    assert!(pod_metric(&p, &source("local_compute")).await > 1000.0);
    // The prefill pod generated one token per request, the decode pod the other four of five
    // (it generates all five: vLLM's decode pod also samples the first token itself).
    assert_eq!(pod_metric(&p, "vllm:generation_tokens_total").await, 4.0);
    assert_eq!(pod_metric(&d, "vllm:generation_tokens_total").await, 20.0);
    // The decision explains both picks.
    let decisions = gw.shared().telemetry.decisions.snapshot();
    let last = serde_json::to_value(decisions.last().unwrap()).unwrap();
    assert_eq!(last["pod"], p.url());
    assert_eq!(last["decode"]["pod"], d.url());
    assert_idle(&gw, &[&p, &d]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_prefill_pod_is_survived_by_another_prefill_pod() {
    // One prefill pod hangs; the other answers. Round robin sends some first attempts to the
    // hung one; each is retried on the other after the first-byte timeout.
    let hung = mock_pod(
        Some(KvRole::Producer),
        Faults {
            hang: true,
            ..Faults::default()
        },
    )
    .await;
    let p = mock_pod(Some(KvRole::Producer), Faults::default()).await;
    let d = mock_pod(Some(KvRole::Consumer), Faults::default()).await;
    let mut args = gateway_args(&[(&hung, "prefill"), (&p, "prefill"), (&d, "decode")]);
    args.first_byte_timeout_ms = Some(300);
    args.policy = Some("round-robin".into());
    let gw = Gateway::start(args).await.unwrap();
    for doc in 0..3 {
        let (status, pod, prefill, body) = send(&gw, false, doc % 2 == 0, doc).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(pod, d.url());
        assert_eq!(prefill.as_deref(), Some(p.url().as_str()));
    }
    assert!(
        metric(
            &gw,
            "kvgate_pd_stage_total{stage=\"prefill\",outcome=\"failed\"}"
        ) >= 1.0
    );
    assert_eq!(
        metric(
            &gw,
            "kvgate_pd_stage_total{stage=\"prefill\",outcome=\"ok\"}"
        ),
        3.0
    );
    assert_eq!(pod_metric(&d, &source("local_compute")).await, 0.0);
    assert_idle(&gw, &[&p, &d]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_pod_without_a_kv_connector_is_skipped_and_with_no_prefill_pod_left_a_both_pod_serves_whole()
 {
    // The prefill pod has no connector (answers without kv_transfer_params); the `both` pod is
    // the only other prefill-capable pod: it serves requests whole.
    let p = mock_pod(None, Faults::default()).await;
    let d = mock_pod(Some(KvRole::Consumer), Faults::default()).await;
    let b = mock_pod(Some(KvRole::Both), Faults::default()).await;
    let mut args = gateway_args(&[(&p, "prefill"), (&d, "decode"), (&b, "both")]);
    args.policy = Some("round-robin".into());
    let gw = Gateway::start(args).await.unwrap();
    for doc in 0..4 {
        let (status, pod, prefill, body) = send(&gw, doc % 2 == 1, true, doc).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(pod, b.url(), "served whole on the both pod");
        assert_eq!(prefill, None);
    }
    assert!(
        metric(
            &gw,
            "kvgate_pd_stage_total{stage=\"prefill\",outcome=\"no_transfer_params\"}"
        ) >= 1.0
    );
    assert_eq!(pod_metric(&d, "vllm:generation_tokens_total").await, 0.0);
    assert_idle(&gw, &[&p, &d, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_pod_failing_before_its_first_byte_is_replaced_after_a_fresh_prefill() {
    // Two idle decode pods tie: the lower id (the hung one) is picked first.
    let hung = mock_pod(
        Some(KvRole::Consumer),
        Faults {
            hang: true,
            ..Faults::default()
        },
    )
    .await;
    let d = mock_pod(Some(KvRole::Consumer), Faults::default()).await;
    let p = mock_pod(Some(KvRole::Producer), Faults::default()).await;
    let mut args = gateway_args(&[(&hung, "decode"), (&d, "decode"), (&p, "prefill")]);
    args.first_byte_timeout_ms = Some(300);
    let gw = Gateway::start(args).await.unwrap();
    let (status, pod, prefill, body) = send(&gw, true, true, 1).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(pod, d.url());
    assert_eq!(prefill.as_deref(), Some(p.url().as_str()));
    assert_eq!(
        metric(
            &gw,
            "kvgate_pd_stage_total{stage=\"decode\",outcome=\"failed\"}"
        ),
        1.0
    );
    // Two prefills: the first one's blocks went to the decode pod that never answered.
    assert_eq!(
        metric(
            &gw,
            "kvgate_pd_stage_total{stage=\"prefill\",outcome=\"ok\"}"
        ),
        2.0
    );
    assert_eq!(pod_metric(&p, "vllm:generation_tokens_total").await, 2.0);
    assert_idle(&gw, &[&p, &d]).await;
}
