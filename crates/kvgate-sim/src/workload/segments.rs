//! Prompts as segments → chained hashes of their full 16-token blocks.
//!
//! Workloads carry no token ids. A prompt is a list of [`Segment`]s (a system prompt, a user turn,
//! an answer, a 512-token Mooncake block), each with a unique `id` and a length in tokens; the
//! token at offset `o` of segment `id` is, conceptually, a function of `(id, o)`. Two prompts
//! whose first `K` tokens come from the same segments at the same offsets therefore have equal
//! first `K` tokens, and share exactly `K / 16` leading block hashes (and no more, unless the next
//! tokens also come from the same segment offsets).
//!
//! A block is hashed from the *runs* of segments it covers — `(id, start offset, length)` for each
//! piece of a segment inside the block, at most 16 of them — chained with the previous block's
//! hash (the first block is chained with [`CHAIN_SEED`]). A block that straddles two segments
//! hashes pieces of both. No per-token work or allocation: a block inside one segment costs one
//! 16-byte xxh3.

use kvgate_core::BlockHash;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::SIM_BLOCK_SIZE_TOKENS;

/// Seed of the hash chain (the "parent" of a prompt's first block). Arbitrary but fixed.
pub const CHAIN_SEED: u64 = 0x6b76_6761_7465_5f30; // "kvgate_0"

/// A run of prompt tokens with one identity: token `o` of the run is a function of `(id, o)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Identity of the content; equal ids mean equal tokens at equal offsets.
    pub id: u64,
    /// Length in tokens.
    pub tokens: u32,
}

impl Segment {
    pub fn new(id: u64, tokens: u32) -> Self {
        Self { id, tokens }
    }
}

/// Mixes a namespace and two indices into a segment id (splitmix64-style finalizer), so that
/// generators can name segments (`tenant 3's system prompt`, `session 17's turn 2 answer`)
/// without a shared counter.
pub fn segment_id(namespace: u64, a: u64, b: u64) -> u64 {
    let mut z = namespace
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(a)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9)
        .wrapping_add(b);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const BLOCK: u32 = SIM_BLOCK_SIZE_TOKENS;
const RUN_BYTES: usize = 16;

/// Appends to `out` the chained hashes of the full 16-token blocks of the prompt made of
/// `segments` (in order). A trailing partial block is not hashed. Zero-length segments are
/// ignored.
pub fn append_prompt_blocks(segments: &[Segment], out: &mut Vec<BlockHash>) {
    let total: u64 = segments.iter().map(|s| u64::from(s.tokens)).sum();
    out.reserve((total / u64::from(BLOCK)) as usize);

    let mut prev = CHAIN_SEED;
    // The runs of the block being filled, encoded as (id, offset, len) little-endian.
    let mut buf = [0u8; RUN_BYTES * BLOCK as usize];
    let mut runs = 0usize;
    let mut filled = 0u32;

    for seg in segments {
        let mut offset = 0u32;
        while offset < seg.tokens {
            let left = seg.tokens - offset;
            if filled == 0 && left >= BLOCK {
                // Fast path: whole blocks inside this segment.
                for _ in 0..left / BLOCK {
                    let mut run = [0u8; RUN_BYTES];
                    encode_run(&mut run, seg.id, offset, BLOCK);
                    prev = xxh3_64_with_seed(&run, prev);
                    out.push(prev);
                    offset += BLOCK;
                }
                continue;
            }
            let take = left.min(BLOCK - filled);
            let start = runs * RUN_BYTES;
            encode_run(&mut buf[start..start + RUN_BYTES], seg.id, offset, take);
            runs += 1;
            filled += take;
            offset += take;
            if filled == BLOCK {
                prev = xxh3_64_with_seed(&buf[..runs * RUN_BYTES], prev);
                out.push(prev);
                runs = 0;
                filled = 0;
            }
        }
    }
}

/// The chained block hashes of a prompt made of `segments` (see [`append_prompt_blocks`]).
pub fn prompt_blocks(segments: &[Segment]) -> Vec<BlockHash> {
    let mut out = Vec::new();
    append_prompt_blocks(segments, &mut out);
    out
}

/// Total length in tokens of a list of segments, saturating at `u32::MAX`.
pub fn segments_tokens(segments: &[Segment]) -> u32 {
    let total: u64 = segments.iter().map(|s| u64::from(s.tokens)).sum();
    u32::try_from(total).unwrap_or(u32::MAX)
}

fn encode_run(dst: &mut [u8], id: u64, offset: u32, len: u32) {
    dst[0..8].copy_from_slice(&id.to_le_bytes());
    dst[8..12].copy_from_slice(&offset.to_le_bytes());
    dst[12..16].copy_from_slice(&len.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(id: u64, tokens: u32) -> Segment {
        Segment::new(id, tokens)
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        assert_eq!(prompt_blocks(&[seg(1, 15)]).len(), 0);
        assert_eq!(prompt_blocks(&[seg(1, 16)]).len(), 1);
        assert_eq!(
            prompt_blocks(&[seg(1, 10), seg(2, 10), seg(3, 13)]).len(),
            2
        );
        assert_eq!(prompt_blocks(&[seg(1, 0), seg(2, 0)]).len(), 0);
    }

    #[test]
    fn block_split_across_segments_equals_nothing_else() {
        // Same total length, different segment layout ⇒ different first block.
        let a = prompt_blocks(&[seg(1, 8), seg(2, 8)]);
        let b = prompt_blocks(&[seg(1, 16)]);
        let c = prompt_blocks(&[seg(1, 8), seg(3, 8)]);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, prompt_blocks(&[seg(1, 8), seg(2, 8), seg(9, 3)]));
    }

    #[test]
    fn shared_first_k_tokens_share_exactly_k_div_16_blocks() {
        // Prompt 1: sys(100) + user(50). Prompt 2: sys(100) + other(70). They share 100 tokens
        // ⇒ 6 full blocks (96 tokens); block 7 (tokens 96..112) mixes sys with the divergent part.
        let p1 = prompt_blocks(&[seg(7, 100), seg(8, 50)]);
        let p2 = prompt_blocks(&[seg(7, 100), seg(9, 70)]);
        let shared = p1.iter().zip(&p2).take_while(|(a, b)| a == b).count();
        assert_eq!(shared, 6);
        // A truncated segment shares exactly its full blocks too.
        let p3 = prompt_blocks(&[seg(7, 40), seg(10, 40)]);
        let shared = p1.iter().zip(&p3).take_while(|(a, b)| a == b).count();
        assert_eq!(shared, 2);
    }

    #[test]
    fn chaining_makes_equal_blocks_after_a_divergence_differ() {
        let p1 = prompt_blocks(&[seg(1, 16), seg(5, 32)]);
        let p2 = prompt_blocks(&[seg(2, 16), seg(5, 32)]);
        assert_ne!(p1[1], p2[1]);
        assert_ne!(p1[2], p2[2]);
    }

    #[test]
    fn segment_ids_differ_across_namespaces_and_indices() {
        assert_ne!(segment_id(1, 0, 0), segment_id(2, 0, 0));
        assert_ne!(segment_id(1, 0, 1), segment_id(1, 1, 0));
        assert_eq!(segment_id(3, 4, 5), segment_id(3, 4, 5));
    }
}
