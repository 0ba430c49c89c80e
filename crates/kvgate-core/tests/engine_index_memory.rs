//! Checks the documented memory bound of the engine index
//! ([`kvgate_core::index::engine::MAX_BYTES_PER_ENGINE_BLOCK`]) with a counting global
//! allocator: live heap bytes of the index per indexed block, after every applied
//! `BlockStored` (20 blocks of 16 tokens, chained to the previous event half of the time) once
//! at least 4,096 blocks are indexed, then again after removals. Also prints the ingestion rate
//! (`cargo test --release -p kvgate-core --test engine_index_memory -- --nocapture`).

use kvgate_core::PodId;
use kvgate_core::index::PrefixIndex;
use kvgate_core::index::engine::{EngineIndex, KvEvent, MAX_BYTES_PER_ENGINE_BLOCK};
use std::sync::atomic::Ordering;
use std::time::Instant;

mod common;
use common::{Counting, LIVE_BYTES};

#[global_allocator]
static GLOBAL: Counting = Counting;

const BLOCKS_PER_EVENT: u64 = 20;
const BLOCK_TOKENS: u32 = 16;

fn stored(first: u64, parent: Option<u64>) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: (first..first + BLOCKS_PER_EVENT)
            .map(|h| h.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect(),
        parent_block_hash: parent.map(|h| h.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        token_ids: (0..(BLOCKS_PER_EVENT as u32 * BLOCK_TOKENS))
            .map(|t| t ^ first as u32)
            .collect(),
        block_size: BLOCK_TOKENS,
        lora_name: None,
        medium: Some("GPU".into()),
    }
}

#[test]
fn engine_index_stays_within_documented_bytes_per_indexed_block() {
    const BLOCKS: u64 = 200_000;
    let baseline = LIVE_BYTES.load(Ordering::Relaxed);
    let mut index = EngineIndex::new();
    index.add_pod(PodId(0), "model");
    index.set_capacity(PodId(0), BLOCKS as u32);
    let mut worst: f64 = 0.0;
    let mut applied_blocks = 0u64;
    let mut elapsed = std::time::Duration::ZERO;
    let mut first = 0;
    while first < BLOCKS {
        // Half the events continue the previous one's chain, half start a sequence.
        let parent = (first > 0 && (first / BLOCKS_PER_EVENT) % 2 == 1).then(|| first - 1);
        let event = stored(first, parent);
        let t = Instant::now();
        index.apply(PodId(0), &event);
        elapsed += t.elapsed();
        drop(event);
        applied_blocks += BLOCKS_PER_EVENT;
        first += BLOCKS_PER_EVENT;
        let indexed = index.indexed_blocks();
        if indexed >= 4_096 {
            let live = (LIVE_BYTES.load(Ordering::Relaxed) - baseline) as f64;
            worst = worst.max(live / indexed as f64);
        }
    }
    assert_eq!(index.indexed_blocks(), BLOCKS as usize);
    let at_end = (LIVE_BYTES.load(Ordering::Relaxed) - baseline) as f64 / BLOCKS as f64;
    println!(
        "engine index: {at_end:.1} bytes/block at the end, {worst:.1} worst; \
         ingestion {:.0} blocks/s ({:.0} BlockStored events of {BLOCKS_PER_EVENT} blocks/s) on one core",
        applied_blocks as f64 / elapsed.as_secs_f64(),
        (applied_blocks / BLOCKS_PER_EVENT) as f64 / elapsed.as_secs_f64(),
    );
    assert!(
        worst <= MAX_BYTES_PER_ENGINE_BLOCK as f64,
        "worst {worst:.1} bytes per block > {MAX_BYTES_PER_ENGINE_BLOCK}"
    );
    // Removing half the blocks frees their entries.
    let t = Instant::now();
    for h in 0..BLOCKS / 2 {
        index.apply(
            PodId(0),
            &KvEvent::BlockRemoved {
                block_hashes: vec![h.wrapping_mul(0x9E37_79B9_7F4A_7C15)],
                medium: None,
            },
        );
    }
    println!(
        "engine index: {:.0} single-block BlockRemoved events/s",
        (BLOCKS / 2) as f64 / t.elapsed().as_secs_f64()
    );
    assert_eq!(index.indexed_blocks(), (BLOCKS / 2) as usize);
    assert_eq!(index.engine_blocks(PodId(0)), (BLOCKS / 2) as usize);
}
