//! Pod outages in a simulated run (`kvgate sim --faults`): which pods go down when, and what the
//! run saw because of it.
//!
//! ## Model
//!
//! An outage is a pod process dying at `down_ms` and serving again at `up_ms`:
//! - at `down_ms` the engine drops every running and waiting request and comes back with an empty
//!   KV cache ([`crate::engine::Engine::crash`]);
//! - requests on it that had **no first token yet** are retried at once on another pod (the dead
//!   pod excluded for them), at most [`MAX_RETRIES`] times, as the gateway retries an attempt that
//!   failed before any response byte; their TTFT keeps counting from the original arrival;
//!   requests that were **already streaming** fail (the gateway can only end the stream with an
//!   error event);
//! - while down, a dispatch to the pod is refused at once (connection refused): the router marks
//!   the pod unhealthy and decides again without it; scrapes fail, so the next scrape also marks
//!   it unhealthy; the first scrape after `up_ms` marks it healthy again;
//! - with the routed index the router is not told that the pod restarted: the index still
//!   believes the pod holds what was routed there until LRU ages it out (as the HTTP gateway
//!   with `--index routed`); with `--index engine` the pod's view is cleared once the restart's
//!   news arrives (`--event-delay-ms` later), as the gateway clears a pod whose event sequence
//!   starts again from 0.
//!
//! Nothing is lost: every request ends completed, rejected (no pod could take it) or failed
//! (mid-stream, or out of retries), and `completed + rejected + failed == requests`.
//!
//! ## Spec (`--faults`)
//!
//! - `POD@DOWN_S-UP_S[,POD@DOWN_S-UP_S…]`: explicit outages, times in seconds of (rate-scaled)
//!   simulated time, e.g. `3@60-90,5@120-125`;
//! - `every=PERIOD_S,down=DOWN_S[,start=START_S]`: pod 0 goes down at `START_S` (default
//!   `PERIOD_S`) for `DOWN_S`, pod 1 at `START_S + PERIOD_S`, and so on round-robin until the last
//!   arrival — the soak test's "kill one pod every minute".
//!
//! ## Report
//!
//! [`FaultReport`]: outage count, retried attempts, failures by kind; TTFT by *phase* of the
//! request's arrival relative to the outages ([`PHASES`]: before any outage, while a pod is down,
//! 0–10 s / 10–30 s / ≥ 30 s after a pod came back) to show how TTFT degrades and recovers; and a
//! timeline of TTFT by arrival window ([`DEFAULT_WINDOW_MS`], 10 s) with the pods down in each.
//! Memory: two `f64` per completed request plus one row per window.

use serde::Serialize;

use crate::stats::nearest_rank;

/// Attempts after the first for a request whose pod died before its first token (the gateway's
/// default `max_retries`).
pub const MAX_RETRIES: u8 = 2;
/// Width of a timeline window.
pub const DEFAULT_WINDOW_MS: f64 = 10_000.0;
/// At most this many outages are generated from an `every=` spec (bounds memory on long runs).
pub const MAX_OUTAGES: usize = 100_000;

/// Phases of an arrival relative to the outages, in [`FaultReport::phases`] order.
pub const PHASES: [&str; 5] = [
    "before any outage",
    "a pod is down",
    "0-10 s after a pod came back",
    "10-30 s after",
    ">= 30 s after",
];

/// One pod down from `down_ms` to `up_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Outage {
    pub pod: u32,
    pub down_ms: f64,
    pub up_ms: f64,
}

/// A parsed `--faults` spec.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultPlan {
    /// Outages at fixed times.
    Explicit(Vec<Outage>),
    /// Round-robin outages: one pod down for `down_ms` every `every_ms`, from `start_ms`.
    Periodic {
        every_ms: f64,
        down_ms: f64,
        start_ms: f64,
    },
}

/// Why a `--faults` spec was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FaultSpecError {
    #[error(
        "bad fault `{0}`: expected POD@DOWN_S-UP_S (e.g. 3@60-90) or every=PERIOD_S,down=DOWN_S[,start=S]"
    )]
    Syntax(String),
    #[error("fault `{0}`: the pod must come back after it goes down (UP_S > DOWN_S ≥ 0)")]
    Order(String),
    #[error("fault `{0}`: period and down time must be positive and down < period")]
    Period(String),
    #[error("faults `{0}` and `{1}` take the same pod down at overlapping times")]
    Overlap(String, String),
}

fn seconds(s: &str, item: &str) -> Result<f64, FaultSpecError> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v * 1000.0),
        _ => Err(FaultSpecError::Syntax(item.to_string())),
    }
}

impl FaultPlan {
    pub fn parse(spec: &str) -> Result<Self, FaultSpecError> {
        let spec = spec.trim();
        if spec.starts_with("every=") {
            let (mut every, mut down, mut start) = (None, None, None);
            for item in spec.split(',') {
                let (key, value) = item
                    .split_once('=')
                    .ok_or_else(|| FaultSpecError::Syntax(item.to_string()))?;
                let v = seconds(value, item)?;
                match key.trim() {
                    "every" => every = Some(v),
                    "down" => down = Some(v),
                    "start" => start = Some(v),
                    _ => return Err(FaultSpecError::Syntax(item.to_string())),
                }
            }
            let (Some(every_ms), Some(down_ms)) = (every, down) else {
                return Err(FaultSpecError::Syntax(spec.to_string()));
            };
            if every_ms <= 0.0 || down_ms <= 0.0 || down_ms >= every_ms {
                return Err(FaultSpecError::Period(spec.to_string()));
            }
            return Ok(FaultPlan::Periodic {
                every_ms,
                down_ms,
                start_ms: start.unwrap_or(every_ms),
            });
        }
        let mut outages = Vec::new();
        for item in spec.split(',').filter(|s| !s.trim().is_empty()) {
            let (pod, window) = item
                .split_once('@')
                .ok_or_else(|| FaultSpecError::Syntax(item.to_string()))?;
            let pod: u32 = pod
                .trim()
                .parse()
                .map_err(|_| FaultSpecError::Syntax(item.to_string()))?;
            let (down, up) = window
                .split_once('-')
                .ok_or_else(|| FaultSpecError::Syntax(item.to_string()))?;
            let (down_ms, up_ms) = (seconds(down, item)?, seconds(up, item)?);
            if up_ms <= down_ms {
                return Err(FaultSpecError::Order(item.to_string()));
            }
            outages.push((
                item.trim(),
                Outage {
                    pod,
                    down_ms,
                    up_ms,
                },
            ));
        }
        if outages.is_empty() {
            return Err(FaultSpecError::Syntax(spec.to_string()));
        }
        for (i, (a_item, a)) in outages.iter().enumerate() {
            for (b_item, b) in &outages[i + 1..] {
                if a.pod == b.pod && a.down_ms < b.up_ms && b.down_ms < a.up_ms {
                    return Err(FaultSpecError::Overlap(
                        a_item.to_string(),
                        b_item.to_string(),
                    ));
                }
            }
        }
        Ok(FaultPlan::Explicit(
            outages.into_iter().map(|(_, o)| o).collect(),
        ))
    }

    /// The outages of a run on `pods` pods whose last arrival is at `horizon_ms`, sorted by
    /// `down_ms`. Explicit outages naming a pod past the fleet are dropped.
    pub fn outages(&self, pods: u32, horizon_ms: f64) -> Vec<Outage> {
        let mut out = match self {
            FaultPlan::Explicit(list) => list.iter().copied().filter(|o| o.pod < pods).collect(),
            FaultPlan::Periodic {
                every_ms,
                down_ms,
                start_ms,
            } => {
                let mut list = Vec::new();
                let mut t = *start_ms;
                let mut pod = 0;
                while t <= horizon_ms && pods > 0 && list.len() < MAX_OUTAGES {
                    list.push(Outage {
                        pod,
                        down_ms: t,
                        up_ms: t + down_ms,
                    });
                    pod = (pod + 1) % pods;
                    t += every_ms;
                }
                list
            }
        };
        out.sort_by(|a, b| a.down_ms.total_cmp(&b.down_ms));
        out
    }
}

/// One timeline window: requests that arrived in `[t_s, t_s + window)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WindowRow {
    pub t_s: f64,
    pub arrived: u64,
    pub completed: u64,
    pub failed: u64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Pods down at any time during the window.
    pub pods_down: u32,
}

/// Requests that arrived in one phase (see [`PHASES`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseRow {
    pub phase: &'static str,
    pub completed: u64,
    pub failed: u64,
    pub ttft_mean_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
}

/// What the outages did to a run (`faults` in `kvgate sim --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultReport {
    pub outages: Vec<Outage>,
    /// Attempts re-dispatched after their pod died or refused the connection.
    pub retried: u64,
    /// Requests whose pod died after their first token.
    pub failed_mid_stream: u64,
    /// Requests whose pod died before their first token with no retry left or no pod to take it.
    pub failed_no_retry: u64,
    /// Requests dropped by a dying pod, in total (retried or failed).
    pub dropped_by_crash: u64,
    /// Mean / p99 TTFT of requests that arrived while no pod was down, and while one was.
    pub ttft_steady_mean_ms: f64,
    pub ttft_steady_p99_ms: f64,
    pub ttft_during_mean_ms: f64,
    pub ttft_during_p99_ms: f64,
    pub phases: Vec<PhaseRow>,
    pub window_ms: f64,
    pub timeline: Vec<WindowRow>,
}

impl FaultReport {
    pub fn failed(&self) -> u64 {
        self.failed_mid_stream + self.failed_no_retry
    }
}

/// Collects outcomes by arrival time during a run with faults.
#[derive(Debug)]
pub struct FaultRecorder {
    outages: Vec<Outage>,
    window_ms: f64,
    /// Per window: TTFTs of completed requests, failures, arrivals.
    ttft: Vec<Vec<f64>>,
    failed: Vec<u64>,
    arrived: Vec<u64>,
    steady: Vec<f64>,
    during: Vec<f64>,
    phase_ttft: [Vec<f64>; 5],
    phase_failed: [u64; 5],
    pub retried: u64,
    pub failed_mid_stream: u64,
    pub failed_no_retry: u64,
    pub dropped_by_crash: u64,
}

impl FaultRecorder {
    pub fn new(outages: Vec<Outage>, horizon_ms: f64) -> Self {
        let window_ms = DEFAULT_WINDOW_MS;
        let windows = (horizon_ms.max(0.0) / window_ms) as usize + 1;
        FaultRecorder {
            outages,
            window_ms,
            ttft: vec![Vec::new(); windows],
            failed: vec![0; windows],
            arrived: vec![0; windows],
            steady: Vec::new(),
            during: Vec::new(),
            phase_ttft: Default::default(),
            phase_failed: [0; 5],
            retried: 0,
            failed_mid_stream: 0,
            failed_no_retry: 0,
            dropped_by_crash: 0,
        }
    }

    fn window(&self, t_ms: f64) -> usize {
        ((t_ms.max(0.0) / self.window_ms) as usize).min(self.arrived.len() - 1)
    }

    fn any_down_at(&self, t_ms: f64) -> bool {
        self.outages
            .iter()
            .any(|o| o.down_ms <= t_ms && t_ms < o.up_ms)
    }

    /// Index into [`PHASES`] of an arrival at `t_ms`.
    fn phase(&self, t_ms: f64) -> usize {
        if self.any_down_at(t_ms) {
            return 1;
        }
        let last_up = self
            .outages
            .iter()
            .filter(|o| o.up_ms <= t_ms)
            .map(|o| o.up_ms)
            .max_by(f64::total_cmp);
        match last_up.map(|up| t_ms - up) {
            None => 0,
            Some(d) if d < 10_000.0 => 2,
            Some(d) if d < 30_000.0 => 3,
            Some(_) => 4,
        }
    }

    pub fn arrived(&mut self, arrival_ms: f64) {
        let w = self.window(arrival_ms);
        self.arrived[w] += 1;
    }

    pub fn completed(&mut self, arrival_ms: f64, ttft_ms: f64) {
        let w = self.window(arrival_ms);
        self.ttft[w].push(ttft_ms);
        let phase = self.phase(arrival_ms);
        self.phase_ttft[phase].push(ttft_ms);
        if self.any_down_at(arrival_ms) {
            self.during.push(ttft_ms);
        } else {
            self.steady.push(ttft_ms);
        }
    }

    pub fn failed(&mut self, arrival_ms: f64, mid_stream: bool) {
        let w = self.window(arrival_ms);
        self.failed[w] += 1;
        let phase = self.phase(arrival_ms);
        self.phase_failed[phase] += 1;
        if mid_stream {
            self.failed_mid_stream += 1;
        } else {
            self.failed_no_retry += 1;
        }
    }

    pub fn finish(mut self) -> FaultReport {
        let stats = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let mean = if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            };
            (mean, nearest_rank(v, 0.99))
        };
        let (steady_mean, steady_p99) = stats(&mut self.steady);
        let (during_mean, during_p99) = stats(&mut self.during);
        let phases = PHASES
            .iter()
            .zip(self.phase_ttft.iter_mut().zip(self.phase_failed))
            .map(|(phase, (ttft, failed))| {
                let (mean, p99) = stats(ttft);
                PhaseRow {
                    phase,
                    completed: ttft.len() as u64,
                    failed,
                    ttft_mean_ms: mean,
                    ttft_p50_ms: nearest_rank(ttft, 0.5),
                    ttft_p99_ms: p99,
                }
            })
            .collect();
        let window_ms = self.window_ms;
        let outages = &self.outages;
        let timeline = self
            .ttft
            .iter_mut()
            .enumerate()
            .map(|(w, ttft)| {
                ttft.sort_by(f64::total_cmp);
                let (start, end) = (w as f64 * window_ms, (w + 1) as f64 * window_ms);
                WindowRow {
                    t_s: start / 1000.0,
                    arrived: self.arrived[w],
                    completed: ttft.len() as u64,
                    failed: self.failed[w],
                    ttft_p50_ms: nearest_rank(ttft, 0.50),
                    ttft_p99_ms: nearest_rank(ttft, 0.99),
                    pods_down: outages
                        .iter()
                        .filter(|o| o.down_ms < end && o.up_ms > start)
                        .count() as u32,
                }
            })
            .collect();
        FaultReport {
            outages: self.outages,
            retried: self.retried,
            failed_mid_stream: self.failed_mid_stream,
            failed_no_retry: self.failed_no_retry,
            dropped_by_crash: self.dropped_by_crash,
            ttft_steady_mean_ms: steady_mean,
            ttft_steady_p99_ms: steady_p99,
            ttft_during_mean_ms: during_mean,
            ttft_during_p99_ms: during_p99,
            phases,
            window_ms,
            timeline,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_spec_parses_pods_and_seconds_sorted_by_down_time() {
        let plan = FaultPlan::parse("5@120-125.5, 3@60-90").unwrap();
        assert_eq!(
            plan.outages(8, 1e9),
            vec![
                Outage {
                    pod: 3,
                    down_ms: 60_000.0,
                    up_ms: 90_000.0
                },
                Outage {
                    pod: 5,
                    down_ms: 120_000.0,
                    up_ms: 125_500.0
                },
            ]
        );
        // A pod past the fleet is dropped.
        assert_eq!(plan.outages(4, 1e9).len(), 1);
    }

    #[test]
    fn periodic_spec_takes_pods_round_robin_until_the_horizon() {
        let plan = FaultPlan::parse("every=60,down=15").unwrap();
        let o = plan.outages(2, 200_000.0);
        let got: Vec<(u32, f64, f64)> = o.iter().map(|o| (o.pod, o.down_ms, o.up_ms)).collect();
        assert_eq!(
            got,
            vec![
                (0, 60_000.0, 75_000.0),
                (1, 120_000.0, 135_000.0),
                (0, 180_000.0, 195_000.0)
            ]
        );
        let plan = FaultPlan::parse("every=10,down=1,start=0").unwrap();
        assert_eq!(plan.outages(3, 25_000.0).len(), 3);
    }

    #[test]
    fn malformed_specs_are_refused_with_the_offending_item() {
        for (spec, want) in [
            ("", FaultSpecError::Syntax(String::new())),
            ("3", FaultSpecError::Syntax("3".into())),
            ("x@1-2", FaultSpecError::Syntax("x@1-2".into())),
            ("1@5-2", FaultSpecError::Order("1@5-2".into())),
            ("1@-1-2", FaultSpecError::Syntax("1@-1-2".into())),
            ("1@nan-2", FaultSpecError::Syntax("1@nan-2".into())),
            ("every=10", FaultSpecError::Syntax("every=10".into())),
            (
                "every=10,down=10",
                FaultSpecError::Period("every=10,down=10".into()),
            ),
            (
                "every=10,down=1,foo=2",
                FaultSpecError::Syntax("foo=2".into()),
            ),
            (
                "0@10-30,1@0-5,0@20-25",
                FaultSpecError::Overlap("0@10-30".into(), "0@20-25".into()),
            ),
        ] {
            assert_eq!(FaultPlan::parse(spec), Err(want), "{spec}");
        }
    }

    #[test]
    fn report_splits_ttft_by_whether_a_pod_was_down_at_arrival() {
        let outages = vec![Outage {
            pod: 0,
            down_ms: 10_000.0,
            up_ms: 20_000.0,
        }];
        let mut r = FaultRecorder::new(outages, 30_000.0);
        for (t, ttft) in [(1_000.0, 100.0), (12_000.0, 900.0), (25_000.0, 120.0)] {
            r.arrived(t);
            r.completed(t, ttft);
        }
        r.arrived(15_000.0);
        r.failed(15_000.0, true);
        let rep = r.finish();
        assert_eq!(rep.ttft_steady_mean_ms, 110.0);
        assert_eq!(rep.ttft_during_p99_ms, 900.0);
        assert_eq!(rep.failed(), 1);
        let rows: Vec<(u64, u64, u64, u32)> = rep
            .timeline
            .iter()
            .map(|w| (w.arrived, w.completed, w.failed, w.pods_down))
            .collect();
        assert_eq!(
            rows,
            vec![(1, 1, 0, 0), (2, 1, 1, 1), (1, 1, 0, 0), (0, 0, 0, 0)]
        );
        let phases: Vec<(u64, u64)> = rep.phases.iter().map(|p| (p.completed, p.failed)).collect();
        assert_eq!(phases, vec![(1, 0), (1, 1), (1, 0), (0, 0), (0, 0)]);
        assert_eq!(
            rep.phases[2].ttft_mean_ms, 120.0,
            "25 s is 5 s after the pod came back"
        );
    }
}
