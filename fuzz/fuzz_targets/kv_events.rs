//! The vLLM KV-event batch decoder (`kvgate_core::index::kv_events_wire::decode_batch`) on
//! arbitrary bytes: a batch or a typed `WireError`, never a panic. Decoded events are applied
//! to an engine index, as the gateway's subscriber does.
#![no_main]

use kvgate_core::PodId;
use kvgate_core::index::engine::EngineIndex;
use kvgate_core::index::kv_events_wire::decode_batch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = decode_batch(data) {
        let mut index = EngineIndex::new();
        index.add_pod(PodId(0), "fuzz-model");
        for event in &batch.events {
            let _ = index.apply(PodId(0), event);
        }
    }
});
