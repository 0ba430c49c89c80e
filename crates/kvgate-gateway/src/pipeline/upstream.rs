//! Upstream forwarding for the HTTP proxy: the request a pod gets, the headers the client gets
//! back, the one wait for a pod's response headers, and the bookkeeping of a failed attempt.
//!
//! - Headers: hop-by-hop headers (and `host`, `content-length`) are never forwarded either way,
//!   nor are the headers a message's `Connection` header names (RFC 9110 §7.6.1);
//!   the client's `Authorization` reaches the pod only with `--forward-authorization`; every
//!   request and answer carries `x-request-id`, answers `x-kvgate-pod` / `x-kvgate-branch`
//!   unless `--no-response-headers`; a request to one engine of a data-parallel server
//!   carries `x-data-parallel-rank` (replacing the client's).
//! - Streams: the pod is always asked for `usage` (`stream_options.include_usage`) so that
//!   tokens are counted; [`crate::body`] strips it again when the client did not ask.
//! - Timeouts: [`send`] waits for the response headers at most `first_byte_timeout` of silence
//!   from a pod making no progress ([`crate::progress`]), and never past the request's
//!   deadline; which of the two ran out decides whether the proxy retries elsewhere (first
//!   byte) or answers 504 (request).
//!
//! The handlers that use these live in [`crate::proxy`].

use crate::body::BodyTimeouts;
use crate::config::GatewayConfig;
use crate::handles::telemetry::Telemetry;
use crate::metrics::Metrics;
use crate::metrics::{Status, timeout_label};
use crate::pods::Pod;
use crate::reject::reject;
use crate::state::Shared;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::Value;

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

/// Whether `headers`' `Connection` header(s) name `name`: such a header is meant for this
/// connection only (RFC 9110 §7.6.1). No allocation: the lists are short.
fn named_by_connection(headers: &HeaderMap, name: &HeaderName) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|option| option.trim().eq_ignore_ascii_case(name.as_str()))
}

/// Whether a header of `headers` goes on to the next hop.
fn is_end_to_end(headers: &HeaderMap, name: &HeaderName) -> bool {
    !is_hop_by_hop(name) && !named_by_connection(headers, name)
}

/// The request `pod` gets: the client's method, path and end-to-end headers, our request id.
pub fn upstream_request(
    cfg: &GatewayConfig,
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
        if is_end_to_end(headers, name)
            && (cfg.forward_authorization || name != header::AUTHORIZATION)
        {
            h.append(name.clone(), value.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert("x-request-id", v);
    }
    if let Some(rank) = pod.rank {
        // One engine of a data-parallel server: vLLM pins the request to it (the client's
        // own value, if any, is replaced).
        h.insert(DATA_PARALLEL_RANK_HEADER, HeaderValue::from(rank));
    }
    Ok(req)
}

/// The header that pins a request to one engine of a vLLM data-parallel server (vLLM answers
/// 400 for a rank out of range).
pub const DATA_PARALLEL_RANK_HEADER: &str = "x-data-parallel-rank";

/// With `response_headers` on, the time a request spent in flow control's queue before it was
/// routed, in milliseconds (one decimal); absent when it did not wait.
pub const QUEUE_MS_HEADER: &str = "x-kvgate-queue-ms";

/// The value of [`QUEUE_MS_HEADER`].
pub fn queue_ms_value(queued: std::time::Duration) -> HeaderValue {
    // A decimal number is always a valid header value.
    HeaderValue::from_str(&format!("{:.1}", queued.as_secs_f64() * 1e3))
        .unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// The response headers the client gets: the pod's minus hop-by-hop, plus ours.
pub fn client_headers(
    upstream: &HeaderMap,
    keep_length: bool,
    request_id: &str,
    routing: Option<(&str, &'static str)>,
) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(upstream.len() + 3);
    for (name, value) in upstream {
        if is_end_to_end(upstream, name) || (keep_length && name == header::CONTENT_LENGTH) {
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

/// What a body's `stream_options` says of usage, read once with the request
/// ([`crate::routing::BodyFields`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOptions {
    /// No `stream_options` member.
    Absent,
    /// The client asked for usage (`include_usage` anything but `false`).
    UsageAsked,
    /// `stream_options` is `null` or says `"include_usage": false`.
    UsageNotAsked,
}

impl StreamOptions {
    pub fn of(body: &kvgate_core::json::Json<'_>) -> Self {
        match body.get("stream_options") {
            None => StreamOptions::Absent,
            Some(so) if so.is_null() => StreamOptions::UsageNotAsked,
            Some(so) => {
                if so
                    .get("include_usage")
                    .and_then(kvgate_core::json::Json::as_bool)
                    .unwrap_or(true)
                {
                    StreamOptions::UsageAsked
                } else {
                    StreamOptions::UsageNotAsked
                }
            }
        }
    }
}

/// The body a completion is forwarded with, and whether the pod's `usage` must be stripped
/// from the stream again (the client did not ask for it). Non-streams, and streams whose
/// client asked for usage, go unchanged; a body without `stream_options` gets it spliced in;
/// one whose `stream_options` must change is parsed again and re-serialised.
pub fn completion_body(stream_options: StreamOptions, body: Bytes, stream: bool) -> (Bytes, bool) {
    completion_body_with(stream_options, body, stream, |body| {
        serde_json::from_slice::<Value>(body).ok()
    })
}

/// [`completion_body`] of a body built as a `Value` (a P/D decode body): serialised once,
/// and changed from the `Value` itself, not from its bytes parsed again.
pub fn completion_body_of_value(value: Value, stream: bool) -> Bytes {
    let stream_options = StreamOptions::of(&kvgate_core::json::Json::from_value(&value));
    let body = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
    let mut value = Some(value);
    completion_body_with(stream_options, body, stream, |_| value.take()).0
}

fn completion_body_with(
    stream_options: StreamOptions,
    body: Bytes,
    stream: bool,
    value_of: impl FnOnce(&[u8]) -> Option<Value>,
) -> (Bytes, bool) {
    if !stream || stream_options == StreamOptions::UsageAsked {
        return (body, false);
    }
    if stream_options == StreamOptions::Absent
        && let Some(spliced) = splice_include_usage(&body)
    {
        return (spliced, true);
    }
    let Some(mut value) = value_of(&body) else {
        return (body, true);
    };
    let Some(obj) = value.as_object_mut() else {
        return (body, true);
    };
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
        Ok(v) => (Bytes::from(v), true),
        Err(_) => (body, true),
    }
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

/// How one upstream request went, up to its response headers.
pub enum Sent {
    /// The pod answered (any status) or the connection failed.
    Answer(Result<http::Response<Incoming>, hyper_util::client::legacy::Error>),
    /// No response headers within `first_byte_timeout` while the pod made no progress
    /// (counted: `timeout="first_byte"`, and as a failure in the pod's breaker); another pod
    /// may still be tried. The message says which pod.
    FirstByteTimeout(String),
    /// The request's deadline passed first (not counted here: see [`request_timed_out`]).
    RequestTimeout,
}

impl Sent {
    /// The pod's response status, or why none came (a trace's `kvgate.upstream` span).
    pub fn outcome(&self) -> Result<http::StatusCode, String> {
        match self {
            Sent::Answer(Ok(resp)) => Ok(resp.status()),
            Sent::Answer(Err(e)) => Err(e.to_string()),
            Sent::FirstByteTimeout(why) => Err(why.clone()),
            Sent::RequestTimeout => Err("request timeout".to_string()),
        }
    }
}

/// Sends `up` to `pod` and waits for its response headers: at most `first_byte_timeout` of
/// silence while the pod makes no progress, and never past `deadline`. A pod whose engine
/// progresses ([`crate::progress`]) is busy with the requests ahead of this one (vLLM sends a
/// whole body's headers only at its end): the wait goes on, counted in
/// `kvgate_busy_waits_total{kind="first_byte"}`, and is neither a failure nor a retry.
pub async fn send(
    shared: &Shared,
    cfg: &GatewayConfig,
    pod: &Pod,
    up: http::Request<Full<Bytes>>,
    deadline: tokio::time::Instant,
) -> Sent {
    let window = crate::progress::window(cfg.first_byte_timeout, cfg.scrape_interval);
    let mut answer = std::pin::pin!(shared.fleet.client.request(up));
    loop {
        let wait = cfg
            .first_byte_timeout
            .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        match tokio::time::timeout(wait, &mut answer).await {
            Ok(answer) => return Sent::Answer(answer),
            Err(_) if tokio::time::Instant::now() >= deadline => return Sent::RequestTimeout,
            Err(_) if pod.progress.within(std::time::Instant::now(), window) => {
                shared
                    .telemetry
                    .metrics
                    .busy_waits
                    .get_or_create(&timeout_label("first_byte"))
                    .inc();
            }
            Err(_) => {
                shared
                    .telemetry
                    .metrics
                    .upstream_timeouts
                    .get_or_create(&timeout_label("first_byte"))
                    .inc();
                crate::breaker::count_failure(
                    shared,
                    pod,
                    "no response headers in time while the pod made no progress, again",
                );
                return Sent::FirstByteTimeout(format!(
                    "pod {} sent no response within {} ms and made no progress",
                    pod.url,
                    cfg.first_byte_timeout.as_millis()
                ));
            }
        }
    }
}

/// The deadlines of a response body once the pod has answered.
pub fn body_timeouts(cfg: &GatewayConfig, deadline: tokio::time::Instant) -> BodyTimeouts {
    BodyTimeouts {
        idle: cfg.idle_chunk_timeout,
        progress_window: crate::progress::window(cfg.idle_chunk_timeout, cfg.scrape_interval),
        deadline,
        request_timeout: cfg.request_timeout,
    }
}

/// The request timeout ran out before the pod answered: 504, counted as a `request` timeout.
pub fn request_timed_out(
    telemetry: &Telemetry,
    cfg: &GatewayConfig,
    pod: &Pod,
    rid: &str,
) -> Response {
    reject(
        telemetry,
        request_timeout_error(telemetry, cfg, pod, rid),
        rid,
    )
}

/// [`request_timed_out`]'s error, counted and logged, for a transport to answer.
pub fn request_timeout_error(
    telemetry: &Telemetry,
    cfg: &GatewayConfig,
    pod: &Pod,
    rid: &str,
) -> crate::errors::ApiError {
    telemetry
        .metrics
        .upstream_timeouts
        .get_or_create(&timeout_label("request"))
        .inc();
    if telemetry.log_limit.allow("request_timeout") {
        tracing::warn!(request_id = %rid, pod = %pod.url, "request timeout before the pod answered");
    }
    crate::errors::request_timeout(cfg.request_timeout)
}

/// Counts an attempt that failed before any byte reached the client
/// (`status="attempt_failed"`); the proxy then retries elsewhere.
pub fn attempt_failed(metrics: &Metrics, pod: &Pod, policy: &str, branch: &str) {
    metrics
        .requests
        .get_or_create(&crate::metrics::RequestLabels {
            pod: pod.url.clone(),
            policy: policy.to_string(),
            branch: branch.to_string(),
            status: Status::AttemptFailed.as_str().to_string(),
        })
        .inc();
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

    fn forwarded(body: &str, stream: bool) -> (Value, bool) {
        let value = kvgate_core::json::parse(body.as_bytes()).unwrap();
        let so = StreamOptions::of(&value);
        let (out, strip) = completion_body(so, Bytes::copy_from_slice(body.as_bytes()), stream);
        (serde_json::from_slice(&out).unwrap(), strip)
    }

    #[test]
    fn streams_ask_the_pod_for_usage_and_strip_it_unless_the_client_asked() {
        let (v, strip) = forwarded(r#"{"stream":true}"#, true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert!(strip);
        let (v, strip) = forwarded(
            r#"{"stream":true,"stream_options":{"include_usage":false}}"#,
            true,
        );
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert!(strip);
        let (v, strip) = forwarded(r#"{"stream":true,"stream_options":{}}"#, true);
        assert_eq!(v["stream_options"], serde_json::json!({}));
        assert!(!strip);
        let (v, strip) = forwarded(r#"{"stream":false}"#, false);
        assert_eq!(v, serde_json::json!({"stream": false}));
        assert!(!strip);
    }

    #[test]
    fn hop_by_hop_and_authorization_stay_behind() {
        let mut client = HeaderMap::new();
        client.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        client.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        client.insert("x-custom", HeaderValue::from_static("1"));
        let pod = Pod::new(kvgate_core::PodId(0), "http://127.0.0.1:1", "default", 1);
        let mut cfg = GatewayConfig::from_args(&crate::config::ServeArgs::default()).unwrap();
        let up = upstream_request(
            &cfg,
            &pod,
            &Method::POST,
            "/v1/completions",
            &client,
            "rid",
            Bytes::new(),
        )
        .unwrap();
        let names: Vec<&str> = up.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-custom", "x-request-id"]);
        cfg.forward_authorization = true;
        let up =
            upstream_request(&cfg, &pod, &Method::GET, "/", &client, "rid", Bytes::new()).unwrap();
        assert!(up.headers().contains_key(header::AUTHORIZATION));
    }

    #[test]
    fn headers_named_by_connection_stay_behind_both_ways() {
        let mut h = HeaderMap::new();
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret"),
        );
        h.append(header::CONNECTION, HeaderValue::from_static("x-hop"));
        h.insert("x-secret", HeaderValue::from_static("s"));
        h.insert("x-hop", HeaderValue::from_static("h"));
        h.insert("x-custom", HeaderValue::from_static("1"));
        let pod = Pod::new(kvgate_core::PodId(0), "http://127.0.0.1:1", "default", 1);
        let cfg = GatewayConfig::from_args(&crate::config::ServeArgs::default()).unwrap();
        let up =
            upstream_request(&cfg, &pod, &Method::POST, "/v1/x", &h, "rid", Bytes::new()).unwrap();
        let names: Vec<&str> = up.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-custom", "x-request-id"]);
        let back = client_headers(&h, true, "rid", None);
        let names: Vec<&str> = back.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-custom", "x-request-id"]);
    }

    #[test]
    fn the_queue_time_header_is_milliseconds_with_one_decimal() {
        use std::time::Duration;
        assert_eq!(queue_ms_value(Duration::from_micros(1_234_567)), "1234.6");
        assert_eq!(queue_ms_value(Duration::from_micros(50)), "0.1");
        assert_eq!(queue_ms_value(Duration::from_millis(30_000)), "30000.0");
    }

    #[test]
    fn a_data_parallel_engine_gets_its_rank_header_and_a_plain_pod_none() {
        let cfg = GatewayConfig::from_args(&crate::config::ServeArgs::default()).unwrap();
        let mut client = HeaderMap::new();
        client.insert(DATA_PARALLEL_RANK_HEADER, HeaderValue::from_static("7"));
        let rank1 = Pod::data_parallel_rank(kvgate_core::PodId(1), "http://h:1", "c", 1, 1, 2);
        let up = upstream_request(
            &cfg,
            &rank1,
            &Method::POST,
            "/v1/completions",
            &client,
            "r",
            Bytes::new(),
        )
        .unwrap();
        let ranks: Vec<&HeaderValue> = up
            .headers()
            .get_all(DATA_PARALLEL_RANK_HEADER)
            .iter()
            .collect();
        assert_eq!(
            ranks,
            [&HeaderValue::from_static("1")],
            "the client's value is replaced"
        );
        assert_eq!(up.uri().to_string(), "http://h:1/v1/completions");
        let plain = Pod::new(kvgate_core::PodId(0), "http://h:2", "c", 1);
        let up = upstream_request(
            &cfg,
            &plain,
            &Method::POST,
            "/v1/completions",
            &HeaderMap::new(),
            "r",
            Bytes::new(),
        )
        .unwrap();
        assert!(!up.headers().contains_key(DATA_PARALLEL_RANK_HEADER));
    }
}
