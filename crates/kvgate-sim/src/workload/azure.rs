//! Azure LLM inference trace 2023 reader (CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`; see
//! `shared/traces/README.md`).
//!
//! - **Arrivals.** `TIMESTAMP` is absolute (`YYYY-MM-DD HH:MM:SS.fffffff`); a request arrives at
//!   its offset in ms from the first line's timestamp. Parsed by hand (proleptic Gregorian
//!   calendar, no time zone; up to 9 fractional digits are kept).
//! - **Blocks.** The trace has no prefix information, so every request is one [`Segment`] whose
//!   id is derived from its line number: no two requests share a block.
//! - **Validation** (error at line N, never a panic): the header must name the three columns (in
//!   any order, extra columns allowed); each non-empty line must have as many fields as the
//!   header, a valid timestamp not before the previous one, `ContextTokens` in
//!   `1..=MAX_INPUT_TOKENS` and `GeneratedTokens` in `1..=MAX_OUTPUT_TOKENS`. Blank lines are
//!   skipped.

use super::segments::{Segment, append_prompt_blocks, segment_id};
use super::{MAX_INPUT_TOKENS, MAX_OUTPUT_TOKENS, WorkloadError};
use crate::SimRequest;

const TIMESTAMP: &str = "TIMESTAMP";
const CONTEXT_TOKENS: &str = "ContextTokens";
const GENERATED_TOKENS: &str = "GeneratedTokens";

/// Namespace of Azure segment ids.
const NAMESPACE: u64 = 0x417a_7572; // "Azur"

/// Whether `line` is an Azure trace CSV header.
pub fn is_header(line: &str) -> bool {
    column_indices(line).is_some()
}

/// Indices of (TIMESTAMP, ContextTokens, GeneratedTokens) and the number of columns.
fn column_indices(header: &str) -> Option<(usize, usize, usize, usize)> {
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let find = |name: &str| cols.iter().position(|c| *c == name);
    Some((
        find(TIMESTAMP)?,
        find(CONTEXT_TOKENS)?,
        find(GENERATED_TOKENS)?,
        cols.len(),
    ))
}

/// Parses an Azure trace CSV `text` (named `source_name` in errors).
pub fn parse(source_name: &str, text: &str) -> Result<Vec<SimRequest>, WorkloadError> {
    let bad = |line: usize, reason: String| WorkloadError::BadLine {
        source_name: source_name.to_owned(),
        line,
        reason,
    };
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty());
    let Some((header_no, header)) = lines.next() else {
        return Ok(Vec::new());
    };
    let header = header.strip_prefix('\u{feff}').unwrap_or(header);
    let (ts_col, ctx_col, gen_col, ncols) = column_indices(header).ok_or_else(|| {
        bad(
            header_no,
            format!("header must name {TIMESTAMP}, {CONTEXT_TOKENS} and {GENERATED_TOKENS}"),
        )
    })?;

    let mut requests = Vec::new();
    let mut first_ns: Option<i128> = None;
    let mut prev_ns = i128::MIN;
    let mut fields: Vec<&str> = Vec::with_capacity(ncols);
    for (line_no, line) in lines {
        fields.clear();
        fields.extend(line.split(',').map(str::trim));
        if fields.len() != ncols {
            return Err(bad(
                line_no,
                format!("expected {ncols} fields, found {}", fields.len()),
            ));
        }
        let (ts, ctx, generated) =
            match (fields.get(ts_col), fields.get(ctx_col), fields.get(gen_col)) {
                (Some(t), Some(c), Some(g)) => (*t, *c, *g),
                _ => return Err(bad(line_no, "missing field".to_owned())),
            };
        let ns = parse_timestamp_ns(ts)
            .ok_or_else(|| bad(line_no, format!("bad {TIMESTAMP} {ts:?}")))?;
        if ns < prev_ns {
            return Err(bad(
                line_no,
                format!("{TIMESTAMP} {ts} is before the previous line's"),
            ));
        }
        prev_ns = ns;
        let first = *first_ns.get_or_insert(ns);
        let input_tokens = parse_count(ctx, MAX_INPUT_TOKENS).ok_or_else(|| {
            bad(
                line_no,
                format!("{CONTEXT_TOKENS} {ctx:?} is not in 1..={MAX_INPUT_TOKENS}"),
            )
        })?;
        let output_tokens = parse_count(generated, MAX_OUTPUT_TOKENS).ok_or_else(|| {
            bad(
                line_no,
                format!("{GENERATED_TOKENS} {generated:?} is not in 1..={MAX_OUTPUT_TOKENS}"),
            )
        })?;
        let mut blocks = Vec::new();
        append_prompt_blocks(
            &[Segment::new(
                segment_id(NAMESPACE, line_no as u64, 0),
                input_tokens,
            )],
            &mut blocks,
        );
        requests.push(SimRequest {
            id: requests.len() as u64,
            arrival_ms: (ns - first) as f64 / 1e6,
            input_tokens,
            output_tokens,
            blocks,
            adapter: None,
            session: None,
        });
    }
    Ok(requests)
}

fn parse_count(s: &str, max: u32) -> Option<u32> {
    let n: u32 = s.parse().ok()?;
    (1..=max).contains(&n).then_some(n)
}

/// `YYYY-MM-DD HH:MM:SS[.f…]` (or with `T`) → nanoseconds since 1970-01-01 00:00:00.
fn parse_timestamp_ns(s: &str) -> Option<i128> {
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.splitn(3, '-');
    let year: i64 = digits(d.next()?, 4)?;
    let month: i64 = digits(d.next()?, 2)?;
    let day: i64 = digits(d.next()?, 2)?;
    let (hms, frac) = match time.split_once('.') {
        Some((hms, frac)) => (hms, Some(frac)),
        None => (time, None),
    };
    let mut t = hms.splitn(3, ':');
    let hour: i64 = digits(t.next()?, 2)?;
    let minute: i64 = digits(t.next()?, 2)?;
    let second: i64 = digits(t.next()?, 2)?;
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut nanos: i128 = 0;
    if let Some(frac) = frac {
        if frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        for (i, b) in frac.bytes().take(9).enumerate() {
            nanos += i128::from(b - b'0') * 10i128.pow(8 - i as u32);
        }
    }
    let days = days_from_civil(year, month, day);
    let secs = i128::from(days) * 86_400 + i128::from(hour * 3600 + minute * 60 + second);
    Some(secs * 1_000_000_000 + nanos)
}

/// Parses exactly `n` ASCII digits.
fn digits(s: &str, n: usize) -> Option<i64> {
    if s.len() != n || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n";

    #[test]
    fn timestamps_parse_to_nanoseconds_since_epoch() {
        assert_eq!(parse_timestamp_ns("1970-01-01 00:00:00"), Some(0));
        assert_eq!(
            parse_timestamp_ns("1970-01-02 00:00:01.5"),
            Some(86_401_500_000_000)
        );
        // 2023-11-16 is day 19,677 since the epoch.
        assert_eq!(
            parse_timestamp_ns("2023-11-16 18:17:03.2250000"),
            Some((19_677i128 * 86_400 + 18 * 3600 + 17 * 60 + 3) * 1_000_000_000 + 225_000_000)
        );
        for bad in [
            "",
            "2023-11-16",
            "2023-13-01 00:00:00",
            "2023-11-16 24:00:00",
            "2023-11-16 1:2:3",
            "2023-11-16 18:17:03.",
            "2023-11-16 18:17:03.x1",
        ] {
            assert_eq!(parse_timestamp_ns(bad), None, "{bad}");
        }
    }

    #[test]
    fn arrivals_are_offsets_from_the_first_timestamp_even_across_midnight() {
        let text = format!(
            "{HEADER}2023-11-16 23:59:59.9000000,100,5\n2023-11-17 00:00:00.1500000,40,7\n"
        );
        let r = parse("a.csv", &text).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].arrival_ms, 0.0);
        assert!((r[1].arrival_ms - 250.0).abs() < 1e-9);
        assert_eq!(
            (r[1].input_tokens, r[1].output_tokens, r[1].blocks.len()),
            (40, 7, 2)
        );
    }

    #[test]
    fn requests_share_no_blocks() {
        let text = format!("{HEADER}2023-11-16 18:00:00.0,320,5\n2023-11-16 18:00:00.0,320,5\n");
        let r = parse("a.csv", &text).unwrap();
        assert_eq!(r[0].blocks.len(), 20);
        assert!(r[0].blocks.iter().all(|b| !r[1].blocks.contains(b)));
    }

    #[test]
    fn columns_may_come_in_any_order() {
        let text = "GeneratedTokens, TIMESTAMP ,ContextTokens\n9,2023-11-16 18:00:00.0,32\n";
        let r = parse("a.csv", text).unwrap();
        assert_eq!((r[0].input_tokens, r[0].output_tokens), (32, 9));
    }

    #[test]
    fn malformed_lines_are_errors_with_their_line_number() {
        let good = "2023-11-16 18:00:01.0,100,5\n";
        for bad in [
            "2023-11-16 18:00:01.0,100\n",
            "2023-11-16 18:00:01.0,100,5,7\n",
            "yesterday,100,5\n",
            "2023-11-16 18:00:01.0,0,5\n",
            "2023-11-16 18:00:01.0,100,-1\n",
            "2023-11-16 18:00:01.0,99999999999,5\n",
            "2023-11-16 18:00:00.0,100,5\n",
        ] {
            let text = format!("{HEADER}{good}\n{good}{bad}");
            assert!(
                matches!(
                    parse("a.csv", &text),
                    Err(WorkloadError::BadLine { line: 5, .. })
                ),
                "{bad}: {:?}",
                parse("a.csv", &text)
            );
        }
    }
}
