//! Prefill/decode (P/D) disaggregation's protocol between the two pods the core picked
//! ([`kvgate_core::RouterSession::route_pd`]): the prefill call and the decode body. The
//! handoff itself (prefill, then the decode pick as the transport's target, the retries) is
//! the request pipeline's, one for the HTTP proxy and the ext_proc picker
//! ([`crate::pipeline::dispatch`]); the proxy sends the decode body itself, ext_proc hands it
//! to Envoy.
//!
//! The protocol is vLLM's (`NixlConnector`, observed on vLLM 0.32; its `toy_proxy_server.py`
//! does the same):
//!
//! 1. **prefill**: the request goes to the prefill pod as a non-stream request with
//!    `max_tokens: 1` (and `max_completion_tokens: 1` when the client set that),
//!    `stream: false`, no `stream_options`, and `"kv_transfer_params": {"do_remote_decode":
//!    true}`. The pod computes the prompt's KV, keeps it for the decode pod and answers with
//!    `kv_transfer_params` (`do_remote_prefill`, `remote_block_ids`, `remote_engine_id`,
//!    `remote_host`, `remote_port`, …). The answer is read whole (≤ [`MAX_PREFILL_ANSWER_BYTES`])
//!    and never reaches the client. Its ticket ends here: the prefill pod's charge is returned
//!    and its class learns the call's duration as TTFT.
//! 2. **decode**: the client's request, unchanged but for the prefill's `kv_transfer_params`
//!    (as they came) and the usual `include_usage`, goes to the decode pod, which pulls the KV
//!    instead of computing the prompt; its answer (stream or not) is the client's.
//!
//! Failures, all before any byte reached the client: a prefill pod that cannot be reached,
//! times out on its first byte, answers 5xx or answers without `kv_transfer_params` is
//! excluded and the request routed again (another prefill pod; none left: the request whole on
//! a `both` pod, or 502). A prefill answer 4xx is the client's error: passed through (status,
//! headers, body), on both transports. A decode pod failing before its first byte (seen by the
//! HTTP proxy only: through Envoy it is Envoy's) is excluded and the request routed again from
//! a fresh prefill (the transferred blocks are for one pull). Both count towards
//! `max_retries`, within the retry budget.
//!
//! Metrics (`kvgate_pd_*`): `requests_total{route}` (`split` or `whole` — a request served whole in a fleet
//! with roles), `stage_total{stage, outcome}` (prefill `ok` | `failed` | `no_transfer_params` |
//! `client_error`; decode `ok` | `failed`), `prefill_ms` (the prefill call, histogram).
//!
//! Bounds: the prefill answer ≤ 1 MiB; the request body is copied twice (prefill and decode
//! bodies), each ≤ `max_body_bytes`.

use crate::config::GatewayConfig;
use crate::lifecycle::TicketGuard;
use crate::metrics::Metrics;
pub use crate::metrics::{PdMetrics, RouteLabel, StageLabels};
use crate::pods::Pod;
use crate::state::Shared;
use crate::upstream::{Sent, attempt_failed, send, upstream_request};
use bytes::Bytes;
use http::{HeaderMap, Method};
use http_body_util::{BodyExt, Limited};
use kvgate_core::Observed;
use serde_json::Value;
use std::time::Instant;

/// Largest prefill answer read (a one-token completion with its transfer parameters is ~1 KiB).
pub const MAX_PREFILL_ANSWER_BYTES: usize = 1 << 20;

/// The body of the prefill call: the client's request as one non-stream token that keeps its
/// KV for a remote decode.
pub fn prefill_body(value: &Value) -> Bytes {
    let mut v = value.clone();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("max_tokens".into(), Value::from(1));
        if obj.contains_key("max_completion_tokens") {
            obj.insert("max_completion_tokens".into(), Value::from(1));
        }
        obj.insert("stream".into(), Value::Bool(false));
        obj.remove("stream_options");
        obj.insert(
            "kv_transfer_params".into(),
            serde_json::json!({"do_remote_decode": true}),
        );
    }
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

/// The client's request for the decode pod: `value` with the prefill's transfer parameters.
pub fn decode_value(value: &Value, kv_transfer_params: Value) -> Value {
    let mut v = value.clone();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("kv_transfer_params".into(), kv_transfer_params);
    }
    v
}

/// The `kv_transfer_params` object of a prefill answer, if it has one.
pub fn transfer_params(answer: &[u8]) -> Option<Value> {
    let v: Value = serde_json::from_slice(answer).ok()?;
    match v.get("kv_transfer_params") {
        Some(p @ Value::Object(_)) => Some(p.clone()),
        _ => None,
    }
}

/// How a prefill call went.
pub(crate) enum Prefilled {
    /// The transfer parameters for the decode pod.
    Params(Value),
    /// Exclude the pod and route again.
    Failed(String),
    /// A 4xx: the client's answer (status and body as the pod sent them).
    ClientError(http::StatusCode, HeaderMap, Bytes),
    /// The request's deadline passed.
    RequestTimeout,
}

/// What the prefill call is sent with.
pub(crate) struct PrefillCall<'a> {
    pub cfg: &'a GatewayConfig,
    pub method: &'a Method,
    pub path_and_query: &'a str,
    pub headers: &'a HeaderMap,
    pub request_id: &'a str,
    pub deadline: tokio::time::Instant,
    pub policy: &'static str,
    pub branch: &'static str,
}

/// The prefill stage on `pod`; `guard` (the prefill ticket) ends here, trained on the call's
/// duration when it returned transfer parameters.
pub(crate) async fn prefill(
    shared: &Shared,
    call: &PrefillCall<'_>,
    pod: &Pod,
    guard: TicketGuard,
    value: &Value,
) -> Prefilled {
    let started = Instant::now();
    let up = match upstream_request(
        call.cfg,
        pod,
        call.method,
        call.path_and_query,
        call.headers,
        call.request_id,
        prefill_body(value),
    ) {
        Ok(r) => r,
        Err(e) => {
            return failed(
                &shared.telemetry.metrics,
                call,
                pod,
                "failed",
                format!("pod {}: {e}", pod.url),
            );
        }
    };
    let resp = match send(shared, call.cfg, pod, up, call.deadline).await {
        Sent::RequestTimeout => return Prefilled::RequestTimeout,
        Sent::FirstByteTimeout(why) => {
            return failed(&shared.telemetry.metrics, call, pod, "failed", why);
        }
        Sent::Answer(Err(e)) => {
            if e.is_connect() {
                pod.mark_unhealthy();
            }
            let why = format!("prefill pod {} failed: {e}", pod.url);
            return failed(&shared.telemetry.metrics, call, pod, "failed", why);
        }
        Sent::Answer(Ok(resp)) => resp,
    };
    let (parts, body) = resp.into_parts();
    let read = tokio::time::timeout_at(
        call.deadline,
        Limited::new(body, MAX_PREFILL_ANSWER_BYTES).collect(),
    )
    .await;
    let body = match read {
        Err(_) => return Prefilled::RequestTimeout,
        Ok(Err(e)) => {
            let why = format!("prefill pod {}: answer unreadable: {e}", pod.url);
            return failed(&shared.telemetry.metrics, call, pod, "failed", why);
        }
        Ok(Ok(c)) => c.to_bytes(),
    };
    if parts.status.is_server_error() {
        let why = format!("prefill pod {} answered {}", pod.url, parts.status);
        return failed(&shared.telemetry.metrics, call, pod, "failed", why);
    }
    if !parts.status.is_success() {
        shared.telemetry.metrics.pd.stage("prefill", "client_error");
        return Prefilled::ClientError(parts.status, parts.headers, body);
    }
    let Some(params) = transfer_params(&body) else {
        let why = format!(
            "prefill pod {} answered without kv_transfer_params (is it a kv_producer?)",
            pod.url
        );
        return failed(
            &shared.telemetry.metrics,
            call,
            pod,
            "no_transfer_params",
            why,
        );
    };
    pod.breaker.success();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    shared.telemetry.metrics.pd.prefill_ms.observe(ms);
    shared.telemetry.metrics.pd.stage("prefill", "ok");
    guard.finish(Some(Observed {
        ttft_ms: ms,
        tpot_ms: None,
    }));
    Prefilled::Params(params)
}

fn failed(
    metrics: &Metrics,
    call: &PrefillCall<'_>,
    pod: &Pod,
    outcome: &'static str,
    why: String,
) -> Prefilled {
    metrics.pd.stage("prefill", outcome);
    attempt_failed(metrics, pod, call.policy, call.branch);
    Prefilled::Failed(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_body_asks_for_one_non_stream_token_kept_for_a_remote_decode() {
        let v = serde_json::json!({
            "model": "m", "prompt": "hi", "max_tokens": 50, "stream": true,
            "stream_options": {"include_usage": true}, "temperature": 0
        });
        let out: Value = serde_json::from_slice(&prefill_body(&v)).unwrap();
        assert_eq!(
            out,
            serde_json::json!({
                "model": "m", "prompt": "hi", "max_tokens": 1, "stream": false,
                "temperature": 0, "kv_transfer_params": {"do_remote_decode": true}
            })
        );
        let chat = serde_json::json!({"messages": [], "max_completion_tokens": 9});
        let out: Value = serde_json::from_slice(&prefill_body(&chat)).unwrap();
        assert_eq!(out["max_completion_tokens"], 1);
        assert_eq!(out["max_tokens"], 1);
    }

    #[test]
    fn transfer_params_are_taken_as_they_came_and_only_as_an_object() {
        let answer = br#"{"choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_port":5600}}"#;
        let p = transfer_params(answer).unwrap();
        assert_eq!(p["remote_block_ids"], serde_json::json!([1, 2]));
        let v = decode_value(&serde_json::json!({"prompt": "hi", "stream": true}), p);
        assert_eq!(v["kv_transfer_params"]["remote_port"], 5600);
        assert_eq!(v["stream"], true);
        assert!(transfer_params(br#"{"kv_transfer_params":null}"#).is_none());
        assert!(transfer_params(br#"{"choices":[]}"#).is_none());
        assert!(transfer_params(b"not json").is_none());
    }
}
