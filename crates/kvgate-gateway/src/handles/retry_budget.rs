//! The retry budget: retries cannot multiply an overload.
//!
//! Algorithm (as Envoy's `retry_budget`): a retry may start only while the retries in flight
//! are fewer than [`BUDGET_SHARE`] (20 %) of the requests in flight, or fewer than
//! [`MIN_RETRY_CONCURRENCY`] (3), whichever is larger. A retry is in flight from its start until
//! its request ends (its [`RetryToken`] rides in the response body). A retry refused is not
//! made: the client gets the failure that would have been retried (502), counted in
//! `kvgate_retries_refused_total`.
//!
//! Exempt: a retry after the connection failed or broke before the pod answered (the pod
//! died, restarted or refused it). That pod holds no work for the request any more, so the
//! retry adds none to the fleet; refusing it would only lose a request the fleet can serve
//! (the chaos soak's killed pod lost 3 whole-body requests so). Each request still makes at
//! most `max_retries` retries.
//!
//! Bound: one atomic.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Share of the requests in flight that may be retries.
pub const BUDGET_SHARE: f64 = 0.2;
/// Retries in flight always allowed, however few requests are.
pub const MIN_RETRY_CONCURRENCY: usize = 3;

/// Retries in flight now.
#[derive(Debug, Default)]
pub struct RetryBudget {
    active: AtomicUsize,
}

/// One retry in flight; returned to the budget when dropped.
#[derive(Debug)]
pub struct RetryToken(Arc<RetryBudget>);

impl Drop for RetryToken {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Retries that may be in flight with `in_flight` requests in flight.
pub fn allowed(in_flight: usize) -> usize {
    ((in_flight as f64 * BUDGET_SHARE).floor() as usize).max(MIN_RETRY_CONCURRENCY)
}

impl RetryBudget {
    /// A retry's token, or `None` when the budget is spent (with `in_flight` requests in
    /// flight, this one included).
    pub fn try_start(self: &Arc<Self>, in_flight: usize) -> Option<RetryToken> {
        let limit = allowed(in_flight);
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| RetryToken(self.clone()))
    }

    /// Retries in flight now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_in_flight_are_bounded_by_a_fifth_of_the_requests_and_at_least_three() {
        assert_eq!(allowed(0), 3);
        assert_eq!(allowed(10), 3);
        assert_eq!(allowed(20), 4);
        assert_eq!(allowed(1000), 200);
    }

    #[test]
    fn a_token_holds_its_place_until_dropped() {
        let b = Arc::new(RetryBudget::default());
        let held: Vec<RetryToken> = (0..3).filter_map(|_| b.try_start(5)).collect();
        assert_eq!(held.len(), 3);
        assert!(b.try_start(5).is_none(), "3 in flight: the budget is spent");
        assert!(b.try_start(20).is_some(), "20 in flight allow 4");
        assert_eq!(b.active(), 3, "the 4th token was dropped at once");
        drop(held);
        assert_eq!(b.active(), 0);
        assert!(b.try_start(1).is_some());
    }
}
