//! What the live page ([`crate::ui`]) shows over time: decisions per gate branch since start,
//! and a sampled history of the predictor's error and the queues, for:
//!
//! - `/debug/pods`: each pod now: health, breaker, scraped queue and KV use, kvgate's in-flight
//!   ledger, KV-event state and lag, and kvgate's prefix hit rate on it (cached / prompt tokens
//!   routed there since start);
//! - `/debug/branches`: the decisions per gate branch in each sampling interval of the last
//!   minutes, and the totals since start;
//! - `/debug/predictor`: the predictor's accuracy now (overall and per class) and its history;
//! - `/debug/queue`: the admission slots and queue, flow control's queue per band and tenant
//!   now, and their history;
//! - `/debug/decisions` (the decision ring, [`crate::decisions`]) gives the last decisions.
//!
//! History: a sample every [`SAMPLE_INTERVAL`] (5 s, `ui::sample_loop`), the last
//! [`HISTORY_SAMPLES`] (60: 5 minutes) kept. Bound: 60 samples of ≤ [`MAX_BRANCHES`] (16) branch
//! counts and six numbers each (a few KiB); branch names beyond the 16th count as `other`.

use parking_lot::Mutex;
use serde::Serialize;
use std::collections::VecDeque;
use std::time::Duration;

/// How often the history is sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
/// Samples kept: 5 minutes at [`SAMPLE_INTERVAL`].
pub const HISTORY_SAMPLES: usize = 60;
/// Distinct branch names counted one by one (the gate has 4; other policies a few each).
pub const MAX_BRANCHES: usize = 16;

/// One sample of the history.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Milliseconds since the Unix epoch.
    pub t_ms: u64,
    /// Decisions per branch since start (cumulative).
    #[serde(skip)]
    pub branch_totals: Vec<(&'static str, u64)>,
    pub ttft_mape: f64,
    pub tpot_mape: f64,
    pub ttft_p90_coverage: f64,
    pub predictor_samples: u64,
    /// Requests holding a slot of the traffic listener, and waiting for one.
    pub active_requests: usize,
    pub admission_queued: usize,
    /// Requests in flow control's queue.
    pub flow_queued: usize,
}

/// The branch counters and the sampled history (`Shared::live`).
#[derive(Debug, Default)]
pub struct LiveHistory {
    /// Decisions per branch since start; ≤ [`MAX_BRANCHES`] names, then `other`.
    branches: Mutex<Vec<(&'static str, u64)>>,
    samples: Mutex<VecDeque<Sample>>,
}

impl LiveHistory {
    /// Counts one decision of `branch` (one short lock over ≤ 16 entries).
    pub fn count_branch(&self, branch: &'static str) {
        let mut b = self.branches.lock();
        if let Some(e) = b.iter_mut().find(|(n, _)| *n == branch) {
            e.1 += 1;
        } else if b.len() < MAX_BRANCHES {
            b.push((branch, 1));
        } else if let Some(e) = b.iter_mut().find(|(n, _)| *n == "other") {
            e.1 += 1;
        } else if let Some(last) = b.last_mut() {
            // The 16th name gives its place to `other`, which keeps its count.
            *last = ("other", last.1 + 1);
        }
    }

    /// Decisions per branch since start.
    pub fn branch_totals(&self) -> Vec<(&'static str, u64)> {
        self.branches.lock().clone()
    }

    /// Adds a sample, dropping the oldest beyond [`HISTORY_SAMPLES`].
    pub fn push(&self, sample: Sample) {
        let mut s = self.samples.lock();
        if s.len() >= HISTORY_SAMPLES {
            s.pop_front();
        }
        s.push_back(sample);
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names_beyond_sixteen_count_as_other() {
        let live = LiveHistory::default();
        const NAMES: [&str; 20] = [
            "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q",
            "r", "s", "t",
        ];
        for name in NAMES {
            live.count_branch(name);
        }
        live.count_branch("a");
        let totals = live.branch_totals();
        assert_eq!(totals.len(), MAX_BRANCHES);
        assert_eq!(totals[0], ("a", 2));
        // p (the 16th) and q..t (4 more) are `other`.
        assert_eq!(totals[MAX_BRANCHES - 1], ("other", 5));
    }

    #[test]
    fn history_keeps_the_last_sixty_samples() {
        let live = LiveHistory::default();
        for t in 0..100 {
            live.push(Sample {
                t_ms: t,
                branch_totals: vec![],
                ttft_mape: 0.0,
                tpot_mape: 0.0,
                ttft_p90_coverage: 0.0,
                predictor_samples: 0,
                active_requests: 0,
                admission_queued: 0,
                flow_queued: 0,
            });
        }
        let s = live.samples();
        assert_eq!(s.len(), HISTORY_SAMPLES);
        assert_eq!(s[0].t_ms, 40);
        assert_eq!(s[HISTORY_SAMPLES - 1].t_ms, 99);
    }
}
