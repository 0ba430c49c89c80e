//! Checks the documented memory bound of the routed index
//! ([`kvgate_core::index::routed::MAX_BYTES_PER_INDEXED_BLOCK`]) with a counting global
//! allocator: live heap bytes of the index divided by its indexed blocks, measured after every
//! recorded prompt once at least `WARMUP_BLOCKS` blocks are indexed (so growth steps of the slab
//! and the hash map, the worst moments, are included).
//!
//! One `#[test]` runs both scenarios in sequence, so no other test thread allocates meanwhile.

use kvgate_core::PodId;
use kvgate_core::index::PrefixIndex;
use kvgate_core::index::routed::{MAX_BYTES_PER_INDEXED_BLOCK, RoutedIndex};
use std::sync::atomic::Ordering;

mod common;
use common::{Counting, LIVE_BYTES};

#[global_allocator]
static GLOBAL: Counting = Counting;

const WARMUP_BLOCKS: usize = 4_096;
const BLOCKS_PER_PROMPT: u64 = 20;

struct Measured {
    final_bytes_per_block: f64,
    worst_bytes_per_block: f64,
}

/// Records `distinct_blocks` distinct blocks, as prompts of 20, into each of `pods` (each with
/// `capacity_blocks`), measuring live bytes of the index per indexed block after every prompt.
fn measure(distinct_blocks: u64, pods: u32, capacity_blocks: u32) -> Measured {
    // Prompt buffer allocated before the baseline so it is not counted.
    let mut prompt: Vec<u64> = Vec::with_capacity(BLOCKS_PER_PROMPT as usize);
    let baseline = LIVE_BYTES.load(Ordering::Relaxed);
    let mut index = RoutedIndex::new();
    for p in 0..pods {
        index.set_capacity(PodId(p), capacity_blocks);
    }
    let mut worst: f64 = 0.0;
    let mut start = 0;
    while start < distinct_blocks {
        prompt.clear();
        // Spread the hashes like real xxh3 output rather than 0, 1, 2, ….
        prompt.extend(
            (start..(start + BLOCKS_PER_PROMPT).min(distinct_blocks))
                .map(|b| b.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        );
        for p in 0..pods {
            index.record_routed(PodId(p), &prompt);
        }
        start += BLOCKS_PER_PROMPT;
        let indexed = index.indexed_blocks();
        if indexed >= WARMUP_BLOCKS {
            let live = LIVE_BYTES.load(Ordering::Relaxed) - baseline;
            worst = worst.max(live as f64 / indexed as f64);
        }
    }
    let held = distinct_blocks.min(capacity_blocks as u64) as usize;
    assert_eq!(index.indexed_blocks(), held * pods as usize);
    let live = LIVE_BYTES.load(Ordering::Relaxed) - baseline;
    let measured = Measured {
        final_bytes_per_block: live as f64 / index.indexed_blocks() as f64,
        worst_bytes_per_block: worst,
    };
    drop(index);
    measured
}

#[test]
fn routed_index_stays_within_documented_bytes_per_indexed_block() {
    let one_pod = measure(200_000, 1, 200_000);
    println!(
        "200,000 distinct blocks in 1 pod: {:.1} bytes/block at the end, {:.1} worst step",
        one_pod.final_bytes_per_block, one_pod.worst_bytes_per_block
    );
    let two_pods = measure(100_000, 2, 100_000);
    println!(
        "100,000 blocks shared by 2 pods: {:.1} bytes/indexed block at the end, {:.1} worst step",
        two_pods.final_bytes_per_block, two_pods.worst_bytes_per_block
    );
    let evicting = measure(200_000, 1, 50_000);
    println!(
        "200,000 blocks through 1 pod of 50,000: {:.1} bytes/block at the end, {:.1} worst step",
        evicting.final_bytes_per_block, evicting.worst_bytes_per_block
    );
    let four_pods = measure(25_000, 4, 25_000);
    println!(
        "25,000 blocks shared by 4 pods: {:.1} bytes/indexed block at the end, {:.1} worst step",
        four_pods.final_bytes_per_block, four_pods.worst_bytes_per_block
    );
    let bound = MAX_BYTES_PER_INDEXED_BLOCK as f64;
    assert!(
        one_pod.worst_bytes_per_block <= bound,
        "one pod exceeds {bound}"
    );
    assert!(
        two_pods.worst_bytes_per_block <= bound,
        "two pods exceed {bound}"
    );
    assert!(
        four_pods.worst_bytes_per_block <= bound,
        "four pods exceed {bound}"
    );
    assert!(
        evicting.worst_bytes_per_block <= bound,
        "evicting pod exceeds {bound}"
    );
    // A block held by one pod can never be cheaper than its slab node + map entry.
    assert!(one_pod.final_bytes_per_block >= 16.0 + 24.0);
}
