//! [`AdmissionHandle`]: what lets a request in and out — the traffic listener's slots and
//! queue (shared with ext_proc), the request-body budget, flow control's gate, the retry
//! budget, and the shutdown state (`/readyz` 503, then the end of the grace for streams).
//!
//! Memory: requests in service ≤ `max_concurrent_requests`, waiting ≤
//! `max_waiting_requests`; body bytes held ≤ `max_body_bytes_in_flight`; the flow queue's own
//! bounds (`[flow_control]`: size, bytes, TTL); retries ≤ 20 % of requests in flight.

use crate::flow_gate::FlowGate;
use crate::grace::GraceEnd;
use crate::limits::{Admission, BodyBudget};
use crate::retry_budget::RetryBudget;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Admission, flow and shutdown state; see the module docs.
pub struct AdmissionHandle {
    /// Slots and queue of the traffic listener (sized at start).
    pub slots: Admission,
    /// Request-body bytes held now (`max_body_bytes_in_flight` bounds it).
    pub body_budget: Arc<BodyBudget>,
    /// Flow control's queue and driver state ([`crate::flow_gate`], driven by [`crate::flow`]).
    pub flow: FlowGate,
    /// Retries in flight, bounded by the requests in flight ([`crate::retry_budget`]).
    pub retry_budget: Arc<RetryBudget>,
    /// Set by [`crate::Gateway::shutdown`]: `/readyz` answers 503.
    pub shutting_down: AtomicBool,
    /// Set when [`crate::Gateway::shutdown`]'s grace is over: streams in flight end with an SSE
    /// error event and `[DONE]`.
    pub grace_end: Arc<GraceEnd>,
}

impl AdmissionHandle {
    /// `max_concurrent` slots and a queue of `max_waiting`.
    pub fn new(max_concurrent: usize, max_waiting: usize) -> AdmissionHandle {
        AdmissionHandle {
            slots: Admission::new(max_concurrent, max_waiting),
            body_budget: Arc::default(),
            flow: FlowGate::default(),
            retry_budget: Arc::default(),
            shutting_down: AtomicBool::new(false),
            grace_end: Arc::default(),
        }
    }
}
