//! The session's adapter book: what kvgate itself routed to each pod, per LoRA adapter —
//! adapters with requests in flight (running, whatever the pod's lagging metric says) and the
//! most recently routed ones (resident). [`AdapterBook::fill`] writes that view into a pod's
//! [`LoraSlots`] before each decision; see [`crate::adapters`] for the fit and its cost.
//!
//! Bound: at most [`MAX_TRACKED_ADAPTERS`] entries per pod id, for pod ids below the routed
//! index's `MAX_PODS`; the least recently routed entry without requests in flight is evicted,
//! and a full book of in-flight adapters stops recording new ones until one drains (counted in
//! `dropped`).

use crate::adapters::{AdapterId, AdapterSet, LoraSlots, MAX_TRACKED_ADAPTERS};
use crate::pod::PodId;

#[derive(Debug, Clone, Copy)]
struct BookEntry {
    adapter: AdapterId,
    in_flight: u32,
    /// The book's route counter when this adapter was last routed to the pod (recency).
    last_routed: u64,
}

/// What kvgate itself routed, per pod: adapters in flight and the most recently routed ones.
/// Kept by the [`crate::RouterSession`]; see the module docs for its bound.
#[derive(Debug, Default)]
pub struct AdapterBook {
    pods: Vec<Vec<BookEntry>>,
    routes: u64,
    /// Routes not recorded because the pod's entries were all in flight.
    pub dropped: u64,
}

impl AdapterBook {
    /// A request for `adapter` was routed to `pod`; false when it could not be recorded (the
    /// caller then must not call [`AdapterBook::finished`] for it).
    pub fn routed(&mut self, pod: PodId, adapter: AdapterId) -> bool {
        if pod.index() >= crate::index::routed::MAX_PODS {
            return false;
        }
        if self.pods.len() <= pod.index() {
            self.pods.resize_with(pod.index() + 1, Vec::new);
        }
        self.routes += 1;
        let now = self.routes;
        let Some(entries) = self.pods.get_mut(pod.index()) else {
            return false;
        };
        if let Some(e) = entries.iter_mut().find(|e| e.adapter == adapter) {
            e.in_flight += 1;
            e.last_routed = now;
            return true;
        }
        if entries.len() >= MAX_TRACKED_ADAPTERS {
            let oldest_idle = entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.in_flight == 0)
                .min_by_key(|(_, e)| e.last_routed)
                .map(|(i, _)| i);
            match oldest_idle {
                Some(i) => {
                    entries.swap_remove(i);
                }
                None => {
                    self.dropped += 1;
                    return false;
                }
            }
        }
        entries.push(BookEntry {
            adapter,
            in_flight: 1,
            last_routed: now,
        });
        true
    }

    /// A request recorded by [`AdapterBook::routed`] ended.
    pub fn finished(&mut self, pod: PodId, adapter: AdapterId) {
        if let Some(e) = self
            .pods
            .get_mut(pod.index())
            .and_then(|entries| entries.iter_mut().find(|e| e.adapter == adapter))
        {
            e.in_flight = e.in_flight.saturating_sub(1);
        }
    }

    /// Requests in flight for `adapter` on `pod`.
    pub fn in_flight(&self, pod: PodId, adapter: AdapterId) -> u32 {
        self.pods
            .get(pod.index())
            .and_then(|entries| entries.iter().find(|e| e.adapter == adapter))
            .map_or(0, |e| e.in_flight)
    }

    /// Writes the book's view of `pod` into `slots`: adapters in flight, and the last
    /// `max_loras` routed as resident (the metric's `running` is left as it is).
    pub fn fill(&self, pod: PodId, slots: &mut LoraSlots) {
        slots.in_flight = AdapterSet::default();
        slots.resident = AdapterSet::default();
        let Some(entries) = self.pods.get(pod.index()) else {
            return;
        };
        for e in entries.iter().filter(|e| e.in_flight > 0) {
            if Some(e.adapter) != slots.base_model {
                slots.in_flight.insert(e.adapter);
            }
        }
        let mut recent: [Option<(u64, AdapterId)>; MAX_TRACKED_ADAPTERS] =
            [None; MAX_TRACKED_ADAPTERS];
        for (slot, e) in recent.iter_mut().zip(entries) {
            *slot = Some((e.last_routed, e.adapter));
        }
        recent.sort_unstable_by(|a, b| b.cmp(a));
        for (_, adapter) in recent
            .iter()
            .flatten()
            .filter(|(_, a)| Some(*a) != slots.base_model)
            .take(slots.max_loras.max(1) as usize)
        {
            slots.resident.insert(*adapter);
        }
    }

    /// The pod left the fleet.
    pub fn remove_pod(&mut self, pod: PodId) {
        if let Some(entries) = self.pods.get_mut(pod.index()) {
            entries.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::AdapterFit;
    use crate::adapters::tests::slots;

    #[test]
    fn book_counts_in_flight_as_running_and_recent_routes_as_resident() {
        let (a, b, c) = (AdapterId::of("a"), AdapterId::of("b"), AdapterId::of("c"));
        let mut book = AdapterBook::default();
        book.routed(PodId(0), a);
        book.routed(PodId(0), b);
        book.finished(PodId(0), a);
        book.finished(PodId(0), b);
        book.routed(PodId(0), c);
        let mut s = slots(2, &[]);
        book.fill(PodId(0), &mut s);
        assert_eq!(s.in_flight.as_slice(), &[c]);
        // max_loras 2: the two most recent (c, then b) are resident, a was evicted.
        assert!(s.resident.contains(c) && s.resident.contains(b));
        assert!(!s.resident.contains(a));
        assert_eq!(s.fit(a), AdapterFit::Evict, "b idle in its slot");
        book.finished(PodId(0), c);
        assert_eq!(book.in_flight(PodId(0), c), 0);
    }

    #[test]
    fn book_stays_bounded_and_keeps_in_flight_entries() {
        let mut book = AdapterBook::default();
        for i in 0..MAX_TRACKED_ADAPTERS {
            assert!(book.routed(PodId(1), AdapterId(i as u64)));
        }
        assert!(
            !book.routed(PodId(1), AdapterId(999)),
            "all in flight: not recorded"
        );
        assert_eq!(book.dropped, 1);
        book.finished(PodId(1), AdapterId(3));
        assert!(book.routed(PodId(1), AdapterId(999)));
        assert_eq!(book.in_flight(PodId(1), AdapterId(3)), 0);
        assert_eq!(book.pods[1].len(), MAX_TRACKED_ADAPTERS);
    }
}
