//! Session affinity: which pod served a client session (an agent's conversation) last.
//!
//! Agents pause for tool calls and come back, and their context gets rewritten (compaction,
//! tool results spliced in the middle), so the prompt's prefix match with the pod that served
//! the session breaks even though that pod still holds the part before the rewrite. A request
//! that carries a session key (the gateway reads it from configurable headers) is scored with a
//! prefix-score floor on the session's last pod: a floor, not a pin, so the load gate and health
//! still apply and the predicted TTFT is still the pod's real one.
//!
//! Parameters (router keys): `session_affinity_ttl_ms` (how long a session is remembered after
//! its last request; 0, the default, turns session affinity off) and `session_affinity_floor`
//! (the floor, default 0.9: above the gate's τ 0.80, so the pod is sticky).
//!
//! Sans IO: the driver moves the clock ([`SessionIndex::advance`]); a session's last request
//! stamps it with the last time the driver gave.
//!
//! # Bounds
//!
//! At most [`MAX_SESSIONS`] sessions; at the bound the least recently stamped is forgotten
//! first. Memory: a map entry of 8 + 4 + 8 bytes (≤ 46 at a hashbrown load of 7/16) and 16 bytes
//! per queue entry; the queue keeps at most [`MAX_SESSIONS`] entries: under 4.1 MB.

use crate::pod::PodId;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// Most sessions remembered at once.
pub const MAX_SESSIONS: usize = 65_536;

/// Session key → the pod that served its last request; see the module docs.
#[derive(Debug, Default)]
pub struct SessionIndex {
    ttl_ms: f64,
    now_ms: f64,
    last_pod: FxHashMap<u64, (PodId, f64)>,
    /// Stamps, oldest first; an entry whose stamp no longer matches `last_pod` is a ghost.
    order: VecDeque<(f64, u64)>,
}

impl SessionIndex {
    /// Sets the lifetime (0 or less: off, and every session is forgotten).
    pub fn set_ttl_ms(&mut self, ttl_ms: f64) {
        self.ttl_ms = if ttl_ms.is_finite() {
            ttl_ms.max(0.0)
        } else {
            0.0
        };
        if self.ttl_ms == 0.0 {
            self.last_pod.clear();
            self.order.clear();
        }
    }

    pub fn is_on(&self) -> bool {
        self.ttl_ms > 0.0
    }

    /// Sessions remembered now.
    pub fn len(&self) -> usize {
        self.last_pod.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_pod.is_empty()
    }

    /// Moves the clock to `now_ms` (never back) and forgets sessions idle for `ttl_ms`.
    pub fn advance(&mut self, now_ms: f64) {
        if now_ms.is_finite() && now_ms > self.now_ms {
            self.now_ms = now_ms;
        }
        while let Some(&(stamp, key)) = self.order.front() {
            if stamp + self.ttl_ms > self.now_ms {
                break;
            }
            self.order.pop_front();
            self.forget_if_stamped(key, stamp);
        }
    }

    /// The pod that served the session's last request, if it is remembered.
    pub fn pod_of(&self, key: u64) -> Option<PodId> {
        self.last_pod.get(&key).map(|&(pod, _)| pod)
    }

    /// The session's request went to `pod`, now.
    pub fn record(&mut self, key: u64, pod: PodId) {
        if !self.is_on() {
            return;
        }
        while self.order.len() >= MAX_SESSIONS {
            let Some((stamp, old)) = self.order.pop_front() else {
                break;
            };
            self.forget_if_stamped(old, stamp);
        }
        self.last_pod.insert(key, (pod, self.now_ms));
        self.order.push_back((self.now_ms, key));
    }

    /// Forgets every session whose last pod is `pod` (removed from the fleet). O(sessions).
    pub fn remove_pod(&mut self, pod: PodId) {
        self.last_pod.retain(|_, &mut (p, _)| p != pod);
    }

    fn forget_if_stamped(&mut self, key: u64, stamp: f64) {
        if self.last_pod.get(&key).is_some_and(|&(_, s)| s == stamp) {
            self.last_pod.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(ttl_ms: f64) -> SessionIndex {
        let mut s = SessionIndex::default();
        s.set_ttl_ms(ttl_ms);
        s
    }

    #[test]
    fn a_session_follows_its_last_pod_until_it_idles_for_the_ttl() {
        let mut s = on(1_000.0);
        s.record(7, PodId(2));
        s.advance(500.0);
        s.record(7, PodId(3));
        assert_eq!(s.pod_of(7), Some(PodId(3)));
        s.advance(1_200.0);
        assert_eq!(
            s.pod_of(7),
            Some(PodId(3)),
            "the first stamp's expiry is a ghost"
        );
        s.advance(1_500.0);
        assert_eq!(s.pod_of(7), None);
    }

    #[test]
    fn off_remembers_nothing_and_the_bound_forgets_the_oldest() {
        let mut off = SessionIndex::default();
        off.record(1, PodId(0));
        assert!(off.is_empty());
        let mut s = on(1e9);
        for key in 0..MAX_SESSIONS as u64 + 2 {
            s.record(key, PodId(0));
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        assert_eq!((s.pod_of(1), s.pod_of(2)), (None, Some(PodId(0))));
    }

    #[test]
    fn removing_a_pod_forgets_its_sessions() {
        let mut s = on(1e9);
        s.record(1, PodId(0));
        s.record(2, PodId(1));
        s.remove_pod(PodId(0));
        assert_eq!((s.pod_of(1), s.pod_of(2)), (None, Some(PodId(1))));
    }
}
