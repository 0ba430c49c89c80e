//! Pending routes of the engine index: blocks a request was just sent to, before the pod's own
//! KV events say it stored them.
//!
//! In engine mode a live pod is scored only from its `BlockStored` events. Requests that share
//! a new prefix and arrive together (parallel tool calls, fan-out agents, n-best sampling, a
//! batch job) arrive before the first one's events exist: each then scores 0 everywhere and is
//! spread over the fleet, paying the whole prefill on every pod. A pending route closes that
//! window: when a request is routed to a live pod, the blocks of its prompt that the pod does
//! not hold yet are recorded here, and [`super::engine::EngineIndex`] scores them like stored
//! blocks until one of these happens:
//! - the pod's `BlockStored` for the block arrives (confirmed: the engine index now holds it);
//! - the pod's `BlockRemoved` for it, its `AllBlocksCleared`, an engine restart or the pod's
//!   removal (dropped);
//! - `ttl_ms` passes ([`DEFAULT_PENDING_TTL_MS`], 2,000 ms: llm-d's `speculativeIndexing` TTL;
//!   Dynamo's `--router-predicted-ttl-secs` plays the same role): the pod never stored it (the
//!   request failed, or was cut before its prefill ended).
//!
//! `ttl_ms = 0` turns pending routes off. The router's `engine_pending_ttl_ms` sets it and is
//! 0 by default: in the simulator's agent workload piling a fan-out's siblings on one pod cost
//! TTFT, since siblings scheduled in the same engine step as the first share no blocks (the
//! engine registers a block once computed); see `RouterConfig::engine_pending_ttl_ms`.
//!
//! # Time
//!
//! Sans IO: the driver moves the clock with [`PendingRoutes::advance`] (the gateway on each
//! metrics scrape and KV-event batch, the simulator on each step). A route is stamped with the
//! last time the driver gave, so its lifetime is `ttl_ms` plus at most one driver period.
//!
//! # Bounds
//!
//! At most [`MAX_PENDING_BLOCKS`] (pod, block) entries over all pods: at the bound the oldest
//! entry is dropped first (counted in [`PendingStats::dropped_over_bound`]). The expiry queue
//! holds at most [`MAX_PENDING_BLOCKS`] entries too (entries of confirmed blocks stay in it
//! until their turn). Memory: ≤ 24 bytes per map entry at a hashbrown load between 7/16 and 7/8
//! (≤ 55 bytes) plus 24 per queue entry: under 5.2 MB at the bound.

use crate::blocks::BlockHash;
use crate::pod::PodId;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// Lifetime of a pending route when turned on without one (llm-d `speculativeIndexing`'s 2 s).
pub const DEFAULT_PENDING_TTL_MS: f64 = 2_000.0;

/// Most (pod, block) entries pending at once, over all pods.
pub const MAX_PENDING_BLOCKS: usize = 65_536;

/// Counters of pending routes (blocks, not requests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PendingStats {
    /// Blocks recorded as pending.
    pub recorded: u64,
    /// Pending blocks the pod's `BlockStored` confirmed.
    pub confirmed: u64,
    /// Pending blocks that reached their lifetime unconfirmed.
    pub expired: u64,
    /// Pending blocks dropped by `BlockRemoved`, `AllBlocksCleared`, a restart or the pod's
    /// removal.
    pub dropped: u64,
    /// Pending blocks dropped, oldest first, because [`MAX_PENDING_BLOCKS`] was reached.
    pub dropped_over_bound: u64,
}

/// The pending (pod, block) entries with their stamps; see the module docs.
#[derive(Debug)]
pub struct PendingRoutes {
    ttl_ms: f64,
    now_ms: f64,
    /// (pod, block) → the stamp of its latest recording.
    entries: FxHashMap<(u32, BlockHash), f64>,
    /// Recordings, oldest first; an entry whose stamp no longer matches `entries` is a ghost
    /// (confirmed, dropped or recorded again since).
    order: VecDeque<(f64, u32, BlockHash)>,
    /// Pending blocks per pod (dense by [`PodId::index`]), so unaffected pods cost nothing.
    per_pod: Vec<u32>,
    stats: PendingStats,
}

impl Default for PendingRoutes {
    fn default() -> Self {
        PendingRoutes {
            ttl_ms: DEFAULT_PENDING_TTL_MS,
            now_ms: 0.0,
            entries: FxHashMap::default(),
            order: VecDeque::new(),
            per_pod: Vec::new(),
            stats: PendingStats::default(),
        }
    }
}

impl PendingRoutes {
    /// Sets the lifetime (0 or less: off, and everything pending is dropped).
    pub fn set_ttl_ms(&mut self, ttl_ms: f64) {
        self.ttl_ms = if ttl_ms.is_finite() {
            ttl_ms.max(0.0)
        } else {
            0.0
        };
        if self.ttl_ms == 0.0 {
            self.entries.clear();
            self.order.clear();
            self.per_pod.clear();
        }
    }

    pub fn ttl_ms(&self) -> f64 {
        self.ttl_ms
    }

    pub fn is_on(&self) -> bool {
        self.ttl_ms > 0.0
    }

    pub fn stats(&self) -> PendingStats {
        self.stats
    }

    /// Pending blocks now, over all pods.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Pending blocks of one pod.
    pub fn pod_len(&self, pod: PodId) -> u32 {
        self.per_pod.get(pod.index()).copied().unwrap_or(0)
    }

    /// Moves the clock to `now_ms` (never back) and expires what outlived `ttl_ms`.
    pub fn advance(&mut self, now_ms: f64) {
        if now_ms.is_finite() && now_ms > self.now_ms {
            self.now_ms = now_ms;
        }
        while let Some(&(stamp, pod, hash)) = self.order.front() {
            if stamp + self.ttl_ms > self.now_ms {
                break;
            }
            self.order.pop_front();
            if self.remove_if_stamped(pod, hash, stamp) {
                self.stats.expired += 1;
            }
        }
    }

    /// Records `blocks` as pending on `pod`, stamped now.
    pub fn record(&mut self, pod: PodId, blocks: &[BlockHash]) {
        if !self.is_on() {
            return;
        }
        let stamp = self.now_ms;
        for &hash in blocks {
            while self.order.len() >= MAX_PENDING_BLOCKS {
                let Some((old, p, h)) = self.order.pop_front() else {
                    break;
                };
                if self.remove_if_stamped(p, h, old) {
                    self.stats.dropped_over_bound += 1;
                }
            }
            if self.entries.insert((pod.0, hash), stamp).is_none() {
                if self.per_pod.len() <= pod.index() {
                    self.per_pod.resize(pod.index() + 1, 0);
                }
                self.per_pod[pod.index()] += 1;
            }
            self.order.push_back((stamp, pod.0, hash));
            self.stats.recorded += 1;
        }
    }

    /// Whether `hash` is pending on `pod`.
    pub fn contains(&self, pod: PodId, hash: BlockHash) -> bool {
        self.entries.contains_key(&(pod.0, hash))
    }

    /// The pod stored `hash`: no longer pending.
    pub fn confirm(&mut self, pod: PodId, hash: BlockHash) {
        if self.pod_len(pod) > 0 && self.remove(pod.0, hash) {
            self.stats.confirmed += 1;
        }
    }

    /// The pod removed `hash` (or never will store it): no longer pending.
    pub fn drop_block(&mut self, pod: PodId, hash: BlockHash) {
        if self.pod_len(pod) > 0 && self.remove(pod.0, hash) {
            self.stats.dropped += 1;
        }
    }

    /// Drops every pending block of `pod` (cleared, restarted or removed). O(pending blocks).
    pub fn drop_pod(&mut self, pod: PodId) {
        let n = self.pod_len(pod);
        if n == 0 {
            return;
        }
        self.entries.retain(|&(p, _), _| p != pod.0);
        self.order.retain(|&(_, p, _)| p != pod.0);
        if let Some(c) = self.per_pod.get_mut(pod.index()) {
            *c = 0;
        }
        self.stats.dropped += u64::from(n);
    }

    fn remove_if_stamped(&mut self, pod: u32, hash: BlockHash, stamp: f64) -> bool {
        if self.entries.get(&(pod, hash)) == Some(&stamp) {
            self.remove(pod, hash)
        } else {
            false
        }
    }

    fn remove(&mut self, pod: u32, hash: BlockHash) -> bool {
        if self.entries.remove(&(pod, hash)).is_none() {
            return false;
        }
        if let Some(c) = self.per_pod.get_mut(pod as usize) {
            *c = c.saturating_sub(1);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_block_lives_ttl_ms_unless_confirmed() {
        let mut p = PendingRoutes::default();
        p.advance(100.0);
        p.record(PodId(1), &[7, 8]);
        p.advance(100.0 + DEFAULT_PENDING_TTL_MS - 1.0);
        assert!(p.contains(PodId(1), 7) && p.contains(PodId(1), 8));
        assert!(!p.contains(PodId(0), 7));
        p.confirm(PodId(1), 8);
        p.advance(100.0 + DEFAULT_PENDING_TTL_MS);
        assert!(p.is_empty());
        assert_eq!(p.pod_len(PodId(1)), 0);
        let s = p.stats();
        assert_eq!((s.recorded, s.confirmed, s.expired), (2, 1, 1));
    }

    #[test]
    fn recording_again_restarts_the_lifetime() {
        let mut p = PendingRoutes::default();
        p.record(PodId(0), &[5]);
        p.advance(1_500.0);
        p.record(PodId(0), &[5]);
        p.advance(2_500.0);
        assert!(
            p.contains(PodId(0), 5),
            "the first stamp's expiry is a ghost"
        );
        p.advance(3_500.0);
        assert!(!p.contains(PodId(0), 5));
        assert_eq!(p.stats().expired, 1);
    }

    #[test]
    fn the_bound_drops_the_oldest_first() {
        let mut p = PendingRoutes::default();
        let blocks: Vec<u64> = (0..MAX_PENDING_BLOCKS as u64 + 3).collect();
        p.record(PodId(0), &blocks);
        assert_eq!(p.len(), MAX_PENDING_BLOCKS);
        assert!(!p.contains(PodId(0), 2) && p.contains(PodId(0), 3));
        assert_eq!(p.stats().dropped_over_bound, 3);
        assert_eq!(p.pod_len(PodId(0)) as usize, MAX_PENDING_BLOCKS);
    }

    #[test]
    fn dropping_a_pod_keeps_the_others() {
        let mut p = PendingRoutes::default();
        p.record(PodId(0), &[1, 2]);
        p.record(PodId(2), &[1]);
        p.drop_pod(PodId(0));
        assert!(!p.contains(PodId(0), 1) && p.contains(PodId(2), 1));
        p.drop_block(PodId(2), 1);
        assert!(p.is_empty());
        assert_eq!(p.stats().dropped, 3);
    }

    #[test]
    fn ttl_zero_records_nothing() {
        let mut p = PendingRoutes::default();
        p.set_ttl_ms(0.0);
        p.record(PodId(0), &[1]);
        assert!(p.is_empty());
        p.set_ttl_ms(f64::NAN);
        assert!(!p.is_on());
    }
}
