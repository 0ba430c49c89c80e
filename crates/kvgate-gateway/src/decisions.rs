//! The `/debug/decisions` ring: the last N decisions with their explanations.
//!
//! Bound: at most `capacity` records (config `decision_log_size`, default 256), each O(pods).

use kvgate_core::Decision;
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
    /// SLOs the client sent (`x-slo-ttft-ms` / `x-llm-d-slo-ttft-ms`, …); with any and the
    /// router's `slo_routing` on, the decision was made in SLO mode (its `slo` explains it for
    /// the affinity gate).
    pub slo_ttft_ms: Option<f64>,
    pub slo_tpot_ms: Option<f64>,
    /// Uncached prompt tokens the session charged the chosen pod (`input − matched blocks ×
    /// block size`, the core's one charge formula).
    pub charged_prefill_tokens: u64,
    /// Flow control's class and the time the request waited in its queue (absent with flow
    /// control off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowNote>,
    #[serde(flatten)]
    pub decision: Decision,
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
}

impl DecisionLog {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        DecisionLog {
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            capacity,
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
        let log = DecisionLog::new(2);
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
                decision: Decision {
                    pod: "p".into(),
                    pod_id: PodId(0),
                    branch: Branch::Exploit,
                    pods: vec![],
                    gate: None,
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
