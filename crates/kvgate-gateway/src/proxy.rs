//! The data path: OpenAI requests in, the core decides, the chosen pod answers, the answer
//! streams back frame by frame.
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: parse (400 and no pod touched on bad
//!   input), decide with the core on a snapshot taken now, forward. A connect error or a 5xx
//!   from the pod — both before any byte reached the client — goes to the next-best pod
//!   (the core decides again with the failed pods excluded), at most `max_retries` times;
//!   then 502. No healthy pod: 503.
//! - `GET /v1/models`: the union of the healthy pods' model lists.
//! - Any other `/v1/*`: the least-loaded healthy pod, passed through.
//!
//! - Timeouts: a pod that sends no response headers within `first_byte_timeout` is retried
//!   elsewhere; the request timeout (`request_timeout`, from admission) bounds the whole
//!   request: 408 while the client is still sending the body, 504 before the pod answered, then
//!   an SSE error event (see [`crate::body`]). It is not retried.
//!
//! Bounds: request bodies up to `max_body_bytes` (413 beyond); the rest is per request.

use crate::body::{ObservedBody, Tracker};
use crate::errors::{ApiError, log_reject, no_healthy_pod, upstream_failed};
use crate::metrics::{Status, timeout_label};
use crate::pods::Pod;
use crate::request_id::request_id;
use crate::routing::{DecisionMeta, Pick, Prepared, Routed, decide_for};
use crate::state::Shared;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use kvgate_core::{PodId, RouteRequest};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Per-pod timeout of a `GET /v1/models` fan-out.
const MODELS_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest model list read from one pod.
const MAX_MODELS_BYTES: usize = 1 << 20;

pub fn traffic_router(shared: Arc<Shared>) -> axum::Router {
    use axum::routing::{any, get, post};
    axum::Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/{*rest}", any(passthrough))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            crate::limits::admit,
        ))
        // Outermost: a request without a valid key takes no slot.
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            crate::auth::authorize,
        ))
        .with_state(shared)
}

fn reject(shared: &Shared, err: ApiError, request_id: &str) -> Response {
    log_reject(shared, &err, request_id);
    err.into_response(request_id)
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
    reject(&shared, err, &id)
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

/// Hop-by-hop headers, never forwarded either way.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

fn upstream_request(
    cfg: &crate::config::GatewayConfig,
    pod: &Pod,
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    request_id: &str,
    body: Bytes,
) -> Result<http::Request<Full<Bytes>>, String> {
    let uri = pod.uri_for(path_and_query).map_err(|e| e.to_string())?;
    let mut req = http::Request::new(Full::new(body));
    *req.method_mut() = method.clone();
    *req.uri_mut() = uri;
    let h = req.headers_mut();
    for (name, value) in headers {
        if !is_hop_by_hop(name) && (cfg.forward_authorization || name != header::AUTHORIZATION) {
            h.append(name.clone(), value.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert("x-request-id", v);
    }
    Ok(req)
}

/// The response headers the client gets: the pod's minus hop-by-hop, plus ours.
fn client_headers(
    upstream: &HeaderMap,
    keep_length: bool,
    request_id: &str,
    routing: Option<(&str, &'static str)>,
) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(upstream.len() + 3);
    for (name, value) in upstream {
        if !is_hop_by_hop(name) || (keep_length && name == header::CONTENT_LENGTH) {
            h.append(name.clone(), value.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert("x-request-id", v);
    }
    if let Some((pod, branch)) = routing {
        if let Ok(v) = HeaderValue::from_str(pod) {
            h.insert("x-kvgate-pod", v);
        }
        h.insert("x-kvgate-branch", HeaderValue::from_static(branch));
    }
    h
}

/// The body with `"stream_options":{"include_usage":true}` inserted as the object's first key,
/// without re-serialising it (the hot path of streams whose client did not ask for usage).
/// Only for a body already parsed as a JSON object without `stream_options`; None when the
/// body does not start with `{` after whitespace.
fn splice_include_usage(body: &Bytes) -> Option<Bytes> {
    const FIELD: &[u8] = br#""stream_options":{"include_usage":true}"#;
    let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body.get(open) != Some(&b'{') {
        return None;
    }
    let rest = body.get(open + 1..)?;
    let empty = rest
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'}');
    let mut out = Vec::with_capacity(body.len() + FIELD.len() + 1);
    out.extend_from_slice(body.get(..=open)?);
    out.extend_from_slice(FIELD);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    Some(Bytes::from(out))
}

/// `POST /v1/chat/completions` and `POST /v1/completions`.
pub async fn completions(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let start = Instant::now();
    let (parts, body) = req.into_parts();
    let rid = request_id(&parts.headers);
    let cfg = shared.config().clone();
    let deadline = tokio::time::Instant::now() + cfg.request_timeout;
    let body = match read_body_until(body, cfg.max_body_bytes, deadline).await {
        Ok(b) => b,
        Err(e) => return reject(&shared, e, &rid),
    };
    let path = parts.uri.path();
    let prepared = match crate::routing::prepare(&shared, &cfg, path, &body, &parts.headers).await {
        Ok(p) => p,
        Err(e) => return reject(&shared, e, &rid),
    };
    let Prepared {
        mut value,
        parsed,
        mut capture,
        ..
    } = prepared;
    let request = RouteRequest {
        blocks: &prepared.blocks,
        input_tokens: prepared.input_tokens,
        block_size_tokens: prepared.block_size_tokens,
        slo: prepared.slo,
    };
    let input_tokens = prepared.input_tokens;

    // Streams: make sure the pod sends usage; strip it again if the client did not ask.
    let mut strip_usage = false;
    let upstream_body = if parsed.stream {
        let client_wants_usage = value
            .get("stream_options")
            .filter(|so| !so.is_null())
            .map(|so| {
                so.get("include_usage")
                    .and_then(Value::as_bool)
                    .unwrap_or(true)
            })
            .unwrap_or(false);
        if client_wants_usage {
            body
        } else {
            strip_usage = true;
            if value.get("stream_options").is_none()
                && let Some(spliced) = splice_include_usage(&body)
            {
                spliced
            } else if let Some(obj) = value.as_object_mut() {
                let so = obj
                    .entry("stream_options")
                    .or_insert_with(|| Value::Object(Default::default()));
                if !so.is_object() {
                    *so = Value::Object(Default::default());
                }
                if let Some(so) = so.as_object_mut() {
                    so.insert("include_usage".into(), Value::Bool(true));
                }
                match serde_json::to_vec(&value) {
                    Ok(v) => Bytes::from(v),
                    Err(_) => body,
                }
            } else {
                body
            }
        }
    } else {
        body
    };

    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or(path)
        .to_string();

    let mut excluded: Vec<PodId> = Vec::new();
    let mut last_failure = String::new();
    for attempt in 0..=cfg.max_retries {
        let meta = DecisionMeta {
            request_id: &rid,
            attempt,
        };
        let Routed {
            pod,
            guard,
            policy,
            branch,
        } = match decide_for(&shared, &request, &excluded, meta) {
            Pick::Routed(r) => r,
            Pick::NoHealthyPod if attempt > 0 => break,
            Pick::NoHealthyPod | Pick::NoDecision => {
                return reject(&shared, no_healthy_pod(), &rid);
            }
        };
        let up = match upstream_request(
            &cfg,
            &pod,
            &parts.method,
            &path_and_query,
            &parts.headers,
            &rid,
            upstream_body.clone(),
        ) {
            Ok(r) => r,
            Err(e) => return reject(&shared, upstream_failed(e), &rid),
        };
        let wait = cfg
            .first_byte_timeout
            .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        let answer = tokio::time::timeout(wait, shared.client.request(up)).await;
        let Ok(answer) = answer else {
            if tokio::time::Instant::now() >= deadline {
                drop(guard);
                return request_timed_out(&shared, &cfg, &pod, &rid);
            }
            shared
                .metrics
                .upstream_timeouts
                .get_or_create(&timeout_label("first_byte"))
                .inc();
            let failure = format!(
                "pod {} sent no response within {} ms",
                pod.url,
                cfg.first_byte_timeout.as_millis()
            );
            drop(guard);
            attempt_failed(&shared, &pod, policy, branch);
            tracing::warn!(request_id = %rid, %attempt, why = %failure, "attempt failed before any byte was sent; retrying elsewhere");
            excluded.push(pod.id);
            last_failure = failure;
            if attempt < cfg.max_retries {
                shared.metrics.retries.inc();
            }
            continue;
        };
        let failure = match answer {
            Ok(resp) if !resp.status().is_server_error() => {
                let ok = resp.status().is_success();
                let (parts_up, incoming) = resp.into_parts();
                let stream = parsed.stream && ok;
                let tracker = Tracker {
                    shared: shared.clone(),
                    guard,
                    start,
                    first_token_at: None,
                    prompt_tokens: u64::from(input_tokens),
                    policy,
                    branch,
                    request_id: rid.clone(),
                    trainable: ok,
                    stream,
                    error_status: !ok,
                    capture: if ok { capture.take() } else { None },
                };
                let headers = client_headers(
                    &parts_up.headers,
                    !stream,
                    &rid,
                    cfg.response_headers.then_some((pod.url.as_str(), branch)),
                );
                let mut resp = Response::new(Body::new(ObservedBody::new(
                    incoming,
                    tracker,
                    stream,
                    strip_usage,
                    body_timeouts(&cfg, deadline),
                )));
                *resp.status_mut() = parts_up.status;
                *resp.headers_mut() = headers;
                return resp;
            }
            Ok(resp) => format!("pod {} answered {}", pod.url, resp.status()),
            Err(e) => {
                if e.is_connect() {
                    pod.healthy.store(false, Ordering::Relaxed);
                }
                format!("pod {} failed: {e}", pod.url)
            }
        };
        drop(guard);
        attempt_failed(&shared, &pod, policy, branch);
        tracing::warn!(request_id = %rid, %attempt, why = %failure, "attempt failed before any byte was sent; retrying elsewhere");
        excluded.push(pod.id);
        last_failure = failure;
        if attempt < cfg.max_retries {
            shared.metrics.retries.inc();
        }
    }
    reject(&shared, upstream_failed(last_failure), &rid)
}

fn body_timeouts(
    cfg: &crate::config::GatewayConfig,
    deadline: tokio::time::Instant,
) -> crate::body::BodyTimeouts {
    crate::body::BodyTimeouts {
        idle: cfg.idle_chunk_timeout,
        deadline,
        request_timeout: cfg.request_timeout,
    }
}

/// The request timeout ran out before the pod answered: 504, counted as a `request` timeout.
fn request_timed_out(
    shared: &Shared,
    cfg: &crate::config::GatewayConfig,
    pod: &Pod,
    rid: &str,
) -> Response {
    shared
        .metrics
        .upstream_timeouts
        .get_or_create(&timeout_label("request"))
        .inc();
    tracing::warn!(request_id = %rid, pod = %pod.url, "request timeout before the pod answered");
    reject(
        shared,
        crate::errors::request_timeout(cfg.request_timeout),
        rid,
    )
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

fn attempt_failed(shared: &Shared, pod: &Pod, policy: &str, branch: &str) {
    shared
        .metrics
        .requests
        .get_or_create(&crate::metrics::RequestLabels {
            pod: pod.url.clone(),
            policy: policy.to_string(),
            branch: branch.to_string(),
            status: Status::AttemptFailed.as_str().to_string(),
        })
        .inc();
}

/// `GET /v1/models`: the union (by model id) of every healthy pod's list.
pub async fn models(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let rid = request_id(req.headers());
    let pods: Vec<Arc<Pod>> = shared
        .pods
        .all()
        .iter()
        .filter(|p| p.is_healthy())
        .cloned()
        .collect();
    if pods.is_empty() {
        return reject(&shared, no_healthy_pod(), &rid);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for pod in pods {
        let shared = shared.clone();
        tasks.spawn(async move {
            tokio::time::timeout(MODELS_TIMEOUT, fetch_models(&shared, &pod))
                .await
                .ok()
                .flatten()
        });
    }
    let mut data: Vec<Value> = Vec::new();
    let mut answered = false;
    while let Some(res) = tasks.join_next().await {
        let Ok(Some(list)) = res else { continue };
        answered = true;
        for m in list {
            let id = m.get("id").cloned();
            if !data.iter().any(|d| d.get("id") == id.as_ref()) {
                data.push(m);
            }
        }
    }
    if !answered {
        return reject(
            &shared,
            upstream_failed("no pod answered /v1/models".into()),
            &rid,
        );
    }
    data.sort_by(|a, b| {
        let k = |v: &Value| {
            v.get("id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        k(a).cmp(&k(b))
    });
    let body = serde_json::json!({"object": "list", "data": data}).to_string();
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

async fn fetch_models(shared: &Shared, pod: &Pod) -> Option<Vec<Value>> {
    let uri = pod.uri_for("/v1/models").ok()?;
    let req = http::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
    let resp = shared.client.request(req).await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let bytes = Limited::new(resp.into_body(), MAX_MODELS_BYTES)
        .collect()
        .await
        .ok()?
        .to_bytes();
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v.get("data")?.as_array().cloned()
}

/// Any other `/v1/*`: the least-loaded healthy pod, passed through (no routing decision, no
/// training; counted in flight).
pub async fn passthrough(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let start = Instant::now();
    let (parts, body) = req.into_parts();
    let rid = request_id(&parts.headers);
    let cfg = shared.config().clone();
    let deadline = tokio::time::Instant::now() + cfg.request_timeout;
    let body = match read_body_until(body, cfg.max_body_bytes, deadline).await {
        Ok(b) => b,
        Err(e) => return reject(&shared, e, &rid),
    };
    let Some((pod, guard)) = crate::routing::least_loaded(&shared, &[]) else {
        return reject(&shared, no_healthy_pod(), &rid);
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
        Err(e) => return reject(&shared, upstream_failed(e), &rid),
    };
    let wait = cfg
        .first_byte_timeout
        .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
    let answer = tokio::time::timeout(wait, shared.client.request(up)).await;
    let Ok(answer) = answer else {
        if tokio::time::Instant::now() >= deadline {
            return request_timed_out(&shared, &cfg, &pod, &rid);
        }
        shared
            .metrics
            .upstream_timeouts
            .get_or_create(&timeout_label("first_byte"))
            .inc();
        return reject(
            &shared,
            upstream_failed(format!(
                "pod {} sent no response within {} ms",
                pod.url,
                cfg.first_byte_timeout.as_millis()
            )),
            &rid,
        );
    };
    match answer {
        Ok(resp) => {
            let (parts_up, incoming) = resp.into_parts();
            let ok = parts_up.status.is_success();
            let tracker = Tracker {
                shared: shared.clone(),
                guard,
                start,
                first_token_at: None,
                prompt_tokens: 0,
                policy: "least-loaded",
                branch: "passthrough",
                request_id: rid.clone(),
                trainable: false,
                stream: false,
                error_status: !ok,
                capture: None,
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
                pod.healthy.store(false, Ordering::Relaxed);
            }
            reject(
                &shared,
                upstream_failed(format!("pod {} failed: {e}", pod.url)),
                &rid,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spliced(body: &str) -> Value {
        let out = splice_include_usage(&Bytes::copy_from_slice(body.as_bytes())).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn include_usage_splice_keeps_every_field_and_adds_stream_options() {
        let v = spliced(
            r#" { "model": "m", "stream": true, "messages": [{"role": "user", "content": "{x}"}] }"#,
        );
        assert_eq!(
            v["stream_options"],
            serde_json::json!({"include_usage": true})
        );
        assert_eq!(v["model"], "m");
        assert_eq!(v["messages"][0]["content"], "{x}");
        assert_eq!(
            spliced("{}"),
            serde_json::json!({"stream_options": {"include_usage": true}})
        );
        assert!(splice_include_usage(&Bytes::from_static(b"[1]")).is_none());
    }
}
