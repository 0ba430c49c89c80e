//! The ext_proc endpoint picker over a real gRPC connection, with the test as a fake Envoy:
//! BUFFERED and FULL_DUPLEX_STREAMED request bodies, the response phase ending the request,
//! 400 on a bad body, 503 with no healthy pod, the subset hint, 429 when the slots and queue are
//! full. (The real Envoy test is `kvgate/tests/envoy.rs`.)

mod common;

use common::{Behavior, FakePod, eventually};
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    CommonResponse, HttpBody, HttpHeaders, ImmediateResponse, ProcessingRequest,
    ProcessingResponse, ProtocolConfiguration, body_mutation, processing_request,
    processing_response,
};
use envoy_types::pb::google::protobuf::value::Kind;
use kvgate_gateway::Gateway;
use kvgate_gateway::ext_proc::DESTINATION_HEADER;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

struct FakeEnvoy {
    tx: mpsc::Sender<ProcessingRequest>,
    rx: tonic::Streaming<ProcessingResponse>,
}

impl FakeEnvoy {
    async fn connect(gw: &Gateway) -> FakeEnvoy {
        let addr = gw.ext_proc_addr.unwrap();
        let mut client = ExternalProcessorClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(16);
        let rx = client
            .process(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        FakeEnvoy { tx, rx }
    }

    async fn send(&self, r: processing_request::Request) {
        self.send_msg(ProcessingRequest {
            request: Some(r),
            ..Default::default()
        })
        .await
    }

    async fn send_msg(&self, m: ProcessingRequest) {
        self.tx.send(m).await.unwrap();
    }

    async fn recv(&mut self) -> processing_response::Response {
        self.recv_full().await.response.unwrap()
    }

    async fn recv_full(&mut self) -> ProcessingResponse {
        tokio::time::timeout(Duration::from_secs(5), self.rx.message())
            .await
            .expect("no answer from kvgate within 5 s")
            .unwrap()
            .expect("stream ended")
    }
}

fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> HttpHeaders {
    HttpHeaders {
        headers: Some(HeaderMap {
            headers: pairs
                .iter()
                .map(|(k, v)| HeaderValue {
                    key: k.to_string(),
                    value: String::new(),
                    raw_value: v.as_bytes().to_vec(),
                })
                .collect(),
        }),
        end_of_stream,
        ..Default::default()
    }
}

fn request_headers() -> processing_request::Request {
    processing_request::Request::RequestHeaders(headers(
        &[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-type", "application/json"),
            ("x-request-id", "envoy-test-1"),
        ],
        false,
    ))
}

fn body(data: &[u8], end_of_stream: bool) -> HttpBody {
    HttpBody {
        body: data.to_vec(),
        end_of_stream,
        ..Default::default()
    }
}

/// The destination set by a routing answer (header mutation), checked against the metadata.
fn destination(
    common: &CommonResponse,
    metadata: Option<&envoy_types::pb::google::protobuf::Struct>,
) -> String {
    assert!(common.clear_route_cache);
    let set = &common.header_mutation.as_ref().unwrap().set_headers;
    let h = set
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == DESTINATION_HEADER)
        .expect("no destination header");
    let dest = String::from_utf8(h.raw_value.clone()).unwrap();
    let lb = metadata.unwrap().fields.get("envoy.lb").unwrap();
    let Some(Kind::StructValue(lb)) = &lb.kind else {
        panic!("envoy.lb is not a struct")
    };
    let Some(Kind::StringValue(meta_dest)) = &lb.fields.get(DESTINATION_HEADER).unwrap().kind
    else {
        panic!("no destination in envoy.lb")
    };
    assert_eq!(&dest, meta_dest, "header and metadata disagree");
    dest
}

async fn fleet() -> (Vec<FakePod>, Gateway) {
    fleet_with(|_| {}).await
}

async fn fleet_with(tune: impl FnOnce(&mut kvgate_gateway::ServeArgs)) -> (Vec<FakePod>, Gateway) {
    let pods = vec![
        FakePod::start(Behavior::Normal {
            chunks: 2,
            delay_ms: 0,
        })
        .await,
        FakePod::start(Behavior::Normal {
            chunks: 2,
            delay_ms: 0,
        })
        .await,
    ];
    let mut args = common::args(&pods.iter().collect::<Vec<_>>());
    args.ext_proc_listen = Some("127.0.0.1:0".parse().unwrap());
    tune(&mut args);
    let gw = Gateway::start(args).await.unwrap();
    let urls: Vec<String> = pods.iter().map(|p| p.url.clone()).collect();
    eventually("pods healthy", || {
        urls.iter().all(|u| gw.pod_healthy(u) == Some(true))
    })
    .await;
    (pods, gw)
}

/// [`fleet_with`] with `toml` as the gateway's config file (in a temp folder named for `name`).
async fn fleet_with_config(name: &str, toml: &str) -> (Vec<FakePod>, Gateway) {
    let dir = std::env::temp_dir().join(format!("kvgate-ext-proc-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("kvgate.toml");
    std::fs::write(&config, toml).unwrap();
    fleet_with(|args| args.config = Some(config)).await
}

fn metric(gw: &Gateway, name: &str) -> f64 {
    gw.shared()
        .metrics_text()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

const CHAT: &str =
    r#"{"model":"fake-model","stream":true,"messages":[{"role":"user","content":"hello there"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_body_routes_and_the_response_phase_ends_the_request() {
    let (pods, gw) = fleet().await;
    let mut envoy = FakeEnvoy::connect(&gw).await;
    envoy.send(request_headers()).await;
    let processing_response::Response::RequestHeaders(h) = envoy.recv().await else {
        panic!("expected a headers answer first (BUFFERED)")
    };
    assert!(h.response.unwrap_or_default().header_mutation.is_none());
    envoy
        .send(processing_request::Request::RequestBody(body(
            CHAT.as_bytes(),
            true,
        )))
        .await;
    let full = envoy.recv_full().await;
    let Some(processing_response::Response::RequestBody(b)) = &full.response else {
        panic!("expected a body answer")
    };
    let dest = destination(b.response.as_ref().unwrap(), full.dynamic_metadata.as_ref());
    let chosen = pods
        .iter()
        .find(|p| p.url == format!("http://{dest}"))
        .expect("destination is one of the pods");
    let decisions = gw.shared().telemetry.decisions.snapshot();
    assert_eq!(decisions.len(), 1);
    assert_eq!(&*decisions[0].decision.pod, chosen.url);
    assert_eq!(decisions[0].request_id, "envoy-test-1");
    assert_eq!(gw.in_flight(&chosen.url).unwrap().requests, 1);

    // The response: SSE in three chunks, the last with end_of_stream.
    envoy
        .send(processing_request::Request::ResponseHeaders(headers(
            &[(":status", "200"), ("content-type", "text/event-stream")],
            false,
        )))
        .await;
    assert!(matches!(
        envoy.recv().await,
        processing_response::Response::ResponseHeaders(_)
    ));
    let chunks = [
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" you\"}}]}\n\n",
        "data: [DONE]\n\n",
    ];
    for (i, c) in chunks.iter().enumerate() {
        envoy
            .send(processing_request::Request::ResponseBody(body(
                c.as_bytes(),
                i + 1 == chunks.len(),
            )))
            .await;
        assert!(matches!(
            envoy.recv().await,
            processing_response::Response::ResponseBody(_)
        ));
    }
    eventually("request ended", || {
        gw.in_flight(&chosen.url).unwrap() == kvgate_core::InFlight::default()
    })
    .await;
    assert_eq!(metric(&gw, "kvgate_ttft_ms_count"), 1.0);
    assert_eq!(metric(&gw, "kvgate_tpot_ms_count"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_duplex_defers_the_headers_and_echoes_the_body_in_chunks() {
    let (pods, gw) = fleet().await;
    let mut envoy = FakeEnvoy::connect(&gw).await;
    envoy
        .send_msg(ProcessingRequest {
            request: Some(request_headers()),
            protocol_config: Some(ProtocolConfiguration {
                request_body_mode: BodySendMode::FullDuplexStreamed as i32,
                response_body_mode: BodySendMode::FullDuplexStreamed as i32,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await;
    let (a, b) = CHAT.as_bytes().split_at(20);
    envoy
        .send(processing_request::Request::RequestBody(body(a, false)))
        .await;
    envoy
        .send(processing_request::Request::RequestBody(body(b, true)))
        .await;
    let full = envoy.recv_full().await;
    let Some(processing_response::Response::RequestHeaders(h)) = &full.response else {
        panic!("expected the deferred headers answer first")
    };
    let dest = destination(h.response.as_ref().unwrap(), full.dynamic_metadata.as_ref());
    assert!(pods.iter().any(|p| p.url == format!("http://{dest}")));
    let processing_response::Response::RequestBody(b) = envoy.recv().await else {
        panic!("expected the body echo")
    };
    let Some(body_mutation::Mutation::StreamedResponse(s)) =
        b.response.unwrap().body_mutation.unwrap().mutation
    else {
        panic!("expected a streamed_response")
    };
    assert!(s.end_of_stream);
    assert_eq!(s.body, CHAT.as_bytes());
    // Envoy goes away before the response: the request's share is released.
    drop(envoy);
    eventually("in-flight released", || {
        pods.iter()
            .all(|p| gw.in_flight(&p.url).unwrap() == kvgate_core::InFlight::default())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_body_is_400_and_no_pod_is_503() {
    let (pods, gw) = fleet().await;
    let mut envoy = FakeEnvoy::connect(&gw).await;
    envoy.send(request_headers()).await;
    let _ = envoy.recv().await;
    envoy
        .send(processing_request::Request::RequestBody(body(
            b"{nope", true,
        )))
        .await;
    let processing_response::Response::ImmediateResponse(r) = envoy.recv().await else {
        panic!("expected an immediate response")
    };
    assert_eq!(r.status.unwrap().code, 400);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "invalid_json");
    assert!(gw.shared().telemetry.decisions.snapshot().is_empty());

    for p in &pods {
        p.kill();
    }
    eventually("pods unhealthy", || {
        pods.iter().all(|p| gw.pod_healthy(&p.url) == Some(false))
    })
    .await;
    let mut envoy = FakeEnvoy::connect(&gw).await;
    envoy.send(request_headers()).await;
    let _ = envoy.recv().await;
    envoy
        .send(processing_request::Request::RequestBody(body(
            CHAT.as_bytes(),
            true,
        )))
        .await;
    let processing_response::Response::ImmediateResponse(r) = envoy.recv().await else {
        panic!("expected an immediate response")
    };
    assert_eq!(r.status.unwrap().code, 503);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "no_healthy_pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_model_fleet_names_only_pods_of_the_models_and_an_unknown_model_is_404() {
    let pods = [
        FakePod::start(Behavior::Normal {
            chunks: 2,
            delay_ms: 0,
        })
        .await,
        FakePod::start_with_model(
            Behavior::Normal {
                chunks: 2,
                delay_ms: 0,
            },
            "other-model",
        )
        .await,
    ];
    let mut args = common::args(&pods.iter().collect::<Vec<_>>());
    args.ext_proc_listen = Some("127.0.0.1:0".parse().unwrap());
    let gw = Gateway::start(args).await.unwrap();
    let shared = gw.shared().clone();
    eventually("both pods' models learnt", || {
        pods.iter().all(|p| {
            gw.pod_healthy(&p.url) == Some(true)
                && shared
                    .fleet
                    .pods
                    .by_url(&p.url)
                    .is_some_and(|p| p.served_models().is_some())
        })
    })
    .await;
    for (model, pod) in [("fake-model", &pods[0]), ("other-model", &pods[1])] {
        for _ in 0..4 {
            let mut envoy = FakeEnvoy::connect(&gw).await;
            envoy.send(request_headers()).await;
            let _ = envoy.recv().await;
            let chat = CHAT.replace("fake-model", model);
            envoy
                .send(processing_request::Request::RequestBody(body(
                    chat.as_bytes(),
                    true,
                )))
                .await;
            let full = envoy.recv_full().await;
            let Some(processing_response::Response::RequestBody(b)) = &full.response else {
                panic!("expected a body answer for {model}")
            };
            let dest = destination(b.response.as_ref().unwrap(), full.dynamic_metadata.as_ref());
            assert_eq!(format!("http://{dest}"), pod.url, "{model}");
        }
    }
    let decided = gw.shared().telemetry.decisions.snapshot().len();
    let mut envoy = FakeEnvoy::connect(&gw).await;
    envoy.send(request_headers()).await;
    let _ = envoy.recv().await;
    let chat = CHAT.replace("fake-model", "no-such-model");
    envoy
        .send(processing_request::Request::RequestBody(body(
            chat.as_bytes(),
            true,
        )))
        .await;
    let processing_response::Response::ImmediateResponse(r) = envoy.recv().await else {
        panic!("expected an immediate response")
    };
    assert_eq!(r.status.unwrap().code, 404);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(gw.shared().telemetry.decisions.snapshot().len(), decided);
}

/// `metadata_context` with the subset hint `endpoints`.
fn subset_hint(endpoints: &[&str]) -> Metadata {
    use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};
    let list = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: endpoints
                .iter()
                .map(|e| Value {
                    kind: Some(Kind::StringValue(e.to_string())),
                })
                .collect(),
        })),
    };
    let hint = Struct {
        fields: [(kvgate_gateway::ext_proc::SUBSET_HINT_KEY.to_string(), list)]
            .into_iter()
            .collect(),
    };
    Metadata {
        filter_metadata: [(
            kvgate_gateway::ext_proc::SUBSET_HINT_NAMESPACE.to_string(),
            hint,
        )]
        .into_iter()
        .collect(),
        ..Default::default()
    }
}

/// One BUFFERED request with `hint` on its headers message: Ok(the routed `ip:port`) or
/// Err(the immediate response).
async fn request_with_hint(
    gw: &Gateway,
    hint: Metadata,
    prompt: &str,
) -> Result<String, ImmediateResponse> {
    let mut envoy = FakeEnvoy::connect(gw).await;
    envoy
        .send_msg(ProcessingRequest {
            request: Some(request_headers()),
            metadata_context: Some(hint),
            ..Default::default()
        })
        .await;
    let _ = envoy.recv().await;
    let chat =
        format!(r#"{{"model":"fake-model","messages":[{{"role":"user","content":"{prompt}"}}]}}"#);
    envoy
        .send(processing_request::Request::RequestBody(body(
            chat.as_bytes(),
            true,
        )))
        .await;
    let full = envoy.recv_full().await;
    match full.response {
        Some(processing_response::Response::RequestBody(b)) => Ok(destination(
            b.response.as_ref().unwrap(),
            full.dynamic_metadata.as_ref(),
        )),
        Some(processing_response::Response::ImmediateResponse(r)) => Err(r),
        other => panic!("unexpected answer {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subset_hint_restricts_the_candidates_and_an_unknown_subset_is_503() {
    let (pods, gw) = fleet().await;
    let endpoint = |i: usize| pods[i].url.trim_start_matches("http://").to_string();
    // A sequence no policy would produce unhinted (neither constant nor alternating), each
    // request hinted to one known pod and one unknown endpoint.
    for (i, want) in [1, 1, 1, 0, 0, 1].into_iter().enumerate() {
        let hint = subset_hint(&[&endpoint(want), "10.9.9.9:1"]);
        let dest = request_with_hint(&gw, hint, &format!("prompt {i}")).await;
        assert_eq!(
            dest.ok(),
            Some(endpoint(want)),
            "request {i} left its subset"
        );
    }
    for hint in [subset_hint(&["10.9.9.9:1"]), subset_hint(&[])] {
        let Err(r) = request_with_hint(&gw, hint, "anything").await else {
            panic!("expected 503 for a subset without a known pod")
        };
        assert_eq!(r.status.unwrap().code, 503);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "no_pod_in_subset");
    }
    assert_eq!(
        metric(
            &gw,
            "kvgate_rejected_requests_total{reason=\"no_pod_in_subset\"}"
        ),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_slots_and_queue_is_429_with_retry_after() {
    let (_pods, gw) = fleet_with(|a| {
        a.max_concurrent_requests = Some(1);
        a.max_waiting_requests = Some(1);
    })
    .await;
    // A holds the only slot (its headers are answered), B waits in the queue.
    let mut a = FakeEnvoy::connect(&gw).await;
    a.send(request_headers()).await;
    assert!(matches!(
        a.recv().await,
        processing_response::Response::RequestHeaders(_)
    ));
    let mut b = FakeEnvoy::connect(&gw).await;
    b.send(request_headers()).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), b.rx.message())
            .await
            .is_err(),
        "B was answered while A holds the only slot"
    );
    eventually("B queued", || gw.shared().admission.slots.queued() == 1).await;
    // C finds the slot and the queue full.
    let mut c = FakeEnvoy::connect(&gw).await;
    c.send(request_headers()).await;
    let processing_response::Response::ImmediateResponse(r) = c.recv().await else {
        panic!("expected an immediate 429")
    };
    assert_eq!(r.status.unwrap().code, 429);
    let set = r.headers.unwrap().set_headers;
    let header = |k: &str| {
        set.iter()
            .filter_map(|o| o.header.as_ref())
            .find(|h| h.key == k)
            .map(|h| String::from_utf8(h.raw_value.clone()).unwrap())
    };
    assert_eq!(header("retry-after").as_deref(), Some("1"));
    assert_eq!(header("content-type").as_deref(), Some("application/json"));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "too_many_requests");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(
        metric(
            &gw,
            "kvgate_rejected_requests_total{reason=\"too_many_requests\"}"
        ),
        1.0
    );
    // A's stream ends: its slot goes to B.
    drop(a);
    assert!(matches!(
        b.recv().await,
        processing_response::Response::RequestHeaders(_)
    ));
    assert_eq!(gw.shared().admission.slots.queued(), 0);
    // B waited ≥ 300 ms in the queue; its TTFT starts at admission, so that wait is not
    // trained on.
    b.send(processing_request::Request::RequestBody(body(
        CHAT.as_bytes(),
        true,
    )))
    .await;
    let _ = b.recv().await;
    b.send(processing_request::Request::ResponseHeaders(headers(
        &[(":status", "200"), ("content-type", "text/event-stream")],
        false,
    )))
    .await;
    let _ = b.recv().await;
    let chunk =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n";
    b.send(processing_request::Request::ResponseBody(body(
        chunk.as_bytes(),
        true,
    )))
    .await;
    let _ = b.recv().await;
    eventually("B's TTFT observed", || {
        metric(&gw, "kvgate_ttft_ms_count") == 1.0
    })
    .await;
    let ttft_ms = metric(&gw, "kvgate_ttft_ms_sum");
    assert!(ttft_ms < 250.0, "TTFT {ttft_ms} ms includes the queue wait");
}

#[tokio::test]
async fn grpc_readiness_turns_not_serving_on_shutdown() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let pod = FakePod::start(Behavior::Normal {
        chunks: 5,
        delay_ms: 100,
    })
    .await;
    let mut args = common::args(&[&pod]);
    args.ext_proc_listen = Some("127.0.0.1:0".parse().unwrap());
    let gw = Gateway::start(args).await.unwrap();
    let addr = gw.ext_proc_addr.unwrap();
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let readiness = || HealthCheckRequest {
        service: "readiness".into(),
    };
    let status = health.check(readiness()).await.unwrap().into_inner().status;
    assert_eq!(status, ServingStatus::Serving as i32);
    // A slow stream keeps the gateway in its grace period while readiness is checked.
    let stream = tokio::spawn({
        let (c, req) = (
            common::client(),
            common::post(&gw, "/v1/chat/completions", &common::chat_body("a", true)),
        );
        async move { common::send(&c, req).await }
    });
    let shared = gw.shared().clone();
    eventually("the stream is in flight", || {
        shared.admission.slots.active() == 1
    })
    .await;
    let shutdown = tokio::spawn(gw.shutdown(std::time::Duration::from_secs(5)));
    let mut status = 0;
    for _ in 0..50 {
        status = health.check(readiness()).await.unwrap().into_inner().status;
        if status == ServingStatus::NotServing as i32 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(status, ServingStatus::NotServing as i32);
    assert_eq!(stream.await.unwrap().status, http::StatusCode::OK);
    shutdown.await.unwrap();
}

#[tokio::test]
async fn shutdown_gives_ext_proc_streams_in_flight_the_grace_period() {
    let (_pods, gw) = fleet().await;
    // An Envoy stream whose request was routed and whose response is still streaming.
    let mut a = FakeEnvoy::connect(&gw).await;
    a.send(request_headers()).await;
    assert!(matches!(
        a.recv().await,
        processing_response::Response::RequestHeaders(_)
    ));
    let shared = gw.shared().clone();
    assert_eq!(shared.admission.slots.active(), 1);
    let shutdown = tokio::spawn(gw.shutdown(Duration::from_secs(5)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !shutdown.is_finished(),
        "shutdown returned while an ext_proc stream was in flight"
    );
    // The stream ends: shutdown returns well before the grace is over.
    drop(a);
    tokio::time::timeout(Duration::from_secs(2), shutdown)
        .await
        .expect("shutdown waits for the stream, not the whole grace")
        .unwrap();
    assert_eq!(shared.admission.slots.active(), 0);
}

/// Request headers with SLO headers added.
fn request_headers_with(extra: &[(&str, &str)]) -> processing_request::Request {
    let mut pairs = vec![
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-type", "application/json"),
        ("x-request-id", "envoy-slo"),
    ];
    pairs.extend_from_slice(extra);
    processing_request::Request::RequestHeaders(headers(&pairs, false))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slo_headers_route_a_policy_that_reads_them_and_a_bad_one_is_400() {
    // The llm-d chain model routes by objectives, as upstream (kvgate's gate does not).
    let (_pods, gw) = fleet_with_config("slo", "policy = \"llmd-chain\"\n").await;
    let mut envoy = FakeEnvoy::connect(&gw).await;
    envoy
        .send(request_headers_with(&[
            ("x-llm-d-slo-ttft-ms", "60000"),
            ("x-slo-tpot-ms", "1000"),
        ]))
        .await;
    let _ = envoy.recv().await;
    envoy
        .send(processing_request::Request::RequestBody(body(
            CHAT.as_bytes(),
            true,
        )))
        .await;
    let full = envoy.recv_full().await;
    assert!(matches!(
        full.response,
        Some(processing_response::Response::RequestBody(_))
    ));
    let decisions = gw.shared().telemetry.decisions.snapshot();
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].slo_ttft_ms, Some(60000.0));
    let slo = decisions[0]
        .decision
        .slo
        .expect("decided by the objectives");
    assert_eq!((slo.ttft_ms, slo.tpot_ms), (Some(60000.0), Some(1000.0)));
    assert!(slo.predicted_to_meet, "{slo:?}");

    let mut envoy = FakeEnvoy::connect(&gw).await;
    envoy
        .send(request_headers_with(&[("x-slo-ttft-ms", "-3")]))
        .await;
    let _ = envoy.recv().await;
    envoy
        .send(processing_request::Request::RequestBody(body(
            CHAT.as_bytes(),
            true,
        )))
        .await;
    assert_rejected_400(&gw, &mut envoy, "invalid_slo_header", "x-slo-ttft-ms").await;
    assert_eq!(gw.shared().telemetry.decisions.snapshot().len(), 1);
}

/// The stream's answer is a 400 with OpenAI error `code` naming `param`, counted once in
/// `kvgate_rejected_requests_total{reason=code}`.
async fn assert_rejected_400(gw: &Gateway, envoy: &mut FakeEnvoy, code: &str, param: &str) {
    let processing_response::Response::ImmediateResponse(r) = envoy.recv().await else {
        panic!("expected an immediate response")
    };
    assert_eq!(r.status.unwrap().code, 400);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], code);
    assert_eq!(v["error"]["param"], param);
    let counter = format!("kvgate_rejected_requests_total{{reason=\"{code}\"}}");
    assert_eq!(metric(gw, &counter), 1.0);
}

/// A routed stream: headers answered (BUFFERED), then the body sent; returns once the body is
/// sent (its answer is the caller's to await).
async fn routed_stream(gw: &Gateway, extra: &[(&str, &str)]) -> FakeEnvoy {
    let mut envoy = FakeEnvoy::connect(gw).await;
    envoy.send(request_headers_with(extra)).await;
    assert!(matches!(
        envoy.recv().await,
        processing_response::Response::RequestHeaders(_)
    ));
    envoy
        .send(processing_request::Request::RequestBody(body(
            CHAT.as_bytes(),
            true,
        )))
        .await;
    envoy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_holds_the_body_answer_releases_high_priority_first_and_expires_with_503() {
    let (_pods, gw) = fleet_with_config(
        "flow",
        "[flow_control]\nenabled = true\nqueue_ttl_ms = 1500\n\
         [flow_control.saturation]\nmax_in_flight_per_pod = 1\n",
    )
    .await;
    // Two streams take the two pods' only places; their responses have not ended.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = routed_stream(&gw, &[]).await;
        assert!(matches!(
            s.recv().await,
            processing_response::Response::RequestBody(_)
        ));
        held.push(s);
    }
    let mut low = routed_stream(&gw, &[("x-kvgate-tenant", "batch")]).await;
    eventually("low queued", || gw.shared().admission.flow.queued() == 1).await;
    let mut high = routed_stream(&gw, &[("x-kvgate-priority", "5")]).await;
    eventually("high queued", || gw.shared().admission.flow.queued() == 2).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), high.rx.message())
            .await
            .is_err(),
        "answered while the fleet is saturated"
    );
    // One held stream ends (Envoy resets it): its place goes to the high one, not the low one
    // queued before it.
    drop(held.pop());
    assert!(matches!(
        high.recv().await,
        processing_response::Response::RequestBody(_)
    ));
    assert_eq!(gw.shared().admission.flow.queued(), 1);
    let rec = gw
        .shared()
        .telemetry
        .decisions
        .snapshot()
        .into_iter()
        .find(|d| d.flow.as_ref().is_some_and(|f| f.priority == 5))
        .expect("the high one's decision");
    let note = rec.flow.unwrap();
    assert_eq!(note.priority, 5);
    assert!(note.queue_ms >= 200.0, "{note:?}");
    // The low one's TTL runs out: an immediate 503 with Retry-After.
    let processing_response::Response::ImmediateResponse(r) = low.recv().await else {
        panic!("expected an immediate 503")
    };
    assert_eq!(r.status.unwrap().code, 503);
    let set = r.headers.unwrap().set_headers;
    assert!(
        set.iter()
            .filter_map(|o| o.header.as_ref())
            .any(|h| h.key == "retry-after" && h.raw_value == b"1")
    );
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "flow_queue_ttl");
    assert_eq!(
        metric(
            &gw,
            "kvgate_flow_shed_total{band=\"0\",tenant=\"batch\",reason=\"flow_queue_ttl\"}"
        ),
        1.0
    );
    // A stream Envoy cancels while queued leaves the queue.
    let gone = routed_stream(&gw, &[]).await;
    eventually("queued", || gw.shared().admission.flow.queued() == 1).await;
    drop(gone);
    eventually("cancelled", || gw.shared().admission.flow.queued() == 0).await;
    assert_eq!(metric(&gw, "kvgate_flow_cancelled_total"), 1.0);
}

/// A P/D fleet's answer to one request, as the client (or Envoy) gets it: status, the pod's
/// own header, the body.
#[derive(Debug, PartialEq)]
struct PdAnswer {
    status: u16,
    pod_header: Option<String>,
    body: String,
}

async fn pd_via_proxy(gw: &Gateway) -> PdAnswer {
    let r = common::send(
        &common::client(),
        common::post(gw, "/v1/chat/completions", CHAT),
    )
    .await;
    PdAnswer {
        status: r.status.as_u16(),
        pod_header: r.header("x-pod-said"),
        body: r.text(),
    }
}

async fn pd_via_ext_proc(gw: &Gateway) -> PdAnswer {
    let mut envoy = FakeEnvoy::connect(gw).await;
    envoy.send(request_headers()).await;
    let _ = envoy.recv().await;
    envoy
        .send(processing_request::Request::RequestBody(body(
            CHAT.as_bytes(),
            true,
        )))
        .await;
    let processing_response::Response::ImmediateResponse(r) = envoy.recv().await else {
        panic!("expected an immediate response")
    };
    let set = r.headers.map(|h| h.set_headers).unwrap_or_default();
    let pod_header = set
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == "x-pod-said")
        .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned());
    PdAnswer {
        status: r.status.unwrap().code as u16,
        pod_header,
        body: String::from_utf8(r.body).unwrap(),
    }
}

/// Both transports run one dispatch, so the same P/D prefill failure gets the same answer from
/// each: a prefill pod's 4xx reaches the client as the pod sent it (status, body, its own
/// headers), as from a plain vLLM; a prefill pod that fails (5xx) with no other prefill pod
/// left is 502 `upstream_failed` naming the failure. The decode pod is never called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_p_d_prefill_failure_gets_the_same_answer_from_the_proxy_and_ext_proc() {
    let prefill = FakePod::start(Behavior::Reject400).await;
    let decode = FakePod::start(Behavior::Normal {
        chunks: 2,
        delay_ms: 0,
    })
    .await;
    let mut args = common::args(&[&prefill, &decode]);
    args.pod = vec![
        format!("{},role=prefill", prefill.url),
        format!("{},role=decode", decode.url),
    ];
    args.ext_proc_listen = Some("127.0.0.1:0".parse().unwrap());
    let gw = Gateway::start(args).await.unwrap();
    eventually("pods healthy", || {
        [&prefill, &decode]
            .iter()
            .all(|p| gw.pod_healthy(&p.url) == Some(true))
    })
    .await;

    let proxy = pd_via_proxy(&gw).await;
    assert_eq!(
        proxy,
        PdAnswer {
            status: 400,
            pod_header: Some("no".into()),
            body: common::REJECT_400_BODY.into(),
        }
    );
    assert_eq!(pd_via_ext_proc(&gw).await, proxy);

    prefill.set(Behavior::Fail500);
    let proxy = pd_via_proxy(&gw).await;
    assert_eq!(proxy.status, 502);
    let v: serde_json::Value = serde_json::from_str(&proxy.body).unwrap();
    assert_eq!(v["error"]["code"], "upstream_failed");
    assert_eq!(
        v["error"]["message"],
        format!(
            "prefill pod {} answered 500 Internal Server Error",
            prefill.url
        )
    );
    assert_eq!(pd_via_ext_proc(&gw).await, proxy);

    assert_eq!(decode.requests(), 0, "no decode after a failed prefill");
    assert_eq!(prefill.requests(), 4);
    common::assert_idle(&gw, &[&prefill, &decode]).await;
}
