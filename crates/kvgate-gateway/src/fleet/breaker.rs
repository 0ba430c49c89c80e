//! Pods whose responses keep dying mid-body are avoided for a while, even when their
//! `/metrics` still answers (the scrape alone would keep calling them healthy). A busy pod is
//! not a failing one, and suspicion never empties the fleet.
//!
//! Algorithm (a per-pod circuit breaker over response outcomes):
//! - a response that dies mid-body (connection reset, truncated body, or silent past the
//!   idle-chunk timeout once its tokens flow) is a failure, and so is a silence before the
//!   response headers (first-byte timeout) or before a stream's first token (idle-chunk
//!   timeout) while the pod shows no progress ([`crate::progress`]: its engine counters stand
//!   still and it streams no token); the same silence from a pod that progresses is a deep
//!   queue, not a failure: the request keeps waiting, bounded by its request timeout;
//!   a response that ends normally resets the count to 0;
//!   client aborts and the gateway's own request timeout count as neither;
//! - the `threshold`-th failure in a row (`--pod-failure-threshold`, default 3) opens the
//!   breaker: the pod counts as unhealthy for `cooldown` (`--pod-failure-cooldown-ms`, default
//!   10 000 ms), then is routed to again;
//! - at most [`MAX_AVOIDED_SHARE`] of the pods answering their scrape (at least one) are
//!   avoided at once, as Envoy's outlier detection bounds ejections (`max_ejection_percent`): a
//!   failure that would avoid one more is counted (`kvgate_pod_cooldowns_withheld_total`) and
//!   the pod stays routable;
//! - panic routing ([`panic_fill`]): when every pod a decision may use is avoided but some of
//!   them still answer their scrape, the decision routes among those (as Envoy's panic
//!   threshold), counted (`kvgate_panic_routes_total`) and logged, instead of answering 503;
//! - after the cooldown the count is still at the threshold (half-open): one more failure opens
//!   the breaker again at once, one success closes it.
//!
//! Bound: two atomics per pod (each pod's [`Breaker`], held in its [`crate::pods::Pod`]). Time
//! is a monotonic clock read by the caller.

pub use crate::pods::{Breaker, Trip};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Counts one failure of `pod` in its breaker (`why`: for the log line); when that opens the
/// breaker, `kvgate_pod_cooldowns_total{pod}` counts it and a warning says so.
pub fn count_failure(shared: &crate::state::Shared, pod: &crate::pods::Pod, why: &'static str) {
    let cfg = shared.config();
    let now = Instant::now();
    let may_open = may_avoid_another(&shared.fleet.pods.all(), pod, now);
    let trip = pod.breaker.failure(
        now,
        cfg.pod_failure_threshold,
        cfg.pod_failure_cooldown,
        may_open,
    );
    if let Trip::Withheld(n) = trip {
        shared
            .telemetry
            .metrics
            .pod_cooldowns_withheld
            .get_or_create(&pod.label())
            .inc();
        if shared.telemetry.log_limit.allow("pod_cooldown_withheld") {
            tracing::warn!(
                pod = %pod.url,
                failures_in_a_row = n,
                "{why}; pod kept routable: as many pods as may be avoided at once already are"
            );
        }
    }
    if let Trip::Opened(n) = trip {
        shared
            .telemetry
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

/// The largest share of the pods answering their scrape that the breaker avoids at once.
pub const MAX_AVOIDED_SHARE: f64 = 0.5;

/// How many of `answering` pods the breaker may avoid at once: [`MAX_AVOIDED_SHARE`] of them,
/// at least one.
pub fn max_avoided(answering: usize) -> usize {
    ((answering as f64 * MAX_AVOIDED_SHARE).floor() as usize).max(1)
}

/// Whether `pod`'s breaker may open at `now`: fewer other pods than [`max_avoided`] of those
/// answering their scrape are avoided already.
fn may_avoid_another(
    pods: &[std::sync::Arc<crate::pods::Pod>],
    pod: &crate::pods::Pod,
    now: Instant,
) -> bool {
    let answering = pods
        .iter()
        .filter(|p| p.healthy.load(Ordering::Relaxed))
        .count();
    let avoided = pods
        .iter()
        .filter(|p| p.id != pod.id && p.healthy.load(Ordering::Relaxed) && p.breaker.is_open(now))
        .count();
    avoided < max_avoided(answering)
}

/// Panic routing: when no pod outside `excluded` is usable in `snaps`, the pods outside
/// `excluded` that answer their scrape but are avoided by their breaker become usable again
/// (counted and logged by the caller). True when it did so.
pub fn panic_fill(
    pods: &[std::sync::Arc<crate::pods::Pod>],
    snaps: &mut [kvgate_core::PodSnapshot],
    excluded: &[kvgate_core::PodId],
) -> bool {
    let usable = |s: &kvgate_core::PodSnapshot| s.healthy && !excluded.contains(&s.id);
    if snaps.iter().any(usable) {
        return false;
    }
    let mut filled = false;
    for snap in snaps.iter_mut().filter(|s| !excluded.contains(&s.id)) {
        if pods
            .iter()
            .any(|p| p.id == snap.id && p.healthy.load(Ordering::Relaxed))
        {
            snap.healthy = true;
            filled = true;
        }
    }
    filled
}

/// [`panic_fill`], counted in `kvgate_panic_routes_total` and logged (rate-limited).
pub fn panic_route(
    telemetry: &crate::handles::telemetry::Telemetry,
    pods: &[std::sync::Arc<crate::pods::Pod>],
    snaps: &mut [kvgate_core::PodSnapshot],
    excluded: &[kvgate_core::PodId],
) {
    if panic_fill(pods, snaps, excluded) {
        telemetry.metrics.panic_routes.inc();
        if telemetry.log_limit.allow("panic_route") {
            tracing::warn!(
                "every usable pod is avoided by its breaker but still answers its scrape; \
                 routing among them (panic mode) rather than answering 503"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const COOL: Duration = Duration::from_secs(10);

    #[test]
    fn opens_at_the_threshold_and_closes_after_the_cooldown() {
        let b = Breaker::default();
        let t0 = Instant::now();
        assert!(!b.is_open(t0));
        assert_eq!(b.failure(t0, 3, COOL, true), Trip::Counted(1));
        assert_eq!(b.failure(t0, 3, COOL, true), Trip::Counted(2));
        assert!(!b.is_open(t0));
        assert_eq!(b.failure(t0, 3, COOL, true), Trip::Opened(3));
        assert!(b.is_open(t0));
        assert!(b.is_open(t0 + Duration::from_secs(9)));
        assert!(!b.is_open(t0 + Duration::from_secs(11)));
    }

    #[test]
    fn a_success_resets_the_count() {
        let b = Breaker::default();
        let t0 = Instant::now();
        b.failure(t0, 2, COOL, true);
        b.success();
        assert_eq!(b.failure(t0, 2, COOL, true), Trip::Counted(1));
        assert!(!b.is_open(t0));
    }

    #[test]
    fn after_the_cooldown_one_more_failure_reopens_it() {
        let b = Breaker::default();
        let t0 = Instant::now();
        b.failure(t0, 2, COOL, true);
        b.failure(t0, 2, COOL, true);
        let later = t0 + Duration::from_secs(11);
        assert!(!b.is_open(later));
        assert_eq!(b.failure(later, 2, COOL, true), Trip::Opened(3));
        assert!(b.is_open(later + Duration::from_secs(1)));
        b.success();
        assert_eq!(b.failures(), 0);
    }

    #[test]
    fn a_withheld_opening_keeps_the_pod_routable_and_the_next_failure_asks_again() {
        let b = Breaker::default();
        let t0 = Instant::now();
        b.failure(t0, 2, COOL, false);
        assert_eq!(b.failure(t0, 2, COOL, false), Trip::Withheld(2));
        assert!(!b.is_open(t0));
        assert_eq!(b.failure(t0, 2, COOL, true), Trip::Opened(3));
        assert!(b.is_open(t0));
    }

    #[test]
    fn at_most_half_the_answering_pods_are_avoided_and_always_one_may_be() {
        assert_eq!(max_avoided(0), 1);
        assert_eq!(max_avoided(1), 1);
        assert_eq!(max_avoided(2), 1);
        assert_eq!(max_avoided(3), 1);
        assert_eq!(max_avoided(4), 2);
        assert_eq!(max_avoided(1000), 500);
    }

    fn pods(n: u32) -> Vec<std::sync::Arc<crate::pods::Pod>> {
        (0..n)
            .map(|i| {
                let p = crate::pods::Pod::new(
                    kvgate_core::PodId(i),
                    &format!("http://127.0.0.1:{}", 1000 + i),
                    "default",
                    1,
                );
                p.healthy.store(true, Ordering::Relaxed);
                std::sync::Arc::new(p)
            })
            .collect()
    }

    #[test]
    fn the_breaker_never_avoids_more_than_its_share_of_the_fleet() {
        let fleet = pods(4);
        let t0 = Instant::now();
        let open = |p: &crate::pods::Pod| {
            p.breaker
                .failure(t0, 1, COOL, may_avoid_another(&fleet, p, t0))
        };
        assert_eq!(open(&fleet[0]), Trip::Opened(1));
        assert_eq!(open(&fleet[1]), Trip::Opened(1));
        assert_eq!(
            open(&fleet[2]),
            Trip::Withheld(1),
            "half of 4 already avoided"
        );
        // A pod that stopped answering its scrape counts neither as answering nor avoided.
        fleet[0].healthy.store(false, Ordering::Relaxed);
        assert_eq!(
            open(&fleet[2]),
            Trip::Withheld(2),
            "1 of max(1, 3/2) avoided"
        );
    }

    #[test]
    fn panic_routing_reopens_only_avoided_pods_that_answer_and_are_not_excluded() {
        let fleet = pods(3);
        let t0 = Instant::now();
        for p in &fleet {
            p.breaker.failure(t0, 1, COOL, true);
        }
        fleet[2].healthy.store(false, Ordering::Relaxed);
        let mut snaps: Vec<_> = fleet.iter().map(|p| p.snapshot()).collect();
        assert!(snaps.iter().all(|s| !s.healthy));
        assert!(panic_fill(&fleet, &mut snaps, &[kvgate_core::PodId(1)]));
        let usable: Vec<bool> = snaps.iter().map(|s| s.healthy).collect();
        assert_eq!(usable, [true, false, false]);
        // A usable pod left: no panic.
        let mut snaps: Vec<_> = fleet.iter().map(|p| p.snapshot()).collect();
        snaps[1].healthy = true;
        assert!(!panic_fill(&fleet, &mut snaps, &[]));
        assert!(!snaps[0].healthy);
    }

    #[test]
    fn a_threshold_of_one_opens_on_the_first_failure() {
        let b = Breaker::default();
        let t0 = Instant::now();
        assert_eq!(b.failure(t0, 1, COOL, true), Trip::Opened(1));
        assert!(b.is_open(t0));
    }
}
