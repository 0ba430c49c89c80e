//! Bucketed training samples for the batch-trained models ([`super::gbdt`]), as llm-d's
//! training server keeps them (reference/llmd-predicted-latency.md §2.3).
//!
//! A sample lands in one of 5 × 20 × 4 = 400 buckets by the pod state at dispatch:
//!
//! - queue depth (waiting requests): 0, 1–2, 3–5, 6–10, 11+ (5 levels);
//! - KV usage: 5 % steps (20 levels);
//! - prefix-hit fraction: quarter steps (4 levels).
//!
//! Each bucket is a ring of at most `bucket_capacity` samples (default 64; llm-d keeps 500):
//! when it is full the bucket's oldest sample is dropped. A sliding window per bucket rather than
//! one global window means a regime absent from recent traffic (say, a long queue) is not
//! forgotten. Memory: at most 400 × `bucket_capacity` samples of 80 bytes (≈ 2 MB per class at
//! the default), allocated only as buckets fill.

use super::features::Features;
use std::collections::VecDeque;

/// Buckets per store: queue levels × KV levels × prefix levels.
pub const BUCKETS: usize = QUEUE_LEVELS * KV_LEVELS * PREFIX_LEVELS;
const QUEUE_LEVELS: usize = 5;
const KV_LEVELS: usize = 20;
const PREFIX_LEVELS: usize = 4;

/// One completed request: the features at dispatch and what was observed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Sanitised features.
    pub features: Features,
    /// Observed TTFT, when it was a valid target.
    pub ttft_ms: Option<f64>,
    /// Observed mean TPOT, when there was one.
    pub tpot_ms: Option<f64>,
}

/// The bucketed sample store of one class.
#[derive(Debug, Clone)]
pub struct SampleBuckets {
    buckets: Vec<VecDeque<Sample>>,
    capacity: usize,
    len: usize,
}

impl SampleBuckets {
    /// `capacity` samples per bucket (at least 1).
    pub fn new(capacity: usize) -> Self {
        SampleBuckets {
            buckets: vec![VecDeque::new(); BUCKETS],
            capacity: capacity.max(1),
            len: 0,
        }
    }

    /// The bucket of a sample with these (sanitised) features.
    pub fn bucket_of(f: &Features) -> usize {
        let queue = match f.waiting {
            w if w.is_nan() || w < 1.0 => 0,
            w if w < 3.0 => 1,
            w if w < 6.0 => 2,
            w if w < 11.0 => 3,
            _ => 4,
        };
        let level = |v: f64, levels: usize| {
            let v = if v.is_nan() { 0.0 } else { v.clamp(0.0, 1.0) };
            ((v * levels as f64) as usize).min(levels - 1)
        };
        (queue * KV_LEVELS + level(f.kv_usage, KV_LEVELS)) * PREFIX_LEVELS
            + level(f.prefix_score, PREFIX_LEVELS)
    }

    /// Adds a sample, dropping the oldest of its bucket when the bucket is full.
    pub fn push(&mut self, sample: Sample) {
        let bucket = &mut self.buckets[Self::bucket_of(&sample.features)];
        if bucket.len() >= self.capacity {
            bucket.pop_front();
        } else {
            self.len += 1;
        }
        bucket.push_back(sample);
    }

    /// Samples held (≤ 400 × capacity).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every sample, bucket by bucket, oldest first within a bucket (deterministic order).
    pub fn snapshot(&self) -> Vec<Sample> {
        let mut out = Vec::with_capacity(self.len);
        for bucket in &self.buckets {
            out.extend(bucket.iter().copied());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(waiting: f64, kv_usage: f64, prefix_score: f64, ttft: f64) -> Sample {
        Sample {
            features: Features {
                waiting,
                kv_usage,
                prefix_score,
                ..Features::default()
            },
            ttft_ms: Some(ttft),
            tpot_ms: None,
        }
    }

    #[test]
    fn buckets_split_queue_kv_and_prefix_as_upstream() {
        let b = |w, kv, p| SampleBuckets::bucket_of(&sample(w, kv, p, 1.0).features);
        assert_eq!(b(0.0, 0.0, 0.0), 0);
        assert_eq!(b(0.0, 0.0, 1.0), 3);
        assert_eq!(b(0.0, 0.05, 0.0), 4);
        assert_eq!(b(0.0, 1.0, 0.0), 19 * 4);
        assert_eq!(b(1.0, 0.0, 0.0), 80);
        assert_eq!(b(2.0, 0.0, 0.0), 80);
        assert_eq!(b(3.0, 0.0, 0.0), 160);
        assert_eq!(b(10.0, 0.0, 0.0), 240);
        assert_eq!(b(11.0, 0.0, 0.0), 320);
        assert_eq!(b(1e9, 1.0, 1.0), BUCKETS - 1);
        assert_eq!(b(f64::NAN, f64::NAN, f64::NAN), 0);
    }

    #[test]
    fn each_bucket_keeps_only_its_newest_samples() {
        let mut store = SampleBuckets::new(3);
        for i in 0..10 {
            store.push(sample(0.0, 0.0, 0.0, i as f64));
        }
        store.push(sample(20.0, 0.5, 0.5, 100.0));
        assert_eq!(store.len(), 4);
        let ttfts: Vec<f64> = store.snapshot().iter().filter_map(|s| s.ttft_ms).collect();
        assert_eq!(ttfts, vec![7.0, 8.0, 9.0, 100.0]);
    }

    #[test]
    fn the_store_never_exceeds_buckets_times_capacity() {
        let mut store = SampleBuckets::new(2);
        for i in 0..100_000u32 {
            let x = f64::from(i);
            store.push(sample(x % 13.0, (x * 0.37) % 1.0, (x * 0.11) % 1.0, 1.0));
        }
        assert!(store.len() <= BUCKETS * 2);
        assert_eq!(store.len(), store.snapshot().len());
    }
}
