//! What to send and when: a workload (trace or generator) turned into [`Planned`] requests.
//!
//! Trace files go through the simulator's reader ([`kvgate_sim::workload::load_trace`]), so
//! arrival times (Mooncake's 3-second buckets spread out), validation and `--max-requests` are the
//! simulator's. For Mooncake files the `hash_ids` are read once more here, line by line, because
//! the prompt text is synthesised from them ([`crate::prompt::mooncake_prompt`]).

use std::path::Path;

use kvgate_sim::SimRequest;
use kvgate_sim::workload::{
    self, Workload, WorkloadError, WorkloadParams, agent, burst, chat,
    mooncake::MOONCAKE_BLOCK_TOKENS, shared_prefix,
};
use serde::Deserialize;

use crate::prompt;

/// Where the prompt text of a request comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptSource {
    /// Mooncake `hash_ids` (only the `ceil(input / 512)` used ones).
    HashIds(Vec<u64>),
    /// The simulator's chained 16-token block hashes.
    Blocks(Vec<u64>),
}

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub id: u64,
    /// Milliseconds from the start of the run (already scaled by `--rate-scale`).
    pub arrival_ms: f64,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub source: PromptSource,
    /// The client session it belongs to (the agent workload's), for `--session-header`.
    pub session: Option<u64>,
}

impl Planned {
    /// The prompt text (built on demand; a long trace would not fit in memory as text).
    pub fn prompt(&self) -> String {
        match &self.source {
            PromptSource::HashIds(ids) => prompt::mooncake_prompt(ids, self.input_tokens),
            PromptSource::Blocks(b) => prompt::blocks_prompt(b, self.input_tokens, self.id),
        }
    }
}

/// A generated workload, as in `kvgate sim --workload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeneratedWorkload {
    Chat,
    SharedPrefix,
    Agent,
    Burst,
}

impl GeneratedWorkload {
    /// Every workload, in the order `kvgate loadgen --help` lists them.
    pub const ALL: [GeneratedWorkload; 4] = [
        GeneratedWorkload::Chat,
        GeneratedWorkload::SharedPrefix,
        GeneratedWorkload::Agent,
        GeneratedWorkload::Burst,
    ];

    /// The name in `--workload`.
    pub fn name(self) -> &'static str {
        match self {
            GeneratedWorkload::Chat => "chat",
            GeneratedWorkload::SharedPrefix => "shared-prefix",
            GeneratedWorkload::Agent => "agent",
            GeneratedWorkload::Burst => "burst",
        }
    }
}

impl std::str::FromStr for GeneratedWorkload {
    type Err = String;

    /// By [`GeneratedWorkload::name`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| format!("unknown workload `{s}` (chat, shared-prefix, agent or burst)"))
    }
}

#[derive(Deserialize)]
struct IdsLine {
    hash_ids: Vec<u64>,
}

/// The `hash_ids` of every non-empty line of a Mooncake file (already validated by the reader).
fn mooncake_ids(source_name: &str, text: &str) -> Result<Vec<Vec<u64>>, WorkloadError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let l: IdsLine = serde_json::from_str(raw).map_err(|e| WorkloadError::BadLine {
            source_name: source_name.to_owned(),
            line: i + 1,
            reason: e.to_string(),
        })?;
        out.push(l.hash_ids);
    }
    Ok(out)
}

/// Loads a trace file and plans its requests.
pub fn from_trace(path: &Path) -> Result<(Workload, Vec<Planned>), WorkloadError> {
    let (workload, requests) = workload::load_trace(path)?;
    let ids = if matches!(workload.params, WorkloadParams::MooncakeTrace { .. }) {
        let text = std::fs::read_to_string(path).map_err(|source| WorkloadError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let name = workload.source.clone().unwrap_or_default();
        Some(mooncake_ids(&name, text.trim_start_matches('\u{feff}'))?)
    } else {
        None
    };
    let planned = requests
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let source = match ids.as_ref().and_then(|all| all.get(i)) {
                Some(line_ids) => {
                    let used = r.input_tokens.div_ceil(MOONCAKE_BLOCK_TOKENS) as usize;
                    PromptSource::HashIds(line_ids.iter().take(used).copied().collect())
                }
                None => PromptSource::Blocks(r.blocks.clone()),
            };
            planned(r, source)
        })
        .collect();
    Ok((workload, planned))
}

fn planned(r: SimRequest, source: PromptSource) -> Planned {
    Planned {
        id: r.id,
        arrival_ms: r.arrival_ms,
        input_tokens: r.input_tokens,
        output_tokens: r.output_tokens,
        source,
        session: r.session,
    }
}

/// What [`generated`] generates besides the workload's kind.
#[derive(Debug, Clone, Copy)]
pub struct GenerateOptions<'a> {
    /// Shared-prefix preset: A–D.
    pub preset: &'a str,
    pub seed: u64,
    pub max_requests: Option<usize>,
    /// Chat and agent: end a session before a prompt longer than this (default: the
    /// generator's, 32k).
    pub max_context_tokens: Option<u32>,
    /// Agent: compact each session's history every N steps (0: never).
    pub agent_compact_every: u32,
}

/// Generates a workload and plans its requests.
pub fn generated(
    kind: GeneratedWorkload,
    options: &GenerateOptions<'_>,
) -> Result<(Workload, Vec<Planned>), WorkloadError> {
    let GenerateOptions {
        preset,
        seed,
        max_requests,
        max_context_tokens,
        agent_compact_every,
    } = *options;
    let (workload, requests) = match kind {
        GeneratedWorkload::Chat => {
            let d = chat::ChatParams::default();
            chat::generate(&chat::ChatParams {
                seed,
                max_requests: max_requests.unwrap_or(d.max_requests),
                max_context_tokens: max_context_tokens.unwrap_or(d.max_context_tokens),
                ..d
            })?
        }
        GeneratedWorkload::Agent => {
            let d = agent::AgentParams::default();
            agent::generate(&agent::AgentParams {
                seed,
                max_requests: max_requests.unwrap_or(d.max_requests),
                max_context_tokens: max_context_tokens.unwrap_or(d.max_context_tokens),
                compact_every: agent_compact_every,
                ..d
            })?
        }
        GeneratedWorkload::Burst => {
            let d = burst::BurstParams::default();
            burst::generate(&burst::BurstParams {
                seed,
                max_requests: max_requests.unwrap_or(d.max_requests),
                ..d
            })?
        }
        GeneratedWorkload::SharedPrefix => {
            let p = shared_prefix::SharedPrefixParams::preset(preset).ok_or_else(|| {
                WorkloadError::InvalidParam {
                    name: "preset",
                    reason: format!("unknown preset {preset:?}; expected A, B, C or D"),
                }
            })?;
            shared_prefix::generate(&shared_prefix::SharedPrefixParams {
                seed,
                max_requests: max_requests.unwrap_or(p.max_requests),
                ..p
            })?
        }
    };
    let planned = requests
        .into_iter()
        .map(|r| {
            let b = PromptSource::Blocks(r.blocks.clone());
            planned(r, b)
        })
        .collect();
    Ok((workload, planned))
}

/// Keeps the first `max` requests and scales arrivals by `rate_scale` (finite, > 0).
pub fn trim_and_scale(
    workload: &mut Workload,
    requests: &mut Vec<Planned>,
    max: Option<usize>,
    rate_scale: f64,
) -> Result<(), WorkloadError> {
    if let Some(n) = max
        && requests.len() > n
    {
        requests.truncate(n);
        workload.request_count = n;
    }
    if !(rate_scale.is_finite() && rate_scale > 0.0) {
        return Err(WorkloadError::InvalidParam {
            name: "rate_scale",
            reason: format!("must be finite and > 0, got {rate_scale}"),
        });
    }
    for r in requests.iter_mut() {
        r.arrival_ms /= rate_scale;
    }
    workload.rate_scale *= rate_scale;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(compact_every: u32) -> Vec<Planned> {
        let options = GenerateOptions {
            preset: "A",
            seed: 1,
            max_requests: Some(200),
            max_context_tokens: None,
            agent_compact_every: compact_every,
        };
        generated(GeneratedWorkload::Agent, &options).unwrap().1
    }

    #[test]
    fn agent_requests_carry_their_session_and_compaction_rewrites_prompts() {
        let plain = agent(0);
        assert!(plain.iter().all(|p| p.session.is_some()));
        let sessions: std::collections::HashSet<_> = plain.iter().map(|p| p.session).collect();
        assert!(sessions.len() > 1, "several sessions");
        let compacted = agent(2);
        assert!(compacted.iter().all(|p| p.session.is_some()));
        let blocks = |p: &Planned| match &p.source {
            PromptSource::Blocks(b) => b.clone(),
            PromptSource::HashIds(_) => unreachable!("generated prompts are blocks"),
        };
        let rewritten = plain
            .iter()
            .zip(&compacted)
            .filter(|(a, b)| blocks(a) != blocks(b))
            .count();
        assert!(rewritten > 0, "compaction changed no prompt");
        // Other workloads carry no session.
        let chat = generated(
            GeneratedWorkload::Chat,
            &GenerateOptions {
                preset: "A",
                seed: 1,
                max_requests: Some(20),
                max_context_tokens: None,
                agent_compact_every: 0,
            },
        )
        .unwrap()
        .1;
        assert!(chat.iter().all(|p| p.session.is_none()));
    }

    #[test]
    fn burst_siblings_share_their_prefix_text_and_arrive_together() {
        let options = GenerateOptions {
            preset: "A",
            seed: 3,
            max_requests: Some(30),
            max_context_tokens: None,
            agent_compact_every: 0,
        };
        let (workload, planned) = generated(GeneratedWorkload::Burst, &options).unwrap();
        assert_eq!(workload.params.kind(), "burst");
        assert_eq!(planned.len(), 30);
        let (a, b) = (planned[0].prompt(), planned[1].prompt());
        let common = a
            .split(' ')
            .zip(b.split(' '))
            .take_while(|(x, y)| x == y)
            .count();
        let words = a.split(' ').count();
        // The 1,200-token prefix of 1,240 tokens: nearly all the words, not all.
        assert!(
            common * 100 >= words * 90 && common < words,
            "{common} of {words}"
        );
        assert!(planned[1].arrival_ms - planned[0].arrival_ms <= 50.0);
        assert!(planned.iter().all(|p| p.session.is_none()));
    }
}
