//! Features known at decision time (DESIGN.md §5) and their engineered, scaled encodings.
//!
//! Every regressor input is scaled to an O(1) range on a busy pod, so that one ridge prior
//! (`ridge_delta`) means roughly the same thing for every weight and the RLS update stays well
//! conditioned:
//!
//! | feature                         | scaling            | TTFT idx | TPOT idx |
//! |---------------------------------|--------------------|----------|----------|
//! | bias                            | 1                  | 0        | 0        |
//! | uncached prompt tokens          | ÷ 1000             | 1        | –        |
//! | prefill tokens in flight        | ÷ 1000             | 2        | 4        |
//! | waiting requests                | ÷ 10               | 3        | 5        |
//! | running requests                | ÷ 100              | 4        | 1        |
//! | KV usage                        | 0..=1 as is        | 5        | 3        |
//! | decode tokens in flight         | ÷ 10 000           | 6        | 2        |
//! | uncached tokens × (waiting > 0) | ÷ 1000             | 7        | –        |
//! | input tokens                    | ÷ 1000             | 8        | –        |
//! | KV shortfall tokens             | ÷ 1000             | 9        | –        |
//!
//! KV shortfall = max(0, prefill tokens in flight + this request's uncached tokens − free KV
//! tokens), free = (1 − KV usage) × KV capacity: how many tokens of KV this request and the
//! prefills queued before it need beyond what the pod has free. When it is positive the request
//! waits for running requests to finish before it is admitted — memory pressure that queue
//! lengths alone do not show (`dynamo-kv`'s cost sees it through active blocks). 0 when the
//! pod's capacity is unknown.
//!
//! The interaction term lets a queued pod charge the request's own prefill differently from an
//! idle one (llm-d's `is_queued` split, reference/llmd-predicted-latency.md §2.1–2.2).
//!
//! Raw inputs are sanitised before encoding: non-finite values become 0, negatives 0, shares
//! (KV usage, prefix score) are clamped to 0..=1, counts to ≤ 10⁶ requests and token totals to
//! ≤ 10⁹ tokens, so an encoded vector is always finite and bounded.

use crate::pod::PodSnapshot;

/// Number of TTFT regressor inputs (see the module table).
pub const TTFT_DIM: usize = 10;
/// Number of TPOT regressor inputs (see the module table).
pub const TPOT_DIM: usize = 6;

pub const PROMPT_TOKENS_SCALE: f64 = 1000.0;
pub const DECODE_TOKENS_SCALE: f64 = 10_000.0;
pub const WAITING_SCALE: f64 = 10.0;
pub const RUNNING_SCALE: f64 = 100.0;

/// Tokens per KV block assumed when turning a pod's KV blocks into tokens, when the pod did not
/// report its own block size (vLLM's CUDA default).
pub const KV_BLOCK_TOKENS: f64 = 16.0;

/// Upper bound on request counts after sanitising.
const MAX_REQUESTS: f64 = 1e6;
/// Upper bound on token totals after sanitising.
const MAX_TOKENS: f64 = 1e9;

// Indices of the TTFT and TPOT vectors (used by the analytic prior).
pub(crate) const TTFT_BIAS: usize = 0;
pub(crate) const TTFT_UNCACHED: usize = 1;
pub(crate) const TTFT_PREFILL_IN_FLIGHT: usize = 2;
pub(crate) const TPOT_BIAS: usize = 0;
pub(crate) const TPOT_RUNNING: usize = 1;
pub(crate) const TPOT_DECODE_IN_FLIGHT: usize = 2;

/// Features known at decision time (DESIGN.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Features {
    pub kv_usage: f64,
    pub waiting: f64,
    pub running: f64,
    /// Uncached prompt tokens dispatched to the pod that have not produced a first token.
    pub prefill_tokens_in_flight: f64,
    pub decode_tokens_in_flight: f64,
    pub input_tokens: f64,
    pub prefix_score: f64,
    /// KV capacity of the pod in tokens (KV blocks × 16); 0 when unknown.
    pub kv_capacity_tokens: f64,
}

impl Features {
    pub fn new(pod: &PodSnapshot, input_tokens: u32, prefix_score: f64) -> Self {
        Features {
            kv_usage: pod.kv_usage,
            waiting: pod.waiting as f64,
            running: pod.running as f64,
            prefill_tokens_in_flight: pod.in_flight.prefill_tokens as f64,
            decode_tokens_in_flight: pod.in_flight.decode_tokens as f64,
            input_tokens: input_tokens as f64,
            prefix_score,
            // `kv_blocks` counts the pod's own blocks (`num_gpu_blocks`): 128 tokens each on a
            // vLLM CPU pod, not 16.
            kv_capacity_tokens: f64::from(pod.kv_blocks)
                * pod.block_size_tokens.map_or(KV_BLOCK_TOKENS, f64::from),
        }
    }

    /// Tokens of KV the queued prefills and this request need beyond the pod's free KV.
    pub fn kv_shortfall_tokens(&self) -> f64 {
        if self.kv_capacity_tokens <= 0.0 {
            return 0.0;
        }
        let free = (1.0 - self.kv_usage.clamp(0.0, 1.0)) * self.kv_capacity_tokens;
        (self.prefill_tokens_in_flight + self.uncached_prompt_tokens() - free).max(0.0)
    }

    /// (1 − prefix score) × input tokens.
    pub fn uncached_prompt_tokens(&self) -> f64 {
        (1.0 - self.prefix_score).clamp(0.0, 1.0) * self.input_tokens
    }

    /// True when every field is a finite number (training rejects samples that are not).
    pub fn is_finite(&self) -> bool {
        [
            self.kv_usage,
            self.waiting,
            self.running,
            self.prefill_tokens_in_flight,
            self.decode_tokens_in_flight,
            self.input_tokens,
            self.prefix_score,
            self.kv_capacity_tokens,
        ]
        .iter()
        .all(|v| v.is_finite())
    }

    /// The same features with every field finite and inside its documented range.
    pub fn sanitized(&self) -> Features {
        fn bounded(v: f64, max: f64) -> f64 {
            if v.is_nan() { 0.0 } else { v.clamp(0.0, max) }
        }
        Features {
            kv_usage: bounded(self.kv_usage, 1.0),
            waiting: bounded(self.waiting, MAX_REQUESTS),
            running: bounded(self.running, MAX_REQUESTS),
            prefill_tokens_in_flight: bounded(self.prefill_tokens_in_flight, MAX_TOKENS),
            decode_tokens_in_flight: bounded(self.decode_tokens_in_flight, MAX_TOKENS),
            input_tokens: bounded(self.input_tokens, MAX_TOKENS),
            prefix_score: bounded(self.prefix_score, 1.0),
            kv_capacity_tokens: bounded(self.kv_capacity_tokens, MAX_TOKENS),
        }
    }

    /// TTFT regressor input; expects sanitised features.
    pub fn ttft_vector(&self) -> [f64; TTFT_DIM] {
        let uncached = self.uncached_prompt_tokens() / PROMPT_TOKENS_SCALE;
        let queued = if self.waiting > 0.0 { 1.0 } else { 0.0 };
        [
            1.0,
            uncached,
            self.prefill_tokens_in_flight / PROMPT_TOKENS_SCALE,
            self.waiting / WAITING_SCALE,
            self.running / RUNNING_SCALE,
            self.kv_usage,
            self.decode_tokens_in_flight / DECODE_TOKENS_SCALE,
            uncached * queued,
            self.input_tokens / PROMPT_TOKENS_SCALE,
            self.kv_shortfall_tokens() / PROMPT_TOKENS_SCALE,
        ]
    }

    /// TPOT regressor input; expects sanitised features.
    pub fn tpot_vector(&self) -> [f64; TPOT_DIM] {
        [
            1.0,
            self.running / RUNNING_SCALE,
            self.decode_tokens_in_flight / DECODE_TOKENS_SCALE,
            self.kv_usage,
            self.prefill_tokens_in_flight / PROMPT_TOKENS_SCALE,
            self.waiting / WAITING_SCALE,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_capacity_counts_the_pods_own_block_size() {
        let mut pod = crate::PodSnapshot::idle(0, "c", 4_096);
        assert_eq!(Features::new(&pod, 100, 0.0).kv_capacity_tokens, 65_536.0);
        pod.block_size_tokens = Some(128);
        assert_eq!(Features::new(&pod, 100, 0.0).kv_capacity_tokens, 524_288.0);
    }

    #[test]
    fn sanitized_maps_nan_negative_and_huge_values_into_range() {
        let f = Features {
            kv_usage: f64::NAN,
            waiting: -3.0,
            running: f64::INFINITY,
            prefill_tokens_in_flight: 1e300,
            decode_tokens_in_flight: f64::NEG_INFINITY,
            input_tokens: 100.0,
            prefix_score: 2.0,
            kv_capacity_tokens: -1.0,
        }
        .sanitized();
        assert_eq!(
            f,
            Features {
                kv_usage: 0.0,
                waiting: 0.0,
                running: MAX_REQUESTS,
                prefill_tokens_in_flight: MAX_TOKENS,
                decode_tokens_in_flight: 0.0,
                input_tokens: 100.0,
                prefix_score: 1.0,
                kv_capacity_tokens: 0.0,
            }
        );
    }

    #[test]
    fn ttft_vector_scales_and_sets_the_queued_interaction() {
        let f = Features {
            kv_usage: 0.5,
            waiting: 2.0,
            running: 50.0,
            prefill_tokens_in_flight: 3000.0,
            decode_tokens_in_flight: 20_000.0,
            input_tokens: 4000.0,
            prefix_score: 0.25,
            // Free: 0.5 × 10 000 = 5000; needed: 3000 + 3000 → shortfall 1000.
            kv_capacity_tokens: 10_000.0,
        };
        assert_eq!(
            f.ttft_vector(),
            [1.0, 3.0, 3.0, 0.2, 0.5, 0.5, 2.0, 3.0, 4.0, 1.0]
        );
        let unknown_capacity = Features {
            kv_capacity_tokens: 0.0,
            ..f
        };
        assert_eq!(unknown_capacity.ttft_vector()[9], 0.0);
        let roomy = Features {
            kv_capacity_tokens: 1e6,
            ..f
        };
        assert_eq!(roomy.ttft_vector()[9], 0.0);
        let idle = Features { waiting: 0.0, ..f };
        assert_eq!(idle.ttft_vector()[7], 0.0);
        assert_eq!(f.tpot_vector(), [1.0, 0.5, 2.0, 0.5, 3.0, 0.2]);
    }
}
