//! Active-active gateway replicas (`kvgate serve --cluster nats://HOST:PORT --cluster-name
//! NAME`): every replica publishes its requests' routing transitions over NATS and applies the
//! others', so each replica's in-flight ledger and routed index hold the whole fleet's work.
//!
//! # What runs where
//!
//! The protocol is the core's sans-IO [`ReplicaMachine`]
//! (`kvgate_core::session::replica`, whose docs give the algorithm and every parameter):
//! request ids, sequence numbers, the live table its snapshots list, decode tokens in steps of
//! 32, the snapshot every second and after each (re)connect, lease expiry, dedup, applying the
//! peers' events through the core's `PeerBook`, shared training samples, warm-up answers. The
//! simulator's replicas (`kvgate sim --replicas R --share`) run the same machine. This module
//! is its driver, and only does I/O:
//!
//! - **Publishing.** [`crate::lifecycle::TicketGuard`] reports its request's transitions here
//!   ([`ReplicaLink`]); each goes into the machine under its lock (held for microseconds) and
//!   wakes the publisher task, so routing never waits on the network. The publisher takes the
//!   machine's messages ([`ReplicaMachine::poll_transmit`]: up to [`MAX_MESSAGE_EVENTS`]
//!   events or [`MAX_MESSAGE_BYTES`]), encodes them ([`wire`]) and publishes them on
//!   `kvgate.<NAME>.events`, stamped with when their oldest event was queued
//!   ([`QUEUED_HEADER`]). It also runs the machine's timer
//!   ([`ReplicaMachine::poll_timeout`] / [`ReplicaMachine::handle_timeout`]: snapshots, lease
//!   expiry). While NATS is unreachable the waiting events are dropped
//!   (`kvgate_cluster_events_dropped_total{reason="disconnected"}`); a full outbox drops
//!   events too (`reason="queue_full"`); the snapshots repair both.
//! - **Receiving.** The receiver task decodes each message (garbage is counted and skipped),
//!   skips its own (NATS echoes them), measures the delivery delay, and hands the rest to
//!   [`ReplicaMachine::handle_message`] with this replica's pods by key ([`wire::pod_key`]: the
//!   xxh3 of the pod's URL), then counts what it did (`kvgate_cluster_*`). A peer asking for a
//!   warm-up gets this replica's routed index, pod by pod
//!   ([`ReplicaMachine::index_answer`]), on `kvgate.<NAME>.to.<replica id>`.
//! - **Decision seed.** A replica's session draws from its configured seed mixed with its
//!   replica id (`decision_seed`), so replicas from one config do not explore in lockstep.
//!
//! NATS core (no JetStream) is used: at-most-once, ordered per publisher. The failure
//! semantics follow from the above: NATS down → each replica routes on its own state (nothing
//! waits on NATS), its peers' charges expire after the lease (`cluster_lease_ms`, default
//! 3,000), and `kvgate_cluster_divergence_seconds` (seconds since the disconnect, or since the
//! stalest peer was heard from) rises; after the reconnect the snapshots and the index sync
//! converge. A replica that shuts down says goodbye ([`leave`]) and is released at once.
//!
//! # Bounds
//!
//! The machine's ([`kvgate_core::session::replica::ReplicaConfig`]: ≤ 8,192 waiting events,
//! ≤ 65,536 own live requests, the peers' `PeerConfig` bounds). A message is at most
//! [`MAX_MESSAGE_BYTES`] unless one event alone is larger. Bandwidth: see [`wire`].

pub mod wire;

pub use crate::config::{ClusterConfig, DEFAULT_CLUSTER_NAME, DEFAULT_LEASE_MS, valid_name};
use crate::handles::session::{ReplicaLink, SessionHandle};
pub use crate::metrics::{ClusterMetrics, ClusterReasonLabel, DeliveryHistogram};
use crate::pods::Pod;
use crate::pods::PodTable;
use crate::state::Shared;
use bytes::Bytes;
use futures_util::StreamExt;
use kvgate_core::session::peers::{PeerConfig, PeerStats};
use kvgate_core::session::replica::{
    Expired, PodKeys, ReplicaConfig, ReplicaMachine, ReplicaMessage,
};
use kvgate_core::{BlockHash, PodId, TrainingSample};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// Largest message the publisher builds (NATS's default `max_payload` is 1 MiB).
pub const MAX_MESSAGE_BYTES: usize = 256 << 10;
/// Most events the publisher puts in one message.
pub const MAX_MESSAGE_EVENTS: usize = 4_096;

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
    /// The replica protocol; locked before the session, never the other way.
    machine: Mutex<ReplicaMachine>,
    /// Wakes the publisher: the machine has events to send.
    wake: tokio::sync::Notify,
    /// Wall-clock µs at which the oldest event not yet taken by the publisher was queued (0:
    /// none); the publisher takes it with a batch and sends it in the message's
    /// [`QUEUED_HEADER`], so peers measure the delivery delay.
    oldest_queued_us: AtomicU64,
    link: Arc<Link>,
    /// `kvgate_cluster_*`, counted into by every transition and task.
    metrics: ClusterMetrics,
    /// The machine's clock: `now_ms` is milliseconds since this instant.
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
    fn routed(
        &self,
        pod: &Pod,
        blocks: &[BlockHash],
        input_tokens: u32,
        prefill_tokens: u64,
    ) -> u64 {
        let key = wire::pod_key(&pod.url);
        self.outbound(|m| m.route(key, blocks, input_tokens, prefill_tokens))
    }

    /// The request's first token; with a training sample (its TTFT, learnt at the first
    /// token), that goes out too, for the other replicas' predictors.
    fn first_token(&self, request: u64, decode_tokens: u64, sample: Option<TrainingSample>) {
        self.outbound(|m| m.first_token(request, decode_tokens, sample));
    }

    /// `tokens` more decode tokens (the machine reports them in steps of 32).
    fn tokens(&self, request: u64, tokens: u64) {
        self.outbound(|m| m.tokens(request, tokens));
    }

    /// The request ended; with a training sample (it completed normally), that goes out
    /// too, for the other replicas' predictors.
    fn finish(&self, request: u64, sample: Option<TrainingSample>) {
        self.outbound(|m| m.finish(request, sample));
    }

    /// Refreshes the `kvgate_cluster_*` gauges.
    fn refresh_gauges(&self, m: &ClusterMetrics) {
        let stats = self.peer_stats();
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

/// This replica's pods by their key on the wire ([`wire::pod_key`]), for the machine.
struct GatewayPods {
    pods: FxHashMap<u64, PodId>,
    classes: FxHashMap<u64, Arc<str>>,
}

impl GatewayPods {
    fn of(pods: &PodTable) -> Self {
        let all = pods.all();
        GatewayPods {
            pods: all.iter().map(|p| (wire::pod_key(&p.url), p.id)).collect(),
            classes: all
                .iter()
                .map(|p| (wire::pod_key(&p.url), p.predictor_class()))
                .collect(),
        }
    }
}

impl PodKeys for GatewayPods {
    fn pod(&self, key: u64) -> Option<PodId> {
        self.pods.get(&key).copied()
    }

    fn class(&self, key: u64) -> Option<&str> {
        self.classes.get(&key).map(|c| &**c)
    }
}

impl Cluster {
    /// Replica `replica`'s membership, its machine started now.
    fn new(config: ClusterConfig, replica: u64, metrics: ClusterMetrics) -> Cluster {
        let machine = ReplicaMachine::new(
            replica,
            ReplicaConfig {
                share_samples: config.share_samples,
                peers: PeerConfig {
                    lease_ms: config.lease.as_millis() as u64,
                    ..PeerConfig::default()
                },
                ..ReplicaConfig::default()
            },
            0,
        );
        Cluster {
            config,
            replica,
            machine: Mutex::new(machine),
            wake: tokio::sync::Notify::new(),
            oldest_queued_us: AtomicU64::new(0),
            link: Arc::new(Link {
                connected: AtomicBool::new(false),
                down_since: Mutex::new(Some(Instant::now())),
                connects: AtomicU64::new(0),
                reconnected: tokio::sync::Notify::new(),
            }),
            epoch: Instant::now(),
            metrics,
        }
    }

    /// This replica's membership, when `--cluster` started one (the session's observer,
    /// [`SessionHandle::cluster`]).
    pub fn of(session: &SessionHandle) -> Option<Arc<Cluster>> {
        session.cluster().cloned()?.into_any().downcast().ok()
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn is_connected(&self) -> bool {
        self.link.connected.load(Ordering::Acquire)
    }

    /// The peers' counters (with the gauges: peers known, their requests charged here).
    pub fn peer_stats(&self) -> PeerStats {
        self.machine.lock().peer_stats()
    }

    /// Runs one of this replica's own transitions in the machine; counts what a full outbox
    /// dropped, stamps the queue time of the first event since the publisher's last take, and
    /// wakes the publisher.
    fn outbound<T>(&self, f: impl FnOnce(&mut ReplicaMachine) -> T) -> T {
        let mut m = self.machine.lock();
        let (pending, dropped) = (m.pending_events(), m.stats().outbox_dropped);
        let out = f(&mut m);
        let (queued, dropped) = (
            m.pending_events() > pending,
            m.stats().outbox_dropped - dropped,
        );
        drop(m);
        if dropped > 0 {
            self.metrics
                .events_dropped
                .get_or_create(&ClusterReasonLabel {
                    reason: "queue_full",
                })
                .inc_by(dropped);
        }
        if queued {
            // Only the first event after a take reads the clock.
            if self.oldest_queued_us.load(Ordering::Relaxed) == 0 {
                let _ = self.oldest_queued_us.compare_exchange(
                    0,
                    unix_us(),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            self.wake.notify_one();
        }
        out
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
        self.machine
            .lock()
            .peers()
            .staleness_ms(now)
            .map_or(0.0, |ms| ms as f64 / 1000.0)
    }

    /// When the oldest event of the batch being taken now was queued (now if none is pending);
    /// called before the batch is taken, so an event queued meanwhile makes the next batch's
    /// stamp early, never late (the delay is over-, not under-stated).
    fn take_queued_us(&self) -> u64 {
        match self.oldest_queued_us.swap(0, Ordering::Relaxed) {
            0 => unix_us(),
            t => t,
        }
    }

    /// The machine's next message, encoded (at most [`MAX_MESSAGE_EVENTS`] events and, past
    /// the first, [`MAX_MESSAGE_BYTES`]); `None` when nothing waits.
    fn next_message(&self) -> Option<(Vec<u8>, usize)> {
        let mut body = Vec::new();
        let mut n = 0;
        let msg = self.machine.lock().poll_transmit(|e| {
            if n >= MAX_MESSAGE_EVENTS || (n > 0 && body.len() >= MAX_MESSAGE_BYTES) {
                return false;
            }
            wire::encode_event(&mut body, e);
            n += 1;
            true
        })?;
        Some((framed(&msg, &body), msg.events.len()))
    }
}

/// `msg`'s header followed by its already encoded events.
fn framed(msg: &ReplicaMessage, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 24);
    wire::encode_header(&mut out, msg.replica, msg.seq, msg.events.len());
    out.extend_from_slice(body);
    out
}

/// A replica's membership before it runs: the [`Cluster`] (given to the gateway's state at
/// start, [`crate::state::StartParts::cluster`]), for the tasks [`start`] spawns.
pub struct Prepared {
    pub cluster: Arc<Cluster>,
}

/// This replica's [`Cluster`], not connected yet.
pub fn prepare(config: ClusterConfig, metrics: &ClusterMetrics) -> Prepared {
    Prepared {
        cluster: Arc::new(Cluster::new(config, random_replica_id(), metrics.clone())),
    }
}

/// Connects (in the background: the gateway starts whether or not NATS is up) and starts the
/// publisher and receiver tasks of `prepared`, which `shared` holds as its cluster link.
pub async fn start(shared: &Arc<Shared>, prepared: Prepared) -> Vec<JoinHandle<()>> {
    let Prepared { cluster } = prepared;
    let replica = cluster.replica;
    // Before anything routes, and whether or not NATS is usable.
    let seed = decision_seed(shared.config().seed, replica);
    shared.session.reseed(seed);
    let link = cluster.link.clone();
    let cb_link = link.clone();
    let cb_metrics = cluster.metrics.clone();
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
            let metrics = cb_metrics.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        link.connected.store(true, Ordering::Release);
                        *link.down_since.lock() = None;
                        if link.connects.fetch_add(1, Ordering::AcqRel) > 0 {
                            metrics.reconnects.inc();
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
        tokio::spawn(publisher(shared.clone(), cluster.clone(), client.clone())),
        tokio::spawn(receiver(shared.clone(), cluster, client)),
    ]
}

fn count_dropped(m: &ClusterMetrics, events: u64) {
    m.events_dropped
        .get_or_create(&ClusterReasonLabel {
            reason: "disconnected",
        })
        .inc_by(events);
}

/// Publishes one encoded message of `events` events on `subject`; dropped and counted while
/// disconnected.
async fn publish(
    m: &ClusterMetrics,
    client: &async_nats::Client,
    subject: &str,
    bytes: Vec<u8>,
    events: usize,
    queued_us: u64,
) {
    let len = bytes.len();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(QUEUED_HEADER, queued_us.to_string().as_str());
    match client
        .publish_with_headers(subject.to_string(), headers, Bytes::from(bytes))
        .await
    {
        Ok(()) => {
            m.messages_sent.inc();
            m.bytes_sent.inc_by(len as u64);
        }
        Err(e) => {
            count_dropped(m, events as u64);
            tracing::debug!(error = %e, "cluster: publish failed");
        }
    }
}

/// Sends every message the machine has waiting (or, while disconnected, drops and counts
/// their events).
async fn flush(cluster: &Cluster, client: &async_nats::Client, subject: &str) {
    let queued = cluster.take_queued_us();
    loop {
        if !cluster.is_connected() {
            let n = cluster.machine.lock().discard_pending();
            if n > 0 {
                count_dropped(&cluster.metrics, n as u64);
            }
            return;
        }
        let Some((bytes, events)) = cluster.next_message() else {
            return;
        };
        publish(&cluster.metrics, client, subject, bytes, events, queued).await;
    }
}

/// Logs and counts what a timeout's lease expiry did.
fn report_expired(m: &ClusterMetrics, expired: Expired) {
    if expired.peers == 0 {
        return;
    }
    m.expired_peers.inc_by(expired.peers);
    m.expired_requests.inc_by(expired.requests);
    tracing::warn!(
        peers = expired.peers,
        requests = expired.requests,
        "cluster: peer lease expired; its charges returned"
    );
}

/// Drives the machine's clock and sends what it queues: woken by a transition, the machine's
/// timeout, or a (re)connect.
async fn publisher(shared: Arc<Shared>, cluster: Arc<Cluster>, client: async_nats::Client) {
    let subject = events_subject(&cluster.config.name);
    loop {
        let due = cluster.machine.lock().poll_timeout();
        let at = tokio::time::Instant::from_std(cluster.epoch + Duration::from_millis(due));
        tokio::select! {
            _ = cluster.wake.notified() => {}
            _ = tokio::time::sleep_until(at) => {
                let now = cluster.now_ms();
                let expired = {
                    let mut m = cluster.machine.lock();
                    let mut session = shared.session.lock();
                    m.handle_timeout(now, &mut session)
                };
                report_expired(&cluster.metrics, expired);
            }
            // After a (re)connect: say what is live now, and ask for the routes missed.
            _ = cluster.link.reconnected.notified() => cluster.machine.lock().reconnected(),
        }
        flush(&cluster, &client, &subject).await;
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
    while let Some(m) = messages.next().await {
        if let Some(asker) = handle(
            &shared.session,
            &shared.fleet.pods,
            &cluster,
            &m.payload,
            m.headers.as_ref(),
        ) {
            answer_sync(
                &shared.session,
                &shared.fleet.pods,
                &cluster,
                &client,
                asker,
            )
            .await;
        }
    }
}

/// Applies one message; returns the asking replica when it asked for a warm-up answer.
fn handle(
    session: &SessionHandle,
    pods: &PodTable,
    cluster: &Cluster,
    payload: &[u8],
    headers: Option<&async_nats::HeaderMap>,
) -> Option<u64> {
    let m = &cluster.metrics;
    let arrived_us = unix_us();
    let msg = match wire::decode_counting_retired(payload) {
        Ok((msg, retired)) => {
            m.retired_events.inc_by(retired);
            msg
        }
        Err(e) => {
            m.decode_errors.inc();
            tracing::debug!(error = %e, "cluster: undecodable message skipped");
            return None;
        }
    };
    // NATS echoes this replica's own messages: skipped before any lock is taken.
    if msg.replica == cluster.replica {
        return None;
    }
    m.messages_received.inc();
    observe_delivery(m, headers, arrived_us);
    let pods = GatewayPods::of(pods);
    let got = {
        let mut machine = cluster.machine.lock();
        let mut session = session.lock();
        machine.handle_message(cluster.now_ms(), &mut session, &pods, &msg)
    };
    if got.duplicate {
        m.duplicates.inc();
        return None;
    }
    m.events_applied.inc_by(got.applied);
    m.repairs.inc_by(got.repairs);
    m.unknown_pod.inc_by(got.unknown_pod);
    m.index_blocks_received.inc_by(got.index_blocks);
    m.samples_applied.inc_by(got.samples);
    if got.left {
        tracing::info!(replica = %format_args!("{:016x}", msg.replica), "cluster: peer left");
    }
    got.sync_asked
}

/// Answers a warm-up request: this replica's routed index, per pod, oldest first.
async fn answer_sync(
    session: &SessionHandle,
    pods: &PodTable,
    cluster: &Cluster,
    client: &async_nats::Client,
    asker: u64,
) {
    let subject = direct_subject(&cluster.config.name, asker);
    for pod in pods.all().iter() {
        let messages = {
            let mut m = cluster.machine.lock();
            let session = session.lock();
            m.index_answer(&session, pod.id, wire::pod_key(&pod.url))
        };
        for msg in messages {
            let events = msg.events.len();
            if !cluster.is_connected() {
                count_dropped(&cluster.metrics, events as u64);
                continue;
            }
            publish(
                &cluster.metrics,
                client,
                &subject,
                wire::encode(&msg),
                events,
                unix_us(),
            )
            .await;
        }
    }
}

/// Says goodbye (the peers release this replica's charges at once); best effort, bounded by
/// `wait`.
pub async fn leave(session: &SessionHandle, wait: Duration) {
    let Some(cluster) = Cluster::of(session) else {
        return;
    };
    cluster.machine.lock().leave();
    cluster.wake.notify_one();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let pending = cluster.machine.lock().pending_events();
        if pending == 0 || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Let the client put it on the wire.
    tokio::time::sleep(Duration::from_millis(20)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;
    use wire::Event;

    fn cluster(share_samples: bool) -> Cluster {
        cluster_counting_into(share_samples, &ClusterMetrics::default())
    }

    fn cluster_counting_into(share_samples: bool, metrics: &ClusterMetrics) -> Cluster {
        Cluster::new(
            ClusterConfig {
                url: "nats://127.0.0.1:1".into(),
                name: "t".into(),
                lease: Duration::from_millis(DEFAULT_LEASE_MS),
                share_samples,
            },
            1,
            metrics.clone(),
        )
    }

    /// Every event the machine has waiting, in order.
    fn sent(c: &Cluster) -> Vec<Event> {
        let mut m = c.machine.lock();
        std::iter::from_fn(|| m.poll_transmit(|_| true))
            .flat_map(|msg| msg.events)
            .collect()
    }

    fn shared() -> Arc<Shared> {
        Shared::new(
            crate::config::GatewayConfig::from_args(&crate::config::ServeArgs::default()).unwrap(),
        )
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
        let c = cluster(true);
        let before = unix_us();
        c.outbound(|m| m.route(7, &[], 100, 100));
        std::thread::sleep(Duration::from_millis(5));
        c.outbound(|m| m.route(7, &[], 100, 100));
        let stamp = c.take_queued_us();
        assert!(
            stamp >= before && stamp < before + 5_000,
            "{stamp} vs {before}"
        );
        // Nothing queued since: the next batch (a snapshot) is stamped now.
        assert!(c.take_queued_us() >= before + 5_000);
    }

    #[test]
    fn a_message_holds_at_most_its_event_count_and_byte_bound_and_numbers_follow() {
        let c = cluster(true);
        // Routes of 8,192 blocks: 64 KiB each, so the fourth passes the byte bound.
        let blocks: Vec<u64> = (0..8_192).collect();
        for _ in 0..6 {
            c.outbound(|m| m.route(7, &blocks, 100, 100));
        }
        for _ in 0..MAX_MESSAGE_EVENTS {
            c.outbound(|m| m.route(7, &[], 1, 1));
        }
        let mut sizes = Vec::new();
        while let Some((bytes, events)) = c.next_message() {
            let msg = wire::decode(&bytes).unwrap();
            assert_eq!(msg.events.len(), events);
            assert_eq!(msg.seq, sizes.len() as u64);
            sizes.push(events);
        }
        assert_eq!(sizes, [4, MAX_MESSAGE_EVENTS, 2]);
    }

    #[tokio::test]
    async fn a_peers_training_sample_teaches_this_replicas_predictor_unless_sharing_is_off() {
        for share in [true, false] {
            let shared = shared();
            shared.fleet.pods.replace(
                &[crate::pods::PodEntry::new("http://127.0.0.1:9", "default")],
                1000,
            );
            let c = cluster_counting_into(share, &shared.telemetry.metrics.cluster);
            let pod = shared.fleet.pods.all()[0].clone();
            let key = wire::pod_key(&pod.url);
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
            handle(
                &shared.session,
                &shared.fleet.pods,
                &c,
                &wire::encode(&msg),
                None,
            );
            let learnt = shared.session.lock().predictor().accuracy().samples;
            assert_eq!(learnt, u64::from(share), "share_samples = {share}");
            assert_eq!(
                shared.telemetry.metrics.cluster.samples_applied.get(),
                u64::from(share)
            );
            // A local request that completed sends its sample after its finish.
            let r = c.routed(&pod, &[], 100, 100);
            c.finish(r, Some(sample));
            let out = sent(&c);
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
            let r = c.routed(&pod, &[], 100, 100);
            c.first_token(r, 101, Some(ttft));
            let r2 = c.routed(&pod, &[], 100, 100);
            c.first_token(r2, 101, None);
            let out = sent(&c);
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
