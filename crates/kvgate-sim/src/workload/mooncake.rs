//! Mooncake FAST'25 trace reader (JSON Lines: `timestamp`, `input_length`, `output_length`,
//! `hash_ids`; see `shared/traces/README.md`).
//!
//! - **Arrivals.** Timestamps are milliseconds, but quantized to ~3-second buckets (on the
//!   conversation trace: 1,180 distinct values, consecutive distinct values 2,997–3,003 ms apart,
//!   every value ≡ 0 or 2,999 mod 3,000), so up to dozens of requests share one timestamp. The
//!   `c` requests sharing timestamp `t` (consecutive lines) get `t + i · w / c` for `i = 0..c`,
//!   with `w = min(bucket_ms, t_next − t)` and `t_next` the next distinct timestamp: evenly spread
//!   over the bucket, in file order, never past the next bucket. `bucket_ms` =
//!   [`MOONCAKE_BUCKET_MS`] (3,000); 0 keeps the raw timestamps.
//! - **Blocks.** Each `hash_id` stands for 512 tokens; `hash_ids` are prefix-chained (an equal id at
//!   position `i` means the whole prefix up to block `i` is equal). Each id becomes a
//!   [`Segment`] of 512 tokens (the last one `input_length − 512·(n−1)`) whose content is a
//!   function of the id, and the prompt's 16-token blocks are hashed through
//!   [`segments`](super::segments): equal first `k` ids ⇒ exactly `32·k` equal leading blocks
//!   (fewer when the `k`-th is a partial last block), and `blocks.len() == input_length / 16`.
//! - **Validation** (error at line N, never a panic): each non-empty line must be a JSON object
//!   with non-negative integer `timestamp`, `input_length` in `1..=MAX_INPUT_TOKENS`,
//!   `output_length` in `1..=MAX_OUTPUT_TOKENS`, at least `ceil(input_length / 512)` `hash_ids`
//!   (extra ids, which the README says never occur, are ignored), and timestamps must not
//!   decrease. Unknown keys are ignored. Blank lines are skipped.

use serde::Deserialize;

use super::segments::{Segment, append_prompt_blocks, segment_id};
use super::{MAX_INPUT_TOKENS, MAX_OUTPUT_TOKENS, WorkloadError};
use crate::SimRequest;

/// Width of Mooncake's timestamp buckets, measured on the FAST'25 conversation trace.
pub const MOONCAKE_BUCKET_MS: f64 = 3000.0;
/// Tokens per Mooncake `hash_id`.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// Namespace of Mooncake segment ids (keeps them apart from generator ids).
const NAMESPACE: u64 = 0x4d6f_6f6e; // "Moon"

#[derive(Deserialize)]
struct Line {
    timestamp: u64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// Parses Mooncake JSON Lines `text` (named `source_name` in errors).
pub fn parse(
    source_name: &str,
    text: &str,
    bucket_ms: f64,
) -> Result<Vec<SimRequest>, WorkloadError> {
    let bad = |line: usize, reason: String| WorkloadError::BadLine {
        source_name: source_name.to_owned(),
        line,
        reason,
    };
    if !(bucket_ms.is_finite() && bucket_ms >= 0.0) {
        return Err(WorkloadError::InvalidParam {
            name: "bucket_ms",
            reason: format!("must be finite and ≥ 0, got {bucket_ms}"),
        });
    }

    let mut requests = Vec::new();
    let mut timestamps: Vec<u64> = Vec::new();
    let mut segments: Vec<Segment> = Vec::new();
    for (idx, raw) in text.lines().enumerate() {
        let line_no = idx + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(raw).map_err(|e| bad(line_no, e.to_string()))?;
        if let Some(&prev) = timestamps.last()
            && l.timestamp < prev
        {
            return Err(bad(
                line_no,
                format!(
                    "timestamp {} is before the previous one ({prev})",
                    l.timestamp
                ),
            ));
        }
        let input_tokens = match u32::try_from(l.input_length) {
            Ok(n) if (1..=MAX_INPUT_TOKENS).contains(&n) => n,
            _ => {
                return Err(bad(
                    line_no,
                    format!(
                        "input_length {} is outside 1..={MAX_INPUT_TOKENS}",
                        l.input_length
                    ),
                ));
            }
        };
        let output_tokens = match u32::try_from(l.output_length) {
            Ok(n) if (1..=MAX_OUTPUT_TOKENS).contains(&n) => n,
            _ => {
                return Err(bad(
                    line_no,
                    format!(
                        "output_length {} is outside 1..={MAX_OUTPUT_TOKENS}",
                        l.output_length
                    ),
                ));
            }
        };
        let needed = input_tokens.div_ceil(MOONCAKE_BLOCK_TOKENS) as usize;
        if l.hash_ids.len() < needed {
            return Err(bad(
                line_no,
                format!(
                    "input_length {input_tokens} needs {needed} hash_ids (512 tokens each), \
                     the line has {}",
                    l.hash_ids.len()
                ),
            ));
        }
        segments.clear();
        let mut left = input_tokens;
        for &h in l.hash_ids.iter().take(needed) {
            let tokens = left.min(MOONCAKE_BLOCK_TOKENS);
            segments.push(Segment::new(segment_id(NAMESPACE, h, 0), tokens));
            left -= tokens;
        }
        let mut blocks = Vec::with_capacity((input_tokens / crate::SIM_BLOCK_SIZE_TOKENS) as usize);
        append_prompt_blocks(&segments, &mut blocks);
        timestamps.push(l.timestamp);
        requests.push(SimRequest {
            id: requests.len() as u64,
            arrival_ms: 0.0,
            input_tokens,
            output_tokens,
            blocks,
            adapter: None,
            session: None,
        });
    }
    spread_buckets(&timestamps, bucket_ms, &mut requests);
    Ok(requests)
}

/// Sets `arrival_ms` from non-decreasing `timestamps`, spreading equal ones over the bucket.
fn spread_buckets(timestamps: &[u64], bucket_ms: f64, requests: &mut [SimRequest]) {
    let mut start = 0;
    while start < timestamps.len() {
        let t = timestamps[start];
        let end = start + timestamps[start..].iter().take_while(|&&x| x == t).count();
        let count = end - start;
        let width = match timestamps.get(end) {
            Some(&next) => bucket_ms.min((next - t) as f64),
            None => bucket_ms,
        };
        for (i, r) in requests[start..end].iter_mut().enumerate() {
            r.arrival_ms = t as f64 + i as f64 * width / count as f64;
        }
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(ts: u64, input: u64, output: u64, ids: &[u64]) -> String {
        format!(
            "{{\"timestamp\": {ts}, \"input_length\": {input}, \"output_length\": {output}, \
             \"hash_ids\": {ids:?}}}\n"
        )
    }

    fn shared_leading(a: &[u64], b: &[u64]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    #[test]
    fn requests_sharing_a_timestamp_spread_evenly_over_the_bucket() {
        let text = [
            line(0, 600, 10, &[0, 1]),
            line(0, 600, 10, &[0, 2]),
            line(0, 600, 10, &[0, 3]),
            line(3000, 600, 10, &[0, 4]),
            line(4000, 600, 10, &[0, 5]),
            line(4000, 600, 10, &[0, 6]),
        ]
        .concat();
        let reqs = parse("t", &text, 3000.0).unwrap();
        let t: Vec<f64> = reqs.iter().map(|r| r.arrival_ms).collect();
        // Last bucket is cut to the file's end with the full bucket width.
        assert_eq!(t, vec![0.0, 1000.0, 2000.0, 3000.0, 4000.0, 5500.0]);
        let raw = parse("t", &text, 0.0).unwrap();
        assert_eq!(raw[1].arrival_ms, 0.0);
    }

    #[test]
    fn the_spread_never_passes_the_next_bucket() {
        let text = [
            line(0, 16, 1, &[0]),
            line(0, 16, 1, &[1]),
            line(1000, 16, 1, &[2]),
        ]
        .concat();
        let reqs = parse("t", &text, 3000.0).unwrap();
        assert_eq!(reqs[1].arrival_ms, 500.0);
    }

    #[test]
    fn blocks_cover_only_full_16_token_blocks() {
        let reqs = parse("t", &line(0, 1000, 5, &[0, 1]), 3000.0).unwrap();
        assert_eq!(reqs[0].input_tokens, 1000);
        assert_eq!(reqs[0].output_tokens, 5);
        assert_eq!(reqs[0].blocks.len(), 1000 / 16);
    }

    #[test]
    fn equal_leading_hash_ids_share_32_blocks_each() {
        let text = [
            line(0, 2000, 1, &[0, 1, 2, 3]),
            line(0, 1800, 1, &[0, 1, 5, 6]),
            line(0, 1600, 1, &[0, 7, 8, 9]),
            // Shares id 0 and 1 but its second block is its partial last one: 700 − 512 = 188
            // tokens ⇒ 11 full blocks of id 1.
            line(0, 700, 1, &[0, 1]),
        ]
        .concat();
        let r = parse("t", &text, 3000.0).unwrap();
        assert_eq!(shared_leading(&r[0].blocks, &r[1].blocks), 64);
        assert_eq!(shared_leading(&r[0].blocks, &r[2].blocks), 32);
        assert_eq!(shared_leading(&r[0].blocks, &r[3].blocks), 32 + 11);
        assert_eq!(r[3].blocks.len(), 700 / 16);
    }

    #[test]
    fn malformed_lines_are_errors_with_their_line_number() {
        let good = line(0, 600, 10, &[0, 1]);
        let cases = [
            "{\"timestamp\": 0}\n".to_owned(),
            "not json\n".to_owned(),
            line(0, 0, 10, &[]),
            line(0, 600, 0, &[0, 1]),
            line(0, 5_000_000_000, 10, &[0]),
            line(0, 1200, 10, &[0, 1]),
            "{\"timestamp\": -5, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}\n"
                .to_owned(),
        ];
        for bad in cases {
            let text = format!("{good}\n{good}{bad}");
            match parse("t.jsonl", &text, 3000.0) {
                Err(WorkloadError::BadLine {
                    line,
                    ref source_name,
                    ..
                }) => {
                    assert_eq!((line, source_name.as_str()), (4, "t.jsonl"), "{bad}")
                }
                other => panic!("{bad}: expected BadLine at 4, got {other:?}"),
            }
        }
        let decreasing = [line(3000, 16, 1, &[0]), line(0, 16, 1, &[1])].concat();
        assert!(matches!(
            parse("t", &decreasing, 3000.0),
            Err(WorkloadError::BadLine { line: 2, .. })
        ));
    }

    #[test]
    fn extra_hash_ids_are_ignored() {
        let r = parse("t", &line(0, 512, 1, &[0, 1, 2]), 3000.0).unwrap();
        let s = parse("t", &line(0, 512, 1, &[0]), 3000.0).unwrap();
        assert_eq!(r[0].blocks, s[0].blocks);
    }
}
