//! The saturation detector: may the router send one more request to the fleet now, or should
//! it hold it in the flow queue ([`super::FlowQueue`])?
//!
//! # Algorithm
//!
//! Per healthy pod, from plain data (the last scrape, the router's own in-flight ledger, the
//! predictor's latest TTFT prediction for the pod):
//!
//! - `waiting_est = max(scraped waiting, in-flight requests − scraped running)`: the engine's
//!   queue as scraped, or, when the router dispatched more since the scrape than the engine
//!   runs, what it must be queueing now. The ledger is exact and updated at dispatch, so a burst
//!   of dispatches between two scrapes (50 ms) is seen at once; the scrape catches requests
//!   the engine queued that kvgate did not send.
//! - The pod is **saturated** when `waiting_est ≥ queue_depth_threshold`, or its KV usage
//!   `≥ kv_cache_util_threshold` (the engine would soon preempt), or (when
//!   `max_predicted_ttft_ms > 0`) its latest predicted TTFT exceeds it.
//! - Its **headroom** is `queue_depth_threshold − waiting_est` when not saturated, else 0;
//!   with `max_in_flight_per_pod > 0`, at most `max_in_flight_per_pod − in-flight requests`
//!   too (a per-pod concurrency cap, as Dynamo's and SMG's workers have; off by default).
//!
//! The fleet's headroom is the sum over healthy pods: how many requests may leave the queue
//! now. No healthy pod at all is [`Saturation::Unavailable`] (503, not a queue: there is no
//! capacity to wait for that the router knows of).
//!
//! # Parameters (defaults)
//!
//! - `queue_depth_threshold` **5** waiting requests per pod, and
//! - `kv_cache_util_threshold` **0.8**: llm-d's utilization detector defaults
//!   (`queueDepthThreshold`, `kvCacheUtilThreshold`, gateway-api-inference-extension 2025).
//! - `max_predicted_ttft_ms` **0** (off): a pod whose predicted TTFT for the latest request
//!   exceeds it counts as saturated; a TTFT objective in ms turns it on.
//! - `max_in_flight_per_pod` **0** (off): requests kvgate has in flight on one pod at most.
//! - `bulk_kv_reserve` **0.3**: KV kept free of *bulk* requests (the flood of the tenant
//!   holding most of the queue, see [`super`]): they see `kv_cache_util_threshold −
//!   bulk_kv_reserve` ([`SaturationConfig::bulk`], [`fleet_bulk_headroom`]). Chosen by
//!   measurement (docs/decisions/flow-control.md: 0, 0.2, 0.3 tried).
//! - `bulk_queue_reserve` **4**: places of the queue depth kept free of bulk requests: they see
//!   `max(1, queue_depth_threshold − bulk_queue_reserve)` = 1, i.e. only a pod with no queue
//!   (scraped, or estimated from the ledger) takes one, so the flood never waits in an engine
//!   queue ahead of the others' arrivals. Chosen by measurement (docs/decisions/flow-control.md: 0, 3, 4
//!   in the simulator; 0 and 4 live, 3 seeds × 3 rounds); 0 gives bulk the plain depth.

use crate::pod::PodSnapshot;
use serde::{Deserialize, Serialize};

/// The detector's thresholds; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SaturationConfig {
    pub queue_depth_threshold: u32,
    pub kv_cache_util_threshold: f64,
    pub max_predicted_ttft_ms: f64,
    pub max_in_flight_per_pod: u32,
    pub bulk_kv_reserve: f64,
    pub bulk_queue_reserve: u32,
}

impl SaturationConfig {
    /// The thresholds a *bulk* request sees: the KV threshold lowered by `bulk_kv_reserve`,
    /// the queue depth by `bulk_queue_reserve` (to 1 at least: a pod with no queue).
    pub fn bulk(&self) -> SaturationConfig {
        SaturationConfig {
            kv_cache_util_threshold: (self.kv_cache_util_threshold - self.bulk_kv_reserve.max(0.0))
                .max(0.0),
            queue_depth_threshold: self
                .queue_depth_threshold
                .saturating_sub(self.bulk_queue_reserve)
                .max(1),
            ..*self
        }
    }
}

impl Default for SaturationConfig {
    fn default() -> Self {
        SaturationConfig {
            queue_depth_threshold: 5,
            kv_cache_util_threshold: 0.8,
            max_predicted_ttft_ms: 0.0,
            max_in_flight_per_pod: 0,
            bulk_kv_reserve: 0.3,
            bulk_queue_reserve: 4,
        }
    }
}

/// The fleet's state for the flow queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saturation {
    /// No healthy pod.
    Unavailable,
    /// This many requests may be dispatched now (0: saturated).
    Headroom(u32),
}

impl Saturation {
    /// Requests that may be dispatched now.
    pub fn headroom(self) -> u32 {
        match self {
            Saturation::Unavailable => 0,
            Saturation::Headroom(n) => n,
        }
    }
}

/// The queue a pod must be holding now (see the module docs).
pub fn waiting_estimate(pod: &PodSnapshot) -> u32 {
    pod.waiting
        .max(pod.in_flight.requests.saturating_sub(pod.running))
}

/// One pod's headroom: requests it may take before it counts as saturated.
pub fn pod_headroom(
    cfg: &SaturationConfig,
    pod: &PodSnapshot,
    predicted_ttft_ms: Option<f64>,
) -> u32 {
    if !pod.healthy {
        return 0;
    }
    let kv_full = pod.kv_usage.is_finite() && pod.kv_usage >= cfg.kv_cache_util_threshold;
    let slow = cfg.max_predicted_ttft_ms > 0.0
        && predicted_ttft_ms.is_some_and(|t| t > cfg.max_predicted_ttft_ms);
    if kv_full || slow {
        return 0;
    }
    let by_queue = cfg
        .queue_depth_threshold
        .saturating_sub(waiting_estimate(pod));
    if cfg.max_in_flight_per_pod > 0 {
        by_queue.min(
            cfg.max_in_flight_per_pod
                .saturating_sub(pod.in_flight.requests),
        )
    } else {
        by_queue
    }
}

/// The fleet's *bulk* headroom: [`fleet_saturation`]'s with the KV threshold lowered by
/// `bulk_kv_reserve` (the KV kept free of bulk requests, see the module docs); the plain
/// headroom when the reserve is 0.
pub fn fleet_bulk_headroom(
    cfg: &SaturationConfig,
    pods: &[PodSnapshot],
    predicted_ttft_ms: impl Fn(usize) -> Option<f64>,
) -> u32 {
    fleet_saturation(&cfg.bulk(), pods, predicted_ttft_ms).headroom()
}

/// The fleet's saturation: `pods` with their in-flight ledger filled in; `predicted_ttft_ms`
/// gives the latest prediction for a pod (by position in `pods`), if any.
pub fn fleet_saturation(
    cfg: &SaturationConfig,
    pods: &[PodSnapshot],
    predicted_ttft_ms: impl Fn(usize) -> Option<f64>,
) -> Saturation {
    if !pods.iter().any(|p| p.healthy) {
        return Saturation::Unavailable;
    }
    let total = pods
        .iter()
        .enumerate()
        .map(|(i, p)| pod_headroom(cfg, p, predicted_ttft_ms(i)))
        .fold(0u32, u32::saturating_add);
    Saturation::Headroom(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(waiting: u32, running: u32, in_flight: u32, kv: f64) -> PodSnapshot {
        let mut p = PodSnapshot::idle(0, "c", 1000);
        p.waiting = waiting;
        p.running = running;
        p.in_flight.requests = in_flight;
        p.kv_usage = kv;
        p
    }

    #[test]
    fn an_idle_pod_has_the_whole_queue_depth_as_headroom() {
        let cfg = SaturationConfig::default();
        assert_eq!(pod_headroom(&cfg, &pod(0, 0, 0, 0.0), None), 5);
    }

    #[test]
    fn dispatches_since_the_scrape_count_as_waiting_beyond_what_runs() {
        let cfg = SaturationConfig::default();
        // Scraped: 8 running, none waiting; the ledger has 11 in flight: 3 must be queued.
        assert_eq!(waiting_estimate(&pod(0, 8, 11, 0.1)), 3);
        assert_eq!(pod_headroom(&cfg, &pod(0, 8, 11, 0.1), None), 2);
        // The scrape's own queue wins when larger (requests from elsewhere).
        assert_eq!(pod_headroom(&cfg, &pod(4, 8, 8, 0.1), None), 1);
        assert_eq!(pod_headroom(&cfg, &pod(6, 8, 8, 0.1), None), 0);
    }

    #[test]
    fn kv_usage_at_the_threshold_saturates_a_pod() {
        let cfg = SaturationConfig::default();
        assert_eq!(pod_headroom(&cfg, &pod(0, 1, 1, 0.79), None), 5);
        assert_eq!(pod_headroom(&cfg, &pod(0, 1, 1, 0.80), None), 0);
    }

    #[test]
    fn predicted_ttft_saturates_only_when_a_limit_is_set() {
        let off = SaturationConfig::default();
        assert_eq!(pod_headroom(&off, &pod(0, 0, 0, 0.0), Some(1e9)), 5);
        let on = SaturationConfig {
            max_predicted_ttft_ms: 500.0,
            ..off
        };
        assert_eq!(pod_headroom(&on, &pod(0, 0, 0, 0.0), Some(501.0)), 0);
        assert_eq!(pod_headroom(&on, &pod(0, 0, 0, 0.0), Some(499.0)), 5);
        assert_eq!(pod_headroom(&on, &pod(0, 0, 0, 0.0), None), 5);
    }

    #[test]
    fn the_in_flight_cap_limits_headroom_only_when_set() {
        let off = SaturationConfig::default();
        assert_eq!(pod_headroom(&off, &pod(0, 40, 40, 0.0), None), 5);
        let cap = SaturationConfig {
            max_in_flight_per_pod: 42,
            ..off
        };
        assert_eq!(pod_headroom(&cap, &pod(0, 40, 40, 0.0), None), 2);
        assert_eq!(pod_headroom(&cap, &pod(0, 40, 42, 0.0), None), 0);
        assert_eq!(pod_headroom(&cap, &pod(0, 0, 0, 0.0), None), 5);
    }

    #[test]
    fn the_queue_reserve_keeps_bulk_requests_off_pods_that_queue() {
        let cfg = SaturationConfig {
            bulk_queue_reserve: 4,
            ..SaturationConfig::default()
        };
        assert_eq!(cfg.bulk().queue_depth_threshold, 1);
        // One request waiting: open to a plain request (4 more), closed to a bulk one.
        let queued = pod(1, 4, 4, 0.1);
        assert_eq!(pod_headroom(&cfg, &queued, None), 4);
        assert_eq!(pod_headroom(&cfg.bulk(), &queued, None), 0);
        // The ledger's own dispatches count: 5 in flight on 4 running is one queued.
        assert_eq!(pod_headroom(&cfg.bulk(), &pod(0, 4, 5, 0.1), None), 0);
        // No queue and KV under 0.5: one bulk request may go.
        assert_eq!(pod_headroom(&cfg.bulk(), &pod(0, 4, 4, 0.1), None), 1);
        let pods = [queued, pod(0, 4, 4, 0.1), pod(0, 4, 4, 0.6)];
        assert_eq!(fleet_bulk_headroom(&cfg, &pods, |_| None), 1);
        // A reserve at or above the depth leaves bulk the smallest queue depth, 1.
        let all = SaturationConfig {
            bulk_queue_reserve: 9,
            ..cfg
        };
        assert_eq!(all.bulk().queue_depth_threshold, 1);
        // Without the reserve bulk sees the plain depth (KV still lowered).
        let plain = SaturationConfig {
            bulk_queue_reserve: 0,
            ..cfg
        };
        assert_eq!(fleet_bulk_headroom(&plain, &pods, |_| None), 4 + 5);
    }

    #[test]
    fn bulk_headroom_uses_the_kv_threshold_lowered_by_the_reserve() {
        // The queue reserve off here, to see the KV reserve alone.
        let cfg = SaturationConfig {
            bulk_queue_reserve: 0,
            ..SaturationConfig::default()
        };
        assert_eq!(cfg.bulk().kv_cache_util_threshold, 0.8 - 0.3);
        let pods = [pod(0, 1, 1, 0.6), pod(0, 1, 1, 0.4)];
        // Both pods are open to a plain request; only the one under 0.5 to a bulk one.
        assert_eq!(
            fleet_saturation(&cfg, &pods, |_| None),
            Saturation::Headroom(10)
        );
        assert_eq!(fleet_bulk_headroom(&cfg, &pods, |_| None), 5);
        let none = SaturationConfig {
            bulk_kv_reserve: 0.0,
            ..cfg
        };
        assert_eq!(fleet_bulk_headroom(&none, &pods, |_| None), 10);
    }

    #[test]
    fn the_fleet_sums_healthy_pods_and_is_unavailable_without_one() {
        let cfg = SaturationConfig::default();
        let mut down = pod(0, 0, 0, 0.0);
        down.healthy = false;
        let pods = [pod(0, 0, 0, 0.0), pod(3, 0, 0, 0.0), down.clone()];
        assert_eq!(
            fleet_saturation(&cfg, &pods, |_| None),
            Saturation::Headroom(7)
        );
        assert_eq!(
            fleet_saturation(&cfg, &[down], |_| None),
            Saturation::Unavailable
        );
        assert_eq!(
            fleet_saturation(&cfg, &[], |_| None),
            Saturation::Unavailable
        );
    }
}
