//! End-to-end behaviour of the gateway against in-process fake pods (real sockets on 127.0.0.1).

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use serde_json::{Value, json};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const SLOW: Behavior = Behavior::Normal {
    chunks: 5,
    delay_ms: 100,
};
const FAST: Behavior = Behavior::Normal {
    chunks: 3,
    delay_ms: 1,
};

#[tokio::test]
async fn stream_chunks_arrive_incrementally_and_added_usage_is_stripped() {
    let pod = FakePod::start(SLOW).await;
    let gw = gateway(&[&pod]).await;
    let c = client();
    let r = send(
        &c,
        post(&gw, "/v1/chat/completions", &chat_body("hello", true)),
    )
    .await;
    assert_eq!(r.status, 200);
    let content: Vec<_> = r
        .frames
        .iter()
        .filter(|(_, b)| String::from_utf8_lossy(b).contains("tok"))
        .collect();
    assert_eq!(content.len(), 5, "one frame per token: {:?}", r.frames);
    // Not buffered: the first token arrives long before the last one.
    let first = content[0].0;
    let last = content[4].0;
    assert!(
        first < Duration::from_millis(250),
        "first token after {first:?}"
    );
    assert!(
        last - first >= Duration::from_millis(350),
        "tokens bunched: {first:?}..{last:?}"
    );
    // The gateway asked for usage; the client did not, so it must not see it.
    let sent = pod.state.last_body.lock().unwrap().clone().unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    let text = r.text();
    assert!(!text.contains("\"usage\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert_eq!(r.header("x-kvgate-pod").as_deref(), Some(pod.url.as_str()));
    assert!(r.header("x-kvgate-branch").is_some());
    assert!(r.header("x-request-id").is_some());
    assert_idle(&gw, &[&pod]).await;
    // The completed stream trained the predictor (TTFT and TPOT).
    let acc = gw.shared().session.lock().predictor().accuracy();
    assert_eq!((acc.samples, acc.tpot_samples), (1, 1));
}

/// The predictor learns a stream's TTFT when its first token arrives (the default profile's
/// `predictor_ttft_at_first_token`), not at the end; the TPOT at the end. In the seed profile
/// both wait for the end.
#[tokio::test]
async fn the_ttft_is_learnt_at_the_first_token_and_the_tpot_at_the_end() {
    use http_body_util::BodyExt;
    for (router, mid_stream) in [("", (1, 0)), ("gate_profile = \"seed\"\n", (0, 0))] {
        let pod = FakePod::start(SLOW).await;
        let path = std::env::temp_dir().join(format!(
            "kvgate-ttft-first-{}-{}.toml",
            std::process::id(),
            router.len()
        ));
        std::fs::write(&path, format!("[router]\n{router}")).unwrap();
        let mut a = args(&[&pod]);
        a.config = Some(path);
        let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
        let learnt = |gw: &kvgate_gateway::Gateway| {
            let acc = gw.shared().session.lock().predictor().accuracy();
            (acc.samples, acc.tpot_samples)
        };
        let c = client();
        let req = post(&gw, "/v1/chat/completions", &chat_body("hello", true));
        let resp = c.request(req).await.unwrap();
        let mut body = resp.into_body();
        // Read up to the first token's frame; the pod sends four more, 100 ms apart.
        loop {
            let f = body.frame().await.expect("a frame").unwrap();
            if f.data_ref()
                .is_some_and(|d| String::from_utf8_lossy(d).contains("tok"))
            {
                break;
            }
        }
        let deadline = Instant::now() + Duration::from_millis(150);
        while learnt(&gw) != mid_stream && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            learnt(&gw),
            mid_stream,
            "mid-stream, router config {router:?}"
        );
        while body.frame().await.is_some() {}
        assert_idle(&gw, &[&pod]).await;
        assert_eq!(learnt(&gw), (1, 1), "at the end, router config {router:?}");
    }
}

#[tokio::test]
async fn stream_keeps_usage_when_the_client_asked_for_it() {
    let pod = FakePod::start(FAST).await;
    let gw = gateway(&[&pod]).await;
    let body =
        json!({"model":"fake-model","prompt":"hi","stream":true,"stream_options":{"include_usage":true}})
            .to_string();
    let r = send(&client(), post(&gw, "/v1/completions", &body)).await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("\"completion_tokens\":3"), "{}", r.text());
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn non_stream_passes_through_and_counters_return_to_zero() {
    let pod = FakePod::start(FAST).await;
    let gw = gateway(&[&pod]).await;
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("hi", false)),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn bad_requests_get_400_with_an_openai_error_and_touch_no_pod() {
    let pod = FakePod::start(FAST).await;
    let gw = gateway(&[&pod]).await;
    let c = client();
    let cases = [
        ("/v1/chat/completions", "{not json", None),
        ("/v1/chat/completions", "", None),
        ("/v1/chat/completions", r#"{"model":"m"}"#, Some("messages")),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":"hi"}"#,
            Some("messages"),
        ),
        (
            "/v1/completions",
            r#"{"model":"m","prompt":"x","stream":"yes"}"#,
            Some("stream"),
        ),
        ("/v1/completions", "[1,2]", None),
    ];
    for (path, body, param) in cases {
        let r = send(&c, post(&gw, path, body)).await;
        assert_eq!(r.status, 400, "{body}");
        let e = r.json();
        assert_eq!(e["error"]["type"], "invalid_request_error", "{body}");
        assert!(
            e["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        if let Some(p) = param {
            assert_eq!(e["error"]["param"], p, "{body}: {e}");
        }
    }
    assert_eq!(pod.requests(), 0);
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn upstream_500_is_retried_on_another_pod_before_any_byte() {
    let bad = FakePod::start(Behavior::Fail500).await;
    let good = FakePod::start(FAST).await;
    let gw = gateway(&[&bad, &good]).await;
    let c = client();
    for i in 0..4 {
        let r = send(
            &c,
            post(
                &gw,
                "/v1/chat/completions",
                &chat_body(&format!("q{i}"), i % 2 == 0),
            ),
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-kvgate-pod").as_deref(), Some(good.url.as_str()));
    }
    assert!(bad.requests() >= 1, "the failing pod was never tried");
    assert_idle(&gw, &[&bad, &good]).await;
}

#[tokio::test]
async fn every_pod_failing_gives_502_after_two_retries() {
    let pods = [
        FakePod::start(Behavior::Fail500).await,
        FakePod::start(Behavior::Fail500).await,
        FakePod::start(Behavior::Fail500).await,
        FakePod::start(Behavior::Fail500).await,
    ];
    let refs: Vec<&FakePod> = pods.iter().collect();
    let gw = gateway(&refs).await;
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("hi", true)),
    )
    .await;
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["error"]["type"], "upstream_error");
    let tried: u32 = pods.iter().map(|p| p.requests()).sum();
    assert_eq!(tried, 3, "first try + 2 retries");
    assert_idle(&gw, &refs).await;
}

#[tokio::test]
async fn no_healthy_pod_gives_503() {
    let pod = FakePod::start(FAST).await;
    pod.state.metrics_ok.store(false, Ordering::SeqCst);
    let gw = gateway(&[&pod]).await;
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("hi", false)),
    )
    .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "no_healthy_pod");
    assert_eq!(pod.requests(), 0);
}

#[tokio::test]
async fn pod_dying_mid_stream_gives_a_clean_error_event_and_no_retry() {
    let dying = FakePod::start(Behavior::DieAfter {
        chunks: 2,
        delay_ms: 20,
    })
    .await;
    let gw = gateway(&[&dying]).await;
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("hi", true)),
    )
    .await;
    assert_eq!(r.status, 200);
    let text = r.text();
    assert!(text.contains("tok1"), "{text}");
    assert!(text.contains("upstream_stream_error"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(dying.requests(), 1, "never retried after bytes were sent");
    assert_idle(&gw, &[&dying]).await;
}

#[tokio::test]
async fn client_abort_mid_stream_cancels_the_upstream_request() {
    let pod = FakePod::start(Behavior::Normal {
        chunks: 200,
        delay_ms: 20,
    })
    .await;
    let gw = gateway(&[&pod]).await;
    let c = client();
    let resp = c
        .request(post(&gw, "/v1/chat/completions", &chat_body("hi", true)))
        .await
        .unwrap();
    let mut body = resp.into_body();
    let mut got = 0;
    while got < 3 {
        use http_body_util::BodyExt;
        let f = body.frame().await.unwrap().unwrap();
        if f.data_ref()
            .is_some_and(|d| String::from_utf8_lossy(d).contains("tok"))
        {
            got += 1;
        }
    }
    assert_eq!(gw.in_flight(&pod.url).map(|f| f.requests), Some(1));
    drop(body);
    drop(c);
    eventually("upstream stream cancelled", || {
        pod.state.cancelled.load(Ordering::SeqCst) == 1
            && pod.state.active_streams.load(Ordering::SeqCst) == 0
    })
    .await;
    assert_idle(&gw, &[&pod]).await;
}

#[tokio::test]
async fn killed_pod_is_marked_unhealthy_and_avoided() {
    let a = FakePod::start(FAST).await;
    let b = FakePod::start(FAST).await;
    let gw = gateway(&[&a, &b]).await;
    assert_eq!(gw.pod_healthy(&a.url), Some(true));
    a.kill();
    eventually("killed pod marked unhealthy", || {
        gw.pod_healthy(&a.url) == Some(false)
    })
    .await;
    let before = a.requests();
    let c = client();
    for i in 0..6 {
        let r = send(
            &c,
            post(
                &gw,
                "/v1/chat/completions",
                &chat_body(&format!("new {i}"), false),
            ),
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-kvgate-pod").as_deref(), Some(b.url.as_str()));
    }
    assert_eq!(a.requests(), before);
    assert_idle(&gw, &[&a, &b]).await;
}

#[tokio::test]
async fn connect_error_before_detection_is_retried_elsewhere() {
    let a = FakePod::start(FAST).await;
    let b = FakePod::start(FAST).await;
    let mut args = args(&[&a, &b]);
    args.scrape_interval_ms = Some(60_000); // the scraper will not notice in time
    let gw = kvgate_gateway::Gateway::start(args).await.unwrap();
    a.kill();
    let c = client();
    for i in 0..6 {
        let r = send(
            &c,
            post(
                &gw,
                "/v1/chat/completions",
                &chat_body(&format!("x{i}"), true),
            ),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-kvgate-pod").as_deref(), Some(b.url.as_str()));
    }
    assert_eq!(
        gw.pod_healthy(&a.url),
        Some(false),
        "connection error marks the pod unhealthy"
    );
    assert_idle(&gw, &[&a, &b]).await;
}

#[tokio::test]
async fn multi_turn_conversation_sticks_to_one_pod_after_its_first_turn() {
    let pods = [
        FakePod::start(FAST).await,
        FakePod::start(FAST).await,
        FakePod::start(FAST).await,
        FakePod::start(FAST).await,
    ];
    let refs: Vec<&FakePod> = pods.iter().collect();
    let gw = gateway(&refs).await;
    let c = client();
    let system = "You are a careful assistant. ".repeat(40);
    let mut messages = vec![json!({"role":"system","content":system})];
    let mut first_pod = None;
    for turn in 0..6 {
        messages.push(json!({"role":"user","content":format!("question {turn}: tell me more about topic {turn}")}));
        let body = json!({"model":"fake-model","messages":messages,"stream":true}).to_string();
        let r = send(&c, post(&gw, "/v1/chat/completions", &body)).await;
        assert_eq!(r.status, 200);
        let pod = r.header("x-kvgate-pod");
        let branch = r.header("x-kvgate-branch").unwrap();
        match &first_pod {
            None => first_pod = pod,
            Some(p) => {
                assert_eq!(pod.as_ref(), Some(p), "turn {turn} moved");
                assert_eq!(branch, "exploit", "turn {turn}");
            }
        }
        messages.push(json!({"role":"assistant","content":"tok0 tok1 tok2 "}));
    }
    assert_idle(&gw, &refs).await;
}

#[tokio::test]
async fn concurrent_new_conversations_spread_over_pods() {
    let pods = [
        FakePod::start(SLOW).await,
        FakePod::start(SLOW).await,
        FakePod::start(SLOW).await,
        FakePod::start(SLOW).await,
    ];
    let refs: Vec<&FakePod> = pods.iter().collect();
    let gw = gateway(&refs).await;
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let req = post(
            &gw,
            "/v1/chat/completions",
            &chat_body(&format!("{i} {}", "unique conversation ".repeat(50)), true),
        );
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            send(&c, req).await.header("x-kvgate-pod")
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut used = std::collections::BTreeSet::new();
    for t in tasks {
        used.insert(t.await.unwrap());
    }
    assert!(used.len() >= 2, "all new conversations went to {used:?}");
    assert_idle(&gw, &refs).await;
}

#[tokio::test]
async fn models_is_the_union_of_the_pods_models() {
    let a = FakePod::start_with_model(FAST, "model-a").await;
    let b = FakePod::start_with_model(FAST, "model-b").await;
    let b2 = FakePod::start_with_model(FAST, "model-b").await;
    let gw = gateway(&[&a, &b, &b2]).await;
    let r = send(
        &client(),
        http::Request::get(format!("http://{}/v1/models", gw.traffic_addr))
            .body(Default::default())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);
    let ids: Vec<_> = r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, vec!["model-a", "model-b"]);
}

/// A `/v1/models` body listing `ids` (compact, as a hostile or buggy pod could: 45,000 ids fit
/// in the 1 MiB read from a pod).
fn models_body(ids: std::ops::Range<usize>) -> String {
    let data: Vec<Value> = ids
        .map(|i| serde_json::json!({"id": format!("{i:05}")}))
        .collect();
    serde_json::json!({"object": "list", "data": data}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_of_two_pods_with_45000_ids_each_merge_fast_bounded_and_leave_healthz_answering() {
    let a = FakePod::start(FAST).await;
    let b = FakePod::start(FAST).await;
    let body_a = models_body(0..45_000);
    assert!(body_a.len() < 1 << 20, "under the 1 MiB read from a pod");
    *a.state.models_body.lock().unwrap() = Some(body_a);
    *b.state.models_body.lock().unwrap() = Some(models_body(45_000..90_000));
    let gw = gateway(&[&a, &b]).await;
    let c = client();
    let get = |url: String| {
        let c = c.clone();
        async move {
            send(
                &c,
                http::Request::get(url).body(Default::default()).unwrap(),
            )
            .await
        }
    };
    let started = Instant::now();
    let calls: Vec<_> = (0..2)
        .map(|_| tokio::spawn(get(format!("http://{}/v1/models", gw.traffic_addr))))
        .collect();
    // The admin listener answers while the merges run (they used to hold the async workers).
    let mut slowest_healthz = Duration::ZERO;
    while !calls.iter().all(|t| t.is_finished()) {
        let t0 = Instant::now();
        let h = get(format!("http://{}/healthz", gw.admin_addr)).await;
        assert_eq!(h.status, 200);
        slowest_healthz = slowest_healthz.max(t0.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for call in calls {
        let r = call.await.unwrap();
        assert_eq!(r.status, 200);
        let ids: Vec<String> = r.json()["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect();
        // The first 10,000 ids seen, in pod-table order (pod a's), sorted.
        let want: Vec<String> = (0..kvgate_gateway::models::MAX_MODEL_IDS)
            .map(|i| format!("{i:05}"))
            .collect();
        assert_eq!(ids, want);
    }
    let took = started.elapsed();
    eprintln!(
        "2 concurrent /v1/models of 2x45,000 ids: {took:?}; slowest /healthz {slowest_healthz:?}"
    );
    // Guards against the quadratic merge (55 s a call), generous for a debug build.
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(
        slowest_healthz < Duration::from_secs(2),
        "{slowest_healthz:?}"
    );
}

#[tokio::test]
async fn other_v1_paths_go_to_a_healthy_pod_and_request_id_is_honoured() {
    let a = FakePod::start(FAST).await;
    let gw = gateway(&[&a]).await;
    let req = http::Request::post(format!("http://{}/v1/embeddings", gw.traffic_addr))
        .header("x-request-id", "my-id-42")
        .body(Default::default())
        .unwrap();
    let r = send(&client(), req).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["path"], "/v1/embeddings");
    assert_eq!(r.header("x-request-id").as_deref(), Some("my-id-42"));
    assert_idle(&gw, &[&a]).await;
}

#[tokio::test]
async fn admin_listener_serves_metrics_decisions_and_readiness() {
    let a = FakePod::start(FAST).await;
    let gw = gateway(&[&a]).await;
    let c = client();
    let req = post(&gw, "/v1/chat/completions", &chat_body("hi", true));
    let (mut parts, body) = req.into_parts();
    parts
        .headers
        .insert("x-request-id", "req-7".parse().unwrap());
    parts
        .headers
        .insert("x-llm-d-slo-ttft-ms", "250".parse().unwrap());
    send(&c, http::Request::from_parts(parts, body)).await;
    let get = |path: &str| {
        http::Request::get(format!("http://{}{path}", gw.admin_addr))
            .body(Default::default())
            .unwrap()
    };
    let m = send(&c, get("/metrics")).await.text();
    for needle in [
        "kvgate_requests_total{",
        "status=\"ok\"",
        "kvgate_ttft_ms_bucket",
        "kvgate_predictor_ttft_mape",
        "kvgate_index_blocks",
        "kvgate_in_flight_requests{",
        "kvgate_scrape_skipped_lines_total",
    ] {
        assert!(m.contains(needle), "{needle} missing from\n{m}");
    }
    let d = send(&c, get("/debug/decisions")).await.json();
    let last = &d.as_array().unwrap()[0];
    assert_eq!(last["request_id"], "req-7");
    assert_eq!(last["slo_ttft_ms"], 250.0);
    assert_eq!(last["pod"], a.url.as_str());
    assert!(last["pods"][0]["predicted_ttft_ms"].is_number());
    assert_eq!(send(&c, get("/readyz")).await.status, 200);
    assert_eq!(send(&c, get("/healthz")).await.status, 200);
    // The traffic port does not serve admin paths.
    let r = send(
        &c,
        http::Request::get(format!("http://{}/metrics", gw.traffic_addr))
            .body(Default::default())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn debug_score_reports_where_a_prompt_is_cached_without_routing_it() {
    let pods = [FakePod::start(FAST).await, FakePod::start(FAST).await];
    let refs: Vec<&FakePod> = pods.iter().collect();
    let gw = gateway(&refs).await;
    let c = client();
    let body = chat_body(&"a long shared system prompt ".repeat(30), false);
    let r = send(&c, post(&gw, "/v1/chat/completions", &body)).await;
    assert_eq!(r.status, 200);
    let served_by = r.header("x-kvgate-pod").unwrap();
    let decisions = gw.shared().telemetry.decisions.snapshot().len();
    let requests: Vec<u32> = pods.iter().map(FakePod::requests).collect();

    let score = |body: &str| {
        http::Request::post(format!(
            "http://{}/debug/score/v1/chat/completions",
            gw.admin_addr
        ))
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .unwrap()
    };
    let r = send(&c, score(&body)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let report = r.json();
    let view = |pod: &str| {
        report["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pod"] == pod)
            .unwrap()
            .clone()
    };
    let blocks = report["prompt_blocks"].as_u64().unwrap();
    assert!(blocks > 0, "{report}");
    assert_eq!(view(&served_by)["prefix_score"], 1.0, "{report}");
    assert_eq!(view(&served_by)["matched_blocks"], blocks, "{report}");
    let other = pods.iter().find(|p| p.url != served_by).unwrap();
    assert_eq!(view(&other.url)["prefix_score"], 0.0, "{report}");
    // A dry run: no decision logged, no pod called, nothing left in flight.
    assert_eq!(gw.shared().telemetry.decisions.snapshot().len(), decisions);
    let after: Vec<u32> = pods.iter().map(FakePod::requests).collect();
    assert_eq!(after, requests);
    assert_idle(&gw, &refs).await;

    // A bad body gets the traffic port's 400.
    let r = send(&c, score("{not json")).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "invalid_json");
}

#[tokio::test]
async fn pod_url_credentials_never_show_in_metrics_headers_or_debug_pages() {
    let pod = FakePod::start(FAST).await;
    let with_userinfo = pod.url.replace("http://", "http://user:s3cret@");
    let shown = pod.url.replace("http://", "http://***@");
    let mut a = args(&[]);
    a.pod = vec![with_userinfo.clone()];
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let c = client();
    // The real URL is still what the gateway connects to and looks pods up by.
    eventually("the pod is scraped healthy", || {
        gw.pod_healthy(&with_userinfo) == Some(true)
    })
    .await;
    let r = send(
        &c,
        post(&gw, "/v1/chat/completions", &chat_body("a", false)),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(pod.requests(), 1);
    assert_eq!(r.header("x-kvgate-pod").as_deref(), Some(shown.as_str()));
    let get = |path: &str| {
        http::Request::get(format!("http://{}{path}", gw.admin_addr))
            .body(Default::default())
            .unwrap()
    };
    let passthrough = send(
        &c,
        http::Request::get(format!("http://{}/v1/other", gw.traffic_addr))
            .body(Default::default())
            .unwrap(),
    )
    .await;
    assert_eq!(
        passthrough.header("x-kvgate-pod").as_deref(),
        Some(shown.as_str())
    );
    let metrics = send(&c, get("/metrics")).await.text();
    assert!(
        metrics.contains(&format!("pod=\"{shown}\"")),
        "pod label missing:\n{metrics}"
    );
    let config = send(&c, get("/debug/config")).await.json();
    assert_eq!(config["pods"][0]["url"], shown.as_str());
    let decisions = send(&c, get("/debug/decisions")).await.text();
    assert!(decisions.contains(&shown), "{decisions}");
    for (page, text) in [
        ("/metrics", metrics),
        ("/debug/config", config.to_string()),
        ("/debug/decisions", decisions),
    ] {
        assert!(
            !text.contains("s3cret"),
            "{page} shows the password:\n{text}"
        );
    }
}

#[tokio::test]
async fn passthrough_paths_with_dot_segments_get_400_and_touch_no_pod() {
    let pod = FakePod::start(FAST).await;
    let gw = gateway(&[&pod]).await;
    let c = client();
    for path in [
        "/v1/../admin",
        "/v1/%2e%2e/x",
        "/v1/%2E%2E/x",
        "/v1/./models/../../metrics",
        "/v1/..%2fadmin",
        "/v1/%252e%252e/admin",
    ] {
        let req = http::Request::get(format!("http://{}{path}", gw.traffic_addr))
            .body(Default::default())
            .unwrap();
        let r = send(&c, req).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "invalid_path", "{path}");
    }
    assert_eq!(pod.requests(), 0, "no dot-segment path reached the pod");
    let m = gw.shared().metrics_text().unwrap();
    assert!(m.contains("reason=\"invalid_path\"} 6"), "{m}");
    let req = http::Request::get(format!("http://{}/v1/files/a..b", gw.traffic_addr))
        .body(Default::default())
        .unwrap();
    let r = send(&c, req).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["path"], "/v1/files/a..b");
}

/// Engine mode with a model whose chat template refuses tool messages: such a chat request is
/// still served (200), counted as a tokenizer error, and routed on kvgate's own rendering with
/// its real token count (not 0 tokens, which would skip the prompt limit, the pod's prefill
/// charge and train the predictor on a 0-token prompt).
#[tokio::test]
async fn a_chat_prompt_the_template_refuses_is_served_with_its_real_token_count() {
    let dir = std::env::temp_dir().join(format!("kvgate-proxy-template-{}", std::process::id()));
    let tokenizer = word_level_tokenizer_json(&dir);
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}\
         {% endif %}{{ m.content }} {% endfor %}",
    )
    .unwrap();
    let pod = FakePod::start(FAST).await;
    let mut a = args(&[&pod]);
    a.index = Some(kvgate_gateway::config::IndexKind::Engine);
    a.tokenizer = Some(tokenizer);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let c = client();
    let words: Vec<String> = (0..40).map(|i| format!("w{}", i % 64)).collect();
    let body = json!({"model": "fake-model", "messages": [
        {"role": "user", "content": words.join(" ")},
        {"role": "tool", "content": "w1 w2", "tool_call_id": "c1"}
    ]})
    .to_string();
    let r = send(&c, post(&gw, "/v1/chat/completions", &body)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = gw.shared().metrics_text().unwrap();
    assert!(
        m.lines()
            .any(|l| l.starts_with("kvgate_tokenizer_errors_total ") && l.ends_with(" 1")),
        "{m}"
    );
    let score = http::Request::post(format!(
        "http://{}/debug/score/v1/chat/completions",
        gw.admin_addr
    ))
    .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
    .unwrap();
    let report = send(&c, score).await.json();
    let input = report["input_tokens"].as_u64().unwrap();
    assert!(input > 40, "{report}");
    assert_idle(&gw, &[&pod]).await;
}

/// A pod whose `/metrics` answer costs it time (vLLM's API server shares a CPU pod's core) is
/// scraped less often, so that the scrapes take at most 4 % of it; a fast one keeps the
/// configured interval (50 ms).
#[tokio::test]
async fn a_costly_metrics_answer_is_scraped_less_often() {
    let fast = FakePod::start(FAST).await;
    let slow = FakePod::start(FAST).await;
    slow.state.metrics_delay_ms.store(40, Ordering::SeqCst);
    let gw = gateway(&[&fast, &slow]).await;
    let interval = |gw: &kvgate_gateway::Gateway, url: &str| {
        gw.shared()
            .metrics_text()
            .unwrap()
            .lines()
            .find(|l| l.starts_with("kvgate_scrape_interval_seconds{") && l.contains(url))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (f0, s0) = (
        fast.state.metrics_requests.load(Ordering::SeqCst),
        slow.state.metrics_requests.load(Ordering::SeqCst),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let f = fast.state.metrics_requests.load(Ordering::SeqCst) - f0;
    let s = slow.state.metrics_requests.load(Ordering::SeqCst) - s0;
    assert!(
        f >= 12,
        "the fast pod is scraped about every 50 ms: {f} in 2 s"
    );
    assert!(s <= 6, "the slow pod about every 500 ms: {s} in 2 s");
    assert_eq!(interval(&gw, &slow.url), Some(0.5));
    assert!(interval(&gw, &fast.url).is_some_and(|i| i < 0.2));
    assert_eq!(gw.pod_healthy(&slow.url), Some(true));
}

/// A pod whose `/metrics` answers slowly (a busy vLLM CPU pod shares its core with the engine)
/// stays healthy through one timed-out scrape, and is marked unhealthy only when scrapes keep
/// timing out.
#[tokio::test]
async fn a_slow_metrics_answer_is_not_an_outage_until_it_repeats() {
    let pod = FakePod::start(FAST).await;
    let gw = gateway(&[&pod]).await;
    eventually("healthy", || gw.pod_healthy(&pod.url) == Some(true)).await;
    // One scrape times out (1 s floor), then answers come fast again.
    pod.state.metrics_delay_ms.store(1_300, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    pod.state.metrics_delay_ms.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let errors = |gw: &kvgate_gateway::Gateway| {
        gw.shared()
            .metrics_text()
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("kvgate_scrape_errors_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert!(errors(&gw) >= 1.0, "the timeout is counted");
    assert_eq!(
        gw.shared().fleet.pods.all()[0].outages(),
        0,
        "but no outage"
    );
    // Scrapes that keep timing out do make it unhealthy.
    pod.state.metrics_delay_ms.store(5_000, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(20), async {
        while gw.pod_healthy(&pod.url) != Some(false) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("unhealthy after ten timeouts in a row");
    pod.state.metrics_delay_ms.store(0, Ordering::SeqCst);
}
