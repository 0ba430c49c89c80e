//! Prefix indexes: which pod holds which prompt blocks.
//!
//! Two kinds live behind [`PrefixIndex`]: the *routed* index ([`routed::RoutedIndex`], records
//! where requests were sent) and the *engine* index ([`engine::EngineIndex`], fed by vLLM
//! KV-cache events decoded by [`kv_events_wire`]); [`engine::HybridIndex`] uses the engine index
//! for pods with live events and the routed index for the others; [`pending`] holds the routes
//! to live pods their events have not confirmed yet. [`follower`] follows one
//! pod's event sequence (gaps, replay, restarts, staleness) for every driver. [`popularity`]
//! counts how many recent requests carried a block (shared system prompt or one conversation's
//! history), for the affinity gate's shared-prefix exploration.

pub mod engine;
pub mod follower;
pub mod kv_events_wire;
pub mod pending;
pub mod popularity;
pub mod routed;

use crate::blocks::BlockHash;
use crate::pod::PodId;

/// Default per-pod capacity in blocks when the pod has not reported its KV size (llm-d's
/// `lruCapacityPerServer`: ~500k tokens of an H100 80 GB for Llama-3-8B / 16 tokens).
pub const DEFAULT_POD_CAPACITY_BLOCKS: u32 = 31_250;

pub trait PrefixIndex {
    /// Leading-block match per pod: clears `matched`, resizes it to cover every pod id the index
    /// knows (dense by [`PodId::index`]), and sets `matched[p]` to the number of leading blocks
    /// of `blocks` (blocks 0..k, all of them) that pod p holds. Cost O(blocks × pods per block),
    /// never O(indexed blocks × pods).
    fn match_prefix(&self, blocks: &[BlockHash], matched: &mut Vec<u32>);

    /// Records that a request with these blocks was sent to `pod` (the routed index learns from
    /// this; the engine index records the blocks as pending, [`pending`]).
    fn record_routed(&mut self, pod: PodId, blocks: &[BlockHash]);

    /// Per pod (dense by [`PodId::index`], empty when none), how many of the blocks matched by
    /// the last [`PrefixIndex::match_prefix`] were pending routes rather than blocks the pod's
    /// events reported stored. Indexes without pending routes leave `out` empty.
    fn pending_matched(&self, out: &mut Vec<u32>) {
        out.clear();
    }

    /// Sets a pod's capacity in blocks (evicting least-recently-used blocks if it shrinks).
    fn set_capacity(&mut self, pod: PodId, capacity_blocks: u32);

    /// Forgets everything about a pod (removed from the fleet, or restarted).
    fn remove_pod(&mut self, pod: PodId);

    /// Blocks indexed over all pods (a block held by two pods counts twice).
    fn indexed_blocks(&self) -> usize;
}

/// How many blocks of `to_size` tokens hold as many tokens as `blocks` blocks of `from_size`
/// (rounded down, saturating; a size of 0 is taken as `to_size`, i.e. no conversion).
pub fn blocks_at_size(blocks: u32, from_size: u32, to_size: u32) -> u32 {
    if from_size == 0 || to_size == 0 || from_size == to_size {
        return blocks;
    }
    let tokens = u64::from(blocks) * u64::from(from_size);
    u32::try_from(tokens / u64::from(to_size)).unwrap_or(u32::MAX)
}

/// Prefix score of a pod: leading blocks held / blocks in the prompt; 0 for an empty prompt.
pub fn prefix_score(matched_blocks: u32, prompt_blocks: usize) -> f64 {
    if prompt_blocks == 0 {
        0.0
    } else {
        (matched_blocks as f64 / prompt_blocks as f64).min(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn capacity_converts_to_the_index_block_size() {
        // A vLLM CPU pod: 860 blocks of 128 tokens are 6,880 blocks of 16.
        assert_eq!(blocks_at_size(860, 128, 16), 6_880);
        assert_eq!(blocks_at_size(6_880, 16, 128), 860);
        assert_eq!(blocks_at_size(7, 16, 128), 0);
        assert_eq!(blocks_at_size(29_000, 16, 16), 29_000);
        assert_eq!(blocks_at_size(5, 0, 16), 5);
        assert_eq!(blocks_at_size(u32::MAX, 128, 16), u32::MAX);
    }

    proptest! {
        #[test]
        fn scores_lie_in_unit_interval_and_grow_with_the_matched_prefix(
            prompt_blocks in 0usize..10_000,
            a in 0u32..12_000,
            b in 0u32..12_000,
        ) {
            let (lo, hi) = (a.min(b), a.max(b));
            let (s_lo, s_hi) = (prefix_score(lo, prompt_blocks), prefix_score(hi, prompt_blocks));
            prop_assert!((0.0..=1.0).contains(&s_lo) && (0.0..=1.0).contains(&s_hi));
            prop_assert!(s_lo <= s_hi);
            if prompt_blocks > 0 && hi as usize <= prompt_blocks && lo < hi {
                prop_assert!(s_lo < s_hi);
            }
        }
    }

    #[test]
    fn empty_prompt_scores_zero_and_full_match_scores_one() {
        assert_eq!(prefix_score(0, 0), 0.0);
        assert_eq!(prefix_score(7, 7), 1.0);
        assert_eq!(prefix_score(1, 4), 0.25);
    }
}
