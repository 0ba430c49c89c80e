//! The real trace files of `shared/traces/` load with the documented counts and sharing.
//! Skipped (with a message) where the shared folder is absent.

use std::path::PathBuf;
use std::time::Instant;

use kvgate_sim::workload::{WorkloadParams, load_trace};

fn trace(name: &str) -> Option<PathBuf> {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/traces"
    ))
    .join(name);
    if path.exists() {
        Some(path)
    } else {
        eprintln!("skipped: {} is absent", path.display());
        None
    }
}

const MOONCAKE: &str = "mooncake_fast25_conversation_trace.jsonl";

#[test]
fn mooncake_conversation_trace_loads_12031_requests_in_order() {
    let Some(path) = trace(MOONCAKE) else { return };
    let started = Instant::now();
    let (workload, reqs) = load_trace(&path).unwrap();
    let elapsed = started.elapsed();
    let blocks: usize = reqs.iter().map(|r| r.blocks.len()).sum();
    eprintln!(
        "loaded {} requests, {blocks} block hashes in {elapsed:?}",
        reqs.len()
    );

    assert_eq!(reqs.len(), 12_031);
    assert_eq!(workload.request_count, 12_031);
    assert_eq!(workload.source.as_deref(), Some(MOONCAKE));
    assert_eq!(
        workload.params,
        WorkloadParams::MooncakeTrace { bucket_ms: 3000.0 }
    );
    assert!(reqs.windows(2).all(|w| w[0].arrival_ms <= w[1].arrival_ms));
    assert_eq!(reqs[0].arrival_ms, 0.0);
    // Last timestamp 3,536,999 ms; the spread keeps every request inside its bucket.
    let last = reqs.last().unwrap().arrival_ms;
    assert!((3_536_999.0..3_539_999.0).contains(&last), "{last}");
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.id, i as u64);
        assert_eq!(r.blocks.len(), (r.input_tokens / 16) as usize);
    }
    // First line of the file: {"timestamp": 0, "input_length": 6758, "output_length": 500, ...}.
    assert_eq!((reqs[0].input_tokens, reqs[0].output_tokens), (6758, 500));
    let input_total: u64 = reqs.iter().map(|r| u64::from(r.input_tokens)).sum();
    assert_eq!(input_total / 12_031, 12_035); // README: mean input 12,035 tokens
}

#[test]
fn mooncake_equal_leading_hash_ids_give_equal_leading_blocks() {
    let Some(path) = trace(MOONCAKE) else { return };
    let (_, reqs) = load_trace(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<(u32, Vec<u64>)> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ids = v["hash_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            (v["input_length"].as_u64().unwrap() as u32, ids)
        })
        .collect();
    let check = |i: usize, j: usize| {
        let (la, ida) = &lines[i];
        let (lb, idb) = &lines[j];
        let k = ida.iter().zip(idb).take_while(|(a, b)| a == b).count() as u32;
        let expected = (k * 512).min(*la).min(*lb) / 16;
        let shared = reqs[i]
            .blocks
            .iter()
            .zip(&reqs[j].blocks)
            .take_while(|(a, b)| a == b)
            .count();
        assert_eq!(shared as u32, expected, "lines {} and {}", i + 1, j + 1);
        k
    };
    // Neighbours (mostly sharing only id 0, the common first block).
    for i in 0..lines.len() {
        for j in i + 1..(i + 10).min(lines.len()) {
            check(i, j);
        }
    }
    // Follow-up turns: each line against the latest earlier line with the same second id.
    let mut latest_by_second_id = rustc_hash::FxHashMap::default();
    let mut checked_sharing = 0;
    for (j, (_, ids)) in lines.iter().enumerate() {
        let Some(&second) = ids.get(1) else { continue };
        if let Some(i) = latest_by_second_id.insert(second, j)
            && check(i, j) > 1
        {
            checked_sharing += 1;
        }
    }
    assert!(
        checked_sharing > 1000,
        "only {checked_sharing} pairs share more than id 0"
    );
}

#[test]
fn azure_traces_load_with_their_request_counts() {
    for (name, count, last_min) in [
        ("azure_llm_2023_code.csv", 8_819, 57.0),
        ("azure_llm_2023_conv.csv", 19_366, 58.0),
    ] {
        let Some(path) = trace(name) else { continue };
        let (workload, reqs) = load_trace(&path).unwrap();
        assert_eq!(
            (reqs.len(), workload.request_count),
            (count, count),
            "{name}"
        );
        assert_eq!(workload.params, WorkloadParams::AzureTrace);
        assert_eq!(reqs[0].arrival_ms, 0.0);
        assert!(reqs.windows(2).all(|w| w[0].arrival_ms <= w[1].arrival_ms));
        // README: spans of ~57 and ~58 minutes.
        let span_min = reqs.last().unwrap().arrival_ms / 60_000.0;
        assert!((span_min - last_min).abs() < 1.0, "{name}: {span_min} min");
        // No prefix information ⇒ no block is shared between requests.
        let mut seen = rustc_hash::FxHashSet::default();
        for r in &reqs {
            assert_eq!(r.blocks.len(), (r.input_tokens / 16) as usize);
            for b in &r.blocks {
                assert!(seen.insert(*b), "{name}: block shared");
            }
        }
    }
}
