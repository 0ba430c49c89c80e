//! The routed (approximate) prefix index.
//!
//! CONTRACT (to be implemented): per-pod strict LRU of block hashes with a capacity in blocks
//! (default [`super::DEFAULT_POD_CAPACITY_BLOCKS`], or the pod's reported KV block count); a
//! block → pods map kept exactly in sync with the LRUs, so scoring costs O(prompt blocks).
//! Recording touches the prompt's blocks last-to-first, so a prompt's first blocks are the most
//! recently used and evicted last (as vLLM frees a request's tail blocks first).

use super::PrefixIndex;
use crate::blocks::BlockHash;
use crate::pod::PodId;

#[derive(Debug, Default)]
pub struct RoutedIndex {}

impl RoutedIndex {
    pub fn new() -> Self {
        RoutedIndex {}
    }
}

impl PrefixIndex for RoutedIndex {
    fn match_prefix(&self, blocks: &[BlockHash], matched: &mut Vec<u32>) {
        let _ = (blocks, matched);
        todo!()
    }
    fn record_routed(&mut self, pod: PodId, blocks: &[BlockHash]) {
        let _ = (pod, blocks);
        todo!()
    }
    fn set_capacity(&mut self, pod: PodId, capacity_blocks: u32) {
        let _ = (pod, capacity_blocks);
        todo!()
    }
    fn remove_pod(&mut self, pod: PodId) {
        let _ = pod;
        todo!()
    }
    fn indexed_blocks(&self) -> usize {
        todo!()
    }
}
