//! Prefixes still being computed: the blocks a request brought to a pod, from its route until
//! its first token.
//!
//! The routed index holds a prefix on a pod from the moment a request carrying it is routed
//! there. The pod holds it only once that request's prefill has computed it: an engine
//! registers a block in its prefix cache when the block is computed, so a second request that
//! is scheduled while the first is still prefilling (in the same step) computes the prefix
//! again. Parallel tool calls and fan-out siblings arrive in exactly that window. With
//! `predict_computed_prefix` the router predicts such a request as uncached from the first block
//! still being computed (`RouterConfig::predict_computed_prefix`).
//!
//! The window: a request that reaches an engine while an earlier one's prefill step is already
//! running waits for that step and then finds the prefix computed; only one that arrives before
//! the earlier request is scheduled joins its step and computes the prefix again. So a mark
//! counts from its route until the request is predicted to start: its predicted TTFT less the
//! same request's on an idle pod (the wait the load adds), plus one engine step (its predicted
//! TPOT) (`until_ms`; the driver's clock from `RouterSession::advance_clock`). Siblings sent
//! together (parallel tool calls, a fan-out) or while the first waits behind a busy pod's step
//! fall inside it; a request of the same tenant a few hundred ms after one that went straight
//! into an idle pod does not (it waits for that prefill and hits).
//!
//! Each mark is one request's first new block on a pod: its position `from` in the pod's chain
//! and its hash. The blocks are chained (a block's hash covers the whole prefix before it), so
//! a prompt that has that hash at that position shares the prefix up to and including it and
//! meets the uncomputed part there; a prompt that differs earlier does not reach it.
//!
//! Cost: a decision walks the open marks of the pods (a mark whose window has closed goes at the
//! next decision), with no hash-map probe per block. Bounds: one mark per request from its route
//! until its window closes, its first token or its end, at most [`MAX_MARKS`] in all (32 bytes
//! each, up to twice that while a pod's list grows: ≤ 4.2 MB); past the bound a route is not marked (counted in [`Prefilling::unmarked`]) and
//! is predicted as before.

use crate::blocks::BlockHash;
use crate::pod::{PodId, PodSnapshot};
use crate::router::PromptCut;
#[cfg(test)]
use crate::router::computed;

/// Most marks held at once over all pods.
pub const MAX_MARKS: usize = 65_536;

/// No block of the prompt is being computed on the pod ([`Prefilling::caps`]).
pub const NO_CAP: u32 = u32::MAX;

/// One request's hold on the blocks it brought to a pod, given back at its first token or end.
#[derive(Debug, PartialEq, Eq)]
pub struct Mark {
    pod: PodId,
    id: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u64,
    /// Until when (the driver's clock, ms) a request arriving at the pod would be scheduled
    /// in the same engine step as this one.
    until_ms: f64,
    /// Position of the first block the pod did not hold when the request was routed.
    from: u32,
    hash: BlockHash,
}

/// The marks of every pod (see the module docs).
#[derive(Debug, Default)]
pub struct Prefilling {
    /// Marks per pod id.
    per_pod: Vec<Vec<Entry>>,
    held: usize,
    next_id: u64,
    unmarked: u64,
}

impl Prefilling {
    /// A request carrying `blocks` (in the pod's own block size) was routed to `pod`, which
    /// already held the first `held` of them: the rest are being computed until [`Self::end`].
    /// `None` when nothing is new (or the bound is reached).
    pub fn start(
        &mut self,
        pod: PodId,
        blocks: &[BlockHash],
        held: u32,
        until_ms: f64,
    ) -> Option<Mark> {
        let hash = *blocks.get(held as usize)?;
        if self.held >= MAX_MARKS {
            self.unmarked += 1;
            return None;
        }
        let i = pod.index();
        if self.per_pod.len() <= i {
            self.per_pod.resize_with(i + 1, Vec::new);
        }
        self.next_id += 1;
        let id = self.next_id;
        self.per_pod[i].push(Entry {
            id,
            until_ms,
            from: held,
            hash,
        });
        self.held += 1;
        Some(Mark { pod, id })
    }

    /// The request's first token arrived, or it ended: its blocks are computed (or never
    /// will be). A mark of a removed pod is already gone.
    pub fn end(&mut self, mark: Mark) {
        let Some(marks) = self.per_pod.get_mut(mark.pod.index()) else {
            return;
        };
        if let Some(k) = marks.iter().position(|e| e.id == mark.id) {
            marks.swap_remove(k);
            self.held -= 1;
        }
    }

    /// The pod left the fleet: its marks go.
    pub fn remove_pod(&mut self, pod: PodId) {
        if let Some(marks) = self.per_pod.get_mut(pod.index()) {
            self.held -= marks.len();
            marks.clear();
        }
    }

    /// For each of `pods` (indexed by [`PodId::index`]): the position in the pod's chain of
    /// `cut` of the first block some request is still computing there, or [`NO_CAP`]. `out`
    /// is left empty when no pod has a mark. Only marks whose window is still open at `now_ms`
    /// count, and a pod that reports waiting requests is not capped: a request queued there
    /// starts after the ones before it, whose prefill has then computed the prefix.
    pub fn caps(
        &mut self,
        cut: &PromptCut<'_>,
        pods: &[PodSnapshot],
        now_ms: f64,
        out: &mut Vec<u32>,
    ) {
        out.clear();
        if self.held == 0 {
            return;
        }
        for pod in pods {
            let Some(marks) = self.per_pod.get_mut(pod.id.index()) else {
                continue;
            };
            // A closed window never opens again (the clock only moves on): its mark goes, so a
            // decision walks only the marks it may use and closed marks hold no room.
            let before = marks.len();
            marks.retain(|e| now_ms <= e.until_ms);
            self.held -= before - marks.len();
            if pod.waiting > 0 {
                continue;
            }
            let (chain, _) = cut.blocks_for(pod);
            let cap = marks
                .iter()
                .filter(|e| chain.get(e.from as usize) == Some(&e.hash))
                .map(|e| e.from)
                .min()
                .unwrap_or(NO_CAP);
            if cap != NO_CAP {
                if out.len() <= pod.id.index() {
                    out.resize(pod.id.index() + 1, NO_CAP);
                }
                out[pod.id.index()] = cap;
            }
        }
    }

    /// Marks held now.
    pub fn len(&self) -> usize {
        self.held
    }

    /// Whether no mark is held.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Routes not marked because [`MAX_MARKS`] was reached.
    pub fn unmarked(&self) -> u64 {
        self.unmarked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(seed: u64, n: u64) -> Vec<BlockHash> {
        (0..n).map(|i| seed * 1_000 + i).collect()
    }

    fn pods(n: u32) -> Vec<PodSnapshot> {
        (0..n).map(|i| PodSnapshot::idle(i, "c", 1_000)).collect()
    }

    fn cut(blocks: &[BlockHash]) -> PromptCut<'_> {
        PromptCut {
            blocks,
            block_size_tokens: 16,
            other_sizes: &[],
            adapter: None,
        }
    }

    #[test]
    fn a_prompt_sharing_a_prefix_being_computed_is_capped_where_the_new_blocks_start() {
        let mut p = Prefilling::default();
        let first = chain(1, 10);
        // Pod 1 held the first 2 blocks; blocks 2.. are new there.
        let mark = p
            .start(PodId(1), &first, 2, 10.0)
            .expect("new blocks are marked");
        let pods = pods(3);
        let mut caps = Vec::new();
        // A sibling with the same 10 blocks and 3 more.
        let mut sibling = first.clone();
        sibling.extend(chain(2, 3));
        p.caps(&cut(&sibling), &pods, 0.0, &mut caps);
        assert_eq!(computed(12, &caps, PodId(1)), 2);
        assert_eq!(computed(0, &caps, PodId(1)), 0);
        // Other pods are not capped.
        assert_eq!(computed(12, &caps, PodId(0)), 12);
        assert_eq!(computed(5, &caps, PodId(2)), 5);
        // A prompt that shares only the held part never meets the new blocks.
        let mut other = first[..2].to_vec();
        other.extend(chain(3, 8));
        p.caps(&cut(&other), &pods, 0.0, &mut caps);
        assert_eq!(computed(2, &caps, PodId(1)), 2);
        // At the first token the blocks are computed.
        p.end(mark);
        p.caps(&cut(&sibling), &pods, 0.0, &mut caps);
        assert!(caps.is_empty());
        assert_eq!(computed(12, &caps, PodId(1)), 12);
        assert!(p.is_empty());
    }

    #[test]
    fn a_mark_counts_for_its_window_only() {
        let mut p = Prefilling::default();
        let a = chain(1, 8);
        let _m = p.start(PodId(0), &a, 0, 30.0).unwrap();
        let mut caps = Vec::new();
        p.caps(&cut(&a), &pods(1), 30.0, &mut caps);
        assert_eq!(computed(8, &caps, PodId(0)), 0);
        // Later, the earlier request's step is running: a newcomer waits for it and hits.
        p.caps(&cut(&a), &pods(1), 30.5, &mut caps);
        assert_eq!(computed(8, &caps, PodId(0)), 8);
    }

    #[test]
    fn a_pod_with_waiting_requests_is_not_capped() {
        let mut p = Prefilling::default();
        let a = chain(1, 8);
        let _m = p.start(PodId(0), &a, 0, 10.0).unwrap();
        let mut pods = pods(1);
        let mut caps = Vec::new();
        p.caps(&cut(&a), &pods, 0.0, &mut caps);
        assert_eq!(computed(8, &caps, PodId(0)), 0);
        // Queued behind the request bringing the prefix, a sibling starts once it is computed.
        pods[0].waiting = 2;
        p.caps(&cut(&a), &pods, 0.0, &mut caps);
        assert_eq!(computed(8, &caps, PodId(0)), 8);
    }

    #[test]
    fn the_earliest_uncomputed_block_of_several_requests_caps_the_prefix() {
        let mut p = Prefilling::default();
        let a = chain(1, 10);
        let m1 = p.start(PodId(0), &a[..6], 4, 10.0).unwrap();
        let m2 = p.start(PodId(0), &a, 1, 10.0).unwrap();
        let mut caps = Vec::new();
        p.caps(&cut(&a), &pods(1), 0.0, &mut caps);
        assert_eq!(computed(10, &caps, PodId(0)), 1);
        p.end(m2);
        p.caps(&cut(&a), &pods(1), 0.0, &mut caps);
        assert_eq!(computed(10, &caps, PodId(0)), 4);
        p.end(m1);
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn a_route_with_nothing_new_is_not_marked_and_a_removed_pod_keeps_no_marks() {
        let mut p = Prefilling::default();
        let a = chain(1, 4);
        assert_eq!(p.start(PodId(0), &a, 4, 10.0), None);
        assert_eq!(p.start(PodId(0), &[], 0, 10.0), None);
        let m = p.start(PodId(2), &a, 0, 10.0).unwrap();
        p.remove_pod(PodId(2));
        assert!(p.is_empty());
        // Ending a mark of a removed pod does nothing.
        p.end(m);
        assert!(p.is_empty());
    }

    #[test]
    fn a_mark_takes_the_32_bytes_the_docs_bound() {
        assert_eq!(std::mem::size_of::<Entry>(), 32);
    }

    #[test]
    fn marks_are_bounded() {
        let mut p = Prefilling::default();
        let a = chain(1, 2);
        let marks: Vec<_> = (0..MAX_MARKS)
            .map(|_| p.start(PodId(0), &a, 0, 10.0).unwrap())
            .collect();
        assert_eq!(p.start(PodId(0), &a, 0, 10.0), None);
        assert_eq!(p.unmarked(), 1);
        assert_eq!(p.len(), MAX_MARKS);
        drop(marks);
    }
}
