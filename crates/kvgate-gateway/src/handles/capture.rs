//! `kvgate serve --capture FILE`: one Mooncake JSONL line per served request, no prompt text.
//!
//! A line is `{"timestamp", "input_length", "output_length", "hash_ids"}`:
//! - `timestamp`: milliseconds since the first captured request arrived (non-decreasing: lines
//!   are written in arrival order, and a timestamp never goes below the previous line's);
//! - `input_length`: the pod's `usage.prompt_tokens`, else the gateway's estimate (bytes / 4);
//! - `output_length`: `usage.completion_tokens`, else the request's `max_tokens`, at least 1;
//! - `hash_ids`: the request's chained block hashes grouped per 512-token span (32 blocks: 32 ×
//!   16 tokens, or 32 × 64 bytes in text mode), each span named by its last hash, remapped to
//!   dense integers in order of first appearance. Because the hashes are chained, equal ids mean
//!   an equal prefix, as in Mooncake. A trailing partial span (≥ 1 full block) gets its own id;
//!   ids are padded with fresh ones up to `ceil(input_length / 512)` so the file always loads.
//!
//! and, when known, what a passive fit of the pods' step time needs (`kvgate calibrate`, issue
//! 42): `pod` (its URL as logged), `cached_tokens` (`usage.prompt_tokens_details.cached_tokens`),
//! `dispatch_ms` (when the request was sent to the pod, on the `timestamp` clock: after any
//! flow-control wait), `ttft_ms` (streams: dispatch → first token, the pod's TTFT as the
//! predictor learns it) and `e2e_ms` (dispatch → end). Readers of Mooncake lines ignore them.
//!
//! `kvgate sim --trace FILE` (and `kvgate loadgen --trace FILE`) replay it.
//!
//! Only requests a pod answered with 2xx and that ran to their end are written. A record is
//! made when the request arrives and sent to a writer thread when it ends, through a bounded
//! channel ([`CAPTURE_QUEUE`]); on overflow the record is dropped and counted
//! (`kvgate_capture_dropped_total` on the admin `/metrics`, [`Capture::dropped`], and a warning
//! in the log at every power of two).
//! The writer reorders by arrival, waiting for a request still running at most until
//! [`MAX_PENDING`] later ones have ended. The dense-id map holds at most [`MAX_DENSE_IDS`]
//! spans; past that it restarts (sharing across the restart is not recorded).

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tokio::sync::mpsc;

/// Records queued for the writer.
pub const CAPTURE_QUEUE: usize = 16_384;
/// Ended requests kept waiting for an earlier one that is still running.
pub const MAX_PENDING: usize = 65_536;
/// Distinct spans remembered for the dense ids.
pub const MAX_DENSE_IDS: usize = 1 << 22;
/// Blocks per Mooncake `hash_id` (512 tokens of 16-token blocks).
pub const BLOCKS_PER_SPAN: usize = 32;
const SPAN_TOKENS: u64 = 512;

/// One request as captured (span ids are raw chained hashes until written).
#[derive(Debug, Clone, PartialEq)]
struct Record {
    timestamp_ms: u64,
    input_length: u64,
    output_length: u64,
    spans: Vec<u64>,
    timing: Timing,
}

/// How a served request ran on its pod (the optional keys of a line; see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timing {
    pub pod: Option<String>,
    pub cached_tokens: Option<u64>,
    /// Arrival → dispatch to the pod, ms.
    pub dispatch_delay_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

type Message = (u64, Option<Record>);

/// The capture of one gateway.
pub struct Capture {
    tx: mpsc::Sender<Message>,
    next_seq: AtomicU64,
    epoch: OnceLock<Instant>,
    /// Shared with the gateway's `kvgate_capture_dropped_total`.
    dropped: Counter,
    /// Sequence numbers whose record was dropped on overflow (so the writer does not wait).
    lost: Mutex<Vec<u64>>,
}

/// A request being captured; written (or skipped) when dropped.
pub struct Ticket {
    capture: Arc<Capture>,
    seq: u64,
    record: Record,
    max_tokens: Option<u32>,
    served: bool,
}

impl Capture {
    /// Opens `path` for appending and starts the writer thread; records dropped on overflow
    /// are counted in `dropped` (the gateway passes its `capture_dropped` metric).
    pub fn open(path: &Path, dropped: Counter) -> std::io::Result<Arc<Capture>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let (tx, rx) = mpsc::channel(CAPTURE_QUEUE);
        let capture = Arc::new(Capture {
            tx,
            next_seq: AtomicU64::new(0),
            epoch: OnceLock::new(),
            dropped,
            lost: Mutex::new(Vec::new()),
        });
        let weak = Arc::downgrade(&capture);
        let name = path.display().to_string();
        std::thread::Builder::new()
            .name("kvgate-capture".into())
            .spawn(move || write_loop(rx, std::io::BufWriter::new(file), weak, name))?;
        Ok(capture)
    }

    /// Records dropped because the writer fell behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Starts capturing a request that arrives now with these block hashes.
    pub fn ticket(
        self: &Arc<Self>,
        blocks: &[u64],
        estimated_input_tokens: u32,
        max_tokens: Option<u32>,
    ) -> Ticket {
        let epoch = *self.epoch.get_or_init(Instant::now);
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        Ticket {
            capture: self.clone(),
            seq,
            record: Record {
                timestamp_ms: epoch.elapsed().as_millis() as u64,
                input_length: u64::from(estimated_input_tokens),
                output_length: 0,
                spans: span_hashes(blocks),
                timing: Timing::default(),
            },
            max_tokens,
            served: false,
        }
    }
}

/// The last hash of every 32-block span (a trailing partial span included).
fn span_hashes(blocks: &[u64]) -> Vec<u64> {
    blocks
        .chunks(BLOCKS_PER_SPAN)
        .filter_map(|c| c.last().copied())
        .collect()
}

impl Ticket {
    /// How the request ran on its pod (written with its line).
    pub fn timing(&mut self, timing: Timing) {
        self.record.timing = timing;
    }

    /// The request ran to its end: use the pod's token counts when it gave them.
    pub fn served(&mut self, prompt_tokens: Option<u64>, completion_tokens: Option<u64>) {
        self.served = true;
        if let Some(p) = prompt_tokens.filter(|&p| p > 0) {
            self.record.input_length = p;
        }
        self.record.output_length = completion_tokens
            .filter(|&c| c > 0)
            .or(self.max_tokens.map(u64::from))
            .unwrap_or(1)
            .max(1);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let record = (self.served && self.record.input_length > 0)
            .then(|| std::mem::replace(&mut self.record, empty_record()));
        if self.capture.tx.try_send((self.seq, record)).is_err() {
            self.capture.lost.lock().push(self.seq);
            let n = self.capture.dropped.inc() + 1;
            if n.is_power_of_two() {
                tracing::warn!(dropped = n, "capture writer is behind; records dropped");
            }
        }
    }
}

fn empty_record() -> Record {
    Record {
        timestamp_ms: 0,
        input_length: 0,
        output_length: 0,
        spans: Vec::new(),
        timing: Timing::default(),
    }
}

/// Milliseconds to the µs, finite and ≥ 0 only.
fn ms(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x >= 0.0)
        .map(|x| (x * 1000.0).round() / 1000.0)
}

/// Turns records into Mooncake lines: dense ids, non-decreasing timestamps.
#[derive(Default)]
struct LineWriter {
    dense: FxHashMap<u64, u64>,
    next_id: u64,
    last_timestamp_ms: u64,
}

impl LineWriter {
    fn line(&mut self, r: &Record) -> String {
        if self.dense.len() >= MAX_DENSE_IDS {
            self.dense.clear();
        }
        let mut ids: Vec<u64> = Vec::with_capacity(r.spans.len() + 1);
        for h in &r.spans {
            let next = &mut self.next_id;
            let id = *self.dense.entry(*h).or_insert_with(|| {
                *next += 1;
                *next - 1
            });
            ids.push(id);
        }
        while (ids.len() as u64) < r.input_length.div_ceil(SPAN_TOKENS) {
            ids.push(self.next_id);
            self.next_id += 1;
        }
        self.last_timestamp_ms = self.last_timestamp_ms.max(r.timestamp_ms);
        let mut line = serde_json::json!({
            "timestamp": self.last_timestamp_ms,
            "input_length": r.input_length,
            "output_length": r.output_length,
            "hash_ids": ids,
        });
        let t = &r.timing;
        let dispatch_ms = ms(t.dispatch_delay_ms).map(|d| r.timestamp_ms as f64 + d);
        let extra = [
            ("pod", t.pod.clone().map(serde_json::Value::from)),
            (
                "cached_tokens",
                t.cached_tokens.map(serde_json::Value::from),
            ),
            ("dispatch_ms", ms(dispatch_ms).map(serde_json::Value::from)),
            ("ttft_ms", ms(t.ttft_ms).map(serde_json::Value::from)),
            ("e2e_ms", ms(t.e2e_ms).map(serde_json::Value::from)),
        ];
        if let Some(obj) = line.as_object_mut() {
            for (key, value) in extra {
                if let Some(v) = value {
                    obj.insert(key.to_string(), v);
                }
            }
        }
        line.to_string()
    }
}

fn write_loop(
    mut rx: mpsc::Receiver<Message>,
    mut out: impl Write,
    capture: std::sync::Weak<Capture>,
    name: String,
) {
    let mut pending: BTreeMap<u64, Option<Record>> = BTreeMap::new();
    let mut next = 0u64;
    let mut lines = LineWriter::default();
    while let Some((seq, record)) = rx.blocking_recv() {
        if seq >= next {
            pending.insert(seq, record);
        }
        if let Some(c) = capture.upgrade() {
            for s in c.lost.lock().drain(..) {
                if s >= next {
                    pending.insert(s, None);
                }
            }
        }
        loop {
            if let Some(r) = pending.remove(&next) {
                next += 1;
                if let Some(r) = r {
                    let line = lines.line(&r);
                    if let Err(e) = writeln!(out, "{line}") {
                        tracing::error!(file = %name, error = %e, "capture write failed; capture stopped");
                        return;
                    }
                }
            } else if pending.len() > MAX_PENDING {
                // Give up on the oldest request still running; its record will be ignored.
                next = pending.keys().next().copied().unwrap_or(next);
            } else {
                break;
            }
        }
        if rx.is_empty()
            && let Err(e) = out.flush()
        {
            tracing::error!(file = %name, error = %e, "capture flush failed; capture stopped");
            return;
        }
    }
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ts: u64, input: u64, spans: &[u64]) -> Record {
        Record {
            timestamp_ms: ts,
            input_length: input,
            output_length: 3,
            spans: spans.to_vec(),
            timing: Timing::default(),
        }
    }

    #[test]
    fn timing_keys_are_written_when_known_and_the_line_stays_a_mooncake_line() {
        let mut w = LineWriter::default();
        let mut r = record(100, 1024, &[7, 8]);
        r.timing = Timing {
            pod: Some("http://10.0.0.5:8000".into()),
            cached_tokens: Some(512),
            dispatch_delay_ms: Some(2.5),
            ttft_ms: Some(41.0004),
            e2e_ms: Some(f64::NAN),
        };
        let line = w.line(&r);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["pod"], "http://10.0.0.5:8000");
        assert_eq!(v["cached_tokens"], 512);
        assert_eq!(v["dispatch_ms"], 102.5);
        assert_eq!(v["ttft_ms"], 41.0);
        // Not a number: left out, not written as null.
        assert!(v.get("e2e_ms").is_none(), "{line}");
        assert_eq!(v["timestamp"], 100);
        assert_eq!(v["hash_ids"], serde_json::json!([0, 1]));
        // Without timing, the line has the four Mooncake keys only.
        let plain: serde_json::Value =
            serde_json::from_str(&w.line(&record(200, 512, &[9]))).unwrap();
        assert_eq!(plain.as_object().map(|o| o.len()), Some(4));
    }

    #[test]
    fn spans_are_named_by_their_last_block() {
        let blocks: Vec<u64> = (0..70).collect();
        assert_eq!(span_hashes(&blocks), vec![31, 63, 69]);
        assert_eq!(span_hashes(&[]), Vec::<u64>::new());
    }

    #[test]
    fn ids_are_dense_in_order_of_first_appearance_and_padded_to_the_length() {
        let mut w = LineWriter::default();
        let a: serde_json::Value =
            serde_json::from_str(&w.line(&record(5, 1024, &[77, 88]))).unwrap();
        let b: serde_json::Value =
            serde_json::from_str(&w.line(&record(3, 1600, &[77, 99]))).unwrap();
        assert_eq!(a["hash_ids"], serde_json::json!([0, 1]));
        // 1600 tokens need 4 ids; the two missing ones are fresh.
        assert_eq!(b["hash_ids"], serde_json::json!([0, 2, 3, 4]));
        // Timestamps never decrease.
        assert_eq!(
            (a["timestamp"].as_u64(), b["timestamp"].as_u64()),
            (Some(5), Some(5))
        );
    }

    #[test]
    fn overflow_is_counted_in_the_gateway_metric() {
        let metrics = crate::metrics::Metrics::new();
        // A queue of one that nobody reads: the second record overflows.
        let (tx, _rx) = mpsc::channel(1);
        let capture = Arc::new(Capture {
            tx,
            next_seq: AtomicU64::new(0),
            epoch: OnceLock::new(),
            dropped: metrics.capture_dropped.clone(),
            lost: Mutex::new(Vec::new()),
        });
        for _ in 0..3 {
            let mut t = capture.ticket(&[1, 2], 100, Some(4));
            t.served(Some(100), Some(4));
        }
        assert_eq!(capture.dropped(), 2);
        assert_eq!(*capture.lost.lock(), vec![1, 2]);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics.registry).unwrap();
        assert!(text.contains("kvgate_capture_dropped_total 2"), "{text}");
    }
}
