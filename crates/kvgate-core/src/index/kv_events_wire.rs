//! Decoding vLLM's KV-event batches (the msgpack payload, third ZeroMQ frame) into
//! [`KvEvent`]s. Pure: bytes in, events or a typed error out.
//!
//! Both encodings vLLM has shipped are accepted at both levels (reference/interfaces.md §2.2,
//! rust-crates.md §15.6): the batch as a positional array `[ts, [events…], dp_rank]` or a map
//! `{"ts", "events", "data_parallel_rank"}`; each event as a map tagged by `"type"` (vLLM after
//! PR #42892) or a positional array with the tag first (`array_like=True`, before). Unknown map
//! keys and trailing positional elements are ignored; an event with an unknown tag is skipped
//! and counted in [`KvEventBatch::unknown_events`] (a newer vLLM may add event kinds). Block
//! hashes may be msgpack ints (u64, or negative i64 from old builtin-hash releases, taken as
//! their two's complement) or bytes (the raw digest: its last 8 bytes, big-endian, which is what
//! vLLM sends as an int by default).
//!
//! Decoding goes through [`rmpv::Value`] (rmpv caps nesting depth and pre-allocation, so hostile
//! input cannot recurse or allocate without bound) and never panics: anything else is a
//! [`WireError`]. Payloads over [`MAX_BATCH_BYTES`] are rejected before decoding, which bounds
//! the decoded size too.

use super::engine::{EngineBlockHash, KvEvent};
use rmpv::Value;

/// Largest payload decoded (vLLM's batches are one scheduler step: kilobytes).
pub const MAX_BATCH_BYTES: usize = 16 << 20;

/// A decoded `KVEventBatch`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventBatch {
    /// Unix seconds.
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub data_parallel_rank: Option<i64>,
    /// Events with a tag this decoder does not know (skipped).
    pub unknown_events: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("batch of {0} bytes exceeds the {MAX_BATCH_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("not msgpack: {0}")]
    Msgpack(String),
    #[error("unexpected shape: {0}")]
    Shape(&'static str),
}

fn shape(what: &'static str) -> WireError {
    WireError::Shape(what)
}

/// Decodes one batch payload.
pub fn decode_batch(payload: &[u8]) -> Result<KvEventBatch, WireError> {
    if payload.len() > MAX_BATCH_BYTES {
        return Err(WireError::TooLarge(payload.len()));
    }
    let mut reader = payload;
    let value =
        rmpv::decode::read_value(&mut reader).map_err(|e| WireError::Msgpack(e.to_string()))?;
    let (ts, events, rank) = match &value {
        Value::Array(items) => (items.first(), items.get(1), items.get(2)),
        Value::Map(entries) => (
            map_get(entries, "ts"),
            map_get(entries, "events"),
            map_get(entries, "data_parallel_rank"),
        ),
        _ => return Err(shape("batch is neither an array nor a map")),
    };
    let ts = match ts {
        Some(Value::F64(t)) => *t,
        Some(Value::F32(t)) => f64::from(*t),
        Some(Value::Integer(i)) => i.as_f64().unwrap_or(0.0),
        _ => return Err(shape("batch ts is not a number")),
    };
    let Some(Value::Array(raw_events)) = events else {
        return Err(shape("batch events is not an array"));
    };
    let data_parallel_rank = match rank {
        None | Some(Value::Nil) => None,
        Some(Value::Integer(i)) => i.as_i64(),
        Some(_) => return Err(shape("data_parallel_rank is not an int")),
    };
    let mut batch = KvEventBatch {
        ts,
        events: Vec::with_capacity(raw_events.len()),
        data_parallel_rank,
        unknown_events: 0,
    };
    for raw in raw_events {
        match decode_event(raw)? {
            Some(event) => batch.events.push(event),
            None => batch.unknown_events += 1,
        }
    }
    Ok(batch)
}

fn map_get<'a>(entries: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    entries
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// Field access that works for both event layouts: by name in a map, by position in an array
/// (position 0 is the tag).
enum Fields<'a> {
    Map(&'a [(Value, Value)]),
    Array(&'a [Value]),
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str, position: usize) -> Option<&'a Value> {
        match self {
            Fields::Map(entries) => map_get(entries, name),
            Fields::Array(items) => items.get(position),
        }
        .filter(|v| !v.is_nil())
    }
}

/// `Ok(None)` for an event with an unknown tag.
fn decode_event(raw: &Value) -> Result<Option<KvEvent>, WireError> {
    let (tag, fields) = match raw {
        Value::Map(entries) => (map_get(entries, "type"), Fields::Map(entries)),
        Value::Array(items) => (items.first(), Fields::Array(items)),
        _ => return Err(shape("event is neither an array nor a map")),
    };
    let Some(tag) = tag.and_then(Value::as_str) else {
        return Err(shape("event has no string tag"));
    };
    let event = match tag {
        "BlockStored" => {
            let block_hashes = hashes(fields.get("block_hashes", 1))?;
            let parent_block_hash = fields.get("parent_block_hash", 2).map(hash).transpose()?;
            let Some(Value::Array(tokens)) = fields.get("token_ids", 3) else {
                return Err(shape("BlockStored.token_ids is not an array"));
            };
            let token_ids = tokens
                .iter()
                .map(|t| {
                    t.as_u64()
                        .and_then(|t| u32::try_from(t).ok())
                        .ok_or(shape("token id is not a u32"))
                })
                .collect::<Result<Vec<u32>, _>>()?;
            let block_size = fields
                .get("block_size", 4)
                .and_then(Value::as_u64)
                .and_then(|b| u32::try_from(b).ok())
                .ok_or(shape("BlockStored.block_size is not a u32"))?;
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                medium: opt_str(fields.get("medium", 6))?,
                lora_name: opt_str(fields.get("lora_name", 7))?,
            }
        }
        "BlockRemoved" => KvEvent::BlockRemoved {
            block_hashes: hashes(fields.get("block_hashes", 1))?,
            medium: opt_str(fields.get("medium", 2))?,
        },
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        _ => return Ok(None),
    };
    Ok(Some(event))
}

fn opt_str(v: Option<&Value>) -> Result<Option<String>, WireError> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) => s
            .as_str()
            .map(|s| Some(s.to_string()))
            .ok_or(shape("string is not UTF-8")),
        Some(_) => Err(shape("expected a string")),
    }
}

fn hashes(v: Option<&Value>) -> Result<Vec<EngineBlockHash>, WireError> {
    let Some(Value::Array(items)) = v else {
        return Err(shape("block_hashes is not an array"));
    };
    items.iter().map(hash).collect()
}

/// An `ExternalBlockHash` (int or bytes) as u64.
fn hash(v: &Value) -> Result<EngineBlockHash, WireError> {
    match v {
        Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|i| i as u64))
            .ok_or(shape("hash int out of range")),
        Value::Binary(bytes) => {
            let tail = bytes.get(bytes.len().saturating_sub(8)..).unwrap_or(&[]);
            Ok(tail.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
        }
        _ => Err(shape("hash is neither an int nor bytes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(x: &str) -> Value {
        Value::from(x)
    }

    fn encode(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).unwrap();
        out
    }

    fn map(fields: Vec<(&str, Value)>) -> Value {
        Value::Map(fields.into_iter().map(|(k, v)| (s(k), v)).collect())
    }

    fn expected_stored() -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: vec![u64::MAX, 7],
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
            lora_name: None,
            medium: Some("GPU".into()),
        }
    }

    fn hashes_value() -> Value {
        Value::Array(vec![Value::from(u64::MAX), Value::from(7u8)])
    }

    fn tokens_value() -> Value {
        Value::Array((1..=4u32).map(Value::from).collect())
    }

    #[test]
    fn positional_events_in_a_positional_batch_decode_with_trailing_fields_ignored() {
        let stored = Value::Array(vec![
            s("BlockStored"),
            hashes_value(),
            Value::Nil,
            tokens_value(),
            Value::from(2u8),
            Value::Nil,
            s("GPU"),
            Value::Nil,
            Value::Nil,
            Value::from(0u8),
            s("full_attention"),
            s("a field from the future"),
        ]);
        let removed = Value::Array(vec![
            s("BlockRemoved"),
            Value::Array(vec![Value::from(-1i64)]),
            s("GPU"),
        ]);
        let cleared = Value::Array(vec![s("AllBlocksCleared")]);
        let batch = Value::Array(vec![
            Value::F64(12.5),
            Value::Array(vec![stored, removed, cleared]),
            Value::from(0u8),
        ]);
        let got = decode_batch(&encode(&batch)).unwrap();
        assert_eq!(got.ts, 12.5);
        assert_eq!(got.data_parallel_rank, Some(0));
        assert_eq!(
            got.events,
            vec![
                expected_stored(),
                KvEvent::BlockRemoved {
                    block_hashes: vec![u64::MAX],
                    medium: Some("GPU".into())
                },
                KvEvent::AllBlocksCleared
            ]
        );
    }

    #[test]
    fn map_events_in_a_map_batch_decode_with_unknown_keys_ignored() {
        let stored = map(vec![
            ("extra_keys", Value::Nil),
            ("type", s("BlockStored")),
            ("block_hashes", hashes_value()),
            ("parent_block_hash", Value::Nil),
            ("token_ids", tokens_value()),
            ("block_size", Value::from(2u8)),
            ("medium", s("GPU")),
            ("kv_cache_spec_sliding_window", Value::from(4096u32)),
        ]);
        let batch = map(vec![
            ("ts", Value::F64(1.0)),
            (
                "events",
                Value::Array(vec![stored, map(vec![("type", s("Future"))])]),
            ),
            ("data_parallel_rank", Value::Nil),
            ("more", s("x")),
        ]);
        let got = decode_batch(&encode(&batch)).unwrap();
        assert_eq!(got.events, vec![expected_stored()]);
        assert_eq!(got.unknown_events, 1);
        assert_eq!(got.data_parallel_rank, None);
    }

    #[test]
    fn byte_hashes_become_their_last_eight_bytes_big_endian() {
        let mut digest = vec![0xAA; 24];
        digest.extend(1u64.to_be_bytes());
        let removed = map(vec![
            ("type", s("BlockRemoved")),
            (
                "block_hashes",
                Value::Array(vec![Value::Binary(digest), Value::Binary(vec![1, 2])]),
            ),
        ]);
        let batch = Value::Array(vec![Value::F64(0.0), Value::Array(vec![removed])]);
        let got = decode_batch(&encode(&batch)).unwrap();
        assert_eq!(
            got.events,
            vec![KvEvent::BlockRemoved {
                block_hashes: vec![1, 0x0102],
                medium: None
            }]
        );
    }

    #[test]
    fn malformed_batches_are_typed_errors() {
        assert!(matches!(decode_batch(&[]), Err(WireError::Msgpack(_))));
        assert_eq!(
            decode_batch(&encode(&Value::from(3u8))),
            Err(WireError::Shape("batch is neither an array nor a map"))
        );
        let bad_token = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![map(vec![
                ("type", s("BlockStored")),
                ("block_hashes", hashes_value()),
                ("token_ids", Value::Array(vec![Value::from(-1i64)])),
                ("block_size", Value::from(2u8)),
            ])]),
        ]);
        assert_eq!(
            decode_batch(&encode(&bad_token)),
            Err(WireError::Shape("token id is not a u32"))
        );
        assert!(matches!(
            decode_batch(&vec![0u8; MAX_BATCH_BYTES + 1]),
            Err(WireError::TooLarge(_))
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_batch(&bytes);
        }

        #[test]
        fn corrupted_valid_batches_never_panic(
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
            cut in any::<prop::sample::Index>(),
        ) {
            let batch = Value::Array(vec![
                Value::F64(1.0),
                Value::Array(vec![Value::Array(vec![
                    s("BlockStored"), hashes_value(), Value::from(3u8), tokens_value(), Value::from(2u8),
                ])]),
                Value::from(0u8),
            ]);
            let mut bytes = encode(&batch);
            for (i, b) in flips {
                let i = i.index(bytes.len());
                bytes[i] = b;
            }
            let len = cut.index(bytes.len() + 1);
            let _ = decode_batch(&bytes[..len]);
        }
    }
}
