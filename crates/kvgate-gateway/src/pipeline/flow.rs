//! Flow control in the gateway: the thin driver around the core's
//! [`FlowQueue`](kvgate_core::flow::FlowQueue) (`kvgate_core::flow`: the discipline, the rules,
//! the saturation detector, every default).
//!
//! Both data paths call [`wait_turn`] after [`crate::routing::prepare`] and before the first
//! [`crate::routing::decide_for`]: with `[flow_control] enabled = false` (the default) it
//! returns at once and nothing else changes. With it on:
//!
//! - **Class.** Priority: the header `x-kvgate-priority` (an integer, higher first, negative
//!   sheddable: llm-d's convention), else the body's `priority` (vLLM's field, lower first: it
//!   is negated), else 0; a header that is not an integer is 400 `invalid_priority`. Tenant:
//!   with API keys configured, the client's key (as `key-` + 8 hex digits of its xxh3 digest,
//!   never the key); else the header `x-kvgate-tenant` (1–64 of `[A-Za-z0-9._-]`, else 400
//!   `invalid_tenant`; meant for a trusted proxy in front); else a Bearer token's digest as
//!   above; else `default`. Cost: prompt tokens + `max_tokens` (256 when absent).
//! - **Saturation** is the core's detector on the pods as scraped, the session's in-flight
//!   ledger and each pod's latest predicted TTFT (from the last decision that scored it), less
//!   the requests let go and not yet routed (so a burst between two scrapes does not overshoot).
//! - **Queue.** The request waits for a [`Verdict`] from the driver task (spawned with the first
//!   queued request; it wakes on every offer, on every routed request's finish (its pod has
//!   room again) and every `TICK` = 5 ms while anything is queued (new scrapes), expires
//!   entries, and releases what the core's release rule lets go
//!   ([`kvgate_core::flow::release`], the one the simulator runs too: as many as the fleet's
//!   headroom allows; a *bulk* request only into the bulk headroom, else the next request that
//!   is not bulk goes). A released request's first decision excludes the pods without headroom
//!   for it at release (dispatch by headroom: it goes where it can start soon, not into an
//!   engine's queue), unless that would leave no pod. A client that goes
//!   away while queued (its future dropped; Envoy cancelling the ext_proc stream) leaves the
//!   queue at once.
//! - **Answers.** 429 with `Retry-After` for the client's share (`flow_shed` sheddable,
//!   `flow_tenant_share`, `flow_queue_full`, `flow_evicted`), 503 with `Retry-After` when the
//!   fleet is unavailable (`flow_unavailable`: no healthy pod) or the queue TTL ran out (`flow_queue_ttl`); the
//!   request's own deadline running out while queued is the usual 504 `request_timeout`.
//!   Every one is counted in `kvgate_rejected_requests{reason}` and
//!   `kvgate_flow_shed_total{band,tenant,reason}`, and logged (rate limited).
//! - **Time.** Queue time counts in the request's deadline (the timeout is from arrival), in
//!   the TTFT and e2e metrics the gateway reports, and in `/debug/decisions` (`flow.queue_ms`);
//!   not in the TTFT the predictor trains on (that is the pod's).
//! - **vLLM.** With `forward_priority = true` and a priority given by header, the body sent to
//!   the pod (HTTP proxy only: the ext_proc picker does not rewrite bodies) gets vLLM's
//!   `priority` = −priority, unless the body has one.
//!
//! Metrics (`kvgate_flow_*`): `queued{band,tenant}` (gauge), `queue_time_seconds{band,tenant}`
//! (histogram of requests released), `dispatched_total{band,tenant,path}` (`direct` or
//! `queued`), `shed_total{band,tenant,reason}`, `cancelled_total`. Label bound: bands ≤ 33
//! (`-16..=16`), tenants ≤ `max_tenants` + 1 (64 + `other` by default) at any time (the
//! series of a name the queue forgot, core docs `tenant_idle_ms`, are dropped), reasons 7.
//!
//! Bounds: the core's (entries ≤ `max_queued_requests`, bytes ≤ `max_queued_bytes`); the
//! predicted-TTFT table ≤ 2 × pods entries.

use crate::config::GatewayConfig;
pub use crate::decisions::FlowNote;
use crate::errors::ApiError;
use crate::flow_gate::{Dispatching, Verdict};
pub use crate::flow_gate::{FlowGate, Turn};
use crate::handles::telemetry::Telemetry;
use crate::metrics::band_label;
pub use crate::metrics::{ClassLabels, DispatchLabels, FlowMetrics, ShedLabels};
use crate::state::Shared;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use kvgate_core::flow::{
    Expiry, FleetRoom, FlowConfig, FlowRequest, Offer, Rejection, Released, release,
};
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};

/// The priority header (llm-d's convention: higher first, negative sheddable).
pub const PRIORITY_HEADER: &str = "x-kvgate-priority";
/// The tenant header (used when no API keys are configured).
pub const TENANT_HEADER: &str = "x-kvgate-tenant";
/// Longest tenant name accepted from the header.
pub const MAX_TENANT_CHARS: usize = 64;
/// `max_tokens` assumed for the fairness cost when the request gives none.
pub const DEFAULT_COST_MAX_TOKENS: u64 = 256;
/// How often the driver re-checks saturation and deadlines while anything is queued.
const TICK: Duration = Duration::from_millis(5);

/// A request's class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowClass {
    pub priority: i32,
    /// The priority came from the header (only then is it written into the pod's body).
    pub priority_from_header: bool,
    pub tenant: String,
}

/// The fleet's room now ([`FleetRoom`], the core's release rule): the pods' snapshots with
/// the session's in-flight ledger, the latest predicted TTFTs, less the requests being
/// dispatched.
fn view(shared: &Shared, cfg: &FlowConfig) -> FleetRoom {
    let pods = shared.fleet.pods.all();
    let mut snaps: Vec<_> = pods.iter().map(|p| p.snapshot()).collect();
    // Read under the session's lock: a routed request leaves `dispatching` under it, in the
    // step that charges it to the ledger (`Dispatching`).
    let dispatching = {
        let session = shared.session.lock();
        for s in &mut snaps {
            s.in_flight = session.in_flight(s.id);
        }
        shared.admission.flow.dispatching.load(Ordering::Acquire)
    };
    FleetRoom::of(
        &cfg.saturation,
        &snaps,
        &shared.admission.flow.predicted_ttft_ms.lock(),
        dispatching,
    )
}

/// The request's class with flow control on ([`class_of`]); with it off, a neutral class and
/// no header is read (so no request gets a 400 it did not get before).
pub fn request_class(
    cfg: &GatewayConfig,
    headers: &HeaderMap,
    body_priority: Option<i64>,
) -> Result<FlowClass, ApiError> {
    if !cfg.flow.enabled {
        return Ok(FlowClass {
            priority: 0,
            priority_from_header: false,
            tenant: kvgate_core::flow::DEFAULT_TENANT.to_string(),
        });
    }
    class_of(cfg, headers, body_priority)
}

/// The request's class from its headers and the body's `priority` (vLLM's, when an integer;
/// see the module docs), or 400.
pub fn class_of(
    cfg: &GatewayConfig,
    headers: &HeaderMap,
    body_priority: Option<i64>,
) -> Result<FlowClass, ApiError> {
    let (priority, priority_from_header) = match headers.get(PRIORITY_HEADER) {
        Some(v) => {
            let p = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "invalid_priority",
                        format!("{PRIORITY_HEADER} must be an integer"),
                        None,
                    )
                })?;
            (p, true)
        }
        None => {
            let vllm =
                body_priority.map_or(0, |p| p.clamp(-i64::from(i32::MAX), i64::from(i32::MAX)));
            (-(vllm as i32), false)
        }
    };
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty());
    let key_tenant = |k: &str| {
        let d = xxhash_rust::xxh3::xxh3_64(k.as_bytes());
        format!("key-{:08x}", d >> 32)
    };
    let keys_on = !cfg.api_keys.is_empty();
    let tenant = match (keys_on, bearer, headers.get(TENANT_HEADER)) {
        (true, Some(k), _) => key_tenant(k),
        (_, _, Some(h)) => {
            let t = h.to_str().unwrap_or("");
            let ok = !t.is_empty()
                && t.len() <= MAX_TENANT_CHARS
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !ok {
                return Err(ApiError::bad_request(
                    "invalid_tenant",
                    format!("{TENANT_HEADER} must be 1 to {MAX_TENANT_CHARS} of A-Z a-z 0-9 . _ -"),
                    None,
                ));
            }
            t.to_string()
        }
        (false, Some(k), None) => key_tenant(k),
        _ => kvgate_core::flow::DEFAULT_TENANT.to_string(),
    };
    Ok(FlowClass {
        priority,
        priority_from_header,
        tenant,
    })
}

/// With `forward_priority`, a header priority written into the body as vLLM's `priority`
/// (negated: vLLM serves lower first), unless the body has one (`body_has_priority`): the body
/// parsed again and re-serialised then, else returned as it is.
pub fn forward_priority(
    cfg: &FlowConfig,
    class: &FlowClass,
    body_has_priority: bool,
    body: Bytes,
) -> Bytes {
    if !(cfg.enabled && cfg.forward_priority && class.priority_from_header) || body_has_priority {
        return body;
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    let Some(obj) = value.as_object_mut() else {
        return body;
    };
    obj.insert("priority".into(), Value::from(-i64::from(class.priority)));
    serde_json::to_vec(&value).map_or(body, Bytes::from)
}

fn rejection_error(r: Rejection, cfg: &FlowConfig) -> ApiError {
    match r {
        Rejection::Unavailable => ApiError {
            code: r.code(),
            ..crate::errors::no_healthy_pod()
        },
        Rejection::Sheddable => too_many(
            r.code(),
            "the fleet is saturated and the request is sheddable (priority < 0); retry later"
                .into(),
        ),
        Rejection::TenantShare => too_many(
            r.code(),
            format!(
                "this tenant holds its share of the flow queue ({} places); retry later",
                cfg.tenant_cap()
            ),
        ),
        Rejection::QueueFull => too_many(
            r.code(),
            format!(
                "the flow queue is full ({} requests, {} bytes) of requests at least as important; retry later",
                cfg.max_queued_requests, cfg.max_queued_bytes
            ),
        ),
    }
}

fn too_many(code: &'static str, message: String) -> ApiError {
    ApiError {
        status: StatusCode::TOO_MANY_REQUESTS,
        kind: "rate_limit_error",
        code,
        message,
        param: None,
    }
}

fn evicted_error() -> ApiError {
    too_many(
        "flow_evicted",
        "a more important request took this request's place in the flow queue; retry later".into(),
    )
}

fn ttl_error(waited_ms: f64) -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "server_error",
        code: "flow_queue_ttl",
        message: format!(
            "the fleet stayed saturated: the request waited {waited_ms:.0} ms in the flow queue, its limit; retry later"
        ),
        param: None,
    }
}

/// Whether an error from [`wait_turn`] carries `Retry-After`.
pub fn retry_after(err: &ApiError) -> bool {
    matches!(
        err.code,
        "flow_shed"
            | "flow_tenant_share"
            | "flow_queue_full"
            | "flow_evicted"
            | "flow_queue_ttl"
            | "flow_unavailable"
    )
}

/// The error as the client's answer, with `Retry-After` when [`retry_after`] says so.
pub fn reject(telemetry: &Telemetry, err: ApiError, request_id: &str) -> axum::response::Response {
    let retry = retry_after(&err);
    let mut resp = crate::reject::reject(telemetry, err, request_id);
    if retry {
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(crate::limits::RETRY_AFTER_S),
        );
    }
    resp
}

fn count_shed(m: &FlowMetrics, band: i32, tenant: &str, reason: &str) {
    m.shed
        .get_or_create(&ShedLabels {
            band: band_label(band),
            tenant: tenant.to_string(),
            reason: reason.to_string(),
        })
        .inc();
}

fn count_dispatch(m: &FlowMetrics, band: i32, tenant: &str, queued: Option<f64>) {
    m.dispatched
        .get_or_create(&DispatchLabels {
            band: band_label(band),
            tenant: tenant.to_string(),
            path: if queued.is_some() { "queued" } else { "direct" }.into(),
        })
        .inc();
    if let Some(ms) = queued {
        m.queue_time_seconds
            .get_or_create(&ClassLabels {
                band: band_label(band),
                tenant: tenant.to_string(),
            })
            .observe(ms / 1e3);
    }
}

/// A queued request's place: leaves the queue when dropped before its verdict (the client
/// went away), and gives back a release it got but will not use.
struct Waiting {
    shared: Arc<Shared>,
    id: kvgate_core::flow::EntryId,
    rx: Option<oneshot::Receiver<Verdict>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let gate = &self.shared.admission.flow;
        let now = gate.now_ms();
        if gate.queue.lock().remove(self.id, now).is_some() {
            self.shared.telemetry.metrics.flow.cancelled.inc();
            return;
        }
        if let Ok(Verdict::Go { .. }) = rx.try_recv() {
            gate.dispatching.fetch_sub(1, Ordering::AcqRel);
            gate.wake.notify_one();
        }
    }
}

/// Waits until the request may be routed (see the module docs): at once with flow control
/// off or the fleet keeping up; else in the queue, until released, refused or out of time.
/// `deadline` is the request's own (its timeout from arrival). `slot`: the request's admission
/// slot, lent back while it waits in the queue and taken again when released (a request
/// waiting for its priority turn holds no slot: no priority inversion behind the admission's
/// FIFO queue).
pub async fn wait_turn(
    shared: &Arc<Shared>,
    class: &FlowClass,
    cost_tokens: u64,
    bytes: u64,
    deadline: tokio::time::Instant,
    slot: Option<&crate::limits::Slot>,
) -> Result<Turn, ApiError> {
    let cfg = shared.config().flow;
    if !cfg.enabled {
        return Ok(Turn::free());
    }
    let gate = &shared.admission.flow;
    let room = view(shared, &cfg).room();
    let now = gate.now_ms();
    let (tx, rx) = oneshot::channel();
    let req = FlowRequest {
        priority: class.priority,
        tenant: &class.tenant,
        cost_tokens,
        bytes,
        deadline_ms: gate.ms_at(deadline),
    };
    let band = kvgate_core::flow::band_of(class.priority);
    let (offer, tenant, forgotten) = {
        let mut q = gate.queue.lock();
        let t = q.tenant(&cfg, &class.tenant, now);
        let tenant = q.tenant_name(t).to_string();
        let offer = q.offer(&cfg, req, room, now, tx);
        (offer, tenant, q.take_forgotten())
    };
    for name in forgotten {
        shared.telemetry.metrics.flow.forget_tenant(&name);
    }
    let note = |queue_ms: f64| FlowNote {
        priority: class.priority,
        band,
        tenant: tenant.clone(),
        queue_ms,
    };
    let id = match offer {
        Offer::Dispatch(_) => {
            let dispatching = Dispatching::enter(&gate.dispatching);
            count_dispatch(&shared.telemetry.metrics.flow, band, &tenant, None);
            return Ok(Turn {
                dispatching: Some(dispatching),
                wake: Some(gate.wake.clone()),
                note: Some(note(0.0)),
                queued: Duration::ZERO,
                closed: Vec::new(),
            });
        }
        Offer::Rejected(r, _) => {
            count_shed(&shared.telemetry.metrics.flow, band, &tenant, r.code());
            return Err(rejection_error(r, &cfg));
        }
        Offer::Queued(id, evicted) => {
            for e in evicted {
                let name = gate.queue.lock().tenant_name(e.tenant).to_string();
                count_shed(
                    &shared.telemetry.metrics.flow,
                    e.band,
                    &name,
                    "flow_evicted",
                );
                let _ = e.payload.send(Verdict::Evicted);
            }
            id
        }
    };
    start_driver(shared);
    gate.wake.notify_one();
    // Waiting for the turn holds no admission slot (no priority inversion behind the
    // admission's FIFO queue); the slot is taken again when the turn comes.
    if let Some(slot) = slot {
        slot.lend();
    }
    let mut waiting = Waiting {
        shared: shared.clone(),
        id,
        rx: Some(rx),
    };
    let verdict = match waiting.rx.as_mut() {
        Some(rx) => rx.await,
        None => return Err(evicted_error()),
    };
    // A verdict arrived: the place is gone, nothing to give back on drop.
    waiting.rx = None;
    match verdict {
        Ok(Verdict::Go { queued_ms, closed }) => {
            let turn = Turn {
                dispatching: Some(Dispatching::counted(&gate.dispatching)),
                wake: Some(gate.wake.clone()),
                note: Some(note(queued_ms)),
                queued: Duration::from_secs_f64(queued_ms / 1e3),
                closed,
            };
            // The slot lent while waiting (dropping `turn` on a timeout ends its dispatch).
            if let Some(slot) = slot
                && tokio::time::timeout_at(deadline, slot.reclaim(&shared.admission.slots))
                    .await
                    .is_err()
            {
                return Err(crate::errors::request_timeout(
                    shared.config().request_timeout,
                ));
            }
            Ok(turn)
        }
        Ok(Verdict::Expired(Expiry::Deadline, _)) => Err(crate::errors::request_timeout(
            shared.config().request_timeout,
        )),
        Ok(Verdict::Expired(Expiry::Ttl, waited)) => Err(ttl_error(waited)),
        Ok(Verdict::Evicted) | Err(_) => Err(evicted_error()),
    }
}

fn start_driver(shared: &Arc<Shared>) {
    if shared
        .admission
        .flow
        .driver_started
        .swap(true, Ordering::AcqRel)
    {
        return;
    }
    let weak = Arc::downgrade(shared);
    let wake = shared.admission.flow.wake.clone();
    tokio::spawn(drive(weak, wake));
}

/// The driver task: expire, then release while the fleet has headroom; see the module docs.
async fn drive(weak: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let busy = pump(&shared);
        drop(shared);
        let wait = if busy { TICK } else { Duration::from_secs(1) };
        let _ = tokio::time::timeout(wait, wake.notified()).await;
    }
}

/// One round of the driver; true while the queue holds requests.
fn pump(shared: &Shared) -> bool {
    let gate = &shared.admission.flow;
    let cfg = shared.config().flow;
    let now = gate.now_ms();
    let expired = gate.queue.lock().expire(now);
    for (l, why) in expired {
        let name = gate.queue.lock().tenant_name(l.tenant).to_string();
        let reason = match why {
            Expiry::Ttl => "flow_queue_ttl",
            Expiry::Deadline => "request_timeout",
        };
        count_shed(&shared.telemetry.metrics.flow, l.band, &name, reason);
        let _ = l.payload.send(Verdict::Expired(why, l.queued_ms));
    }
    if gate.queue.lock().is_empty() {
        return false;
    }
    let room = view(shared, &cfg);
    let mut dispatched = Vec::new();
    release(
        &mut gate.queue.lock(),
        &cfg,
        &room,
        now,
        |Released { left, bulk }, tenant| {
            let queued_ms = left.queued_ms;
            let closed = room.closed_to(bulk).to_vec();
            gate.dispatching.fetch_add(1, Ordering::AcqRel);
            // A waiter gone between its pop and this send (its request ended) takes no turn
            // and no headroom.
            if left
                .payload
                .send(Verdict::Go { queued_ms, closed })
                .is_err()
            {
                gate.dispatching.fetch_sub(1, Ordering::AcqRel);
                return false;
            }
            dispatched.push((left.band, tenant.to_string(), queued_ms));
            true
        },
    );
    for (band, tenant, queued_ms) in dispatched {
        count_dispatch(
            &shared.telemetry.metrics.flow,
            band,
            &tenant,
            Some(queued_ms),
        );
    }
    !gate.queue.lock().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_core::flow::Saturation;

    fn shared(keys: &[&str]) -> Arc<Shared> {
        let args = crate::config::ServeArgs {
            api_key: keys.iter().map(|k| k.to_string()).collect(),
            ..Default::default()
        };
        Shared::new(crate::config::GatewayConfig::from_args(&args).unwrap())
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_priority_header_wins_and_the_body_field_is_vllms_negated() {
        let s = shared(&[]);
        let body = Some(3);
        let c = class_of(&s.config(), &headers(&[(PRIORITY_HEADER, "5")]), body).unwrap();
        assert_eq!((c.priority, c.priority_from_header), (5, true));
        let c = class_of(&s.config(), &HeaderMap::new(), body).unwrap();
        assert_eq!((c.priority, c.priority_from_header), (-3, false));
        let c = class_of(&s.config(), &HeaderMap::new(), None).unwrap();
        assert_eq!(c.priority, 0);
        let e = class_of(&s.config(), &headers(&[(PRIORITY_HEADER, "high")]), body).unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_REQUEST, "invalid_priority")
        );
    }

    #[test]
    fn the_tenant_is_the_api_key_digest_when_keys_are_on_else_the_header() {
        let open = shared(&[]);
        let h = headers(&[(TENANT_HEADER, "team-a"), ("authorization", "Bearer sk-1")]);
        assert_eq!(class_of(&open.config(), &h, None).unwrap().tenant, "team-a");
        let keyed = shared(&["sk-1"]);
        let t = class_of(&keyed.config(), &h, None).unwrap().tenant;
        assert!(
            t.starts_with("key-") && t.len() == 12 && !t.contains("sk-1"),
            "{t}"
        );
        let only_key = headers(&[("authorization", "Bearer sk-1")]);
        assert_eq!(class_of(&open.config(), &only_key, None).unwrap().tenant, t);
        assert_eq!(
            class_of(&open.config(), &HeaderMap::new(), None)
                .unwrap()
                .tenant,
            "default"
        );
        for bad in ["a b", "x/y", &"t".repeat(65)] {
            let e = class_of(&open.config(), &headers(&[(TENANT_HEADER, bad)]), None).unwrap_err();
            assert_eq!(e.code, "invalid_tenant");
        }
    }

    #[test]
    fn a_header_priority_is_forwarded_negated_only_when_asked_and_absent() {
        let class = FlowClass {
            priority: 4,
            priority_from_header: true,
            tenant: "t".into(),
        };
        let on = FlowConfig {
            enabled: true,
            forward_priority: true,
            ..FlowConfig::default()
        };
        let body = Bytes::from_static(br#"{"model": "m"}"#);
        let off = FlowConfig {
            forward_priority: false,
            ..on
        };
        assert_eq!(forward_priority(&off, &class, false, body.clone()), body);
        let sent: Value =
            serde_json::from_slice(&forward_priority(&on, &class, false, body)).unwrap();
        assert_eq!(sent, serde_json::json!({"model": "m", "priority": -4}));
        let own = Bytes::from_static(br#"{"priority": 9}"#);
        assert_eq!(forward_priority(&on, &class, true, own.clone()), own);
    }

    #[test]
    fn the_fleet_view_closes_pods_without_headroom_and_bulk_sees_the_lowered_kv_threshold() {
        let s = shared(&[]);
        s.fleet.pods.replace(
            &[
                crate::pods::PodEntry::new("http://a", "c"),
                crate::pods::PodEntry::new("http://b", "c"),
                crate::pods::PodEntry::new("http://c", "c"),
            ],
            1000,
        );
        let pods = s.fleet.pods.all();
        for (p, kv) in pods.iter().zip([0.9, 0.6, 0.2]) {
            p.healthy.store(true, Ordering::Relaxed);
            p.apply_metrics(&crate::pods::PodMetrics {
                running: Some(1),
                waiting: Some(0),
                kv_usage: Some(kv),
                ..Default::default()
            });
        }
        let cfg = FlowConfig {
            enabled: true,
            ..FlowConfig::default()
        };
        let v = view(&s, &cfg);
        let (a, b) = (pods[0].id, pods[1].id);
        // a is over KV 0.8: closed to all; b under 0.8 but over 0.5: closed to bulk only.
        assert_eq!(v.closed, vec![a]);
        assert_eq!(v.closed_bulk, vec![a, b]);
        assert_eq!(v.saturation, Saturation::Headroom(10));
        // c takes one bulk request (the bulk queue depth, 5 − the reserve 4).
        assert_eq!(v.bulk_room, 1);
        // Requests let go and not yet routed count against both.
        s.admission.flow.dispatching.store(6, Ordering::Release);
        let v = view(&s, &cfg);
        assert_eq!(v.saturation, Saturation::Headroom(4));
        assert_eq!(v.bulk_room, 0);
    }

    #[tokio::test]
    async fn off_by_default_every_request_goes_at_once() {
        let s = shared(&[]);
        assert!(!s.config().flow.enabled);
        let class = FlowClass {
            priority: -5,
            priority_from_header: true,
            tenant: "t".into(),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        let turn = wait_turn(&s, &class, 10, 10, deadline, None).await.unwrap();
        assert!(turn.note.is_none());
        assert_eq!(turn.queued, Duration::ZERO);
    }

    /// A name the queue forgets (its place taken by a newcomer after `tenant_idle_ms`) leaves
    /// `/metrics` with it, so per-tenant series stay bounded however many tenants come and go.
    #[tokio::test]
    async fn a_forgotten_tenants_series_leave_the_metrics() {
        let mut config =
            crate::config::GatewayConfig::from_args(&crate::config::ServeArgs::default()).unwrap();
        config.flow.enabled = true;
        config.flow.max_tenants = 1;
        config.flow.tenant_idle_ms = 0;
        let s = Shared::new(config);
        let class = |tenant: &str| FlowClass {
            priority: 0,
            priority_from_header: false,
            tenant: tenant.into(),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        // No pod: each request is refused 503 flow_unavailable and counted for its tenant.
        for t in ["alpha", "beta"] {
            let Err(err) = wait_turn(&s, &class(t), 10, 10, deadline, None).await else {
                panic!("{t}: no pod, so refused");
            };
            assert_eq!(err.status, StatusCode::SERVICE_UNAVAILABLE);
            let text = s.metrics_text().unwrap();
            let series = |name: &str| {
                text.lines()
                    .filter(|l| l.starts_with("kvgate_flow_shed_total{"))
                    .filter(|l| l.contains(&format!("tenant=\"{name}\"")))
                    .count()
            };
            assert_eq!(series(t), 1, "{t}: {text}");
            if t == "beta" {
                assert_eq!(series("alpha"), 0, "alpha was forgotten: {text}");
            }
        }
    }
}
