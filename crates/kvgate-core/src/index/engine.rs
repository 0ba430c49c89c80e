//! The engine (precise) prefix index, fed by the pods' own KV-cache events.
//!
//! DESIGN.md §4 and §7. Each vLLM pod publishes `BlockStored` / `BlockRemoved` /
//! `AllBlocksCleared` events (reference/interfaces.md §2.2); every router replica that applies
//! them sees the same truth, so replicas agree on where prefixes live.
//!
//! # Our hashes, not the engine's
//!
//! vLLM's block hashes depend on its hash algorithm and on a per-process random seed unless
//! `PYTHONHASHSEED` is pinned (interfaces.md §2.3), so the router cannot compute them. A
//! `BlockStored` carries the blocks' `token_ids` and the engine hash of the block before the
//! first one (`parent_block_hash`), so the index recomputes its **own** chained hashes
//! ([`BlockHasher::hash_tokens`]) seeded by the parent's router hash, or, for a sequence's first
//! block, by [`BlockHasher::chain_seed`] of the pod's model (or of the event's `lora_name`, the
//! model name a LoRA request carries). It keeps, per pod, a map engine hash → router hash, so a
//! later `BlockRemoved` (engine hashes only) finds our hash whatever algorithm the engine uses.
//! Several engine hashes may map to one router hash (vLLM mixes `cache_salt` and multimodal
//! keys into its hash, which the chain seed here does not see for events); a per-pod reference
//! count keeps the router block until the last of them is removed.
//!
//! Limits that follow: a salted request (`cache_salt`) is hashed by the gateway with the salt in
//! its seed, so it never matches event-fed blocks (it falls back to a cold score, which is the
//! safe side); a `BlockStored` whose parent the index does not know (events lost, or the
//! subscriber joined after the parent was stored) cannot be placed in a chain and is skipped
//! (counted in [`EngineIndexStats::unknown_parent`]). Events of a `medium` other than GPU
//! (CPU-offload tiers) are ignored and counted: only GPU blocks skip prefill.
//!
//! # Structure
//!
//! - Block → pods and per-pod LRU: a [`RoutedIndex`] keyed by router hashes, reused as is
//!   (`match_prefix` is the routed index's: strict leading blocks, O(prompt blocks × pods per
//!   block)). Its per-pod capacity is the pod's KV blocks, so even a pod whose removals are lost
//!   cannot grow the block map past its capacity.
//! - Per pod ([`EnginePod`]): `engine_to_router: FxHashMap<u64, u64>` and
//!   `router_refs: FxHashMap<u64, u32>` (engine hashes per router hash), the model's chain seed,
//!   and a `stale` flag the driver sets when it lost events it could not replay.
//!
//! # Bounds
//!
//! The per-pod engine map holds at most [`ENGINE_MAP_SLACK`] × max(capacity,
//! [`DEFAULT_POD_CAPACITY_BLOCKS`]) entries; stores beyond that are dropped and counted
//! ([`EngineIndexStats::dropped_over_bound`]): an engine never holds more blocks than its KV
//! size, so reaching the bound means removals were lost, and the driver should rebuild the pod.
//! Pod ids ≥ [`MAX_PODS`] are rejected. A `BlockStored` with `block_size` outside
//! 1..=[`MAX_BLOCK_SIZE_TOKENS`] or `token_ids.len() != block_hashes.len() × block_size` is
//! rejected and counted ([`EngineIndexStats::malformed`]).
//!
//! # Memory
//!
//! Per indexed (pod, block): the routed part (≤ 96 bytes, see [`super::routed`]) plus one entry
//! in each per-pod map (16 + 1 and 16 + 1 bytes at a hashbrown load between 7/16 and 7/8).
//! Documented bound: [`MAX_BYTES_PER_ENGINE_BLOCK`] = 192 bytes of live heap per indexed block,
//! checked by `tests/engine_index_memory.rs` with a counting allocator. Measured (x86-64
//! Linux, 200,000 blocks on one pod, `BlockStored` events of 20 blocks): 93.3 B per block at the
//! end, 153.2 B at the worst step (map growth). Ingestion on one core (release, same test with
//! `--nocapture`): 1.8 M stored blocks/s (90 k `BlockStored` events of 20 blocks/s), 1.3 M
//! single-block `BlockRemoved` events/s; decoding and the gateway's lock are not included.
//!
//! Sans IO: the gateway's ZeroMQ subscriber decodes frames ([`super::kv_events_wire`]) and calls
//! [`EngineIndex::apply`]; sequence gaps, replay and restarts are the driver's business, which
//! it reports through [`EngineIndex::clear_pod`] and [`EngineIndex::set_stale`].

use super::pending::PendingRoutes;
use super::routed::{MAX_PODS, RoutedIndex};
use super::{DEFAULT_POD_CAPACITY_BLOCKS, PrefixIndex};
use crate::blocks::{BlockHash, BlockHasher};
use crate::pod::PodId;
use rustc_hash::FxHashMap;
use std::cell::RefCell;

/// Engine-side block hash, normalised to u64 (vLLM's int hashes, or the last 8 bytes of a
/// byte digest: interfaces.md §2.2).
pub type EngineBlockHash = u64;

/// Largest `block_size` accepted in a `BlockStored`.
pub const MAX_BLOCK_SIZE_TOKENS: u32 = 4096;

/// The per-pod engine map may hold this many times the pod's capacity (see Bounds).
pub const ENGINE_MAP_SLACK: usize = 2;

/// Documented bound on live heap bytes per indexed (pod, block); see Memory.
pub const MAX_BYTES_PER_ENGINE_BLOCK: usize = 192;

/// One KV-cache event as the core sees it (decoded from either vLLM encoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    BlockStored {
        block_hashes: Vec<EngineBlockHash>,
        /// Engine hash of the block before the first stored one; `None` at a sequence start.
        parent_block_hash: Option<EngineBlockHash>,
        /// All tokens of the stored blocks (`block_hashes.len() × block_size`).
        token_ids: Vec<u32>,
        block_size: u32,
        /// LoRA adapter name: the chain seed of a sequence start becomes this name.
        lora_name: Option<String>,
        /// "GPU" (or absent) is indexed; other tiers are ignored.
        medium: Option<String>,
    },
    BlockRemoved {
        block_hashes: Vec<EngineBlockHash>,
        medium: Option<String>,
    },
    AllBlocksCleared,
}

/// A GPU-tier store or removal whose hashes are the router's; see
/// [`EngineIndex::apply_prehashed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrehashedEvent<'a> {
    Stored(&'a [BlockHash]),
    Removed(&'a [BlockHash]),
}

/// Counters of what the index did with events (cumulative, all pods).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineIndexStats {
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    pub cleared: u64,
    /// `BlockRemoved` hashes the index did not know (normal after joining late).
    pub unknown_removed: u64,
    /// `BlockStored` events skipped because their parent was unknown.
    pub unknown_parent: u64,
    /// `BlockStored` with an invalid block size or token count.
    pub malformed: u64,
    /// Events of a non-GPU medium.
    pub ignored_medium: u64,
    /// Stored blocks dropped because the pod's engine map was full.
    pub dropped_over_bound: u64,
    /// Events for a pod not added with [`EngineIndex::add_pod`] (or id ≥ [`MAX_PODS`]).
    pub unknown_pod: u64,
}

/// What applying one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    Applied,
    /// Skipped (the reason is counted in [`EngineIndexStats`]).
    Skipped,
}

#[derive(Debug)]
struct EnginePod {
    model_seed: BlockHash,
    engine_to_router: FxHashMap<EngineBlockHash, BlockHash>,
    router_refs: FxHashMap<BlockHash, u32>,
    capacity_blocks: u32,
    stale: bool,
}

impl EnginePod {
    fn map_bound(&self) -> usize {
        ENGINE_MAP_SLACK * (self.capacity_blocks as usize).max(DEFAULT_POD_CAPACITY_BLOCKS as usize)
    }
}

/// The engine index; see the module docs.
#[derive(Debug, Default)]
pub struct EngineIndex {
    blocks: RoutedIndex,
    pods: Vec<Option<EnginePod>>,
    stats: EngineIndexStats,
    /// Router hashes of the event being applied (reused, never shrunk below one event).
    scratch: Vec<BlockHash>,
    /// Routes not yet confirmed by the pod's events ([`super::pending`]).
    pending: PendingRoutes,
    /// Per pod, the blocks of the last [`PrefixIndex::match_prefix`] that were pending.
    pending_matched: RefCell<Vec<u32>>,
}

fn is_gpu(medium: &Option<String>) -> bool {
    medium
        .as_deref()
        .is_none_or(|m| m.eq_ignore_ascii_case("GPU"))
}

impl EngineIndex {
    pub fn new() -> Self {
        EngineIndex::default()
    }

    /// Starts following a pod's events; `model` seeds its sequences' chains. Re-adding a pod
    /// with another model clears it.
    pub fn add_pod(&mut self, pod: PodId, model: &str) {
        // Events store blocks whose ancestors may be missing here (a lost event, another
        // medium): the storage must not assume prefix-closed block sets.
        self.blocks.allow_holes();
        if pod.index() >= MAX_PODS {
            self.stats.unknown_pod += 1;
            return;
        }
        let seed = BlockHasher::chain_seed(model, None);
        if self.pods.len() <= pod.index() {
            self.pods.resize_with(pod.index() + 1, || None);
        }
        if let Some(Some(p)) = self.pods.get(pod.index())
            && p.model_seed == seed
        {
            return;
        }
        let capacity = self.blocks.capacity_blocks(pod);
        self.blocks.remove_pod(pod);
        self.pending.drop_pod(pod);
        let capacity = capacity.unwrap_or(DEFAULT_POD_CAPACITY_BLOCKS);
        self.blocks.set_capacity(pod, capacity);
        if let Some(slot) = self.pods.get_mut(pod.index()) {
            *slot = Some(EnginePod {
                model_seed: seed,
                engine_to_router: FxHashMap::default(),
                router_refs: FxHashMap::default(),
                capacity_blocks: capacity,
                stale: false,
            });
        }
    }

    /// True when the pod was added and its events are trusted (not stale).
    pub fn is_live(&self, pod: PodId) -> bool {
        self.pod(pod).is_some_and(|p| !p.stale)
    }

    /// True when the pod was added and is marked stale.
    pub fn is_stale(&self, pod: PodId) -> bool {
        self.pod(pod).is_some_and(|p| p.stale)
    }

    /// Marks a pod's view as lost (events missed and not replayed) or rebuilt.
    pub fn set_stale(&mut self, pod: PodId, stale: bool) {
        if let Some(Some(p)) = self.pods.get_mut(pod.index()) {
            p.stale = stale;
        }
    }

    /// Forgets every block of a pod (engine restart, `AllBlocksCleared`, rebuild); keeps the
    /// pod, its model and its stale flag.
    pub fn clear_pod(&mut self, pod: PodId) {
        let Some(Some(p)) = self.pods.get_mut(pod.index()) else {
            return;
        };
        p.engine_to_router = FxHashMap::default();
        p.router_refs = FxHashMap::default();
        let capacity = p.capacity_blocks;
        self.blocks.remove_pod(pod);
        self.blocks.set_capacity(pod, capacity);
        self.pending.drop_pod(pod);
    }

    pub fn stats(&self) -> EngineIndexStats {
        self.stats
    }

    /// The pending routes ([`super::pending`]): their counters and lifetime.
    pub fn pending(&self) -> &PendingRoutes {
        &self.pending
    }

    /// Sets the pending routes' lifetime ([`super::pending::DEFAULT_PENDING_TTL_MS`]; 0: off).
    pub fn set_pending_ttl_ms(&mut self, ttl_ms: f64) {
        self.pending.set_ttl_ms(ttl_ms);
    }

    /// Moves the pending routes' clock to the driver's `now_ms` and expires the old ones.
    pub fn advance_clock(&mut self, now_ms: f64) {
        self.pending.advance(now_ms);
    }

    /// Engine hashes the index maps for `pod`.
    pub fn engine_blocks(&self, pod: PodId) -> usize {
        self.pod(pod).map_or(0, |p| p.engine_to_router.len())
    }

    /// Router blocks the index believes `pod` holds.
    pub fn pod_blocks(&self, pod: PodId) -> usize {
        self.blocks.pod_blocks(pod)
    }

    fn pod(&self, pod: PodId) -> Option<&EnginePod> {
        self.pods.get(pod.index()).and_then(Option::as_ref)
    }

    /// Applies one event of `pod`.
    pub fn apply(&mut self, pod: PodId, event: &KvEvent) -> ApplyOutcome {
        let Some(Some(p)) = self.pods.get_mut(pod.index()) else {
            self.stats.unknown_pod += 1;
            return ApplyOutcome::Skipped;
        };
        match event {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                medium,
            } => {
                if !is_gpu(medium) {
                    self.stats.ignored_medium += 1;
                    return ApplyOutcome::Skipped;
                }
                let n = block_hashes.len();
                if !(1..=MAX_BLOCK_SIZE_TOKENS).contains(block_size)
                    || Some(token_ids.len()) != n.checked_mul(*block_size as usize)
                {
                    self.stats.malformed += 1;
                    return ApplyOutcome::Skipped;
                }
                let seed = match (parent_block_hash, lora_name) {
                    (Some(parent), _) => match p.engine_to_router.get(parent) {
                        Some(&r) => r,
                        None => {
                            self.stats.unknown_parent += 1;
                            return ApplyOutcome::Skipped;
                        }
                    },
                    (None, Some(lora)) => BlockHasher::chain_seed(lora, None),
                    (None, None) => p.model_seed,
                };
                let hasher = BlockHasher {
                    block_size_tokens: *block_size,
                    ..BlockHasher::default()
                };
                self.scratch.clear();
                hasher.hash_tokens(seed, token_ids, &mut self.scratch);
                let bound = p.map_bound();
                let mut kept = 0;
                for (&engine, &router) in block_hashes.iter().zip(&self.scratch) {
                    match p.engine_to_router.get(&engine) {
                        Some(&old) if old == router => {}
                        Some(&old) => {
                            p.engine_to_router.insert(engine, router);
                            release(p, &mut self.blocks, pod, old);
                            *p.router_refs.entry(router).or_insert(0) += 1;
                        }
                        None => {
                            if p.engine_to_router.len() >= bound {
                                self.stats.dropped_over_bound += 1;
                                // Later blocks chain from this one: they cannot be placed either.
                                break;
                            }
                            p.engine_to_router.insert(engine, router);
                            *p.router_refs.entry(router).or_insert(0) += 1;
                        }
                    }
                    kept += 1;
                }
                self.stats.stored_blocks += kept as u64;
                let stored = self.scratch.get(..kept).unwrap_or(&[]);
                self.blocks.record_routed(pod, stored);
                for &h in stored {
                    self.pending.confirm(pod, h);
                }
                ApplyOutcome::Applied
            }
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
            } => {
                if !is_gpu(medium) {
                    self.stats.ignored_medium += 1;
                    return ApplyOutcome::Skipped;
                }
                let maps = (&mut self.blocks, &mut self.pending);
                remove_engine_blocks(p, maps, &mut self.stats, pod, block_hashes);
                ApplyOutcome::Applied
            }
            KvEvent::AllBlocksCleared => {
                self.stats.cleared += 1;
                self.clear_pod(pod);
                ApplyOutcome::Applied
            }
        }
    }

    /// Applies one event whose block hashes are already the router's (engine hash = router
    /// hash): the simulator's engines hash blocks as the router does, so there is nothing to
    /// re-hash or map, and the event goes straight to the block map (whose per-pod capacity
    /// still bounds it). A pod is fed either these or [`EngineIndex::apply`]'s events, not both.
    pub fn apply_prehashed(&mut self, pod: PodId, event: &PrehashedEvent<'_>) -> ApplyOutcome {
        if self.pod(pod).is_none() {
            self.stats.unknown_pod += 1;
            return ApplyOutcome::Skipped;
        }
        match *event {
            PrehashedEvent::Stored(hashes) => {
                self.stats.stored_blocks += hashes.len() as u64;
                self.blocks.record_routed(pod, hashes);
                for &h in hashes {
                    self.pending.confirm(pod, h);
                }
            }
            PrehashedEvent::Removed(hashes) => {
                for &h in hashes {
                    self.pending.drop_block(pod, h);
                    if self.blocks.remove_block(pod, h) {
                        self.stats.removed_blocks += 1;
                    } else {
                        self.stats.unknown_removed += 1;
                    }
                }
            }
        }
        ApplyOutcome::Applied
    }

    /// Checks the maps agree (tests).
    #[cfg(test)]
    fn check_invariants(&self) {
        for (i, p) in self.pods.iter().enumerate() {
            let Some(p) = p else { continue };
            let mut refs: FxHashMap<BlockHash, u32> = FxHashMap::default();
            for &r in p.engine_to_router.values() {
                *refs.entry(r).or_insert(0) += 1;
            }
            assert_eq!(refs, p.router_refs, "pod {i}: refs out of sync");
            assert!(p.engine_to_router.len() <= p.map_bound());
            assert!(self.blocks.pod_blocks(PodId(i as u32)) <= p.router_refs.len());
        }
    }
}

/// `BlockRemoved`: each known engine hash drops its reference.
fn remove_engine_blocks(
    p: &mut EnginePod,
    (blocks, pending): (&mut RoutedIndex, &mut PendingRoutes),
    stats: &mut EngineIndexStats,
    pod: PodId,
    hashes: &[EngineBlockHash],
) {
    for engine in hashes {
        match p.engine_to_router.remove(engine) {
            Some(router) => {
                pending.drop_block(pod, router);
                release(p, blocks, pod, router);
                stats.removed_blocks += 1;
            }
            None => stats.unknown_removed += 1,
        }
    }
}

/// Drops one engine reference to `router`; forgets the block when none is left.
fn release(p: &mut EnginePod, blocks: &mut RoutedIndex, pod: PodId, router: BlockHash) {
    if let Some(n) = p.router_refs.get_mut(&router) {
        *n -= 1;
        if *n == 0 {
            p.router_refs.remove(&router);
            blocks.remove_block(pod, router);
        }
    }
}

impl PrefixIndex for EngineIndex {
    /// The stored blocks' match, each live pod's then extended by its pending blocks.
    fn match_prefix(&self, blocks: &[BlockHash], matched: &mut Vec<u32>) {
        self.blocks.match_prefix(blocks, matched);
        let mut used = self.pending_matched.borrow_mut();
        used.clear();
        if self.pending.is_empty() {
            return;
        }
        used.resize(self.pods.len(), 0);
        if matched.len() < self.pods.len() {
            matched.resize(self.pods.len(), 0);
        }
        for (i, (m, used)) in matched.iter_mut().zip(used.iter_mut()).enumerate() {
            let pod = PodId(i as u32);
            if self.pending.pod_len(pod) == 0 || !self.is_live(pod) {
                continue;
            }
            let start = *m as usize;
            let extra = blocks
                .get(start..)
                .unwrap_or(&[])
                .iter()
                .take_while(|&&h| self.pending.contains(pod, h))
                .count() as u32;
            *m += extra;
            *used = extra;
        }
    }

    /// A request was sent to a live pod: the blocks it does not hold yet are pending there
    /// ([`super::pending`]) until its events confirm them or they expire.
    fn record_routed(&mut self, pod: PodId, blocks: &[BlockHash]) {
        if !self.pending.is_on() || !self.is_live(pod) {
            return;
        }
        let held = blocks
            .iter()
            .take_while(|&&h| self.blocks.holds(pod, h))
            .count();
        self.pending.record(pod, blocks.get(held..).unwrap_or(&[]));
    }

    fn pending_matched(&self, out: &mut Vec<u32>) {
        out.clear();
        out.extend_from_slice(&self.pending_matched.borrow());
    }

    fn set_capacity(&mut self, pod: PodId, capacity_blocks: u32) {
        if let Some(Some(p)) = self.pods.get_mut(pod.index()) {
            p.capacity_blocks = capacity_blocks;
            self.blocks.set_capacity(pod, capacity_blocks);
        }
    }

    fn remove_pod(&mut self, pod: PodId) {
        if let Some(slot) = self.pods.get_mut(pod.index()) {
            *slot = None;
        }
        while matches!(self.pods.last(), Some(None)) {
            self.pods.pop();
        }
        self.pending.drop_pod(pod);
        self.blocks.remove_pod(pod);
    }

    fn indexed_blocks(&self) -> usize {
        self.blocks.indexed_blocks()
    }
}

/// Engine index for pods whose events are live, routed index for the others (no events
/// endpoint, or stale after lost events): DESIGN.md §4's fallback. Both are kept up to date
/// (the routed one learns every routing decision), so a pod that goes stale falls back to a
/// routed view that is warm.
#[derive(Debug, Default)]
pub struct HybridIndex {
    pub engine: EngineIndex,
    pub routed: RoutedIndex,
    /// The routed index's match, merged per pod (the trait's `&self` forbids a field).
    scratch: RefCell<Vec<u32>>,
}

impl HybridIndex {
    pub fn new() -> Self {
        HybridIndex::default()
    }

    /// Sets a pod's KV capacity from what it reports: `pod_blocks` blocks of `pod_block_size`
    /// tokens (`num_gpu_blocks` and `block_size` of `vllm:cache_config_info`). The engine index
    /// counts the pod's own blocks; the routed index counts blocks of `routed_block_size`
    /// tokens, the size it cuts this pod's prompts at, so it is given as many of those as hold
    /// the same tokens ([`super::blocks_at_size`]). Without the conversion a vLLM CPU pod
    /// (128-token blocks) behind a text-mode router (16-token blocks) was modelled with an
    /// eighth of its cache, and its conversations were forgotten after a few requests.
    pub fn set_pod_kv(
        &mut self,
        pod: PodId,
        pod_blocks: u32,
        pod_block_size: u32,
        routed_block_size: u32,
    ) {
        self.engine.set_capacity(pod, pod_blocks);
        self.routed.set_capacity(
            pod,
            super::blocks_at_size(pod_blocks, pod_block_size, routed_block_size),
        );
    }
}

impl PrefixIndex for HybridIndex {
    fn match_prefix(&self, blocks: &[BlockHash], matched: &mut Vec<u32>) {
        self.engine.match_prefix(blocks, matched);
        let routed_pods = self.routed.pod_slots();
        if (0..routed_pods).all(|i| {
            let pod = PodId(i as u32);
            !self.routed.knows_pod(pod) || self.engine.is_live(pod)
        }) {
            // Every pod the routed index knows has live events: its answer would be unused.
            return;
        }
        let mut routed = self.scratch.borrow_mut();
        self.routed.match_prefix(blocks, &mut routed);
        if matched.len() < routed.len() {
            matched.resize(routed.len(), 0);
        }
        for (i, m) in matched.iter_mut().enumerate() {
            if !self.engine.is_live(PodId(i as u32)) {
                *m = routed.get(i).copied().unwrap_or(0);
            }
        }
    }

    fn record_routed(&mut self, pod: PodId, blocks: &[BlockHash]) {
        self.engine.record_routed(pod, blocks);
        self.routed.record_routed(pod, blocks);
    }

    /// The engine index's: a pod that is not live has no pending routes.
    fn pending_matched(&self, out: &mut Vec<u32>) {
        self.engine.pending_matched(out);
    }

    fn set_capacity(&mut self, pod: PodId, capacity_blocks: u32) {
        self.engine.set_capacity(pod, capacity_blocks);
        self.routed.set_capacity(pod, capacity_blocks);
    }

    fn remove_pod(&mut self, pod: PodId) {
        self.engine.remove_pod(pod);
        self.routed.remove_pod(pod);
    }

    fn indexed_blocks(&self) -> usize {
        self.engine.indexed_blocks() + self.routed.indexed_blocks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    const MODEL: &str = "m";
    const BS: u32 = 4;

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: parent,
            token_ids: tokens.to_vec(),
            block_size: BS,
            lora_name: None,
            medium: Some("GPU".into()),
        }
    }

    fn removed(hashes: &[u64]) -> KvEvent {
        KvEvent::BlockRemoved {
            block_hashes: hashes.to_vec(),
            medium: None,
        }
    }

    /// Router blocks of a token prompt, as the gateway hashes a request.
    fn prompt(tokens: &[u32]) -> Vec<BlockHash> {
        let mut out = Vec::new();
        BlockHasher {
            block_size_tokens: BS,
            ..BlockHasher::default()
        }
        .hash_tokens(BlockHasher::chain_seed(MODEL, None), tokens, &mut out);
        out
    }

    fn matched(index: &impl PrefixIndex, blocks: &[BlockHash]) -> Vec<u32> {
        let mut m = Vec::new();
        index.match_prefix(blocks, &mut m);
        m
    }

    fn index_with_pods(n: u32) -> EngineIndex {
        let mut index = EngineIndex::new();
        for p in 0..n {
            index.add_pod(PodId(p), MODEL);
        }
        index
    }

    #[test]
    fn stored_chain_split_over_two_events_matches_the_requests_blocks() {
        let mut index = index_with_pods(2);
        let tokens: Vec<u32> = (0..14).collect();
        // Arbitrary engine hashes: the index never needs to compute them.
        index.apply(PodId(1), &stored(&[901, 902], None, &tokens[..8]));
        index.apply(PodId(1), &stored(&[903], Some(902), &tokens[8..12]));
        assert_eq!(matched(&index, &prompt(&tokens)), vec![0, 3]);
        assert_eq!(index.stats().stored_blocks, 3);
        index.check_invariants();
    }

    #[test]
    fn removed_block_cuts_the_match_at_that_block() {
        let mut index = index_with_pods(1);
        let tokens: Vec<u32> = (0..12).collect();
        index.apply(PodId(0), &stored(&[1, 2, 3], None, &tokens));
        index.apply(PodId(0), &removed(&[2, 77]));
        assert_eq!(matched(&index, &prompt(&tokens)), vec![1]);
        assert_eq!(index.stats().removed_blocks, 1);
        assert_eq!(index.stats().unknown_removed, 1);
        index.check_invariants();
    }

    #[test]
    fn all_blocks_cleared_empties_only_that_pod() {
        let mut index = index_with_pods(2);
        let tokens: Vec<u32> = (0..8).collect();
        index.apply(PodId(0), &stored(&[1, 2], None, &tokens));
        index.apply(PodId(1), &stored(&[5, 6], None, &tokens));
        index.apply(PodId(0), &KvEvent::AllBlocksCleared);
        assert_eq!(matched(&index, &prompt(&tokens)), vec![0, 2]);
        assert_eq!(index.engine_blocks(PodId(0)), 0);
        // The pod keeps working after the clear.
        index.apply(PodId(0), &stored(&[1], None, &tokens[..4]));
        assert_eq!(matched(&index, &prompt(&tokens)), vec![1, 2]);
        index.check_invariants();
    }

    #[test]
    fn unknown_parent_wrong_token_count_and_cpu_medium_are_skipped_and_counted() {
        let mut index = index_with_pods(1);
        let tokens: Vec<u32> = (0..8).collect();
        assert_eq!(
            index.apply(PodId(0), &stored(&[2], Some(1), &tokens[..4])),
            ApplyOutcome::Skipped
        );
        assert_eq!(
            index.apply(PodId(0), &stored(&[1, 2], None, &tokens[..7])),
            ApplyOutcome::Skipped
        );
        let mut cpu = stored(&[1], None, &tokens[..4]);
        if let KvEvent::BlockStored { medium, .. } = &mut cpu {
            *medium = Some("CPU".into());
        }
        assert_eq!(index.apply(PodId(0), &cpu), ApplyOutcome::Skipped);
        assert_eq!(
            index.apply(PodId(5), &KvEvent::AllBlocksCleared),
            ApplyOutcome::Skipped
        );
        let s = index.stats();
        assert_eq!(
            (
                s.unknown_parent,
                s.malformed,
                s.ignored_medium,
                s.unknown_pod
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(index.indexed_blocks(), 0);
    }

    #[test]
    fn two_engine_hashes_of_one_router_block_keep_it_until_both_are_removed() {
        let mut index = index_with_pods(1);
        let tokens: Vec<u32> = (0..4).collect();
        // Same tokens stored twice under different engine hashes (e.g. two cache salts).
        index.apply(PodId(0), &stored(&[10], None, &tokens));
        index.apply(PodId(0), &stored(&[20], None, &tokens));
        index.apply(PodId(0), &removed(&[10]));
        assert_eq!(matched(&index, &prompt(&tokens)), vec![1]);
        index.apply(PodId(0), &removed(&[20]));
        assert_eq!(matched(&index, &prompt(&tokens)), vec![0]);
        index.check_invariants();
    }

    #[test]
    fn lora_sequences_are_seeded_by_the_adapter_name() {
        let mut index = index_with_pods(1);
        let tokens: Vec<u32> = (0..4).collect();
        let mut ev = stored(&[1], None, &tokens);
        if let KvEvent::BlockStored { lora_name, .. } = &mut ev {
            *lora_name = Some("adapter".into());
        }
        index.apply(PodId(0), &ev);
        assert_eq!(matched(&index, &prompt(&tokens)), vec![0]);
        let mut lora_prompt = Vec::new();
        BlockHasher {
            block_size_tokens: BS,
            ..BlockHasher::default()
        }
        .hash_tokens(
            BlockHasher::chain_seed("adapter", None),
            &tokens,
            &mut lora_prompt,
        );
        assert_eq!(matched(&index, &lora_prompt), vec![1]);
    }

    #[test]
    fn a_request_for_adapter_b_never_scores_on_blocks_stored_for_adapter_a() {
        let mut index = index_with_pods(1);
        let tokens: Vec<u32> = (0..8).collect();
        let mut ev = stored(&[1, 2], None, &tokens);
        if let KvEvent::BlockStored { lora_name, .. } = &mut ev {
            *lora_name = Some("a".into());
        }
        index.apply(PodId(0), &ev);
        let hasher = BlockHasher {
            block_size_tokens: BS,
            ..BlockHasher::default()
        };
        let chain = |name: &str| {
            let mut out = Vec::new();
            hasher.hash_tokens(BlockHasher::chain_seed(name, None), &tokens, &mut out);
            out
        };
        assert_eq!(matched(&index, &chain("a")), vec![2]);
        assert_eq!(matched(&index, &chain("b")), vec![0]);
        // The base model's chain (the pod's model seed) does not match a's blocks either.
        assert_eq!(matched(&index, &prompt(&tokens)), vec![0]);
    }

    #[test]
    fn engine_map_stops_growing_at_its_bound() {
        let mut index = index_with_pods(1);
        index.set_capacity(PodId(0), 10);
        let bound = ENGINE_MAP_SLACK * DEFAULT_POD_CAPACITY_BLOCKS as usize;
        for i in 0..bound as u64 + 5 {
            index.apply(PodId(0), &stored(&[i], None, &[i as u32, 0, 0, 0]));
        }
        assert_eq!(index.engine_blocks(PodId(0)), bound);
        assert_eq!(index.stats().dropped_over_bound, 5);
        assert_eq!(index.pod_blocks(PodId(0)), 10);
        index.check_invariants();
    }

    #[test]
    fn hybrid_uses_routed_history_for_stale_and_event_less_pods() {
        let mut hybrid = HybridIndex::new();
        hybrid.engine.add_pod(PodId(0), MODEL);
        hybrid.engine.add_pod(PodId(1), MODEL);
        let tokens: Vec<u32> = (0..8).collect();
        let blocks = prompt(&tokens);
        hybrid
            .engine
            .apply(PodId(0), &stored(&[1, 2], None, &tokens));
        hybrid
            .engine
            .apply(PodId(1), &stored(&[1, 2], None, &tokens));
        // Routed history says pod 1 and pod 2 got the first block only.
        hybrid.record_routed(PodId(1), &blocks[..1]);
        hybrid.record_routed(PodId(2), &blocks[..1]);
        assert_eq!(matched(&hybrid, &blocks), vec![2, 2, 1]);
        hybrid.engine.set_stale(PodId(1), true);
        assert_eq!(matched(&hybrid, &blocks), vec![2, 1, 1]);
        hybrid.engine.set_stale(PodId(1), false);
        assert_eq!(matched(&hybrid, &blocks), vec![2, 2, 1]);
    }

    #[test]
    fn a_pod_with_large_blocks_is_routed_with_its_whole_cache() {
        // The pod holds 2 blocks of 32 tokens; the routed index cuts its prompts in blocks of 4,
        // so it may hold 16 of them: a 16-block prompt stays whole, a 17th block evicts one.
        let mut hybrid = HybridIndex::new();
        hybrid.engine.add_pod(PodId(0), MODEL);
        hybrid.set_pod_kv(PodId(0), 2, 32, BS);
        assert_eq!(
            hybrid.engine.pod(PodId(0)).map(|p| p.capacity_blocks),
            Some(2)
        );
        assert_eq!(hybrid.routed.capacity_blocks(PodId(0)), Some(16));
        hybrid.engine.set_stale(PodId(0), true);
        let tokens: Vec<u32> = (0..64).collect();
        let blocks = prompt(&tokens);
        assert_eq!(blocks.len(), 16);
        hybrid.record_routed(PodId(0), &blocks);
        assert_eq!(matched(&hybrid, &blocks), vec![16]);
        let longer: Vec<u32> = (0..68).collect();
        hybrid.record_routed(PodId(0), &prompt(&longer));
        assert_eq!(hybrid.routed.indexed_blocks(), 16);
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Store `n` blocks on pod `pod`, continuing the `from`-th known chain of that pod
        /// (or a new sequence if out of range), with token content picked by `content`.
        Store {
            pod: u32,
            from: usize,
            n: usize,
            content: u32,
        },
        Remove {
            pod: u32,
            pick: usize,
        },
        Clear(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u32..3, 0usize..12, 1usize..4, 0u32..3)
                .prop_map(|(pod, from, n, content)| Op::Store { pod, from, n, content }),
            3 => (0u32..3, 0usize..16).prop_map(|(pod, pick)| Op::Remove { pod, pick }),
            1 => (0u32..3).prop_map(Op::Clear),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The reference model keeps, per pod, engine hash → full token prefix up to that block;
        /// a prompt's match is the leading blocks whose prefixes the pod holds.
        #[test]
        fn index_agrees_with_a_token_prefix_model(ops in prop::collection::vec(op(), 1..60)) {
            let mut index = index_with_pods(3);
            let mut model: BTreeMap<u32, BTreeMap<u64, Vec<u32>>> = BTreeMap::new();
            let mut next_engine_hash = 1000u64;
            for op in ops {
                match op {
                    Op::Store { pod, from, n, content } => {
                        let held = model.entry(pod).or_default();
                        let parent = held.iter().nth(from).map(|(&h, t)| (h, t.clone()));
                        let mut prefix = parent.as_ref().map_or_else(Vec::new, |(_, t)| t.clone());
                        let mut hashes = Vec::new();
                        let mut tokens = Vec::new();
                        for _ in 0..n {
                            let block = vec![content; BS as usize];
                            prefix.extend(&block);
                            tokens.extend(block);
                            hashes.push(next_engine_hash);
                            held.insert(next_engine_hash, prefix.clone());
                            next_engine_hash += 1;
                        }
                        let out = index.apply(PodId(pod), &stored(&hashes, parent.map(|(h, _)| h), &tokens));
                        prop_assert_eq!(out, ApplyOutcome::Applied);
                    }
                    Op::Remove { pod, pick } => {
                        let held = model.entry(pod).or_default();
                        let h = held.keys().nth(pick).copied().unwrap_or(1);
                        held.remove(&h);
                        index.apply(PodId(pod), &removed(&[h]));
                    }
                    Op::Clear(pod) => {
                        model.remove(&pod);
                        index.apply(PodId(pod), &KvEvent::AllBlocksCleared);
                    }
                }
                index.check_invariants();
                let prefixes: BTreeMap<u32, BTreeSet<Vec<u32>>> = model
                    .iter()
                    .map(|(&p, held)| (p, held.values().cloned().collect()))
                    .collect();
                for held in model.values() {
                    for tokens in held.values() {
                        let blocks = prompt(tokens);
                        let m = matched(&index, &blocks);
                        for p in 0..3u32 {
                            let expected = (1..=blocks.len())
                                .take_while(|&k| prefixes.get(&p).is_some_and(|s| s.contains(&tokens[..k * BS as usize])))
                                .count() as u32;
                            prop_assert_eq!(m.get(p as usize).copied().unwrap_or(0), expected);
                        }
                    }
                }
                let engine_total: usize = (0..3).map(|p| index.engine_blocks(PodId(p))).sum();
                let model_total: usize = model.values().map(BTreeMap::len).sum();
                prop_assert_eq!(engine_total, model_total);
            }
        }
    }

    fn pending_of(index: &impl PrefixIndex) -> Vec<u32> {
        let mut out = Vec::new();
        index.pending_matched(&mut out);
        out
    }

    #[test]
    fn a_routed_request_scores_as_pending_on_a_live_pod_until_its_events_confirm_it() {
        let mut index = index_with_pods(2);
        let tokens: Vec<u32> = (0..12).collect();
        let blocks = prompt(&tokens);
        index.advance_clock(10.0);
        index.record_routed(PodId(1), &blocks);
        assert_eq!(matched(&index, &blocks), vec![0, 3]);
        assert_eq!(pending_of(&index), vec![0, 3]);
        index.apply(PodId(1), &stored(&[1, 2, 3], None, &tokens));
        assert_eq!(matched(&index, &blocks), vec![0, 3]);
        assert_eq!(
            pending_of(&index),
            Vec::<u32>::new(),
            "nothing pending is left"
        );
        let s = index.pending().stats();
        assert_eq!((s.recorded, s.confirmed, s.expired), (3, 3, 0));
        index.check_invariants();
    }

    #[test]
    fn an_unconfirmed_route_expires_after_its_lifetime() {
        let mut index = index_with_pods(1);
        let blocks = prompt(&(0..8).collect::<Vec<u32>>());
        index.record_routed(PodId(0), &blocks);
        index.advance_clock(super::super::pending::DEFAULT_PENDING_TTL_MS - 1.0);
        assert_eq!(matched(&index, &blocks), vec![2]);
        index.advance_clock(super::super::pending::DEFAULT_PENDING_TTL_MS);
        assert_eq!(matched(&index, &blocks), vec![0]);
        assert_eq!(index.pending().stats().expired, 2);
    }

    #[test]
    fn only_the_blocks_the_pod_does_not_hold_are_recorded_pending() {
        let mut index = index_with_pods(1);
        let tokens: Vec<u32> = (0..16).collect();
        index.apply(PodId(0), &stored(&[1, 2], None, &tokens[..8]));
        let blocks = prompt(&tokens);
        index.record_routed(PodId(0), &blocks);
        assert_eq!(index.pending().len(), 2);
        assert_eq!(matched(&index, &blocks), vec![4]);
        assert_eq!(pending_of(&index), vec![2]);
        // The pod evicts the stored prefix: the pending suffix no longer leads anywhere.
        index.apply(PodId(0), &removed(&[1]));
        assert_eq!(matched(&index, &blocks), vec![0]);
    }

    #[test]
    fn cleared_pods_and_removed_blocks_drop_their_pending_routes() {
        let mut index = index_with_pods(2);
        let tokens: Vec<u32> = (0..8).collect();
        let blocks = prompt(&tokens);
        index.record_routed(PodId(0), &blocks);
        index.record_routed(PodId(1), &blocks);
        index.apply(PodId(0), &KvEvent::AllBlocksCleared);
        assert_eq!(matched(&index, &blocks), vec![0, 2]);
        index.remove_pod(PodId(1));
        assert!(index.pending().is_empty());
        assert_eq!(index.pending().stats().dropped, 4);
    }

    #[test]
    fn the_hybrid_index_records_pending_routes_only_for_live_pods() {
        let mut index = HybridIndex::new();
        index.engine.add_pod(PodId(0), MODEL);
        index.engine.add_pod(PodId(1), MODEL);
        index.engine.set_stale(PodId(1), true);
        let blocks = prompt(&(0..8).collect::<Vec<u32>>());
        index.record_routed(PodId(0), &blocks);
        index.record_routed(PodId(1), &blocks);
        assert_eq!(
            index.engine.pending().len(),
            2,
            "pod 1 is stale: routed index only"
        );
        // Both score 2: pod 0 from its pending route, pod 1 from the routed fallback.
        assert_eq!(matched(&index, &blocks), vec![2, 2]);
        assert_eq!(pending_of(&index), vec![2, 0]);
    }

    #[test]
    fn pending_routes_off_leave_the_engine_index_event_only() {
        let mut index = index_with_pods(1);
        index.set_pending_ttl_ms(0.0);
        let blocks = prompt(&(0..8).collect::<Vec<u32>>());
        index.record_routed(PodId(0), &blocks);
        assert_eq!(matched(&index, &blocks), vec![0]);
    }
}
