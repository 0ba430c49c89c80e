//! One router replica's side of the replica protocol, sans IO: what it tells the other replicas
//! about its own requests, when, and what it does with what they tell it. The gateway
//! (`kvgate serve --cluster`: NATS, the binary `wire` format, metrics) and the simulator
//! (`kvgate sim --replicas R --share`: a modelled network with delay and loss) are both thin
//! drivers of this one type, so the simulator's replica verdicts are about the code production
//! runs.
//!
//! # Algorithm
//!
//! In the style of quinn-proto: the driver passes `now_ms` (its own monotonic clock) and
//! events in, and takes messages out; the machine never reads a clock, touches a socket or
//! draws a random number.
//!
//! - **Own requests** ([`ReplicaMachine::route`], [`ReplicaMachine::first_token`],
//!   [`ReplicaMachine::tokens`], [`ReplicaMachine::finish`]). Each routed request gets the next
//!   request id (`next_request`, from 0) and an entry in the live table; its transitions become
//!   [`ReplicaEvent`]s in the outbox: route (pod, prompt tokens, the charge, the prompt's block
//!   hashes), first token,
//!   decode tokens in steps of `tokens_per_event` (the rest is settled by the finish, which
//!   returns the whole charge), finish. A request that completed normally (or learnt its TTFT
//!   at the first token) also sends its training sample after that event, when
//!   `share_samples` is on and the sample teaches something (a TTFT or a TPOT).
//! - **Messages** ([`ReplicaMachine::poll_transmit`]). The driver takes the outbox's events in
//!   order as messages, each with this replica's id and the next sequence number (from 0), as
//!   many events per message as the driver's `take` says fit. Events and snapshots leave in the
//!   order they were made, so a snapshot never goes ahead of an event it already reflects (a
//!   peer would apply that event on top of it: decode tokens counted twice).
//! - **Snapshots** ([`ReplicaMachine::handle_timeout`]). Every `snapshot_interval_ms` (the first
//!   one interval after [`ReplicaMachine::new`]), and right after every (re)connect
//!   ([`ReplicaMachine::reconnected`], which also asks the peers for their routed index), the
//!   live table goes out as a complete [`ReplicaEvent::Snapshot`] with `next_request`: peers
//!   charge what they miss, align what lags and finish what is gone
//!   ([`PeerBook::reconcile`]), so loss is repaired within one interval. Ticks keep their
//!   schedule; one handled a whole interval late or more is not made up (the next is an
//!   interval after it).
//! - **Leases** ([`ReplicaMachine::handle_timeout`]). Every `expire_tick_ms` the peers not
//!   heard from for `peers.lease_ms` have their charges returned ([`PeerBook::expire`]).
//! - **Receiving** ([`ReplicaMachine::handle_message`]). A message of this replica itself is
//!   ignored; one already seen (by sequence number) is refused ([`PeerBook::accept`], which
//!   also renews the sender's lease); the rest is applied event by event: transitions through
//!   [`PeerBook::apply`] (the same session transitions a local request makes), snapshots
//!   through [`PeerBook::reconcile`] (entries on pods this replica lacks are left out and the
//!   snapshot stays complete), index entries into the routed index, training samples into the predictor ([`RouterSession::learn`], for the
//!   pod's class; only with `share_samples`), a goodbye releases the peer at once. Pods are
//!   named by a key both sides agree on ([`PodKeys`]: the gateway hashes the pod's URL, the
//!   simulator uses its index); events naming a pod this replica does not have are counted
//!   and skipped.
//! - **Warm-up** ([`ReplicaMachine::index_answer`]). A peer's sync request is reported to the
//!   driver ([`Received::sync_asked`]); the driver asks, pod by pod, for this replica's
//!   routed-index entries (the newest `max_index_blocks_per_pod`, oldest first, in messages of
//!   `index_chunk_blocks`) and sends them to the asker alone.
//!
//! # Parameters (defaults in [`ReplicaConfig::default`])
//!
//! - `tokens_per_event` = 32 decode tokens per tokens event (a 500-token answer: 15 events).
//! - `snapshot_interval_ms` = 1,000: how long loss can leave a peer wrong; a snapshot of 100
//!   live requests is about 2 KB on the wire.
//! - `expire_tick_ms` = 250: how often leases are checked (a dead peer's charges go within
//!   `lease_ms` + 250 ms).
//! - `share_samples` = true (`cluster_share_samples`): four replicas each training on its own
//!   quarter over-predicted more than one router (docs/decisions/cluster-sharing.md).
//! - `max_outbox_events` = 8,192: events waiting for the driver; beyond, an event of a request
//!   transition is dropped and counted (the next snapshot repairs it). Snapshots, sync requests
//!   and goodbyes are never dropped.
//! - `max_live` = 65,536 own live requests (what a peer's [`PeerConfig`] accepts per replica);
//!   beyond, a request is not shared (counted).
//! - `index_chunk_blocks` = 8,192 and `max_index_blocks_per_pod` = 65,536 (warm-up answers).
//! - `peers`: the [`PeerConfig`] (`lease_ms` = 3,000, three snapshot intervals).
//!
//! # Bounds
//!
//! Live table: ≤ `max_live` entries (~56 bytes each with the map's slot: 3.7 MB at the
//! bound). Outbox: ≤
//! `max_outbox_events` + 3 events; a route holds its prompt's block hashes (8 bytes each), a
//! snapshot one item per live request (~48 bytes). Peers: the [`PeerBook`]'s bounds. A
//! warm-up answer is built one pod at a time (≤ `max_index_blocks_per_pod` hashes).

use super::peers::{PeerBook, PeerConfig, PeerEvent, PeerStats, SnapshotEntry};
use super::{RouterSession, TrainingSample};
use crate::blocks::BlockHash;
use crate::index::PrefixIndex;
use crate::pod::PodId;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// The machine's parameters; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaConfig {
    pub tokens_per_event: u64,
    pub snapshot_interval_ms: u64,
    pub expire_tick_ms: u64,
    pub share_samples: bool,
    pub max_outbox_events: usize,
    pub max_live: usize,
    pub index_chunk_blocks: usize,
    pub max_index_blocks_per_pod: usize,
    pub peers: PeerConfig,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            tokens_per_event: 32,
            snapshot_interval_ms: 1_000,
            expire_tick_ms: 250,
            share_samples: true,
            max_outbox_events: 8_192,
            max_live: 65_536,
            index_chunk_blocks: 8_192,
            max_index_blocks_per_pod: 65_536,
            peers: PeerConfig::default(),
        }
    }
}

/// One live request in a snapshot, its pod named by key ([`PodKeys`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotItem {
    pub request: u64,
    pub pod: u64,
    pub input_tokens: u32,
    /// The prefill charge still held (0 after the first token).
    pub prefill_tokens: u64,
    pub first_token: bool,
    /// Decode tokens reported so far (the first token's, then every tokens event's).
    pub decode_tokens: u64,
}

/// What one replica tells the others; pods are named by key ([`PodKeys`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ReplicaEvent {
    Route {
        request: u64,
        pod: u64,
        input_tokens: u32,
        prefill_tokens: u64,
        blocks: Vec<BlockHash>,
    },
    FirstToken {
        request: u64,
    },
    /// `tokens` more decode tokens.
    Tokens {
        request: u64,
        tokens: u64,
    },
    Finish {
        request: u64,
    },
    /// The sender's live requests; every request it routed is below `next_request`.
    Snapshot {
        next_request: u64,
        complete: bool,
        live: Vec<SnapshotItem>,
    },
    /// Asks the peers for their routed index (answered with [`ReplicaEvent::Index`]).
    SyncRequest,
    /// Routed-index entries of `pod`, oldest first.
    Index {
        pod: u64,
        blocks: Vec<BlockHash>,
    },
    /// The sender is leaving: release its charges now.
    Bye,
    /// A request's training sample, for the predictor of `pod`'s class.
    Sample {
        pod: u64,
        sample: TrainingSample,
    },
}

/// A replica's message: its id, its sequence number, its events in order.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaMessage {
    pub replica: u64,
    pub seq: u64,
    pub events: Vec<ReplicaEvent>,
}

/// How the driver names its pods to the other replicas.
pub trait PodKeys {
    /// This replica's pod of `key` (`None`: it has no such pod).
    fn pod(&self, key: u64) -> Option<PodId>;
    /// The predictor class of the pod of `key`.
    fn class(&self, key: u64) -> Option<&str>;
}

/// What one received message did (for the driver's counters and logs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Received {
    /// The message was this replica's own (nothing else was looked at).
    pub own: bool,
    /// Refused as seen already, older than the window, or from one peer too many.
    pub duplicate: bool,
    /// Transitions applied and snapshot corrections made ([`PeerStats`]' deltas).
    pub applied: u64,
    pub repairs: u64,
    /// Events naming a pod this replica does not have.
    pub unknown_pod: u64,
    /// Routed-index entries recorded from a warm-up answer.
    pub index_blocks: u64,
    /// Training samples learnt.
    pub samples: u64,
    /// The sender asked for this replica's routed index.
    pub sync_asked: Option<u64>,
    /// The sender said goodbye.
    pub left: bool,
}

/// What a timeout did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expired {
    /// Peers whose lease ran out, and their requests whose charges were returned.
    pub peers: u64,
    pub requests: u64,
}

/// Counters of the outbound side (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Events dropped because the outbox was full.
    pub outbox_dropped: u64,
    /// Requests not shared because the live table was full.
    pub over_bound: u64,
    pub messages: u64,
    pub snapshots: u64,
}

/// This replica's own live request (what its snapshots list).
#[derive(Debug, Clone, Copy)]
struct Live {
    pod: u64,
    input_tokens: u32,
    prefill_tokens: u64,
    first_token: bool,
    /// Reported decode tokens.
    decode_tokens: u64,
    /// Decode tokens not yet reported (below `tokens_per_event`).
    unreported: u64,
}

/// One replica's protocol state; see the module docs.
#[derive(Debug)]
pub struct ReplicaMachine {
    config: ReplicaConfig,
    replica: u64,
    next_seq: u64,
    next_request: u64,
    live: FxHashMap<u64, Live>,
    outbox: VecDeque<ReplicaEvent>,
    next_snapshot_ms: u64,
    next_expire_ms: u64,
    peers: PeerBook,
    stats: ReplicaStats,
}

/// A sample worth sending: it carries a TTFT or a TPOT.
fn teaches(sample: &TrainingSample) -> bool {
    sample.ttft_ms.is_some() || sample.tpot_ms.is_some()
}

impl ReplicaMachine {
    /// Replica `replica` (an id unique in the cluster), started at `now_ms`.
    pub fn new(replica: u64, config: ReplicaConfig, now_ms: u64) -> Self {
        ReplicaMachine {
            replica,
            next_seq: 0,
            next_request: 0,
            live: FxHashMap::default(),
            outbox: VecDeque::new(),
            next_snapshot_ms: now_ms.saturating_add(config.snapshot_interval_ms),
            next_expire_ms: now_ms.saturating_add(config.expire_tick_ms),
            peers: PeerBook::new(config.peers),
            stats: ReplicaStats::default(),
            config,
        }
    }

    pub fn replica(&self) -> u64 {
        self.replica
    }

    pub fn config(&self) -> &ReplicaConfig {
        &self.config
    }

    /// The other replicas' requests charged here.
    pub fn peers(&self) -> &PeerBook {
        &self.peers
    }

    pub fn peer_stats(&self) -> PeerStats {
        self.peers.stats()
    }

    pub fn stats(&self) -> ReplicaStats {
        self.stats
    }

    /// Own requests live now.
    pub fn live_requests(&self) -> usize {
        self.live.len()
    }

    /// Events waiting for [`ReplicaMachine::poll_transmit`].
    pub fn pending_events(&self) -> usize {
        self.outbox.len()
    }

    fn push(&mut self, e: ReplicaEvent) {
        if self.outbox.len() >= self.config.max_outbox_events {
            self.stats.outbox_dropped += 1;
        } else {
            self.outbox.push_back(e);
        }
    }

    fn push_sample(&mut self, pod: u64, sample: Option<TrainingSample>) {
        if let Some(sample) = sample.filter(|s| self.config.share_samples && teaches(s)) {
            self.push(ReplicaEvent::Sample { pod, sample });
        }
    }

    /// A request of this replica was routed to `pod` (or charged unrouted: no `blocks`) with
    /// this charge. Returns its request id for the transitions below.
    pub fn route(
        &mut self,
        pod: u64,
        blocks: &[BlockHash],
        input_tokens: u32,
        prefill_tokens: u64,
    ) -> u64 {
        let request = self.next_request;
        self.next_request += 1;
        if self.live.len() >= self.config.max_live {
            self.stats.over_bound += 1;
            return request;
        }
        self.live.insert(
            request,
            Live {
                pod,
                input_tokens,
                prefill_tokens,
                first_token: false,
                decode_tokens: 0,
                unreported: 0,
            },
        );
        self.push(ReplicaEvent::Route {
            request,
            pod,
            input_tokens,
            prefill_tokens,
            blocks: blocks.to_vec(),
        });
        request
    }

    /// The request's first token: its charge is now `decode_tokens` decode tokens (the
    /// session's ticket says how many). `sample`: the TTFT learnt at the first token, if any.
    /// Later calls, and calls for a request not shared, do nothing.
    pub fn first_token(
        &mut self,
        request: u64,
        decode_tokens: u64,
        sample: Option<TrainingSample>,
    ) {
        let Some(l) = self.live.get_mut(&request).filter(|l| !l.first_token) else {
            return;
        };
        l.first_token = true;
        l.prefill_tokens = 0;
        l.decode_tokens = decode_tokens;
        let pod = l.pod;
        self.push(ReplicaEvent::FirstToken { request });
        self.push_sample(pod, sample);
    }

    /// `tokens` more decode tokens; reported every `tokens_per_event`.
    pub fn tokens(&mut self, request: u64, tokens: u64) {
        let per_event = self.config.tokens_per_event;
        let Some(l) = self.live.get_mut(&request) else {
            return;
        };
        l.unreported = l.unreported.saturating_add(tokens);
        if l.unreported >= per_event {
            let tokens = std::mem::take(&mut l.unreported);
            l.decode_tokens = l.decode_tokens.saturating_add(tokens);
            self.push(ReplicaEvent::Tokens { request, tokens });
        }
    }

    /// The request ended (its unreported tokens with it); `sample`: its training sample when
    /// it completed normally.
    pub fn finish(&mut self, request: u64, sample: Option<TrainingSample>) {
        let Some(l) = self.live.remove(&request) else {
            return;
        };
        self.push(ReplicaEvent::Finish { request });
        self.push_sample(l.pod, sample);
    }

    /// The link to the other replicas came (back) up: a snapshot now (it repairs what they
    /// missed meanwhile) and a sync request (for the routes this replica missed).
    pub fn reconnected(&mut self) {
        let snapshot = self.snapshot();
        self.outbox.push_back(snapshot);
        self.outbox.push_back(ReplicaEvent::SyncRequest);
    }

    /// This replica is leaving: a goodbye, after what is queued.
    pub fn leave(&mut self) {
        self.outbox.push_back(ReplicaEvent::Bye);
    }

    /// The live table as a snapshot, in request-id order (the same bytes on every run).
    fn snapshot(&mut self) -> ReplicaEvent {
        self.stats.snapshots += 1;
        let mut live: Vec<SnapshotItem> = self
            .live
            .iter()
            .map(|(&request, l)| SnapshotItem {
                request,
                pod: l.pod,
                input_tokens: l.input_tokens,
                prefill_tokens: l.prefill_tokens,
                first_token: l.first_token,
                decode_tokens: l.decode_tokens,
            })
            .collect();
        live.sort_unstable_by_key(|i| i.request);
        ReplicaEvent::Snapshot {
            next_request: self.next_request,
            complete: true,
            live,
        }
    }

    /// The next message: the outbox's oldest events, as long as `take` says the next one fits
    /// (it is asked for every event, the first included, and the first is taken whatever it
    /// says); `None` when nothing is waiting.
    pub fn poll_transmit(
        &mut self,
        mut take: impl FnMut(&ReplicaEvent) -> bool,
    ) -> Option<ReplicaMessage> {
        let first = self.outbox.pop_front()?;
        take(&first);
        let mut events = vec![first];
        while let Some(e) = self.outbox.front() {
            if !take(e) {
                break;
            }
            events.extend(self.outbox.pop_front());
        }
        Some(self.message(events))
    }

    fn message(&mut self, events: Vec<ReplicaEvent>) -> ReplicaMessage {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.stats.messages += 1;
        ReplicaMessage {
            replica: self.replica,
            seq,
            events,
        }
    }

    /// Drops every waiting event (the link is down: they could not be sent; the snapshot after
    /// the reconnect repairs them). Returns how many.
    pub fn discard_pending(&mut self) -> usize {
        let n = self.outbox.len();
        self.outbox.clear();
        n
    }

    /// When [`ReplicaMachine::handle_timeout`] is due next.
    pub fn poll_timeout(&self) -> u64 {
        self.next_snapshot_ms.min(self.next_expire_ms)
    }

    /// Runs what is due by `now_ms`: lease expiry (peers' charges returned to `session`), then
    /// the periodic snapshot (queued after every event already queued).
    pub fn handle_timeout(&mut self, now_ms: u64, session: &mut RouterSession) -> Expired {
        let mut expired = Expired::default();
        if now_ms >= self.next_expire_ms {
            let before = self.peers.stats();
            expired.peers = self.peers.expire(session, now_ms) as u64;
            expired.requests = self.peers.stats().expired_requests - before.expired_requests;
            self.next_expire_ms =
                next_tick(self.next_expire_ms, self.config.expire_tick_ms, now_ms);
        }
        if now_ms >= self.next_snapshot_ms {
            let snapshot = self.snapshot();
            self.outbox.push_back(snapshot);
            self.next_snapshot_ms = next_tick(
                self.next_snapshot_ms,
                self.config.snapshot_interval_ms,
                now_ms,
            );
        }
        expired
    }

    /// Applies a message received at `now_ms` to `session`; see the module docs.
    pub fn handle_message(
        &mut self,
        now_ms: u64,
        session: &mut RouterSession,
        pods: &impl PodKeys,
        msg: &ReplicaMessage,
    ) -> Received {
        let mut got = Received::default();
        if msg.replica == self.replica {
            got.own = true;
            return got;
        }
        let r = msg.replica;
        if !self.peers.accept(r, msg.seq, now_ms) {
            got.duplicate = true;
            return got;
        }
        let before = self.peers.stats();
        let share_samples = self.config.share_samples;
        let peers = &mut self.peers;
        for e in &msg.events {
            match e {
                ReplicaEvent::Route {
                    request,
                    pod,
                    input_tokens,
                    prefill_tokens,
                    blocks,
                } => match pods.pod(*pod) {
                    Some(pod) => peers.apply(
                        session,
                        r,
                        PeerEvent::Route {
                            request: *request,
                            pod,
                            input_tokens: *input_tokens,
                            prefill_tokens: *prefill_tokens,
                            blocks,
                        },
                    ),
                    None => got.unknown_pod += 1,
                },
                ReplicaEvent::FirstToken { request } => {
                    peers.apply(session, r, PeerEvent::FirstToken { request: *request })
                }
                ReplicaEvent::Tokens { request, tokens } => peers.apply(
                    session,
                    r,
                    PeerEvent::Tokens {
                        request: *request,
                        tokens: *tokens,
                    },
                ),
                ReplicaEvent::Finish { request } => {
                    peers.apply(session, r, PeerEvent::Finish { request: *request })
                }
                ReplicaEvent::Snapshot {
                    next_request,
                    complete,
                    live,
                } => {
                    let mut entries = Vec::with_capacity(live.len());
                    for i in live {
                        match pods.pod(i.pod) {
                            Some(pod) => entries.push(SnapshotEntry {
                                request: i.request,
                                pod,
                                input_tokens: i.input_tokens,
                                prefill_tokens: i.prefill_tokens,
                                first_token: i.first_token,
                                decode_tokens: i.decode_tokens,
                            }),
                            // Left out, and the snapshot still complete: a request on a pod
                            // this replica lacks was never charged here (its route was skipped
                            // too), or was charged to a pod since removed, whose charge is void.
                            // (Treating such a snapshot as partial kept every lost finish charged
                            // for as long as the peer had any request on that pod.)
                            None => got.unknown_pod += 1,
                        }
                    }
                    peers.reconcile(session, r, *next_request, &entries, *complete);
                }
                ReplicaEvent::SyncRequest => got.sync_asked = Some(r),
                ReplicaEvent::Index { pod, blocks } => match pods.pod(*pod) {
                    Some(pod) => {
                        // The routed index's contents, not a route: nothing becomes pending.
                        let index = &mut session.index_mut().routed;
                        for b in blocks {
                            index.record_routed(pod, std::slice::from_ref(b));
                        }
                        got.index_blocks += blocks.len() as u64;
                    }
                    None => got.unknown_pod += 1,
                },
                ReplicaEvent::Bye => {
                    peers.forget(session, r);
                    got.left = true;
                }
                ReplicaEvent::Sample { .. } if !share_samples => {}
                ReplicaEvent::Sample { pod, sample } => match pods.class(*pod) {
                    Some(class) => {
                        session.learn(class, sample);
                        got.samples += 1;
                    }
                    None => got.unknown_pod += 1,
                },
            }
        }
        let after = self.peers.stats();
        got.applied = after.applied - before.applied;
        got.repairs = after.repairs - before.repairs;
        got
    }

    /// A warm-up answer's messages for `pod` (named `key` on the wire): this replica's newest
    /// routed-index entries of it, oldest first, `index_chunk_blocks` per message, each with
    /// its own sequence number; for the asker alone.
    pub fn index_answer(
        &mut self,
        session: &RouterSession,
        pod: PodId,
        key: u64,
    ) -> Vec<ReplicaMessage> {
        let blocks = session
            .index()
            .routed
            .pod_blocks_oldest_first(pod, self.config.max_index_blocks_per_pod);
        blocks
            .chunks(self.config.index_chunk_blocks.max(1))
            .map(|chunk| {
                self.message(vec![ReplicaEvent::Index {
                    pod: key,
                    blocks: chunk.to_vec(),
                }])
            })
            .collect()
    }

    /// Returns every peer's charges and forgets the peers (the end of a run, or a shutdown).
    pub fn forget_peers(&mut self, session: &mut RouterSession) {
        for peer in self.peers.peer_ids() {
            self.peers.forget(session, peer);
        }
    }
}

/// The tick after `due` (`period` later), or `period` after `now_ms` when that is already past:
/// late ticks are not made up.
fn next_tick(due: u64, period: u64, now_ms: u64) -> u64 {
    let next = due.saturating_add(period.max(1));
    if next <= now_ms {
        now_ms.saturating_add(period.max(1))
    } else {
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::InFlight;
    use crate::predictor::Features;

    fn session() -> RouterSession {
        super::super::test_session(1)
    }

    /// Two pods, keyed by their index, both of class "c".
    struct TwoPods;

    impl PodKeys for TwoPods {
        fn pod(&self, key: u64) -> Option<PodId> {
            (key < 2).then_some(PodId(key as u32))
        }
        fn class(&self, key: u64) -> Option<&str> {
            (key < 2).then_some("c")
        }
    }

    /// Every waiting event, one message each.
    fn drain(m: &mut ReplicaMachine) -> Vec<ReplicaMessage> {
        let mut out = Vec::new();
        loop {
            let mut n = 0;
            match m.poll_transmit(|_| {
                n += 1;
                n == 1
            }) {
                Some(msg) => out.push(msg),
                None => return out,
            }
        }
    }

    fn events(msgs: &[ReplicaMessage]) -> Vec<ReplicaEvent> {
        msgs.iter().flat_map(|m| m.events.clone()).collect()
    }

    fn sample(ttft_ms: Option<f64>, tpot_ms: Option<f64>) -> TrainingSample {
        TrainingSample {
            features: Features {
                input_tokens: 100.0,
                kv_capacity_tokens: 100_000.0,
                ..Features::default()
            },
            ttft_ms,
            tpot_ms,
        }
    }

    /// Delivers `msgs` to `to` at `now_ms`; returns the summed receipts.
    fn deliver(
        to: &mut ReplicaMachine,
        s: &mut RouterSession,
        now_ms: u64,
        msgs: &[ReplicaMessage],
    ) -> Received {
        let mut sum = Received::default();
        for m in msgs {
            let r = to.handle_message(now_ms, s, &TwoPods, m);
            sum.duplicate |= r.duplicate;
            sum.own |= r.own;
            sum.applied += r.applied;
            sum.repairs += r.repairs;
            sum.unknown_pod += r.unknown_pod;
            sum.index_blocks += r.index_blocks;
            sum.samples += r.samples;
            sum.sync_asked = sum.sync_asked.or(r.sync_asked);
            sum.left |= r.left;
        }
        sum
    }

    #[test]
    fn messages_are_numbered_from_zero_and_hold_what_take_lets_fit() {
        let mut m = ReplicaMachine::new(7, ReplicaConfig::default(), 0);
        assert_eq!(m.route(0, &[1, 2], 100, 60), 0);
        assert_eq!(m.route(1, &[], 10, 10), 1);
        assert_eq!(m.route(0, &[3], 50, 50), 2);
        let all = m.poll_transmit(|_| true).unwrap();
        assert_eq!((all.replica, all.seq, all.events.len()), (7, 0, 3));
        assert_eq!(
            all.events[0],
            ReplicaEvent::Route {
                request: 0,
                pod: 0,
                input_tokens: 100,
                prefill_tokens: 60,
                blocks: vec![1, 2]
            }
        );
        assert!(m.poll_transmit(|_| true).is_none());
        // `take` is asked about every event; the first goes whatever it says.
        m.route(0, &[], 1, 1);
        m.route(0, &[], 1, 1);
        let mut asked = 0;
        let one = m
            .poll_transmit(|_| {
                asked += 1;
                false
            })
            .unwrap();
        assert_eq!((one.seq, one.events.len(), asked), (1, 1, 2));
        assert_eq!(drain(&mut m).iter().map(|m| m.seq).collect::<Vec<_>>(), [2]);
        assert_eq!(m.stats().messages, 3);
    }

    #[test]
    fn decode_tokens_go_out_in_steps_of_32_and_the_rest_ends_with_the_finish() {
        let mut m = ReplicaMachine::new(1, ReplicaConfig::default(), 0);
        let r = m.route(0, &[], 100, 60);
        m.first_token(r, 101, None);
        for _ in 0..70 {
            m.tokens(r, 1);
        }
        m.tokens(r, 0);
        m.handle_timeout(1_000, &mut session());
        m.finish(r, None);
        // A second finish, or a transition after it, sends nothing.
        m.finish(r, None);
        m.tokens(r, 40);
        let sent = events(&drain(&mut m));
        assert_eq!(sent.len(), 6, "{sent:?}");
        assert_eq!(sent[1], ReplicaEvent::FirstToken { request: 0 });
        assert_eq!(
            sent[2],
            ReplicaEvent::Tokens {
                request: 0,
                tokens: 32
            }
        );
        assert_eq!(
            sent[3],
            ReplicaEvent::Tokens {
                request: 0,
                tokens: 32
            }
        );
        // The snapshot lists the reported tokens only (the other 6 are not sent).
        assert_eq!(
            sent[4],
            ReplicaEvent::Snapshot {
                next_request: 1,
                complete: true,
                live: vec![SnapshotItem {
                    request: 0,
                    pod: 0,
                    input_tokens: 100,
                    prefill_tokens: 0,
                    first_token: true,
                    decode_tokens: 165,
                }]
            }
        );
        assert_eq!(sent[5], ReplicaEvent::Finish { request: 0 });
        // Several tokens at once (a streamed chunk) count alike.
        let r = m.route(0, &[], 10, 10);
        m.first_token(r, 11, None);
        m.tokens(r, 31);
        m.tokens(r, 5);
        let sent = events(&drain(&mut m));
        assert_eq!(
            sent[2],
            ReplicaEvent::Tokens {
                request: 1,
                tokens: 36
            }
        );
    }

    #[test]
    fn snapshots_go_out_every_second_and_after_a_reconnect_behind_the_queued_events() {
        let mut s = session();
        let mut m = ReplicaMachine::new(1, ReplicaConfig::default(), 0);
        assert_eq!(m.poll_timeout(), 250, "the first lease check");
        for t in [250, 500, 750] {
            m.handle_timeout(t, &mut s);
            assert_eq!(m.pending_events(), 0, "no snapshot at {t}");
        }
        assert_eq!(m.poll_timeout(), 1_000);
        let r = m.route(1, &[], 10, 10);
        m.handle_timeout(1_000, &mut s);
        assert_eq!(m.poll_timeout(), 1_250);
        let sent = events(&drain(&mut m));
        assert!(matches!(sent[0], ReplicaEvent::Route { .. }));
        assert!(
            matches!(&sent[1], ReplicaEvent::Snapshot { next_request: 1, live, .. } if live.len() == 1)
        );
        // On time at 2,000: the next at 3,000. Handled at 4,500 (more than an interval late):
        // one snapshot, and the next an interval after it.
        m.handle_timeout(2_000, &mut s);
        m.handle_timeout(4_500, &mut s);
        assert_eq!(m.pending_events(), 2);
        drain(&mut m);
        for t in (4_750..=5_500).step_by(250) {
            m.handle_timeout(t, &mut s);
        }
        assert_eq!(m.pending_events(), 1, "the snapshot of 5,500 only");
        drain(&mut m);
        // A reconnect: the queued events, then a snapshot and a sync request, at once.
        m.first_token(r, 11, None);
        m.reconnected();
        let sent = events(&drain(&mut m));
        assert_eq!(sent.len(), 3);
        assert_eq!(sent[0], ReplicaEvent::FirstToken { request: r });
        assert!(
            matches!(&sent[1], ReplicaEvent::Snapshot { live, .. } if live[0].first_token && live[0].decode_tokens == 11)
        );
        assert_eq!(sent[2], ReplicaEvent::SyncRequest);
        assert_eq!(m.stats().snapshots, 5);
    }

    #[test]
    fn a_snapshot_behind_the_events_it_reflects_makes_the_peer_count_them_once() {
        // Routed, first token (100 + 1 decode tokens), 32 more: all still queued when the
        // snapshot tick comes. (A snapshot sent ahead of them made peers apply them on top of
        // it: 165 decode tokens instead of 133, the route ignored as known, its blocks lost.)
        let mut a = ReplicaMachine::new(1, ReplicaConfig::default(), 0);
        let mut b = ReplicaMachine::new(2, ReplicaConfig::default(), 0);
        let (mut sa, mut sb) = (session(), session());
        let r = a.route(0, &[11, 12, 13], 100, 60);
        a.first_token(r, 101, None);
        a.tokens(r, 32);
        a.handle_timeout(1_000, &mut sa);
        let msgs = drain(&mut a);
        assert!(matches!(
            msgs.last().map(|m| &m.events[0]),
            Some(ReplicaEvent::Snapshot { .. })
        ));
        deliver(&mut b, &mut sb, 1_000, &msgs);
        assert_eq!(
            sb.in_flight(PodId(0)),
            InFlight {
                requests: 1,
                prefill_tokens: 0,
                decode_tokens: 133
            }
        );
        assert_eq!(sb.index().routed.pod_blocks(PodId(0)), 3);
    }

    #[test]
    fn a_silent_peers_charges_are_returned_one_tick_after_its_lease() {
        let (mut a, mut b) = (
            ReplicaMachine::new(1, ReplicaConfig::default(), 0),
            ReplicaMachine::new(2, ReplicaConfig::default(), 0),
        );
        let (mut sa, mut sb) = (session(), session());
        a.route(0, &[], 100, 60);
        a.route(1, &[], 100, 60);
        deliver(&mut b, &mut sb, 10, &drain(&mut a));
        assert_eq!(
            sb.in_flight(PodId(0)).requests + sb.in_flight(PodId(1)).requests,
            2
        );
        // A falls silent at 10; its lease (3,000 ms) runs out after 3,010: the tick of 3,250.
        let mut t = 250;
        while t <= 3_000 {
            assert_eq!(b.handle_timeout(t, &mut sb), Expired::default(), "at {t}");
            t += 250;
        }
        assert_eq!(
            b.handle_timeout(3_250, &mut sb),
            Expired {
                peers: 1,
                requests: 2
            }
        );
        assert_eq!(sb.in_flight_total(), 0);
        assert_eq!(b.peer_stats().peers, 0);
        // A's own requests are untouched.
        assert_eq!(a.handle_timeout(3_250, &mut sa), Expired::default());
        assert_eq!(a.live_requests(), 2);
    }

    #[test]
    fn a_message_received_twice_is_applied_once_and_an_own_message_not_at_all() {
        let mut a = ReplicaMachine::new(1, ReplicaConfig::default(), 0);
        let mut b = ReplicaMachine::new(2, ReplicaConfig::default(), 0);
        let mut sb = session();
        a.route(0, &[5, 6], 100, 60);
        let msg = a.poll_transmit(|_| true).unwrap();
        let first = b.handle_message(0, &mut sb, &TwoPods, &msg);
        assert_eq!((first.duplicate, first.applied), (false, 1));
        let again = b.handle_message(1, &mut sb, &TwoPods, &msg);
        assert!(again.duplicate);
        assert_eq!(again.applied, 0);
        assert_eq!(
            sb.in_flight(PodId(0)),
            InFlight {
                requests: 1,
                prefill_tokens: 60,
                decode_tokens: 0
            }
        );
        assert_eq!(b.peer_stats().duplicates, 1);
        // A replica's own message (NATS echoes it back) changes nothing.
        let mut sa = session();
        assert!(a.handle_message(0, &mut sa, &TwoPods, &msg).own);
        assert_eq!(sa.in_flight_total(), 0);
    }

    #[test]
    fn lost_routes_finishes_and_tokens_are_repaired_by_the_next_snapshot() {
        let mut a = ReplicaMachine::new(1, ReplicaConfig::default(), 0);
        let mut b = ReplicaMachine::new(2, ReplicaConfig::default(), 0);
        let (mut sa, mut sb) = (session(), session());
        let r0 = a.route(0, &[], 100, 60);
        deliver(&mut b, &mut sb, 5, &drain(&mut a));
        // Lost: r1's route, r0's finish, r1's first token and 32 tokens.
        let r1 = a.route(1, &[], 100, 60);
        a.finish(r0, None);
        a.first_token(r1, 101, None);
        a.tokens(r1, 32);
        a.tokens(r1, 8);
        assert_eq!(drain(&mut a).len(), 4);
        assert_eq!(sb.in_flight(PodId(0)).requests, 1);
        assert_eq!(sb.in_flight(PodId(1)).requests, 0);
        a.handle_timeout(1_000, &mut sa);
        let got = deliver(&mut b, &mut sb, 1_005, &drain(&mut a));
        // r0 finished; r1 charged, its first token and its reported 32 tokens aligned.
        assert_eq!(got.repairs, 4);
        assert_eq!(sb.in_flight(PodId(0)), InFlight::default());
        assert_eq!(
            sb.in_flight(PodId(1)),
            InFlight {
                requests: 1,
                prefill_tokens: 0,
                decode_tokens: 133
            }
        );
        // r1 ends; its finish arrives: nothing left.
        a.finish(r1, None);
        deliver(&mut b, &mut sb, 1_100, &drain(&mut a));
        assert_eq!(sb.in_flight_total(), 0);
    }

    #[test]
    fn a_full_outbox_drops_transitions_and_counts_them_but_never_a_snapshot() {
        let mut s = session();
        let mut m = ReplicaMachine::new(
            1,
            ReplicaConfig {
                max_outbox_events: 2,
                ..ReplicaConfig::default()
            },
            0,
        );
        for _ in 0..3 {
            m.route(0, &[], 10, 10);
        }
        assert_eq!(m.stats().outbox_dropped, 1);
        m.handle_timeout(1_000, &mut s);
        m.leave();
        assert_eq!(m.pending_events(), 4);
        let sent = events(&drain(&mut m));
        // The dropped route's request is still live: the snapshot lists all three.
        assert!(matches!(&sent[2], ReplicaEvent::Snapshot { live, .. } if live.len() == 3));
        assert_eq!(sent[3], ReplicaEvent::Bye);
        // While the link is down, waiting events are discarded (not numbered).
        m.route(0, &[], 10, 10);
        assert_eq!(m.discard_pending(), 1);
        assert_eq!(drain(&mut m).len(), 0);
    }

    #[test]
    fn a_live_table_at_its_bound_leaves_further_requests_unshared() {
        let mut m = ReplicaMachine::new(
            1,
            ReplicaConfig {
                max_live: 1,
                ..ReplicaConfig::default()
            },
            0,
        );
        let r0 = m.route(0, &[], 10, 10);
        let r1 = m.route(0, &[], 10, 10);
        assert_eq!((r0, r1), (0, 1));
        m.first_token(r1, 11, None);
        m.finish(r1, None);
        assert_eq!(events(&drain(&mut m)).len(), 1, "r0's route only");
        assert_eq!(m.stats().over_bound, 1);
    }

    #[test]
    fn training_samples_follow_their_event_and_teach_peers_only_when_shared() {
        for share in [true, false] {
            let config = ReplicaConfig {
                share_samples: share,
                ..ReplicaConfig::default()
            };
            let mut a = ReplicaMachine::new(1, ReplicaConfig::default(), 0);
            let mut b = ReplicaMachine::new(2, config, 0);
            let mut sb = session();
            let r = a.route(1, &[], 100, 100);
            a.first_token(r, 101, Some(sample(Some(50.0), None)));
            // Nothing left to teach (TTFT sent already, one token): no sample.
            a.finish(r, Some(sample(None, None)));
            let r = a.route(1, &[], 100, 100);
            a.finish(r, Some(sample(Some(40.0), Some(5.0))));
            let msgs = drain(&mut a);
            let sent = events(&msgs);
            assert_eq!(sent.len(), 7, "{sent:?}");
            assert_eq!(sent[1], ReplicaEvent::FirstToken { request: 0 });
            assert_eq!(
                sent[2],
                ReplicaEvent::Sample {
                    pod: 1,
                    sample: sample(Some(50.0), None)
                }
            );
            assert_eq!(sent[3], ReplicaEvent::Finish { request: 0 });
            assert_eq!(sent[5], ReplicaEvent::Finish { request: 1 });
            assert!(matches!(sent[6], ReplicaEvent::Sample { pod: 1, .. }));
            let got = deliver(&mut b, &mut sb, 0, &msgs);
            assert_eq!(got.samples, if share { 2 } else { 0 }, "share {share}");
            assert_eq!(sb.predictor().accuracy().samples, if share { 2 } else { 0 });
            // A replica with sharing off sends none.
            let mut c = ReplicaMachine::new(3, config, 0);
            let r = c.route(1, &[], 100, 100);
            c.finish(r, Some(sample(Some(40.0), Some(5.0))));
            assert_eq!(events(&drain(&mut c)).len(), if share { 3 } else { 2 });
        }
    }

    #[test]
    fn events_on_a_pod_this_replica_lacks_are_counted_and_skipped() {
        let mut a = ReplicaMachine::new(1, ReplicaConfig::default(), 0);
        let mut b = ReplicaMachine::new(2, ReplicaConfig::default(), 0);
        let (mut sa, mut sb) = (session(), session());
        a.route(9, &[1], 10, 10);
        a.route(0, &[], 10, 10);
        a.handle_timeout(1_000, &mut sa);
        let got = deliver(&mut b, &mut sb, 0, &drain(&mut a));
        // The route and the snapshot's entry of pod 9.
        assert_eq!(got.unknown_pod, 2);
        assert_eq!(sb.in_flight(PodId(0)).requests, 1);
        assert_eq!(got.repairs, 0);
    }

    #[test]
    fn a_warm_up_answer_carries_the_routed_index_oldest_first_in_chunks() {
        let config = ReplicaConfig {
            index_chunk_blocks: 2,
            ..ReplicaConfig::default()
        };
        let mut a = ReplicaMachine::new(1, config, 0);
        let mut b = ReplicaMachine::new(2, config, 0);
        let (mut sa, mut sb) = (session(), session());
        sa.index_mut()
            .record_routed(PodId(1), &[11, 12, 13, 14, 15]);
        b.reconnected();
        let got = deliver(&mut a, &mut sa, 0, &drain(&mut b));
        assert_eq!(got.sync_asked, Some(2));
        let answer = a.index_answer(&sa, PodId(1), 1);
        assert_eq!(answer.iter().map(|m| m.seq).collect::<Vec<_>>(), [0, 1, 2]);
        // The index's own oldest-first order, cut into chunks of 2.
        let mut sent = Vec::new();
        for m in &answer {
            match &m.events[..] {
                [ReplicaEvent::Index { pod: 1, blocks }] => sent.push(blocks.clone()),
                other => panic!("{other:?}"),
            }
        }
        let oldest_first = sa.index().routed.pod_blocks_oldest_first(PodId(1), 100);
        assert_eq!(oldest_first.len(), 5);
        assert_eq!(sent.concat(), oldest_first);
        assert_eq!(sent.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
        assert!(
            a.index_answer(&sa, PodId(0), 0).is_empty(),
            "nothing on pod 0"
        );
        let got = deliver(&mut b, &mut sb, 0, &answer);
        assert_eq!(got.index_blocks, 5);
        assert_eq!(sb.index().routed.pod_blocks(PodId(1)), 5);
        // Index entries are the index's contents, not routes: nothing is charged.
        assert_eq!(sb.in_flight_total(), 0);
    }

    #[test]
    fn a_goodbye_releases_the_peer_at_once_and_forget_peers_releases_all() {
        let mut a = ReplicaMachine::new(1, ReplicaConfig::default(), 0);
        let mut c = ReplicaMachine::new(3, ReplicaConfig::default(), 0);
        let mut b = ReplicaMachine::new(2, ReplicaConfig::default(), 0);
        let mut sb = session();
        a.route(0, &[], 10, 10);
        c.route(0, &[], 10, 10);
        deliver(&mut b, &mut sb, 0, &drain(&mut a));
        deliver(&mut b, &mut sb, 0, &drain(&mut c));
        assert_eq!(sb.in_flight(PodId(0)).requests, 2);
        a.leave();
        assert!(deliver(&mut b, &mut sb, 1, &drain(&mut a)).left);
        assert_eq!(sb.in_flight(PodId(0)).requests, 1);
        b.forget_peers(&mut sb);
        assert_eq!(sb.in_flight_total(), 0);
        assert_eq!(b.peer_stats().peers, 0);
    }
}
