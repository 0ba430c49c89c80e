//! `--ext-proc-listen ADDR`: kvgate as an Envoy endpoint picker — the gRPC service
//! `envoy.service.ext_proc.v3.ExternalProcessor/Process` as the Gateway API Inference Extension
//! (GAIE) endpoint-picker protocol uses it. One gRPC stream per HTTP request:
//!
//! 1. **Request headers.** `:path`, `:method`, `x-request-id`, SLO headers are kept. A request
//!    without a body: `POST` completions get 400; anything else goes to the least-loaded healthy
//!    pod (as the HTTP gateway's pass-through), answered at once.
//! 2. **Request body.** Accumulated up to the gateway's `max_body_bytes` (32 MiB; 413 beyond),
//!    prepared and routed by the request pipeline the HTTP proxy runs too ([`crate::pipeline`]:
//!    parsed, objectives read, blocks cut, the same limits — 400 with an OpenAI-style error
//!    body when invalid, 400 `context_length_exceeded` over `max_prompt_tokens`; `--capture`
//!    records it —, the flow turn, then [`crate::pipeline::dispatch`]: the same core session,
//!    state and in-flight accounting). The answer names the pod as `ip:port` in the header
//!    `x-gateway-destination-endpoint` (a header mutation, `clear_route_cache: true`) and in
//!    dynamic metadata `envoy.lb` / `x-gateway-destination-endpoint`. 503 (immediate response)
//!    when no pod is healthy.
//!    - **P/D** (a fleet with `prefill` / `decode` pods, [`crate::pd`]): the dispatch makes
//!      the prefill call (a failed one excludes its pod and routes again, up to `max_retries`
//!      within the retry budget; a prefill 4xx is the client's answer, the pod's status,
//!      headers and body in an immediate response, as the HTTP proxy passes it), then names
//!      the decode pod and
//!      replaces the body with the client's request carrying the prefill's
//!      `kv_transfer_params`, `content-length` set to its length (in BUFFERED mode that is the
//!      processor's job). A decode pod's failure is Envoy's (no fresh prefill here).
//!    - `BUFFERED` body mode (what `deploy/envoy/envoy.yaml` uses): Envoy waits for the headers
//!      answer before it sends the body, so the headers get an empty `CONTINUE` and the body
//!      answer carries the mutation (Envoy has not forwarded the headers yet).
//!    - `FULL_DUPLEX_STREAMED` (announced in `protocol_config`): the headers answer is deferred
//!      until the body is complete, then sent with the mutation, followed by the body echoed in
//!      `streamed_response` chunks of at most 62,000 bytes, the last with `end_of_stream`.
//! 3. **Response headers and body** (`response_body_mode: STREAMED` or `BUFFERED`): passed
//!    through unchanged. What is measured, from kvgate's point of view: the request starts when
//!    its headers reach kvgate and it holds an admission slot (time queued in kvgate is not the
//!    pod's); the first token is the first SSE event with content in a response body chunk
//!    (non-stream: the first body chunk); the end is the body chunk with `end_of_stream`. TTFT
//!    includes Envoy's buffering of the request body and the pod's queueing, like the HTTP
//!    gateway's. TPOT uses the stream's `usage` when the client asked
//!    for it; otherwise the count of content events (kvgate does not rewrite bodies here, so it
//!    cannot ask the pod for usage). Only 2xx streams train the predictor, as in the HTTP
//!    gateway. The request's in-flight share is released when the response ends, or when the
//!    gRPC stream ends early (counted as `client_abort`).
//!
//! **Subset hint.** When the request's `metadata_context.filter_metadata` holds
//! `envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset` (a list of `ip:port`
//! strings; a comma-separated string is accepted too), only pods whose `ip:port` is in that list
//! are candidates. A hint that names no healthy pod (or an empty list) gets 503
//! `no_pod_in_subset`, as the endpoint-picker protocol requires. Without the key every pod is a
//! candidate.
//!
//! **Admission.** On its request headers a request takes a slot of the gateway's
//! [`crate::limits::Admission`] (the same slots and queue as the HTTP listener,
//! `max_concurrent_requests` 1024 / `max_waiting_requests` 1024), waiting in the queue if needed;
//! with both full it gets an immediate 429 with `retry-after: 1` and an OpenAI-style
//! `too_many_requests` body (counted in `kvgate_rejected_requests{reason="too_many_requests"}`).
//! The slot is held until the response ends or the gRPC stream ends; a stream Envoy cancels
//! while queued gives its place back. Envoy's `message_timeout` (5 s in `deploy/envoy`) bounds
//! how long Envoy waits for a queued request's answer.
//!
//! **Flow control** (`[flow_control]`, off by default; [`crate::flow`]): after the body is
//! prepared, the request waits for its turn as in the HTTP proxy; the body answer is held
//! meanwhile, a stream Envoy cancels leaves the queue, and refusals are immediate responses
//! (429 / 503 with `retry-after: 1`). Its queue time is part of the TTFT kvgate reports.
//!
//! Pods must be configured with IP-literal URLs (`http://10.0.0.5:8000`): Envoy's
//! `ORIGINAL_DST` cluster connects to the address kvgate names.
//!
//! This module is the stream's state machine (`Exchange`: admit, run the pipeline, observe
//! the response) and the pipeline's transport (`ToEnvoy`: the target is named, not sent);
//! reading Envoy's messages and building every answer is `protocol`'s.
//!
//! Bounds: one request body per stream up to `max_body_bytes`; SSE events inspected ≤ 1 MiB
//! (the scanner's bound); the subset hint as Envoy sent it (within gRPC's 4 MiB message limit);
//! nothing else is kept per stream.

mod protocol;

pub use protocol::{
    DESTINATION_HEADER, LB_NAMESPACE, MAX_STREAMED_CHUNK, SUBSET_HINT_KEY, SUBSET_HINT_NAMESPACE,
    destination, subset_hint,
};

use crate::body::Tracker;
use crate::errors::ApiError;
use crate::lifecycle::TicketGuard;
use crate::metrics::Status;
use crate::otel::{RequestTrace, StageSpan};
use crate::pipeline::{Deliver, Delivery, Dispatch, DispatchError, Target};
use crate::pods::Pod;
use crate::sse::{SseScanner, Usage, usage_of_response};
use crate::state::Shared;
use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyResponse, HeadersResponse, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
    processing_request, processing_response,
};
use http::{HeaderMap, HeaderName, StatusCode};
use kvgate_core::PodId;
use kvgate_core::request::RequestError;
use protocol::{
    answer, immediate, pod_answer, raw_value, response_head, routed_body, routed_body_replaced,
    routed_headers, routed_headers_with_length, streamed_body,
};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status as GrpcStatus, Streaming};

/// The ext_proc service; one task per gRPC stream.
#[derive(Clone)]
pub struct ExtProc {
    shared: Arc<Shared>,
}

impl ExtProc {
    pub fn new(shared: Arc<Shared>) -> Self {
        ExtProc { shared }
    }

    pub fn into_server(self) -> ExternalProcessorServer<ExtProc> {
        ExternalProcessorServer::new(self)
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, GrpcStatus>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for ExtProc {
    type ProcessStream = ResponseStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, GrpcStatus> {
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(32);
        tokio::spawn(run_stream(self.shared.clone(), inbound, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Serves the ext_proc service (and gRPC health: `""`, `liveness`, `readiness` and the
/// ext_proc service name) on `listener` until the task is aborted. When `stop` turns true
/// (graceful shutdown: the drain begins), `""` and `readiness` report NOT_SERVING, so Envoy stops
/// sending.
pub async fn serve(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<ExternalProcessorServer<ExtProc>>()
        .await;
    for name in ["", "liveness", "readiness"] {
        reporter
            .set_service_status(name, tonic_health::ServingStatus::Serving)
            .await;
    }
    tokio::spawn(async move {
        if stop.wait_for(|s| *s).await.is_ok() {
            for name in ["", "readiness"] {
                reporter
                    .set_service_status(name, tonic_health::ServingStatus::NotServing)
                    .await;
            }
        }
    });
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    if let Err(e) = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(health)
        .add_service(ExtProc::new(shared).into_server())
        .serve_with_incoming(incoming)
        .await
    {
        tracing::error!(error = %e, "ext_proc listener stopped");
    }
}

/// One HTTP request's exchange with Envoy.
struct Exchange {
    shared: Arc<Shared>,
    start: Instant,
    request_id: String,
    headers: HeaderMap,
    path: String,
    method: String,
    /// Envoy announced FULL_DUPLEX_STREAMED request bodies.
    duplex: bool,
    /// The data plane's subset hint (`None`: no hint, every pod is a candidate).
    subset: Option<Vec<String>>,
    /// Our sender of answers: closed when Envoy cancels the stream (ends a queue wait).
    answers: mpsc::Sender<Result<ProcessingResponse, GrpcStatus>>,
    body: BytesMut,
    /// Set once the request is routed; ends the request when the response ends.
    tracker: Option<Tracker>,
    stream: bool,
    scanner: Option<SseScanner>,
    content_events: u64,
    whole: BytesMut,
    /// The request's trace and its `kvgate.upstream` span (named to Envoy ─► response
    /// headers); empty with tracing off ([`crate::otel`]).
    trace: RequestTrace,
    upstream: StageSpan,
    /// The request's admission slot, held until its response ends. Declared last: fields drop
    /// in order, so an exchange Envoy cancels ends its spans before its slot goes.
    slot: Option<crate::limits::Slot>,
}

enum Outcome {
    /// Answers to send; keep going.
    Send(Vec<ProcessingResponse>),
    /// An immediate response; the exchange is over.
    Done(Box<ProcessingResponse>),
}

async fn run_stream(
    shared: Arc<Shared>,
    mut inbound: Streaming<ProcessingRequest>,
    tx: mpsc::Sender<Result<ProcessingResponse, GrpcStatus>>,
) {
    let mut ex = Exchange {
        shared,
        start: Instant::now(),
        request_id: String::new(),
        headers: HeaderMap::new(),
        path: String::new(),
        method: String::new(),
        duplex: false,
        subset: None,
        slot: None,
        answers: tx.clone(),
        body: BytesMut::new(),
        tracker: None,
        stream: false,
        scanner: None,
        content_events: 0,
        whole: BytesMut::new(),
        trace: RequestTrace::default(),
        upstream: StageSpan::default(),
    };
    loop {
        let msg = match inbound.message().await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, "ext_proc stream ended with an error");
                break;
            }
        };
        let outcome = ex.handle(msg).await;
        let (answers, done) = match outcome {
            Outcome::Send(a) => (a, false),
            Outcome::Done(a) => (vec![*a], true),
        };
        for a in answers {
            if tx.send(Ok(a)).await.is_err() {
                break;
            }
        }
        if done {
            break;
        }
    }
    // The stream ended before the response did: Envoy reset it or the client went away.
    if let Some(t) = ex.tracker.take() {
        t.finish(Status::ClientAbort, None);
    }
}

impl Exchange {
    async fn handle(&mut self, msg: ProcessingRequest) -> Outcome {
        if let Some(pc) = &msg.protocol_config {
            self.duplex = pc.request_body_mode == BodySendMode::FullDuplexStreamed as i32;
        }
        if self.subset.is_none()
            && let Some(md) = &msg.metadata_context
        {
            self.subset = subset_hint(md);
        }
        use processing_request::Request as R;
        match msg.request {
            Some(R::RequestHeaders(h)) => self.request_headers(h).await,
            Some(R::RequestBody(b)) => self.request_body(b).await,
            Some(R::RequestTrailers(_)) => Outcome::Send(vec![answer(
                processing_response::Response::RequestTrailers(Default::default()),
            )]),
            Some(R::ResponseHeaders(h)) => self.response_headers(h),
            Some(R::ResponseBody(b)) => self.response_body(b),
            Some(R::ResponseTrailers(_)) => {
                self.finish_response();
                Outcome::Send(vec![answer(
                    processing_response::Response::ResponseTrailers(Default::default()),
                )])
            }
            None => Outcome::Send(Vec::new()),
        }
    }

    fn reject(&self, err: ApiError) -> Outcome {
        crate::reject::log_reject(&self.shared.telemetry, &err, &self.request_id);
        Outcome::Done(Box::new(immediate(&err, &self.request_id)))
    }

    /// Ids of the pods the subset hint rules out (none without a hint).
    fn outside_subset(&self) -> Vec<PodId> {
        match &self.subset {
            None => Vec::new(),
            Some(subset) => pods_outside(&self.shared.fleet.pods.all(), subset),
        }
    }

    /// 503 for "no pod": `no_pod_in_subset` under a subset hint, else `no_healthy_pod`.
    fn no_pod(&self) -> ApiError {
        match &self.subset {
            Some(subset) => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "service_unavailable",
                code: "no_pod_in_subset",
                message: format!(
                    "none of the {} endpoints in the subset hint is a healthy pod",
                    subset.len()
                ),
                param: None,
            },
            None => crate::errors::no_healthy_pod(),
        }
    }

    /// A slot of the gateway's admission (waiting in its queue), unless Envoy cancels the
    /// stream meanwhile (None, and nothing to answer) or both are full (Err: 429).
    async fn admit(&mut self) -> Result<Option<()>, ApiError> {
        let answers = self.answers.clone();
        tokio::select! {
            slot = self.shared.admission.slots.admit() => match slot {
                Some(slot) => {
                    self.slot = Some(slot);
                    Ok(Some(()))
                }
                None => Err(crate::limits::too_many_requests(&self.shared.admission.slots)),
            },
            _ = answers.closed() => Ok(None),
        }
    }

    async fn request_headers(&mut self, h: HttpHeaders) -> Outcome {
        for hv in h.headers.iter().flat_map(|m| m.headers.iter()) {
            let raw = raw_value(hv);
            match hv.key.as_str() {
                ":path" => self.path = String::from_utf8_lossy(raw).into_owned(),
                ":method" => self.method = String::from_utf8_lossy(raw).into_owned(),
                key => {
                    if let (Ok(name), Ok(value)) = (
                        HeaderName::from_bytes(key.as_bytes()),
                        http::HeaderValue::from_bytes(raw),
                    ) {
                        self.headers.append(name, value);
                    }
                }
            }
        }
        self.request_id = crate::request_id::request_id(&self.headers);
        let otel = self.shared.telemetry.otel.as_ref();
        self.trace = RequestTrace::start(otel, &self.headers, &self.path, &self.request_id);
        if self.slot.is_none() {
            match self.admit().await {
                Ok(Some(())) => {}
                Ok(None) => return Outcome::Send(Vec::new()),
                Err(too_many) => return self.reject(too_many),
            }
        }
        // The clock starts once admitted, as in the HTTP gateway: queueing in kvgate is not
        // the pod's latency and must not train the predictor.
        self.start = Instant::now();
        if !h.end_of_stream {
            if self.duplex {
                // Answered with the decision once the body is complete.
                return Outcome::Send(Vec::new());
            }
            return Outcome::Send(vec![answer(processing_response::Response::RequestHeaders(
                HeadersResponse::default(),
            ))]);
        }
        if self.is_completions() {
            return self.reject(request_error(RequestError::InvalidJson(
                "the request has no body".into(),
            )));
        }
        // No body and not a completion: the least-loaded healthy pod, not trained on.
        let outside = self.outside_subset();
        let Some((pod, guard)) = crate::routing::least_loaded(&self.shared, &outside) else {
            return self.reject(self.no_pod());
        };
        let Some(dest) = destination(&pod) else {
            return self.reject(bad_pod_url(&pod));
        };
        self.tracker = Some(self.tracker_for(guard, "least-loaded", "passthrough", 0, false));
        Outcome::Send(vec![routed_headers(&dest)])
    }

    fn is_completions(&self) -> bool {
        let path = self.path.split('?').next().unwrap_or("");
        path == "/v1/chat/completions" || path == "/v1/completions"
    }

    fn tracker_for(
        &self,
        guard: TicketGuard,
        policy: &'static str,
        branch: &'static str,
        prompt_tokens: u64,
        trainable: bool,
    ) -> Tracker {
        Tracker {
            shared: self.shared.clone(),
            guard,
            start: self.start,
            before_dispatch: std::time::Duration::ZERO,
            first_token_at: None,
            prompt_tokens,
            policy,
            branch,
            request_id: self.request_id.clone(),
            trainable,
            stream: false,
            error_status: false,
            capture: None,
            retry: None,
            trace: Default::default(),
        }
    }

    async fn request_body(&mut self, b: HttpBody) -> Outcome {
        if self.tracker.is_some() {
            // Already routed (a body after a decision: pass it through).
            return Outcome::Send(vec![answer(processing_response::Response::RequestBody(
                BodyResponse::default(),
            ))]);
        }
        let limit = self.shared.config().max_body_bytes;
        if self.body.len().saturating_add(b.body.len()) > limit {
            return self.reject(ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                kind: "invalid_request_error",
                code: "body_too_large",
                message: format!("request body exceeds {limit} bytes"),
                param: None,
            });
        }
        self.body.extend_from_slice(&b.body);
        if !b.end_of_stream && self.duplex {
            // More chunks to come; nothing is answered until the decision.
            return Outcome::Send(Vec::new());
        }
        // BUFFERED mode sends the whole body in one message.
        self.route_body().await
    }

    async fn route_body(&mut self) -> Outcome {
        let body = std::mem::take(&mut self.body).freeze();
        if !self.is_completions() {
            return self.reject(ApiError {
                status: StatusCode::NOT_FOUND,
                kind: "invalid_request_error",
                code: "not_found",
                message: format!("no route for {} {}", self.method, self.path),
                param: None,
            });
        }
        let path = self.path.split('?').next().unwrap_or("").to_string();
        let cfg = self.shared.config().clone();
        // Prepare, class and price the request, then its flow turn (at once with flow control
        // off): the same pipeline as the HTTP proxy's. Envoy cancelling the stream meanwhile
        // gives the place back.
        let deadline = tokio::time::Instant::from_std(self.start) + cfg.request_timeout;
        let answers = self.answers.clone();
        let ready = tokio::select! {
            r = crate::pipeline::ready(
                &self.shared,
                &cfg,
                &path,
                &body,
                &self.headers,
                deadline,
                self.slot.as_ref(),
            ) => r,
            _ = answers.closed() => return Outcome::Send(Vec::new()),
        };
        let crate::pipeline::Ready {
            mut prepared,
            turn,
            class,
        } = match ready {
            Ok(r) => r,
            Err(e) => return self.reject(e),
        };
        let (priority, tenant) = (class.priority, &class.tenant);
        self.trace
            .flow_queue(&cfg.flow, priority, tenant, turn.queued);
        // Decide (a P/D request's prefill call made here), the same dispatch as the HTTP
        // proxy's; Envoy sends the request to the target.
        let method = http::Method::from_bytes(self.method.as_bytes()).unwrap_or(http::Method::POST);
        let dispatch = Dispatch {
            shared: &self.shared,
            cfg: &cfg,
            request: prepared.route_request(),
            request_id: &self.request_id,
            turn,
            excluded: self.outside_subset(),
            split: Some(&body),
            method: &method,
            path_and_query: &self.path,
            headers: &self.headers,
            deadline,
            trace: &self.trace,
        };
        let target = match crate::pipeline::dispatch(dispatch, &mut ToEnvoy).await {
            Ok(t) => t,
            Err(DispatchError::NoPod) => return self.reject(self.no_pod()),
            Err(DispatchError::Gateway(e)) => return self.reject(e),
            Err(DispatchError::Pod(answer)) => {
                return Outcome::Done(Box::new(pod_answer(&answer, &self.request_id)));
            }
        };
        let Target {
            pod,
            guard,
            policy,
            branch,
            handoff,
            retry,
        } = target;
        let Some(dest) = destination(&pod) else {
            return self.reject(bad_pod_url(&pod));
        };
        let replaced = handoff.map(|h| serde_json::to_vec(&h.decode_body).unwrap_or_default());
        let mut tracker = self.tracker_for(
            guard,
            policy,
            branch,
            u64::from(prepared.input_tokens),
            true,
        );
        tracker.stream = prepared.parsed.stream;
        // Envoy sends the request on when this answer reaches it: the pod's TTFT counts from
        // here (the body's arrival, the flow queue and the decision are not the pod's).
        tracker.before_dispatch = self.start.elapsed();
        tracker.capture = prepared.capture.take();
        tracker.retry = retry;
        self.stream = prepared.parsed.stream;
        self.tracker = Some(tracker);
        tracing::debug!(request_id = %self.request_id, pod = %pod.url, %dest, "ext_proc: routed");
        // The pod's `traceparent` rides in the routing answer's header mutation.
        let mut trace_headers = HeaderMap::new();
        self.upstream = self.trace.upstream(&pod.url, &mut trace_headers);
        let dest = dest.with_headers(&trace_headers);
        match (self.duplex, replaced) {
            (true, None) => {
                let mut out = vec![routed_headers(&dest)];
                out.extend(streamed_body(&body));
                Outcome::Send(out)
            }
            (true, Some(new_body)) => {
                let mut out = vec![routed_headers_with_length(&dest, new_body.len())];
                out.extend(streamed_body(&new_body));
                Outcome::Send(out)
            }
            (false, None) => Outcome::Send(vec![routed_body(&dest)]),
            (false, Some(new_body)) => Outcome::Send(vec![routed_body_replaced(&dest, &new_body)]),
        }
    }

    fn response_headers(&mut self, h: HttpHeaders) -> Outcome {
        let (status, event_stream) = response_head(&h);
        let ok = (200..300).contains(&status);
        let upstream = std::mem::take(&mut self.upstream);
        if let Ok(code) = StatusCode::from_u16(status) {
            upstream.answered(code);
            self.trace.responded(code);
        }
        drop(upstream);
        if let Some(t) = &mut self.tracker {
            t.trace = crate::otel::BodyTrace::begin(&self.trace);
            t.error_status = !ok;
            t.trainable &= ok;
            t.stream = self.stream && ok && event_stream;
            self.scanner = t.stream.then(|| SseScanner::new(false));
        }
        if h.end_of_stream {
            self.finish_response();
        }
        Outcome::Send(vec![answer(
            processing_response::Response::ResponseHeaders(HeadersResponse::default()),
        )])
    }

    fn response_body(&mut self, b: HttpBody) -> Outcome {
        let end = b.end_of_stream;
        if let Some(t) = &mut self.tracker {
            let data = Bytes::from(b.body);
            match &mut self.scanner {
                Some(scanner) => {
                    let fed = scanner.feed(data);
                    if fed.first_content {
                        t.first_token();
                        self.content_events += 1;
                    }
                    if fed.more_content_events > 0 {
                        t.guard.tokens_generated(fed.more_content_events);
                        self.content_events += fed.more_content_events;
                    }
                }
                None => {
                    if !data.is_empty() {
                        t.first_token();
                    }
                    if self.whole.len() + data.len() <= crate::body::MAX_USAGE_SCAN_BYTES {
                        self.whole.extend_from_slice(&data);
                    }
                }
            }
        }
        if end {
            self.finish_response();
        }
        Outcome::Send(vec![answer(processing_response::Response::ResponseBody(
            BodyResponse::default(),
        ))])
    }

    fn finish_response(&mut self) {
        // The request's spans end with its response, before its admission slot goes: shutdown
        // waits for the slots, then flushes the exporter (a span ended after that is lost).
        let tracker = self.tracker.take();
        let slot = self.slot.take();
        self.finish_tracker(tracker);
        self.upstream = StageSpan::default();
        self.trace = RequestTrace::default();
        drop(slot);
    }

    fn finish_tracker(&mut self, tracker: Option<Tracker>) {
        let Some(t) = tracker else {
            return;
        };
        let usage = match &mut self.scanner {
            Some(s) => {
                let _ = s.finish();
                s.usage().or_else(|| {
                    (self.content_events > 0).then_some(Usage {
                        prompt_tokens: t.prompt_tokens,
                        completion_tokens: self.content_events,
                        cached_tokens: None,
                    })
                })
            }
            None => usage_of_response(&self.whole),
        };
        t.finish(Status::Ok, usage);
    }
}

/// ext_proc's [`Deliver`]: the target is named to Envoy, which forwards the request; no
/// failure is seen before answering.
struct ToEnvoy;

impl Deliver for ToEnvoy {
    type Answer = Target;

    async fn deliver(&mut self, target: Target) -> Delivery<Target> {
        Delivery::Answer(target)
    }
}

/// Ids of the pods whose `ip:port` is not in `subset`.
fn pods_outside(pods: &[Arc<Pod>], subset: &[String]) -> Vec<PodId> {
    let wanted: rustc_hash::FxHashSet<&str> = subset.iter().map(String::as_str).collect();
    pods.iter()
        .filter(|p| destination(p).is_none_or(|d| !wanted.contains(d.endpoint.as_str())))
        .map(|p| p.id)
        .collect()
}

fn request_error(e: RequestError) -> ApiError {
    crate::errors::request_error(e)
}

fn bad_pod_url(pod: &Pod) -> ApiError {
    ApiError {
        status: StatusCode::BAD_GATEWAY,
        kind: "upstream_error",
        code: "bad_pod_url",
        message: format!("pod URL {} has no host:port Envoy can connect to", pod.url),
        param: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_outside_the_subset_are_excluded_by_ip_port() {
        let pods: Vec<Arc<Pod>> = [
            "http://10.0.0.1:8000",
            "http://10.0.0.2:8000",
            "http://10.0.0.3:8000/",
        ]
        .iter()
        .enumerate()
        .map(|(i, u)| Arc::new(Pod::new(PodId(i as u32), u, "default", 1)))
        .collect();
        let subset = vec!["10.0.0.3:8000".to_string(), "10.9.9.9:1".to_string()];
        assert_eq!(pods_outside(&pods, &subset), vec![PodId(0), PodId(1)]);
        assert_eq!(pods_outside(&pods, &[]).len(), 3);
    }
}
