//! Burst generator: groups of sibling requests that share a prefix nobody has seen yet and
//! arrive within a few milliseconds of each other, as parallel tool calls, fan-out agents,
//! n-best sampling and batch jobs send them (issue 43's sibling bursts).
//!
//! Model (all draws from one `ChaCha8Rng` seeded with `seed`):
//! - bursts arrive as a Poisson process of `bursts_per_s` (default 0.4);
//! - a burst has `size_min..=size_max` siblings (uniform; default 3–8, the range);
//! - every burst has its own prefix of `prefix_tokens` tokens (default 1,200), shared by its
//!   siblings and by no other request;
//! - sibling `j` appends a question of its own, `question_tokens` tokens (default 40), and
//!   asks for `output_tokens` (default 16);
//! - the first sibling arrives at the burst's time, the others at uniform offsets within
//!   `window_ms` (default 50) after it, in order.
//!
//! Requests stop at `max_requests` (a burst may be cut short by it). Memory: the requests, one
//! block list each (`(prefix + question) / 16` hashes).

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Exp};
use serde::{Deserialize, Serialize};

use super::segments::{Segment, prompt_blocks, segment_id, segments_tokens};
use super::{MAX_INPUT_TOKENS, Workload, WorkloadError, WorkloadParams, positive, token_count};
use crate::SimRequest;

const NS_PREFIX: u64 = 0x4275_5072; // "BuPr"
const NS_QUESTION: u64 = 0x4275_5175; // "BuQu"

/// Parameters of the burst generator (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BurstParams {
    pub seed: u64,
    pub max_requests: usize,
    pub bursts_per_s: f64,
    pub size_min: u32,
    pub size_max: u32,
    pub prefix_tokens: u32,
    pub question_tokens: u32,
    pub output_tokens: u32,
    pub window_ms: f64,
}

impl Default for BurstParams {
    fn default() -> Self {
        Self {
            seed: 0,
            max_requests: 10_000,
            bursts_per_s: 0.4,
            size_min: 3,
            size_max: 8,
            prefix_tokens: 1_200,
            question_tokens: 40,
            output_tokens: 16,
            window_ms: 50.0,
        }
    }
}

impl BurstParams {
    fn validate(&self) -> Result<(), WorkloadError> {
        positive("bursts_per_s", self.bursts_per_s)?;
        token_count("prefix_tokens", self.prefix_tokens)?;
        token_count("question_tokens", self.question_tokens)?;
        if !(self.window_ms.is_finite() && self.window_ms >= 0.0) {
            return Err(WorkloadError::InvalidParam {
                name: "window_ms",
                reason: format!("must be finite and ≥ 0, got {}", self.window_ms),
            });
        }
        if self.size_min == 0 || self.size_min > self.size_max {
            return Err(WorkloadError::InvalidParam {
                name: "size_min",
                reason: format!(
                    "need 1 ≤ size_min ≤ size_max, got {}..={}",
                    self.size_min, self.size_max
                ),
            });
        }
        if self.output_tokens == 0 {
            return Err(WorkloadError::InvalidParam {
                name: "output_tokens",
                reason: "must be ≥ 1".to_owned(),
            });
        }
        if u64::from(self.prefix_tokens) + u64::from(self.question_tokens)
            > u64::from(MAX_INPUT_TOKENS)
        {
            return Err(WorkloadError::InvalidParam {
                name: "prefix_tokens",
                reason: format!("prefix + question exceeds {MAX_INPUT_TOKENS} tokens"),
            });
        }
        Ok(())
    }
}

/// Generates a burst workload; requests are in arrival order with ids 0, 1, 2, ….
pub fn generate(params: &BurstParams) -> Result<(Workload, Vec<SimRequest>), WorkloadError> {
    params.validate()?;
    let p = params;
    let gap = Exp::new(p.bursts_per_s / 1000.0).map_err(|e| WorkloadError::InvalidParam {
        name: "bursts_per_s",
        reason: e.to_string(),
    })?;
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let mut requests: Vec<SimRequest> = Vec::with_capacity(p.max_requests.min(1 << 20));
    let mut burst_ms = 0.0;
    let mut burst = 0u64;
    while requests.len() < p.max_requests {
        if burst > 0 {
            burst_ms += gap.sample(&mut rng);
        }
        let size = rng.random_range(p.size_min..=p.size_max);
        let mut offsets: Vec<f64> = (1..size)
            .map(|_| rng.random::<f64>() * p.window_ms)
            .collect();
        offsets.sort_by(f64::total_cmp);
        offsets.insert(0, 0.0);
        let prefix = Segment::new(segment_id(NS_PREFIX, p.seed, burst), p.prefix_tokens);
        for (j, offset) in offsets.into_iter().enumerate() {
            if requests.len() >= p.max_requests {
                break;
            }
            let segments = [
                prefix,
                Segment::new(segment_id(NS_QUESTION, burst, j as u64), p.question_tokens),
            ];
            requests.push(SimRequest {
                id: requests.len() as u64,
                arrival_ms: burst_ms + offset,
                input_tokens: segments_tokens(&segments),
                output_tokens: p.output_tokens,
                blocks: prompt_blocks(&segments),
                adapter: None,
                session: None,
            });
        }
        burst += 1;
    }
    // Bursts closer than their window interleave: keep arrival order, ids in that order.
    requests.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    for (i, r) in requests.iter_mut().enumerate() {
        r.id = i as u64;
    }
    let workload = Workload {
        source: None,
        params: WorkloadParams::Burst(params.clone()),
        request_count: requests.len(),
        rate_scale: 1.0,
    };
    Ok((workload, requests))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared_leading(a: &[u64], b: &[u64]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    /// The requests grouped by burst (by their first block), in order of first arrival.
    fn bursts(requests: &[SimRequest]) -> Vec<Vec<&SimRequest>> {
        let mut out: Vec<Vec<&SimRequest>> = Vec::new();
        for r in requests {
            match out.iter_mut().find(|b| b[0].blocks[0] == r.blocks[0]) {
                Some(b) => b.push(r),
                None => out.push(vec![r]),
            }
        }
        out
    }

    #[test]
    fn siblings_share_a_new_prefix_and_arrive_within_the_window() {
        let params = BurstParams {
            seed: 7,
            max_requests: 400,
            ..BurstParams::default()
        };
        let (workload, requests) = generate(&params).unwrap();
        assert_eq!(workload.request_count, 400);
        assert_eq!(workload.params.kind(), "burst");
        let groups = bursts(&requests);
        let prefix_blocks = (params.prefix_tokens / 16) as usize;
        for (g, group) in groups.iter().enumerate() {
            // The last burst may be cut by max_requests.
            if g + 1 < groups.len() {
                assert!((3..=8).contains(&group.len()), "burst {g}: {}", group.len());
            }
            let first = group[0];
            for s in group {
                assert_eq!(s.input_tokens, 1_240);
                assert_eq!(s.output_tokens, 16);
                assert!(s.arrival_ms - first.arrival_ms <= 50.0);
                assert!(s.arrival_ms >= first.arrival_ms);
                assert!(shared_leading(&s.blocks, &first.blocks) >= prefix_blocks);
            }
            // Siblings differ after the prefix.
            if group.len() > 1 {
                assert_ne!(group[0].blocks, group[1].blocks);
            }
            // No other burst shares the prefix.
            if let Some(next) = groups.get(g + 1) {
                assert_eq!(shared_leading(&first.blocks, &next[0].blocks), 0);
            }
        }
        let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
        assert!(sizes.contains(&3) && sizes.contains(&8), "{sizes:?}");
        // Bursts 2.5 s apart on average (0.4 per second).
        let span_s = requests.last().unwrap().arrival_ms / 1000.0;
        let per_s = (groups.len() - 1) as f64 / span_s;
        assert!((0.3..0.5).contains(&per_s), "{per_s} bursts/s");
        assert!(
            requests
                .windows(2)
                .all(|w| w[0].arrival_ms <= w[1].arrival_ms)
        );
        assert!(requests.iter().enumerate().all(|(i, r)| r.id == i as u64));
    }

    #[test]
    fn the_same_seed_gives_the_same_workload_and_bad_parameters_are_errors() {
        let p = BurstParams {
            max_requests: 50,
            ..BurstParams::default()
        };
        assert_eq!(generate(&p).unwrap().1, generate(&p).unwrap().1);
        for bad in [
            BurstParams {
                size_min: 0,
                ..p.clone()
            },
            BurstParams {
                size_min: 9,
                size_max: 8,
                ..p.clone()
            },
            BurstParams {
                bursts_per_s: 0.0,
                ..p.clone()
            },
            BurstParams {
                window_ms: f64::NAN,
                ..p.clone()
            },
            BurstParams {
                output_tokens: 0,
                ..p.clone()
            },
        ] {
            assert!(generate(&bad).is_err(), "{bad:?}");
        }
    }
}
