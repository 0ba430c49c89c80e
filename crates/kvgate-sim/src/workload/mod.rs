//! Workloads: trace readers (Mooncake JSONL, Azure CSV) and seeded generators (multi-turn chat,
//! llm-d's shared-prefix scenarios, agent sessions, sibling bursts), all producing
//! [`SimRequest`]s in arrival order.
//!
//! - [`load_trace`] reads a trace file and detects its format from the content: a first
//!   non-empty line starting with `{` is Mooncake JSON Lines ([`mooncake`]); a CSV header with
//!   `TIMESTAMP`, `ContextTokens`, `GeneratedTokens` is the Azure LLM trace ([`azure`]).
//! - [`chat::generate`], [`shared_prefix::generate`], [`agent::generate`] and
//!   [`burst::generate`] build synthetic workloads from a seed.
//! - [`scale_rate`] speeds a workload up or down (arrival times ÷ `rate_scale`).
//!
//! Bad input policy: trace files are something a user passes on the command line, so a malformed
//! line is an error naming the file and the 1-based line number ([`WorkloadError::BadLine`]) —
//! never skipped silently, never a panic. Prompts are turned into block hashes through
//! [`segments`], so the same sharing rules hold for traces and generators.

pub mod agent;
pub mod azure;
pub mod burst;
pub mod chat;
pub mod classes;
pub mod mooncake;
pub mod segments;
pub mod shared_prefix;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::SimRequest;

/// Longest prompt a trace line may claim (4M tokens = 262,144 blocks); longer is rejected as
/// absurd rather than allocated.
pub const MAX_INPUT_TOKENS: u32 = 1 << 22;
/// Longest output a trace line may claim.
pub const MAX_OUTPUT_TOKENS: u32 = 1 << 20;

/// What a run replayed, for reports: the source, its parameters, how many requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// File name of the trace (no directories), `None` for generators.
    pub source: Option<String>,
    /// Kind and parameters.
    pub params: WorkloadParams,
    /// Number of requests produced.
    pub request_count: usize,
    /// Factor the arrival rate was multiplied by (see [`Workload::scale_rate`]); 1.0 = as loaded.
    pub rate_scale: f64,
}

/// The kind of a workload and the parameters it was produced with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum WorkloadParams {
    /// Mooncake FAST'25 JSON Lines; requests sharing a timestamp spread over `bucket_ms`.
    MooncakeTrace { bucket_ms: f64 },
    /// Azure LLM inference trace 2023 (CSV); no prefix information, so no sharing.
    AzureTrace,
    /// Multi-turn chat sessions.
    Chat(chat::ChatParams),
    /// llm-d / inference-perf shared-prefix groups.
    SharedPrefix(shared_prefix::SharedPrefixParams),
    /// Agent sessions: tool calls, tool pauses and parallel calls.
    Agent(agent::AgentParams),
    /// Sibling bursts sharing a new prefix.
    Burst(burst::BurstParams),
}

impl WorkloadParams {
    /// Short name of the kind, as in reports (`mooncake-trace`, `chat`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            WorkloadParams::MooncakeTrace { .. } => "mooncake-trace",
            WorkloadParams::AzureTrace => "azure-trace",
            WorkloadParams::Chat(_) => "chat",
            WorkloadParams::SharedPrefix(_) => "shared-prefix",
            WorkloadParams::Agent(_) => "agent",
            WorkloadParams::Burst(_) => "burst",
        }
    }
}

impl Workload {
    /// Scales the arrival rate of `requests` by `rate_scale` and records it.
    pub fn scale_rate(
        &mut self,
        requests: &mut [SimRequest],
        rate_scale: f64,
    ) -> Result<(), WorkloadError> {
        scale_rate(requests, rate_scale)?;
        self.rate_scale *= rate_scale;
        Ok(())
    }
}

/// Errors of trace readers and generators.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("cannot read trace {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{source_name}: unrecognized trace format (expected Mooncake JSON Lines, or an Azure CSV \
         whose header has TIMESTAMP,ContextTokens,GeneratedTokens)"
    )]
    UnknownFormat { source_name: String },
    #[error("{source_name}:{line}: {reason}")]
    BadLine {
        source_name: String,
        /// 1-based line number.
        line: usize,
        reason: String,
    },
    #[error("{source_name}: the trace holds no requests")]
    Empty { source_name: String },
    #[error("invalid workload parameter {name}: {reason}")]
    InvalidParam { name: &'static str, reason: String },
}

/// Reads a trace file, detecting Mooncake JSONL vs Azure CSV from its content.
pub fn load_trace(path: impl AsRef<Path>) -> Result<(Workload, Vec<SimRequest>), WorkloadError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| WorkloadError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    parse_trace(&name, &bytes)
}

/// Parses the bytes of a trace file named `source_name` (see [`load_trace`]).
pub fn parse_trace(
    source_name: &str,
    bytes: &[u8],
) -> Result<(Workload, Vec<SimRequest>), WorkloadError> {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let line = 1 + bytes
                .iter()
                .take(e.valid_up_to())
                .filter(|&&b| b == b'\n')
                .count();
            return Err(WorkloadError::BadLine {
                source_name: source_name.to_owned(),
                line,
                reason: "not valid UTF-8".to_owned(),
            });
        }
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let first = text.lines().map(str::trim).find(|l| !l.is_empty());
    let (params, requests) = match first {
        None => {
            return Err(WorkloadError::Empty {
                source_name: source_name.to_owned(),
            });
        }
        Some(l) if l.starts_with('{') => {
            let bucket_ms = mooncake::MOONCAKE_BUCKET_MS;
            let reqs = mooncake::parse(source_name, text, bucket_ms)?;
            (WorkloadParams::MooncakeTrace { bucket_ms }, reqs)
        }
        Some(l) if azure::is_header(l) => {
            (WorkloadParams::AzureTrace, azure::parse(source_name, text)?)
        }
        Some(_) => {
            return Err(WorkloadError::UnknownFormat {
                source_name: source_name.to_owned(),
            });
        }
    };
    if requests.is_empty() {
        return Err(WorkloadError::Empty {
            source_name: source_name.to_owned(),
        });
    }
    let workload = Workload {
        source: Some(source_name.to_owned()),
        params,
        request_count: requests.len(),
        rate_scale: 1.0,
    };
    Ok((workload, requests))
}

/// Multiplies the arrival rate by `rate_scale` (arrival times ÷ `rate_scale`): 2.0 replays the
/// workload twice as fast. `rate_scale` must be finite and > 0.
pub fn scale_rate(requests: &mut [SimRequest], rate_scale: f64) -> Result<(), WorkloadError> {
    if !(rate_scale.is_finite() && rate_scale > 0.0) {
        return Err(WorkloadError::InvalidParam {
            name: "rate_scale",
            reason: format!("must be finite and > 0, got {rate_scale}"),
        });
    }
    for r in requests {
        r.arrival_ms /= rate_scale;
    }
    Ok(())
}

/// Checks that a generator parameter is finite and > 0.
fn positive(name: &'static str, v: f64) -> Result<f64, WorkloadError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(WorkloadError::InvalidParam {
            name,
            reason: format!("must be finite and > 0, got {v}"),
        })
    }
}

/// Checks a token-length parameter: at least 1 and at most [`MAX_INPUT_TOKENS`].
fn token_count(name: &'static str, v: u32) -> Result<u32, WorkloadError> {
    if (1..=MAX_INPUT_TOKENS).contains(&v) {
        Ok(v)
    } else {
        Err(WorkloadError::InvalidParam {
            name,
            reason: format!("must be in 1..={MAX_INPUT_TOKENS}, got {v}"),
        })
    }
}

/// Sorts generated requests by arrival (ties keep generation order), keeps the first
/// `max_requests`, and numbers them 0, 1, 2, ….
fn finish(mut requests: Vec<SimRequest>, max_requests: usize) -> Vec<SimRequest> {
    requests.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    requests.truncate(max_requests);
    for (i, r) in requests.iter_mut().enumerate() {
        r.id = i as u64;
    }
    requests
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(arrival_ms: f64) -> SimRequest {
        SimRequest {
            id: 0,
            arrival_ms,
            input_tokens: 16,
            output_tokens: 1,
            blocks: vec![1],
            adapter: None,
            session: None,
        }
    }

    #[test]
    fn scale_rate_divides_arrival_times() {
        let mut reqs = vec![req(0.0), req(1000.0), req(3000.0)];
        scale_rate(&mut reqs, 2.0).unwrap();
        let t: Vec<f64> = reqs.iter().map(|r| r.arrival_ms).collect();
        assert_eq!(t, vec![0.0, 500.0, 1500.0]);
    }

    #[test]
    fn scale_rate_rejects_non_positive_factors() {
        let mut reqs = vec![req(10.0)];
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                scale_rate(&mut reqs, bad),
                Err(WorkloadError::InvalidParam {
                    name: "rate_scale",
                    ..
                })
            ));
        }
        assert_eq!(reqs[0].arrival_ms, 10.0);
    }

    #[test]
    fn unknown_format_and_empty_files_are_errors() {
        assert!(matches!(
            parse_trace("x.txt", b"hello,world\n1,2\n"),
            Err(WorkloadError::UnknownFormat { .. })
        ));
        assert!(matches!(
            parse_trace("x", b"\n  \n"),
            Err(WorkloadError::Empty { .. })
        ));
        assert!(matches!(
            parse_trace("x", b"TIMESTAMP,ContextTokens,GeneratedTokens\n"),
            Err(WorkloadError::Empty { .. })
        ));
    }

    #[test]
    fn invalid_utf8_is_reported_with_its_line() {
        let err = parse_trace("x", b"{\"a\":1}\n\xff\n").unwrap_err();
        assert!(
            matches!(err, WorkloadError::BadLine { line: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn workload_description_serializes_with_its_kind() {
        let w = Workload {
            source: Some("t.jsonl".into()),
            params: WorkloadParams::MooncakeTrace { bucket_ms: 3000.0 },
            request_count: 3,
            rate_scale: 1.0,
        };
        let v = serde_json::to_value(&w).unwrap();
        assert_eq!(v["params"]["kind"], "mooncake-trace");
        assert_eq!(v["request_count"], 3);
        let back: Workload = serde_json::from_value(v).unwrap();
        assert_eq!(back, w);
    }
}
