//! Shared-prefix generator: groups of users behind one system prompt per group, after
//! inference-perf's `shared_prefix` data generator, with llm-d's published scenarios A–D as
//! presets.
//!
//! Model (all draws from one `ChaCha8Rng` seeded with `seed`):
//! - `num_groups × prompts_per_group` users. Group `g` has one system prompt of
//!   `system_prompt_tokens` tokens; user `u` has one question of `question_tokens_mean ±
//!   question_tokens_std` tokens and one output length of `output_tokens_mean ±
//!   output_tokens_std` (normal, rounded, clamped to `1..=mean + 3·std`; inference-perf clamps to
//!   configured min/max, which the blog does not publish).
//! - Arrivals are a Poisson process of `rate_per_s`; the blog steps QPS up to saturation (100 s
//!   per step) and publishes no rates, so the default 10 req/s is ours — scale it with
//!   [`scale_rate`](super::scale_rate).
//! - `multi_turn` (inference-perf `enable_multi_turn_chat`, used in every llm-d run): request `i`
//!   goes to user `perm[i mod N]` (a seeded permutation) in round `r = i div N`; its prompt is
//!   `system prompt, (question, answer) × r, question` — the user's context grows by its question
//!   and its answer (its output length) each round, like inference-perf's `LocalUserSession`.
//!   (inference-perf pairs sessions and question texts by index after shuffling only the
//!   sessions; the lengths come from the same distribution, so we give each user its own.)
//!   Without `multi_turn`, request `i` sends prompt `perm[i mod N]` = `system prompt, question`,
//!   cycling through the shuffled prompts.
//!
//! Presets, from llm-d's predicted-latency blog (Mar 2026; `shared/reference/
//! llmd-predicted-latency.md` §3): groups × prompts/group, system prompt, question ± std,
//! output ± std —
//! - `A`: 6 × 1000, 1000, 30 ± 9, 1000 ± 300 (short questions, long shared prefix share);
//! - `B`: 6 × 1000, 1000, 3000 ± 900, 1000 ± 300 (long unique questions);
//! - `C`: 150 × 5, 6000, 1200 ± 360, 1000 ± 300 (many large prefixes, cache churn — "b2b-saas");
//! - `D`: 150 × 5, 1000, 6200 ± 1860, 1000 ± 300.
//!
//! "All runs are multi-turn", so presets set `multi_turn`. Rates are not published (see above).

use rand::SeedableRng;
use rand::rngs::ChaCha8Rng;
use rand::seq::SliceRandom;
use rand_distr::{Distribution, Exp, Normal};
use serde::{Deserialize, Serialize};

use super::segments::{Segment, prompt_blocks, segment_id, segments_tokens};
use super::{MAX_INPUT_TOKENS, Workload, WorkloadError, WorkloadParams, positive, token_count};
use crate::SimRequest;

const NS_SYSTEM: u64 = 0x5350_5379; // "SPSy"
const NS_QUESTION: u64 = 0x5350_5175; // "SPQu"
const NS_ANSWER: u64 = 0x5350_416e; // "SPAn"

/// Names of the built-in presets.
pub const PRESETS: [&str; 4] = ["A", "B", "C", "D"];

/// Parameters of the shared-prefix generator (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SharedPrefixParams {
    /// The preset these parameters came from (`"A"`–`"D"`), if any.
    pub preset: Option<String>,
    pub seed: u64,
    pub max_requests: usize,
    pub num_groups: u32,
    pub prompts_per_group: u32,
    pub system_prompt_tokens: u32,
    pub question_tokens_mean: f64,
    pub question_tokens_std: f64,
    pub output_tokens_mean: f64,
    pub output_tokens_std: f64,
    pub rate_per_s: f64,
    pub multi_turn: bool,
}

impl Default for SharedPrefixParams {
    /// Scenario A.
    fn default() -> Self {
        Self {
            preset: Some("A".to_owned()),
            seed: 0,
            max_requests: 10_000,
            num_groups: 6,
            prompts_per_group: 1000,
            system_prompt_tokens: 1000,
            question_tokens_mean: 30.0,
            question_tokens_std: 9.0,
            output_tokens_mean: 1000.0,
            output_tokens_std: 300.0,
            rate_per_s: 10.0,
            multi_turn: true,
        }
    }
}

impl SharedPrefixParams {
    /// llm-d's scenario `name` (`"A"`–`"D"`, case-insensitive), or `None`.
    pub fn preset(name: &str) -> Option<Self> {
        let a = Self::default();
        let (groups, per_group, system, question, question_std) =
            match name.to_ascii_uppercase().as_str() {
                "A" => (6, 1000, 1000, 30.0, 9.0),
                "B" => (6, 1000, 1000, 3000.0, 900.0),
                "C" => (150, 5, 6000, 1200.0, 360.0),
                "D" => (150, 5, 1000, 6200.0, 1860.0),
                _ => return None,
            };
        Some(Self {
            preset: Some(name.to_ascii_uppercase()),
            num_groups: groups,
            prompts_per_group: per_group,
            system_prompt_tokens: system,
            question_tokens_mean: question,
            question_tokens_std: question_std,
            ..a
        })
    }

    fn validate(&self) -> Result<(), WorkloadError> {
        positive("rate_per_s", self.rate_per_s)?;
        positive("question_tokens_mean", self.question_tokens_mean)?;
        positive("output_tokens_mean", self.output_tokens_mean)?;
        token_count("system_prompt_tokens", self.system_prompt_tokens)?;
        for (name, v) in [
            ("question_tokens_std", self.question_tokens_std),
            ("output_tokens_std", self.output_tokens_std),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(WorkloadError::InvalidParam {
                    name,
                    reason: format!("must be finite and ≥ 0, got {v}"),
                });
            }
        }
        if self.num_groups == 0 || self.prompts_per_group == 0 {
            return Err(WorkloadError::InvalidParam {
                name: "num_groups",
                reason: "num_groups and prompts_per_group must be ≥ 1".to_owned(),
            });
        }
        Ok(())
    }
}

/// Generates a shared-prefix workload; requests are in arrival order with ids 0, 1, 2, ….
pub fn generate(params: &SharedPrefixParams) -> Result<(Workload, Vec<SimRequest>), WorkloadError> {
    params.validate()?;
    let p = params;
    let param_err = |name, e: &dyn std::fmt::Display| WorkloadError::InvalidParam {
        name,
        reason: e.to_string(),
    };
    let gap = Exp::new(p.rate_per_s / 1000.0).map_err(|e| param_err("rate_per_s", &e))?;
    let question_len = Normal::new(p.question_tokens_mean, p.question_tokens_std)
        .map_err(|e| param_err("question_tokens_std", &e))?;
    let output_len = Normal::new(p.output_tokens_mean, p.output_tokens_std)
        .map_err(|e| param_err("output_tokens_std", &e))?;
    let clamp = |x: f64, mean: f64, std: f64| {
        let max = (mean + 3.0 * std)
            .round()
            .clamp(1.0, f64::from(MAX_INPUT_TOKENS));
        x.round().clamp(1.0, max) as u32
    };

    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let users = p.num_groups as usize * p.prompts_per_group as usize;
    // Per user: (question tokens, output tokens), drawn group by group like inference-perf.
    let lengths: Vec<(u32, u32)> = (0..users)
        .map(|_| {
            let q = clamp(
                question_len.sample(&mut rng),
                p.question_tokens_mean,
                p.question_tokens_std,
            );
            let o = clamp(
                output_len.sample(&mut rng),
                p.output_tokens_mean,
                p.output_tokens_std,
            );
            (q, o)
        })
        .collect();
    let mut order: Vec<usize> = (0..users).collect();
    order.shuffle(&mut rng);

    let mut requests = Vec::with_capacity(p.max_requests.min(1 << 20));
    let mut segments: Vec<Segment> = Vec::new();
    let mut arrival_ms = 0.0;
    for i in 0..p.max_requests {
        if i > 0 {
            arrival_ms += gap.sample(&mut rng);
        }
        let user = order.get(i % users).copied().unwrap_or(0);
        let round = if p.multi_turn { i / users } else { 0 };
        let group = user / p.prompts_per_group as usize;
        let (question, output_tokens) = lengths.get(user).copied().unwrap_or((1, 1));
        let question_id = segment_id(NS_QUESTION, user as u64, 0);
        segments.clear();
        segments.push(Segment::new(
            segment_id(NS_SYSTEM, group as u64, 0),
            p.system_prompt_tokens,
        ));
        for r in 0..round {
            segments.push(Segment::new(question_id, question));
            segments.push(Segment::new(
                segment_id(NS_ANSWER, user as u64, r as u64),
                output_tokens,
            ));
        }
        segments.push(Segment::new(question_id, question));
        let input_tokens = segments_tokens(&segments);
        if input_tokens > MAX_INPUT_TOKENS {
            return Err(WorkloadError::InvalidParam {
                name: "max_requests",
                reason: format!(
                    "round {round} prompts would exceed {MAX_INPUT_TOKENS} tokens; \
                     lower max_requests or disable multi_turn"
                ),
            });
        }
        requests.push(SimRequest {
            id: i as u64,
            arrival_ms,
            input_tokens,
            output_tokens,
            blocks: prompt_blocks(&segments),
            adapter: None,
            session: None,
        });
    }
    let workload = Workload {
        source: None,
        params: WorkloadParams::SharedPrefix(params.clone()),
        request_count: requests.len(),
        rate_scale: 1.0,
    };
    Ok((workload, requests))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(name: &str, seed: u64, max_requests: usize) -> SharedPrefixParams {
        SharedPrefixParams {
            seed,
            max_requests,
            ..SharedPrefixParams::preset(name).unwrap()
        }
    }

    fn shared_leading(a: &[u64], b: &[u64]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    #[test]
    fn presets_carry_the_published_numbers() {
        let c = SharedPrefixParams::preset("c").unwrap();
        assert_eq!(
            (c.num_groups, c.prompts_per_group, c.system_prompt_tokens),
            (150, 5, 6000)
        );
        assert_eq!(
            (c.question_tokens_mean, c.question_tokens_std),
            (1200.0, 360.0)
        );
        assert_eq!((c.output_tokens_mean, c.output_tokens_std), (1000.0, 300.0));
        assert_eq!(c.preset.as_deref(), Some("C"));
        let d = SharedPrefixParams::preset("D").unwrap();
        assert_eq!(
            (d.num_groups, d.system_prompt_tokens, d.question_tokens_mean),
            (150, 1000, 6200.0)
        );
        assert!(SharedPrefixParams::preset("E").is_none());
        assert_eq!(
            SharedPrefixParams::preset("A").unwrap(),
            SharedPrefixParams::default()
        );
    }

    #[test]
    fn same_seed_same_workload_other_seed_other_workload() {
        for name in PRESETS {
            let (w, a) = generate(&preset(name, 1, 300)).unwrap();
            let (_, b) = generate(&preset(name, 1, 300)).unwrap();
            let (_, c) = generate(&preset(name, 2, 300)).unwrap();
            assert_eq!(a, b, "{name}");
            assert_ne!(a, c, "{name}");
            assert_eq!((w.request_count, w.params.kind()), (300, "shared-prefix"));
        }
    }

    #[test]
    fn same_group_shares_exactly_the_system_prompt_blocks() {
        // Scenario C: 6000-token system prompt = 375 full blocks; groups of 5 users.
        let (_, reqs) = generate(&preset("C", 4, 750)).unwrap();
        let sys_blocks = 6000 / 16;
        let mut same_group_pairs = 0;
        for a in &reqs {
            for b in &reqs {
                if a.id >= b.id {
                    continue;
                }
                let shared = shared_leading(&a.blocks, &b.blocks);
                if a.blocks[0] == b.blocks[0] {
                    // Same group, different users in round 0: the system prompt and nothing more.
                    assert_eq!(shared, sys_blocks);
                    same_group_pairs += 1;
                } else {
                    assert_eq!(shared, 0);
                }
            }
        }
        // 150 groups × C(5, 2) pairs, every user appears once in the first 750 requests.
        assert_eq!(same_group_pairs, 150 * 10);
    }

    #[test]
    fn a_users_next_round_extends_its_previous_prompt() {
        let p = SharedPrefixParams {
            num_groups: 2,
            prompts_per_group: 3,
            ..preset("B", 9, 18)
        };
        let (_, reqs) = generate(&p).unwrap();
        for i in 6..18 {
            let prev = &reqs[i - 6];
            let cur = &reqs[i];
            assert!(cur.blocks.starts_with(&prev.blocks), "request {i}");
            assert_eq!(cur.output_tokens, prev.output_tokens);
            // Round r adds (answer, question) to the user's round r−1 prompt.
            let question = reqs[i % 6].input_tokens - 1000;
            assert_eq!(
                cur.input_tokens,
                prev.input_tokens + prev.output_tokens + question
            );
        }
    }

    #[test]
    fn single_turn_cycles_through_the_same_prompts() {
        let p = SharedPrefixParams {
            multi_turn: false,
            num_groups: 2,
            prompts_per_group: 2,
            ..preset("A", 3, 8)
        };
        let (_, reqs) = generate(&p).unwrap();
        for i in 0..4 {
            assert_eq!(reqs[i].blocks, reqs[i + 4].blocks);
        }
    }

    #[test]
    fn arrivals_are_poisson_at_the_configured_rate() {
        let (_, reqs) = generate(&preset("A", 5, 5000)).unwrap();
        let span_s = reqs.last().unwrap().arrival_ms / 1000.0;
        let rate = (reqs.len() - 1) as f64 / span_s;
        assert!((rate - 10.0).abs() < 0.5, "rate {rate}");
        assert!(reqs.windows(2).all(|w| w[0].arrival_ms <= w[1].arrival_ms));
    }

    #[test]
    fn lengths_stay_in_their_clamped_ranges() {
        let (_, reqs) = generate(&preset("D", 6, 750)).unwrap();
        for r in &reqs {
            assert!((1..=1000 + 6200 + 3 * 1860).contains(&r.input_tokens));
            assert!((1..=1000 + 900).contains(&r.output_tokens));
            assert_eq!(r.blocks.len(), (r.input_tokens / 16) as usize);
        }
    }
}
