//! Pods whose responses keep dying mid-body are avoided for a while, even when their
//! `/metrics` still answers (the scrape alone would keep calling them healthy).
//!
//! Algorithm (a per-pod circuit breaker over response outcomes):
//! - a response that dies mid-body (connection reset, truncated body, or silent past the
//!   idle-chunk timeout) is a failure, and so is an attempt that got no response headers within
//!   the first-byte timeout (a pod that accepts and never answers); a response that ends
//!   normally resets the count to 0;
//!   client aborts and the gateway's own request timeout count as neither;
//! - the `threshold`-th failure in a row (`--pod-failure-threshold`, default 3) opens the
//!   breaker: the pod counts as unhealthy for `cooldown` (`--pod-failure-cooldown-ms`, default
//!   10 000 ms), then is routed to again;
//! - after the cooldown the count is still at the threshold (half-open): one more failure opens
//!   the breaker again at once, one success closes it.
//!
//! Bound: two atomics per pod. Time is a monotonic clock read by the caller.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Origin of the breaker's clock (nanoseconds since the first use in this process).
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn nanos(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(base()).as_nanos()).unwrap_or(u64::MAX)
}

/// Counts one failure of `pod` in its breaker (`why`: for the log line); when that opens the
/// breaker, `kvgate_pod_cooldowns_total{pod}` counts it and a warning says so.
pub fn count_failure(shared: &crate::state::Shared, pod: &crate::pods::Pod, why: &'static str) {
    let cfg = shared.config();
    let trip = pod.breaker.failure(
        Instant::now(),
        cfg.pod_failure_threshold,
        cfg.pod_failure_cooldown,
    );
    if let Trip::Opened(n) = trip {
        shared
            .metrics
            .pod_cooldowns
            .get_or_create(&pod.label())
            .inc();
        tracing::warn!(
            pod = %pod.url,
            failures_in_a_row = n,
            cooldown_ms = cfg.pod_failure_cooldown.as_millis() as u64,
            "{why}; pod avoided for the cooldown"
        );
    }
}

/// One pod's breaker.
#[derive(Debug, Default)]
pub struct Breaker {
    /// Failures in a row (saturating).
    failures: AtomicU32,
    /// Avoided until this time (nanoseconds since [`base`]); 0: not avoided.
    open_until: AtomicU64,
}

/// What [`Breaker::failure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trip {
    /// Below the threshold.
    Counted(u32),
    /// The breaker opened: the pod is avoided until the cooldown ends.
    Opened(u32),
}

impl Breaker {
    /// A response ended normally: the count goes back to 0.
    pub fn success(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    /// A response died mid-body at `now`.
    pub fn failure(&self, now: Instant, threshold: u32, cooldown: Duration) -> Trip {
        let n = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if n == u32::MAX {
            self.failures.store(threshold, Ordering::Relaxed);
        }
        if n < threshold.max(1) {
            return Trip::Counted(n);
        }
        let until = nanos(now + cooldown).max(1);
        self.open_until.store(until, Ordering::Relaxed);
        Trip::Opened(n)
    }

    /// Whether the pod is avoided at `now`.
    pub fn is_open(&self, now: Instant) -> bool {
        let until = self.open_until.load(Ordering::Relaxed);
        until != 0 && nanos(now) < until
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOL: Duration = Duration::from_secs(10);

    #[test]
    fn opens_at_the_threshold_and_closes_after_the_cooldown() {
        let b = Breaker::default();
        let t0 = Instant::now();
        assert!(!b.is_open(t0));
        assert_eq!(b.failure(t0, 3, COOL), Trip::Counted(1));
        assert_eq!(b.failure(t0, 3, COOL), Trip::Counted(2));
        assert!(!b.is_open(t0));
        assert_eq!(b.failure(t0, 3, COOL), Trip::Opened(3));
        assert!(b.is_open(t0));
        assert!(b.is_open(t0 + Duration::from_secs(9)));
        assert!(!b.is_open(t0 + Duration::from_secs(11)));
    }

    #[test]
    fn a_success_resets_the_count() {
        let b = Breaker::default();
        let t0 = Instant::now();
        b.failure(t0, 2, COOL);
        b.success();
        assert_eq!(b.failure(t0, 2, COOL), Trip::Counted(1));
        assert!(!b.is_open(t0));
    }

    #[test]
    fn after_the_cooldown_one_more_failure_reopens_it() {
        let b = Breaker::default();
        let t0 = Instant::now();
        b.failure(t0, 2, COOL);
        b.failure(t0, 2, COOL);
        let later = t0 + Duration::from_secs(11);
        assert!(!b.is_open(later));
        assert_eq!(b.failure(later, 2, COOL), Trip::Opened(3));
        assert!(b.is_open(later + Duration::from_secs(1)));
        b.success();
        assert_eq!(b.failures(), 0);
    }

    #[test]
    fn a_threshold_of_one_opens_on_the_first_failure() {
        let b = Breaker::default();
        let t0 = Instant::now();
        assert_eq!(b.failure(t0, 1, COOL), Trip::Opened(1));
        assert!(b.is_open(t0));
    }
}
