//! The `/debug/decisions` ring: the last N decisions with their explanations; and, with
//! `--decisions-log FILE`, every routed request's record completed with what then happened
//! (`observed`, `ended_ms`), one JSON line per request when it ends ([`crate::jsonl`]).
//!
//! Bound: at most `capacity` records (config `decision_log_size`, default 256), each O(pods);
//! the file's queue at most [`crate::jsonl::QUEUE`] records (more are dropped, counted in
//! `kvgate_decisions_log_dropped_total`).

use crate::jsonl::JsonLines;
use kvgate_core::{Decision, Observed, PodSnapshot};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::VecDeque;

/// One logged decision: the core's `Decision` serialisation plus request id and time.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionRecord {
    pub request_id: String,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    pub policy: &'static str,
    /// 0 for the first try, 1.. for retries of the same request.
    pub attempt: u32,
    /// SLOs the client sent (`x-slo-ttft-ms` / `x-llm-d-slo-ttft-ms`, …); recorded (the
    /// `llmd-chain` policy routes by them, and its decision's `slo` explains it).
    pub slo_ttft_ms: Option<f64>,
    pub slo_tpot_ms: Option<f64>,
    /// Uncached prompt tokens the session charged the chosen pod (`input − matched blocks ×
    /// block size`, the core's one charge formula).
    pub charged_prefill_tokens: u64,
    /// Flow control's class and the time the request waited in its queue (absent with flow
    /// control off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowNote>,
    /// Each pod's load as the decision saw it: its scraped queue and KV use, and the session's
    /// in-flight ledger (kvgate's own requests, this one not yet charged).
    pub load: Vec<PodLoad>,
    /// `--decisions-log` only: what a stream did, measured (absent for a whole-body answer,
    /// whose first byte is its end, and for an attempt that ended without an answer: an
    /// error, a client gone, a retry elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<Observed>,
    /// `--decisions-log` only: when the request ended, ms since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    #[serde(flatten)]
    pub decision: Decision,
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One pod's load at a decision ([`DecisionRecord::load`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodLoad {
    pub id: String,
    /// The pod's own `num_requests_waiting` / `running` and KV-cache use, last scrape.
    pub waiting: u32,
    pub running: u32,
    pub kv_usage: f64,
    /// The session's ledger for the pod: requests, uncached prompt tokens not yet past their
    /// first token, decode tokens of requests past it.
    pub in_flight_requests: u32,
    pub in_flight_prefill_tokens: u64,
    pub in_flight_decode_tokens: u64,
}

impl PodLoad {
    pub fn of(snap: &PodSnapshot) -> Self {
        PodLoad {
            id: snap.name.to_string(),
            waiting: snap.waiting,
            running: snap.running,
            kv_usage: snap.kv_usage,
            in_flight_requests: snap.in_flight.requests,
            in_flight_prefill_tokens: snap.in_flight.prefill_tokens,
            in_flight_decode_tokens: snap.in_flight.decode_tokens,
        }
    }
}

/// What `/debug/decisions` shows of a request's flow control (`flow`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlowNote {
    pub priority: i32,
    pub band: i32,
    pub tenant: String,
    /// Time spent in the flow queue, ms (0: dispatched at once).
    pub queue_ms: f64,
}

pub struct DecisionLog {
    ring: Mutex<VecDeque<DecisionRecord>>,
    capacity: usize,
    /// `--decisions-log FILE`, given at start.
    file: Option<JsonLines<DecisionRecord>>,
}

impl DecisionLog {
    /// A ring of `capacity` records; with `file`, every routed request's completed record is
    /// also written there.
    pub fn new(capacity: usize, file: Option<JsonLines<DecisionRecord>>) -> Self {
        let capacity = capacity.max(1);
        DecisionLog {
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            capacity,
            file,
        }
    }

    /// Whether `--decisions-log` is on (then a request's guard carries its record to its end).
    pub fn logs_outcomes(&self) -> bool {
        self.file.is_some()
    }

    /// A request ended now: its record, completed, goes to the file (if any).
    pub fn ended(&self, mut record: DecisionRecord, observed: Option<Observed>) {
        if let Some(file) = &self.file {
            record.observed = observed;
            record.ended_ms = Some(unix_ms());
            file.send(record);
        }
    }

    pub fn push(&self, record: DecisionRecord) {
        let mut ring = self.ring.lock();
        if ring.len() >= self.capacity {
            ring.pop_front();
        }
        ring.push_back(record);
    }

    /// Oldest first.
    pub fn snapshot(&self) -> Vec<DecisionRecord> {
        self.ring.lock().iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_core::{Branch, PodId};

    #[test]
    fn ring_keeps_only_the_last_capacity_records() {
        let log = DecisionLog::new(2, None);
        for i in 0..5 {
            log.push(DecisionRecord {
                request_id: i.to_string(),
                timestamp_ms: i,
                policy: "affinity-gate",
                attempt: 0,
                slo_ttft_ms: None,
                slo_tpot_ms: None,
                charged_prefill_tokens: 0,
                flow: None,
                load: vec![],
                observed: None,
                ended_ms: None,
                decision: Decision {
                    pod: "p".into(),
                    pod_id: PodId(0),
                    branch: Branch::Exploit,
                    pods: vec![],
                    slo: None,
                    decode: None,
                },
            });
        }
        let ids: Vec<_> = log.snapshot().into_iter().map(|r| r.request_id).collect();
        assert_eq!(ids, vec!["3", "4"]);
        let json = serde_json::to_value(&log.snapshot()[0]).unwrap();
        assert_eq!(json["branch"], "exploit");
        assert_eq!(json["pod"], "p");
    }
}
