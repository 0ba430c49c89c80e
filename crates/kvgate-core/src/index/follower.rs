//! Following one pod's KV-event stream, sans IO: sequence numbers, gaps, replay, restarts and
//! staleness, applied to the [`EngineIndex`].
//!
//! vLLM numbers its event batches (`seq`, from 0 per engine start; interfaces.md §2.2). A
//! driver — the gateway's ZeroMQ task, or the simulator's delayed, lossy event feed — hands
//! every batch's `seq` to [`KvEventFollower::on_batch`] with the time now, and does what the
//! answer says:
//!
//! | answer | the driver |
//! |---|---|
//! | [`BatchStep::Apply`] | applies the batch |
//! | [`BatchStep::Skip`] | drops it (already applied from a replay) |
//! | [`BatchStep::JoinedLate`] | may replay `0..seq` (what the pod cached before; partial is fine), then applies |
//! | [`BatchStep::Restarted`] | the pod was cleared; may replay `0..seq` (the new engine's first batches), then applies |
//! | [`BatchStep::Gap`] | replays `from..to`, reports [`KvEventFollower::gap_result`], then applies |
//!
//! A driver that replays a pod's buffer when it (re)subscribes reports the last batch it applied
//! with [`KvEventFollower::replayed`], so live batches the replay already covered are skipped.
//!
//! The algorithm:
//! - The first batch of a subscription sets the expected sequence; with `seq > 0` it is
//!   [`BatchStep::JoinedLate`].
//! - A live `seq` at or below the last live one: the sequence went backwards, so the engine
//!   restarted (vLLM numbers batches from 0 per engine start; a subscriber that reconnects late
//!   sees the new engine's first batch it gets, which may be above 0). The pod's entries are
//!   cleared, it is live (not stale), and the batch applies — after a replay of `0..seq` when
//!   `seq > 0` ([`BatchStep::Restarted`]). A `seq` below the next expected but above the last
//!   live one was already applied from a replay: skipped. A driver that learns of a restart
//!   another way (the pod went down) calls [`KvEventFollower::restarted`].
//! - `seq` beyond the expected one: a gap. If the replay brought every missing batch, nothing
//!   else happens. If not, the pod's entries are cleared and it is **stale** for
//!   `stale_rebuild_ms` (default 30,000, [`DEFAULT_STALE_REBUILD_MS`]): the hybrid index scores
//!   it from the routed index while new events rebuild its view; [`KvEventFollower::tick`] ends
//!   the episode.
//!
//! Time is the driver's, in ms on any monotonic scale (the gateway's elapsed time, the
//! simulator's clock). Bounds: a few words per pod.

use super::engine::EngineIndex;
use crate::pod::PodId;

/// How long a pod stays stale after an unrecovered gap while new events rebuild its view.
pub const DEFAULT_STALE_REBUILD_MS: f64 = 30_000.0;

/// What the driver does with a batch; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchStep {
    Apply {
        /// The sequence went back to 0: the engine restarted and the pod was cleared.
        restarted: bool,
    },
    Skip,
    JoinedLate {
        to: u64,
    },
    /// The sequence went backwards to `to > 0`: the pod was cleared; replay `0..to`.
    Restarted {
        to: u64,
    },
    Gap {
        from: u64,
        to: u64,
    },
}

/// What [`KvEventFollower::gap_result`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapOutcome {
    Replayed,
    /// The pod was cleared and is stale for the rebuild time.
    Stale,
}

/// One pod's position in its event stream; see the module docs.
#[derive(Debug, Clone)]
pub struct KvEventFollower {
    pod: PodId,
    stale_rebuild_ms: f64,
    /// The next expected `seq`; `None` before the first batch (or after a restart).
    next: Option<u64>,
    /// The last `seq` that came on the live stream (not from a replay).
    live_last: Option<u64>,
    stale_until_ms: Option<f64>,
}

impl KvEventFollower {
    pub fn new(pod: PodId, stale_rebuild_ms: f64) -> Self {
        KvEventFollower {
            pod,
            stale_rebuild_ms,
            next: None,
            live_last: None,
            stale_until_ms: None,
        }
    }

    /// A batch with `seq` arrived at `now_ms`; see [`BatchStep`].
    pub fn on_batch(&mut self, seq: u64, now_ms: f64, index: &mut EngineIndex) -> BatchStep {
        let backwards = self.live_last.is_some_and(|last| seq <= last);
        let step = match self.next {
            _ if backwards => {
                self.clear(index, now_ms, false);
                if seq == 0 {
                    BatchStep::Apply { restarted: true }
                } else {
                    BatchStep::Restarted { to: seq }
                }
            }
            None if seq > 0 => BatchStep::JoinedLate { to: seq },
            None => BatchStep::Apply { restarted: false },
            Some(next) if seq == next => BatchStep::Apply { restarted: false },
            // Below the next expected but not behind the live stream: a replay applied it.
            Some(next) if seq < next => {
                self.live_last = Some(seq);
                return BatchStep::Skip;
            }
            Some(next) => BatchStep::Gap {
                from: next,
                to: seq,
            },
        };
        self.live_last = Some(seq);
        self.next = seq.checked_add(1);
        step
    }

    /// A replay applied batches up to `last_seq` (the driver's replay on (re)subscribe): later
    /// live batches the replay covered are skipped.
    pub fn replayed(&mut self, last_seq: u64) {
        let after = last_seq.saturating_add(1);
        self.next = Some(self.next.map_or(after, |n| n.max(after)));
    }

    /// The replay of a [`BatchStep::Gap`]: `complete` when every missing batch was applied.
    /// Otherwise the pod's entries are cleared and it is stale for the rebuild time.
    pub fn gap_result(
        &mut self,
        complete: bool,
        now_ms: f64,
        index: &mut EngineIndex,
    ) -> GapOutcome {
        if complete {
            return GapOutcome::Replayed;
        }
        self.clear(index, now_ms, true);
        GapOutcome::Stale
    }

    /// The driver learnt that the engine restarted (empty cache) other than by its sequence:
    /// the pod is cleared and live, and its next batch starts the sequence again.
    pub fn restarted(&mut self, now_ms: f64, index: &mut EngineIndex) {
        self.clear(index, now_ms, false);
        self.next = None;
        self.live_last = None;
    }

    /// Ends a stale episode whose rebuild time is over; true when it did.
    pub fn tick(&mut self, now_ms: f64, index: &mut EngineIndex) -> bool {
        match self.stale_until_ms {
            Some(until) if now_ms >= until => {
                self.stale_until_ms = None;
                index.set_stale(self.pod, false);
                true
            }
            _ => false,
        }
    }

    pub fn is_stale(&self) -> bool {
        self.stale_until_ms.is_some()
    }

    fn clear(&mut self, index: &mut EngineIndex, now_ms: f64, stale: bool) {
        index.clear_pod(self.pod);
        index.set_stale(self.pod, stale);
        self.stale_until_ms = stale.then_some(now_ms + self.stale_rebuild_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::PrefixIndex;
    use crate::index::engine::PrehashedEvent;

    fn index_with(blocks: &[u64]) -> EngineIndex {
        let mut index = EngineIndex::new();
        index.add_pod(PodId(0), "m");
        index.apply_prehashed(PodId(0), &PrehashedEvent::Stored(blocks));
        index
    }

    fn held(index: &EngineIndex) -> usize {
        index.pod_blocks(PodId(0))
    }

    #[test]
    fn batches_in_order_apply_and_a_repeated_live_seq_means_a_new_engine() {
        let mut index = index_with(&[1]);
        let mut f = KvEventFollower::new(PodId(0), 100.0);
        assert_eq!(
            f.on_batch(0, 0.0, &mut index),
            BatchStep::Apply { restarted: false }
        );
        assert_eq!(
            f.on_batch(1, 0.0, &mut index),
            BatchStep::Apply { restarted: false }
        );
        assert_eq!(held(&index), 1);
        // PUB/SUB never repeats a batch: seq 1 again comes from a restarted engine.
        assert_eq!(
            f.on_batch(1, 0.0, &mut index),
            BatchStep::Restarted { to: 1 }
        );
        assert_eq!(held(&index), 0);
    }

    #[test]
    fn a_first_batch_after_zero_asks_for_what_the_pod_already_holds() {
        let mut index = index_with(&[]);
        let mut f = KvEventFollower::new(PodId(0), 100.0);
        assert_eq!(
            f.on_batch(5, 0.0, &mut index),
            BatchStep::JoinedLate { to: 5 }
        );
        assert_eq!(
            f.on_batch(6, 0.0, &mut index),
            BatchStep::Apply { restarted: false }
        );
    }

    #[test]
    fn a_sequence_back_to_zero_clears_the_pod_and_keeps_it_live() {
        let mut index = index_with(&[1, 2]);
        let mut f = KvEventFollower::new(PodId(0), 100.0);
        f.on_batch(0, 0.0, &mut index);
        f.on_batch(1, 0.0, &mut index);
        assert_eq!(
            f.on_batch(0, 5.0, &mut index),
            BatchStep::Apply { restarted: true }
        );
        assert_eq!(held(&index), 0);
        assert!(index.is_live(PodId(0)));
    }

    #[test]
    fn a_gap_replayed_in_full_changes_nothing_else() {
        let mut index = index_with(&[1]);
        let mut f = KvEventFollower::new(PodId(0), 100.0);
        f.on_batch(0, 0.0, &mut index);
        assert_eq!(
            f.on_batch(4, 1.0, &mut index),
            BatchStep::Gap { from: 1, to: 4 }
        );
        assert_eq!(f.gap_result(true, 1.0, &mut index), GapOutcome::Replayed);
        assert_eq!((held(&index), index.is_live(PodId(0))), (1, true));
    }

    #[test]
    fn an_unreplayed_gap_makes_the_pod_stale_until_the_rebuild_time() {
        let mut index = index_with(&[1]);
        let mut f = KvEventFollower::new(PodId(0), 100.0);
        f.on_batch(0, 0.0, &mut index);
        f.on_batch(3, 10.0, &mut index);
        assert_eq!(f.gap_result(false, 10.0, &mut index), GapOutcome::Stale);
        assert_eq!(held(&index), 0);
        assert!(index.is_stale(PodId(0)));
        assert!(!f.tick(109.9, &mut index));
        assert!(f.tick(110.0, &mut index));
        assert!(index.is_live(PodId(0)) && !f.is_stale());
        assert_eq!(index.indexed_blocks(), 0);
    }

    #[test]
    fn a_live_sequence_that_goes_backwards_above_zero_is_a_restart_to_resync() {
        // vLLM restarted and the subscriber reconnected late: the first batch it gets is seq 2.
        let mut index = index_with(&[1, 2, 3]);
        let mut f = KvEventFollower::new(PodId(0), 100.0);
        for seq in 0..243 {
            f.on_batch(seq, 0.0, &mut index);
        }
        assert_eq!(
            f.on_batch(2, 5.0, &mut index),
            BatchStep::Restarted { to: 2 }
        );
        assert_eq!(held(&index), 0, "the old engine's blocks are cleared");
        assert!(index.is_live(PodId(0)));
        assert_eq!(
            f.on_batch(3, 6.0, &mut index),
            BatchStep::Apply { restarted: false }
        );
    }

    #[test]
    fn live_batches_a_replay_already_applied_are_skipped() {
        let mut index = index_with(&[1]);
        let mut f = KvEventFollower::new(PodId(0), 100.0);
        // Subscribed, replayed 0..=9 from the buffer; the live stream then repeats 8 and 9.
        f.replayed(9);
        assert_eq!(f.on_batch(8, 0.0, &mut index), BatchStep::Skip);
        assert_eq!(f.on_batch(9, 0.0, &mut index), BatchStep::Skip);
        assert_eq!(
            f.on_batch(10, 0.0, &mut index),
            BatchStep::Apply { restarted: false }
        );
        assert_eq!(held(&index), 1, "nothing cleared");
        // The subscribe-time replay can race the first live batches: a live seq 0 after a
        // replay of 0..=1 is the same batch, not a restart.
        let mut g = KvEventFollower::new(PodId(0), 100.0);
        g.replayed(1);
        assert_eq!(g.on_batch(0, 0.0, &mut index), BatchStep::Skip);
        assert_eq!(g.on_batch(1, 0.0, &mut index), BatchStep::Skip);
        assert_eq!(
            g.on_batch(2, 0.0, &mut index),
            BatchStep::Apply { restarted: false }
        );
        assert_eq!(held(&index), 1);
        // A replay reaching past what arrived live moves the expectation on, never back.
        f.replayed(4);
        assert_eq!(
            f.on_batch(11, 0.0, &mut index),
            BatchStep::Apply { restarted: false }
        );
    }

    #[test]
    fn a_restart_told_by_the_driver_starts_the_sequence_again() {
        let mut index = index_with(&[1]);
        let mut f = KvEventFollower::new(PodId(0), 100.0);
        f.on_batch(0, 0.0, &mut index);
        f.on_batch(1, 0.0, &mut index);
        f.restarted(2.0, &mut index);
        assert_eq!(held(&index), 0);
        assert_eq!(
            f.on_batch(0, 3.0, &mut index),
            BatchStep::Apply { restarted: false }
        );
    }
}
