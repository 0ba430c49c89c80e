//! The routed path's core work for one ~400,000-character chat body, for instruction counts.
//!
//! `cargo run --release -p kvgate-core --example body_cost [-- REQUESTS [MODE]]` (default 200
//! requests, mode `in-place`), or under callgrind, counting only the measured loop (the warm-up
//! and setup are not counted):
//!
//! ```sh
//! valgrind --tool=callgrind --toggle-collect='body_cost::measure' \
//!   target/release/examples/body_cost 200 in-place
//! ```
//!
//! MODE `in-place`: the prompt hashed where it lies ([`BlockHasher::hash_value`], what the
//! gateway does); `render`: parsed with its rendering, then the rendering hashed
//! ([`parse_request_value`] and [`BlockHasher::hash_request`], what it did before).
//!
//! What one request costs in `kvgate serve` (default config, routed index) between reading its
//! body and choosing a pod, minus the decision's scoring: decode the body
//! (`serde_json::from_slice` into a `Value`, as `routing::prepare` does), read the request and
//! cut its prompt into block hashes (MODE), then
//! match and record the blocks in a routed index at steady state. The bodies are
//! `bench/cost.sh`'s 400k body: a shared ~350,000-character system prompt and a ~50,000-character
//! user message that starts with the request's number, so each request adds ~780 new blocks
//! to an index of 4 pods of 100,000 blocks each (full after the warm-up, so each request also
//! evicts ~780). Prints the requests measured and a checksum of the blocks (equal before and
//! after a change that must not change the hashes).

use kvgate_core::PodId;
use kvgate_core::blocks::{BlockHash, BlockHasher};
use kvgate_core::index::PrefixIndex;
use kvgate_core::index::routed::RoutedIndex;
use kvgate_core::request::parse_request_value;
use std::hint::black_box;

const PODS: u32 = 4;
const POD_CAPACITY_BLOCKS: u32 = 100_000;
const WARM_UP_REQUESTS: usize = 600;

/// `bench/cost.sh`'s text: words from a fixed list, drawn by a 64-bit LCG, a newline every 40.
fn text(chars: usize, seed: u64) -> String {
    const WORDS: [&str; 14] = [
        "the", "router", "pod", "cache", "prefix", "token", "block", "engine", "request",
        "latency", "model", "fleet", "gate", "score",
    ];
    let mut words: Vec<&str> = Vec::new();
    let (mut x, mut n) = (seed, 0);
    while n < chars {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let w = WORDS[((x >> 60) % WORDS.len() as u64) as usize];
        words.push(w);
        n += w.len() + 1;
        if words.len().is_multiple_of(40) {
            words.push("\n");
        }
    }
    let mut joined = words.join(" ");
    joined.truncate(chars);
    joined
}

fn bodies(count: usize) -> Vec<Vec<u8>> {
    let system = text(350_000, 1);
    let user = text(50_000, 2);
    (0..count)
        .map(|i| {
            serde_json::to_vec(&serde_json::json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": format!("{i:09} {user}")},
                ],
                "max_tokens": 1,
            }))
            .expect("a JSON value serialises")
        })
        .collect()
}

/// One request's work; returns its number of blocks.
fn request(
    index: &mut RoutedIndex,
    body: &[u8],
    pod: PodId,
    blocks: &mut Vec<BlockHash>,
    in_place: bool,
) -> u64 {
    const PATH: &str = "/v1/chat/completions";
    let hasher = BlockHasher::default();
    let value: serde_json::Value = serde_json::from_slice(body).expect("the body is JSON");
    let parsed = if in_place {
        hasher
            .hash_value(PATH, &value, blocks)
            .expect("a chat request")
    } else {
        let parsed = parse_request_value(PATH, &value).expect("a chat request");
        hasher.hash_request(&parsed, blocks);
        parsed
    };
    black_box(parsed.estimated_input_tokens());
    let mut matched = Vec::new();
    index.match_prefix(blocks, &mut matched);
    black_box(&matched);
    index.record_routed(pod, blocks);
    blocks.iter().fold(0u64, |a, b| a.rotate_left(5) ^ b)
}

/// The counted loop (callgrind's `--toggle-collect`).
#[inline(never)]
fn measure(index: &mut RoutedIndex, bodies: &[Vec<u8>], in_place: bool) -> u64 {
    let mut blocks = Vec::new();
    let mut sum = 0u64;
    for (i, body) in bodies.iter().enumerate() {
        sum ^= request(index, body, PodId(i as u32 % PODS), &mut blocks, in_place);
    }
    sum
}

/// The same loop, not counted.
#[inline(never)]
fn warm_up(index: &mut RoutedIndex, bodies: &[Vec<u8>], in_place: bool) -> u64 {
    let mut blocks = Vec::new();
    let mut sum = 0u64;
    for (i, body) in bodies.iter().enumerate() {
        sum ^= request(index, body, PodId(i as u32 % PODS), &mut blocks, in_place);
    }
    sum
}

fn main() {
    let requests: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("REQUESTS: a number"))
        .unwrap_or(200);
    let in_place = match std::env::args().nth(2).as_deref() {
        None | Some("in-place") => true,
        Some("render") => false,
        Some(other) => panic!("MODE: in-place or render, not {other}"),
    };
    let all = bodies(WARM_UP_REQUESTS + requests);
    let mut index = RoutedIndex::new();
    for pod in 0..PODS {
        index.set_capacity(PodId(pod), POD_CAPACITY_BLOCKS);
    }
    let (warm, measured) = all.split_at(WARM_UP_REQUESTS);
    let warm_sum = warm_up(&mut index, warm, in_place);
    let sum = black_box(measure(&mut index, measured, in_place));
    println!(
        "requests {requests} indexed_blocks {} checksum {:016x}",
        index.indexed_blocks(),
        sum ^ warm_sum
    );
}
