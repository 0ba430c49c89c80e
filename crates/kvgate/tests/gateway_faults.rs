//! The gateway in front of mock pods that inject faults (`--fail-after`, `--hang`,
//! `--garbage-metrics`): clients get clean errors or are served elsewhere, counters return to
//! zero.

use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::api::Faults;
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use serde_json::json;
use std::time::{Duration, Instant};

async fn mock_pod(faults: Faults) -> RunningPod {
    let config = PodConfig {
        time_scale: 10.0,
        faults,
        ..PodConfig::default()
    };
    kvgate_mock_pod::spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 1)
        .await
        .unwrap()
        .remove(0)
}

fn gateway_args(pods: &[&RunningPod]) -> ServeArgs {
    ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods.iter().map(|p| p.url()).collect(),
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

fn completion(stream: bool) -> serde_json::Value {
    json!({"model": DEFAULT_MODEL, "prompt": "Hello there", "max_tokens": 6, "stream": stream})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_cut_mid_stream_gives_the_client_a_clean_error_event() {
    let pod = mock_pod(Faults {
        fail_after_tokens: Some(3),
        ..Faults::default()
    })
    .await;
    let gw = Gateway::start(gateway_args(&[&pod])).await.unwrap();
    let text = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", gw.traffic_addr))
        .json(&completion(true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .expect("the client's stream ends cleanly");
    assert!(
        text.contains("\"code\":\"upstream_stream_error\""),
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_pod_is_skipped_after_the_first_byte_timeout() {
    let hung = mock_pod(Faults {
        hang: true,
        ..Faults::default()
    })
    .await;
    let ok = mock_pod(Faults::default()).await;
    let mut args = gateway_args(&[&hung, &ok]);
    args.first_byte_timeout_ms = Some(300);
    args.policy = Some("round-robin".into());
    let gw = Gateway::start(args).await.unwrap();
    let c = reqwest::Client::new();
    for _ in 0..3 {
        let r = c
            .post(format!("http://{}/v1/completions", gw.traffic_addr))
            .json(&completion(false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_idle(&gw, &[&hung, &ok]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_garbage_metrics_is_still_served_and_the_lines_are_counted() {
    let pod = mock_pod(Faults {
        garbage_metrics: true,
        ..Faults::default()
    })
    .await;
    let gw = Gateway::start(gateway_args(&[&pod])).await.unwrap();
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", gw.traffic_addr))
        .json(&completion(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let m = gw.shared().metrics_text().unwrap();
    let skipped: f64 = m
        .lines()
        .filter(|l| l.starts_with("kvgate_scrape_skipped_lines_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(skipped > 0.0, "{m}");
    assert_idle(&gw, &[&pod]).await;
}

/// Streams to `gw` until one ends; true when it ended with the gateway's upstream error event.
async fn stream_died(c: &reqwest::Client, gw: &Gateway) -> bool {
    let text = c
        .post(format!("http://{}/v1/completions", gw.traffic_addr))
        .json(&completion(true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .expect("the client's stream ends cleanly");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    text.contains("\"code\":\"upstream_stream_error\"")
}

fn metric_sum(gw: &Gateway, prefix: &str) -> f64 {
    gw.shared()
        .metrics_text()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_streams_keep_dying_is_avoided_for_the_cooldown_while_its_metrics_answer() {
    let bad = mock_pod(Faults {
        fail_after_tokens: Some(2),
        ..Faults::default()
    })
    .await;
    let good = mock_pod(Faults::default()).await;
    let mut args = gateway_args(&[&bad, &good]);
    args.policy = Some("round-robin".into());
    args.pod_failure_threshold = Some(2);
    args.pod_failure_cooldown_ms = Some(1500);
    let gw = Gateway::start(args).await.unwrap();
    let c = reqwest::Client::new();
    // Round robin alternates: two of four streams go to the bad pod and die; the second trips it.
    let mut died = 0;
    for _ in 0..4 {
        died += u32::from(stream_died(&c, &gw).await);
    }
    assert_eq!(died, 2);
    assert_eq!(gw.pod_healthy(&bad.url()), Some(false));
    let cooled = format!("kvgate_pod_cooldowns_total{{pod=\"{}\"}}", bad.url());
    assert_eq!(metric_sum(&gw, &cooled), 1.0);
    // Its /metrics still answers, and the gateway still scrapes it without error.
    let metrics = c
        .get(format!("{}/metrics", bad.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);
    assert_eq!(metric_sum(&gw, "kvgate_scrape_errors_total{"), 0.0);
    // While cooling down, every stream goes to the good pod.
    for _ in 0..4 {
        assert!(!stream_died(&c, &gw).await);
    }
    // After the cooldown the pod is tried again; one more failure sends it back at once.
    wait_until("the cooldown ends", || {
        gw.pod_healthy(&bad.url()) == Some(true)
    })
    .await;
    let mut died = 0;
    for _ in 0..2 {
        died += u32::from(stream_died(&c, &gw).await);
    }
    assert_eq!(died, 1);
    assert_eq!(gw.pod_healthy(&bad.url()), Some(false));
    assert_eq!(metric_sum(&gw, &cooled), 2.0);
    assert_idle(&gw, &[&bad, &good]).await;
}
