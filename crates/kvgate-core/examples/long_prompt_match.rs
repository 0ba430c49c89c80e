//! The routed index's prefix match on long prompts: bisection (the default on a prefix-closed
//! index) against the block-by-block walk, on the same index in one run.
//!
//! `cargo run --release -p kvgate-core --example long_prompt_match [-- BLOCKS PODS REPS]`
//! (default 6,250 blocks — a ~400,000-character prompt at 16 tokens per block and 4 characters
//! per token —, 8 pods, 2,000 matches). Pod k holds the prompt's first BLOCKS × (k + 1) / PODS
//! blocks (every pod a different length: the bisection's worst case for this many pods), and
//! every pod also holds 4 other conversations of BLOCKS / 4 blocks. Prints the nanoseconds per
//! match of each mode and checks that both give the same answer.

use kvgate_core::PodId;
use kvgate_core::index::PrefixIndex;
use kvgate_core::index::routed::RoutedIndex;
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("BLOCKS PODS REPS: numbers"))
        .collect();
    let blocks = args.first().copied().unwrap_or(6_250);
    let pods = args.get(1).copied().unwrap_or(8).max(1);
    let reps = args.get(2).copied().unwrap_or(2_000);
    let prompt: Vec<u64> = (0..blocks as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let mut bisecting = RoutedIndex::new();
    let mut walking = RoutedIndex::new();
    walking.allow_holes();
    for index in [&mut bisecting, &mut walking] {
        for k in 0..pods {
            let pod = PodId(k as u32);
            index.set_capacity(pod, (blocks * 4) as u32);
            for other in 0..4u64 {
                let conversation: Vec<u64> = (0..(blocks / 4) as u64)
                    .map(|i| ((k as u64 * 4 + other + 1) << 40) | i)
                    .collect();
                index.record_routed(pod, &conversation);
            }
            index.record_routed(pod, &prompt[..blocks * (k + 1) / pods]);
        }
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    bisecting.match_prefix(&prompt, &mut a);
    walking.match_prefix(&prompt, &mut b);
    assert_eq!(a, b, "bisection and walk disagree");
    println!("{blocks} blocks, {pods} pods, matched {a:?}");
    for (name, index) in [
        ("walk", &walking),
        ("bisection", &bisecting),
        ("walk", &walking),
        ("bisection", &bisecting),
    ] {
        let start = Instant::now();
        let mut m = Vec::new();
        for _ in 0..reps {
            index.match_prefix(black_box(&prompt), &mut m);
            black_box(&m);
        }
        let ns = start.elapsed().as_nanos() as f64 / reps as f64;
        println!("{name:>9}: {ns:>10.0} ns per match");
    }
}
