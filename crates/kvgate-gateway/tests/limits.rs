//! Limits and security of the traffic listener, end to end (real sockets on 127.0.0.1).

mod common;

use common::*;

const SLOW: Behavior = Behavior::Normal {
    chunks: 5,
    delay_ms: 100,
};

#[tokio::test]
async fn beyond_the_concurrency_limit_and_queue_requests_get_429_with_retry_after() {
    let pod = FakePod::start(SLOW).await;
    let mut a = args(&[&pod]);
    a.max_concurrent_requests = Some(1);
    a.max_waiting_requests = Some(0);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let c = client();
    let first = tokio::spawn({
        let (c, req) = (
            c.clone(),
            post(&gw, "/v1/chat/completions", &chat_body("a", true)),
        );
        async move { send(&c, req).await }
    });
    let shared = gw.shared().clone();
    eventually("the first request holds the slot", || {
        shared.admission.slots.active() == 1
    })
    .await;
    let second = send(&c, post(&gw, "/v1/chat/completions", &chat_body("b", true))).await;
    assert_eq!(second.status, http::StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(second.header("retry-after").as_deref(), Some("1"));
    let err = second.json();
    assert_eq!(err["error"]["code"], "too_many_requests");
    assert_eq!(err["error"]["type"], "rate_limit_error");
    let first = first.await.unwrap();
    assert_eq!(first.status, http::StatusCode::OK);
    assert!(
        first.text().ends_with("data: [DONE]\n\n"),
        "{}",
        first.text()
    );
    eventually("slots and queue back to zero", || {
        shared.admission.slots.active() == 0 && shared.admission.slots.queued() == 0
    })
    .await;
    assert_idle(&gw, &[&pod]).await;
    assert_eq!(pod.requests(), 1);
    let m = shared.metrics_text().unwrap();
    assert!(
        m.contains("kvgate_rejected_requests_total{reason=\"too_many_requests\"} 1"),
        "{m}"
    );
    assert!(m.contains("kvgate_active_requests 0"), "{m}");
}

fn get_with_key(
    gw: &kvgate_gateway::Gateway,
    path: &str,
    key: Option<&str>,
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut b = http::Request::get(format!("http://{}{path}", gw.traffic_addr));
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    b.body(Default::default()).unwrap()
}

#[tokio::test]
async fn api_keys_are_required_on_v1_and_authorization_is_not_forwarded_by_default() {
    let pod = FakePod::start(SLOW).await;
    let mut a = args(&[&pod]);
    a.api_key = vec!["k1".into(), "k2".into()];
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let c = client();
    for key in [None, Some("wrong"), Some("k1x"), Some("")] {
        let r = send(&c, get_with_key(&gw, "/v1/embeddings", key)).await;
        assert_eq!(r.status, http::StatusCode::UNAUTHORIZED, "key {key:?}");
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
        assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer"));
    }
    let r = send(
        &c,
        post(&gw, "/v1/chat/completions", &chat_body("a", false)),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::UNAUTHORIZED);
    assert_eq!(pod.requests(), 0, "a rejected request touches no pod");
    let r = send(&c, get_with_key(&gw, "/v1/embeddings", Some("k2"))).await;
    assert_eq!(r.status, http::StatusCode::OK);
    assert_eq!(r.json()["authorization"], false);
    let m = gw.shared().metrics_text().unwrap();
    assert!(
        m.contains("kvgate_rejected_requests_total{reason=\"invalid_api_key\"} 5"),
        "{m}"
    );
}

#[tokio::test]
async fn authorization_is_forwarded_with_forward_authorization() {
    let pod = FakePod::start(SLOW).await;
    let mut a = args(&[&pod]);
    a.api_key = vec!["k1".into()];
    a.forward_authorization = true;
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let r = send(&client(), get_with_key(&gw, "/v1/embeddings", Some("k1"))).await;
    assert_eq!(r.status, http::StatusCode::OK);
    assert_eq!(r.json()["authorization"], true);
}

#[tokio::test]
async fn without_api_keys_the_listener_is_open() {
    let pod = FakePod::start(SLOW).await;
    let gw = gateway(&[&pod]).await;
    let r = send(
        &client(),
        get_with_key(&gw, "/v1/embeddings", Some("anything")),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::OK);
    assert_eq!(r.json()["authorization"], false);
}

#[tokio::test]
async fn shutdown_turns_readiness_false_lets_streams_finish_then_refuses_connections() {
    let pod = FakePod::start(SLOW).await;
    let gw = gateway(&[&pod]).await;
    let c = client();
    let (traffic, admin) = (gw.traffic_addr, gw.admin_addr);
    let stream = tokio::spawn({
        let (c, req) = (
            c.clone(),
            post(&gw, "/v1/chat/completions", &chat_body("a", true)),
        );
        async move { send(&c, req).await }
    });
    let shared = gw.shared().clone();
    eventually("the stream is in flight", || {
        shared.admission.slots.active() == 1
    })
    .await;
    let shutdown = tokio::spawn(gw.shutdown(std::time::Duration::from_secs(5)));
    let readyz = http::Request::get(format!("http://{admin}/readyz"))
        .body(Default::default())
        .unwrap();
    let r = send(&client(), readyz).await;
    assert_eq!(r.status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.text(), "not ready: shutting down\n");
    let stream = stream.await.unwrap();
    assert_eq!(stream.status, http::StatusCode::OK);
    assert!(
        stream.text().ends_with("data: [DONE]\n\n"),
        "{}",
        stream.text()
    );
    tokio::time::timeout(std::time::Duration::from_secs(5), shutdown)
        .await
        .expect("shutdown ends once the stream is done")
        .unwrap();
    assert!(tokio::net::TcpStream::connect(traffic).await.is_err());
}

#[tokio::test]
async fn a_pod_sending_no_response_in_time_gives_502_and_counters_return_to_zero() {
    let pod = FakePod::start(Behavior::Hang).await;
    let mut a = args(&[&pod]);
    a.first_byte_timeout_ms = Some(200);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let t0 = std::time::Instant::now();
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("a", true)),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::BAD_GATEWAY);
    assert!(t0.elapsed() < std::time::Duration::from_secs(3));
    let err = r.json();
    assert_eq!(err["error"]["code"], "upstream_failed");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no response within 200 ms"),
        "{err}"
    );
    assert_idle(&gw, &[&pod]).await;
    let m = gw.shared().metrics_text().unwrap();
    assert!(
        m.contains("kvgate_upstream_timeouts_total{kind=\"first_byte\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn a_hung_pod_is_retried_on_another_before_any_byte() {
    // Non-stream: the pod answers when done, so its whole generation must fit the timeout.
    let (hung, ok, gw) = hung_and_ok(200).await;
    let c = client();
    for i in 0..2 {
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
    assert!(hung.requests() >= 1, "the hung pod was tried");
    assert_idle(&gw, &[&hung, &ok]).await;
}

#[tokio::test]
async fn a_pod_that_never_answers_goes_into_the_failure_cooldown_after_three_timeouts() {
    let (hung, ok, gw) = hung_and_ok(200).await;
    let c = client();
    let t0 = std::time::Instant::now();
    for i in 0..10 {
        let r = send(
            &c,
            post(
                &gw,
                "/v1/chat/completions",
                &chat_body(&format!("q{i}"), false),
            ),
        )
        .await;
        assert_eq!(r.status, http::StatusCode::OK, "request {i}");
    }
    // The third first-byte timeout in a row opened the breaker (default threshold 3): the
    // hung pod was tried three times, not five, and the ten requests waited 3 × 200 ms.
    assert_eq!(hung.requests(), 3);
    assert!(
        t0.elapsed() < std::time::Duration::from_millis(1_500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(gw.pod_healthy(&hung.url), Some(false), "in its cooldown");
    let m = gw.shared().metrics_text().unwrap();
    assert!(
        m.lines()
            .any(|l| l.starts_with("kvgate_pod_cooldowns_total{")
                && l.contains(&hung.url)
                && l.ends_with(" 1")),
        "{m}"
    );
    assert_idle(&gw, &[&hung, &ok]).await;
}

#[tokio::test]
async fn a_pod_stalling_mid_stream_gives_a_clean_error_event_and_counters_return_to_zero() {
    let pod = FakePod::start(Behavior::HangAfter {
        chunks: 2,
        delay_ms: 10,
    })
    .await;
    let mut a = args(&[&pod]);
    a.idle_chunk_timeout_ms = Some(300);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("a", true)),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::OK);
    let text = r.text();
    assert!(text.contains("tok1 "), "{text}");
    assert!(
        text.contains("\"code\":\"upstream_stream_error\""),
        "{text}"
    );
    assert!(text.contains("the pod sent nothing for 300 ms"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_idle(&gw, &[&pod]).await;
    let shared = gw.shared().clone();
    eventually("slot given back", || shared.admission.slots.active() == 0).await;
    eventually("the upstream stream is cancelled", || {
        pod.state
            .active_streams
            .load(std::sync::atomic::Ordering::SeqCst)
            == 0
    })
    .await;
    let m = shared.metrics_text().unwrap();
    assert!(
        m.contains("kvgate_upstream_timeouts_total{kind=\"idle_chunk\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn a_request_within_the_queue_waits_for_a_slot_and_is_served() {
    let pod = FakePod::start(SLOW).await;
    let mut a = args(&[&pod]);
    a.max_concurrent_requests = Some(1);
    a.max_waiting_requests = Some(1);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let c = client();
    let shared = gw.shared().clone();
    let spawn_stream = |text: &str| {
        let (c, req) = (
            c.clone(),
            post(&gw, "/v1/chat/completions", &chat_body(text, true)),
        );
        tokio::spawn(async move { send(&c, req).await })
    };
    let first = spawn_stream("a");
    eventually("the first holds the slot", || {
        shared.admission.slots.active() == 1
    })
    .await;
    let second = spawn_stream("b");
    eventually("the second waits", || shared.admission.slots.queued() == 1).await;
    let third = send(&c, post(&gw, "/v1/chat/completions", &chat_body("c", true))).await;
    assert_eq!(third.status, http::StatusCode::TOO_MANY_REQUESTS);
    for r in [first.await.unwrap(), second.await.unwrap()] {
        assert_eq!(r.status, http::StatusCode::OK);
        assert!(r.text().ends_with("data: [DONE]\n\n"), "{}", r.text());
    }
    assert_eq!(pod.requests(), 2);
    eventually("slots and queue back to zero", || {
        shared.admission.slots.active() == 0 && shared.admission.slots.queued() == 0
    })
    .await;
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn a_prompt_over_the_limit_gets_400_and_touches_no_pod() {
    let pod = FakePod::start(SLOW).await;
    let mut a = args(&[&pod]);
    a.max_prompt_tokens = Some(10);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let long = "word ".repeat(200);
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body(&long, false)),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(pod.requests(), 0);
}

#[tokio::test]
async fn oversized_request_headers_get_431() {
    let pod = FakePod::start(SLOW).await;
    let gw = gateway(&[&pod]).await;
    let mut req = post(&gw, "/v1/chat/completions", &chat_body("a", false));
    req.headers_mut().insert(
        "x-padding",
        http::HeaderValue::from_str(&"a".repeat(1 << 20)).unwrap(),
    );
    let r = client().request(req).await.unwrap();
    assert_eq!(
        r.status(),
        http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    assert_eq!(pod.requests(), 0);
}

#[tokio::test]
async fn the_request_timeout_ends_a_long_stream_with_a_clean_error_event() {
    // 40 chunks 50 ms apart: about 2 s of stream, cut at 400 ms.
    let pod = FakePod::start(Behavior::Normal {
        chunks: 40,
        delay_ms: 50,
    })
    .await;
    let mut a = args(&[&pod]);
    a.request_timeout_ms = Some(400);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let t0 = std::time::Instant::now();
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("a", true)),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::OK);
    assert!(t0.elapsed() < std::time::Duration::from_millis(1500));
    let text = r.text();
    assert!(text.contains("tok1 "), "{text}");
    assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_idle(&gw, &[&pod]).await;
    let shared = gw.shared().clone();
    eventually("the upstream stream is cancelled", || {
        pod.state
            .active_streams
            .load(std::sync::atomic::Ordering::SeqCst)
            == 0
    })
    .await;
    let m = shared.metrics_text().unwrap();
    assert!(
        m.contains("kvgate_upstream_timeouts_total{kind=\"request\"} 1"),
        "{m}"
    );
    assert!(m.contains("status=\"request_timeout\"} 1"), "{m}");
    // The gateway's own timeout is not the pod's failure.
    assert_eq!(gw.pod_healthy(&pod.url), Some(true));
}

#[tokio::test]
async fn the_request_timeout_before_any_response_gives_504_without_retry() {
    let hung = FakePod::start(Behavior::Hang).await;
    let other = FakePod::start(Behavior::Hang).await;
    let mut a = args(&[&hung, &other]);
    a.request_timeout_ms = Some(300);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let t0 = std::time::Instant::now();
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("a", false)),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::GATEWAY_TIMEOUT);
    assert!(t0.elapsed() < std::time::Duration::from_secs(2));
    assert_eq!(r.json()["error"]["code"], "request_timeout");
    assert_eq!(hung.requests() + other.requests(), 1, "not retried");
    assert_idle(&gw, &[&hung, &other]).await;
    let m = gw.shared().metrics_text().unwrap();
    assert!(
        m.contains("kvgate_rejected_requests_total{reason=\"request_timeout\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn the_drain_keeps_serving_with_readiness_false_then_the_listener_closes() {
    let pod = FakePod::start(Behavior::Normal {
        chunks: 2,
        delay_ms: 1,
    })
    .await;
    let gw = gateway(&[&pod]).await;
    let (traffic, admin) = (gw.traffic_addr, gw.admin_addr);
    let drain = std::time::Duration::from_millis(800);
    let t0 = std::time::Instant::now();
    let shutdown = tokio::spawn(gw.drain_and_shutdown(
        drain,
        std::time::Duration::from_secs(5),
        std::future::pending(),
    ));
    let readyz = || {
        http::Request::get(format!("http://{admin}/readyz"))
            .body(Default::default())
            .unwrap()
    };
    let mut ready = http::StatusCode::OK;
    for _ in 0..100 {
        ready = send(&client(), readyz()).await.status;
        if ready == http::StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(ready, http::StatusCode::SERVICE_UNAVAILABLE);
    // Within the drain, a new connection is still accepted and served.
    let req = http::Request::post(format!("http://{traffic}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(chat_body(
            "during drain",
            false,
        ))))
        .unwrap();
    let r = send(&client(), req).await;
    assert_eq!(r.status, http::StatusCode::OK);
    assert!(t0.elapsed() < drain, "served within the drain");
    tokio::time::timeout(std::time::Duration::from_secs(5), shutdown)
        .await
        .expect("shutdown ends after the drain")
        .unwrap();
    assert!(
        t0.elapsed() >= drain,
        "the listener stayed open for the drain"
    );
    assert!(tokio::net::TcpStream::connect(traffic).await.is_err());
}

#[tokio::test]
async fn a_second_signal_cuts_the_drain_short() {
    let pod = FakePod::start(Behavior::Normal {
        chunks: 2,
        delay_ms: 1,
    })
    .await;
    let gw = gateway(&[&pod]).await;
    let traffic = gw.traffic_addr;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let t0 = std::time::Instant::now();
    let shutdown = tokio::spawn(gw.drain_and_shutdown(
        std::time::Duration::from_secs(30),
        std::time::Duration::from_secs(5),
        async move {
            let _ = rx.await;
        },
    ));
    tx.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), shutdown)
        .await
        .expect("the skipped drain does not wait 30 s")
        .unwrap();
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    assert!(tokio::net::TcpStream::connect(traffic).await.is_err());
}

/// A client that sends the head of a `POST /v1/chat/completions` claiming `claimed` body bytes,
/// then `sent` of them, then nothing (the connection stays open until dropped).
async fn trickling_client(
    gw: &kvgate_gateway::Gateway,
    claimed: usize,
    sent: usize,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(gw.traffic_addr)
        .await
        .unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {claimed}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&vec![b' '; sent]).await.unwrap();
    s
}

/// A gateway over `pod` with `config` (TOML) as its config file.
async fn gateway_with_file(
    pod: &FakePod,
    config: &str,
    tweak: impl FnOnce(&mut kvgate_gateway::ServeArgs),
) -> kvgate_gateway::Gateway {
    let path = std::env::temp_dir().join(format!(
        "kvgate-limits-{}-{}.toml",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::write(&path, config).unwrap();
    let mut a = args(&[pod]);
    a.config = Some(path);
    tweak(&mut a);
    kvgate_gateway::Gateway::start(a).await.unwrap()
}

#[tokio::test]
async fn clients_trickling_their_bodies_hold_no_slot() {
    let pod = FakePod::start(Behavior::Normal {
        chunks: 2,
        delay_ms: 1,
    })
    .await;
    let gw = gateway_with_file(&pod, "body_read_timeout_ms = 400\n", |a| {
        a.max_concurrent_requests = Some(2);
        a.max_waiting_requests = Some(0);
    })
    .await;
    // More trickling clients than slots: before the fix each took a slot before its body.
    let mut slow = Vec::new();
    for _ in 0..5 {
        slow.push(trickling_client(&gw, 10_000_000, 10).await);
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(gw.shared().admission.slots.active(), 0);
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("a", false)),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::OK, "{}", r.text());
    // Each trickling client gets 408 once its body is late.
    use tokio::io::AsyncReadExt;
    for mut s in slow {
        let mut buf = vec![0; 4096];
        let n = tokio::time::timeout(std::time::Duration::from_secs(3), s.read(&mut buf))
            .await
            .expect("an answer within the body read timeout")
            .unwrap();
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("body_timeout"), "{text}");
    }
    eventually("every body's bytes returned to the budget", || {
        gw.shared().admission.body_budget.held() == 0
    })
    .await;
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn request_bodies_beyond_the_memory_budget_get_503_and_the_budget_comes_back() {
    let pod = FakePod::start(Behavior::Normal {
        chunks: 2,
        delay_ms: 1,
    })
    .await;
    let gw = gateway_with_file(
        &pod,
        "max_body_bytes_in_flight = 1000\nbody_read_timeout_ms = 500\n",
        |_| {},
    )
    .await;
    // One client holds 900 bytes of the 1,000-byte budget while it trickles.
    let hog = trickling_client(&gw, 5_000, 900).await;
    eventually("the hog's bytes are in the budget", || {
        gw.shared().admission.body_budget.held() == 900
    })
    .await;
    let body = chat_body(&"x".repeat(200), false);
    let r = send(&client(), post(&gw, "/v1/chat/completions", &body)).await;
    assert_eq!(
        r.status,
        http::StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        r.text()
    );
    assert_eq!(r.json()["error"]["code"], "body_budget_exhausted");
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));
    // The hog times out (408) and its bytes come back: the same request is served.
    eventually("the hog's bytes returned", || {
        gw.shared().admission.body_budget.held() == 0
    })
    .await;
    let r = send(&client(), post(&gw, "/v1/chat/completions", &body)).await;
    assert_eq!(r.status, http::StatusCode::OK, "{}", r.text());
    drop(hog);
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn time_queued_counts_against_the_request_timeout() {
    let pod = FakePod::start(Behavior::Normal {
        chunks: 20,
        delay_ms: 50,
    })
    .await;
    let mut a = args(&[&pod]);
    a.max_concurrent_requests = Some(1);
    a.max_waiting_requests = Some(1);
    a.request_timeout_ms = Some(600);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let c = client();
    // The first request holds the only slot until its own timeout (a 1 s stream, cut at 600 ms).
    let first = tokio::spawn({
        let (c, req) = (
            c.clone(),
            post(&gw, "/v1/chat/completions", &chat_body("a", true)),
        );
        async move { send(&c, req).await }
    });
    let shared = gw.shared().clone();
    eventually("the first request holds the slot", || {
        shared.admission.slots.active() == 1
    })
    .await;
    // The second waits in the queue for ~600 ms, so its deadline (600 ms from its arrival) is
    // all but gone when it gets the slot: it ends with the request timeout at once, either 504
    // or a stream cut by the timeout event, instead of a fresh 600 ms (it would end at ~1.2 s).
    let t0 = std::time::Instant::now();
    let r = send(&c, post(&gw, "/v1/chat/completions", &chat_body("b", true))).await;
    let text = r.text();
    assert!(
        r.status == http::StatusCode::GATEWAY_TIMEOUT || text.contains("\"request_timeout\""),
        "{}: {text}",
        r.status
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    first.await.unwrap();
    assert_idle(&gw, &[&pod]).await;
}

/// `kvgate_tokenizations_total` from the gateway's metrics text.
fn tokenizations(gw: &kvgate_gateway::Gateway) -> u64 {
    let m = gw.shared().metrics_text().unwrap();
    m.lines()
        .find_map(|l| l.strip_prefix("kvgate_tokenizations_total "))
        .unwrap_or_else(|| panic!("no kvgate_tokenizations_total in\n{m}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn in_token_mode_a_huge_prompt_over_the_limit_gets_400_without_being_tokenized() {
    let pod = FakePod::start(SLOW).await;
    let mut a = args(&[&pod]);
    a.index = Some(kvgate_gateway::config::IndexKind::Engine);
    a.max_prompt_tokens = Some(100);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let c = client();
    // 16 MB: what took 9 s of CPU and 893 MB to tokenize before the limit was checked.
    let huge = "word ".repeat((16 << 20) / 5);
    let bodies = [
        (
            "/v1/completions",
            serde_json::json!({"model": "fake-model", "prompt": huge}).to_string(),
        ),
        ("/v1/chat/completions", chat_body(&huge, false)),
    ];
    for (path, body) in &bodies {
        let t0 = std::time::Instant::now();
        let r = send(&c, post(&gw, path, body)).await;
        let took = t0.elapsed();
        assert_eq!(r.status, http::StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("bytes"),
            "{}",
            r.text()
        );
        eprintln!("{path}: 16 MB prompt answered 400 in {took:?}");
        assert!(
            took < std::time::Duration::from_secs(20),
            "{path}: {took:?}"
        );
    }
    assert_eq!(tokenizations(&gw), 0, "the tokenizer was never called");
    assert_eq!(pod.requests(), 0);
    // A prompt that fits is tokenized, counted and served.
    let r = send(
        &c,
        post(
            &gw,
            "/v1/chat/completions",
            &chat_body("a short prompt", false),
        ),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::OK, "{}", r.text());
    assert_eq!(tokenizations(&gw), 1);
    // Just under the length bound but over the limit by its tokens: tokenized, then 400.
    let per_token = kvgate_core::tokenizer::PromptTokenizer::cl100k().max_token_bytes();
    let prompt = "a ".repeat(100 * per_token / 2);
    let body = serde_json::json!({"model": "fake-model", "prompt": prompt}).to_string();
    let r = send(&c, post(&gw, "/v1/completions", &body)).await;
    assert_eq!(r.status, http::StatusCode::BAD_REQUEST);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("about")
    );
    assert_eq!(tokenizations(&gw), 2);
}

/// A counter `kvgate_NAME_total` from the gateway's metrics text.
fn counter(gw: &kvgate_gateway::Gateway, name: &str) -> u64 {
    let m = gw.shared().metrics_text().unwrap();
    let prefix = format!("kvgate_{name}_total ");
    m.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {prefix}in\n{m}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn in_token_mode_a_conversations_next_turn_tokenizes_only_its_new_messages() {
    let pod = FakePod::start(Behavior::Normal {
        chunks: 1,
        delay_ms: 0,
    })
    .await;
    let system = "You are a careful assistant. ".repeat(400);
    let turn1 = serde_json::json!([
        {"role": "system", "content": system},
        {"role": "user", "content": "first question ".repeat(200)},
    ]);
    let mut turn2 = turn1.as_array().unwrap().clone();
    turn2.push(serde_json::json!({"role": "assistant", "content": "an answer"}));
    turn2.push(serde_json::json!({"role": "user", "content": "and a follow-up"}));
    let body = |messages: &serde_json::Value| {
        serde_json::json!({"model": "fake-model", "messages": messages, "max_tokens": 1})
            .to_string()
    };
    for (cache_mib, reuses) in [(None, true), (Some(0), false)] {
        let mut a = args(&[&pod]);
        a.index = Some(kvgate_gateway::config::IndexKind::Engine);
        a.tokenization_cache_mib = cache_mib;
        let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
        let c = client();
        for messages in [&turn1, &serde_json::Value::Array(turn2.clone())] {
            let r = send(&c, post(&gw, "/v1/chat/completions", &body(messages))).await;
            assert_eq!(r.status, http::StatusCode::OK, "{}", r.text());
        }
        let reused = counter(&gw, "tokenization_reused_bytes");
        let tokenized = counter(&gw, "tokenization_tokenized_bytes");
        assert_eq!(tokenizations(&gw), 2);
        if reuses {
            // Turn 2 reuses all of turn 1's rendering (system and first user message, ~14 KB)
            // and tokenizes only the two new messages (~50 bytes rendered).
            assert!(reused > 14_000, "reused {reused}");
            assert!(tokenized < reused + 100, "tokenized {tokenized}");
        } else {
            assert_eq!(reused, 0, "--tokenization-cache-mib 0 turns reuse off");
        }
        assert_idle(&gw, &[&pod]).await;
    }
}
