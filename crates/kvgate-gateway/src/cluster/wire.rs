//! The replica machine's messages ([`kvgate_core::session::replica`]) on the wire: a small
//! binary encoding (integers as LEB128 varints, pod keys and block hashes as 8 bytes
//! little-endian).
//!
//! ```text
//! message  = version:u8 (1) replica:u64le seq:varint count:varint event*
//! event    = 1 route    request pod:u64le input_tokens prefill_tokens n:varint block:u64le*n
//!          | 2 first    request
//!          | 3 tokens   request tokens
//!          | 4 finish   request
//!          | 5 snapshot next_request complete:u8 n:varint (request pod:u64le input prefill
//!                       first:u8 decode)*n
//!          | 6 sync     (asks the peers for their routed index; answered on the asker's subject)
//!          | 7 index    pod:u64le n:varint block:u64le*n (oldest first)
//!          | 8 bye      (the replica is leaving: release its charges now)
//!          | 9 sample   pod:u64le mask:u8 [ttft:f64le] [tpot:f64le] feature:f64le*8
//!                       (a finished request's training sample; mask bit 0: TTFT, bit 1: TPOT;
//!                       features in `Features`' field order)
//!          | 10 session pod:u64le key:u64le (retired: session affinity's record, sent by
//!                       versions before 2026-12-07 while it was on; read and skipped, counted
//!                       in kvgate_cluster_retired_events_total; never sent)
//! ```
//!
//! A pod is named by [`pod_key`], the xxh3-64 of its URL as the gateway shows it, so replicas
//! configured with the same pods agree without a shared id table.
//!
//! Size: a routed request costs one route (about 17 bytes + 8 per prompt block), a first token
//! (about 4), a tokens event per 32 generated tokens (about 6; the machine's
//! `tokens_per_event`) and a finish (about 4), plus its share of a message header (10 to 20 bytes per message, several
//! events per message under load) and NATS's own framing (about 40 bytes per message). A
//! 4,000-token prompt in 16-token blocks: about 2.0 KB for the route, 20 bytes for the rest,
//! and 90 bytes for its training sample (sent when it completed normally).
//!
//! A replica of an older version that does not know tag 9 (or 10) refuses the whole message (counted
//! as a decode error); its snapshots then repair the transitions it missed, so a rolling
//! upgrade loses no charge for longer than a snapshot period.
//!
//! Decoding never panics: truncated input, unknown tags or versions, and counts beyond
//! [`MAX_BLOCKS`] / [`MAX_ITEMS`] are errors (the receiver counts and skips the message).

use kvgate_core::predictor::Features;
use kvgate_core::{BlockHash, TrainingSample};

pub const VERSION: u8 = 1;
/// Most block hashes in one route or index event (a 1 Mi-token prompt in 16-token blocks).
pub const MAX_BLOCKS: usize = 65_536;
/// Most events in a message, or entries in a snapshot.
pub const MAX_ITEMS: usize = 1 << 20;

/// The key of a pod on the wire.
pub fn pod_key(url: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(url.as_bytes())
}

/// The events are the core replica machine's, encoded here: `Event` is
/// [`kvgate_core::session::replica::ReplicaEvent`], `Message` its
/// [`kvgate_core::session::replica::ReplicaMessage`].
pub use kvgate_core::session::replica::{
    ReplicaEvent as Event, ReplicaMessage as Message, SnapshotItem,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("message truncated")]
    Truncated,
    #[error("unknown version {0}")]
    Version(u8),
    #[error("unknown event tag {0}")]
    Tag(u8),
    #[error("count over bound")]
    TooMany,
    #[error("varint overflows 64 bits")]
    Varint,
    #[error("trailing bytes")]
    Trailing,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_blocks(out: &mut Vec<u8>, blocks: &[BlockHash]) {
    put_varint(out, blocks.len() as u64);
    for b in blocks {
        put_u64(out, *b);
    }
}

/// Appends one event's encoding to `out` (what [`encode`] writes per event).
pub fn encode_event(out: &mut Vec<u8>, e: &Event) {
    match e {
        Event::Route {
            request,
            pod,
            input_tokens,
            prefill_tokens,
            blocks,
        } => {
            out.push(1);
            put_varint(out, *request);
            put_u64(out, *pod);
            put_varint(out, u64::from(*input_tokens));
            put_varint(out, *prefill_tokens);
            put_blocks(out, blocks);
        }
        Event::FirstToken { request } => {
            out.push(2);
            put_varint(out, *request);
        }
        Event::Tokens { request, tokens } => {
            out.push(3);
            put_varint(out, *request);
            put_varint(out, *tokens);
        }
        Event::Finish { request } => {
            out.push(4);
            put_varint(out, *request);
        }
        Event::Snapshot {
            next_request,
            complete,
            live,
        } => {
            out.push(5);
            put_varint(out, *next_request);
            out.push(u8::from(*complete));
            put_varint(out, live.len() as u64);
            for i in live {
                put_varint(out, i.request);
                put_u64(out, i.pod);
                put_varint(out, u64::from(i.input_tokens));
                put_varint(out, i.prefill_tokens);
                out.push(u8::from(i.first_token));
                put_varint(out, i.decode_tokens);
            }
        }
        Event::SyncRequest => out.push(6),
        Event::Index { pod, blocks } => {
            out.push(7);
            put_u64(out, *pod);
            put_blocks(out, blocks);
        }
        Event::Bye => out.push(8),
        Event::Sample { pod, sample } => {
            out.push(9);
            put_u64(out, *pod);
            let mask =
                u8::from(sample.ttft_ms.is_some()) | (u8::from(sample.tpot_ms.is_some()) << 1);
            out.push(mask);
            for v in [sample.ttft_ms, sample.tpot_ms].into_iter().flatten() {
                put_u64(out, v.to_bits());
            }
            for v in features_of(&sample.features) {
                put_u64(out, v.to_bits());
            }
        }
    }
}

/// The features in wire order (`Features`' field order).
fn features_of(f: &Features) -> [f64; 8] {
    [
        f.kv_usage,
        f.waiting,
        f.running,
        f.prefill_tokens_in_flight,
        f.decode_tokens_in_flight,
        f.input_tokens,
        f.prefix_score,
        f.kv_capacity_tokens,
    ]
}

/// The message header; events follow ([`encode_event`] each, `count` of them).
pub fn encode_header(out: &mut Vec<u8>, replica: u64, seq: u64, count: usize) {
    out.push(VERSION);
    put_u64(out, replica);
    put_varint(out, seq);
    put_varint(out, count as u64);
}

pub fn encode(m: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    encode_header(&mut out, m.replica, m.seq, m.events.len());
    for e in &m.events {
        encode_event(&mut out, e);
    }
    out
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn u8(&mut self) -> Result<u8, DecodeError> {
        let (&b, rest) = self.buf.split_first().ok_or(DecodeError::Truncated)?;
        self.buf = rest;
        Ok(b)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        if self.buf.len() < 8 {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.buf.split_at(8);
        self.buf = rest;
        let mut b = [0u8; 8];
        b.copy_from_slice(head);
        Ok(u64::from_le_bytes(b))
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(DecodeError::Varint);
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::Varint)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        u32::try_from(self.varint()?).map_err(|_| DecodeError::Varint)
    }

    fn count(&mut self, max: usize, min_bytes_each: usize) -> Result<usize, DecodeError> {
        let n = usize::try_from(self.varint()?).map_err(|_| DecodeError::TooMany)?;
        if n > max {
            return Err(DecodeError::TooMany);
        }
        // A count the rest of the message cannot hold is refused before allocating.
        if n.saturating_mul(min_bytes_each) > self.buf.len() {
            return Err(DecodeError::Truncated);
        }
        Ok(n)
    }

    fn blocks(&mut self) -> Result<Vec<BlockHash>, DecodeError> {
        let n = self.count(MAX_BLOCKS, 8)?;
        (0..n).map(|_| self.u64()).collect()
    }

    /// One event; `None`: a retired kind, read and skipped.
    fn event(&mut self) -> Result<Option<Event>, DecodeError> {
        Ok(Some(match self.u8()? {
            1 => Event::Route {
                request: self.varint()?,
                pod: self.u64()?,
                input_tokens: self.u32()?,
                prefill_tokens: self.varint()?,
                blocks: self.blocks()?,
            },
            2 => Event::FirstToken {
                request: self.varint()?,
            },
            3 => Event::Tokens {
                request: self.varint()?,
                tokens: self.varint()?,
            },
            4 => Event::Finish {
                request: self.varint()?,
            },
            5 => {
                let next_request = self.varint()?;
                let complete = self.u8()? != 0;
                let n = self.count(MAX_ITEMS, 13)?;
                let mut live = Vec::with_capacity(n);
                for _ in 0..n {
                    live.push(SnapshotItem {
                        request: self.varint()?,
                        pod: self.u64()?,
                        input_tokens: self.u32()?,
                        prefill_tokens: self.varint()?,
                        first_token: self.u8()? != 0,
                        decode_tokens: self.varint()?,
                    });
                }
                Event::Snapshot {
                    next_request,
                    complete,
                    live,
                }
            }
            6 => Event::SyncRequest,
            7 => Event::Index {
                pod: self.u64()?,
                blocks: self.blocks()?,
            },
            8 => Event::Bye,
            9 => {
                let pod = self.u64()?;
                let mask = self.u8()?;
                if mask > 3 {
                    return Err(DecodeError::Tag(9));
                }
                let mut f64_if = |bit: u8| -> Result<Option<f64>, DecodeError> {
                    Ok(if mask & bit != 0 {
                        Some(f64::from_bits(self.u64()?))
                    } else {
                        None
                    })
                };
                let ttft_ms = f64_if(1)?;
                let tpot_ms = f64_if(2)?;
                let mut v = [0f64; 8];
                for x in &mut v {
                    *x = f64::from_bits(self.u64()?);
                }
                let [
                    kv_usage,
                    waiting,
                    running,
                    prefill_tokens_in_flight,
                    decode_tokens_in_flight,
                    input_tokens,
                    prefix_score,
                    kv_capacity_tokens,
                ] = v;
                Event::Sample {
                    pod,
                    sample: TrainingSample {
                        features: Features {
                            kv_usage,
                            waiting,
                            running,
                            prefill_tokens_in_flight,
                            decode_tokens_in_flight,
                            input_tokens,
                            prefix_score,
                            kv_capacity_tokens,
                        },
                        ttft_ms,
                        tpot_ms,
                    },
                }
            }
            10 => {
                // Retired (session affinity's record): its pod and key are read and dropped.
                self.u64()?;
                self.u64()?;
                return Ok(None);
            }
            t => return Err(DecodeError::Tag(t)),
        }))
    }
}

pub fn decode(buf: &[u8]) -> Result<Message, DecodeError> {
    decode_counting_retired(buf).map(|(message, _)| message)
}

/// [`decode`], with the number of retired events (tag 10) it skipped.
pub fn decode_counting_retired(buf: &[u8]) -> Result<(Message, u64), DecodeError> {
    let mut r = Reader { buf };
    let v = r.u8()?;
    if v != VERSION {
        return Err(DecodeError::Version(v));
    }
    let replica = r.u64()?;
    let seq = r.varint()?;
    let n = r.count(MAX_ITEMS, 1)?;
    let mut events = Vec::with_capacity(n);
    let mut retired = 0;
    for _ in 0..n {
        match r.event()? {
            Some(event) => events.push(event),
            None => retired += 1,
        }
    }
    if !r.buf.is_empty() {
        return Err(DecodeError::Trailing);
    }
    Ok((
        Message {
            replica,
            seq,
            events,
        },
        retired,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Message {
        Message {
            replica: 0xdead_beef_0123_4567,
            seq: 300,
            events: vec![
                Event::Route {
                    request: 1,
                    pod: pod_key("http://127.0.0.1:8000"),
                    input_tokens: 4_010,
                    prefill_tokens: 10,
                    blocks: (0..250u64)
                        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                        .collect(),
                },
                Event::FirstToken { request: 1 },
                Event::Tokens {
                    request: 1,
                    tokens: 32,
                },
                Event::Finish { request: 1 },
                Event::Snapshot {
                    next_request: 2,
                    complete: true,
                    live: vec![SnapshotItem {
                        request: 0,
                        pod: 5,
                        input_tokens: 7,
                        prefill_tokens: 0,
                        first_token: true,
                        decode_tokens: u64::MAX,
                    }],
                },
                Event::SyncRequest,
                Event::Index {
                    pod: 9,
                    blocks: vec![1, 2, 3],
                },
                Event::Bye,
                Event::Sample {
                    pod: 5,
                    sample: TrainingSample {
                        features: Features {
                            kv_usage: 0.25,
                            waiting: 1.0,
                            running: 3.0,
                            prefill_tokens_in_flight: 4_000.0,
                            decode_tokens_in_flight: 120.0,
                            input_tokens: 4_010.0,
                            prefix_score: 0.5,
                            kv_capacity_tokens: 467_000.0,
                        },
                        ttft_ms: Some(123.5),
                        tpot_ms: None,
                    },
                },
            ],
        }
    }

    #[test]
    fn every_event_round_trips() {
        let m = sample();
        assert_eq!(decode(&encode(&m)).unwrap(), m);
    }

    /// A replica older than 2026-12-07 with session affinity on sends session records (tag 10):
    /// they are skipped and counted, and the rest of its message is applied.
    #[test]
    fn a_retired_session_record_from_an_older_replica_is_skipped_and_counted() {
        let mut buf = vec![VERSION];
        put_u64(&mut buf, 7);
        put_varint(&mut buf, 3);
        put_varint(&mut buf, 3);
        encode_event(&mut buf, &Event::FirstToken { request: 1 });
        buf.push(10);
        put_u64(&mut buf, 5);
        put_u64(&mut buf, 0x0123_4567_89ab_cdef);
        encode_event(&mut buf, &Event::Finish { request: 1 });
        let (m, retired) = decode_counting_retired(&buf).unwrap();
        assert_eq!(retired, 1);
        assert_eq!(
            m,
            Message {
                replica: 7,
                seq: 3,
                events: vec![
                    Event::FirstToken { request: 1 },
                    Event::Finish { request: 1 }
                ],
            }
        );
        // Truncated, it is still an error.
        assert_eq!(decode(&buf[..buf.len() - 10]), Err(DecodeError::Truncated));
    }

    #[test]
    fn a_routed_request_costs_about_17_bytes_plus_8_per_block() {
        let route = |blocks: usize| {
            let mut out = Vec::new();
            encode_event(
                &mut out,
                &Event::Route {
                    request: 100_000,
                    pod: pod_key("http://10.0.0.5:8000"),
                    input_tokens: 4_010,
                    prefill_tokens: 4_010,
                    blocks: vec![u64::MAX; blocks],
                },
            );
            out.len()
        };
        assert_eq!(route(0), 17);
        assert_eq!(route(250), 17 + 1 + 250 * 8);
        let mut rest = Vec::new();
        for e in [
            Event::FirstToken { request: 100_000 },
            Event::Tokens {
                request: 100_000,
                tokens: 32,
            },
            Event::Finish { request: 100_000 },
        ] {
            encode_event(&mut rest, &e);
        }
        assert_eq!(rest.len(), 4 + 5 + 4);
        let mut sample_bytes = Vec::new();
        encode_event(
            &mut sample_bytes,
            &Event::Sample {
                pod: 1,
                sample: TrainingSample {
                    features: Features::default(),
                    ttft_ms: Some(1.0),
                    tpot_ms: Some(2.0),
                },
            },
        );
        assert_eq!(sample_bytes.len(), 1 + 8 + 1 + 2 * 8 + 8 * 8);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert_eq!(decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(decode(&[2]), Err(DecodeError::Version(2)));
        let mut m = encode(&sample());
        m.push(0);
        assert_eq!(decode(&m), Err(DecodeError::Trailing));
        // A huge block count with no bytes behind it is refused before allocating.
        let mut out = Vec::new();
        encode_header(&mut out, 1, 1, 1);
        out.push(7);
        put_u64(&mut out, 1);
        put_varint(&mut out, 60_000);
        assert_eq!(decode(&out), Err(DecodeError::Truncated));
        let mut out = Vec::new();
        encode_header(&mut out, 1, 1, 1);
        out.push(99);
        assert_eq!(decode(&out), Err(DecodeError::Tag(99)));
        assert_eq!(
            decode(&[
                1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                0x7f
            ]),
            Err(DecodeError::Varint)
        );
    }

    proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn every_truncation_of_a_message_is_an_error(cut in 0usize..2_100) {
            let m = encode(&sample());
            let cut = cut.min(m.len() - 1);
            prop_assert!(decode(&m[..cut]).is_err());
        }
    }
}
