//! Overload is not an outage: a slow fleet with deep queues stays a fleet. Two mock pods
//! slowed 5× (`time_scale` 0.2) behind the gateway with a 3 s idle-chunk timeout, and 48
//! concurrent streams of ~4k-token prompts: streams wait in the pods' queues for far longer
//! than 3 s without a token, while the pods' engines step. Before `progress` (issue 38) 44 of
//! the 48 streams were cut and both pods went into their breaker's cooldown.

use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use serde_json::json;
use std::time::{Duration, Instant};

async fn slow_pods(n: u16) -> Vec<RunningPod> {
    let config = PodConfig {
        time_scale: 0.2,
        ..PodConfig::default()
    };
    kvgate_mock_pod::spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), n)
        .await
        .unwrap()
}

/// A prompt of about `tokens` cl100k tokens (one per 4-byte word), unique to `seed`, so that
/// every request pays its whole prefill.
fn prompt(seed: usize, tokens: usize) -> String {
    (0..tokens)
        .map(|i| format!(" w{:02x}", (seed * 7919 + i * 31) % 251))
        .collect()
}

/// The text of one streamed completion, to its end.
async fn stream(client: reqwest::Client, url: String, i: usize) -> (u16, String) {
    let body = json!({
        "model": DEFAULT_MODEL, "prompt": prompt(i, 4_000), "max_tokens": 8, "stream": true,
    });
    let mut resp = match client.post(&url).json(&body).send().await {
        Ok(r) => r,
        Err(e) => return (0, format!("send failed: {e}")),
    };
    let status = resp.status().as_u16();
    let mut text = String::new();
    loop {
        match resp.chunk().await {
            Ok(Some(b)) => text.push_str(&String::from_utf8_lossy(&b)),
            Ok(None) => break,
            Err(e) => {
                text.push_str(&format!("\n[body error: {e}]"));
                break;
            }
        }
    }
    (status, text)
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_queue_on_slow_pods_cuts_no_stream_and_trips_no_breaker() {
    let pods = slow_pods(2).await;
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods.iter().map(|p| p.url()).collect(),
        idle_chunk_timeout_ms: Some(3_000),
        first_byte_timeout_ms: Some(3_000),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let url = format!("http://{}/v1/completions", gw.traffic_addr);
    let client = reqwest::Client::new();
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..48)
        .map(|i| tokio::spawn(stream(client.clone(), url.clone(), i)))
        .collect();
    let mut results = Vec::with_capacity(tasks.len());
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let took = t0.elapsed();
    let m = gw.shared().metrics_text().unwrap();
    let mut cut = 0;
    for (i, (status, text)) in results.iter().enumerate() {
        let clean = *status == 200
            && text.ends_with("data: [DONE]\n\n")
            && !text.contains("\"error\"")
            && text.contains("\"finish_reason\":\"length\"");
        if !clean {
            cut += 1;
            eprintln!(
                "stream {i}: status {status}: {}",
                &text[text.len().saturating_sub(300)..]
            );
        }
    }
    let busy = metric(&m, "kvgate_busy_waits_total{kind=\"idle_chunk\"}");
    eprintln!("48 streams in {took:?}; cut {cut}; busy waits {busy}");
    assert_eq!(cut, 0, "every stream completes");
    // The load did what it was meant to: streams waited past the idle-chunk timeout for their
    // first token (else the test proves nothing).
    assert!(
        busy >= 1.0,
        "no stream waited past 3 s: the load is too light\n{m}"
    );
    assert_eq!(metric(&m, "kvgate_pod_cooldowns_total"), 0.0, "{m}");
    assert_eq!(
        metric(
            &m,
            "kvgate_rejected_requests_total{reason=\"no_healthy_pod\"}"
        ),
        0.0
    );
    assert_eq!(metric(&m, "kvgate_upstream_timeouts_total"), 0.0, "{m}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.shared().admission.slots.active() != 0 {
        assert!(Instant::now() < deadline, "slots back to zero");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
