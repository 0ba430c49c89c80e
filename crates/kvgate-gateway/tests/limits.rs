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
    a.max_queued_requests = Some(0);
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
        shared.admission.active() == 1
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
        shared.admission.active() == 0 && shared.admission.queued() == 0
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
