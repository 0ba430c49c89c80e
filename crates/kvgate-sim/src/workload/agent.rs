//! Agent sessions: a coding or research agent calling tools, with tool pauses and parallel calls.
//!
//! Model (all draws from one `ChaCha8Rng` seeded with `seed`, so a seed fixes the workload):
//! - `agents` agent kinds, each with a prompt of `system_tokens_min..=max` tokens (uniform): its
//!   system prompt and tool definitions, shared by every session of that kind.
//! - Sessions start as a Poisson process of `session_rate_per_s` (the first at t = 0). Each picks
//!   an agent kind uniformly, opens with a task of lognormal length (`task_tokens_median`,
//!   `task_tokens_sigma`) and runs `steps_min..=steps_max` model calls (uniform).
//! - Each call's prompt is the whole session so far: agent prompt, task, then every earlier call's
//!   output and tool result. A call's output is a tool call (lognormal `tool_call_tokens_*`);
//!   the last call's is the answer (`answer_tokens_*`). The tool result appended after a call is
//!   lognormal (`tool_result_tokens_*`, at most `tool_result_tokens_max`).
//! - Parallel calls: with probability `parallel_share` a step fans out into `2..=parallel_max`
//!   calls arriving at once (sub-agents or parallel tool calls), each the session so far plus its
//!   own short instruction (`branch_tokens`). All their results are appended before the next step.
//! - Open loop, as [`super::chat`]: the next step arrives at `arrival + duration estimate + tool
//!   pause`; the estimate is `prompt tokens · est_prefill_ms_per_token + output tokens ·
//!   est_ms_per_output_token` (the longest branch for a fan-out), the pause lognormal
//!   (`tool_pause_median_s`, `tool_pause_sigma`). A session ends early when the next prompt would
//!   exceed `max_context_tokens`.
//! - Compaction: with `compact_every` = N > 0, after every N-th step the session's history
//!   (every output and tool result so far) is replaced by a new summary of
//!   `compact_summary_tokens`, as agent clients compact a long context: the next prompt keeps
//!   only the agent prompt and the task as its prefix, although the pod that served the session
//!   still holds them and nothing else of the session is anywhere. Each request carries its
//!   session's id ([`SimRequest::session`]), as the gateway reads a session header.
//! - The first `max_requests` requests by arrival are kept, as in the chat generator.
//!
//! What sets it apart from chat: long shared agent prompts, contexts that grow fast by tool
//! results, short outputs, pauses of seconds rather than tens of seconds, and bursts of calls
//! sharing one long prefix. Routing that scatters a session's steps loses its whole context from
//! the cache; routing that piles every branch of a fan-out on one pod queues them.
//!
//! Defaults: 4 agent kinds with 1.5–3k-token prompts, tasks of ~200 tokens, 3–12 steps, tool calls
//! of ~60 tokens, answers of ~250, tool results of ~300 (σ 1, ≤ 4k), pauses of ~1.5 s (σ 1), a
//! quarter of the steps fanning out into 2–4 calls, 0.2 sessions/s (≈ 2 req/s), no compaction
//! (summaries of 400 tokens when on); the estimate's speeds are the chat generator's.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal};
use serde::{Deserialize, Serialize};

use super::segments::{Segment, prompt_blocks, segment_id, segments_tokens};
use super::{Workload, WorkloadError, WorkloadParams, finish, positive, token_count};
use crate::SimRequest;

const NS_AGENT: u64 = 0x4167_5379; // "AgSy"
const NS_TASK: u64 = 0x4167_5461; // "AgTa"
const NS_OUTPUT: u64 = 0x4167_4f75; // "AgOu"
const NS_RESULT: u64 = 0x4167_5265; // "AgRe"
const NS_BRANCH: u64 = 0x4167_4272; // "AgBr"
const NS_SUMMARY: u64 = 0x4167_5375; // "AgSu"

/// Parameters of the agent generator (see the module docs for the model and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentParams {
    pub seed: u64,
    pub max_requests: usize,
    pub session_rate_per_s: f64,
    pub agents: u32,
    pub system_tokens_min: u32,
    pub system_tokens_max: u32,
    pub task_tokens_median: f64,
    pub task_tokens_sigma: f64,
    pub steps_min: u32,
    pub steps_max: u32,
    pub tool_call_tokens_median: f64,
    pub tool_call_tokens_sigma: f64,
    pub answer_tokens_median: f64,
    pub answer_tokens_sigma: f64,
    pub tool_result_tokens_median: f64,
    pub tool_result_tokens_sigma: f64,
    pub tool_result_tokens_max: u32,
    pub tool_pause_median_s: f64,
    pub tool_pause_sigma: f64,
    pub parallel_share: f64,
    pub parallel_max: u32,
    pub branch_tokens: u32,
    pub max_context_tokens: u32,
    pub est_prefill_ms_per_token: f64,
    pub est_ms_per_output_token: f64,
    pub compact_every: u32,
    pub compact_summary_tokens: u32,
}

impl Default for AgentParams {
    fn default() -> Self {
        Self {
            seed: 0,
            max_requests: 10_000,
            session_rate_per_s: 0.2,
            agents: 4,
            system_tokens_min: 1500,
            system_tokens_max: 3000,
            task_tokens_median: 200.0,
            task_tokens_sigma: 0.8,
            steps_min: 3,
            steps_max: 12,
            tool_call_tokens_median: 60.0,
            tool_call_tokens_sigma: 0.6,
            answer_tokens_median: 250.0,
            answer_tokens_sigma: 0.7,
            tool_result_tokens_median: 300.0,
            tool_result_tokens_sigma: 1.0,
            tool_result_tokens_max: 4096,
            tool_pause_median_s: 1.5,
            tool_pause_sigma: 1.0,
            parallel_share: 0.25,
            parallel_max: 4,
            branch_tokens: 48,
            max_context_tokens: 32_768,
            est_prefill_ms_per_token: 0.02,
            est_ms_per_output_token: 25.0,
            compact_every: 0,
            compact_summary_tokens: 400,
        }
    }
}

impl AgentParams {
    fn validate(&self) -> Result<(), WorkloadError> {
        positive("session_rate_per_s", self.session_rate_per_s)?;
        positive("task_tokens_median", self.task_tokens_median)?;
        positive("tool_call_tokens_median", self.tool_call_tokens_median)?;
        positive("answer_tokens_median", self.answer_tokens_median)?;
        positive("tool_result_tokens_median", self.tool_result_tokens_median)?;
        positive("tool_pause_median_s", self.tool_pause_median_s)?;
        token_count("system_tokens_min", self.system_tokens_min)?;
        token_count("system_tokens_max", self.system_tokens_max)?;
        token_count("tool_result_tokens_max", self.tool_result_tokens_max)?;
        token_count("branch_tokens", self.branch_tokens)?;
        token_count("max_context_tokens", self.max_context_tokens)?;
        token_count("compact_summary_tokens", self.compact_summary_tokens)?;
        let invalid = |name, reason: &str| {
            Err(WorkloadError::InvalidParam {
                name,
                reason: reason.to_owned(),
            })
        };
        if self.agents == 0 {
            return invalid("agents", "must be ≥ 1");
        }
        if self.system_tokens_min > self.system_tokens_max {
            return invalid("system_tokens_min", "must be ≤ system_tokens_max");
        }
        if self.steps_min == 0 || self.steps_min > self.steps_max {
            return invalid("steps_min", "must be in 1..=steps_max");
        }
        if !(0.0..=1.0).contains(&self.parallel_share) {
            return invalid("parallel_share", "must be in 0..=1");
        }
        if self.parallel_max < 2 {
            return invalid("parallel_max", "must be ≥ 2");
        }
        for (name, v) in [
            ("task_tokens_sigma", self.task_tokens_sigma),
            ("tool_call_tokens_sigma", self.tool_call_tokens_sigma),
            ("answer_tokens_sigma", self.answer_tokens_sigma),
            ("tool_result_tokens_sigma", self.tool_result_tokens_sigma),
            ("tool_pause_sigma", self.tool_pause_sigma),
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

/// The length distributions of one workload.
struct Lengths {
    task: LogNormal<f64>,
    tool_call: LogNormal<f64>,
    answer: LogNormal<f64>,
    tool_result: LogNormal<f64>,
    pause_ms: LogNormal<f64>,
}

impl Lengths {
    fn new(p: &AgentParams) -> Result<Lengths, WorkloadError> {
        let lognormal = |name, median: f64, sigma| {
            LogNormal::new(median.ln(), sigma).map_err(|e| WorkloadError::InvalidParam {
                name,
                reason: e.to_string(),
            })
        };
        Ok(Lengths {
            task: lognormal(
                "task_tokens_sigma",
                p.task_tokens_median,
                p.task_tokens_sigma,
            )?,
            tool_call: lognormal(
                "tool_call_tokens_sigma",
                p.tool_call_tokens_median,
                p.tool_call_tokens_sigma,
            )?,
            answer: lognormal(
                "answer_tokens_sigma",
                p.answer_tokens_median,
                p.answer_tokens_sigma,
            )?,
            tool_result: lognormal(
                "tool_result_tokens_sigma",
                p.tool_result_tokens_median,
                p.tool_result_tokens_sigma,
            )?,
            pause_ms: lognormal(
                "tool_pause_sigma",
                p.tool_pause_median_s * 1000.0,
                p.tool_pause_sigma,
            )?,
        })
    }
}

fn tokens(x: f64, max: u32) -> u32 {
    (x.round().max(1.0) as u32).min(max)
}

/// Generates an agent workload; requests are in arrival order with ids 0, 1, 2, ….
pub fn generate(params: &AgentParams) -> Result<(Workload, Vec<SimRequest>), WorkloadError> {
    params.validate()?;
    let p = params;
    let session_gap =
        Exp::new(p.session_rate_per_s / 1000.0).map_err(|e| WorkloadError::InvalidParam {
            name: "session_rate_per_s",
            reason: e.to_string(),
        })?;
    let len = Lengths::new(p)?;
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let system_tokens: Vec<u32> = (0..p.agents)
        .map(|_| rng.random_range(p.system_tokens_min..=p.system_tokens_max))
        .collect();
    let output_max = p.max_context_tokens;

    let mut requests: Vec<SimRequest> = Vec::new();
    let mut cutoff_ms = f64::INFINITY;
    let mut session_start_ms = 0.0;
    let mut context: Vec<Segment> = Vec::new();
    let mut scratch: Vec<f64> = Vec::new();
    for session in 0u64.. {
        if p.max_requests == 0 {
            break;
        }
        if requests.len() >= p.max_requests {
            // The max_requests-th earliest arrival so far: a later session adds no kept request.
            scratch.clear();
            scratch.extend(requests.iter().map(|r| r.arrival_ms));
            let (_, kth, _) = scratch.select_nth_unstable_by(p.max_requests - 1, f64::total_cmp);
            cutoff_ms = *kth;
        }
        if session > 0 {
            session_start_ms += session_gap.sample(&mut rng);
        }
        if session_start_ms > cutoff_ms {
            break;
        }
        let agent = rng.random_range(0..p.agents);
        let steps = rng.random_range(p.steps_min..=p.steps_max);
        let task = tokens(len.task.sample(&mut rng), p.max_context_tokens);
        context.clear();
        context.push(Segment::new(
            segment_id(NS_AGENT, u64::from(agent), 0),
            system_tokens[agent as usize],
        ));
        context.push(Segment::new(segment_id(NS_TASK, session, 0), task));
        let mut arrival_ms = session_start_ms;
        for step in 0..steps {
            let last = step + 1 == steps;
            let fan_out = match !last && rng.random_bool(p.parallel_share) {
                true => rng.random_range(2..=p.parallel_max),
                false => 1,
            };
            let call = u64::from(step) << 8;
            let mut longest_ms: f64 = 0.0;
            let mut outputs: Vec<Segment> = Vec::with_capacity(fan_out as usize);
            for branch in 0..fan_out {
                let output_tokens = match last {
                    true => tokens(len.answer.sample(&mut rng), output_max),
                    false => tokens(len.tool_call.sample(&mut rng), output_max),
                };
                let mut prompt = context.clone();
                if fan_out > 1 {
                    let id = segment_id(NS_BRANCH, session, call | u64::from(branch));
                    prompt.push(Segment::new(id, p.branch_tokens));
                }
                let input_tokens = segments_tokens(&prompt);
                if input_tokens > p.max_context_tokens {
                    break;
                }
                requests.push(SimRequest {
                    id: 0,
                    arrival_ms,
                    input_tokens,
                    output_tokens,
                    blocks: prompt_blocks(&prompt),
                    adapter: None,
                    session: Some(session),
                });
                let id = segment_id(NS_OUTPUT, session, call | u64::from(branch));
                outputs.push(Segment::new(id, output_tokens));
                longest_ms = longest_ms.max(
                    f64::from(input_tokens) * p.est_prefill_ms_per_token
                        + f64::from(output_tokens) * p.est_ms_per_output_token,
                );
            }
            if last || (outputs.len() as u32) < fan_out {
                break;
            }
            // The calls' outputs, then their tools' results, join the session's context.
            for (branch, out) in outputs.into_iter().enumerate() {
                context.push(out);
                let result = tokens(len.tool_result.sample(&mut rng), p.tool_result_tokens_max);
                let id = segment_id(NS_RESULT, session, call | branch as u64);
                context.push(Segment::new(id, result));
            }
            if p.compact_every > 0 && (step + 1) % p.compact_every == 0 {
                context.truncate(2);
                let id = segment_id(NS_SUMMARY, session, call);
                context.push(Segment::new(id, p.compact_summary_tokens));
            }
            arrival_ms += longest_ms + len.pause_ms.sample(&mut rng);
        }
    }
    let requests = finish(requests, p.max_requests);
    let workload = Workload {
        source: None,
        params: WorkloadParams::Agent(params.clone()),
        request_count: requests.len(),
        rate_scale: 1.0,
    };
    Ok((workload, requests))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seed: u64, max_requests: usize) -> AgentParams {
        AgentParams {
            seed,
            max_requests,
            ..AgentParams::default()
        }
    }

    #[test]
    fn compaction_keeps_only_the_agent_prompt_and_task_as_the_next_prefix() {
        let p = AgentParams {
            compact_every: 1,
            parallel_share: 0.0,
            steps_min: 3,
            steps_max: 3,
            ..params(5, 3)
        };
        let (_, reqs) = generate(&p).unwrap();
        assert_eq!(reqs.len(), 3);
        assert!(reqs.iter().all(|r| r.session == Some(0)));
        let shared = |a: &SimRequest, b: &SimRequest| {
            a.blocks
                .iter()
                .zip(&b.blocks)
                .take_while(|(x, y)| x == y)
                .count()
        };
        let head = shared(&reqs[0], &reqs[1]);
        // Step 1's prompt is agent + task + summary: it shares agent + task (every full block
        // of step 0's prompt but its partial last one) and no more.
        assert_eq!(head, reqs[0].blocks.len());
        assert_eq!(
            shared(&reqs[1], &reqs[2]),
            head,
            "compacted again after step 1"
        );
        let plain = generate(&AgentParams {
            compact_every: 0,
            ..p.clone()
        })
        .unwrap()
        .1;
        assert!(
            shared(&plain[1], &plain[2]) > head,
            "without compaction the history stays"
        );
    }

    #[test]
    fn same_seed_same_workload_other_seed_other_workload() {
        let (w, a) = generate(&params(7, 400)).unwrap();
        let (_, b) = generate(&params(7, 400)).unwrap();
        let (_, c) = generate(&params(8, 400)).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!((w.request_count, a.len()), (400, 400));
        assert_eq!(w.params.kind(), "agent");
    }

    #[test]
    fn requests_are_in_arrival_order_and_within_the_context() {
        let p = AgentParams {
            max_context_tokens: 6000,
            ..params(1, 1000)
        };
        let (_, reqs) = generate(&p).unwrap();
        assert_eq!(reqs.len(), 1000);
        for (i, w) in reqs.windows(2).enumerate() {
            assert!(w[0].arrival_ms <= w[1].arrival_ms, "request {i}");
        }
        for (i, r) in reqs.iter().enumerate() {
            assert_eq!(r.id, i as u64);
            assert_eq!(r.blocks.len(), (r.input_tokens / 16) as usize);
            assert!(r.input_tokens <= 6000 && r.output_tokens >= 1);
        }
    }

    /// Fan-outs: calls arriving at one instant share everything but their last block or so,
    /// and a later step extends the context of an earlier one.
    #[test]
    fn parallel_calls_share_the_session_and_later_steps_extend_it() {
        let (_, reqs) = generate(&params(3, 2000)).unwrap();
        let mut fanned = 0;
        for w in reqs.windows(2) {
            if w[0].arrival_ms == w[1].arrival_ms {
                let shared = w[0]
                    .blocks
                    .iter()
                    .zip(&w[1].blocks)
                    .take_while(|(a, b)| a == b)
                    .count();
                // The branch instruction (48 tokens) touches at most 4 blocks.
                assert!(shared + 4 >= w[0].blocks.len().min(w[1].blocks.len()));
                fanned += 1;
            }
        }
        assert!(fanned > 100, "{fanned} fan-out pairs");
        let extended = reqs
            .iter()
            .enumerate()
            .filter(|(i, r)| {
                reqs[..*i].iter().any(|q| {
                    q.blocks.len() > 100
                        && q.blocks.len() < r.blocks.len()
                        && r.blocks.starts_with(&q.blocks[..q.blocks.len() - 4])
                })
            })
            .count();
        assert!(extended > reqs.len() / 2, "{extended} of {}", reqs.len());
    }

    #[test]
    fn outputs_are_short_tool_calls_and_pauses_are_seconds() {
        let p = AgentParams {
            session_rate_per_s: 1e-9, // one session at a time
            parallel_share: 0.0,
            steps_min: 6,
            steps_max: 6,
            ..params(5, 6)
        };
        let (_, reqs) = generate(&p).unwrap();
        assert_eq!(reqs.len(), 6);
        for w in reqs.windows(2) {
            assert!(w[1].blocks.starts_with(&w[0].blocks));
            let gap_s = (w[1].arrival_ms - w[0].arrival_ms) / 1000.0;
            assert!((0.05..120.0).contains(&gap_s), "gap {gap_s} s");
        }
        let median = |mut v: Vec<u32>| {
            v.sort_unstable();
            v[v.len() / 2]
        };
        let (_, many) = generate(&params(9, 3000)).unwrap();
        let outs = median(many.iter().map(|r| r.output_tokens).collect());
        assert!((30..=120).contains(&outs), "median output {outs}");
    }

    #[test]
    fn bad_parameters_are_errors() {
        for p in [
            AgentParams {
                session_rate_per_s: 0.0,
                ..params(0, 10)
            },
            AgentParams {
                agents: 0,
                ..params(0, 10)
            },
            AgentParams {
                steps_min: 3,
                steps_max: 2,
                ..params(0, 10)
            },
            AgentParams {
                parallel_share: 1.5,
                ..params(0, 10)
            },
            AgentParams {
                parallel_max: 1,
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
