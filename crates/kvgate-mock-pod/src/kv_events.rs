//! KV-cache events over ZeroMQ in vLLM's wire format (`reference/interfaces.md` §2.2).
//!
//! - **PUB** socket bound at `--kv-events`: one message per engine step that changed the cache,
//!   three frames `[topic, seq (u64 big-endian, from 0, +1 per batch), msgpack KVEventBatch]`.
//! - **Replay** ROUTER socket bound at `--kv-events-replay`: a DEALER sends `[empty, start_seq]`
//!   (8 bytes big-endian); the pod answers every buffered batch with `seq >= start_seq` as
//!   `[empty, topic, seq, payload]` and then the end marker `[empty, empty, 0xFF×8, empty]`
//!   (seq = −1), the four frames real vLLM 0.32 sends (reference/real-vllm.md). Malformed
//!   replay requests are counted and logged.
//! - **Encodings** (`--kv-events-encoding`):
//!   - `map` (current vLLM): each event is a msgpack map tagged by `"type"`, with the fields
//!     vLLM 0.32 sends (observed, reference/real-vllm.md):
//!     `{"type":"BlockStored","block_hashes":[…],"parent_block_hash":…,"token_ids":[…],
//!     "block_size":B,"lora_id":null,"medium":"GPU","lora_name":null,"extra_keys":[null per
//!     block],"group_idx":0,"kv_cache_spec_kind":"full_attention"}` and
//!     `{"type":"BlockRemoved","block_hashes":[h],"medium":"GPU","group_idx":0}`;
//!   - `array` (vLLM before PR #42892): each event is a positional array whose first element is
//!     the tag, `["BlockStored",[…],parent,[…],B,null,"GPU",null]` (that version's fields only).
//!
//!   `B` is the pod's `--block-size` (16 by default; vLLM CPU uses 128).
//!
//!   In both, the batch is the positional `[ts, [events…], data_parallel_rank]` (`ts` = Unix
//!   seconds as a float, rank 0), which is what vLLM v0.26 was observed to send; decoders
//!   should accept a map batch too (interfaces.md notes both).
//! - **Block hashes** are the engine's u64 chained xxh3 hashes
//!   ([`kvgate_core::BlockHasher::hash_tokens`] seeded by model + `cache_salt`), sent as msgpack
//!   unsigned ints, like vLLM's default `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`. Consecutive
//!   blocks of one prompt stored in the same step go in one `BlockStored` whose
//!   `parent_block_hash` is the hash of the block before the first (nil for a prompt's first
//!   block); `token_ids` holds `B × blocks` ids. Each evicted block is one `BlockRemoved`,
//!   placed before the stores of its batch (evictions happen when blocks are allocated, stores
//!   when they are full). Only prompt blocks are stored: vLLM also stores the blocks filled
//!   during decode, the engine model does not hash output tokens.
//!   `AllBlocksCleared` is encoded but never sent: the engine model has no cache reset.
//!
//! Bounds: the queue from the engine driver to the publisher holds [`PUBLISH_QUEUE_BATCHES`]
//! batches (a full queue drops the batch and counts it, so subscribers see a `seq` gap only in
//! the replay buffer's absence); the replay buffer keeps the last [`REPLAY_BUFFER_BATCHES`]
//! batches (vLLM's `buffer_steps` default).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use kvgate_core::BlockHash;
use rmpv::Value;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Batches kept for replay (vLLM `KVEventsConfig.buffer_steps`).
pub const REPLAY_BUFFER_BATCHES: usize = 10_000;
/// Batches waiting between the engine driver and the PUB socket.
pub const PUBLISH_QUEUE_BATCHES: usize = 10_000;
/// The replay stream's end marker (seq = −1).
pub const END_SEQ: [u8; 8] = [0xFF; 8];

/// How events are laid out in msgpack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvEventsEncoding {
    /// Events are maps tagged by "type" (current vLLM).
    #[default]
    Map,
    /// Events are positional arrays, tag first (vLLM before PR #42892).
    Array,
}

impl KvEventsEncoding {
    /// Every encoding, in the order `kvgate mock-pod --help` lists them.
    pub const ALL: [KvEventsEncoding; 2] = [KvEventsEncoding::Map, KvEventsEncoding::Array];

    /// The name in `--kv-events-encoding`.
    pub fn name(self) -> &'static str {
        match self {
            KvEventsEncoding::Map => "map",
            KvEventsEncoding::Array => "array",
        }
    }

    /// What the encoding is, as `kvgate mock-pod --help` says it.
    pub fn help(self) -> &'static str {
        match self {
            KvEventsEncoding::Map => "Events are maps tagged by \"type\" (current vLLM)",
            KvEventsEncoding::Array => {
                "Events are positional arrays, tag first (vLLM before PR #42892)"
            }
        }
    }
}

impl std::str::FromStr for KvEventsEncoding {
    type Err = String;

    /// By [`KvEventsEncoding::name`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| format!("unknown KV events encoding `{s}` (map or array)"))
    }
}

/// One cache event as vLLM reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    BlockStored {
        block_hashes: Vec<BlockHash>,
        parent_block_hash: Option<BlockHash>,
        token_ids: Vec<u32>,
        /// Tokens per block: `token_ids.len() == block_size × block_hashes.len()`.
        block_size: u32,
    },
    BlockRemoved {
        block_hashes: Vec<BlockHash>,
    },
    AllBlocksCleared,
}

const MEDIUM: &str = "GPU";
/// vLLM 0.32's `group_idx` and `kv_cache_spec_kind` of a plain decoder's one KV-cache group.
const GROUP_IDX: u8 = 0;
const KV_CACHE_SPEC_KIND: &str = "full_attention";

fn hashes(h: &[BlockHash]) -> Value {
    Value::Array(h.iter().map(|&h| Value::from(h)).collect())
}

fn event_value(event: &CacheEvent, encoding: KvEventsEncoding) -> Value {
    let s = |x: &str| Value::from(x);
    let map = encoding == KvEventsEncoding::Map;
    let mut fields: Vec<(&str, Value)> = match event {
        CacheEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
        } => vec![
            ("type", s("BlockStored")),
            ("block_hashes", hashes(block_hashes)),
            (
                "parent_block_hash",
                parent_block_hash.map_or(Value::Nil, Value::from),
            ),
            (
                "token_ids",
                Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
            ),
            ("block_size", Value::from(*block_size)),
            ("lora_id", Value::Nil),
            ("medium", s(MEDIUM)),
            ("lora_name", Value::Nil),
        ],
        CacheEvent::BlockRemoved { block_hashes } => vec![
            ("type", s("BlockRemoved")),
            ("block_hashes", hashes(block_hashes)),
            ("medium", s(MEDIUM)),
        ],
        CacheEvent::AllBlocksCleared => vec![("type", s("AllBlocksCleared"))],
    };
    // The fields vLLM 0.32 added; the older array layout has none of them.
    if map {
        match event {
            CacheEvent::BlockStored { block_hashes, .. } => {
                let extra_keys = Value::Array(vec![Value::Nil; block_hashes.len()]);
                fields.push(("extra_keys", extra_keys));
                fields.push(("group_idx", Value::from(GROUP_IDX)));
                fields.push(("kv_cache_spec_kind", s(KV_CACHE_SPEC_KIND)));
            }
            CacheEvent::BlockRemoved { .. } => fields.push(("group_idx", Value::from(GROUP_IDX))),
            CacheEvent::AllBlocksCleared => {}
        }
    }
    match encoding {
        KvEventsEncoding::Map => Value::Map(fields.into_iter().map(|(k, v)| (s(k), v)).collect()),
        KvEventsEncoding::Array => Value::Array(fields.into_iter().map(|(_, v)| v).collect()),
    }
}

/// The msgpack payload of one `KVEventBatch` of data-parallel rank `rank` (0 for a pod with
/// one engine).
pub fn encode_batch(
    ts_unix_s: f64,
    events: &[CacheEvent],
    encoding: KvEventsEncoding,
    rank: u32,
) -> Bytes {
    let batch = Value::Array(vec![
        Value::F64(ts_unix_s),
        Value::Array(events.iter().map(|e| event_value(e, encoding)).collect()),
        Value::from(rank),
    ]);
    let mut out = Vec::with_capacity(256);
    // Writing into a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &batch);
    Bytes::from(out)
}

type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// The bound sockets of one pod, and the queue the driver publishes into.
pub struct Publisher {
    pub tx: mpsc::Sender<Bytes>,
    /// The PUB endpoint as bound (port resolved).
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Binds the PUB (and optional replay ROUTER) socket and starts their tasks.
pub async fn start(
    endpoint: &str,
    replay_endpoint: Option<&str>,
    topic: String,
) -> anyhow::Result<Publisher> {
    let mut pub_socket = PubSocket::new();
    let bound = pub_socket
        .bind(endpoint)
        .await
        .map_err(|e| anyhow::anyhow!("binding KV events PUB at {endpoint}: {e}"))?;
    let buffer: ReplayBuffer = Arc::new(Mutex::new(VecDeque::new()));
    let mut tasks = Vec::new();
    let mut replay_bound = None;
    if let Some(replay) = replay_endpoint {
        let mut router = RouterSocket::new();
        let b = router
            .bind(replay)
            .await
            .map_err(|e| anyhow::anyhow!("binding KV events replay at {replay}: {e}"))?;
        replay_bound = Some(b.to_string());
        tasks.push(tokio::spawn(serve_replay(
            router,
            buffer.clone(),
            Bytes::from(topic.clone()),
        )));
    }
    let (tx, rx) = mpsc::channel(PUBLISH_QUEUE_BATCHES);
    tasks.push(tokio::spawn(publish(pub_socket, rx, buffer, topic)));
    Ok(Publisher {
        tx,
        endpoint: bound.to_string(),
        replay_endpoint: replay_bound,
        tasks,
    })
}

async fn publish(
    mut socket: PubSocket,
    mut rx: mpsc::Receiver<Bytes>,
    buffer: ReplayBuffer,
    topic: String,
) {
    let topic = Bytes::from(topic);
    let mut seq: u64 = 0;
    while let Some(payload) = rx.recv().await {
        if let Ok(mut b) = buffer.lock() {
            if b.len() >= REPLAY_BUFFER_BATCHES {
                b.pop_front();
            }
            b.push_back((seq, payload.clone()));
        }
        let frames = vec![
            topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ];
        if let Ok(msg) = ZmqMessage::try_from(frames)
            && let Err(e) = socket.send(msg).await
        {
            tracing::warn!("KV events publish failed: {e}");
        }
        seq += 1;
    }
}

async fn serve_replay(mut socket: RouterSocket, buffer: ReplayBuffer, topic: Bytes) {
    loop {
        let msg = match socket.recv().await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("KV events replay socket: {e}");
                continue;
            }
        };
        let frames = msg.into_vec();
        // [identity, empty, start_seq]
        let (Some(identity), Some(start)) = (frames.first(), frames.get(2)) else {
            tracing::warn!(
                "KV events replay: malformed request of {} frames",
                frames.len()
            );
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
            tracing::warn!(
                "KV events replay: start_seq of {} bytes, expected 8",
                start.len()
            );
            continue;
        };
        let start = u64::from_be_bytes(start);
        let batches: Vec<(u64, Bytes)> = match buffer.lock() {
            Ok(b) => b.iter().filter(|(s, _)| *s >= start).cloned().collect(),
            Err(_) => Vec::new(),
        };
        let empty = Bytes::new();
        let end = (Bytes::new(), u64::from_be_bytes(END_SEQ), Bytes::new());
        for (topic, seq, payload) in batches
            .into_iter()
            .map(|(seq, payload)| (topic.clone(), seq, payload))
            .chain(std::iter::once(end))
        {
            let frames = vec![
                identity.clone(),
                empty.clone(),
                topic,
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload,
            ];
            let Ok(reply) = ZmqMessage::try_from(frames) else {
                continue;
            };
            if let Err(e) = socket.send(reply).await {
                tracing::warn!("KV events replay send failed: {e}");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored() -> CacheEvent {
        CacheEvent::BlockStored {
            block_hashes: vec![u64::MAX, 2],
            parent_block_hash: None,
            token_ids: (0..256).collect(),
            block_size: 128,
        }
    }

    #[test]
    fn map_encoding_tags_events_with_type_inside_a_positional_batch() {
        let bytes = encode_batch(1.5, &[stored()], KvEventsEncoding::Map, 0);
        let v = rmpv::decode::read_value(&mut bytes.as_ref()).unwrap();
        let batch = v.as_array().unwrap();
        assert_eq!(batch[0].as_f64(), Some(1.5));
        let event = &batch[1].as_array().unwrap()[0];
        let map = event.as_map().unwrap();
        let get = |k: &str| {
            map.iter()
                .find(|(key, _)| key.as_str() == Some(k))
                .map(|(_, v)| v)
        };
        assert_eq!(get("type").and_then(|v| v.as_str()), Some("BlockStored"));
        assert_eq!(
            get("block_hashes").unwrap().as_array().unwrap()[0].as_u64(),
            Some(u64::MAX)
        );
        assert!(get("parent_block_hash").unwrap().is_nil());
        assert_eq!(get("token_ids").unwrap().as_array().unwrap().len(), 256);
        assert_eq!(get("block_size").and_then(|v| v.as_u64()), Some(128));
        assert_eq!(get("extra_keys").unwrap().as_array().unwrap().len(), 2);
        assert_eq!(get("group_idx").and_then(|v| v.as_u64()), Some(0));
        assert_eq!(
            get("kv_cache_spec_kind").and_then(|v| v.as_str()),
            Some("full_attention")
        );
    }

    #[test]
    fn array_encoding_puts_the_tag_first() {
        let removed = CacheEvent::BlockRemoved {
            block_hashes: vec![7],
        };
        let bytes = encode_batch(0.0, &[removed], KvEventsEncoding::Array, 0);
        let v = rmpv::decode::read_value(&mut bytes.as_ref()).unwrap();
        let event = v.as_array().unwrap()[1].as_array().unwrap()[0]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(event[0].as_str(), Some("BlockRemoved"));
        assert_eq!(event[1].as_array().unwrap()[0].as_u64(), Some(7));
        assert_eq!(event[2].as_str(), Some("GPU"));
        assert_eq!(event.len(), 3, "no vLLM 0.32 fields in the old layout");
    }
}
