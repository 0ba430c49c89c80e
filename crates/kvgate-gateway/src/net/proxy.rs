//! The data path: OpenAI requests in, the core decides, the chosen pod answers, the answer
//! streams back frame by frame.
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: the request pipeline
//!   ([`crate::pipeline`], the same as ext_proc's: prepare, flow turn, decide, P/D prefill,
//!   retries); this module is its HTTP transport (`Forward`): it forwards the request to the
//!   chosen pod and streams the answer. A connect error or a 5xx from the pod — both before
//!   any byte reached the client — goes back to the pipeline, which routes to the next-best
//!   pod (the core decides again with the failed pods excluded), at most `max_retries` times
//!   and only within the retry budget ([`crate::retry_budget`]; a retry after a lost
//!   connection is free of it); then 502. No healthy pod: 503 (pods avoided by their breaker
//!   but answering their scrape are routed to instead: panic mode, [`crate::breaker`]). A P/D
//!   request's decode stage goes to the decode pod with the prefill's `kv_transfer_params`;
//!   a prefill pod's 4xx is passed to the client as the pod sent it.
//! - `GET /v1/models`: the union of the healthy pods' model lists ([`crate::models`]).
//! - Any other `/v1/*`: the least-loaded healthy pod, passed through.
//!
//! - Timeouts: a pod that sends no response headers within `first_byte_timeout` while it makes
//!   no progress ([`crate::progress`]) is retried elsewhere (a busy pod is waited for); the
//!   request timeout (`request_timeout`, from admission) bounds the whole request: 408 while
//!   the client is still sending the body, 504 before the pod answered, then an SSE error
//!   event (see [`crate::body`]). It is not retried.
//!
//! The request a pod gets, the headers the client gets back, the wait for the first byte and the
//! bookkeeping of a failed attempt are [`crate::upstream`]'s; the response body is
//! [`crate::body`]'s; admission and API keys are layers ([`crate::limits`], [`crate::auth`]).
//!
//! Bounds: request bodies up to `max_body_bytes` (413 beyond); the rest is per request.

use crate::body::{ObservedBody, Tracker};
use crate::errors::{ApiError, no_healthy_pod, upstream_failed};
use crate::otel::RequestTrace;
use crate::pipeline::{Deliver, Delivery, Dispatch, DispatchError, Failure, Target};
use crate::reject::reject;
use crate::request_id::request_id;
use crate::routing::Prepared;
use crate::state::Shared;
use crate::upstream::{
    QUEUE_MS_HEADER, Sent, attempt_failed, body_timeouts, client_headers, completion_body,
    completion_body_of_value, queue_ms_value, request_timed_out, send, upstream_request,
};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Limited};
use kvgate_core::RouteRequest;
use std::sync::Arc;
use std::time::Instant;

pub fn traffic_router(shared: Arc<Shared>) -> axum::Router {
    use axum::routing::{any, get, post};
    axum::Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(crate::models::models))
        .route("/v1/{*rest}", any(passthrough))
        .fallback(not_found)
        .layer(crate::admission::AdmissionLayer::new(shared.clone()))
        // Outermost: a request without a valid key takes no slot.
        .layer(crate::auth::AuthLayer::new(shared.clone()))
        .with_state(shared)
}

async fn not_found(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let id = request_id(req.headers());
    let err = ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "invalid_request_error",
        code: "not_found",
        message: format!("no route for {} {}", req.method(), req.uri().path()),
        param: None,
    };
    reject(&shared.telemetry, err, &id)
}

/// The request's deadline: its request timeout counted from its arrival at the gateway
/// ([`crate::limits::Arrived`]: body read and queue time included), else from now.
fn request_deadline(
    parts: &http::request::Parts,
    cfg: &crate::config::GatewayConfig,
) -> tokio::time::Instant {
    let arrived = parts
        .extensions
        .get::<crate::limits::Arrived>()
        .map_or_else(tokio::time::Instant::now, |a| a.0);
    arrived + cfg.request_timeout
}

/// Reads the whole request body up to the configured limit.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                kind: "invalid_request_error",
                code: "body_too_large",
                message: format!("request body exceeds {limit} bytes"),
                param: None,
            })
        }
        Err(e) => Err(ApiError::bad_request(
            "body_read_error",
            format!("cannot read request body: {e}"),
            None,
        )),
    }
}

/// `POST /v1/chat/completions` and `POST /v1/completions`.
pub async fn completions(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let start = Instant::now();
    let (parts, body) = req.into_parts();
    let rid = request_id(&parts.headers);
    let trace = RequestTrace::start(
        shared.telemetry.otel.as_ref(),
        &parts.headers,
        parts.uri.path(),
        &rid,
    );
    let cfg = shared.config().clone();
    let deadline = request_deadline(&parts, &cfg);
    let body = match read_body_until(body, cfg.max_body_bytes, deadline).await {
        Ok(b) => b,
        Err(e) => return reject(&shared.telemetry, e, &rid),
    };
    let path = parts.uri.path();
    // Prepare, class and price the request, then its flow turn (at once with flow control
    // off): the same pipeline as ext_proc's.
    let ready = crate::pipeline::ready(
        &shared,
        &cfg,
        path,
        &body,
        &parts.headers,
        deadline,
        parts.extensions.get::<crate::limits::Slot>(),
    )
    .await;
    let crate::pipeline::Ready {
        prepared,
        class,
        turn,
    } = match ready {
        Ok(r) => r,
        Err(e) => return trace.answered(crate::flow::reject(&shared.telemetry, e, &rid)),
    };
    trace.flow_queue(&cfg.flow, class.priority, &class.tenant, turn.queued);
    let queued = turn.queued;
    let Prepared {
        fields,
        parsed,
        mut capture,
        ..
    } = prepared;
    let body = crate::flow::forward_priority(&cfg.flow, &class, fields.has_priority, body);
    let request = RouteRequest {
        blocks: &prepared.blocks,
        input_tokens: prepared.input_tokens,
        block_size_tokens: prepared.block_size_tokens,
        other_sizes: &prepared.other_sizes,
        slo: prepared.slo,
        adapter: Some(prepared.adapter),
    };
    // A fleet with P/D roles: the request may be split, and its prefill and decode bodies are
    // built from this body (a handle kept only then: the common path forwards it as it came).
    let split = shared
        .fleet
        .pods
        .all()
        .iter()
        .any(|p| p.role != kvgate_core::PodRole::Both);
    let pd_body = split.then(|| body.clone());
    let (upstream_body, strip_usage) = completion_body(fields.stream_options, body, parsed.stream);

    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or(path)
        .to_string();
    let mut fwd = Forward {
        shared: &shared,
        cfg: &cfg,
        parts: &parts,
        path_and_query: &path_and_query,
        rid: &rid,
        deadline,
        start,
        queued,
        input_tokens: prepared.input_tokens,
        stream: parsed.stream,
        strip_usage,
        body: upstream_body,
        capture: &mut capture,
        trace: &trace,
    };
    let dispatch = Dispatch {
        shared: &shared,
        cfg: &cfg,
        request,
        request_id: &rid,
        turn,
        excluded: Vec::new(),
        split: pd_body.as_deref(),
        method: &parts.method,
        path_and_query: &path_and_query,
        headers: &parts.headers,
        deadline,
        trace: &trace,
    };
    let resp = match crate::pipeline::dispatch(dispatch, &mut fwd).await {
        Ok(resp) => resp,
        Err(DispatchError::NoPod) => reject(&shared.telemetry, no_healthy_pod(), &rid),
        Err(DispatchError::Gateway(e)) => reject(&shared.telemetry, e, &rid),
        Err(DispatchError::Pod(answer)) => {
            let mut resp = Response::new(Body::from(answer.body));
            *resp.status_mut() = answer.status;
            *resp.headers_mut() = client_headers(&answer.headers, true, &rid, None);
            resp
        }
    };
    trace.answered(resp)
}

/// What every attempt of one completion request is sent with: the proxy's [`Deliver`].
struct Forward<'a> {
    shared: &'a Arc<Shared>,
    cfg: &'a crate::config::GatewayConfig,
    parts: &'a http::request::Parts,
    path_and_query: &'a str,
    rid: &'a str,
    deadline: tokio::time::Instant,
    start: Instant,
    queued: std::time::Duration,
    input_tokens: u32,
    stream: bool,
    strip_usage: bool,
    /// The body a whole request is forwarded with.
    body: Bytes,
    capture: &'a mut Option<crate::capture::Ticket>,
    trace: &'a RequestTrace,
}

impl Deliver for Forward<'_> {
    type Answer = Response;

    /// A whole request: the body to the pod. A P/D request's decode stage: the client's
    /// request with the prefill's transfer parameters to the decode pod ([`crate::pd`]).
    async fn deliver(&mut self, target: Target) -> Delivery<Response> {
        let Some(handoff) = target.handoff else {
            let body = self.body.clone();
            return self.forward(target, body, None).await;
        };
        let body = completion_body_of_value(handoff.decode_body, self.stream);
        let target = Target {
            handoff: None,
            ..target
        };
        let sent = self
            .forward(target, body, Some(handoff.prefill_pod.url.as_str()))
            .await;
        let outcome = match &sent {
            Delivery::Answer(_) => "ok",
            Delivery::Failed(_) => "failed",
        };
        self.shared.telemetry.metrics.pd.stage("decode", outcome);
        sent
    }
}

impl Forward<'_> {
    /// Sends `body` to the target's pod holding its guard: the pod's answer streams to the
    /// client, or the attempt failed before any byte (counted and logged, the guard returned).
    /// `prefill_pod`: the decode stage of a P/D request (its prefill pod shown in
    /// `x-kvgate-prefill-pod`).
    async fn forward(
        &mut self,
        target: Target,
        body: Bytes,
        prefill_pod: Option<&str>,
    ) -> Delivery<Response> {
        let Target {
            pod,
            guard,
            policy,
            branch,
            retry,
            ..
        } = target;
        let (shared, cfg, rid) = (self.shared, self.cfg, self.rid);
        // The pod's TTFT counts from here, not from the request's arrival (the flow queue, the
        // decision and any earlier failed attempt are not the pod's).
        let before_dispatch = self.start.elapsed();
        let mut up = match upstream_request(
            cfg,
            &pod,
            &self.parts.method,
            self.path_and_query,
            &self.parts.headers,
            rid,
            body,
        ) {
            Ok(r) => r,
            Err(e) => return Delivery::Answer(reject(&shared.telemetry, upstream_failed(e), rid)),
        };
        let span = self.trace.upstream(&pod.url, up.headers_mut());
        let sent = send(shared, cfg, &pod, up, self.deadline).await;
        span.sent(|| sent.outcome());
        drop(span);
        let failure = match sent {
            Sent::RequestTimeout => {
                drop(guard);
                return Delivery::Answer(request_timed_out(&shared.telemetry, cfg, &pod, rid));
            }
            Sent::FirstByteTimeout(why) => Failure::counted(why),
            Sent::Answer(Ok(resp)) if !resp.status().is_server_error() => {
                let ok = resp.status().is_success();
                let (parts_up, incoming) = resp.into_parts();
                let stream = self.stream && ok;
                let tracker = Tracker {
                    shared: shared.clone(),
                    guard,
                    start: self.start,
                    before_dispatch,
                    first_token_at: None,
                    prompt_tokens: u64::from(self.input_tokens),
                    policy,
                    branch,
                    request_id: rid.to_string(),
                    trainable: ok,
                    stream,
                    error_status: !ok,
                    capture: if ok { self.capture.take() } else { None },
                    retry,
                    trace: crate::otel::BodyTrace::begin(self.trace),
                };
                let mut headers = client_headers(
                    &parts_up.headers,
                    !stream,
                    rid,
                    cfg.response_headers.then_some((pod.url.as_str(), branch)),
                );
                if let (true, Some(p)) = (cfg.response_headers, prefill_pod)
                    && let Ok(v) = http::HeaderValue::from_str(p)
                {
                    headers.insert("x-kvgate-prefill-pod", v);
                }
                if cfg.response_headers && !self.queued.is_zero() {
                    headers.insert(QUEUE_MS_HEADER, queue_ms_value(self.queued));
                }
                let mut resp = Response::new(Body::new(ObservedBody::new(
                    incoming,
                    tracker,
                    stream,
                    self.strip_usage,
                    body_timeouts(cfg, self.deadline),
                )));
                *resp.status_mut() = parts_up.status;
                *resp.headers_mut() = headers;
                return Delivery::Answer(resp);
            }
            Sent::Answer(Ok(resp)) => {
                Failure::counted(format!("pod {} answered {}", pod.url, resp.status()))
            }
            Sent::Answer(Err(e)) => {
                if e.is_connect() {
                    pod.mark_unhealthy();
                }
                Failure {
                    why: format!("pod {} failed: {e}", pod.url),
                    connection_lost: true,
                }
            }
        };
        drop(guard);
        attempt_failed(&shared.telemetry.metrics, &pod, policy, branch);
        if shared.telemetry.log_limit.allow("attempt_failed") {
            tracing::warn!(request_id = %rid, why = %failure.why, "attempt failed before any byte was sent; retrying elsewhere");
        }
        Delivery::Failed(failure)
    }
}

/// [`read_body`], or 408 when the client has not sent the whole body by `deadline`.
async fn read_body_until(
    body: Body,
    limit: usize,
    deadline: tokio::time::Instant,
) -> Result<Bytes, ApiError> {
    match tokio::time::timeout_at(deadline, read_body(body, limit)).await {
        Ok(read) => read,
        Err(_) => Err(ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            kind: "invalid_request_error",
            code: "body_timeout",
            message: "the request body did not arrive within the request timeout".into(),
            param: None,
        }),
    }
}

/// Any other `/v1/*`: the least-loaded healthy pod, passed through (no routing decision, no
/// training; counted in flight). A path with a dot segment (`/v1/../admin`, `/v1/%2e%2e/x`,
/// `/v1/.%2E%5cx`: `.` or `..` between `/` or `\\`, percent-decoded up to
/// [`PATH_DECODE_ROUNDS`] times) gets 400 `invalid_path` and touches no pod: the path is sent
/// verbatim, and a pod (or a proxy in front of it) that resolves dot segments would serve a
/// path outside `/v1/`.
pub async fn passthrough(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let start = Instant::now();
    let (parts, body) = req.into_parts();
    let rid = request_id(&parts.headers);
    if has_dot_segment(parts.uri.path()) {
        let err = ApiError::bad_request(
            "invalid_path",
            "the request path has a `.` or `..` segment (decoded or not)".into(),
            None,
        );
        return reject(&shared.telemetry, err, &rid);
    }
    let cfg = shared.config().clone();
    let deadline = request_deadline(&parts, &cfg);
    let body = match read_body_until(body, cfg.max_body_bytes, deadline).await {
        Ok(b) => b,
        Err(e) => return reject(&shared.telemetry, e, &rid),
    };
    let Some((pod, guard)) = crate::routing::least_loaded(&shared, &[]) else {
        return reject(&shared.telemetry, no_healthy_pod(), &rid);
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| parts.uri.path().to_string());
    let up = match upstream_request(
        &cfg,
        &pod,
        &parts.method,
        &path_and_query,
        &parts.headers,
        &rid,
        body,
    ) {
        Ok(r) => r,
        Err(e) => return reject(&shared.telemetry, upstream_failed(e), &rid),
    };
    let answer = match send(&shared, &cfg, &pod, up, deadline).await {
        Sent::Answer(answer) => answer,
        Sent::RequestTimeout => return request_timed_out(&shared.telemetry, &cfg, &pod, &rid),
        Sent::FirstByteTimeout(failure) => {
            return reject(&shared.telemetry, upstream_failed(failure), &rid);
        }
    };
    match answer {
        Ok(resp) => {
            let (parts_up, incoming) = resp.into_parts();
            let ok = parts_up.status.is_success();
            let tracker = Tracker {
                shared: shared.clone(),
                guard,
                start,
                before_dispatch: std::time::Duration::ZERO,
                first_token_at: None,
                prompt_tokens: 0,
                policy: "least-loaded",
                branch: crate::body::PASSTHROUGH,
                request_id: rid.clone(),
                trainable: false,
                stream: false,
                error_status: !ok,
                capture: None,
                retry: None,
                trace: Default::default(),
            };
            let headers = client_headers(
                &parts_up.headers,
                true,
                &rid,
                cfg.response_headers
                    .then_some((pod.url.as_str(), "passthrough")),
            );
            let mut resp = Response::new(Body::new(ObservedBody::new(
                incoming,
                tracker,
                false,
                false,
                body_timeouts(&cfg, deadline),
            )));
            *resp.status_mut() = parts_up.status;
            *resp.headers_mut() = headers;
            resp
        }
        Err(e) => {
            if e.is_connect() {
                pod.mark_unhealthy();
            }
            reject(
                &shared.telemetry,
                upstream_failed(format!("pod {} failed: {e}", pod.url)),
                &rid,
            )
        }
    }
}

/// Percent-decoding rounds [`has_dot_segment`] looks through: `%2e` (one round) and `%252e`
/// (two) are dots to a server that decodes that often; three covers one more layer than any
/// server we know decodes.
const PATH_DECODE_ROUNDS: usize = 3;

/// Whether `path`, as sent or percent-decoded up to [`PATH_DECODE_ROUNDS`] times, has a `.` or
/// `..` segment (segments split at `/` and `\\`).
fn has_dot_segment(path: &str) -> bool {
    let mut current = path.as_bytes().to_vec();
    for round in 0..=PATH_DECODE_ROUNDS {
        if current
            .split(|&b| b == b'/' || b == b'\\')
            .any(|seg| seg == b"." || seg == b"..")
        {
            return true;
        }
        if round == PATH_DECODE_ROUNDS || !current.contains(&b'%') {
            break;
        }
        current = percent_decode(&current);
    }
    false
}

/// One round of percent-decoding; a `%` not followed by two hex digits stays as it is.
fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod path_tests {
    use super::has_dot_segment;

    #[test]
    fn dot_segments_are_found_encoded_or_not() {
        for bad in [
            "/v1/../admin",
            "/v1/./models",
            "/v1/..",
            "/v1/%2e%2e/admin",
            "/v1/%2E%2e/admin",
            "/v1/.%2e/admin",
            "/v1/%2e/x",
            "/v1/..%2fadmin",
            "/v1/..%5cadmin",
            "/v1\\..\\admin",
            "/v1/%252e%252e/admin",
        ] {
            assert!(has_dot_segment(bad), "{bad} passed");
        }
        for good in [
            "/v1/models",
            "/v1/files/a.b",
            "/v1/files/...",
            "/v1/files/..x",
            "/v1/x.%2e",
            "/v1/%zz/..a",
            "/v1/100%",
            "/v1/",
        ] {
            assert!(!has_dot_segment(good), "{good} rejected");
        }
    }
}
