//! Flow control end to end: the gateway in front of in-process mock pods (127.0.0.1, ephemeral
//! ports) under overload, with `[flow_control]` on and a per-pod in-flight cap so the fleet
//! saturates at a known point. High priority goes first, a tenant sending 10× does not starve
//! another, the TTL ends in a clear 503, sheddable and over-share requests get 429 with
//! `Retry-After`, and nothing accepted is lost.

use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A config file holding `flow` as the `[flow_control]` table.
fn flow_config(name: &str, flow: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-flow-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.toml");
    std::fs::write(&path, format!("[flow_control]\n{flow}\n")).unwrap();
    path
}

/// `pods` mock pods (real time) behind a gateway with `flow` as its flow control.
async fn fleet(name: &str, pods: usize, flow: &str) -> (Vec<RunningPod>, Gateway) {
    let pods = kvgate_mock_pod::spawn_pods(
        &PodConfig::default(),
        "127.0.0.1:0".parse().unwrap(),
        pods as u16,
    )
    .await
    .unwrap();
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods.iter().map(RunningPod::url).collect(),
        scrape_interval_ms: Some(20),
        config: Some(flow_config(name, flow)),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    wait_until("every pod healthy", || {
        pods.iter().all(|p| gw.pod_healthy(&p.url()) == Some(true))
    })
    .await;
    assert!(gw.shared().config().flow.enabled);
    (pods, gw)
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One answer: status, `Retry-After`, body text, when it ended (since `t0`).
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<String>,
    /// `x-kvgate-queue-ms`: the time in flow control's queue (absent: it did not wait).
    queue_ms: Option<f64>,
    body: String,
    done_ms: f64,
}

impl Answer {
    fn complete_stream(&self) -> bool {
        self.status == 200 && self.body.trim_end().ends_with("data: [DONE]")
    }

    fn error_code(&self) -> String {
        serde_json::from_str::<Value>(&self.body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

async fn chat(
    base: String,
    tenant: &'static str,
    priority: Option<i32>,
    max_tokens: u32,
    tag: String,
    t0: Instant,
) -> Answer {
    let content = format!("request {tag}: say something");
    chat_saying(base, tenant, priority, max_tokens, tag, content, t0).await
}

/// [`chat`] with the user message given.
async fn chat_saying(
    base: String,
    tenant: &'static str,
    priority: Option<i32>,
    max_tokens: u32,
    tag: String,
    content: String,
    t0: Instant,
) -> Answer {
    let client = reqwest::Client::new();
    let mut req = client
        .post(format!("{base}/v1/chat/completions"))
        .header("x-kvgate-tenant", tenant)
        .header("x-request-id", tag.as_str())
        .json(&json!({
            "model": DEFAULT_MODEL,
            "stream": true,
            "max_tokens": max_tokens,
            "ignore_eos": true,
            "messages": [{"role": "user", "content": content}],
        }));
    if let Some(p) = priority {
        req = req.header("x-kvgate-priority", p.to_string());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let queue_ms = resp
        .headers()
        .get("x-kvgate-queue-ms")
        .map(|v| v.to_str().unwrap().parse::<f64>().unwrap());
    let body = resp.text().await.unwrap();
    Answer {
        status,
        retry_after,
        queue_ms,
        body,
        done_ms: t0.elapsed().as_secs_f64() * 1e3,
    }
}

fn flow_queued(gw: &Gateway) -> usize {
    gw.shared().admission.flow.queued()
}

fn metric_sum(gw: &Gateway, prefix: &str) -> f64 {
    gw.shared()
        .metrics_text()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

async fn in_flight_back_to_zero(gw: &Gateway, pods: &[RunningPod]) {
    wait_until("in-flight counters back to zero", || {
        pods.iter().all(|p| {
            gw.in_flight(&p.url())
                .is_none_or(|f| f == kvgate_core::InFlight::default())
        })
    })
    .await;
}

/// Fills the fleet's in-flight cap with `n` long requests; returns their tasks.
async fn block(
    gw: &Gateway,
    pods: &[RunningPod],
    n: usize,
    max_tokens: u32,
    t0: Instant,
) -> Vec<tokio::task::JoinHandle<Answer>> {
    let base = format!("http://{}", gw.traffic_addr);
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            tokio::spawn(chat(
                base.clone(),
                "blocker",
                None,
                max_tokens,
                format!("blocker-{i}"),
                t0,
            ))
        })
        .collect();
    wait_until("the blockers in flight", || {
        pods.iter()
            .map(|p| gw.in_flight(&p.url()).map_or(0, |f| f.requests))
            .sum::<u32>()
            == n as u32
    })
    .await;
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_priority_is_served_before_low_priority_queued_earlier() {
    let (pods, gw) = fleet(
        "priority",
        1,
        "enabled = true\n[flow_control.saturation]\nmax_in_flight_per_pod = 2",
    )
    .await;
    let base = format!("http://{}", gw.traffic_addr);
    let t0 = Instant::now();
    let blockers = block(&gw, &pods, 2, 40, t0).await;
    let mut low = Vec::new();
    for i in 0..4 {
        low.push(tokio::spawn(chat(
            base.clone(),
            "batch",
            Some(0),
            20,
            format!("low-{i}"),
            t0,
        )));
        wait_until("the low one queued", || flow_queued(&gw) == i + 1).await;
    }
    let high = tokio::spawn(chat(base, "interactive", Some(10), 20, "high".into(), t0));
    wait_until("the high one queued", || flow_queued(&gw) == 5).await;
    let high = high.await.unwrap();
    assert!(high.complete_stream(), "{high:?}");
    let mut low_done = Vec::new();
    for t in low {
        let a = t.await.unwrap();
        assert!(a.complete_stream(), "{a:?}");
        low_done.push(a.done_ms);
    }
    for b in blockers {
        let b = b.await.unwrap();
        assert!(b.complete_stream());
        assert_eq!(b.queue_ms, None, "routed at once: no queue-time header");
    }
    // Two leave per release (the cap): the high one and the oldest low; the high one ends
    // before at least three of the four lows queued before it.
    let later = low_done.iter().filter(|&&d| d > high.done_ms).count();
    assert!(
        later >= 3,
        "high ended at {} ms, lows at {low_done:?}",
        high.done_ms
    );
    // /debug/decisions shows its class and its time in the queue.
    let decisions = gw.shared().telemetry.decisions.snapshot();
    let rec = decisions
        .iter()
        .find(|d| d.request_id == "high")
        .expect("the high request's decision");
    let flow = rec.flow.as_ref().expect("flow note");
    assert_eq!(
        (flow.priority, flow.band, flow.tenant.as_str()),
        (10, 10, "interactive")
    );
    assert!(flow.queue_ms > 10.0, "queued {} ms", flow.queue_ms);
    let json = serde_json::to_value(rec).unwrap();
    assert!(json["flow"]["queue_ms"].as_f64().unwrap() > 10.0);
    // ... and so does the response's `x-kvgate-queue-ms` header, the same figure.
    let header_ms = high
        .queue_ms
        .expect("x-kvgate-queue-ms on a queued request");
    assert!(
        (header_ms - flow.queue_ms).abs() < 0.11,
        "header {header_ms} ms, decision {} ms",
        flow.queue_ms
    );
    let blocker = decisions
        .iter()
        .find(|d| d.request_id == "blocker-0")
        .unwrap();
    assert_eq!(blocker.flow.as_ref().unwrap().queue_ms, 0.0);
    assert_eq!(
        metric_sum(
            &gw,
            r#"kvgate_flow_dispatched_total{band="10",tenant="interactive",path="queued"}"#
        ),
        1.0
    );
    assert_eq!(
        metric_sum(
            &gw,
            r#"kvgate_flow_queue_time_seconds_count{band="0",tenant="batch"}"#
        ),
        4.0
    );
    in_flight_back_to_zero(&gw, &pods).await;
    assert_eq!(flow_queued(&gw), 0);
}

/// Dispatch by headroom: a request released from the queue goes to a pod with room, even when
/// the pod holding its whole prefix is still full (the affinity gate alone would send it there,
/// to wait behind that pod's running work).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_request_goes_to_the_pod_with_room_not_to_its_full_sticky_pod() {
    let (pods, gw) = fleet(
        "headroom",
        2,
        "enabled = true\n[flow_control.saturation]\nmax_in_flight_per_pod = 1",
    )
    .await;
    let base = format!("http://{}", gw.traffic_addr);
    let t0 = Instant::now();
    let in_flight = |gw: &Gateway| -> Vec<u32> {
        pods.iter()
            .map(|p| gw.in_flight(&p.url()).map_or(0, |f| f.requests))
            .collect()
    };
    let context = "the shared context of this long conversation ".repeat(40);
    // A long request with the context fills one pod (X) ...
    let long = tokio::spawn(chat_saying(
        base.clone(),
        "a",
        None,
        400,
        "long".into(),
        context.clone(),
        t0,
    ));
    wait_until("the long one in flight", || {
        in_flight(&gw).iter().sum::<u32>() == 1
    })
    .await;
    // ... a short unrelated one the other (Y) ...
    let short = tokio::spawn(chat_saying(
        base.clone(),
        "b",
        None,
        30,
        "short".into(),
        "something unrelated".into(),
        t0,
    ));
    wait_until("both in flight", || in_flight(&gw).iter().sum::<u32>() == 2).await;
    assert_eq!(in_flight(&gw), vec![1, 1], "one request per pod");
    // ... so a request with the same context waits in kvgate's queue, and leaves when the
    // short one ends and Y has room, while X is still busy with the long one.
    let released = tokio::spawn(chat_saying(
        base,
        "c",
        None,
        5,
        "released".into(),
        context,
        t0,
    ));
    wait_until("the third one queued", || flow_queued(&gw) == 1).await;
    let released = released.await.unwrap();
    assert!(released.complete_stream(), "{released:?}");
    let short = short.await.unwrap();
    let long = long.await.unwrap();
    assert!(short.complete_stream() && long.complete_stream());
    assert!(
        released.done_ms < long.done_ms,
        "released {} ms, long {} ms",
        released.done_ms,
        long.done_ms
    );
    let decisions = gw.shared().telemetry.decisions.snapshot();
    let pod_of = |id: &str| {
        decisions
            .iter()
            .find(|d| d.request_id == id)
            .map(|d| d.decision.clone())
            .unwrap_or_else(|| panic!("no decision for {id}"))
    };
    let (x, y, r) = (pod_of("long"), pod_of("short"), pod_of("released"));
    assert_ne!(x.pod, y.pod);
    assert_eq!(r.pod, y.pod, "released to the pod with room: {r:?}");
    // It went there without its prefix: on Y it matched nothing.
    let on_y = r.pods.iter().find(|p| p.id == y.pod).expect("Y explained");
    assert_eq!(on_y.prefix_score, 0.0, "{r:?}");
    assert!(flow_queued(&gw) == 0);
    in_flight_back_to_zero(&gw, &pods).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sending_ten_times_more_does_not_starve_the_other() {
    let (pods, gw) = fleet(
        "fairness",
        1,
        "enabled = true\n[flow_control.saturation]\nmax_in_flight_per_pod = 2",
    )
    .await;
    let base = format!("http://{}", gw.traffic_addr);
    let t0 = Instant::now();
    let blockers = block(&gw, &pods, 2, 30, t0).await;
    let mut noisy = Vec::new();
    for i in 0..10 {
        noisy.push(tokio::spawn(chat(
            base.clone(),
            "noisy",
            None,
            10,
            format!("noisy-{i}"),
            t0,
        )));
    }
    wait_until("noisy queued", || flow_queued(&gw) == 10).await;
    let quiet = tokio::spawn(chat(base, "quiet", None, 10, "quiet".into(), t0));
    let quiet = quiet.await.unwrap();
    assert!(quiet.complete_stream(), "{quiet:?}");
    let mut noisy_done = Vec::new();
    for t in noisy {
        let a = t.await.unwrap();
        assert!(a.complete_stream(), "{a:?}");
        noisy_done.push(a.done_ms);
    }
    for b in blockers {
        b.await.unwrap();
    }
    // FIFO would serve quiet after all ten; least attained service serves it in the first
    // release after noisy's first one.
    let after = noisy_done.iter().filter(|&&d| d > quiet.done_ms).count();
    assert!(
        after >= 7,
        "quiet ended at {} ms, noisy at {noisy_done:?}",
        quiet.done_ms
    );
    in_flight_back_to_zero(&gw, &pods).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expiry_sheddable_and_over_share_requests_get_clear_errors_with_retry_after() {
    let (pods, gw) = fleet(
        "errors",
        1,
        "enabled = true\nqueue_ttl_ms = 300\nmax_queued_requests = 2\ntenant_max_share = 0.5\n\
         [flow_control.saturation]\nmax_in_flight_per_pod = 1",
    )
    .await;
    let base = format!("http://{}", gw.traffic_addr);
    let t0 = Instant::now();
    // The blocker runs for well over the TTL.
    let blocker = block(&gw, &pods, 1, 200, t0).await;
    let queued_at = Instant::now();
    let waiting = tokio::spawn(chat(base.clone(), "a", None, 5, "waits".into(), t0));
    wait_until("queued", || flow_queued(&gw) == 1).await;
    // Tenant "a" holds its share (1 of 2 places).
    let share = chat(base.clone(), "a", None, 5, "share".into(), t0).await;
    assert_eq!(
        (share.status, share.error_code().as_str()),
        (429, "flow_tenant_share")
    );
    assert_eq!(share.retry_after.as_deref(), Some("1"));
    // Sheddable: refused at once while saturated.
    let shed = chat(base.clone(), "b", Some(-1), 5, "shed".into(), t0).await;
    assert_eq!(
        (shed.status, shed.error_code().as_str()),
        (429, "flow_shed")
    );
    assert_eq!(shed.retry_after.as_deref(), Some("1"));
    let expired = waiting.await.unwrap();
    let waited = queued_at.elapsed();
    assert_eq!(
        (expired.status, expired.error_code().as_str()),
        (503, "flow_queue_ttl")
    );
    assert_eq!(expired.retry_after.as_deref(), Some("1"));
    assert!(expired.body.contains("flow queue"), "{}", expired.body);
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    for (reason, n) in [
        ("flow_queue_ttl", 1.0),
        ("flow_shed", 1.0),
        ("flow_tenant_share", 1.0),
    ] {
        assert_eq!(
            metric_sum(
                &gw,
                &format!("kvgate_rejected_requests_total{{reason=\"{reason}\"}}")
            ),
            n,
            "{reason}"
        );
    }
    assert_eq!(metric_sum(&gw, "kvgate_flow_shed_total{"), 3.0);
    for b in blocker {
        assert!(b.await.unwrap().complete_stream());
    }
    // The fleet free again: a sheddable request is served.
    let later = chat(base, "b", Some(-1), 5, "later".into(), t0).await;
    assert!(later.complete_stream(), "{later:?}");
    in_flight_back_to_zero(&gw, &pods).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_overload_every_request_is_served_or_answered_and_none_is_lost() {
    let (pods, gw) = fleet(
        "overload",
        2,
        "enabled = true\nmax_queued_requests = 12\ntenant_max_share = 1.0\n\
         [flow_control.saturation]\nmax_in_flight_per_pod = 2",
    )
    .await;
    let base = format!("http://{}", gw.traffic_addr);
    let t0 = Instant::now();
    let classes = [
        (Some(-1), "t1"),
        (None, "t1"),
        (Some(5), "t2"),
        (None, "t3"),
    ];
    let n = 40;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (p, t) = classes[i % classes.len()];
            tokio::spawn(chat(base.clone(), t, p, 8, format!("r{i}"), t0))
        })
        .collect();
    let mut served = 0;
    let mut refused = 0;
    for t in tasks {
        let a = t.await.unwrap();
        if a.complete_stream() {
            served += 1;
            continue;
        }
        let code = a.error_code();
        assert!(
            matches!(
                code.as_str(),
                "flow_shed" | "flow_queue_full" | "flow_evicted"
            ) && a.status == 429
                && a.retry_after.as_deref() == Some("1"),
            "{a:?}"
        );
        refused += 1;
    }
    assert_eq!(served + refused, n);
    assert!(served >= 12, "only {served} served");
    // Every request is in exactly one of the flow counters, and every one let through was
    // routed and completed.
    assert_eq!(
        metric_sum(&gw, "kvgate_flow_dispatched_total{") as usize,
        served
    );
    assert_eq!(metric_sum(&gw, "kvgate_flow_shed_total{") as usize, refused);
    assert_eq!(
        metric_sum(&gw, "kvgate_requests_total{") as usize,
        served,
        "routed requests"
    );
    assert_eq!(flow_queued(&gw), 0);
    in_flight_back_to_zero(&gw, &pods).await;
}
