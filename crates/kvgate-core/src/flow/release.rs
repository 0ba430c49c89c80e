//! The release rule, sans IO: what the fleet can take now ([`FleetRoom`]) and which queued
//! requests leave the [`FlowQueue`] for it ([`release`]). The gateway's driver task
//! (`kvgate-gateway/src/pipeline/flow.rs`) and the simulator's event loop (`kvgate-sim/src/cluster.rs`)
//! both run these; neither has a release loop of its own.
//!
//! # The rule
//!
//! - **Room** ([`FleetRoom::of`]): the saturation detector over the pods' snapshots (their
//!   in-flight counts from the session's ledger) with each pod's latest predicted TTFT
//!   ([`PredictedTtft`]), less the requests let go and not routed yet (`dispatching`: the
//!   gateway routes a released request on its own task, later; the simulator routes it at
//!   once, so it passes 0). The pods without headroom for a plain and for a bulk request are
//!   listed: a released request's first decision excludes them (dispatch by headroom).
//! - **Release** ([`release`]): while headroom is left, the queue's next request leaves (its
//!   order: strict bands, then least attained service, then FIFO). A bulk request leaves only
//!   into bulk headroom; without any, the next request that is not bulk leaves instead. Each
//!   release takes one unit of headroom, a bulk one a unit of bulk headroom too. The room is
//!   read once per round, so a round never releases more than the detector saw.
//!
//! # Bounds
//!
//! [`PredictedTtft`] holds one number per pod name and is cleared when it holds more than
//! twice the fleet (names of pods that left). A round returns at most the fleet's headroom.

use super::saturation::{SaturationConfig, fleet_bulk_headroom, fleet_saturation, pod_headroom};
use super::{FlowConfig, FlowQueue, Leaving, Room, Saturation};
use crate::decision::Decision;
use crate::pod::{PodId, PodSnapshot};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// The latest predicted TTFT of each pod, as the router's decisions said it (the saturation
/// detector's `max_predicted_ttft_ms` signal). One number per pod name.
#[derive(Debug, Default, Clone)]
pub struct PredictedTtft(FxHashMap<Arc<str>, f64>);

impl PredictedTtft {
    /// Notes each pod's predicted TTFT in `decision`; `pods` is the fleet's size (the map is
    /// cleared when it holds more than twice that: pods that left).
    pub fn observe(&mut self, decision: &Decision, pods: usize) {
        if self.0.len() > 2 * pods.max(1) {
            self.0.clear();
        }
        for p in &decision.pods {
            if let Some(v) = self.0.get_mut(&*p.id) {
                *v = p.predicted_ttft_ms;
            } else {
                self.0.insert(p.id.clone(), p.predicted_ttft_ms);
            }
        }
    }

    /// The pod's latest predicted TTFT, ms.
    pub fn get(&self, pod: &str) -> Option<f64> {
        self.0.get(pod).copied()
    }
}

/// What the fleet can take now; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetRoom {
    pub saturation: Saturation,
    /// Requests a bulk request may take now (≤ the plain headroom).
    pub bulk_room: u32,
    /// Healthy pods without headroom for a plain request.
    pub closed: Vec<PodId>,
    /// Healthy pods without headroom for a bulk request.
    pub closed_bulk: Vec<PodId>,
}

impl FleetRoom {
    /// The room of the pods in `snapshots` (in-flight counts from the ledger filled in), less
    /// `dispatching` requests let go and not routed yet.
    pub fn of(
        cfg: &SaturationConfig,
        snapshots: &[PodSnapshot],
        predicted: &PredictedTtft,
        dispatching: u32,
    ) -> FleetRoom {
        let pred = |i: usize| snapshots.get(i).and_then(|s| predicted.get(&s.name));
        let saturation = match fleet_saturation(cfg, snapshots, pred) {
            Saturation::Headroom(n) => Saturation::Headroom(n.saturating_sub(dispatching)),
            s => s,
        };
        let bulk_room = fleet_bulk_headroom(cfg, snapshots, pred).saturating_sub(dispatching);
        let bulk_cfg = cfg.bulk();
        let mut closed = Vec::new();
        let mut closed_bulk = Vec::new();
        for (i, s) in snapshots.iter().enumerate().filter(|(_, s)| s.healthy) {
            if pod_headroom(cfg, s, pred(i)) == 0 {
                closed.push(s.id);
            }
            if pod_headroom(&bulk_cfg, s, pred(i)) == 0 {
                closed_bulk.push(s.id);
            }
        }
        FleetRoom {
            saturation,
            bulk_room: bulk_room.min(saturation.headroom()),
            closed,
            closed_bulk,
        }
    }

    /// What [`FlowQueue::offer`] needs of it.
    pub fn room(&self) -> Room {
        Room {
            saturation: self.saturation,
            bulk_headroom: self.bulk_room,
        }
    }

    /// The pods a released request's first decision excludes.
    pub fn closed_to(&self, bulk: bool) -> &[PodId] {
        if bulk {
            &self.closed_bulk
        } else {
            &self.closed
        }
    }
}

/// A request [`release`] lets go.
#[derive(Debug)]
pub struct Released<T> {
    pub left: Leaving<T>,
    /// It left as a bulk request (route it outside [`FleetRoom::closed_to`]`(true)`).
    pub bulk: bool,
}

/// Lets go the queued requests `room` allows now, in the queue's order (see the module docs):
/// each is handed to `take` with its tenant's name, and takes a unit of headroom only if
/// `take` says it was taken (`false`: its waiter was gone, and the next request may have the
/// unit). Returns how many were taken.
pub fn release<T>(
    queue: &mut FlowQueue<T>,
    cfg: &FlowConfig,
    room: &FleetRoom,
    now_ms: f64,
    mut take: impl FnMut(Released<T>, &str) -> bool,
) -> u32 {
    let mut left = room.saturation.headroom();
    let mut bulk_left = room.bulk_room.min(left);
    let mut taken = 0;
    while left > 0 {
        let (next, bulk) = match queue.next_is_bulk(cfg, now_ms) {
            None => break,
            Some(true) if bulk_left == 0 => (queue.pop_non_bulk(cfg, now_ms), false),
            Some(bulk) => (queue.pop(now_ms), bulk),
        };
        let Some(next) = next else { break };
        let tenant = queue.tenant_name(next.tenant);
        if !take(Released { left: next, bulk }, tenant) {
            continue;
        }
        taken += 1;
        left -= 1;
        if bulk {
            bulk_left -= 1;
        }
        bulk_left = bulk_left.min(left);
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{FlowRequest, Offer};

    fn pod(id: u32, waiting: u32, kv: f64) -> PodSnapshot {
        let mut p = PodSnapshot::idle(id, "x", 1_000);
        p.waiting = waiting;
        p.kv_usage = kv;
        p
    }

    /// A decision that predicted `ttft_ms` for each named pod.
    fn decision(ttft_ms: &[(&str, f64)]) -> Decision {
        let pods = ttft_ms
            .iter()
            .map(|&(name, t)| crate::decision::PodExplanation {
                id: name.into(),
                prefix_score: 0.0,
                predicted_ttft_ms: t,
                predicted_tpot_ms: 10.0,
                eligible: true,
                adapter: Default::default(),
                adapter_cost_ms: 0.0,
                pending_blocks: 0,
                prefilling_blocks: 0,
            })
            .collect();
        Decision {
            pod: ttft_ms[0].0.into(),
            pod_id: PodId(0),
            branch: crate::decision::Branch::NoSticky,
            pods,
            slo: None,
            decode: None,
        }
    }

    fn offer(q: &mut FlowQueue<u32>, cfg: &FlowConfig, tenant: &str, priority: i32, n: u32) {
        let req = FlowRequest {
            priority,
            tenant,
            cost_tokens: 100,
            bytes: 0,
            deadline_ms: f64::INFINITY,
        };
        let full = Room::from(Saturation::Headroom(0));
        assert!(matches!(q.offer(cfg, req, full, 0.0, n), Offer::Queued(..)));
    }

    #[test]
    fn room_counts_each_pods_headroom_less_what_is_being_dispatched() {
        let cfg = SaturationConfig::default();
        // Depth 5: p0 has 3 queued (room 2), p1 is full of KV, p2 is idle (room 5).
        let pods = [pod(0, 3, 0.1), pod(1, 0, 0.9), pod(2, 0, 0.1)];
        let room = FleetRoom::of(&cfg, &pods, &PredictedTtft::default(), 0);
        assert_eq!(room.saturation, Saturation::Headroom(7));
        // Bulk: KV under 0.5 and no queue (depth 5 − 4 = 1): only p2, one request.
        assert_eq!(room.bulk_room, 1);
        assert_eq!(room.closed, [PodId(1)]);
        assert_eq!(room.closed_bulk, [PodId(0), PodId(1)]);
        let room = FleetRoom::of(&cfg, &pods, &PredictedTtft::default(), 3);
        assert_eq!(room.saturation, Saturation::Headroom(4));
        assert_eq!(room.bulk_room, 0);
    }

    #[test]
    fn a_slow_predicted_ttft_closes_the_pod_when_the_detector_reads_it() {
        let cfg = SaturationConfig {
            max_predicted_ttft_ms: 1_000.0,
            ..SaturationConfig::default()
        };
        let pods = [pod(0, 0, 0.1), pod(1, 0, 0.1)];
        let mut pred = PredictedTtft::default();
        pred.observe(
            &decision(&[("pod-0", 2_500.0), ("pod-1", 300.0)]),
            pods.len(),
        );
        assert_eq!(pred.get("pod-0"), Some(2_500.0));
        let room = FleetRoom::of(&cfg, &pods, &pred, 0);
        assert_eq!(room.closed, [PodId(0)]);
        assert_eq!(room.saturation, Saturation::Headroom(5));
    }

    #[test]
    fn a_round_releases_at_most_the_headroom_in_the_queues_order() {
        let cfg = FlowConfig {
            enabled: true,
            ..FlowConfig::default()
        };
        let mut q = FlowQueue::new();
        offer(&mut q, &cfg, "a", 0, 1);
        offer(&mut q, &cfg, "b", 5, 2);
        offer(&mut q, &cfg, "a", 0, 3);
        let room = FleetRoom {
            saturation: Saturation::Headroom(2),
            bulk_room: 2,
            closed: vec![],
            closed_bulk: vec![],
        };
        let mut out = Vec::new();
        let taken = release(&mut q, &cfg, &room, 1.0, |r, tenant| {
            out.push((r.left.payload, tenant.to_string()));
            true
        });
        assert_eq!(taken, 2);
        assert_eq!(
            out,
            [(2, "b".to_string()), (1, "a".to_string())],
            "the higher band first, then FIFO"
        );
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn without_bulk_room_the_next_request_that_is_not_bulk_leaves() {
        let cfg = FlowConfig {
            enabled: true,
            ..FlowConfig::default()
        };
        let mut q = FlowQueue::new();
        // Tenant "flood" holds most of the queue: its requests are bulk.
        for n in 0..4 {
            offer(&mut q, &cfg, "flood", 0, n);
        }
        offer(&mut q, &cfg, "quiet", 0, 10);
        assert_eq!(q.next_is_bulk(&cfg, 1.0), Some(true));
        let room = FleetRoom {
            saturation: Saturation::Headroom(3),
            bulk_room: 0,
            closed: vec![],
            closed_bulk: vec![],
        };
        let mut got = Vec::new();
        release(&mut q, &cfg, &room, 1.0, |r, _| {
            got.push((r.left.payload, r.bulk));
            true
        });
        assert_eq!(got, [(10, false)], "only the quiet tenant's request leaves");
        let room = FleetRoom {
            bulk_room: 1,
            ..room
        };
        let mut got = Vec::new();
        release(&mut q, &cfg, &room, 2.0, |r, _| {
            got.push((r.left.payload, r.bulk));
            true
        });
        assert_eq!(got, [(0, true)], "one bulk unit: one bulk request");
    }

    #[test]
    fn a_request_whose_waiter_is_gone_takes_no_headroom() {
        let cfg = FlowConfig {
            enabled: true,
            ..FlowConfig::default()
        };
        let mut q = FlowQueue::new();
        for n in 0..3 {
            offer(&mut q, &cfg, "a", 0, n);
        }
        let room = FleetRoom {
            saturation: Saturation::Headroom(2),
            bulk_room: 2,
            closed: vec![],
            closed_bulk: vec![],
        };
        let mut got = Vec::new();
        let taken = release(&mut q, &cfg, &room, 1.0, |r, _| {
            // Request 0's client went away: the next one gets its unit.
            if r.left.payload == 0 {
                return false;
            }
            got.push(r.left.payload);
            true
        });
        assert_eq!((taken, got), (2, vec![1, 2]));
        assert!(q.is_empty());
    }
}
