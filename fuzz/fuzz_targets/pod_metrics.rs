//! The pod `/metrics` parser (`kvgate_gateway::scrape::parse_metrics`) on arbitrary text: no
//! panic; values it keeps are in range.
#![no_main]

use kvgate_gateway::scrape::parse_metrics;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let m = parse_metrics(&text);
    if let Some(kv) = m.kv_usage {
        assert!((0.0..=1.0).contains(&kv), "kv usage {kv} out of range");
    }
});
