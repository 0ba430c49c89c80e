//! Multi-turn chat generator: tenants with shared system prompts, sessions with growing history.
//!
//! Model (all draws from one `ChaCha8Rng` seeded with `seed`, so a seed fixes the workload):
//! - `tenants` tenants, each with a system prompt of `system_prompt_tokens_min..=max` tokens
//!   (uniform), shared by every session of the tenant.
//! - Sessions start as a Poisson process of `session_rate_per_s` (the first at t = 0); each picks a
//!   tenant uniformly and has `turns_min..=turns_max` turns (uniform).
//! - Turn `t`'s prompt is `system prompt, user₀, answer₀, …, userₜ`: the previous prompt plus its
//!   answer plus a new user message, so turn `t+1`'s blocks start with all of turn `t`'s full
//!   blocks. User messages and answers are lognormal (`*_median`, `*_sigma`), clamped to
//!   `1..=user_tokens_max` / `1..=output_tokens_max`. A session ends early when the next prompt
//!   would exceed `max_context_tokens`.
//! - Open loop: turn `t+1` arrives at `arrival(t) + duration estimate(t) + think time`, where the
//!   estimate is `prompt tokens · est_prefill_ms_per_token + output tokens ·
//!   est_ms_per_output_token` (no cache, no queueing: the client does not wait for the simulated
//!   answer, so the workload is fixed before the run) and the think time is exponential with mean
//!   `think_time_mean_s`.
//! - The first `max_requests` requests by arrival are kept (sessions are generated until no
//!   later session can arrive before the last kept request), so the last sessions may be cut.
//!
//! Defaults: 8 tenants with 1–2k-token system prompts and 2–10 turns, as in the kvgate brief;
//! 0.5 sessions/s × ~6 turns ≈ 3 req/s, near Mooncake's conversation trace (3.4 req/s); output
//! median 200 tokens (between Azure conv's 129 and Mooncake's 350); prefill 0.02 ms/token
//! (≈ DESIGN §6's 18 µs/token on H100) and 25 ms per output token (a typical loaded TPOT).

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal};
use serde::{Deserialize, Serialize};

use super::segments::{Segment, prompt_blocks, segment_id, segments_tokens};
use super::{Workload, WorkloadError, WorkloadParams, finish, positive, token_count};
use crate::SimRequest;
use kvgate_core::AdapterId;

const NS_SYSTEM: u64 = 0x4368_5379; // "ChSy"
const NS_USER: u64 = 0x4368_5573; // "ChUs"
const NS_ANSWER: u64 = 0x4368_416e; // "ChAn"

/// Parameters of the chat generator (see the module docs for the model and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChatParams {
    pub seed: u64,
    pub max_requests: usize,
    pub session_rate_per_s: f64,
    pub tenants: u32,
    pub system_prompt_tokens_min: u32,
    pub system_prompt_tokens_max: u32,
    pub turns_min: u32,
    pub turns_max: u32,
    pub think_time_mean_s: f64,
    pub user_tokens_median: f64,
    pub user_tokens_sigma: f64,
    pub user_tokens_max: u32,
    pub output_tokens_median: f64,
    pub output_tokens_sigma: f64,
    pub output_tokens_max: u32,
    pub max_context_tokens: u32,
    pub est_prefill_ms_per_token: f64,
    pub est_ms_per_output_token: f64,
    /// LoRA adapters (0: every request uses the base model). With N > 0 tenant t's requests
    /// name adapter `adapter-{t mod N}`, and their block chains are seeded by it (vLLM's prefix
    /// cache is per adapter). No random draw depends on it: the same seed gives the same
    /// arrivals and lengths with or without adapters.
    #[serde(skip_serializing_if = "is_zero")]
    pub adapters: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// The adapter name of tenant `tenant` with `adapters` adapters (`None` with 0).
pub fn adapter_name(tenant: u32, adapters: u32) -> Option<String> {
    (adapters > 0).then(|| format!("adapter-{}", tenant % adapters))
}

impl Default for ChatParams {
    fn default() -> Self {
        Self {
            seed: 0,
            max_requests: 10_000,
            session_rate_per_s: 0.5,
            tenants: 8,
            system_prompt_tokens_min: 1000,
            system_prompt_tokens_max: 2000,
            turns_min: 2,
            turns_max: 10,
            think_time_mean_s: 10.0,
            user_tokens_median: 100.0,
            user_tokens_sigma: 1.0,
            user_tokens_max: 8192,
            output_tokens_median: 200.0,
            output_tokens_sigma: 0.7,
            output_tokens_max: 4096,
            max_context_tokens: 32_768,
            est_prefill_ms_per_token: 0.02,
            est_ms_per_output_token: 25.0,
            adapters: 0,
        }
    }
}

impl ChatParams {
    fn validate(&self) -> Result<(), WorkloadError> {
        positive("session_rate_per_s", self.session_rate_per_s)?;
        positive("think_time_mean_s", self.think_time_mean_s)?;
        positive("user_tokens_median", self.user_tokens_median)?;
        positive("output_tokens_median", self.output_tokens_median)?;
        token_count("system_prompt_tokens_min", self.system_prompt_tokens_min)?;
        token_count("system_prompt_tokens_max", self.system_prompt_tokens_max)?;
        token_count("user_tokens_max", self.user_tokens_max)?;
        token_count("output_tokens_max", self.output_tokens_max)?;
        token_count("max_context_tokens", self.max_context_tokens)?;
        let invalid = |name, reason: &str| {
            Err(WorkloadError::InvalidParam {
                name,
                reason: reason.to_owned(),
            })
        };
        if self.tenants == 0 {
            return invalid("tenants", "must be ≥ 1");
        }
        if self.system_prompt_tokens_min > self.system_prompt_tokens_max {
            return invalid(
                "system_prompt_tokens_min",
                "must be ≤ system_prompt_tokens_max",
            );
        }
        if self.turns_min == 0 || self.turns_min > self.turns_max {
            return invalid("turns_min", "must be in 1..=turns_max");
        }
        for (name, v) in [
            ("user_tokens_sigma", self.user_tokens_sigma),
            ("output_tokens_sigma", self.output_tokens_sigma),
            ("est_prefill_ms_per_token", self.est_prefill_ms_per_token),
            ("est_ms_per_output_token", self.est_ms_per_output_token),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return invalid(name, "must be finite and ≥ 0");
            }
        }
        Ok(())
    }
}

/// Generates a chat workload; requests are in arrival order with ids 0, 1, 2, ….
pub fn generate(params: &ChatParams) -> Result<(Workload, Vec<SimRequest>), WorkloadError> {
    params.validate()?;
    let p = params;
    let param_err = |name, e: &dyn std::fmt::Display| WorkloadError::InvalidParam {
        name,
        reason: e.to_string(),
    };
    let session_gap =
        Exp::new(p.session_rate_per_s / 1000.0).map_err(|e| param_err("session_rate_per_s", &e))?;
    let think = Exp::new(1.0 / (p.think_time_mean_s * 1000.0))
        .map_err(|e| param_err("think_time_mean_s", &e))?;
    let user_len = LogNormal::new(p.user_tokens_median.ln(), p.user_tokens_sigma)
        .map_err(|e| param_err("user_tokens_sigma", &e))?;
    let output_len = LogNormal::new(p.output_tokens_median.ln(), p.output_tokens_sigma)
        .map_err(|e| param_err("output_tokens_sigma", &e))?;

    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let system_tokens: Vec<u32> = (0..p.tenants)
        .map(|_| rng.random_range(p.system_prompt_tokens_min..=p.system_prompt_tokens_max))
        .collect();

    let mut requests: Vec<SimRequest> = Vec::new();
    let mut cutoff_ms = f64::INFINITY;
    let mut session_start_ms = 0.0;
    let mut segments: Vec<Segment> = Vec::new();
    let mut arrivals_scratch: Vec<f64> = Vec::new();
    let clamp = |x: f64, max: u32| (x.round().max(1.0) as u32).min(max);
    for session in 0u64.. {
        if p.max_requests == 0 {
            break;
        }
        if requests.len() >= p.max_requests {
            // The max_requests-th earliest arrival so far: a session starting later cannot
            // contribute a kept request.
            arrivals_scratch.clear();
            arrivals_scratch.extend(requests.iter().map(|r| r.arrival_ms));
            let (_, kth, _) =
                arrivals_scratch.select_nth_unstable_by(p.max_requests - 1, f64::total_cmp);
            cutoff_ms = *kth;
        }
        if session > 0 {
            session_start_ms += session_gap.sample(&mut rng);
        }
        if session_start_ms > cutoff_ms {
            break;
        }
        let tenant = rng.random_range(0..p.tenants);
        let turns = rng.random_range(p.turns_min..=p.turns_max);
        let adapter = adapter_name(tenant, p.adapters).map(|n| AdapterId::of(&n));
        segments.clear();
        segments.push(Segment::new(
            // The adapter seeds the chain: its first segment differs per adapter.
            segment_id(NS_SYSTEM, u64::from(tenant), adapter.map_or(0, |a| a.0)),
            system_tokens
                .get(tenant as usize)
                .copied()
                .unwrap_or(p.system_prompt_tokens_min),
        ));
        let mut arrival_ms = session_start_ms;
        for turn in 0..u64::from(turns) {
            let user = clamp(user_len.sample(&mut rng), p.user_tokens_max);
            let output_tokens = clamp(output_len.sample(&mut rng), p.output_tokens_max);
            let think_ms = think.sample(&mut rng);
            segments.push(Segment::new(segment_id(NS_USER, session, turn), user));
            let input_tokens = segments_tokens(&segments);
            if input_tokens > p.max_context_tokens {
                break;
            }
            requests.push(SimRequest {
                id: 0,
                arrival_ms,
                input_tokens,
                output_tokens,
                blocks: prompt_blocks(&segments),
                adapter,
                session: None,
            });
            segments.push(Segment::new(
                segment_id(NS_ANSWER, session, turn),
                output_tokens,
            ));
            arrival_ms += f64::from(input_tokens) * p.est_prefill_ms_per_token
                + f64::from(output_tokens) * p.est_ms_per_output_token
                + think_ms;
        }
    }
    let requests = finish(requests, p.max_requests);
    let workload = Workload {
        source: None,
        params: WorkloadParams::Chat(params.clone()),
        request_count: requests.len(),
        rate_scale: 1.0,
    };
    Ok((workload, requests))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seed: u64, max_requests: usize) -> ChatParams {
        ChatParams {
            seed,
            max_requests,
            ..ChatParams::default()
        }
    }

    #[test]
    fn adapters_change_no_draw_and_seed_each_adapters_chains_apart() {
        let (_, plain) = generate(&params(5, 300)).unwrap();
        let (_, lora) = generate(&ChatParams {
            adapters: 3,
            ..params(5, 300)
        })
        .unwrap();
        assert_eq!(plain.len(), lora.len());
        for (p, l) in plain.iter().zip(&lora) {
            assert_eq!(
                (p.arrival_ms, p.input_tokens, p.output_tokens),
                (l.arrival_ms, l.input_tokens, l.output_tokens)
            );
            assert_eq!(p.adapter, None);
            assert!(l.adapter.is_some());
            assert_ne!(
                p.blocks.first(),
                l.blocks.first(),
                "the adapter seeds the chain"
            );
        }
        let names: std::collections::BTreeSet<_> = lora.iter().map(|r| r.adapter).collect();
        assert_eq!(names.len(), 3);
        assert_eq!(adapter_name(4, 3).as_deref(), Some("adapter-1"));
        assert_eq!(adapter_name(4, 0), None);
    }

    #[test]
    fn same_seed_same_workload_other_seed_other_workload() {
        let (wa, a) = generate(&params(7, 500)).unwrap();
        let (_, b) = generate(&params(7, 500)).unwrap();
        let (_, c) = generate(&params(8, 500)).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!((wa.request_count, a.len()), (500, 500));
        assert_eq!(wa.params.kind(), "chat");
    }

    #[test]
    fn requests_are_in_arrival_order_and_well_formed() {
        let (_, reqs) = generate(&params(1, 2000)).unwrap();
        for (i, w) in reqs.windows(2).enumerate() {
            assert!(w[0].arrival_ms <= w[1].arrival_ms, "request {i}");
        }
        for (i, r) in reqs.iter().enumerate() {
            assert_eq!(r.id, i as u64);
            assert_eq!(r.blocks.len(), (r.input_tokens / 16) as usize);
            assert!(r.input_tokens <= 32_768 && r.output_tokens >= 1);
        }
    }

    /// Rebuilds sessions from the generator's own model: a later turn's blocks start with the
    /// previous turn's full blocks, and sessions of one tenant share the system prompt's blocks.
    #[test]
    fn each_turn_extends_the_previous_turns_blocks() {
        let (_, reqs) = generate(&params(3, 3000)).unwrap();
        // Group by first block (= tenant's system prompt, ≥ 1000 tokens ⇒ ≥ 62 blocks).
        let mut extended = 0;
        for (i, r) in reqs.iter().enumerate() {
            // The previous turn of the same session is an earlier request whose blocks are a
            // strict prefix of r's blocks and that is followed by ≥ 1 answer block.
            if let Some(prev) = reqs[..i].iter().rev().find(|q| {
                q.blocks.len() < r.blocks.len()
                    && q.blocks.len() > 63
                    && r.blocks.starts_with(&q.blocks)
            }) {
                assert!(prev.arrival_ms < r.arrival_ms);
                extended += 1;
            }
        }
        // With 2–10 turns per session, most requests are follow-up turns.
        assert!(extended > reqs.len() / 2, "{extended} of {}", reqs.len());
    }

    #[test]
    fn turn_t_plus_1_starts_with_turn_t_blocks_in_a_single_session() {
        let p = ChatParams {
            seed: 11,
            max_requests: 5,
            session_rate_per_s: 1e-9, // the second session starts after the first one ends
            turns_min: 5,
            turns_max: 5,
            ..ChatParams::default()
        };
        let (_, reqs) = generate(&p).unwrap();
        assert_eq!(reqs.len(), 5);
        for w in reqs.windows(2) {
            assert!(w[1].blocks.starts_with(&w[0].blocks));
            assert!(w[1].input_tokens > w[0].input_tokens + w[0].output_tokens);
            let min_gap = f64::from(w[0].output_tokens) * p.est_ms_per_output_token;
            assert!(w[1].arrival_ms - w[0].arrival_ms >= min_gap);
        }
    }

    #[test]
    fn sessions_of_one_tenant_share_the_system_prompt_blocks() {
        let p = ChatParams {
            tenants: 1,
            system_prompt_tokens_min: 1600,
            system_prompt_tokens_max: 1600,
            ..params(5, 200)
        };
        let (_, reqs) = generate(&p).unwrap();
        for r in &reqs {
            assert_eq!(r.blocks[..100], reqs[0].blocks[..100]);
        }
    }

    #[test]
    fn bad_parameters_are_errors() {
        for p in [
            ChatParams {
                session_rate_per_s: 0.0,
                ..params(0, 10)
            },
            ChatParams {
                tenants: 0,
                ..params(0, 10)
            },
            ChatParams {
                turns_min: 3,
                turns_max: 2,
                ..params(0, 10)
            },
            ChatParams {
                output_tokens_sigma: f64::NAN,
                ..params(0, 10)
            },
        ] {
            assert!(
                matches!(generate(&p), Err(WorkloadError::InvalidParam { .. })),
                "{p:?}"
            );
        }
        assert!(generate(&params(0, 0)).unwrap().1.is_empty());
    }
}
