//! KV-event ingestion on one core: decode a vLLM batch (msgpack) and apply it to the engine
//! index, as the gateway's subscriber does (without its lock and socket).
//!
//! A batch is one scheduler step of a pod whose cache is full: 4 `BlockStored` events of 32
//! blocks × 16 tokens (new prompts, each continuing a stored chain or starting one) and 128
//! single-block `BlockRemoved` events (vLLM emits one per evicted block): 132 events, 256 block
//! changes. Batches cycle through a ring of 64, each removing the blocks the batch 32 steps
//! earlier stored, so the index stays at 32 × 128 = 4,096 blocks (steady state, no growth).
//! Encoding: the batch positional, the events maps tagged by `type` (vLLM's current layout).
//!
//! `cargo bench -p kvgate-core --bench kv_events`; throughput is in events (132 per batch).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvgate_core::PodId;
use kvgate_core::index::engine::EngineIndex;
use kvgate_core::index::kv_events_wire::decode_batch;
use rmpv::Value;
use std::hint::black_box;

const RING: u64 = 64;
const LAG: u64 = 32;
const STORED_EVENTS: u64 = 4;
const BLOCKS_PER_STORED: u64 = 32;
const BLOCK_SIZE: u64 = 16;
const BLOCKS_PER_BATCH: u64 = STORED_EVENTS * BLOCKS_PER_STORED;
const EVENTS_PER_BATCH: u64 = STORED_EVENTS + BLOCKS_PER_BATCH;

fn s(x: &str) -> Value {
    Value::from(x)
}

fn engine_hash(batch: u64, block: u64) -> u64 {
    // Distinct, spread-out u64s (engine hashes are arbitrary to the index).
    (batch * BLOCKS_PER_BATCH + block + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn encode_batch(j: u64) -> Vec<u8> {
    let mut events = Vec::new();
    for e in 0..STORED_EVENTS {
        let first = e * BLOCKS_PER_STORED;
        let hashes: Vec<Value> = (first..first + BLOCKS_PER_STORED)
            .map(|b| Value::from(engine_hash(j, b)))
            .collect();
        let tokens: Vec<Value> = (0..BLOCKS_PER_STORED * BLOCK_SIZE)
            .map(|t| Value::from(((j * 7919 + e * 104_729 + t * 31) % 100_000) as u32))
            .collect();
        events.push(Value::Map(vec![
            (s("type"), s("BlockStored")),
            (s("block_hashes"), Value::Array(hashes)),
            (s("parent_block_hash"), Value::Nil),
            (s("token_ids"), Value::Array(tokens)),
            (s("block_size"), Value::from(BLOCK_SIZE)),
            (s("lora_id"), Value::Nil),
            (s("medium"), s("GPU")),
        ]));
    }
    let old = (j + RING - LAG) % RING;
    for b in 0..BLOCKS_PER_BATCH {
        events.push(Value::Map(vec![
            (s("type"), s("BlockRemoved")),
            (
                s("block_hashes"),
                Value::Array(vec![Value::from(engine_hash(old, b))]),
            ),
            (s("medium"), s("GPU")),
        ]));
    }
    let batch = Value::Array(vec![
        Value::from(1_764_480_000.5f64),
        Value::Array(events),
        Value::from(0u8),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("encoding to a Vec cannot fail");
    out
}

fn bench(c: &mut Criterion) {
    let batches: Vec<Vec<u8>> = (0..RING).map(encode_batch).collect();
    let mut group = c.benchmark_group("kv_events");
    group.throughput(Throughput::Elements(EVENTS_PER_BATCH));

    group.bench_function("decode", |b| {
        let mut j = 0;
        b.iter(|| {
            j = (j + 1) % batches.len();
            black_box(decode_batch(black_box(&batches[j])).expect("valid batch"))
        });
    });

    group.bench_function("decode_and_apply", |b| {
        let mut index = EngineIndex::new();
        index.add_pod(PodId(0), "model");
        for payload in &batches {
            for e in &decode_batch(payload).expect("valid batch").events {
                index.apply(PodId(0), e);
            }
        }
        let mut j = 0;
        b.iter(|| {
            j = (j + 1) % batches.len();
            let batch = decode_batch(black_box(&batches[j])).expect("valid batch");
            for e in &batch.events {
                index.apply(PodId(0), e);
            }
        });
        assert_eq!(
            index.engine_blocks(PodId(0)) as u64,
            LAG * BLOCKS_PER_BATCH,
            "steady state"
        );
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
