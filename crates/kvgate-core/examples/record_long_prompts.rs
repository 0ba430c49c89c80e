//! The routed index's `record_routed` on long prompts that share a system prompt, as
//! `bench/cost.sh` sends them: every request is the shared system prompt's blocks then blocks of
//! its own, recorded on the pods in turn, each pod's LRU full (so every new block evicts one).
//!
//! `cargo run --release -p kvgate-core --example record_long_prompts [-- BLOCKS PODS CAPACITY
//! REPS]` (default 6,250 blocks — a ~400,000-character prompt at 16 tokens per block and 4
//! characters per token — of which 7/8 shared, 4 pods of 100,000 blocks, `cost_bench pod`'s
//! `num_gpu_blocks`, and 2,000 timed requests after the pods are filled). Prints the
//! nanoseconds per recorded request.

use kvgate_core::PodId;
use kvgate_core::index::PrefixIndex;
use kvgate_core::index::routed::RoutedIndex;
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("BLOCKS PODS CAPACITY REPS: numbers"))
        .collect();
    let blocks = args.first().copied().unwrap_or(6_250);
    let pods = args.get(1).copied().unwrap_or(4).max(1);
    let capacity = args.get(2).copied().unwrap_or(100_000);
    let reps = args.get(3).copied().unwrap_or(2_000);
    let shared = blocks * 7 / 8;
    let mix = |x: u64| x.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    let request = |n: u64| -> Vec<u64> {
        (0..blocks as u64)
            .map(|i| {
                if (i as usize) < shared {
                    mix(i + 1)
                } else {
                    mix((n << 24) | i)
                }
            })
            .collect()
    };
    let mut index = RoutedIndex::new();
    for k in 0..pods {
        index.set_capacity(PodId(k as u32), capacity as u32);
    }
    // Fill every pod's LRU, then time the requests that evict as many blocks as they add.
    let fill = (pods * capacity).div_ceil(blocks - shared) as u64 + pods as u64;
    for n in 0..fill {
        index.record_routed(PodId((n % pods as u64) as u32), &request(n));
    }
    let prompts: Vec<Vec<u64>> = (fill..fill + reps as u64).map(request).collect();
    let start = Instant::now();
    for (n, prompt) in prompts.iter().enumerate() {
        index.record_routed(PodId((n % pods) as u32), prompt);
    }
    let ns = start.elapsed().as_nanos() as f64 / reps as f64;
    println!(
        "{blocks} blocks ({shared} shared), {pods} pods of {capacity}: {ns:.0} ns per record_routed, {} blocks indexed",
        index.indexed_blocks()
    );
}
