//! OpenTelemetry traces (`[tracing]` in the serve config, off by default): one span per
//! completion request, with a child span for each stage the pipeline runs, exported over OTLP
//! (HTTP/protobuf) by a batch span processor on its own thread.
//!
//! ```text
//! kvgate.request (server; continues the client's `traceparent`)
//!   ├─ kvgate.flow_queue   the flow-control wait (flow control on), start back-dated by the wait
//!   ├─ kvgate.decide       one per attempt: branch, chosen pod, its prefix score and predicted
//!   │                      TTFT, the runner-up pod (least predicted TTFT of the others) and its TTFT
//!   ├─ kvgate.upstream     one per attempt (client): sent to the pod ─► its response headers;
//!   │                      the pod gets a `traceparent` naming this span, so vLLM's own spans
//!   │                      (`--otlp-traces-endpoint`) are its children
//!   └─ kvgate.stream       response headers ─► the body's end (status, time to first token)
//! ```
//!
//! Sampling is parent-based: a request whose `traceparent` says sampled (or not) is traced
//! (or not) as its caller decided; a request without one is sampled with probability
//! `sampling_ratio` (trace-id ratio, default 1.0). An unsampled request still gets non-recording
//! spans, so the pod receives a `traceparent` (flag `00`) continuing the client's trace id.
//!
//! Cost with tracing off: the request's hook checks `Shared::otel` (an `Option` that stays
//! `None`) once, and every other hook a `RequestTrace` of one null pointer; nothing is allocated or read from headers
//! (`BENCHMARKS.md` "Tracing overhead"). The client's own `traceparent` then reaches the pod
//! untouched, as every other end-to-end header does.
//!
//! Bounds: the batch processor's queue holds at most [`MAX_QUEUED_SPANS`] ended spans (a span
//! is a few hundred bytes with its ≤ 10 attributes); beyond, spans are dropped (the SDK counts
//! them in its shutdown log), and requests never wait for the exporter. Exports go out every
//! [`EXPORT_DELAY`] in batches of ≤ [`EXPORT_BATCH_SPANS`], each with a 10 s timeout.

use crate::config::TracingConfig;
use http::HeaderMap;
use kvgate_core::Decision;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Span, SpanKind, Status, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Ended spans held for export at most; more are dropped.
pub const MAX_QUEUED_SPANS: usize = 2048;
/// Spans per OTLP export request at most.
pub const EXPORT_BATCH_SPANS: usize = 512;
/// How often the queue is exported.
pub const EXPORT_DELAY: Duration = Duration::from_secs(1);
/// An export request's timeout.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The gateway's tracer (`Shared::otel`, set at start when `[tracing]` names an endpoint).
pub struct Tracing {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
}

impl Tracing {
    /// The exporter, the batch processor and the parent-based ratio sampler for `cfg`.
    pub fn start(cfg: &TracingConfig, endpoint: &str) -> Result<Tracing, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("OTLP exporter for {endpoint}: {e}"))?;
        // Set here, so OTEL_BSP_* environment variables cannot lift the documented bound.
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(MAX_QUEUED_SPANS)
            .with_max_export_batch_size(EXPORT_BATCH_SPANS)
            .with_scheduled_delay(EXPORT_DELAY)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        let sampler =
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(cfg.sampling_ratio)));
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(cfg.service_name.clone())
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        Ok(Tracing {
            tracer: provider.tracer("kvgate"),
            provider,
        })
    }

    /// Exports what is queued and stops the processor's thread (at shutdown; blocking, so on
    /// the blocking pool: the blocking HTTP client must not be dropped on a runtime thread).
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        let done = tokio::task::spawn_blocking(move || {
            provider.shutdown_with_timeout(Duration::from_secs(5))
        })
        .await;
        if let Ok(Err(e)) = done {
            tracing::warn!(error = %e, "OpenTelemetry exporter shutdown");
        }
    }
}

/// One request's trace: its request span's context and the tracer; empty (one null pointer)
/// with tracing off. Clones share the request span, which ends when the last clone is dropped
/// (the transport's, or the response body's at its end).
#[derive(Clone, Default)]
pub(crate) struct RequestTrace(Option<Arc<Traced>>);

impl std::fmt::Debug for RequestTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.trace_id() {
            Some(id) => write!(f, "RequestTrace({id})"),
            None => f.write_str("RequestTrace(off)"),
        }
    }
}

struct Traced {
    tracer: SdkTracer,
    cx: Context,
    /// The request span is sampled. When not, no child span is made (they would not be
    /// sampled either) and the pod's `traceparent` names the request span.
    recording: bool,
}

/// `http::HeaderMap` as the propagator reads and writes it.
struct Headers<'a>(&'a HeaderMap);
struct HeadersMut<'a>(&'a mut HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// W3C `traceparent` / `tracestate` (a unit struct: free to make).
fn propagator() -> TraceContextPropagator {
    TraceContextPropagator::new()
}

impl RequestTrace {
    /// The request span of a completion request that arrived with `headers` (its
    /// `traceparent` continued); empty when tracing is off.
    pub(crate) fn start(
        tracing: Option<&Tracing>,
        headers: &HeaderMap,
        path: &str,
        request_id: &str,
    ) -> RequestTrace {
        let Some(t) = tracing else {
            return RequestTrace(None);
        };
        let parent = propagator().extract(&Headers(headers));
        let mut span = t
            .tracer
            .span_builder("kvgate.request")
            .with_kind(SpanKind::Server)
            .start_with_context(&t.tracer, &parent);
        // Attributes only for a sampled request: an unsampled one costs no string copies.
        let recording = span.is_recording();
        if recording {
            span.set_attributes([
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("url.path", path.to_string()),
                KeyValue::new("kvgate.request_id", request_id.to_string()),
            ]);
        }
        RequestTrace(Some(Arc::new(Traced {
            tracer: t.tracer.clone(),
            cx: parent.with_span(span),
            recording,
        })))
    }

    /// The recording request's trace.
    fn recording(&self) -> Option<&Traced> {
        self.0.as_deref().filter(|t| t.recording)
    }

    fn child(&self, name: &'static str, kind: SpanKind) -> Option<(Context, &SdkTracer)> {
        let t = self.recording()?;
        let span = t
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .start_with_context(&t.tracer, &t.cx);
        Some((t.cx.with_span(span), &t.tracer))
    }

    /// The flow-control wait that just ended after `queued` (a span back-dated by it), with
    /// the request's priority and tenant; nothing with flow control off.
    pub(crate) fn flow_queue(
        &self,
        flow: &kvgate_core::flow::FlowConfig,
        priority: i32,
        tenant: &str,
        queued: Duration,
    ) {
        let Some(t) = self.recording() else { return };
        if !flow.enabled {
            return;
        }
        let now = SystemTime::now();
        let mut span = t
            .tracer
            .span_builder("kvgate.flow_queue")
            .with_start_time(now.checked_sub(queued).unwrap_or(now))
            .with_attributes([
                KeyValue::new("kvgate.queue_ms", queued.as_secs_f64() * 1e3),
                KeyValue::new("kvgate.priority", i64::from(priority)),
                KeyValue::new("kvgate.tenant", tenant.to_string()),
            ])
            .start_with_context(&t.tracer, &t.cx);
        span.end_with_timestamp(now);
    }

    /// The span of one decision (attempt `attempt`), ended when dropped.
    pub(crate) fn decide(&self, attempt: u32) -> StageSpan {
        let Some((cx, _)) = self.child("kvgate.decide", SpanKind::Internal) else {
            return StageSpan(None);
        };
        cx.span()
            .set_attribute(KeyValue::new("kvgate.attempt", i64::from(attempt)));
        StageSpan(Some(cx))
    }

    /// The span of one call to `pod_url`, to its response headers; `headers` (the request the
    /// pod gets) carry its `traceparent` (and the client's `tracestate`).
    pub(crate) fn upstream(&self, pod_url: &str, headers: &mut HeaderMap) -> StageSpan {
        let Some((cx, _)) = self.child("kvgate.upstream", SpanKind::Client) else {
            // Not sampled: the pod still continues the trace id (flag 00) under the request
            // span; tracing off: the client's headers as they came.
            if let Some(t) = self.0.as_deref() {
                propagator().inject_context(&t.cx, &mut HeadersMut(headers));
            }
            return StageSpan(None);
        };
        cx.span()
            .set_attribute(KeyValue::new("server.address", pod_url.to_string()));
        propagator().inject_context(&cx, &mut HeadersMut(headers));
        StageSpan(Some(cx))
    }

    /// The span of the response body, from now to its end ([`StageSpan::stream_end`]).
    pub(crate) fn stream(&self) -> StageSpan {
        StageSpan(
            self.child("kvgate.stream", SpanKind::Internal)
                .map(|(cx, _)| cx),
        )
    }

    /// The request's answer, its status recorded on the request span.
    pub(crate) fn answered<B>(&self, resp: http::Response<B>) -> http::Response<B> {
        self.responded(resp.status());
        resp
    }

    /// The answer's status, recorded on the request span (ext_proc sees only the status).
    pub(crate) fn responded(&self, status: http::StatusCode) {
        let Some(t) = self.recording() else { return };
        let span = t.cx.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status.as_u16()),
        ));
        if status.is_server_error() {
            span.set_status(Status::error(status.to_string()));
        }
    }

    /// The request's trace id as 32 hex digits (tests and logs), if traced.
    pub(crate) fn trace_id(&self) -> Option<String> {
        let t = self.0.as_deref()?;
        Some(t.cx.span().span_context().trace_id().to_string())
    }
}

/// A stage's span (decision, upstream call, stream); ends when dropped. Empty with tracing off.
#[derive(Default)]
pub(crate) struct StageSpan(Option<Context>);

impl StageSpan {
    /// A routed decision's explanation: the branch, the chosen pod with its prefix score and
    /// predicted TTFT, and the runner-up (the other pod with the least predicted TTFT).
    pub(crate) fn decided(&self, decision: &Decision, pod_url: &str, policy: &'static str) {
        let Some(cx) = &self.0 else { return };
        let span = cx.span();
        span.set_attribute(KeyValue::new("kvgate.policy", policy));
        span.set_attribute(KeyValue::new("kvgate.branch", decision.branch.as_str()));
        span.set_attribute(KeyValue::new("kvgate.pod", pod_url.to_string()));
        span.set_attribute(KeyValue::new(
            "kvgate.candidates",
            decision.pods.len() as i64,
        ));
        if let Some(p) = decision.pods.iter().find(|p| p.id == decision.pod) {
            span.set_attribute(KeyValue::new("kvgate.pod.prefix_score", p.prefix_score));
            span.set_attribute(KeyValue::new(
                "kvgate.pod.predicted_ttft_ms",
                p.predicted_ttft_ms,
            ));
        }
        let runner_up = decision
            .pods
            .iter()
            .filter(|p| p.id != decision.pod)
            .min_by(|a, b| a.predicted_ttft_ms.total_cmp(&b.predicted_ttft_ms));
        if let Some(r) = runner_up {
            span.set_attribute(KeyValue::new("kvgate.runner_up", r.id.to_string()));
            span.set_attribute(KeyValue::new(
                "kvgate.runner_up.predicted_ttft_ms",
                r.predicted_ttft_ms,
            ));
            span.set_attribute(KeyValue::new(
                "kvgate.runner_up.prefix_score",
                r.prefix_score,
            ));
        }
        if let Some(d) = &decision.decode {
            span.set_attribute(KeyValue::new("kvgate.decode_pod", d.pod.to_string()));
        }
    }

    /// No decision: why (`no_healthy_pod`, `no_decision`).
    pub(crate) fn undecided(&self, why: &'static str) {
        let Some(cx) = &self.0 else { return };
        cx.span().set_status(Status::error(why));
    }

    /// How the call went (`outcome` is asked only when traced): the pod's response status, or
    /// why no response came.
    pub(crate) fn sent(&self, outcome: impl FnOnce() -> Result<http::StatusCode, String>) {
        if self.0.is_none() {
            return;
        }
        match outcome() {
            Ok(status) => self.answered(status),
            Err(why) => self.failed(&why),
        }
    }

    /// The pod's response headers: their status.
    pub(crate) fn answered(&self, status: http::StatusCode) {
        let Some(cx) = &self.0 else { return };
        let span = cx.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status.as_u16()),
        ));
        if status.is_server_error() {
            span.set_status(Status::error(status.to_string()));
        }
    }

    /// The attempt failed before any byte reached the client.
    pub(crate) fn failed(&self, why: &str) {
        let Some(cx) = &self.0 else { return };
        cx.span().set_status(Status::error(why.to_string()));
    }

    /// The body's end: how it ended (`body.rs`'s status names) and its time to first token.
    pub(crate) fn stream_end(&self, status: &'static str, ttft: Option<Duration>) {
        let Some(cx) = &self.0 else { return };
        let span = cx.span();
        span.set_attribute(KeyValue::new("kvgate.status", status));
        if let Some(t) = ttft {
            span.set_attribute(KeyValue::new("kvgate.ttft_ms", t.as_secs_f64() * 1e3));
        }
        if status != "ok" {
            span.set_status(Status::error(status));
        }
    }
}

impl Drop for StageSpan {
    fn drop(&mut self) {
        if let Some(cx) = &self.0 {
            cx.span().end();
        }
    }
}

/// The stream span with the request's trace, kept by the response body ([`crate::body::Tracker`]):
/// both end with the body.
#[derive(Default)]
pub struct BodyTrace {
    pub(crate) stream: StageSpan,
    /// Held so that the request span ends with the body, not before.
    _request: RequestTrace,
}

impl BodyTrace {
    /// The stream span of `request`, begun now.
    pub(crate) fn begin(request: &RequestTrace) -> BodyTrace {
        if request.recording().is_none() {
            return BodyTrace::default();
        }
        BodyTrace {
            stream: request.stream(),
            _request: request.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_core::decision::{Branch, PodExplanation};
    use opentelemetry::Value;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SpanData};

    /// A tracer exporting to memory, sampling requests without a parent at `ratio`.
    fn tracing(ratio: f64) -> (Tracing, InMemorySpanExporter) {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                ratio,
            ))))
            .build();
        let t = Tracing {
            tracer: provider.tracer("kvgate"),
            provider,
        };
        (t, exporter)
    }

    fn headers(traceparent: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(tp) = traceparent {
            h.insert("traceparent", tp.parse().unwrap());
        }
        h
    }

    /// The traceparent a pod would get: (trace id, parent id, flags).
    fn pod_traceparent(trace: &RequestTrace) -> (String, String, String) {
        let mut h = HeaderMap::new();
        drop(trace.upstream("http://pod", &mut h));
        let tp = h
            .get("traceparent")
            .expect("a traceparent")
            .to_str()
            .unwrap();
        let p: Vec<&str> = tp.split('-').collect();
        (p[1].to_string(), p[2].to_string(), p[3].to_string())
    }

    fn attr(span: &SpanData, key: &str) -> Option<Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
    }

    const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7";

    #[test]
    fn tracing_off_adds_no_header_and_leaves_the_clients_traceparent() {
        let trace =
            RequestTrace::start(None, &headers(Some(&format!("{CLIENT}-01"))), "/v1/x", "r");
        let mut h = headers(Some(&format!("{CLIENT}-01")));
        let span = trace.upstream("http://pod", &mut h);
        assert!(span.0.is_none());
        assert_eq!(h.len(), 1);
        assert_eq!(h["traceparent"], format!("{CLIENT}-01").as_str());
        assert!(trace.trace_id().is_none());
    }

    #[test]
    fn a_sampled_parent_is_continued_and_the_pod_gets_the_upstream_span() {
        let (t, exporter) = tracing(0.0);
        let trace = RequestTrace::start(
            Some(&t),
            &headers(Some(&format!("{CLIENT}-01"))),
            "/v1/x",
            "r",
        );
        let (trace_id, parent, flags) = pod_traceparent(&trace);
        assert_eq!(trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(flags, "01", "the caller sampled it: traced despite ratio 0");
        drop(trace);
        let spans = exporter.get_finished_spans().unwrap();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["kvgate.upstream", "kvgate.request"]);
        assert_eq!(spans[0].span_context.span_id().to_string(), parent);
        assert_eq!(spans[1].parent_span_id.to_string(), "00f067aa0ba902b7");
        assert_eq!(spans[0].parent_span_id, spans[1].span_context.span_id());
    }

    #[test]
    fn an_unsampled_request_exports_nothing_yet_the_pod_continues_its_trace_id() {
        let (t, exporter) = tracing(1.0);
        // The caller said not sampled: followed although the ratio is 1.
        let trace = RequestTrace::start(
            Some(&t),
            &headers(Some(&format!("{CLIENT}-00"))),
            "/v1/x",
            "r",
        );
        let (trace_id, _, flags) = pod_traceparent(&trace);
        assert_eq!(trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(flags, "00");
        drop(trace.decide(0));
        drop(BodyTrace::begin(&trace));
        drop(trace);
        // No parent and ratio 0: a new trace id, not sampled.
        let (t0, exporter0) = tracing(0.0);
        let trace = RequestTrace::start(Some(&t0), &headers(None), "/v1/x", "r");
        let (trace_id, _, flags) = pod_traceparent(&trace);
        assert_eq!((trace_id.len(), flags.as_str()), (32, "00"));
        assert_ne!(trace_id, "0".repeat(32));
        drop(trace);
        assert!(exporter.get_finished_spans().unwrap().is_empty());
        assert!(exporter0.get_finished_spans().unwrap().is_empty());
    }

    #[test]
    fn the_decision_span_names_the_pick_and_the_runner_up_with_the_least_predicted_ttft() {
        let (t, exporter) = tracing(1.0);
        let trace = RequestTrace::start(Some(&t), &headers(None), "/v1/chat/completions", "r");
        let pod = |id: &str, score: f64, ttft: f64| PodExplanation {
            id: id.into(),
            prefix_score: score,
            predicted_ttft_ms: ttft,
            predicted_tpot_ms: 10.0,
            eligible: true,
            adapter: Default::default(),
            adapter_cost_ms: 0.0,
            pending_blocks: 0,
            prefilling_blocks: 0,
        };
        let decision = Decision {
            pod: "a".into(),
            pod_id: kvgate_core::PodId(0),
            branch: Branch::Exploit,
            pods: vec![
                pod("a", 0.9, 40.0),
                pod("b", 0.1, 30.0),
                pod("c", 0.5, 35.0),
            ],
            slo: None,
            decode: None,
        };
        let span = trace.decide(1);
        span.decided(&decision, "http://a:8000", "affinity-gate");
        drop(span);
        drop(trace);
        let spans = exporter.get_finished_spans().unwrap();
        let d = spans.iter().find(|s| s.name == "kvgate.decide").unwrap();
        assert_eq!(attr(d, "kvgate.branch"), Some(Value::from("exploit")));
        assert_eq!(attr(d, "kvgate.pod"), Some(Value::from("http://a:8000")));
        assert_eq!(attr(d, "kvgate.pod.prefix_score"), Some(Value::F64(0.9)));
        assert_eq!(
            attr(d, "kvgate.pod.predicted_ttft_ms"),
            Some(Value::F64(40.0))
        );
        assert_eq!(attr(d, "kvgate.runner_up"), Some(Value::from("b")));
        assert_eq!(
            attr(d, "kvgate.runner_up.predicted_ttft_ms"),
            Some(Value::F64(30.0))
        );
        assert_eq!(attr(d, "kvgate.attempt"), Some(Value::I64(1)));
        assert_eq!(attr(d, "kvgate.candidates"), Some(Value::I64(3)));
        let r = spans.iter().find(|s| s.name == "kvgate.request").unwrap();
        assert_eq!(d.parent_span_id, r.span_context.span_id());
        assert_eq!(
            attr(r, "url.path"),
            Some(Value::from("/v1/chat/completions"))
        );
    }
}
