//! The pipeline's second half, one function for both transports ([`dispatch`]): decide, hand
//! the request to the transport, and on a failure before any byte reached the client route
//! again with the failed pod excluded; a P/D request's prefill call is made here and its
//! decode pick handed on with the decode body.
//!
//! 1. **Decide** ([`decide`]): one decision through the core session
//!    ([`crate::routing::decide_for`]) among the pods that serve the request's model (those
//!    known to serve only others are excluded: [`crate::served_models::not_serving`]); the first one avoids the pods flow control found
//!    without headroom when it released the request (dispatch by headroom), falling back to all
//!    when that leaves none. The chosen pod comes back as its handle (`Arc<Pod>`) with its
//!    ticket. The flow turn ends at the first routed decision: from then the session's ledger
//!    counts the request.
//! 2. **P/D handoff** (a fleet with `prefill` / `decode` pods; [`crate::pd`]): the prefill call
//!    on the prefill pick; its `kv_transfer_params` go into the decode body, and the decode pick
//!    is the transport's target. A prefill that fails (unreachable, first-byte timeout, 5xx, no
//!    transfer parameters) excludes its pod and routes again. A prefill 4xx is the client's
//!    answer, the pod's status, headers and body as it sent them ([`DispatchError::Pod`]): what
//!    the client of a plain vLLM would get for the same request, on both transports. The
//!    request timeout while prefilling: 504 (counted as a `request` timeout).
//! 3. **Deliver** ([`Deliver`]): the transport's own work. The HTTP proxy forwards the request
//!    and streams the answer (a connect error, a first-byte timeout or a 5xx is a
//!    [`Delivery::Failed`], routed again); ext_proc names the pod to Envoy (it sees no failure
//!    before answering: Envoy forwards).
//! 4. **Retry**: at most `max_retries` more decisions, each within the retry budget
//!    ([`crate::retry_budget`]; a retry after a lost connection is free of it: the pod holds no
//!    work for the request). The retry's token goes with its target, held until the response
//!    ends. Out of retries, or no pod left after a failure: 502 `upstream_failed` with the last
//!    failure. No pod at the first decision: [`DispatchError::NoPod`].

use crate::config::GatewayConfig;
use crate::errors::{ApiError, upstream_failed};
use crate::flow_gate::Turn;
use crate::lifecycle::TicketGuard;
use crate::pods::Pod;
use crate::retry_budget::RetryToken;
use crate::routing::{DecisionMeta, Pick, Routed, SplitRouted};
use crate::state::{AdmissionHandle, Shared, Telemetry};
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use kvgate_core::{PodId, RouteRequest};
use serde_json::Value;
use std::sync::Arc;

/// One completion request, ready to route (after [`super::ready`]).
pub(crate) struct Dispatch<'a> {
    pub shared: &'a Arc<Shared>,
    pub cfg: &'a GatewayConfig,
    pub request: RouteRequest<'a>,
    pub request_id: &'a str,
    /// The flow turn: ended at the first routed decision.
    pub turn: Turn,
    /// Pods never to route to (ext_proc: those outside the subset hint).
    pub excluded: Vec<PodId>,
    /// The client's request body when it may be split in two stages (a fleet with P/D roles;
    /// parsed again for the prefill and decode bodies only when it is); `None`: whole requests
    /// only.
    pub split: Option<&'a [u8]>,
    /// What a prefill call is sent with: the client's method, path and headers, and the
    /// request's deadline.
    pub method: &'a Method,
    pub path_and_query: &'a str,
    pub headers: &'a HeaderMap,
    pub deadline: tokio::time::Instant,
    /// The request's trace ([`crate::otel`]; empty with tracing off).
    pub trace: &'a crate::otel::RequestTrace,
}

/// Where the transport sends the request: the pod and the request's ticket on it.
pub(crate) struct Target {
    pub pod: Arc<Pod>,
    pub guard: TicketGuard,
    pub policy: &'static str,
    pub branch: &'static str,
    /// The decode stage of a P/D request; `None` for a whole request.
    pub handoff: Option<Handoff>,
    /// A retry's place in the retry budget, held until the response ends.
    pub retry: Option<RetryToken>,
}

/// A P/D request after its prefill: what the decode pod gets.
pub(crate) struct Handoff {
    pub prefill_pod: Arc<Pod>,
    /// The client's request with the prefill's `kv_transfer_params`.
    pub decode_body: Value,
}

/// How a transport's delivery went.
pub(crate) enum Delivery<A> {
    /// The client's answer (the pod's response, or an error the transport gives).
    Answer(A),
    /// Failed before any byte reached the client: route again without the pod.
    Failed(Failure),
}

/// The transport's part of the pipeline: sending the request to a target.
pub(crate) trait Deliver {
    type Answer;
    fn deliver(
        &mut self,
        target: Target,
    ) -> impl std::future::Future<Output = Delivery<Self::Answer>> + Send;
}

/// Why an attempt failed before any byte reached the client.
#[derive(Debug, Default)]
pub(crate) struct Failure {
    /// For the client's error and the log.
    pub why: String,
    /// The connection failed or broke before the pod answered: the pod holds no work for the
    /// request, so its retry is free of the retry budget.
    pub connection_lost: bool,
}

impl Failure {
    /// A failure whose retry needs the retry budget.
    pub fn counted(why: String) -> Failure {
        Failure {
            why,
            connection_lost: false,
        }
    }
}

/// A request that was not delivered.
pub(crate) enum DispatchError {
    /// No pod to route to at the first decision: 503 (the transport words it).
    NoPod,
    /// An error the gateway answers: 502 `upstream_failed`, 504 at the request timeout.
    Gateway(ApiError),
    /// A prefill pod's own 4xx, for the client as the pod sent it.
    Pod(PodAnswer),
}

/// A pod's answer passed to the client as it came (status, the pod's headers, body).
pub(crate) struct PodAnswer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Routes `d` and hands each target to `to` until one answers (see the module docs).
pub(crate) async fn dispatch<D: Deliver>(
    d: Dispatch<'_>,
    to: &mut D,
) -> Result<D::Answer, DispatchError> {
    let Dispatch {
        shared,
        cfg,
        request,
        request_id: rid,
        turn,
        mut excluded,
        split,
        method,
        path_and_query,
        headers,
        deadline,
        trace,
    } = d;
    // Model-aware fleets: the pods of other models are never candidates.
    if let Some(model) = request.adapter {
        excluded.extend(crate::served_models::not_serving(&shared.fleet.pods, model));
    }
    let flow = turn.note.clone();
    let mut turn = Some(turn);
    // Dispatch by headroom: the first decision avoids the pods flow control found closed.
    let mut closed = turn
        .as_mut()
        .map_or_else(Vec::new, |t| std::mem::take(&mut t.closed));
    let mut last = Failure::default();
    let mut retry: Option<RetryToken> = None;
    for attempt in 0..=cfg.max_retries {
        if attempt > 0 {
            // This request's earlier retry, which failed, leaves the budget first.
            drop(retry.take());
            match retry_token(&shared.admission, &shared.telemetry, rid, &mut last) {
                Some(token) => retry = token,
                None => break,
            }
        }
        let meta = DecisionMeta {
            request_id: rid,
            attempt,
            flow: flow.as_ref(),
            split: split.is_some(),
            trace,
            dispatching: turn.as_ref().and_then(|t| t.dispatching.as_ref()),
        };
        let pick = decide(shared, &request, &excluded, &closed, meta);
        if matches!(pick, Pick::Routed(_) | Pick::Split(_)) {
            // Routed: the session's ledger counts the request now.
            drop(turn.take());
            closed.clear();
        }
        let target = match pick {
            Pick::Routed(r) => {
                let Routed {
                    pod,
                    guard,
                    policy,
                    branch,
                } = *r;
                Target {
                    pod,
                    guard,
                    policy,
                    branch,
                    handoff: None,
                    retry: retry.take(),
                }
            }
            Pick::Split(s) => {
                let call = crate::pd::PrefillCall {
                    cfg,
                    method,
                    path_and_query,
                    headers,
                    request_id: rid,
                    deadline,
                    policy: s.policy,
                    branch: s.branch,
                };
                match prefill(shared, &call, *s, split).await {
                    Prefill::Decode(mut t) => {
                        t.retry = retry.take();
                        t
                    }
                    Prefill::Failed(pod, failure) => {
                        if shared.telemetry.log_limit.allow("pd_prefill_failed") {
                            tracing::warn!(request_id = %rid, %attempt, why = %failure.why, "prefill failed; routing again");
                        }
                        last = failure;
                        excluded.push(pod);
                        continue;
                    }
                    Prefill::Stop(e) => return Err(e),
                }
            }
            Pick::NoHealthyPod if attempt > 0 => break,
            Pick::NoHealthyPod | Pick::NoDecision => return Err(DispatchError::NoPod),
        };
        let pod = target.pod.id;
        match to.deliver(target).await {
            Delivery::Answer(a) => return Ok(a),
            Delivery::Failed(failure) => {
                last = failure;
                excluded.push(pod);
            }
        }
    }
    Err(DispatchError::Gateway(upstream_failed(last.why)))
}

/// One decision ([`crate::routing::decide_for`]); with `closed` (pods flow control found
/// without headroom) it avoids those too, unless that leaves no pod.
pub(crate) fn decide(
    shared: &Arc<Shared>,
    request: &RouteRequest<'_>,
    excluded: &[PodId],
    closed: &[PodId],
    meta: DecisionMeta<'_>,
) -> Pick {
    if !closed.is_empty() {
        let both: Vec<PodId> = excluded.iter().chain(closed).copied().collect();
        match crate::routing::decide_for(shared, request, &both, meta) {
            Pick::NoHealthyPod => {}
            pick => return pick,
        }
    }
    crate::routing::decide_for(shared, request, excluded, meta)
}

/// A retry's place in the retry budget (`Some(None)`: a retry after a lost connection, free of
/// it), or `None` when the budget is spent (counted, logged, and said in `last`).
fn retry_token(
    admission: &AdmissionHandle,
    telemetry: &Telemetry,
    rid: &str,
    last: &mut Failure,
) -> Option<Option<RetryToken>> {
    if last.connection_lost {
        telemetry.metrics.retries.inc();
        return Some(None);
    }
    match admission.retry_budget.try_start(admission.slots.active()) {
        Some(token) => {
            telemetry.metrics.retries.inc();
            Some(Some(token))
        }
        None => {
            telemetry.metrics.retries_refused.inc();
            if telemetry.log_limit.allow("retry_refused") {
                tracing::warn!(request_id = %rid, why = %last.why, "retry budget spent; not retried");
            }
            last.why
                .push_str("; not retried: the retry budget is spent");
            None
        }
    }
}

/// How a P/D request's prefill went.
enum Prefill {
    /// The decode pick with its body: the transport's target (its retry token set after).
    Decode(Target),
    /// Exclude the pod and route again.
    Failed(PodId, Failure),
    /// The request ends here.
    Stop(DispatchError),
}

/// The prefill call on the split's prefill pod ([`crate::pd::prefill`]), then the decode pick
/// as the target.
async fn prefill(
    shared: &Shared,
    call: &crate::pd::PrefillCall<'_>,
    s: SplitRouted,
    body: Option<&[u8]>,
) -> Prefill {
    // The body was read as JSON before routing; a failure here cannot happen.
    let Some(Ok(value)) = body.map(serde_json::from_slice::<Value>) else {
        // Cannot happen: a split is asked for (`DecisionMeta::split`) only with the body.
        let why = "no request body kept for P/D".to_string();
        return Prefill::Failed(s.prefill_pod.id, Failure::counted(why));
    };
    let value = &value;
    let prefilled = crate::pd::prefill(shared, call, &s.prefill_pod, s.prefill_guard, value).await;
    match prefilled {
        crate::pd::Prefilled::Params(params) => Prefill::Decode(Target {
            pod: s.decode_pod,
            guard: s.decode_guard,
            policy: s.policy,
            branch: s.branch,
            handoff: Some(Handoff {
                prefill_pod: s.prefill_pod,
                decode_body: crate::pd::decode_value(value, params),
            }),
            retry: None,
        }),
        crate::pd::Prefilled::Failed(why) => {
            Prefill::Failed(s.prefill_pod.id, Failure::counted(why))
        }
        crate::pd::Prefilled::ClientError(status, headers, body) => {
            Prefill::Stop(DispatchError::Pod(PodAnswer {
                status,
                headers,
                body,
            }))
        }
        crate::pd::Prefilled::RequestTimeout => Prefill::Stop(DispatchError::Gateway(
            crate::upstream::request_timeout_error(
                &shared.telemetry,
                call.cfg,
                &s.prefill_pod,
                call.request_id,
            ),
        )),
    }
}
