//! The KV-cache block pool of one engine, with vLLM v1 prefix-caching semantics.
//!
//! - A fixed pool of `num_blocks` blocks (of the engine's block size, 16 tokens by default),
//!   each with a reference count (the running requests using it) and optionally the chained
//!   hash of the prompt block it holds.
//! - Free blocks (ref count 0) sit in one LRU queue, an intrusive doubly linked list so that a
//!   block can be taken out of the middle in O(1) when a prefix hit revives it. Allocation pops the
//!   front (least recently freed) and evicts its hash; freeing appends at the back. A request's
//!   blocks are freed tail first (vLLM `free_blocks(reversed(...))`), so the tail of a prompt is
//!   evicted before its head, which other prompts are more likely to share.
//! - A block's hash is registered once the block is full of prompt tokens. When a hash is already
//!   registered by another block (two identical prompts prefilled concurrently) the second block
//!   stays unregistered; vLLM keeps both, which only matters until one of them is evicted.
//! - Memory is bounded by `num_blocks`: the hash map holds at most one entry per block.

use kvgate_core::BlockHash;
use rustc_hash::FxHashMap;

/// Index of a block in the pool.
pub(crate) type BlockId = u32;

const NIL: BlockId = BlockId::MAX;

#[derive(Debug, Clone)]
struct Block {
    hash: BlockHash,
    /// Whether `hash` is registered in the map (the block is "cached").
    cached: bool,
    ref_cnt: u32,
    prev: BlockId,
    next: BlockId,
}

/// A change of the set of cached blocks, as vLLM reports it over KV events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEvent {
    /// A full prompt block became cached.
    Stored(BlockHash),
    /// A cached block was evicted to be reused.
    Removed(BlockHash),
}

/// The block pool with its free LRU queue and hash → block map.
#[derive(Debug, Clone)]
pub(crate) struct KvCache {
    blocks: Vec<Block>,
    cached: FxHashMap<BlockHash, BlockId>,
    free_head: BlockId,
    free_tail: BlockId,
    num_free: u32,
    /// Whether to record `KvEvent`s into `events`.
    pub(crate) record_events: bool,
    pub(crate) events: Vec<KvEvent>,
}

impl KvCache {
    pub(crate) fn new(num_blocks: u32) -> Self {
        let n = num_blocks as usize;
        let mut cache = KvCache {
            blocks: Vec::with_capacity(n),
            cached: FxHashMap::with_capacity_and_hasher(n, Default::default()),
            free_head: NIL,
            free_tail: NIL,
            num_free: 0,
            record_events: false,
            events: Vec::new(),
        };
        for id in 0..num_blocks {
            cache.blocks.push(Block {
                hash: 0,
                cached: false,
                ref_cnt: 0,
                prev: NIL,
                next: NIL,
            });
            cache.push_free(id);
        }
        cache
    }

    pub(crate) fn num_blocks(&self) -> u32 {
        self.blocks.len() as u32
    }

    pub(crate) fn num_free(&self) -> u32 {
        self.num_free
    }

    /// Blocks held by running requests (cached-but-free blocks are not counted, as in vLLM).
    pub(crate) fn num_used(&self) -> u32 {
        self.num_blocks() - self.num_free
    }

    /// Number of cached blocks (free or in use).
    pub(crate) fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Finds the longest run of leading `hashes` that are cached, pushing their block ids into
    /// `out` (cleared first). Returns how many of them are free (reviving them costs free blocks).
    pub(crate) fn find_prefix(&self, hashes: &[BlockHash], out: &mut Vec<BlockId>) -> u32 {
        out.clear();
        let mut free = 0;
        for h in hashes {
            match self.cached.get(h) {
                Some(&id) => {
                    if self.blocks[id as usize].ref_cnt == 0 {
                        free += 1;
                    }
                    out.push(id);
                }
                None => break,
            }
        }
        free
    }

    /// Length of the run of leading `hashes` that are cached (free or in use).
    pub(crate) fn prefix_len(&self, hashes: &[BlockHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(*h))
            .count()
    }

    /// Takes a reference on a cached block found by `find_prefix`, reviving it if free.
    pub(crate) fn touch(&mut self, id: BlockId) {
        if self.blocks[id as usize].ref_cnt == 0 {
            self.unlink_free(id);
        }
        self.blocks[id as usize].ref_cnt += 1;
    }

    /// Allocates the least recently freed block, evicting its hash. `None` when none is free.
    pub(crate) fn allocate(&mut self) -> Option<BlockId> {
        let id = self.free_head;
        if id == NIL {
            return None;
        }
        self.unlink_free(id);
        let b = &mut self.blocks[id as usize];
        b.ref_cnt = 1;
        if b.cached {
            b.cached = false;
            let hash = b.hash;
            self.cached.remove(&hash);
            if self.record_events {
                self.events.push(KvEvent::Removed(hash));
            }
        }
        Some(id)
    }

    /// Drops one reference on each block of a request, tail first; blocks reaching zero join the
    /// back of the free queue keeping their hash.
    pub(crate) fn free_all(&mut self, table: &[BlockId]) {
        for &id in table.iter().rev() {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.ref_cnt > 0);
            b.ref_cnt -= 1;
            if b.ref_cnt == 0 {
                self.push_free(id);
            }
        }
    }

    /// Registers `hash` for a block that just became full of prompt tokens.
    pub(crate) fn register(&mut self, id: BlockId, hash: BlockHash) {
        let b = &mut self.blocks[id as usize];
        if b.cached {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(hash) {
            e.insert(id);
            b.cached = true;
            b.hash = hash;
            if self.record_events {
                self.events.push(KvEvent::Stored(hash));
            }
        }
    }

    /// Hashes of the free queue from the next to be evicted to the last (for tests).
    #[cfg(test)]
    pub(crate) fn free_queue_hashes(&self) -> Vec<Option<BlockHash>> {
        let mut out = Vec::new();
        let mut id = self.free_head;
        while id != NIL {
            let b = &self.blocks[id as usize];
            out.push(b.cached.then_some(b.hash));
            id = b.next;
        }
        out
    }

    fn push_free(&mut self, id: BlockId) {
        let tail = self.free_tail;
        {
            let b = &mut self.blocks[id as usize];
            b.prev = tail;
            b.next = NIL;
        }
        if tail == NIL {
            self.free_head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.free_tail = id;
        self.num_free += 1;
    }

    fn unlink_free(&mut self, id: BlockId) {
        let (prev, next) = {
            let b = &self.blocks[id as usize];
            (b.prev, b.next)
        };
        if prev == NIL {
            self.free_head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.free_tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = NIL;
        b.next = NIL;
        self.num_free -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc_registered(c: &mut KvCache, hashes: &[BlockHash]) -> Vec<BlockId> {
        hashes
            .iter()
            .map(|&h| {
                let id = c.allocate().unwrap();
                c.register(id, h);
                id
            })
            .collect()
    }

    #[test]
    fn freed_blocks_are_evicted_tail_first_and_oldest_request_first() {
        let mut c = KvCache::new(6);
        let a = alloc_registered(&mut c, &[1, 2, 3]);
        let b = alloc_registered(&mut c, &[4, 5, 6]);
        assert_eq!(c.num_free(), 0);
        c.free_all(&a);
        c.free_all(&b);
        assert_eq!(
            c.free_queue_hashes(),
            vec![Some(3), Some(2), Some(1), Some(6), Some(5), Some(4)]
        );
        // Allocating two blocks evicts the tail of the first prompt.
        c.allocate().unwrap();
        c.allocate().unwrap();
        let mut ids = Vec::new();
        assert_eq!(c.find_prefix(&[1, 2, 3], &mut ids), 1);
        assert_eq!(ids.len(), 1);
        assert_eq!(c.find_prefix(&[4, 5, 6], &mut ids), 3);
        assert_eq!(c.num_cached(), 4);
    }

    #[test]
    fn touching_a_free_cached_block_takes_it_out_of_the_free_queue() {
        let mut c = KvCache::new(3);
        let a = alloc_registered(&mut c, &[7, 8]);
        c.free_all(&a);
        assert_eq!(c.num_free(), 3);
        let mut ids = Vec::new();
        assert_eq!(c.find_prefix(&[7, 8, 9], &mut ids), 2);
        c.touch(ids[0]);
        assert_eq!(c.num_free(), 2);
        assert_eq!(c.free_queue_hashes(), vec![None, Some(8)]);
        // The revived block is shared: a second touch only bumps its count.
        c.touch(ids[0]);
        c.free_all(&ids[..1]);
        assert_eq!(c.num_free(), 2);
        c.free_all(&ids[..1]);
        assert_eq!(c.num_free(), 3);
    }

    #[test]
    fn duplicate_hash_is_registered_once() {
        let mut c = KvCache::new(2);
        c.record_events = true;
        let a = alloc_registered(&mut c, &[5]);
        let b = alloc_registered(&mut c, &[5]);
        assert_eq!(c.num_cached(), 1);
        c.free_all(&b);
        c.free_all(&a);
        c.allocate().unwrap(); // b's block: uncached, no event
        c.allocate().unwrap(); // a's block: evicts hash 5
        assert_eq!(c.events, vec![KvEvent::Stored(5), KvEvent::Removed(5)]);
        assert_eq!(c.num_cached(), 0);
        assert!(c.allocate().is_none());
    }
}
