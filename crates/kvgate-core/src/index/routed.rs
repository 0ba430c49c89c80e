//! The routed (approximate) prefix index.
//!
//! It learns from where the router *sent* requests, not from the pods: after a request with
//! blocks `b0..bn` goes to pod p, p is assumed to hold those blocks until p's strict LRU (with a
//! capacity in blocks equal to the pod's KV blocks) pushes them out. This mirrors vLLM's prefix
//! cache, which evicts free blocks in LRU order.
//!
//! # Structure
//!
//! - One slab-backed doubly linked LRU list per pod ([`PodLru`]): a `Vec` of 16-byte nodes
//!   (`hash: u64, prev: u32, next: u32`), freed slots chained in a free list. Pods are dense
//!   [`PodId`]s, so per-pod state lives in a `Vec` indexed by [`PodId::index`]; ids at or above
//!   [`MAX_PODS`] are rejected (ignored and counted in [`RoutedIndex::rejected_pod_ids`]) rather
//!   than allocating without bound.
//! - One global block → holders map (`FxHashMap<BlockHash, Holders>`, deterministic hashing).
//!   A holder is `(pod, slot in that pod's slab)`, so the global map doubles as each pod's
//!   hash → node lookup and there is no per-pod hash map at all. One or two holders are stored
//!   inline (16-byte value); three or more spill to a boxed `Vec`.
//!
//! The two are kept exactly in sync: every LRU node has a holder entry pointing at it and vice
//! versa; evicting a node removes the pod from the block's holders, and an empty entry is removed.
//!
//! # Parameters
//!
//! - Capacity per pod: [`super::DEFAULT_POD_CAPACITY_BLOCKS`] (31,250, llm-d's default) for a pod
//!   first seen via `record_routed`; `set_capacity` sets the pod's real KV block count
//!   (clamped to [`MAX_POD_CAPACITY_BLOCKS`]).
//! - [`MAX_PODS`] = 65,536: pod ids are stored as `u16` in the holders.
//!
//! # Behaviour
//!
//! - `record_routed` touches blocks from last to first, so the prompt's first blocks end up most
//!   recently used and are evicted last (vLLM frees a finished request's tail blocks first).
//!   What it costs is memory latency, the global map being far larger than the caches; so a
//!   prefix the pod holds already, lying in the prompt's order in its LRU (as recording left
//!   it), is moved to the front in one splice found by following the list, not one map probe
//!   per block; and the map entries of the blocks it evicts are removed together after its
//!   loop, where the CPU overlaps their probes. The resulting LRUs are exactly those of moving
//!   and evicting block by block (property tests against a reference model).
//! - `match_prefix` walks the prompt's blocks in order and advances pod p at step i only if p
//!   matched all of blocks `0..i`; it stops at the first step where no pod advanced. A block
//!   held by the same pods as the block before (same size and fingerprint, an XOR of a 64-bit
//!   mix of each holder's id, kept in O(1) per insert/remove) advances the same pods without
//!   walking them, so a prefix that every holder holds whole costs one walk of its holders.
//!   Cost O(prompt blocks + Σ holders over the blocks where the holder set changes) — at most
//!   O(prompt blocks × pods per block), as before. It does not touch the LRUs.
//! - **Long prompts are matched by bisection.** Block hashes are chained (a block's hash covers
//!   every block before it), and recording touches a prompt's blocks last to first, so in each
//!   pod's LRU a block's ancestors are always more recent than the block: the strict LRU evicts
//!   a chain from its tail, and every pod's set of blocks is *prefix-closed* (holding block i
//!   means holding blocks 0..i). Then "some pod holds block i" and "pod p holds block i" are
//!   monotone in i, and a prompt of more than [`BISECT_MIN_BLOCKS`] blocks is matched by an
//!   exponential then binary search for the longest held prefix, and a bisection that splits
//!   the pods holding block 0 by the block each stops at: O(log(prompt blocks)) probes per
//!   distinct matched length instead of one per block (a 6,250-block prompt: ~30 probes
//!   instead of 6,250). The answer equals the block-by-block walk's on a prefix-closed index
//!   (a property test checks it on chained prompts). Removing one block
//!   ([`RoutedIndex::remove_block`]) or recording events that need not be chains (the engine
//!   index's storage, [`RoutedIndex::allow_holes`]) can break the closure, so such an index
//!   walks every block. One case stays approximate: a gateway replica's warm-up
//!   (`kvgate-gateway::cluster`) records a peer's blocks one by one, oldest first, so a lost
//!   chunk of it can leave a block held without its ancestors; bisection may then credit a pod
//!   with a prefix whose first blocks it lacks, until the LRU churns them out — a routing
//!   estimate off, never an error.
//!
//! # Memory
//!
//! Per indexed (pod, block): one 16-byte slab node, plus one global map entry per distinct block
//! (8-byte key + 16-byte value + 1 control byte; hashbrown keeps its load between 7/16 and 7/8).
//! A slab grows by doubling but never past the pod's capacity, so a full pod's slab is exact.
//! Worst case for a block held by one pod: 16 × 2 (slab just after doubling) + 25 × 16 / 7 (map
//! just after doubling) ≈ 89 bytes. The documented bound is [`MAX_BYTES_PER_INDEXED_BLOCK`] =
//! 96 bytes of live heap (requested sizes; malloc's own per-allocation overhead not included),
//! checked by `tests/index_memory.rs` with a counting global allocator: live bytes /
//! [`PrefixIndex::indexed_blocks`] after every recorded 20-block prompt once ≥ 4,096 blocks are
//! indexed. Measured (x86-64 Linux):
//!
//! | scenario | at the end | worst step |
//! |---|---|---|
//! | 200,000 distinct blocks, 1 pod | 48.8 | 82.0 |
//! | 100,000 blocks shared by 2 pods (200,000 indexed) | 32.4 | 57.0 |
//! | 200,000 blocks through 1 pod of capacity 50,000 | 48.8 | 82.0 |
//! | 25,000 blocks shared by 4 pods (boxed holder lists) | 42.2 | 62.5 |
//!
//! While the map resizes, its old and new tables coexist for a moment (not in the figures).
//! `record_routed` keeps one buffer of the blocks a call evicted: 8 bytes per block of the
//! longest prompt recorded.
//! The index as a whole is bounded by Σ pod capacities × 96 bytes plus per-pod headers
//! (≤ [`MAX_PODS`] of them). Removing a pod or shrinking a capacity compacts the slab and
//! shrinks the map once it is under a quarter full.
//!
//! The `lru` crate (0.19) was considered and not used: it allocates each entry separately and
//! keeps its own hash map per pod, so it would cost a per-pod map entry *and* a heap node on top
//! of the global block → pods map that scoring needs.

use super::{DEFAULT_POD_CAPACITY_BLOCKS, PrefixIndex};
use crate::blocks::BlockHash;
use crate::pod::PodId;
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;

/// Pod ids at or above this are rejected (pods are stored as `u16` in the block → pods map).
pub const MAX_PODS: usize = 1 << 16;

/// Largest per-pod capacity: slab slots are `u32` and `u32::MAX` terminates the lists.
pub const MAX_POD_CAPACITY_BLOCKS: u32 = u32::MAX - 1;

/// Documented bound on live heap bytes per indexed (pod, block); see the module docs.
pub const MAX_BYTES_PER_INDEXED_BLOCK: usize = 96;

const NIL: u32 = u32::MAX;

/// How far ahead `record_routed` probes the map while it adds new blocks.
const LOOKAHEAD_BLOCKS: usize = 8;

/// Prompts longer than this many blocks are matched by bisection on a prefix-closed index (see
/// the module docs); shorter ones by the walk, which costs about as little there.
pub const BISECT_MIN_BLOCKS: usize = 256;

/// One entry of a pod's LRU list. `next` also chains the free list.
#[derive(Debug, Clone, Copy)]
struct Node {
    hash: BlockHash,
    prev: u32,
    next: u32,
}

/// A pod that holds a block, and where the block sits in that pod's slab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    pod: u16,
    slot: u32,
}

/// The pods holding one block. Most blocks are held by one or two pods, stored inline.
#[derive(Debug)]
enum Holders {
    One {
        pod: u16,
        slot: u32,
    },
    Two {
        pods: [u16; 2],
        slots: [u32; 2],
    },
    /// A thin pointer keeps Holders at 16 bytes; a Vec or Box<[_]> would make it 24-32.
    Many(Box<ManyHolders>),
}

/// Three or more holders, with their set's [`Holders::fingerprint`] kept up to date.
#[derive(Debug)]
struct ManyHolders {
    /// XOR of [`pod_mix`] over the holders.
    fingerprint: u64,
    list: Vec<Holder>,
}

/// A pod's contribution to a holder set's fingerprint (splitmix64's finalizer: distinct pods
/// give independent-looking 64-bit values, so two distinct sets of equal size share a
/// fingerprint with odds ~2^-64).
fn pod_mix(pod: u16) -> u64 {
    let mut z = u64::from(pod).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Holders {
    fn slot_of(&self, pod: u16) -> Option<u32> {
        match self {
            Holders::One { pod: p, slot } => (*p == pod).then_some(*slot),
            Holders::Two { pods, slots } => {
                if pods[0] == pod {
                    Some(slots[0])
                } else if pods[1] == pod {
                    Some(slots[1])
                } else {
                    None
                }
            }
            Holders::Many(m) => m.list.iter().find(|h| h.pod == pod).map(|h| h.slot),
        }
    }

    fn for_each_pod(&self, mut f: impl FnMut(u16)) {
        match self {
            Holders::One { pod, .. } => f(*pod),
            Holders::Two { pods, .. } => {
                f(pods[0]);
                f(pods[1]);
            }
            Holders::Many(m) => m.list.iter().for_each(|h| f(h.pod)),
        }
    }

    /// The holder set's size and fingerprint (XOR of [`pod_mix`]): O(1). Two blocks with equal
    /// `(len, fingerprint)` are held by the same pods (up to a 2^-64 collision, the odds of two
    /// blocks' 64-bit hashes colliding in the map itself).
    fn fingerprint(&self) -> (usize, u64) {
        match self {
            Holders::One { pod, .. } => (1, pod_mix(*pod)),
            Holders::Two { pods, .. } => (2, pod_mix(pods[0]) ^ pod_mix(pods[1])),
            Holders::Many(m) => (m.list.len(), m.fingerprint),
        }
    }

    /// Adds a pod known not to be a holder yet.
    fn insert(&mut self, pod: u16, slot: u32) {
        *self = match std::mem::replace(self, Holders::One { pod: 0, slot: 0 }) {
            Holders::One { pod: p, slot: s } => Holders::Two {
                pods: [p, pod],
                slots: [s, slot],
            },
            Holders::Two { pods, slots } => Holders::Many(Box::new(ManyHolders {
                fingerprint: pod_mix(pods[0]) ^ pod_mix(pods[1]) ^ pod_mix(pod),
                list: vec![
                    Holder {
                        pod: pods[0],
                        slot: slots[0],
                    },
                    Holder {
                        pod: pods[1],
                        slot: slots[1],
                    },
                    Holder { pod, slot },
                ],
            })),
            Holders::Many(mut m) => {
                m.list.push(Holder { pod, slot });
                m.fingerprint ^= pod_mix(pod);
                Holders::Many(m)
            }
        };
    }

    fn set_slot(&mut self, pod: u16, slot: u32) {
        match self {
            Holders::One { pod: p, slot: s } => {
                if *p == pod {
                    *s = slot;
                }
            }
            Holders::Two { pods, slots } => {
                for (p, s) in pods.iter().zip(slots.iter_mut()) {
                    if *p == pod {
                        *s = slot;
                    }
                }
            }
            Holders::Many(m) => {
                for h in m.list.iter_mut().filter(|h| h.pod == pod) {
                    h.slot = slot;
                }
            }
        }
    }

    /// Removes a pod; returns true when no holder is left.
    fn remove(&mut self, pod: u16) -> bool {
        match self {
            Holders::One { pod: p, .. } => *p == pod,
            Holders::Two { pods, slots } => {
                if pods[0] == pod {
                    *self = Holders::One {
                        pod: pods[1],
                        slot: slots[1],
                    };
                } else if pods[1] == pod {
                    *self = Holders::One {
                        pod: pods[0],
                        slot: slots[0],
                    };
                }
                false
            }
            Holders::Many(m) => {
                let before = m.list.len();
                m.list.retain(|h| h.pod != pod);
                if m.list.len() < before {
                    m.fingerprint ^= pod_mix(pod);
                }
                if let [a, b] = m.list.as_slice() {
                    *self = Holders::Two {
                        pods: [a.pod, b.pod],
                        slots: [a.slot, b.slot],
                    };
                }
                false
            }
        }
    }
}

/// Removes `pod` from the holders of `hash`, dropping the entry when it becomes empty. One probe
/// of the map (an evicted block's entry is cold: a second lookup to remove it cost a cache miss
/// of its own in the simulator's profile).
fn drop_holder(holders: &mut FxHashMap<BlockHash, Holders>, hash: BlockHash, pod: u16) {
    if let Entry::Occupied(mut e) = holders.entry(hash)
        && e.get_mut().remove(pod)
    {
        e.remove();
    }
}

/// One pod's strict LRU over a slab. `head` is the most recently used block, `tail` the least.
#[derive(Debug)]
struct PodLru {
    nodes: Vec<Node>,
    head: u32,
    tail: u32,
    free: u32,
    len: u32,
    capacity: u32,
}

impl PodLru {
    fn new(capacity: u32) -> Self {
        PodLru {
            nodes: Vec::new(),
            head: NIL,
            tail: NIL,
            free: NIL,
            len: 0,
            capacity: capacity.min(MAX_POD_CAPACITY_BLOCKS),
        }
    }

    fn unlink(&mut self, slot: u32) {
        let Node { prev, next, .. } = self.nodes[slot as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    fn link_front(&mut self, slot: u32) {
        let old_head = self.head;
        let node = &mut self.nodes[slot as usize];
        node.prev = NIL;
        node.next = old_head;
        if old_head == NIL {
            self.tail = slot;
        } else {
            self.nodes[old_head as usize].prev = slot;
        }
        self.head = slot;
    }

    /// The nodes just before `last` (towards the head) whose hashes are the end of `before`,
    /// in order: returns the first of them (`last` itself if none) and how many there are.
    /// Each hash is in one node at most, so the walk can only follow the prompt's own blocks.
    fn run_ending_at(&self, last: u32, before: &[BlockHash]) -> (u32, usize) {
        let mut first = last;
        let mut run = 0;
        for &hash in before.iter().rev() {
            let prev = self.nodes[first as usize].prev;
            if prev == NIL || self.nodes[prev as usize].hash != hash {
                break;
            }
            first = prev;
            run += 1;
        }
        (first, run)
    }

    /// Moves the linked run `first..=last` (in list order) to the front, keeping its order:
    /// the same list as moving `last`, then each node before it down to `first`, to the front.
    fn move_run_to_front(&mut self, first: u32, last: u32) {
        if self.head == first {
            return;
        }
        let before = self.nodes[first as usize].prev;
        let after = self.nodes[last as usize].next;
        // `first` is not the head, so `before` is a node.
        self.nodes[before as usize].next = after;
        if after == NIL {
            self.tail = before;
        } else {
            self.nodes[after as usize].prev = before;
        }
        let old_head = self.head;
        self.nodes[last as usize].next = old_head;
        self.nodes[old_head as usize].prev = last;
        self.nodes[first as usize].prev = NIL;
        self.head = first;
    }

    /// Inserts a block as most recently used (the caller made room) and returns its slot.
    fn push_front(&mut self, hash: BlockHash) -> u32 {
        let node = Node {
            hash,
            prev: NIL,
            next: NIL,
        };
        let slot = if self.free != NIL {
            let slot = self.free;
            self.free = self.nodes[slot as usize].next;
            self.nodes[slot as usize] = node;
            slot
        } else {
            if self.nodes.len() == self.nodes.capacity() {
                // Double, but never past the capacity: a full pod's slab is exactly its size.
                let len = self.nodes.len();
                let room = (self.capacity as usize).saturating_sub(len).max(1);
                self.nodes.reserve_exact(len.max(16).min(room));
            }
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        };
        self.link_front(slot);
        self.len += 1;
        slot
    }

    /// Removes the least recently used block and returns its hash.
    fn pop_back(&mut self) -> Option<BlockHash> {
        let slot = self.tail;
        if slot == NIL {
            return None;
        }
        self.unlink(slot);
        let node = &mut self.nodes[slot as usize];
        let hash = node.hash;
        node.next = self.free;
        self.free = slot;
        self.len -= 1;
        Some(hash)
    }

    /// Slots from most to least recently used.
    fn iter_slots(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors((self.head != NIL).then_some(self.head), |&s| {
            let next = self.nodes[s as usize].next;
            (next != NIL).then_some(next)
        })
    }

    /// Rebuilds the slab without holes (after a shrink), fixing the slots in `holders`.
    fn compact(&mut self, pod: u16, holders: &mut FxHashMap<BlockHash, Holders>) {
        let mut nodes = Vec::with_capacity(self.len as usize);
        for (new_slot, old_slot) in self.iter_slots().enumerate() {
            let hash = self.nodes[old_slot as usize].hash;
            let new_slot = new_slot as u32;
            nodes.push(Node {
                hash,
                prev: new_slot.checked_sub(1).unwrap_or(NIL),
                next: new_slot + 1,
            });
            if let Some(h) = holders.get_mut(&hash) {
                h.set_slot(pod, new_slot);
            }
        }
        if let Some(last) = nodes.last_mut() {
            last.next = NIL;
        }
        self.head = if nodes.is_empty() { NIL } else { 0 };
        self.tail = (nodes.len() as u32).checked_sub(1).unwrap_or(NIL);
        self.free = NIL;
        self.nodes = nodes;
    }
}

/// The routed prefix index; see the module docs.
#[derive(Debug, Default)]
pub struct RoutedIndex {
    /// Per-pod LRUs, indexed by [`PodId::index`]; `None` for ids never seen or removed.
    pods: Vec<Option<PodLru>>,
    /// Block → pods holding it, with each pod's slab slot.
    holders: FxHashMap<BlockHash, Holders>,
    /// Σ per-pod LRU lengths.
    indexed_blocks: usize,
    /// Calls ignored because the pod id was ≥ [`MAX_PODS`].
    rejected_pod_ids: u64,
    /// The pods' block sets may not be prefix-closed (a block was removed alone, or the owner
    /// records blocks that need not be chains): match by walking every block.
    holes_possible: bool,
    /// `record_routed`'s evicted blocks, whose holder entries it removes at its end (kept to
    /// reuse the buffer; as long as the longest prompt recorded).
    evicted: Vec<BlockHash>,
}

impl RoutedIndex {
    pub fn new() -> Self {
        RoutedIndex::default()
    }

    /// Declares that this index may be given blocks that are not whole chains from their first
    /// block (the engine index's events), so `match_prefix` never bisects. Cannot be undone.
    pub fn allow_holes(&mut self) {
        self.holes_possible = true;
    }

    /// Calls to `record_routed` / `set_capacity` ignored because the pod id was ≥ [`MAX_PODS`].
    pub fn rejected_pod_ids(&self) -> u64 {
        self.rejected_pod_ids
    }

    /// Distinct blocks held by at least one pod.
    pub fn distinct_blocks(&self) -> usize {
        self.holders.len()
    }

    /// Blocks the index believes `pod` holds.
    /// Pod ids covered by `match_prefix` answers (one past the highest id seen).
    pub fn pod_slots(&self) -> usize {
        self.pods.len()
    }

    /// True when the pod has a capacity or blocks here (not removed).
    pub fn knows_pod(&self, pod: PodId) -> bool {
        self.lru(pod).is_some()
    }

    /// Whether `pod` holds `hash`. O(1) (holders per block are few).
    pub fn holds(&self, pod: PodId, hash: BlockHash) -> bool {
        u16::try_from(pod.0).is_ok_and(|p| {
            self.holders
                .get(&hash)
                .is_some_and(|h| h.slot_of(p).is_some())
        })
    }

    pub fn pod_blocks(&self, pod: PodId) -> usize {
        self.lru(pod).map_or(0, |l| l.len as usize)
    }

    /// The pod's newest `max` blocks, least recently used first: recording them one by one in
    /// this order ([`PrefixIndex::record_routed`] per block) rebuilds the same LRU order
    /// elsewhere (a joining gateway replica's warm-up, `kvgate-gateway::cluster`).
    pub fn pod_blocks_oldest_first(&self, pod: PodId, max: usize) -> Vec<BlockHash> {
        let Some(lru) = self.lru(pod) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(max.min(lru.len as usize));
        let mut slot = lru.head;
        while slot != NIL && out.len() < max {
            let node = &lru.nodes[slot as usize];
            out.push(node.hash);
            slot = node.next;
        }
        out.reverse();
        out
    }

    /// The pod's capacity in blocks, or `None` if the pod is unknown.
    pub fn capacity_blocks(&self, pod: PodId) -> Option<u32> {
        self.lru(pod).map(|l| l.capacity)
    }

    fn lru(&self, pod: PodId) -> Option<&PodLru> {
        self.pods.get(pod.index()).and_then(Option::as_ref)
    }

    /// Creates the pod's LRU with `capacity` if unseen and returns the id as stored in the
    /// holders; `None` (and counted) if the id is ≥ [`MAX_PODS`].
    fn ensure_pod(&mut self, pod: PodId, capacity: u32) -> Option<u16> {
        let Ok(pod16) = u16::try_from(pod.0) else {
            self.rejected_pod_ids += 1;
            return None;
        };
        let i = pod.index();
        if self.pods.len() <= i {
            self.pods.resize_with(i + 1, || None);
        }
        if let Some(entry) = self.pods.get_mut(i) {
            entry.get_or_insert_with(|| PodLru::new(capacity));
        }
        Some(pod16)
    }

    /// Forgets that `pod` holds the block `hash` (the engine index's `BlockRemoved`); true when
    /// the pod held it. O(1).
    pub fn remove_block(&mut self, pod: PodId, hash: BlockHash) -> bool {
        let Ok(pod16) = u16::try_from(pod.0) else {
            return false;
        };
        let Some(slot) = self.holders.get(&hash).and_then(|h| h.slot_of(pod16)) else {
            return false;
        };
        let Some(Some(lru)) = self.pods.get_mut(pod.index()) else {
            return false;
        };
        self.holes_possible = true;
        lru.unlink(slot);
        if let Some(node) = lru.nodes.get_mut(slot as usize) {
            node.next = lru.free;
        }
        lru.free = slot;
        lru.len -= 1;
        self.indexed_blocks -= 1;
        drop_holder(&mut self.holders, hash, pod16);
        true
    }

    /// Frees hash-map memory after large removals (never on the recording path).
    fn maybe_shrink_map(&mut self) {
        if self.holders.capacity() > 4 * self.holders.len().max(1024) {
            self.holders.shrink_to_fit();
        }
    }

    /// Blocks of `pod` from most to least recently used (tests only).
    #[cfg(test)]
    fn blocks_mru_first(&self, pod: PodId) -> Vec<BlockHash> {
        self.lru(pod).map_or_else(Vec::new, |l| {
            l.iter_slots().map(|s| l.nodes[s as usize].hash).collect()
        })
    }
}

impl RoutedIndex {
    /// The longest prefix each pod holds, found by bisection: exact when every pod's block set
    /// is prefix-closed (module docs). `matched` has one entry per pod slot.
    fn match_by_bisection(&self, blocks: &[BlockHash], matched: &mut Vec<u32>) {
        matched.clear();
        matched.resize(self.pods.len(), 0);
        let blocks = &blocks[..blocks.len().min(u32::MAX as usize)];
        let held = |i: usize| blocks.get(i).and_then(|h| self.holders.get(h));
        let Some(first) = held(0) else {
            return;
        };
        // The longest prefix any pod holds: `held(i)` is true up to it, false after.
        let (mut lo, mut hi) = (0usize, blocks.len());
        let mut step = 1usize;
        while lo + step < hi {
            if held(lo + step).is_some() {
                lo += step;
                step *= 2;
            } else {
                hi = lo + step;
            }
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if held(mid).is_some() {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let longest = (lo + 1) as u32;
        let mut pods: Vec<u16> = Vec::new();
        first.for_each_pod(|p| pods.push(p));
        if held(lo).is_some_and(|h| h.fingerprint() == first.fingerprint()) {
            for &pod in &pods {
                if let Some(m) = matched.get_mut(pod as usize) {
                    *m = longest;
                }
            }
            return;
        }
        // Each range `pods[start..end]` holds pods whose matched length is in `[a, b]`; probing
        // block `mid - 1` splits it into those holding it (`[mid, b]`) and the rest. `matched`
        // stays 0 until the end (it marks a probe's holders meanwhile); `lengths` follows `pods`.
        const MARK: u32 = u32::MAX;
        let mut lengths = vec![0u32; pods.len()];
        let mut ranges = vec![(1u32, longest, 0usize, pods.len())];
        while let Some((a, b, start, end)) = ranges.pop() {
            if a == b {
                lengths[start..end].fill(a);
                continue;
            }
            let mid = a + (b - a).div_ceil(2);
            let Some(holders) = held(mid as usize - 1) else {
                ranges.push((a, mid - 1, start, end));
                continue;
            };
            holders.for_each_pod(|p| {
                if let Some(m) = matched.get_mut(p as usize) {
                    *m = MARK;
                }
            });
            // Holders of the probe to the front of the range.
            let mut split = start;
            for i in start..end {
                if matched.get(pods[i] as usize) == Some(&MARK) {
                    pods.swap(i, split);
                    split += 1;
                }
            }
            holders.for_each_pod(|p| {
                if let Some(m) = matched.get_mut(p as usize) {
                    *m = 0;
                }
            });
            if split > start {
                ranges.push((mid, b, start, split));
            }
            if split < end {
                ranges.push((a, mid - 1, split, end));
            }
        }
        for (&pod, &len) in pods.iter().zip(&lengths) {
            if let Some(m) = matched.get_mut(pod as usize) {
                *m = len;
            }
        }
    }

    /// The longest prefix each pod holds, block by block (any index).
    fn match_by_walking(&self, blocks: &[BlockHash], matched: &mut Vec<u32>) {
        matched.clear();
        matched.resize(self.pods.len(), 0);
        // The pods that matched every block so far (those with `matched == i` at step i), and
        // the blocks since the last step that walked the holders: blocks held by the same set
        // as the one before (equal fingerprint) advance exactly these pods, so a run of such
        // blocks (a prefix every holder holds whole) is credited at once when it ends.
        let mut advancing: Vec<u16> = Vec::new();
        let mut last_set: Option<(usize, u64)> = None;
        let mut pending = 0u32;
        let credit = |advancing: &[u16], pending: u32, matched: &mut Vec<u32>| {
            for &pod in advancing {
                if let Some(m) = matched.get_mut(pod as usize) {
                    *m += pending;
                }
            }
        };
        for (i, hash) in blocks.iter().enumerate() {
            let (Ok(i), Some(holders)) = (u32::try_from(i), self.holders.get(hash)) else {
                break;
            };
            let Some(next) = i.checked_add(1) else { break };
            let set = holders.fingerprint();
            if last_set == Some(set) {
                pending += 1;
                continue;
            }
            credit(&advancing, pending, matched);
            pending = 0;
            advancing.clear();
            holders.for_each_pod(|pod| {
                if let Some(m) = matched.get_mut(pod as usize)
                    && *m == i
                {
                    *m = next;
                    advancing.push(pod);
                }
            });
            if advancing.is_empty() {
                break;
            }
            last_set = Some(set);
        }
        credit(&advancing, pending, matched);
    }
}

impl PrefixIndex for RoutedIndex {
    fn match_prefix(&self, blocks: &[BlockHash], matched: &mut Vec<u32>) {
        if !self.holes_possible && blocks.len() > BISECT_MIN_BLOCKS {
            self.match_by_bisection(blocks, matched);
        } else {
            self.match_by_walking(blocks, matched);
        }
    }

    fn record_routed(&mut self, pod: PodId, blocks: &[BlockHash]) {
        let Some(pod16) = self.ensure_pod(pod, DEFAULT_POD_CAPACITY_BLOCKS) else {
            return;
        };
        let Some(Some(lru)) = self.pods.get_mut(pod.index()) else {
            return;
        };
        let holders = &mut self.holders;
        // An evicted block's holder entry is removed after the loop, all of them in a row: each
        // removal is a probe of a map much larger than the caches, and independent probes in a
        // tight loop wait for memory together rather than one after another. Until then the
        // entry is stale: its slot was reused at once by the block pushed in its place, so a
        // stale entry is one whose node holds another hash.
        let mut evicted = std::mem::take(&mut self.evicted);
        evicted.clear();
        let mut rest = blocks.len();
        while let Some(i) = rest.checked_sub(1) {
            let hash = blocks[i];
            rest = i;
            if let Some(slot) = holders.get(&hash).and_then(|h| h.slot_of(pod16)) {
                if lru.nodes[slot as usize].hash == hash {
                    // The prompt's blocks just before this one, already in the prompt's order
                    // just before it in the LRU (a prefix recorded here before), go to the front
                    // with it in one splice: the order moving each of them in turn would give,
                    // without a map probe per block.
                    let (first, run) = lru.run_ending_at(slot, &blocks[..i]);
                    lru.move_run_to_front(first, slot);
                    rest -= run;
                    continue;
                }
                // Evicted earlier in this call: not held.
                drop_holder(holders, hash, pod16);
            }
            if lru.capacity == 0 {
                continue;
            }
            // A new block: the blocks before it in a prompt's own tail are likely new too. Probe
            // one a few steps ahead now, so that its probe's wait overlaps this block's work.
            if let Some(ahead) = i.checked_sub(LOOKAHEAD_BLOCKS).and_then(|j| blocks.get(j)) {
                std::hint::black_box(holders.contains_key(ahead));
            }
            if lru.len >= lru.capacity
                && let Some(old) = lru.pop_back()
            {
                evicted.push(old);
                self.indexed_blocks -= 1;
            }
            let slot = lru.push_front(hash);
            holders
                .entry(hash)
                .and_modify(|h| h.insert(pod16, slot))
                .or_insert(Holders::One { pod: pod16, slot });
            self.indexed_blocks += 1;
        }
        // Probes only first, which the CPU runs many at a time; the removals then find their
        // entries in the cache.
        std::hint::black_box(evicted.iter().filter(|&h| holders.contains_key(h)).count());
        for &hash in &evicted {
            // Unless it went (stale, above) or was pushed again since, with an entry of its own.
            let stale = holders
                .get(&hash)
                .and_then(|h| h.slot_of(pod16))
                .is_some_and(|slot| lru.nodes[slot as usize].hash != hash);
            if stale {
                drop_holder(holders, hash, pod16);
            }
        }
        self.evicted = evicted;
    }

    fn set_capacity(&mut self, pod: PodId, capacity_blocks: u32) {
        let capacity = capacity_blocks.min(MAX_POD_CAPACITY_BLOCKS);
        let Some(pod16) = self.ensure_pod(pod, capacity) else {
            return;
        };
        let Some(Some(lru)) = self.pods.get_mut(pod.index()) else {
            return;
        };
        let shrunk = capacity < lru.capacity;
        lru.capacity = capacity;
        let mut evicted_any = false;
        while lru.len > capacity {
            let Some(hash) = lru.pop_back() else { break };
            drop_holder(&mut self.holders, hash, pod16);
            self.indexed_blocks -= 1;
            evicted_any = true;
        }
        if shrunk && lru.nodes.capacity() > capacity as usize {
            lru.compact(pod16, &mut self.holders);
        }
        if evicted_any {
            self.maybe_shrink_map();
        }
    }

    fn remove_pod(&mut self, pod: PodId) {
        let Ok(pod16) = u16::try_from(pod.0) else {
            return;
        };
        let Some(lru) = self.pods.get_mut(pod.index()).and_then(Option::take) else {
            return;
        };
        for slot in lru.iter_slots() {
            drop_holder(&mut self.holders, lru.nodes[slot as usize].hash, pod16);
        }
        self.indexed_blocks -= lru.len as usize;
        while matches!(self.pods.last(), Some(None)) {
            self.pods.pop();
        }
        self.maybe_shrink_map();
    }

    fn indexed_blocks(&self) -> usize {
        self.indexed_blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet, VecDeque};

    fn matched(index: &RoutedIndex, blocks: &[BlockHash]) -> Vec<u32> {
        let mut m = vec![99; 7];
        index.match_prefix(blocks, &mut m);
        m
    }

    /// Checks every internal invariant: list links, free list, slots, holders ↔ LRUs, counts.
    fn check_invariants(index: &RoutedIndex) {
        let mut derived: BTreeMap<BlockHash, BTreeSet<u16>> = BTreeMap::new();
        let mut total = 0;
        for (p, lru) in index.pods.iter().enumerate() {
            let Some(lru) = lru else { continue };
            let pod = p as u16;
            assert!(lru.len <= lru.capacity, "pod {p} over capacity");
            let slots: Vec<u32> = lru.iter_slots().collect();
            assert_eq!(slots.len(), lru.len as usize, "pod {p} list length");
            let mut prev = NIL;
            for &s in &slots {
                assert_eq!(lru.nodes[s as usize].prev, prev, "pod {p} prev link");
                prev = s;
            }
            assert_eq!(lru.tail, prev, "pod {p} tail");
            let mut free = 0;
            let mut f = lru.free;
            while f != NIL {
                free += 1;
                f = lru.nodes[f as usize].next;
            }
            assert_eq!(free + slots.len(), lru.nodes.len(), "pod {p} free list");
            for &s in &slots {
                let hash = lru.nodes[s as usize].hash;
                assert!(derived.entry(hash).or_default().insert(pod), "duplicate");
                let slot = index.holders.get(&hash).and_then(|h| h.slot_of(pod));
                assert_eq!(slot, Some(s), "pod {p} block {hash} slot");
            }
            total += slots.len();
        }
        assert_eq!(index.indexed_blocks, total);
        let mut actual: BTreeMap<BlockHash, BTreeSet<u16>> = BTreeMap::new();
        for (&hash, h) in &index.holders {
            if let Holders::Many(m) = h {
                assert!(m.list.len() >= 3, "Many with {} holders", m.list.len());
                let fingerprint = m.list.iter().fold(0, |x, h| x ^ pod_mix(h.pod));
                assert_eq!(m.fingerprint, fingerprint, "block {hash} fingerprint");
            }
            let mut n = 0;
            h.for_each_pod(|p| {
                n += 1;
                actual.entry(hash).or_default().insert(p);
            });
            assert_eq!(
                actual.get(&hash).map_or(0, BTreeSet::len),
                n,
                "duplicate holder"
            );
        }
        assert_eq!(
            actual, derived,
            "block → pods map out of sync with the LRUs"
        );
    }

    #[test]
    fn remove_block_forgets_one_pods_copy_and_reuses_the_slot() {
        let mut index = RoutedIndex::new();
        index.record_routed(PodId(0), &[1, 2, 3]);
        index.record_routed(PodId(1), &[1, 2]);
        assert!(index.remove_block(PodId(0), 2));
        assert!(!index.remove_block(PodId(0), 2));
        assert!(!index.remove_block(PodId(7), 1));
        assert_eq!(matched(&index, &[1, 2, 3]), vec![1, 2]);
        assert_eq!(index.indexed_blocks(), 4);
        check_invariants(&index);
        index.record_routed(PodId(0), &[9]);
        assert_eq!(index.blocks_mru_first(PodId(0)), vec![9, 1, 3]);
        check_invariants(&index);
    }

    #[test]
    fn node_and_holders_are_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Node>(), 16);
        assert_eq!(std::mem::size_of::<Holders>(), 16);
    }

    #[test]
    fn pod_holding_a_later_block_but_not_the_first_scores_zero() {
        let mut index = RoutedIndex::new();
        index.record_routed(PodId(0), &[10, 11, 12]);
        index.record_routed(PodId(1), &[11, 12]);
        assert_eq!(matched(&index, &[10, 11, 12]), vec![3, 0]);
        check_invariants(&index);
    }

    #[test]
    fn match_stops_at_the_first_block_a_pod_lacks() {
        let mut index = RoutedIndex::new();
        index.record_routed(PodId(0), &[1, 2, 3]);
        assert_eq!(matched(&index, &[1, 2, 9, 3]), vec![2]);
        assert_eq!(matched(&index, &[1, 2, 3, 4]), vec![3]);
    }

    #[test]
    fn empty_prompt_matches_nothing_but_covers_every_known_pod() {
        let mut index = RoutedIndex::new();
        assert_eq!(matched(&index, &[]), Vec::<u32>::new());
        assert_eq!(matched(&index, &[1]), Vec::<u32>::new());
        index.record_routed(PodId(2), &[1]);
        assert_eq!(matched(&index, &[]), vec![0, 0, 0]);
        index.record_routed(PodId(0), &[]);
        assert_eq!(index.indexed_blocks(), 1);
        assert_eq!(
            index.capacity_blocks(PodId(0)),
            Some(DEFAULT_POD_CAPACITY_BLOCKS)
        );
    }

    #[test]
    fn lru_evicts_a_prompts_tail_blocks_first() {
        let mut index = RoutedIndex::new();
        index.set_capacity(PodId(0), 4);
        index.record_routed(PodId(0), &[1, 2, 3, 4]);
        assert_eq!(index.blocks_mru_first(PodId(0)), vec![1, 2, 3, 4]);
        index.record_routed(PodId(0), &[5, 6]);
        assert_eq!(index.blocks_mru_first(PodId(0)), vec![5, 6, 1, 2]);
        assert_eq!(matched(&index, &[1, 2, 3, 4]), vec![2]);
        assert_eq!(index.indexed_blocks(), 4);
        check_invariants(&index);
    }

    #[test]
    fn blocks_exported_oldest_first_rebuild_the_same_lru_order() {
        let mut a = RoutedIndex::new();
        a.set_capacity(PodId(0), 4);
        a.record_routed(PodId(0), &[1, 2]);
        a.record_routed(PodId(0), &[3]);
        a.record_routed(PodId(0), &[1]);
        // Most recent first: 1, 3, 2 (recording touches last to first).
        let out = a.pod_blocks_oldest_first(PodId(0), 10);
        assert_eq!(out, vec![2, 3, 1]);
        assert_eq!(a.pod_blocks_oldest_first(PodId(0), 2), vec![3, 1]);
        assert!(a.pod_blocks_oldest_first(PodId(7), 10).is_empty());
        let mut b = RoutedIndex::new();
        b.set_capacity(PodId(0), 4);
        for h in &out {
            b.record_routed(PodId(0), &[*h]);
        }
        assert_eq!(b.pod_blocks_oldest_first(PodId(0), 10), out);
    }

    #[test]
    fn recording_again_refreshes_a_prompt_so_other_blocks_are_evicted() {
        let mut index = RoutedIndex::new();
        index.set_capacity(PodId(0), 4);
        index.record_routed(PodId(0), &[1, 2]);
        index.record_routed(PodId(0), &[3, 4]);
        index.record_routed(PodId(0), &[1, 2]);
        index.record_routed(PodId(0), &[5, 6]);
        assert_eq!(index.blocks_mru_first(PodId(0)), vec![5, 6, 1, 2]);
        check_invariants(&index);
    }

    #[test]
    fn prompt_longer_than_capacity_keeps_its_first_blocks() {
        let mut index = RoutedIndex::new();
        let blocks: Vec<BlockHash> = (0..DEFAULT_POD_CAPACITY_BLOCKS as u64 + 10).collect();
        index.record_routed(PodId(0), &blocks);
        assert_eq!(index.indexed_blocks(), DEFAULT_POD_CAPACITY_BLOCKS as usize);
        assert_eq!(matched(&index, &blocks), vec![DEFAULT_POD_CAPACITY_BLOCKS]);
        check_invariants(&index);
    }

    #[test]
    fn a_block_evicted_and_recorded_again_in_one_call_is_held_once() {
        // Capacity 1, blocks touched x, y, x: y evicts x, then x evicts y. The removals of
        // evicted entries wait for the end of the call; x's must not remove x's new entry.
        let mut index = RoutedIndex::new();
        index.set_capacity(PodId(0), 1);
        index.record_routed(PodId(0), &[7, 8, 7]);
        check_invariants(&index);
        assert_eq!(index.blocks_mru_first(PodId(0)), vec![7]);
        assert_eq!(index.indexed_blocks(), 1);
        assert_eq!(matched(&index, &[7]), vec![1]);
        assert_eq!(matched(&index, &[8]), vec![0]);
    }

    #[test]
    fn capacity_shrink_evicts_least_recently_used_blocks() {
        let mut index = RoutedIndex::new();
        index.record_routed(PodId(0), &[1, 2, 3, 4, 5, 6]);
        index.set_capacity(PodId(0), 2);
        assert_eq!(index.blocks_mru_first(PodId(0)), vec![1, 2]);
        assert_eq!(index.indexed_blocks(), 2);
        assert_eq!(index.distinct_blocks(), 2);
        assert_eq!(matched(&index, &[1, 2, 3]), vec![2]);
        check_invariants(&index);
        // The compacted slab keeps working.
        index.record_routed(PodId(0), &[7]);
        assert_eq!(index.blocks_mru_first(PodId(0)), vec![7, 1]);
        check_invariants(&index);
    }

    #[test]
    fn zero_capacity_pod_holds_nothing() {
        let mut index = RoutedIndex::new();
        index.set_capacity(PodId(1), 0);
        index.record_routed(PodId(1), &[1, 2]);
        assert_eq!(index.indexed_blocks(), 0);
        assert_eq!(matched(&index, &[1, 2]), vec![0, 0]);
        check_invariants(&index);
    }

    #[test]
    fn two_pods_sharing_blocks_match_independently() {
        let mut index = RoutedIndex::new();
        index.set_capacity(PodId(0), 3);
        index.record_routed(PodId(0), &[1, 2, 3]);
        index.record_routed(PodId(1), &[1, 2]);
        assert_eq!(matched(&index, &[1, 2, 3]), vec![3, 2]);
        assert_eq!(index.indexed_blocks(), 5);
        assert_eq!(index.distinct_blocks(), 3);
        // Pod 0 evicting shared blocks leaves pod 1's copies.
        index.record_routed(PodId(0), &[7, 8, 9]);
        assert_eq!(matched(&index, &[1, 2, 3]), vec![0, 2]);
        assert_eq!(index.distinct_blocks(), 5);
        check_invariants(&index);
    }

    #[test]
    fn remove_pod_clears_its_map_entries() {
        let mut index = RoutedIndex::new();
        index.record_routed(PodId(0), &[1, 2]);
        index.record_routed(PodId(1), &[1, 3]);
        index.remove_pod(PodId(1));
        assert_eq!(index.indexed_blocks(), 2);
        assert_eq!(index.distinct_blocks(), 2);
        assert_eq!(matched(&index, &[1, 3]), vec![1]);
        assert_eq!(index.capacity_blocks(PodId(1)), None);
        index.remove_pod(PodId(0));
        assert_eq!(index.indexed_blocks(), 0);
        assert_eq!(index.distinct_blocks(), 0);
        assert_eq!(matched(&index, &[1]), Vec::<u32>::new());
        index.remove_pod(PodId(0));
        index.remove_pod(PodId(u32::MAX));
        check_invariants(&index);
    }

    #[test]
    fn many_pods_sharing_a_block_all_match() {
        let mut index = RoutedIndex::new();
        for p in 0..5 {
            index.record_routed(PodId(p), &[1, 2 + p as u64]);
        }
        assert_eq!(matched(&index, &[1, 2]), vec![2, 1, 1, 1, 1]);
        index.remove_pod(PodId(0));
        index.remove_pod(PodId(2));
        index.remove_pod(PodId(4));
        assert_eq!(matched(&index, &[1, 3]), vec![0, 2, 0, 1]);
        check_invariants(&index);
    }

    #[test]
    fn pod_ids_at_or_above_max_pods_are_rejected() {
        let mut index = RoutedIndex::new();
        index.record_routed(PodId(MAX_PODS as u32), &[1]);
        index.set_capacity(PodId(u32::MAX), 5);
        assert_eq!(index.rejected_pod_ids(), 2);
        assert_eq!(index.indexed_blocks(), 0);
        assert_eq!(matched(&index, &[1]), Vec::<u32>::new());
        index.record_routed(PodId(MAX_PODS as u32 - 1), &[1]);
        assert_eq!(index.pod_blocks(PodId(MAX_PODS as u32 - 1)), 1);
        check_invariants(&index);
    }

    #[test]
    fn a_run_of_blocks_held_by_the_same_pods_is_credited_to_each_of_them_and_a_hole_stops_one() {
        let mut index = RoutedIndex::new();
        let chain: Vec<BlockHash> = (1..=10).collect();
        for p in [0, 2, 3] {
            index.record_routed(PodId(p), &chain);
        }
        // Pod 1 holds all but block 5: same holder sets as the others except at block 5.
        index.record_routed(PodId(1), &chain[..4]);
        index.record_routed(PodId(1), &chain[5..]);
        assert_eq!(matched(&index, &chain), vec![10, 4, 10, 10]);
        // Pod 3 loses block 8 (a change of set mid-run), pod 2 holds a longer chain.
        index.remove_block(PodId(3), 8);
        index.record_routed(PodId(2), &[11, 12]);
        let longer: Vec<BlockHash> = (1..=12).collect();
        assert_eq!(matched(&index, &longer), vec![10, 4, 12, 7]);
        check_invariants(&index);
    }

    /// A chained prompt of `len` blocks: its first `shared` blocks are conversation 0's (hash
    /// `i`), the rest its own (`(tag << 32) | i`), as chained hashes of a forked prompt are.
    fn chain(tag: u64, shared: usize, len: usize) -> Vec<BlockHash> {
        (0..len as u64)
            .map(|i| {
                if (i as usize) < shared {
                    i
                } else {
                    (tag << 32) | i
                }
            })
            .collect()
    }

    #[test]
    fn long_prompts_are_bisected_to_each_pods_own_prefix() {
        let mut index = RoutedIndex::new();
        let long = chain(0, 0, 300);
        assert!(long.len() > BISECT_MIN_BLOCKS);
        for (pod, len) in [(0, 100), (1, 70), (2, 70), (3, 300), (4, 1)] {
            index.record_routed(PodId(pod), &long[..len]);
        }
        // Pod 5 holds another conversation with 40 blocks in common, pod 6 nothing of it.
        index.record_routed(PodId(5), &chain(2, 40, 120));
        index.record_routed(PodId(6), &chain(3, 0, 90));
        let mut m = Vec::new();
        index.match_prefix(&long, &mut m);
        assert_eq!(m, vec![100, 70, 70, 300, 1, 40, 0]);
        index.match_by_walking(&long, &mut m);
        assert_eq!(m, vec![100, 70, 70, 300, 1, 40, 0]);
        // A shorter prompt; then pods 3 and 4 hold all of it: one group, credited at once.
        index.match_prefix(&long[..270], &mut m);
        assert_eq!(m, vec![100, 70, 70, 270, 1, 40, 0]);
        index.record_routed(PodId(4), &long[..280]);
        index.match_prefix(&long[..260], &mut m);
        assert_eq!(m, vec![100, 70, 70, 260, 260, 40, 0]);
        index.match_prefix(&chain(9, 0, 100), &mut m);
        assert_eq!(m, vec![0; 7]);
    }

    #[test]
    fn a_block_removed_alone_makes_long_prompts_walk() {
        let mut index = RoutedIndex::new();
        let long = chain(1, 0, 300);
        assert!(long.len() > BISECT_MIN_BLOCKS);
        index.record_routed(PodId(0), &long);
        index.remove_block(PodId(0), long[50]);
        // Bisection would see blocks 0 and 299 held and credit 300.
        let mut m = Vec::new();
        index.match_prefix(&long, &mut m);
        assert_eq!(m, vec![50]);
        let mut engine_storage = RoutedIndex::new();
        engine_storage.allow_holes();
        engine_storage.record_routed(PodId(0), &long[..10]);
        engine_storage.record_routed(PodId(0), &long[11..]);
        engine_storage.match_prefix(&long, &mut m);
        assert_eq!(m, vec![10]);
    }

    #[derive(Debug, Clone)]
    enum ChainOp {
        /// Pod, conversation, blocks of it.
        Record(u32, usize, usize),
        SetCapacity(u32, u32),
        Remove(u32),
        Match(usize, usize),
    }

    fn chain_op() -> impl Strategy<Value = ChainOp> {
        prop_oneof![
            6 => (0u32..6, 0usize..4, 0usize..160).prop_map(|(p, c, n)| ChainOp::Record(p, c, n)),
            2 => (0u32..6, 0u32..240).prop_map(|(p, c)| ChainOp::SetCapacity(p, c)),
            1 => (0u32..6).prop_map(ChainOp::Remove),
            3 => (0usize..4, 0usize..160).prop_map(|(c, n)| ChainOp::Match(c, n)),
        ]
    }

    /// Four conversations of 160 chained blocks, conversation c > 0 forking from conversation
    /// 0's chain at block `forks[c]`.
    fn forking_conversations(forks: &[usize]) -> Vec<Vec<BlockHash>> {
        (0..4)
            .map(|c| chain(c as u64, if c == 0 { 0 } else { forks[c] }, 160))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// On chained prompts (four conversations forking from one another) bisection gives the
        /// block-by-block walk's answer after any mix of records, capacity changes and removals.
        #[test]
        fn bisection_agrees_with_the_walk_on_chained_prompts(
            forks in prop::collection::vec(0usize..160, 4),
            ops in prop::collection::vec(chain_op(), 1..60),
        ) {
            let conversations = forking_conversations(&forks);
            let mut index = RoutedIndex::new();
            let (mut bisected, mut walked) = (Vec::new(), Vec::new());
            for op in ops {
                match op {
                    ChainOp::Record(p, c, n) => index.record_routed(PodId(p), &conversations[c][..n]),
                    ChainOp::SetCapacity(p, cap) => index.set_capacity(PodId(p), cap),
                    ChainOp::Remove(p) => index.remove_pod(PodId(p)),
                    ChainOp::Match(c, n) => {
                        let prompt = &conversations[c][..n];
                        if prompt.is_empty() {
                            continue;
                        }
                        index.match_by_bisection(prompt, &mut bisected);
                        index.match_by_walking(prompt, &mut walked);
                        prop_assert_eq!(&bisected, &walked);
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Re-recorded prefixes move to the front as one run: the LRUs stay exactly the
        /// reference model's, block by block, on forking conversations with evictions.
        #[test]
        fn recording_chained_prompts_keeps_the_reference_lru_order(
            forks in prop::collection::vec(0usize..160, 4),
            ops in prop::collection::vec(chain_op(), 1..60),
        ) {
            let conversations = forking_conversations(&forks);
            let mut index = RoutedIndex::new();
            let mut model = Model::default();
            for op in ops {
                match op {
                    ChainOp::Record(p, c, n) => {
                        index.record_routed(PodId(p), &conversations[c][..n]);
                        model.record(p, &conversations[c][..n]);
                    }
                    ChainOp::SetCapacity(p, cap) => {
                        index.set_capacity(PodId(p), cap);
                        model.set_capacity(p, cap);
                    }
                    ChainOp::Remove(p) => {
                        index.remove_pod(PodId(p));
                        model.pods.remove(&p);
                    }
                    ChainOp::Match(..) => continue,
                }
                check_invariants(&index);
                for (&p, (lru, _)) in &model.pods {
                    prop_assert_eq!(index.blocks_mru_first(PodId(p)), Vec::from(lru.clone()));
                }
            }
        }
    }

    /// Reference model: per-pod `VecDeque` (front = most recently used) and its capacity.
    #[derive(Default)]
    struct Model {
        pods: BTreeMap<u32, (VecDeque<BlockHash>, u32)>,
    }

    impl Model {
        fn record(&mut self, pod: u32, blocks: &[BlockHash]) {
            if pod as usize >= MAX_PODS {
                return;
            }
            let (lru, cap) = self
                .pods
                .entry(pod)
                .or_insert_with(|| (VecDeque::new(), DEFAULT_POD_CAPACITY_BLOCKS));
            for &b in blocks.iter().rev() {
                if let Some(pos) = lru.iter().position(|&x| x == b) {
                    lru.remove(pos);
                } else if *cap == 0 {
                    continue;
                } else if lru.len() >= *cap as usize {
                    lru.pop_back();
                }
                lru.push_front(b);
            }
        }
        fn set_capacity(&mut self, pod: u32, cap: u32) {
            if pod as usize >= MAX_PODS {
                return;
            }
            let entry = self
                .pods
                .entry(pod)
                .or_insert_with(|| (VecDeque::new(), cap));
            entry.1 = cap;
            entry.0.truncate(cap as usize);
        }
        fn matched(&self, blocks: &[BlockHash]) -> Vec<u32> {
            let n = self.pods.keys().next_back().map_or(0, |&p| p as usize + 1);
            let mut m = vec![0; n];
            for (&p, (lru, _)) in &self.pods {
                m[p as usize] = blocks.iter().take_while(|b| lru.contains(b)).count() as u32;
            }
            m
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Record(u32, Vec<BlockHash>),
        SetCapacity(u32, u32),
        Remove(u32),
        Match(Vec<BlockHash>),
    }

    fn pod_id() -> impl Strategy<Value = u32> {
        prop_oneof![8 => 0u32..5, 1 => Just(MAX_PODS as u32), 1 => Just(u32::MAX)]
    }

    fn blocks() -> impl Strategy<Value = Vec<BlockHash>> {
        prop::collection::vec(0u64..16, 0..10)
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (pod_id(), blocks()).prop_map(|(p, b)| Op::Record(p, b)),
            2 => (pod_id(), 0u32..10).prop_map(|(p, c)| Op::SetCapacity(p, c)),
            1 => pod_id().prop_map(Op::Remove),
            3 => blocks().prop_map(Op::Match),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn index_agrees_with_reference_lru_model(ops in prop::collection::vec(op(), 1..80)) {
            let mut index = RoutedIndex::new();
            let mut model = Model::default();
            let mut m = Vec::new();
            for op in ops {
                match op {
                    Op::Record(p, b) => {
                        index.record_routed(PodId(p), &b);
                        model.record(p, &b);
                    }
                    Op::SetCapacity(p, c) => {
                        index.set_capacity(PodId(p), c);
                        model.set_capacity(p, c);
                    }
                    Op::Remove(p) => {
                        index.remove_pod(PodId(p));
                        model.pods.remove(&p);
                    }
                    Op::Match(b) => {
                        index.match_prefix(&b, &mut m);
                        prop_assert_eq!(&m, &model.matched(&b));
                    }
                }
                check_invariants(&index);
                for (&p, (lru, cap)) in &model.pods {
                    prop_assert!(lru.len() <= *cap as usize);
                    prop_assert_eq!(index.blocks_mru_first(PodId(p)), Vec::from(lru.clone()));
                    prop_assert_eq!(index.capacity_blocks(PodId(p)), Some(*cap));
                }
                let total: usize = model.pods.values().map(|(l, _)| l.len()).sum();
                prop_assert_eq!(index.indexed_blocks(), total);
            }
        }
    }
}
