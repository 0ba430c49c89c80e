//! Active-active gateway replicas (`kvgate serve --cluster nats://HOST:PORT --cluster-name
//! NAME`): every replica publishes its requests' routing transitions over NATS and applies the
//! others', so each replica's in-flight ledger and routed index hold the whole fleet's work.
//!
//! # Algorithm
//!
//! - **Publishing.** [`crate::lifecycle::TicketGuard`] reports its request's transitions here
//!   ([`Cluster::routed`], [`Cluster::first_token`], [`Cluster::tokens`], [`Cluster::finish`]):
//!   route (pod, prompt tokens, the charge, the prompt's block hashes), first token, decode
//!   tokens in steps of [`TOKENS_PER_EVENT`], finish. Each becomes a [`wire::Event`] pushed with
//!   `try_send` onto a bounded queue of [`QUEUE_EVENTS`]: a full queue drops the event and counts
//!   it (`kvgate_cluster_events_dropped_total{reason="queue_full"}`), so routing never waits on
//!   the network. One publisher task drains the queue into messages (everything queued, up to
//!   [`MAX_MESSAGE_BYTES`]) on `kvgate.<NAME>.events`, each with this replica's id and the next
//!   sequence number. While NATS is unreachable events are dropped
//!   (`reason="disconnected"`); the snapshots below repair what they would have said.
//! - **Snapshots.** Every [`SNAPSHOT_INTERVAL`] (and right after every (re)connect) a replica
//!   publishes its live requests ([`wire::Event::Snapshot`]); peers reconcile against it
//!   ([`kvgate_core::session::peers::PeerBook::reconcile`]), which also renews the replica's
//!   lease.
//! - **Applying.** The receiver task decodes each message (garbage is counted and skipped),
//!   refuses duplicates by sequence number, maps pod keys ([`wire::pod_key`]) to this replica's
//!   pod ids (pods it does not have are skipped and counted) and applies the events through the
//!   core's [`kvgate_core::session::peers::PeerBook`] — the same session transitions a local
//!   request makes. A peer silent for the lease (`cluster_lease_ms`, default 3,000) has its
//!   charges returned; one that shuts down says `Bye` and is released at once.
//! - **Warm-up.** After every (re)connect a replica asks its peers for their routed index
//!   ([`wire::Event::SyncRequest`]); each answers on `kvgate.<NAME>.to.<replica id>` with, per
//!   pod, its newest [`MAX_INDEX_BLOCKS_PER_POD`] blocks oldest first, in chunks of
//!   [`INDEX_CHUNK_BLOCKS`], which the asker records, so a new replica routes warm and one that
//!   was partitioned learns the routes it missed.
//! - **Training samples.** A request that completed normally also sends its predictor sample
//!   ([`wire::Event::Sample`]: the pod, the features at dispatch, the observed TTFT/TPOT);
//!   peers learn it for that pod's class ([`kvgate_core::RouterSession::learn`]), so every
//!   replica's predictor trains on the whole fleet's requests. Measured in EVALUATION.md §12:
//!   4 replicas training each on its own quarter over-predicted more than one router did.
//!   `cluster_share_samples = false` turns it off.
//! - **Decision seed.** A replica's session draws from its configured seed mixed with its
//!   replica id (`decision_seed`), so replicas from one config do not explore in lockstep.
//!
//! NATS core (no JetStream) is used: at-most-once, ordered per publisher. The failure
//! semantics follow from the above: NATS down → each replica routes on its own state (nothing
//! waits on NATS), its peers' charges expire after the lease, and
//! `kvgate_cluster_divergence_seconds` (seconds since the disconnect, or since the stalest peer
//! was heard from) rises; after the reconnect the snapshots and the index sync converge.
//!
//! # Bounds
//!
//! Queue: [`QUEUE_EVENTS`] events (a route holds its prompt's block hashes: ≤ 8 bytes × 65,536).
//! Own live requests: one small entry per request in flight (bounded by the admission slots).
//! Peers: [`kvgate_core::session::peers::PeerConfig`]'s bounds. Bandwidth: see [`wire`].

pub mod wire;

pub use crate::config::{ClusterConfig, DEFAULT_CLUSTER_NAME, DEFAULT_LEASE_MS, valid_name};
pub use crate::metrics::{ClusterMetrics, ClusterReasonLabel, DeliveryHistogram};
use crate::pods::Pod;
use crate::state::{ReplicaLink, Shared};
use bytes::Bytes;
use futures_util::StreamExt;
use kvgate_core::index::PrefixIndex;
use kvgate_core::session::peers::{PeerBook, PeerConfig, PeerEvent, SnapshotEntry};
use kvgate_core::{BlockHash, PodId, TrainingSample};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use wire::{Event, SnapshotItem};

/// Decode tokens a request accumulates before it reports them (the rest goes with the finish).
pub const TOKENS_PER_EVENT: u64 = 32;
/// Events waiting for the publisher; beyond, dropped and counted.
pub const QUEUE_EVENTS: usize = 8_192;
/// Largest message the publisher builds (NATS's default `max_payload` is 1 MiB).
pub const MAX_MESSAGE_BYTES: usize = 256 << 10;
/// How often a replica publishes its live requests.
pub const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(1);
/// How often leases are checked.
pub const EXPIRE_TICK: Duration = Duration::from_millis(250);
/// Blocks per index message of a warm-up answer.
pub const INDEX_CHUNK_BLOCKS: usize = 8_192;
/// Newest blocks per pod a warm-up answer carries.
pub const MAX_INDEX_BLOCKS_PER_POD: usize = 65_536;

/// This replica's view of one of its own requests (what its snapshots say).
#[derive(Debug, Clone, Copy)]
struct Live {
    pod: u64,
    input_tokens: u32,
    prefill_tokens: u64,
    first_token: bool,
    decode_tokens: u64,
}

/// The connection's state as the NATS client's event callback reports it.
#[derive(Debug)]
struct Link {
    connected: AtomicBool,
    /// When the link went down (or the start, before the first connect).
    down_since: Mutex<Option<Instant>>,
    connects: AtomicU64,
    /// Wakes the publisher after a (re)connect: snapshot + sync request at once.
    reconnected: tokio::sync::Notify,
}

/// One replica's membership in the cluster; see the module docs.
pub struct Cluster {
    pub config: ClusterConfig,
    /// This replica's id (random per start).
    pub replica: u64,
    next_request: AtomicU64,
    seq: AtomicU64,
    queue: mpsc::Sender<Event>,
    /// Wall-clock µs at which the oldest event not yet taken by the publisher was queued (0:
    /// none); the publisher takes it with a batch and sends it in the message's
    /// [`QUEUED_HEADER`], so peers measure the delivery delay.
    oldest_queued_us: AtomicU64,
    live: Mutex<FxHashMap<u64, Live>>,
    /// Peers' requests charged here (locked before the session, never the other way).
    pub peers: Mutex<PeerBook>,
    link: Arc<Link>,
    epoch: Instant,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("config", &self.config)
            .field("replica", &format_args!("{:016x}", self.replica))
            .finish()
    }
}

impl ReplicaLink for Cluster {
    /// A request was routed (or charged unrouted: no blocks); returns its cluster request id.
    /// A request of a client session also tells the others its pod (session affinity).
    fn routed(
        &self,
        shared: &Shared,
        pod: &Pod,
        blocks: &[BlockHash],
        input_tokens: u32,
        prefill_tokens: u64,
        session: Option<u64>,
    ) -> u64 {
        let key = wire::pod_key(&pod.url);
        let request = self.route_event(shared, key, blocks, input_tokens, prefill_tokens);
        if let Some(session) = session {
            let live = self.live.lock();
            self.push(
                shared,
                &live,
                Event::Session {
                    pod: key,
                    key: session,
                },
            );
        }
        request
    }

    /// The request's first token; with a training sample (its TTFT, learnt at the first
    /// token), that goes out too, for the other replicas' predictors.
    fn first_token(
        &self,
        shared: &Shared,
        request: u64,
        decode_tokens: u64,
        sample: Option<TrainingSample>,
    ) {
        let mut live = self.live.lock();
        let pod = live.get_mut(&request).map(|l| {
            l.first_token = true;
            l.prefill_tokens = 0;
            l.decode_tokens = decode_tokens;
            l.pod
        });
        self.push(shared, &live, Event::FirstToken { request });
        if let (Some(pod), Some(sample), true) = (pod, sample, self.config.share_samples) {
            self.push(shared, &live, Event::Sample { pod, sample });
        }
    }

    /// `tokens` more decode tokens (the guard batches them by [`TOKENS_PER_EVENT`]).
    fn tokens(&self, shared: &Shared, request: u64, tokens: u64) {
        let mut live = self.live.lock();
        if let Some(l) = live.get_mut(&request) {
            l.decode_tokens = l.decode_tokens.saturating_add(tokens);
        }
        self.push(shared, &live, Event::Tokens { request, tokens });
    }

    /// The request ended; with a training sample (it completed normally), that goes out
    /// too, for the other replicas' predictors.
    fn finish(&self, shared: &Shared, request: u64, sample: Option<TrainingSample>) {
        let mut live = self.live.lock();
        let pod = live.remove(&request).map(|l| l.pod);
        self.push(shared, &live, Event::Finish { request });
        if let (Some(pod), Some(sample), true) = (pod, sample, self.config.share_samples) {
            self.push(shared, &live, Event::Sample { pod, sample });
        }
    }

    /// Refreshes the `kvgate_cluster_*` gauges.
    fn refresh_gauges(&self, m: &ClusterMetrics) {
        let stats = self.peers.lock().stats();
        m.connected.set(i64::from(self.is_connected()));
        m.peers.set(stats.peers as i64);
        m.remote_requests.set(stats.requests as i64);
        m.divergence_seconds.set(self.divergence_seconds());
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

/// The decision RNG's seed of a replica: its configured `seed` mixed with its (random) replica
/// id. Replicas usually share one config file, and with one seed their sessions would draw the
/// same numbers in lockstep, so two replicas deciding at the same moment would explore together
/// and pick alike.
fn decision_seed(seed: u64, replica: u64) -> u64 {
    seed ^ replica
}

fn random_replica_id() -> u64 {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    std::collections::hash_map::RandomState::new().hash_one((std::process::id(), nanos))
}

/// Wall-clock microseconds since the Unix epoch.
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(1)
        .max(1)
}

/// The NATS header carrying [`Cluster::take_queued_us`]'s stamp (decimal µs since the Unix
/// epoch). A header, not a payload field, so replicas that predate it read the messages as
/// before.
pub const QUEUED_HEADER: &str = "Kvgate-Queued-Us";

/// Records a message's delivery delay from its [`QUEUED_HEADER`] (absent or garbled: nothing;
/// a stamp in the future, clock skew: zero).
fn observe_delivery(m: &ClusterMetrics, headers: Option<&async_nats::HeaderMap>, now_us: u64) {
    let Some(stamp) = headers
        .and_then(|h| h.get(QUEUED_HEADER))
        .and_then(|v| v.as_str().parse::<u64>().ok())
    else {
        return;
    };
    m.delivery_seconds
        .0
        .observe(now_us.saturating_sub(stamp) as f64 / 1e6);
}

fn events_subject(name: &str) -> String {
    format!("kvgate.{name}.events")
}

fn direct_subject(name: &str, replica: u64) -> String {
    format!("kvgate.{name}.to.{replica:016x}")
}

impl Cluster {
    /// This replica's membership, when `--cluster` started one ([`Shared::cluster`]).
    pub fn of(shared: &Shared) -> Option<Arc<Cluster>> {
        shared.cluster.clone()?.into_any().downcast().ok()
    }

    fn metrics<'a>(&self, shared: &'a Shared) -> &'a ClusterMetrics {
        &shared.metrics.cluster
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn is_connected(&self) -> bool {
        self.link.connected.load(Ordering::Acquire)
    }

    /// Queues `e`; the caller holds `live` (already updated for `e`), so a snapshot (built
    /// under the same lock, after draining the queue) never shows a transition whose event is
    /// still to be sent after it.
    fn push(&self, shared: &Shared, _live: &FxHashMap<u64, Live>, e: Event) {
        // Only the first event after a take reads the clock.
        if self.oldest_queued_us.load(Ordering::Relaxed) == 0 {
            let _ = self.oldest_queued_us.compare_exchange(
                0,
                unix_us(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        if self.queue.try_send(e).is_err() {
            self.metrics(shared)
                .events_dropped
                .get_or_create(&ClusterReasonLabel {
                    reason: "queue_full",
                })
                .inc();
        }
    }

    fn route_event(
        &self,
        shared: &Shared,
        key: u64,
        blocks: &[BlockHash],
        input_tokens: u32,
        prefill_tokens: u64,
    ) -> u64 {
        let mut live = self.live.lock();
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        live.insert(
            request,
            Live {
                pod: key,
                input_tokens,
                prefill_tokens,
                first_token: false,
                decode_tokens: 0,
            },
        );
        self.push(
            shared,
            &live,
            Event::Route {
                request,
                pod: key,
                input_tokens,
                prefill_tokens,
                blocks: blocks.to_vec(),
            },
        );
        request
    }

    /// Seconds the view of the other replicas may be behind (the divergence gauge).
    pub fn divergence_seconds(&self) -> f64 {
        if !self.is_connected() {
            return self
                .link
                .down_since
                .lock()
                .map_or(0.0, |t| t.elapsed().as_secs_f64());
        }
        let now = self.now_ms();
        self.peers
            .lock()
            .staleness_ms(now)
            .map_or(0.0, |ms| ms as f64 / 1000.0)
    }

    /// When the oldest event of the batch being taken now was queued (now if none is pending);
    /// called before the batch is drained, so an event queued meanwhile makes the next batch's
    /// stamp early, never late (the delay is over-, not under-stated).
    fn take_queued_us(&self) -> u64 {
        match self.oldest_queued_us.swap(0, Ordering::Relaxed) {
            0 => unix_us(),
            t => t,
        }
    }

    /// Appends to `out` every event still queued, then a snapshot of the live requests, both
    /// taken under the `live` lock: the events a snapshot reflects are all ahead of it on the
    /// wire. (A snapshot sent ahead of queued events made peers apply those events on top of
    /// it: decode tokens counted twice, routes ignored as known and their blocks never
    /// recorded.)
    fn pending_then_snapshot(&self, rx: &mut mpsc::Receiver<Event>, out: &mut Vec<Event>) {
        let live = self.live.lock();
        while let Ok(e) = rx.try_recv() {
            out.push(e);
        }
        out.push(Self::snapshot_of(
            self.next_request.load(Ordering::Relaxed),
            &live,
        ));
    }

    fn snapshot_of(next_request: u64, live: &FxHashMap<u64, Live>) -> Event {
        Event::Snapshot {
            next_request,
            complete: true,
            live: live
                .iter()
                .map(|(r, l)| SnapshotItem {
                    request: *r,
                    pod: l.pod,
                    input_tokens: l.input_tokens,
                    prefill_tokens: l.prefill_tokens,
                    first_token: l.first_token,
                    decode_tokens: l.decode_tokens,
                })
                .collect(),
        }
    }
}

/// A replica's membership before it runs: the [`Cluster`] (given to the gateway's state at
/// start, [`crate::state::StartParts::cluster`]) and its event queue's receiving end, for the
/// publisher [`start`] spawns.
pub struct Prepared {
    pub cluster: Arc<Cluster>,
    events: mpsc::Receiver<Event>,
}

/// This replica's [`Cluster`], not connected yet.
pub fn prepare(config: ClusterConfig) -> Prepared {
    let link = Arc::new(Link {
        connected: AtomicBool::new(false),
        down_since: Mutex::new(Some(Instant::now())),
        connects: AtomicU64::new(0),
        reconnected: tokio::sync::Notify::new(),
    });
    let (tx, rx) = mpsc::channel(QUEUE_EVENTS);
    let replica = random_replica_id();
    let cluster = Arc::new(Cluster {
        peers: Mutex::new(PeerBook::new(PeerConfig {
            lease_ms: config.lease.as_millis() as u64,
            ..PeerConfig::default()
        })),
        config,
        replica,
        next_request: AtomicU64::new(0),
        seq: AtomicU64::new(0),
        queue: tx,
        oldest_queued_us: AtomicU64::new(0),
        live: Mutex::new(FxHashMap::default()),
        link,
        epoch: Instant::now(),
    });
    Prepared {
        cluster,
        events: rx,
    }
}

/// Connects (in the background: the gateway starts whether or not NATS is up) and starts the
/// publisher and receiver tasks of `prepared`, which `shared` holds as its cluster link.
pub async fn start(shared: &Arc<Shared>, prepared: Prepared) -> Vec<JoinHandle<()>> {
    let Prepared {
        cluster,
        events: rx,
    } = prepared;
    let replica = cluster.replica;
    // Before anything routes, and whether or not NATS is usable.
    let seed = decision_seed(shared.config().seed, replica);
    shared.session.lock().reseed(seed);
    let link = cluster.link.clone();
    let cb_link = link.clone();
    let cb_shared = shared.clone();
    let options = async_nats::ConnectOptions::new()
        .name(format!("kvgate-{replica:016x}"))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(2))
        .reconnect_delay_callback(|attempts| {
            Duration::from_millis((100 * attempts as u64).clamp(100, 1_000))
        })
        .event_callback(move |event| {
            let link = cb_link.clone();
            let shared = cb_shared.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        link.connected.store(true, Ordering::Release);
                        *link.down_since.lock() = None;
                        if link.connects.fetch_add(1, Ordering::AcqRel) > 0 {
                            shared.metrics.cluster.reconnects.inc();
                        }
                        tracing::info!("cluster: connected to NATS");
                        link.reconnected.notify_one();
                    }
                    async_nats::Event::Disconnected => {
                        link.connected.store(false, Ordering::Release);
                        *link.down_since.lock() = Some(Instant::now());
                        tracing::warn!(
                            "cluster: NATS disconnected; routing on local state until it is back"
                        );
                    }
                    other => tracing::debug!(event = %other, "cluster: NATS event"),
                }
            }
        });
    let client = match options.connect(cluster.config.url.as_str()).await {
        Ok(c) => c,
        Err(e) => {
            // Only an unusable address gets here (retry_on_initial_connect retries the rest).
            tracing::error!(url = %cluster.config.url, error = %e, "cluster: cannot use the NATS address; running alone");
            return Vec::new();
        }
    };
    tracing::info!(
        url = %cluster.config.url,
        name = %cluster.config.name,
        replica = %format_args!("{replica:016x}"),
        decision_seed = seed,
        "cluster: replica started"
    );
    vec![
        tokio::spawn(publisher(
            shared.clone(),
            cluster.clone(),
            client.clone(),
            rx,
        )),
        tokio::spawn(receiver(shared.clone(), cluster, client)),
    ]
}

/// Publishes `events` as one message (several if they pass [`MAX_MESSAGE_BYTES`]) on `subject`;
/// dropped and counted while disconnected.
async fn send(
    shared: &Shared,
    cluster: &Cluster,
    client: &async_nats::Client,
    subject: &str,
    events: &[Event],
    queued_us: u64,
) {
    let m = &shared.metrics.cluster;
    if !cluster.is_connected() {
        m.events_dropped
            .get_or_create(&ClusterReasonLabel {
                reason: "disconnected",
            })
            .inc_by(events.len() as u64);
        return;
    }
    let mut start = 0;
    while start < events.len() {
        let mut body = Vec::new();
        let mut n = 0;
        for e in &events[start..] {
            if n > 0 && body.len() >= MAX_MESSAGE_BYTES {
                break;
            }
            wire::encode_event(&mut body, e);
            n += 1;
        }
        start += n;
        let seq = cluster.seq.fetch_add(1, Ordering::Relaxed);
        let mut out = Vec::with_capacity(body.len() + 24);
        wire::encode_header(&mut out, cluster.replica, seq, n);
        out.extend_from_slice(&body);
        let len = out.len();
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(QUEUED_HEADER, queued_us.to_string().as_str());
        match client
            .publish_with_headers(subject.to_string(), headers, Bytes::from(out))
            .await
        {
            Ok(()) => {
                m.messages_sent.inc();
                m.bytes_sent.inc_by(len as u64);
            }
            Err(e) => {
                m.events_dropped
                    .get_or_create(&ClusterReasonLabel {
                        reason: "disconnected",
                    })
                    .inc_by(n as u64);
                tracing::debug!(error = %e, "cluster: publish failed");
            }
        }
    }
}

async fn publisher(
    shared: Arc<Shared>,
    cluster: Arc<Cluster>,
    client: async_nats::Client,
    mut rx: mpsc::Receiver<Event>,
) {
    let subject = events_subject(&cluster.config.name);
    let mut tick = tokio::time::interval(SNAPSHOT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch: Vec<Event> = Vec::new();
    loop {
        tokio::select! {
            e = rx.recv() => {
                let Some(e) = e else { return };
                let queued = cluster.take_queued_us();
                batch.push(e);
                while batch.len() < 4_096 {
                    match rx.try_recv() {
                        Ok(e) => batch.push(e),
                        Err(_) => break,
                    }
                }
                send(&shared, &cluster, &client, &subject, &batch, queued).await;
                batch.clear();
            }
            _ = tick.tick() => {
                let queued = cluster.take_queued_us();
                cluster.pending_then_snapshot(&mut rx, &mut batch);
                send(&shared, &cluster, &client, &subject, &batch, queued).await;
                batch.clear();
            }
            _ = cluster.link.reconnected.notified() => {
                // After a (re)connect: say what is live now, and ask for the routes missed.
                let queued = cluster.take_queued_us();
                cluster.pending_then_snapshot(&mut rx, &mut batch);
                batch.push(Event::SyncRequest);
                send(&shared, &cluster, &client, &subject, &batch, queued).await;
                batch.clear();
            }
        }
    }
}

async fn receiver(shared: Arc<Shared>, cluster: Arc<Cluster>, client: async_nats::Client) {
    let subscribe = async |subject: String| loop {
        match client.subscribe(subject.clone()).await {
            Ok(s) => return s,
            Err(e) => {
                tracing::warn!(error = %e, %subject, "cluster: subscribe failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let events = subscribe(events_subject(&cluster.config.name)).await;
    let direct = subscribe(direct_subject(&cluster.config.name, cluster.replica)).await;
    let mut messages = futures_util::stream::select(events, direct);
    let mut tick = tokio::time::interval(EXPIRE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            m = messages.next() => {
                let Some(m) = m else { return };
                if let Some(asker) = handle(&shared, &cluster, &m.payload, m.headers.as_ref()) {
                    answer_sync(&shared, &cluster, &client, asker).await;
                }
            }
            _ = tick.tick() => expire(&shared, &cluster),
        }
    }
}

fn expire(shared: &Shared, cluster: &Cluster) {
    let now = cluster.now_ms();
    let mut peers = cluster.peers.lock();
    let before = peers.stats();
    let n = {
        let mut session = shared.session.lock();
        peers.expire(&mut session, now)
    };
    if n > 0 {
        let after = peers.stats();
        let m = &shared.metrics.cluster;
        m.expired_peers
            .inc_by(after.expired_peers - before.expired_peers);
        m.expired_requests
            .inc_by(after.expired_requests - before.expired_requests);
        tracing::warn!(
            peers = n,
            requests = after.expired_requests - before.expired_requests,
            "cluster: peer lease expired; its charges returned"
        );
    }
}

/// Applies one message; returns the asking replica when it asked for a warm-up answer.
fn handle(
    shared: &Shared,
    cluster: &Cluster,
    payload: &[u8],
    headers: Option<&async_nats::HeaderMap>,
) -> Option<u64> {
    let m = &shared.metrics.cluster;
    let arrived_us = unix_us();
    let msg = match wire::decode(payload) {
        Ok(msg) => msg,
        Err(e) => {
            m.decode_errors.inc();
            tracing::debug!(error = %e, "cluster: undecodable message skipped");
            return None;
        }
    };
    if msg.replica == cluster.replica {
        return None;
    }
    m.messages_received.inc();
    observe_delivery(m, headers, arrived_us);
    let all = shared.pods.all();
    let pods: FxHashMap<u64, PodId> = all.iter().map(|p| (wire::pod_key(&p.url), p.id)).collect();
    let classes: FxHashMap<u64, Arc<str>> = all
        .iter()
        .map(|p| (wire::pod_key(&p.url), p.predictor_class()))
        .collect();
    let mut samples = 0u64;
    let mut peers = cluster.peers.lock();
    if !peers.accept(msg.replica, msg.seq, cluster.now_ms()) {
        m.duplicates.inc();
        return None;
    }
    let before = peers.stats();
    let mut unknown = 0u64;
    let mut index_blocks = 0u64;
    let mut asked = None;
    let mut session = shared.session.lock();
    for e in &msg.events {
        let r = msg.replica;
        match e {
            Event::Route {
                request,
                pod,
                input_tokens,
                prefill_tokens,
                blocks,
            } => match pods.get(pod) {
                Some(&pod) => peers.apply(
                    &mut session,
                    r,
                    PeerEvent::Route {
                        request: *request,
                        pod,
                        input_tokens: *input_tokens,
                        prefill_tokens: *prefill_tokens,
                        blocks,
                    },
                ),
                None => unknown += 1,
            },
            Event::FirstToken { request } => {
                peers.apply(&mut session, r, PeerEvent::FirstToken { request: *request })
            }
            Event::Tokens { request, tokens } => peers.apply(
                &mut session,
                r,
                PeerEvent::Tokens {
                    request: *request,
                    tokens: *tokens,
                },
            ),
            Event::Finish { request } => {
                peers.apply(&mut session, r, PeerEvent::Finish { request: *request })
            }
            Event::Snapshot {
                next_request,
                complete,
                live,
            } => {
                let mut entries = Vec::with_capacity(live.len());
                for i in live {
                    match pods.get(&i.pod) {
                        Some(&pod) => entries.push(SnapshotEntry {
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
                        None => unknown += 1,
                    }
                }
                peers.reconcile(&mut session, r, *next_request, &entries, *complete);
            }
            Event::SyncRequest => asked = Some(r),
            Event::Index { pod, blocks } => match pods.get(pod) {
                Some(&pod) => {
                    // The routed index's contents, not a route: nothing becomes pending.
                    let index = &mut session.index_mut().routed;
                    for b in blocks {
                        index.record_routed(pod, std::slice::from_ref(b));
                    }
                    index_blocks += blocks.len() as u64;
                }
                None => unknown += 1,
            },
            Event::Bye => {
                peers.forget(&mut session, r);
                tracing::info!(replica = %format_args!("{r:016x}"), "cluster: peer left");
            }
            Event::Session { pod, key } => match pods.get(pod) {
                Some(&pod) => session.record_session(*key, pod),
                None => unknown += 1,
            },
            Event::Sample { .. } if !cluster.config.share_samples => {}
            Event::Sample { pod, sample } => match classes.get(pod) {
                Some(class) => {
                    session.learn(class, sample);
                    samples += 1;
                }
                None => unknown += 1,
            },
        }
    }
    drop(session);
    let after = peers.stats();
    m.events_applied.inc_by(after.applied - before.applied);
    m.repairs.inc_by(after.repairs - before.repairs);
    m.unknown_pod.inc_by(unknown);
    m.index_blocks_received.inc_by(index_blocks);
    m.samples_applied.inc_by(samples);
    asked
}

/// Answers a warm-up request: this replica's routed index, per pod, oldest first.
async fn answer_sync(shared: &Shared, cluster: &Cluster, client: &async_nats::Client, asker: u64) {
    let subject = direct_subject(&cluster.config.name, asker);
    for pod in shared.pods.all().iter() {
        let blocks = shared
            .session
            .lock()
            .index()
            .routed
            .pod_blocks_oldest_first(pod.id, MAX_INDEX_BLOCKS_PER_POD);
        let key = wire::pod_key(&pod.url);
        for chunk in blocks.chunks(INDEX_CHUNK_BLOCKS) {
            let e = Event::Index {
                pod: key,
                blocks: chunk.to_vec(),
            };
            send(
                shared,
                cluster,
                client,
                &subject,
                std::slice::from_ref(&e),
                unix_us(),
            )
            .await;
        }
    }
}

/// Says goodbye (the peers release this replica's charges at once); best effort, bounded by
/// `wait`.
pub async fn leave(shared: &Shared, wait: Duration) {
    let Some(cluster) = Cluster::of(shared) else {
        return;
    };
    let _ = tokio::time::timeout(wait, cluster.queue.send(Event::Bye)).await;
    // Let the publisher put it on the wire.
    tokio::time::sleep(Duration::from_millis(20)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_core::config::RouterConfig;
    use kvgate_core::policy::PolicyKind;
    use kvgate_core::predictor::PredictorConfig;
    use kvgate_core::{InFlight, RouterSession};
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    fn cluster() -> (Cluster, mpsc::Receiver<Event>) {
        let (tx, rx) = mpsc::channel(QUEUE_EVENTS);
        let c = Cluster {
            config: ClusterConfig {
                url: "nats://127.0.0.1:1".into(),
                name: "t".into(),
                lease: Duration::from_millis(DEFAULT_LEASE_MS),
                share_samples: true,
            },
            replica: 1,
            next_request: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            queue: tx,
            oldest_queued_us: AtomicU64::new(0),
            live: Mutex::new(FxHashMap::default()),
            peers: Mutex::new(PeerBook::default()),
            link: Arc::new(Link {
                connected: AtomicBool::new(false),
                down_since: Mutex::new(None),
                connects: AtomicU64::new(0),
                reconnected: tokio::sync::Notify::new(),
            }),
            epoch: Instant::now(),
        };
        (c, rx)
    }

    /// The text exposition of one histogram's `_count` and `_sum`.
    fn count_and_sum(h: &Histogram) -> (f64, f64) {
        let mut r = Registry::default();
        r.register("d", "", h.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().parse::<f64>().unwrap())
                .unwrap()
        };
        (value("d_count "), value("d_sum "))
    }

    #[test]
    fn the_delivery_delay_is_read_from_the_stamp_and_skew_counts_as_zero() {
        let m = ClusterMetrics::default();
        let stamped = |us: &str| {
            let mut h = async_nats::HeaderMap::new();
            h.insert(QUEUED_HEADER, us);
            h
        };
        observe_delivery(&m, Some(&stamped("1000000")), 1_002_500);
        assert_eq!(count_and_sum(&m.delivery_seconds.0), (1.0, 0.0025));
        // A stamp from a clock ahead of this one: zero, not negative.
        observe_delivery(&m, Some(&stamped("2000000")), 1_000_000);
        // No header (an older replica) or a garbled one: not timed.
        observe_delivery(&m, None, 1_000_000);
        observe_delivery(&m, Some(&stamped("soon")), 1_000_000);
        assert_eq!(count_and_sum(&m.delivery_seconds.0), (2.0, 0.0025));
    }

    #[tokio::test]
    async fn a_batch_is_stamped_with_its_oldest_events_queue_time() {
        let (c, _rx) = cluster();
        let shared = Shared::new(
            crate::config::GatewayConfig::resolve(&crate::config::ServeArgs::default(), None)
                .unwrap(),
        );
        let before = unix_us();
        c.route_event(&shared, 7, &[], 100, 100);
        std::thread::sleep(Duration::from_millis(5));
        c.route_event(&shared, 7, &[], 100, 100);
        let stamp = c.take_queued_us();
        assert!(
            stamp >= before && stamp < before + 5_000,
            "{stamp} vs {before}"
        );
        // Nothing queued since: the next batch (a snapshot) is stamped now.
        assert!(c.take_queued_us() >= before + 5_000);
    }

    /// Applies `events` (as a peer would receive them, in order) to a fresh session.
    fn apply(events: &[Event]) -> RouterSession {
        let mut s = RouterSession::new(
            RouterConfig::default(),
            PolicyKind::AffinityGate,
            PredictorConfig::default(),
            1,
        );
        let mut book = PeerBook::default();
        assert!(book.accept(1, 0, 0));
        let pod = PodId(0);
        for e in events {
            match e {
                Event::Route {
                    request,
                    input_tokens,
                    prefill_tokens,
                    blocks,
                    ..
                } => book.apply(
                    &mut s,
                    1,
                    PeerEvent::Route {
                        request: *request,
                        pod,
                        input_tokens: *input_tokens,
                        prefill_tokens: *prefill_tokens,
                        blocks,
                    },
                ),
                Event::FirstToken { request } => {
                    book.apply(&mut s, 1, PeerEvent::FirstToken { request: *request })
                }
                Event::Tokens { request, tokens } => book.apply(
                    &mut s,
                    1,
                    PeerEvent::Tokens {
                        request: *request,
                        tokens: *tokens,
                    },
                ),
                Event::Finish { request } => {
                    book.apply(&mut s, 1, PeerEvent::Finish { request: *request })
                }
                Event::Snapshot {
                    next_request,
                    complete,
                    live,
                } => {
                    let entries: Vec<_> = live
                        .iter()
                        .map(|i| SnapshotEntry {
                            request: i.request,
                            pod,
                            input_tokens: i.input_tokens,
                            prefill_tokens: i.prefill_tokens,
                            first_token: i.first_token,
                            decode_tokens: i.decode_tokens,
                        })
                        .collect();
                    book.reconcile(&mut s, 1, *next_request, &entries, *complete);
                }
                _ => {}
            }
        }
        s
    }

    #[tokio::test]
    async fn a_snapshot_goes_out_after_the_queued_events_it_reflects_so_peers_count_them_once() {
        let shared = Shared::new(
            crate::config::GatewayConfig::resolve(&crate::config::ServeArgs::default(), None)
                .unwrap(),
        );
        let (c, mut rx) = cluster();
        // Routed, first token (100 + 1 decode tokens), 32 more: all still queued when the
        // snapshot tick comes.
        let r = c.route_event(&shared, 7, &[11, 12, 13], 100, 60);
        c.first_token(&shared, r, 101, None);
        c.tokens(&shared, r, 32);
        let mut out = Vec::new();
        c.pending_then_snapshot(&mut rx, &mut out);
        assert_eq!(out.len(), 4);
        assert!(matches!(out[3], Event::Snapshot { .. }), "snapshot last");
        let s = apply(&out);
        assert_eq!(
            s.in_flight(PodId(0)),
            InFlight {
                requests: 1,
                prefill_tokens: 0,
                decode_tokens: 133
            },
            "decode tokens counted once"
        );
        assert_eq!(
            s.index().routed.pod_blocks(PodId(0)),
            3,
            "the route's blocks learnt"
        );
        // Nothing left behind: later events follow the snapshot.
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_peers_training_sample_teaches_this_replicas_predictor_unless_sharing_is_off() {
        for share in [true, false] {
            let shared = Shared::new(
                crate::config::GatewayConfig::resolve(&crate::config::ServeArgs::default(), None)
                    .unwrap(),
            );
            shared.pods.replace(
                &[crate::pods::PodEntry::new("http://127.0.0.1:9", "default")],
                1000,
            );
            let (mut c, mut rx) = cluster();
            c.config.share_samples = share;
            let key = wire::pod_key(&shared.pods.all()[0].url);
            let sample = TrainingSample {
                features: kvgate_core::predictor::Features {
                    input_tokens: 100.0,
                    kv_capacity_tokens: 100_000.0,
                    ..Default::default()
                },
                ttft_ms: Some(50.0),
                tpot_ms: Some(5.0),
            };
            let msg = wire::Message {
                replica: 2,
                seq: 0,
                events: vec![
                    Event::Sample { pod: key, sample },
                    Event::Sample {
                        pod: wire::pod_key("http://elsewhere:1"),
                        sample,
                    },
                ],
            };
            handle(&shared, &c, &wire::encode(&msg), None);
            let learnt = shared.session.lock().predictor().accuracy().samples;
            assert_eq!(learnt, u64::from(share), "share_samples = {share}");
            assert_eq!(
                shared.metrics.cluster.samples_applied.get(),
                u64::from(share)
            );
            // A local request that completed sends its sample after its finish.
            let r = c.route_event(&shared, key, &[], 100, 100);
            c.finish(&shared, r, Some(sample));
            let mut out = Vec::new();
            while let Ok(e) = rx.try_recv() {
                out.push(e);
            }
            assert!(matches!(out[1], Event::Finish { .. }));
            assert_eq!(out.len(), 2 + usize::from(share), "{out:?}");
            if share {
                assert_eq!(out[2], Event::Sample { pod: key, sample });
            }
            // A TTFT learnt at the first token goes out right after the first token; a first
            // token without one sends nothing more.
            let ttft = TrainingSample {
                tpot_ms: None,
                ..sample
            };
            let r = c.route_event(&shared, key, &[], 100, 100);
            c.first_token(&shared, r, 101, Some(ttft));
            let r2 = c.route_event(&shared, key, &[], 100, 100);
            c.first_token(&shared, r2, 101, None);
            let mut out = Vec::new();
            while let Ok(e) = rx.try_recv() {
                out.push(e);
            }
            assert!(matches!(out[1], Event::FirstToken { request } if request == r));
            assert_eq!(out.len(), 4 + usize::from(share), "{out:?}");
            if share {
                assert_eq!(
                    out[2],
                    Event::Sample {
                        pod: key,
                        sample: ttft
                    }
                );
            }
        }
    }
}
