//! Flow control's state held in [`crate::state::AdmissionHandle::flow`]: the core's queue of
//! waiting requests, the requests let go and not yet routed, the latest predicted TTFT per pod
//! and the driver's wake-up; a request's [`Turn`]. The rules, the driver and the answers are
//! [`crate::flow`]'s.

use crate::decisions::FlowNote;
use crate::metrics::{ClassLabels, FlowMetrics};
use kvgate_core::PodId;
use kvgate_core::flow::{Expiry, FlowQueue, PredictedTtft};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};

/// The driver's answer to a queued request.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Route now, to a pod outside `closed` (the pods without headroom for it at release).
    Go {
        queued_ms: f64,
        closed: Vec<PodId>,
    },
    Expired(Expiry, f64),
    Evicted,
}

/// The gateway's flow-control state (in [`crate::state::AdmissionHandle::flow`]).
pub struct FlowGate {
    pub(crate) queue: Mutex<FlowQueue<oneshot::Sender<Verdict>>>,
    /// Requests let go (at once or from the queue) and not yet routed.
    pub(crate) dispatching: Arc<AtomicU32>,
    /// Latest predicted TTFT per pod name (from decisions).
    pub(crate) predicted_ttft_ms: Mutex<PredictedTtft>,
    pub(crate) wake: Arc<Notify>,
    pub(crate) driver_started: AtomicBool,
    pub(crate) epoch: tokio::time::Instant,
}

impl Default for FlowGate {
    fn default() -> Self {
        FlowGate {
            queue: Mutex::new(FlowQueue::new()),
            dispatching: Arc::default(),
            predicted_ttft_ms: Mutex::default(),
            wake: Arc::default(),
            driver_started: AtomicBool::new(false),
            epoch: tokio::time::Instant::now(),
        }
    }
}

/// One request's place in [`FlowGate::dispatching`] (let go, not yet routed), left once: by
/// the routed decision, under the session's lock in the same step as the ledger's charge (so
/// flow control's view of the fleet never counts the request twice, or not at all), or when
/// the [`Turn`] is dropped unrouted.
#[derive(Debug)]
pub struct Dispatching {
    count: Arc<AtomicU32>,
    left: AtomicBool,
}

impl Dispatching {
    /// Counts one more request in `count`.
    pub(crate) fn enter(count: &Arc<AtomicU32>) -> Dispatching {
        count.fetch_add(1, Ordering::AcqRel);
        Dispatching::counted(count)
    }

    /// The place the driver counted in `count` when it released the request.
    pub(crate) fn counted(count: &Arc<AtomicU32>) -> Dispatching {
        Dispatching {
            count: count.clone(),
            left: AtomicBool::new(false),
        }
    }

    /// Leaves the count (the first call only).
    pub(crate) fn leave(&self) {
        if !self.left.swap(true, Ordering::AcqRel) {
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A request's permission to route: held until its first decision is made (dropping it
/// tells the driver the fleet's ledger now counts the request).
pub struct Turn {
    pub(crate) dispatching: Option<Dispatching>,
    pub(crate) wake: Option<Arc<Notify>>,
    pub note: Option<FlowNote>,
    /// Time spent queued.
    pub queued: Duration,
    /// Pods without headroom for the request when the queue released it: its first decision
    /// excludes them (dispatch by headroom; empty for a request let through at once).
    pub closed: Vec<PodId>,
}

impl Turn {
    pub(crate) fn free() -> Turn {
        Turn {
            dispatching: None,
            wake: None,
            note: None,
            queued: Duration::ZERO,
            closed: Vec::new(),
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(d) = self.dispatching.take() {
            d.leave();
        }
        if let Some(w) = self.wake.take() {
            w.notify_one();
        }
    }
}

impl FlowGate {
    pub(crate) fn now_ms(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1e3
    }

    pub(crate) fn ms_at(&self, t: tokio::time::Instant) -> f64 {
        t.saturating_duration_since(self.epoch).as_secs_f64() * 1e3
    }

    /// Notes a decision's predicted TTFT per pod (the detector's third signal).
    pub fn observe_decision(&self, decision: &kvgate_core::Decision, pods: usize) {
        self.predicted_ttft_ms.lock().observe(decision, pods);
    }

    /// A routed request finished: wakes the driver (its pod has room again).
    pub fn request_finished(&self) {
        if self.driver_started.load(Ordering::Acquire) {
            self.wake.notify_one();
        }
    }

    /// Requests in the queue now.
    pub fn queued(&self) -> usize {
        self.queue.lock().len()
    }

    /// Refreshes `kvgate_flow_queued` (called before `/metrics` is encoded).
    pub fn refresh_gauges(&self, m: &FlowMetrics) {
        let q = self.queue.lock();
        m.queued.clear();
        for (band, tenant, n) in q.queued_by_class() {
            m.queued
                .get_or_create(&ClassLabels {
                    band: band.to_string(),
                    tenant: q.tenant_name(tenant).to_string(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request routed leaves the count under the session's lock; its turn, dropped after,
    /// does not leave it a second time (which would hide another request's place).
    #[test]
    fn a_place_among_the_let_go_requests_is_left_once() {
        let count = Arc::new(AtomicU32::new(0));
        let other = Dispatching::enter(&count);
        let mut turn = Turn::free();
        turn.dispatching = Some(Dispatching::enter(&count));
        assert_eq!(count.load(Ordering::Acquire), 2);
        turn.dispatching.as_ref().unwrap().leave();
        assert_eq!(count.load(Ordering::Acquire), 1);
        drop(turn);
        assert_eq!(
            count.load(Ordering::Acquire),
            1,
            "the other request still counts"
        );
        // One the driver counted at release is left by its unrouted turn's drop.
        count.fetch_add(1, Ordering::AcqRel);
        let mut released = Turn::free();
        released.dispatching = Some(Dispatching::counted(&count));
        drop(released);
        assert_eq!(count.load(Ordering::Acquire), 1);
        other.leave();
        assert_eq!(count.load(Ordering::Acquire), 0);
    }
}
