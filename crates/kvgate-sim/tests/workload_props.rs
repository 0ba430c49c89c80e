//! Trace loaders never panic on arbitrary input.

use kvgate_sim::workload::parse_trace;
use proptest::prelude::*;

fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[{}\\[\\],:0-9a-z_\" -]{0,80}",
        (any::<i64>(), any::<i64>(), any::<i64>(), prop::collection::vec(any::<u64>(), 0..40)).prop_map(
            |(t, i, o, ids)| format!(
                "{{\"timestamp\": {t}, \"input_length\": {i}, \"output_length\": {o}, \"hash_ids\": {ids:?}}}"
            )
        ),
        (0u64..10_000, 0u64..30_000, 0u64..5000, 0usize..70).prop_map(|(t, i, o, n)| format!(
            "{{\"timestamp\": {t}, \"input_length\": {i}, \"output_length\": {o}, \"hash_ids\": {:?}}}",
            (0..n as u64).collect::<Vec<_>>()
        )),
        "[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{0,9},-?[0-9]{0,12},-?[0-9]{0,12}(,[0-9]*)?",
    ]
}

proptest! {
    #[test]
    fn random_bytes_never_panic_the_loaders(bytes in prop::collection::vec(any::<u8>(), 0..2000)) {
        let _ = parse_trace("random.bin", &bytes);
        let mut with_header = b"TIMESTAMP,ContextTokens,GeneratedTokens\n".to_vec();
        with_header.extend_from_slice(&bytes);
        let _ = parse_trace("random.csv", &with_header);
        let mut json = b"{".to_vec();
        json.extend_from_slice(&bytes);
        let _ = parse_trace("random.jsonl", &json);
    }

    #[test]
    fn random_lines_never_panic_the_loaders(lines in prop::collection::vec(line(), 0..30), azure in any::<bool>()) {
        let mut text = String::new();
        if azure {
            text.push_str("TIMESTAMP,ContextTokens,GeneratedTokens\n");
        }
        for l in &lines {
            text.push_str(l);
            text.push('\n');
        }
        if let Ok((w, reqs)) = parse_trace("random", text.as_bytes()) {
            prop_assert_eq!(w.request_count, reqs.len());
            for r in &reqs {
                prop_assert_eq!(r.blocks.len(), (r.input_tokens / 16) as usize);
            }
            prop_assert!(reqs.windows(2).all(|p| p[0].arrival_ms <= p[1].arrival_ms));
        }
    }
}
