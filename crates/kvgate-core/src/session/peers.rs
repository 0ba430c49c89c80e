//! Other router replicas' requests, applied to this replica's session: the sans-IO half of
//! active-active replicas (`kvgate serve --cluster`, the gateway's `cluster` module carries
//! the messages over NATS).
//!
//! # What is applied, and how
//!
//! Each replica publishes its own requests' transitions: route (pod, prompt tokens, the prefill
//! charge it computed, the prompt's block hashes), first token, more decode tokens, finish.
//! [`PeerBook::apply`] turns a peer's event into the **same** session transition a local
//! request makes — [`RouterSession::route_remote`] (routed index + ledger charge, no decision),
//! then [`RouterSession::first_token`], [`RouterSession::tokens_generated`],
//! [`RouterSession::finish`] — on a [`Ticket`] the book keeps per (replica, request id). There
//! is no second ledger: `route` sees the whole fleet's load in the one ledger.
//!
//! # Delivery faults
//!
//! - **Duplicates**: every message carries its replica's sequence number; [`PeerBook::accept`]
//!   refuses a number already seen (the highest, or one of the [`SEQ_WINDOW`] below it) and
//!   anything older than the window. Applying the same message twice can therefore not happen.
//! - **Reordering / loss**: transitions are keyed by request id and are no-ops when they do
//!   not apply (a finish for an unknown request is remembered, so a late route for it is
//!   ignored; a first token for an unknown request is dropped). What loss leaves wrong is
//!   repaired by the peer's periodic snapshot ([`PeerBook::reconcile`]): its live requests
//!   (with their first-token state and decode tokens) are charged if missing and aligned if
//!   behind, and this book's requests of that peer that the snapshot no longer lists (and that
//!   are older than the snapshot's `next_request`) are finished. Each such correction is counted
//!   in [`PeerStats::repairs`]: the divergence found. A snapshot carries no block hashes, so a
//!   request it charged before its route arrived is marked unrouted; the late route then
//!   records its blocks in the routed index without charging it a second time.
//! - **A replica that dies**: each message renews the peer's lease; [`PeerBook::expire`] finishes
//!   every request of a peer not heard from for `lease_ms` and forgets the peer
//!   ([`PeerStats::expired_peers`], [`PeerStats::expired_requests`]). A peer that says goodbye
//!   ([`PeerBook::forget`]) is released at once.
//!
//! Time never enters: the driver passes `now_ms` (its own monotonic clock).
//!
//! # Parameters (defaults in [`PeerConfig::default`])
//!
//! - `lease_ms` = 3,000: a peer silent this long is dead (peers send a snapshot every second).
//! - `max_peers` = 64: messages of further replicas are refused and counted.
//! - `max_requests_per_peer` = 65,536: further routes of that peer are refused and counted.
//! - `finished_memory` = 4,096 request ids per peer remembered as finished (for reordering).
//!
//! # Bounds
//!
//! Per peer: ≤ `max_requests_per_peer` tickets (~100 bytes each with the map entry), ≤
//! `finished_memory` ids (~24 bytes each), a few words. At the defaults: ≤ 64 × (6.6 MB +
//! 100 KB). The routed-index entries a peer's routes add are bounded by the index's per-pod
//! capacity, as local ones are.

use super::{RouterSession, Ticket};
use crate::blocks::BlockHash;
use crate::index::PrefixIndex;
use crate::pod::PodId;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::VecDeque;

/// Sequence numbers below a peer's highest that are still told apart (seen or not).
pub const SEQ_WINDOW: u64 = 64;

/// The book's limits; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerConfig {
    pub lease_ms: u64,
    pub max_peers: usize,
    pub max_requests_per_peer: usize,
    pub finished_memory: usize,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            lease_ms: 3_000,
            max_peers: 64,
            max_requests_per_peer: 65_536,
            finished_memory: 4_096,
        }
    }
}

/// One transition of a peer's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerEvent<'a> {
    /// Routed to `pod` (already resolved to this replica's id) with this charge.
    Route {
        request: u64,
        pod: PodId,
        input_tokens: u32,
        prefill_tokens: u64,
        blocks: &'a [BlockHash],
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
}

/// One live request in a peer's snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotEntry {
    pub request: u64,
    pub pod: PodId,
    pub input_tokens: u32,
    /// The prefill charge still held (0 after the first token).
    pub prefill_tokens: u64,
    pub first_token: bool,
    pub decode_tokens: u64,
}

/// Counters of what the book did (monotonic, except the two gauges).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Events applied (routes, first tokens, tokens, finishes).
    pub applied: u64,
    /// Messages refused as already seen (or older than the window).
    pub duplicates: u64,
    /// Events that changed nothing (unknown request, already finished, ...).
    pub ignored: u64,
    /// Corrections made by snapshots: requests charged, finished or aligned.
    pub repairs: u64,
    pub expired_peers: u64,
    pub expired_requests: u64,
    /// Messages or routes refused by `max_peers` / `max_requests_per_peer`.
    pub over_bound: u64,
    /// Gauges: peers known now, and their requests charged here now.
    pub peers: usize,
    pub requests: usize,
}

/// A peer's request charged here.
#[derive(Debug)]
struct Remote {
    ticket: Ticket,
    /// False while only a snapshot has charged it: its route (with the prompt's blocks) has
    /// not been applied, and when it arrives its blocks are recorded (not charged again).
    routed: bool,
}

#[derive(Debug, Default)]
struct Peer {
    last_heard_ms: u64,
    /// Highest sequence number accepted, and a bitmap of the [`SEQ_WINDOW`] below it (bit i:
    /// `highest - 1 - i` seen).
    highest: Option<u64>,
    window: u64,
    requests: FxHashMap<u64, Remote>,
    finished: FxHashSet<u64>,
    finished_order: VecDeque<u64>,
}

impl Peer {
    fn remember_finished(&mut self, request: u64, memory: usize) {
        if memory == 0 || !self.finished.insert(request) {
            return;
        }
        self.finished_order.push_back(request);
        while self.finished_order.len() > memory {
            if let Some(old) = self.finished_order.pop_front() {
                self.finished.remove(&old);
            }
        }
    }
}

/// The peers' requests charged to this replica's session; see the module docs.
#[derive(Debug, Default)]
pub struct PeerBook {
    config: PeerConfig,
    peers: FxHashMap<u64, Peer>,
    stats: PeerStats,
}

impl PeerBook {
    pub fn new(config: PeerConfig) -> Self {
        PeerBook {
            config,
            ..PeerBook::default()
        }
    }

    pub fn config(&self) -> &PeerConfig {
        &self.config
    }

    /// The counters, with the gauges filled in.
    pub fn stats(&self) -> PeerStats {
        PeerStats {
            peers: self.peers.len(),
            requests: self.peers.values().map(|p| p.requests.len()).sum(),
            ..self.stats
        }
    }

    /// Peer replica ids known now.
    pub fn peer_ids(&self) -> Vec<u64> {
        self.peers.keys().copied().collect()
    }

    /// Milliseconds since the peer heard from longest ago was last heard from (`None`: no peer).
    pub fn staleness_ms(&self, now_ms: u64) -> Option<u64> {
        self.peers
            .values()
            .map(|p| now_ms.saturating_sub(p.last_heard_ms))
            .max()
    }

    /// A message `seq` of `replica` arrived: true if it is new (apply its events), false if it
    /// was seen already or is older than the window, or the peer is one too many. Renews the
    /// peer's lease either way.
    pub fn accept(&mut self, replica: u64, seq: u64, now_ms: u64) -> bool {
        if !self.peers.contains_key(&replica) && self.peers.len() >= self.config.max_peers {
            self.stats.over_bound += 1;
            return false;
        }
        let peer = self.peers.entry(replica).or_default();
        peer.last_heard_ms = peer.last_heard_ms.max(now_ms);
        let new = match peer.highest {
            None => {
                peer.highest = Some(seq);
                true
            }
            Some(h) if seq > h => {
                let shift = seq - h;
                peer.window = if shift > SEQ_WINDOW {
                    0
                } else {
                    // The old highest becomes bit shift-1.
                    (peer.window << (shift - 1) << 1) | (1 << (shift - 1))
                };
                peer.highest = Some(seq);
                true
            }
            Some(h) if seq == h => false,
            Some(h) if h - seq <= SEQ_WINDOW => {
                let bit = 1u64 << (h - seq - 1);
                let seen = peer.window & bit != 0;
                peer.window |= bit;
                !seen
            }
            Some(_) => false,
        };
        if !new {
            self.stats.duplicates += 1;
        }
        new
    }

    /// Applies one event of `replica` (a message [`PeerBook::accept`] took) to `session`.
    pub fn apply(&mut self, session: &mut RouterSession, replica: u64, event: PeerEvent<'_>) {
        let memory = self.config.finished_memory;
        let max_requests = self.config.max_requests_per_peer;
        let Some(peer) = self.peers.get_mut(&replica) else {
            self.stats.ignored += 1;
            return;
        };
        let applied = match event {
            PeerEvent::Route {
                request,
                pod,
                input_tokens,
                prefill_tokens,
                blocks,
            } => {
                if peer.finished.contains(&request) {
                    false
                } else if let Some(r) = peer.requests.get_mut(&request) {
                    // Charged by a snapshot that overtook the route: the charge stands, the
                    // route's blocks are still to be learnt.
                    if r.routed {
                        false
                    } else {
                        r.routed = true;
                        if !blocks.is_empty() {
                            session.index_mut().record_routed(pod, blocks);
                        }
                        true
                    }
                } else if peer.requests.len() >= max_requests {
                    self.stats.over_bound += 1;
                    false
                } else {
                    let ticket = session.route_remote(pod, blocks, input_tokens, prefill_tokens);
                    peer.requests.insert(
                        request,
                        Remote {
                            ticket,
                            routed: true,
                        },
                    );
                    true
                }
            }
            PeerEvent::FirstToken { request } => match peer.requests.get_mut(&request) {
                Some(r) if !r.ticket.has_first_token() => {
                    session.first_token(&mut r.ticket);
                    true
                }
                _ => false,
            },
            PeerEvent::Tokens { request, tokens } => match peer.requests.get_mut(&request) {
                Some(r) if tokens > 0 => {
                    session.tokens_generated(&mut r.ticket, tokens);
                    true
                }
                _ => false,
            },
            PeerEvent::Finish { request } => {
                let r = peer.requests.remove(&request);
                peer.remember_finished(request, memory);
                match r {
                    Some(r) => {
                        session.finish(r.ticket, None);
                        true
                    }
                    None => false,
                }
            }
        };
        if applied {
            self.stats.applied += 1;
        } else {
            self.stats.ignored += 1;
        }
    }

    /// A snapshot of `replica`'s live requests (`complete`: all of them; else only additions
    /// are made): charges what is missing, aligns first tokens and decode tokens, and finishes
    /// this book's requests of that peer below `next_request` that it no longer lists. Returns
    /// the corrections made (also added to [`PeerStats::repairs`]).
    pub fn reconcile(
        &mut self,
        session: &mut RouterSession,
        replica: u64,
        next_request: u64,
        live: &[SnapshotEntry],
        complete: bool,
    ) -> u64 {
        let max_requests = self.config.max_requests_per_peer;
        let Some(peer) = self.peers.get_mut(&replica) else {
            return 0;
        };
        let mut repairs = 0u64;
        for e in live {
            if peer.finished.contains(&e.request) {
                continue;
            }
            let t = match peer.requests.get_mut(&e.request) {
                Some(r) => &mut r.ticket,
                None => {
                    if peer.requests.len() >= max_requests {
                        self.stats.over_bound += 1;
                        continue;
                    }
                    let ticket = session.route_remote(e.pod, &[], e.input_tokens, e.prefill_tokens);
                    repairs += 1;
                    &mut peer
                        .requests
                        .entry(e.request)
                        .or_insert(Remote {
                            ticket,
                            routed: false,
                        })
                        .ticket
                }
            };
            if e.first_token && !t.has_first_token() {
                session.first_token(t);
                repairs += 1;
            }
            if e.decode_tokens > t.decode_tokens() && t.has_first_token() {
                session.tokens_generated(t, e.decode_tokens - t.decode_tokens());
                repairs += 1;
            }
        }
        if complete {
            let listed: FxHashSet<u64> = live.iter().map(|e| e.request).collect();
            let gone: Vec<u64> = peer
                .requests
                .keys()
                .copied()
                .filter(|r| *r < next_request && !listed.contains(r))
                .collect();
            for r in gone {
                if let Some(t) = peer.requests.remove(&r) {
                    session.finish(t.ticket, None);
                    repairs += 1;
                }
            }
        }
        self.stats.repairs += repairs;
        repairs
    }

    /// Finishes every request of the peers not heard from for `lease_ms` and forgets them.
    /// Returns the peers expired.
    pub fn expire(&mut self, session: &mut RouterSession, now_ms: u64) -> usize {
        let lease = self.config.lease_ms;
        let dead: Vec<u64> = self
            .peers
            .iter()
            .filter(|(_, p)| now_ms.saturating_sub(p.last_heard_ms) > lease)
            .map(|(id, _)| *id)
            .collect();
        for id in &dead {
            let n = self.release(session, *id);
            self.stats.expired_peers += 1;
            self.stats.expired_requests += n as u64;
        }
        dead.len()
    }

    /// The peer left (said goodbye): its requests are finished and it is forgotten.
    pub fn forget(&mut self, session: &mut RouterSession, replica: u64) {
        self.release(session, replica);
    }

    fn release(&mut self, session: &mut RouterSession, replica: u64) -> usize {
        let Some(peer) = self.peers.remove(&replica) else {
            return 0;
        };
        let n = peer.requests.len();
        for (_, r) in peer.requests {
            session.finish(r.ticket, None);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::InFlight;

    fn session() -> RouterSession {
        super::super::test_session(1)
    }

    fn route(request: u64, blocks: &[BlockHash]) -> PeerEvent<'_> {
        PeerEvent::Route {
            request,
            pod: PodId(1),
            input_tokens: 100,
            prefill_tokens: 60,
            blocks,
        }
    }

    #[test]
    fn a_peers_request_is_charged_recorded_moved_and_returned_like_a_local_one() {
        let mut s = session();
        let mut book = PeerBook::default();
        assert!(book.accept(7, 0, 0));
        book.apply(&mut s, 7, route(1, &[11, 12]));
        assert_eq!(
            s.in_flight(PodId(1)),
            InFlight {
                requests: 1,
                prefill_tokens: 60,
                decode_tokens: 0
            }
        );
        assert_eq!(s.index().routed.pod_blocks(PodId(1)), 2);
        book.apply(&mut s, 7, PeerEvent::FirstToken { request: 1 });
        book.apply(
            &mut s,
            7,
            PeerEvent::Tokens {
                request: 1,
                tokens: 5,
            },
        );
        assert_eq!(
            s.in_flight(PodId(1)),
            InFlight {
                requests: 1,
                prefill_tokens: 0,
                decode_tokens: 106
            }
        );
        book.apply(&mut s, 7, PeerEvent::Finish { request: 1 });
        assert_eq!(s.in_flight_total(), 0);
        assert_eq!(book.stats().applied, 4);
        assert_eq!(book.stats().requests, 0);
        // The routed index keeps what the peer's request taught it.
        assert_eq!(s.index().routed.pod_blocks(PodId(1)), 2);
    }

    #[test]
    fn a_message_seen_twice_or_older_than_the_window_is_refused() {
        let mut book = PeerBook::default();
        assert!(book.accept(1, 10, 0));
        assert!(!book.accept(1, 10, 0));
        assert!(book.accept(1, 12, 0));
        // 11 was skipped, arrives late: new once, then a duplicate.
        assert!(book.accept(1, 11, 0));
        assert!(!book.accept(1, 11, 0));
        assert!(!book.accept(1, 12, 0));
        assert!(book.accept(1, 12 + SEQ_WINDOW + 5, 0));
        assert!(!book.accept(1, 12, 0), "older than the window");
        assert!(book.accept(1, 12 + SEQ_WINDOW + 4, 0));
        assert_eq!(book.stats().duplicates, 4);
        // Another replica's numbers are its own.
        assert!(book.accept(2, 10, 0));
    }

    #[test]
    fn a_finish_before_its_route_leaves_nothing_charged() {
        let mut s = session();
        let mut book = PeerBook::default();
        book.accept(3, 0, 0);
        book.apply(&mut s, 3, PeerEvent::Finish { request: 9 });
        book.apply(&mut s, 3, route(9, &[]));
        book.apply(&mut s, 3, PeerEvent::FirstToken { request: 9 });
        assert_eq!(s.in_flight_total(), 0);
        assert_eq!(book.stats().ignored, 3);
    }

    #[test]
    fn a_snapshot_repairs_lost_routes_lost_finishes_and_lagging_tokens() {
        let mut s = session();
        let mut book = PeerBook::default();
        book.accept(5, 0, 0);
        book.apply(&mut s, 5, route(1, &[]));
        book.apply(&mut s, 5, route(2, &[]));
        // Request 1's finish and request 3's route were lost; request 2 is at 4 decode tokens.
        let live = [
            SnapshotEntry {
                request: 2,
                pod: PodId(1),
                input_tokens: 100,
                prefill_tokens: 0,
                first_token: true,
                decode_tokens: 105,
            },
            SnapshotEntry {
                request: 3,
                pod: PodId(0),
                input_tokens: 10,
                prefill_tokens: 10,
                first_token: false,
                decode_tokens: 0,
            },
        ];
        let repairs = book.reconcile(&mut s, 5, 4, &live, true);
        assert_eq!(repairs, 4, "2 first token, 2 tokens, 3 charged, 1 finished");
        assert_eq!(
            s.in_flight(PodId(1)),
            InFlight {
                requests: 1,
                prefill_tokens: 0,
                decode_tokens: 105
            }
        );
        assert_eq!(
            s.in_flight(PodId(0)),
            InFlight {
                requests: 1,
                prefill_tokens: 10,
                decode_tokens: 0
            }
        );
        // The same snapshot again changes nothing.
        assert_eq!(book.reconcile(&mut s, 5, 4, &live, true), 0);
        // A request routed after the snapshot was taken (id ≥ next_request) is kept.
        book.apply(&mut s, 5, route(4, &[]));
        assert_eq!(book.reconcile(&mut s, 5, 4, &live, true), 0);
        assert_eq!(book.stats().requests, 3);
        // An empty complete snapshot later finishes everything.
        book.reconcile(&mut s, 5, 5, &[], true);
        assert_eq!(s.in_flight_total(), 0);
    }

    #[test]
    fn a_route_overtaken_by_a_snapshot_still_teaches_the_index_and_is_not_charged_twice() {
        let mut s = session();
        let mut book = PeerBook::default();
        book.accept(5, 0, 0);
        let live = [SnapshotEntry {
            request: 1,
            pod: PodId(1),
            input_tokens: 100,
            prefill_tokens: 60,
            first_token: false,
            decode_tokens: 0,
        }];
        assert_eq!(book.reconcile(&mut s, 5, 2, &live, true), 1);
        assert_eq!(s.index().routed.pod_blocks(PodId(1)), 0);
        book.apply(&mut s, 5, route(1, &[11, 12, 13]));
        assert_eq!(s.index().routed.pod_blocks(PodId(1)), 3);
        assert_eq!(
            s.in_flight(PodId(1)),
            InFlight {
                requests: 1,
                prefill_tokens: 60,
                decode_tokens: 0
            }
        );
        // A second copy of the route changes nothing.
        book.apply(&mut s, 5, route(1, &[11, 12, 13, 14]));
        assert_eq!(s.index().routed.pod_blocks(PodId(1)), 3);
        assert_eq!(book.stats().applied, 1);
        book.apply(&mut s, 5, PeerEvent::Finish { request: 1 });
        assert_eq!(s.in_flight_total(), 0);
    }

    #[test]
    fn a_silent_peer_expires_after_its_lease_and_its_charges_are_returned() {
        let mut s = session();
        let mut book = PeerBook::new(PeerConfig {
            lease_ms: 1_000,
            ..PeerConfig::default()
        });
        book.accept(1, 0, 0);
        book.apply(&mut s, 1, route(1, &[]));
        book.accept(2, 0, 500);
        book.apply(&mut s, 2, route(1, &[]));
        assert_eq!(s.in_flight(PodId(1)).requests, 2);
        assert_eq!(book.expire(&mut s, 1_000), 0);
        assert_eq!(book.staleness_ms(1_000), Some(1_000));
        assert_eq!(book.expire(&mut s, 1_001), 1);
        assert_eq!(s.in_flight(PodId(1)).requests, 1);
        assert_eq!(book.stats().expired_requests, 1);
        book.forget(&mut s, 2);
        assert_eq!(s.in_flight_total(), 0);
        assert_eq!(book.stats().peers, 0);
    }

    #[test]
    fn bounds_refuse_extra_peers_and_requests() {
        let mut s = session();
        let mut book = PeerBook::new(PeerConfig {
            max_peers: 1,
            max_requests_per_peer: 1,
            finished_memory: 1,
            ..PeerConfig::default()
        });
        assert!(book.accept(1, 0, 0));
        assert!(!book.accept(2, 0, 0));
        book.apply(&mut s, 1, route(1, &[]));
        book.apply(&mut s, 1, route(2, &[]));
        assert_eq!(s.in_flight(PodId(1)).requests, 1);
        assert_eq!(book.stats().over_bound, 2);
        // Finished memory of 1: the older id is forgotten.
        book.apply(&mut s, 1, PeerEvent::Finish { request: 1 });
        book.apply(&mut s, 1, PeerEvent::Finish { request: 2 });
        book.apply(&mut s, 1, route(1, &[]));
        assert_eq!(s.in_flight(PodId(1)).requests, 1);
    }

    #[test]
    fn a_removed_pod_is_not_charged_back_by_a_late_finish() {
        let mut s = session();
        let mut book = PeerBook::default();
        book.accept(1, 0, 0);
        book.apply(&mut s, 1, route(1, &[]));
        s.remove_pod(PodId(1));
        let local = s.route_remote(PodId(1), &[], 5, 5);
        book.apply(&mut s, 1, PeerEvent::Finish { request: 1 });
        assert_eq!(s.in_flight(PodId(1)).requests, 1);
        s.finish(local, None);
        assert_eq!(s.in_flight_total(), 0);
    }
}
