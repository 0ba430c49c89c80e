//! `dynamo-kv`: NVIDIA Dynamo's KV router cost function (`DefaultWorkerSelector`).
//!
//! ```text
//! prefill_blocks(p) = (prefill tokens in flight on p + request tokens not cached on p) / block
//! decode_blocks(p)  = decode tokens in flight on p / block
//! cost(p)           = overlap_score_weight × prefill_blocks(p) + decode_blocks(p)
//! temperature 0:  argmin cost, ties to fewer requests, then the lower index
//! temperature T:  min-max normalise costs to [0, 1]; sample p ∝ exp(−normalised / T)
//! ```
//!
//! "Request tokens not cached on p" = input tokens − matched blocks × block size (≥ 0).
//!
//! Parameters (Dynamo `KvRouterConfig` defaults):
//! - `overlap_score_weight` = 1.0
//! - `router_temperature` = 0.0

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts, argmin_by};
use crate::DecisionRng;
use crate::config::RouterConfig;
use crate::decision::Branch;
use rand::RngExt;

#[derive(Debug, Clone, Copy)]
pub struct DynamoKv {
    overlap_score_weight: f64,
    router_temperature: f64,
}

impl DynamoKv {
    pub fn new(config: &RouterConfig) -> Self {
        DynamoKv {
            overlap_score_weight: config.overlap_score_weight,
            router_temperature: config.router_temperature,
        }
    }

    /// The cost of sending this request to one candidate (lower is better).
    pub fn cost(&self, request: &RequestFacts, c: &Candidate<'_>) -> f64 {
        let block = request.block_size_tokens.max(1) as f64;
        let cached = f64::from(c.matched_blocks) * f64::from(c.block_size_tokens);
        let uncached = (request.input_tokens as f64 - cached).max(0.0);
        let prefill_blocks = (c.pod.in_flight.prefill_tokens as f64 + uncached) / block;
        let decode_blocks = c.pod.in_flight.decode_tokens as f64 / block;
        self.overlap_score_weight * prefill_blocks + decode_blocks
    }
}

impl Policy for DynamoKv {
    fn kind(&self) -> PolicyKind {
        PolicyKind::DynamoKv
    }

    fn pick(
        &mut self,
        request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        if self.router_temperature <= 0.0 {
            let index = argmin_by(candidates, eligible, |c| self.cost(request, c))
                .ok_or(PolicyError::NoCandidates)?;
            return Ok(Pick {
                index,
                branch: Branch::Reason("min_cost"),
            });
        }
        // Softmax sampling over min-max normalised costs.
        let (lo, hi) = candidates
            .iter()
            .map(|c| self.cost(request, c))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
                (lo.min(x), hi.max(x))
            });
        if candidates.is_empty() {
            return Err(PolicyError::NoCandidates);
        }
        let range = hi - lo;
        let weight = |c: &Candidate<'_>| {
            let norm = if range > 0.0 {
                (self.cost(request, c) - lo) / range
            } else {
                0.0
            };
            (-norm / self.router_temperature).exp()
        };
        let total: f64 = candidates.iter().map(weight).sum();
        let mut draw = rng.random::<f64>() * total;
        for (index, c) in candidates.iter().enumerate() {
            draw -= weight(c);
            if draw < 0.0 {
                return Ok(Pick {
                    index,
                    branch: Branch::Reason("sampled_cost"),
                });
            }
        }
        Ok(Pick {
            index: candidates.len() - 1,
            branch: Branch::Reason("sampled_cost"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    #[test]
    fn cost_is_uncached_prefill_blocks_plus_decode_blocks() {
        let d = DynamoKv::new(&RouterConfig::default());
        let mut a = pod(0, 0, 0, 0.0);
        a.in_flight.prefill_tokens = 320; // 20 blocks
        a.in_flight.decode_tokens = 1600; // 100 blocks
        // 10 prompt blocks (160 tokens), 4 cached → 6 uncached blocks.
        let c = cand(&a, 4, 10, 1.0);
        assert_eq!(d.cost(&facts(10), &c), 20.0 + 6.0 + 100.0);
    }

    #[test]
    fn temperature_zero_picks_the_cheapest() {
        let mut a = pod(0, 0, 0, 0.0);
        a.in_flight.decode_tokens = 16 * 50;
        let b = pod(1, 0, 0, 0.0);
        // a: 0 uncached + 50 decode = 50; b: 10 uncached blocks = 10.
        let cands = [cand(&a, 10, 10, 1.0), cand(&b, 0, 10, 1.0)];
        let (pick, _) = run(
            &mut DynamoKv::new(&RouterConfig::default()),
            &facts(10),
            &cands,
            &mut rng(1),
        );
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 1,
                branch: Branch::Reason("min_cost")
            }
        );
    }

    #[test]
    fn temperature_samples_mostly_the_cheaper_pod() {
        let config = RouterConfig {
            router_temperature: 0.5,
            ..RouterConfig::default()
        };
        let mut policy = DynamoKv::new(&config);
        let (a, b) = (pod(0, 0, 0, 0.0), pod(1, 0, 0, 0.0));
        let cands = [cand(&a, 10, 10, 1.0), cand(&b, 0, 10, 1.0)];
        let mut r = rng(3);
        let picks_a = (0..10_000)
            .filter(|_| {
                run(&mut policy, &facts(10), &cands, &mut r)
                    .0
                    .unwrap()
                    .index
                    == 0
            })
            .count();
        // Weights exp(0) : exp(−1/0.5) → P(a) = 1 / (1 + e^−2) ≈ 0.881.
        assert!((8600..=9000).contains(&picks_a), "{picks_a}");
    }
}
