//! Overload is not an outage: a busy pod is waited for, a hung one is still caught, the
//! breaker never empties the fleet, and retries cannot multiply an overload.

mod common;
use common::*;

fn metric(gw: &kvgate_gateway::Gateway, prefix: &str) -> f64 {
    let text = gw.shared().metrics_text().unwrap();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_busy_pod_sending_no_headers_past_the_first_byte_timeout_is_waited_for() {
    // A whole-body answer after 800 ms; the first-byte timeout is 300 ms. The engine steps.
    let pod = FakePod::start(Behavior::Normal {
        chunks: 4,
        delay_ms: 200,
    })
    .await;
    let _busy = pod.keep_stepping();
    let mut a = args(&[&pod]);
    a.first_byte_timeout_ms = Some(300);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("a", false)),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::OK, "{}", r.text());
    assert_eq!(pod.requests(), 1, "not retried");
    assert!(metric(&gw, "kvgate_busy_waits_total{kind=\"first_byte\"}") >= 1.0);
    assert_eq!(metric(&gw, "kvgate_upstream_timeouts_total"), 0.0);
    assert_eq!(gw.pod_healthy(&pod.url), Some(true));
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn a_stream_queued_past_the_idle_chunk_timeout_on_a_busy_pod_completes() {
    let pod = FakePod::start(Behavior::Queued {
        wait_ms: 900,
        chunks: 3,
    })
    .await;
    let _busy = pod.keep_stepping();
    let mut a = args(&[&pod]);
    a.idle_chunk_timeout_ms = Some(300);
    a.pod_failure_threshold = Some(1);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let c = client();
    for i in 0..2 {
        let r = send(
            &c,
            post(
                &gw,
                "/v1/chat/completions",
                &chat_body(&format!("q{i}"), true),
            ),
        )
        .await;
        let text = r.text();
        assert!(!text.contains("\"error\""), "{text}");
        assert!(text.contains("tok2"), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    }
    assert!(metric(&gw, "kvgate_busy_waits_total{kind=\"idle_chunk\"}") >= 2.0);
    assert_eq!(metric(&gw, "kvgate_pod_cooldowns_total"), 0.0);
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn a_stream_preempted_after_its_first_token_on_a_busy_pod_completes() {
    // vLLM preempts a running request when its KV blocks are needed: the stream falls silent
    // between two tokens while the engine steps others (CI cut 3 of 37 so on real pods).
    let pod = FakePod::start(Behavior::Preempted {
        wait_ms: 900,
        chunks: 3,
    })
    .await;
    let _busy = pod.keep_stepping();
    let mut a = args(&[&pod]);
    a.idle_chunk_timeout_ms = Some(300);
    a.pod_failure_threshold = Some(1);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("p", true)),
    )
    .await;
    let text = r.text();
    assert!(!text.contains("\"error\""), "{text}");
    assert!(text.contains("tok0") && text.contains("tok2"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(metric(&gw, "kvgate_busy_waits_total{kind=\"idle_chunk\"}") >= 1.0);
    assert_eq!(metric(&gw, "kvgate_upstream_timeouts_total"), 0.0);
    assert_eq!(metric(&gw, "kvgate_pod_cooldowns_total"), 0.0);
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn a_stream_stalled_after_its_first_token_on_a_pod_standing_still_is_cut() {
    let pod = FakePod::start(Behavior::Preempted {
        wait_ms: 5_000,
        chunks: 3,
    })
    .await;
    let mut a = args(&[&pod]);
    a.idle_chunk_timeout_ms = Some(300);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let t0 = std::time::Instant::now();
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("s", true)),
    )
    .await;
    let text = r.text();
    assert!(text.contains("tok0"), "{text}");
    assert!(
        text.contains("\"code\":\"upstream_stream_error\""),
        "{text}"
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(4),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(
        metric(&gw, "kvgate_upstream_timeouts_total{kind=\"idle_chunk\"}"),
        1.0
    );
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn a_stream_queued_on_a_pod_whose_engine_stands_still_is_cut_as_before() {
    let pod = FakePod::start(Behavior::Queued {
        wait_ms: 5_000,
        chunks: 3,
    })
    .await;
    let mut a = args(&[&pod]);
    a.idle_chunk_timeout_ms = Some(300);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let t0 = std::time::Instant::now();
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("q", true)),
    )
    .await;
    let text = r.text();
    assert!(
        text.contains("\"code\":\"upstream_stream_error\""),
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(
        metric(&gw, "kvgate_upstream_timeouts_total{kind=\"idle_chunk\"}"),
        1.0
    );
    assert_eq!(metric(&gw, "kvgate_busy_waits_total"), 0.0);
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn a_hung_pod_whose_metrics_answer_with_counters_standing_still_is_still_caught() {
    let hung = FakePod::start(Behavior::Hang).await;
    hung.state
        .engine_tokens
        .store(1234, std::sync::atomic::Ordering::SeqCst);
    let ok = FakePod::start(Behavior::Normal {
        chunks: 3,
        delay_ms: 1,
    })
    .await;
    let mut a = args(&[&hung, &ok]);
    a.first_byte_timeout_ms = Some(200);
    a.policy = Some("round-robin".into());
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let c = client();
    for i in 0..4 {
        let r = send(
            &c,
            post(
                &gw,
                "/v1/chat/completions",
                &chat_body(&format!("q{i}"), false),
            ),
        )
        .await;
        assert_eq!(r.status, http::StatusCode::OK);
    }
    assert!(hung.requests() >= 1);
    assert!(metric(&gw, "kvgate_upstream_timeouts_total{kind=\"first_byte\"}") >= 1.0);
    assert_eq!(metric(&gw, "kvgate_busy_waits_total"), 0.0);
    assert_idle(&gw, &[&hung, &ok]).await;
}

#[tokio::test]
async fn the_breaker_avoids_at_most_half_the_fleet_and_a_lone_avoided_pod_is_routed_in_panic_mode()
{
    // Both pods' streams die mid-body; one failure opens a breaker.
    let die = Behavior::DieAfter {
        chunks: 1,
        delay_ms: 1,
    };
    let (p1, p2) = (FakePod::start(die).await, FakePod::start(die).await);
    let mut a = args(&[&p1, &p2]);
    a.pod_failure_threshold = Some(1);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let c = client();
    for i in 0..6 {
        let r = send(
            &c,
            post(
                &gw,
                "/v1/chat/completions",
                &chat_body(&format!("q{i}"), true),
            ),
        )
        .await;
        assert_eq!(r.status, http::StatusCode::OK, "request {i}: never 503");
    }
    assert_eq!(
        metric(&gw, "kvgate_pod_cooldowns_total"),
        1.0,
        "one of two pods"
    );
    assert!(metric(&gw, "kvgate_pod_cooldowns_withheld_total") >= 1.0);
    assert_eq!(metric(&gw, "kvgate_panic_routes_total"), 0.0);
    assert_idle(&gw, &[&p1, &p2]).await;

    // A fleet of one: its breaker may open, and the pod is still routed to (panic mode).
    let lone = FakePod::start(die).await;
    let mut a = args(&[&lone]);
    a.pod_failure_threshold = Some(1);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    for i in 0..3 {
        let r = send(
            &c,
            post(
                &gw,
                "/v1/chat/completions",
                &chat_body(&format!("l{i}"), true),
            ),
        )
        .await;
        assert_eq!(r.status, http::StatusCode::OK, "request {i}: never 503");
    }
    // Each failure in panic mode opens the breaker again (half-open).
    assert!(metric(&gw, "kvgate_pod_cooldowns_total") >= 1.0);
    assert_eq!(gw.pod_healthy(&lone.url), Some(false), "in its cooldown");
    assert!(metric(&gw, "kvgate_panic_routes_total") >= 2.0);
    assert_eq!(
        metric(
            &gw,
            "kvgate_rejected_requests_total{reason=\"no_healthy_pod\"}"
        ),
        0.0
    );
    assert_eq!(lone.requests(), 3);
    assert_idle(&gw, &[&lone]).await;
}

#[tokio::test]
async fn retries_in_flight_stay_within_a_fifth_of_the_requests_in_flight() {
    // Every attempt fails with a 500 after 300 ms, so 20 concurrent requests all fail at once
    // and all want a retry: at most max(3, 20 × 20 %) = 4 may be in flight.
    let slow500 = Behavior::Fail500After { delay_ms: 300 };
    let (p1, p2) = (FakePod::start(slow500).await, FakePod::start(slow500).await);
    let gw = kvgate_gateway::Gateway::start(args(&[&p1, &p2]))
        .await
        .unwrap();
    let c = client();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let req = post(
                &gw,
                "/v1/chat/completions",
                &chat_body(&format!("q{i}"), false),
            );
            let c = c.clone();
            tokio::spawn(async move { send(&c, req).await })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, http::StatusCode::BAD_GATEWAY);
    }
    let (retries, refused) = (
        metric(&gw, "kvgate_retries_total"),
        metric(&gw, "kvgate_retries_refused_total"),
    );
    eprintln!("retries {retries}, refused {refused}");
    assert!(refused >= 12.0, "retries {retries}, refused {refused}");
    assert!(retries >= 3.0);
    // Without the budget each request would have made max_retries (2) retries: 40.
    assert!(retries <= 12.0, "retries {retries}");
    assert_idle(&gw, &[&p1, &p2]).await;
}

#[tokio::test]
async fn requests_on_a_pod_that_dies_are_all_retried_whatever_the_budget() {
    // Many whole-body requests wait on a busy pod, which then dies: every one of them lost its
    // connection at once. Their retries need no budget (the dead pod holds no work for them),
    // so none is lost; with the budget (max(3, 20 % of 20) = 4) most would get 502.
    let busy = FakePod::start(Behavior::Hang).await;
    let _stepping = busy.keep_stepping();
    let live = FakePod::start(Behavior::Normal {
        chunks: 5,
        delay_ms: 100,
    })
    .await;
    let gw = kvgate_gateway::Gateway::start(args(&[&busy, &live]))
        .await
        .unwrap();
    let c = client();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let req = post(
                &gw,
                "/v1/chat/completions",
                &chat_body(&format!("question {i}"), false),
            );
            let c = c.clone();
            tokio::spawn(async move { send(&c, req).await })
        })
        .collect();
    eventually("all 20 requests reached a pod", || {
        busy.requests() + live.requests() >= 20
    })
    .await;
    let on_busy = busy.requests();
    assert!(
        on_busy >= 5,
        "only {on_busy} requests waited on the busy pod"
    );
    busy.kill();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, http::StatusCode::OK, "{}", r.text());
    }
    let (retries, refused) = (
        metric(&gw, "kvgate_retries_total"),
        metric(&gw, "kvgate_retries_refused_total"),
    );
    assert_eq!(refused, 0.0);
    assert!(
        retries >= f64::from(on_busy),
        "{retries} retries, {on_busy} lost"
    );
    assert_idle(&gw, &[&live]).await;
}

#[tokio::test]
async fn a_stream_queued_on_a_busy_pod_whose_metrics_answer_past_the_scrape_timeout_completes() {
    // The pod's /metrics takes 1.5 s, past the 1 s scrape timeout, as a busy CPU pod's API
    // server may: no scrape is timely, but the late answers' moving counters still show a busy
    // engine, so the stream queued 4 s (past the 1 s idle-chunk timeout and its 2 s window)
    // is waited for.
    let pod = FakePod::start(Behavior::Queued {
        wait_ms: 4_000,
        chunks: 3,
    })
    .await;
    let _busy = pod.keep_stepping();
    let mut a = args(&[&pod]);
    a.idle_chunk_timeout_ms = Some(1_000);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    pod.state
        .metrics_delay_ms
        .store(1_500, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(std::time::Duration::from_millis(3_000)).await;
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("q", true)),
    )
    .await;
    let text = r.text();
    assert!(!text.contains("\"error\""), "{text}");
    assert!(text.contains("tok2"), "{text}");
    assert!(metric(&gw, "kvgate_busy_waits_total{kind=\"idle_chunk\"}") >= 1.0);
    assert_eq!(
        metric(&gw, "kvgate_upstream_timeouts_total{kind=\"idle_chunk\"}"),
        0.0
    );
    assert_idle(&gw, &[&pod]).await;
}
