//! Prefix popularity: about how many recent requests carried a given prompt block.
//!
//! Tells a shared system prompt from a conversation's own history before the prompt has spread
//! over the fleet: the deepest block of a prompt that some pod already holds was carried by many
//! recent requests when it ends a shared system prompt, by one or two when it ends the history
//! of one conversation (each turn carries the previous turn's prompt once). The affinity gate's
//! shared-prefix exploration (`shared_prefix_epsilon`) reads it.
//!
//! ```text
//! counted blocks: every STRIDE-th block of a prompt (block i with (i + 1) % STRIDE == 0)
//! record(prompt):  for each counted block b: raise, among its ROWS counters, those at the
//!                  minimum by 1 (conservative update; saturating at u16::MAX)
//! count(b):        min over b's ROWS counters (never below the true count since the last
//!                  halving; above it only by collisions)
//! every HALVE_AFTER increments: every counter is halved (the count follows recent traffic)
//! query(prompt, deepest matched k): count of the last counted block within the first k
//! ```
//!
//! A count-min sketch, so memory is fixed whatever the traffic: ROWS × WIDTH u16 counters =
//! 4 × 16,384 × 2 B = 128 KiB. With at most 2 × HALVE_AFTER = 16,384 increments held (the
//! halving keeps the total there), the average counter holds ≤ 1, so a collision alone
//! rarely reaches the gate's threshold of 8 on all four rows. Deterministic (no clock, no RNG):
//! "recent" is counted in increments, not time. Block hashes are already well mixed (chained
//! hashes), so a row's slot is taken from 14 of its bits after a per-row multiply.

use crate::blocks::BlockHash;

/// Counter rows (independent slots per block).
const ROWS: usize = 4;
/// Counters per row (a power of two).
const WIDTH: usize = 1 << 14;
/// Every STRIDE-th block is counted: a shared prefix is tens of blocks long, and counting a
/// quarter of them keeps the sketch's load low.
pub const STRIDE: usize = 4;
/// Increments between two halvings of every counter.
const HALVE_AFTER: u32 = 8192;
/// Odd multipliers that decorrelate the rows' slots.
const ROW_MIX: [u64; ROWS] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x85EB_CA77_C2B2_AE63,
];

/// The sketch (module docs).
#[derive(Debug, Clone)]
pub struct PrefixPopularity {
    counters: Vec<u16>,
    since_halving: u32,
}

impl Default for PrefixPopularity {
    fn default() -> Self {
        PrefixPopularity {
            counters: vec![0; ROWS * WIDTH],
            since_halving: 0,
        }
    }
}

impl PrefixPopularity {
    fn slots(block: BlockHash) -> [usize; ROWS] {
        std::array::from_fn(|r| {
            let mixed = block.wrapping_mul(ROW_MIX[r]);
            r * WIDTH + (mixed >> (64 - WIDTH.trailing_zeros())) as usize
        })
    }

    /// The block's count: the least of its counters.
    fn min_of(&self, slots: &[usize; ROWS]) -> u16 {
        slots.iter().map(|&s| self.counters[s]).min().unwrap_or(0)
    }

    /// Counts one request carrying `blocks` (its counted blocks, once each).
    pub fn record(&mut self, blocks: &[BlockHash]) {
        for &block in blocks.iter().skip(STRIDE - 1).step_by(STRIDE) {
            let slots = Self::slots(block);
            let min = self.min_of(&slots);
            for s in slots {
                if self.counters[s] == min {
                    self.counters[s] = min.saturating_add(1);
                }
            }
            self.since_halving += 1;
            if self.since_halving >= HALVE_AFTER {
                self.since_halving = 0;
                for c in &mut self.counters {
                    *c >>= 1;
                }
            }
        }
    }

    /// About how many recent requests carried the prompt's first `matched_blocks` blocks: the
    /// count of the last counted block among them (0 when they hold no counted block).
    pub fn sharers(&self, blocks: &[BlockHash], matched_blocks: usize) -> u32 {
        let k = matched_blocks.min(blocks.len()) / STRIDE * STRIDE;
        if k == 0 {
            return 0;
        }
        u32::from(self.min_of(&Self::slots(blocks[k - 1])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt of `shared` blocks common to a group, then `own` blocks of its own.
    fn prompt(group: u64, shared: usize, request: u64, own: usize) -> Vec<BlockHash> {
        let mut h = group.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
        let mut out = Vec::new();
        for i in 0..shared + own {
            if i == shared {
                h ^= request.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            }
            h = h.rotate_left(17).wrapping_mul(0xFF51_AFD7_ED55_8CCD) ^ i as u64;
            out.push(h);
        }
        out
    }

    #[test]
    fn a_shared_system_prompt_counts_its_requests_a_conversation_counts_its_turns() {
        let mut p = PrefixPopularity::default();
        for r in 0..50 {
            p.record(&prompt(1, 64, r, 4));
        }
        // A conversation: each turn carries the previous prompt plus 8 new blocks.
        let mut conversation = prompt(2, 64, 7, 8);
        p.record(&conversation);
        let previous_len = conversation.len();
        conversation.extend(prompt(3, 0, 9, 8));
        // The deepest matched block of the next turn ends the previous turn's prompt.
        assert_eq!(p.sharers(&conversation, previous_len), 1);
        // A new request of group 1: its system prompt was carried by the 50 requests.
        assert_eq!(p.sharers(&prompt(1, 64, 99, 4), 64), 50);
        // Matched blocks are rounded down to a counted block; below the stride nothing counts.
        assert_eq!(p.sharers(&prompt(1, 64, 99, 4), 66), 50);
        assert_eq!(p.sharers(&prompt(1, 64, 99, 4), STRIDE - 1), 0);
        assert_eq!(p.sharers(&[], 10), 0);
    }

    #[test]
    fn counts_halve_so_they_follow_recent_traffic() {
        let mut p = PrefixPopularity::default();
        let hot = prompt(1, 64, 0, 0);
        for _ in 0..40 {
            p.record(&hot);
        }
        assert_eq!(p.sharers(&hot, 64), 40);
        // 16 counted blocks per request: 512 requests of other traffic cross one halving.
        for r in 0..(HALVE_AFTER as u64 / 16) {
            p.record(&prompt(5 + r, 64, r, 0));
        }
        assert_eq!(p.sharers(&hot, 64), 20);
    }

    #[test]
    fn unrelated_traffic_rarely_looks_shared() {
        let mut p = PrefixPopularity::default();
        // 2,000 distinct requests of 64 blocks each: 64,000 increments, 7 halvings.
        for r in 0..2000 {
            p.record(&prompt(100 + r, 64, r, 0));
        }
        let looks_shared = (0..2000)
            .filter(|r| p.sharers(&prompt(100_000 + r, 64, *r, 0), 64) >= 8)
            .count();
        assert_eq!(looks_shared, 0);
    }
}
