//! The KV-event subscriber: one ZeroMQ SUB task per pod that publishes events
//! (`--pod URL,events=tcp://…,replay=tcp://…`, `--index engine`), feeding the core's
//! [`kvgate_core::index::engine::EngineIndex`] (DESIGN.md §4, §7; interfaces.md §2.2).
//!
//! - **Registration**: a pod joins the engine index once its model is known (the `model=`
//!   option, else the `model_name` label of its scraped metrics): [`on_scrape`]. Its task waits
//!   for that before subscribing.
//! - **Frames**: `[topic, seq (8 bytes BE), msgpack batch]`. Anything else, and payloads the
//!   core's decoder rejects, is counted in `kvgate_kv_events_rejected_total{pod}`, logged at
//!   debug, and skipped.
//! - **Subscribe**: connect (retried, backoff ≤ [`RECONNECT_BACKOFF`]), subscribe, then replay
//!   the pod's whole buffer (DEALER sends `[empty, start_seq BE]`, reads `[empty, topic, seq,
//!   payload]` — vLLM 0.32's framing; `[empty, seq, payload]` is accepted too — until the end
//!   marker `seq = −1`), so blocks the pod cached before kvgate subscribed are known.
//! - **Sequence**: the core's [`KvEventFollower`] (the same state machine the simulator runs)
//!   says what to do with each batch's `seq`; this task does the I/O. A jump forward is a gap
//!   (`kv_events_gaps_total`): the missing batches are replayed; if that fails or does not cover
//!   the gap (`kv_events_replay_failures_total`), the follower clears the pod's entries and marks
//!   it **stale**: the routed index stands in for it
//!   ([`kvgate_core::index::engine::HybridIndex`]) for [`STALE_REBUILD`], while new events
//!   rebuild its view. A live `seq` at or below the last live one means a new engine
//!   (`kv_events_restarts_total`): the pod's entries are cleared (its cache is empty), batches
//!   `0..seq` are replayed, and it stays live.
//! - **Pod down and back**: when the pod's scrapes fail and then succeed again, the task drops
//!   its socket, clears the pod (its engine most likely restarted), resubscribes and replays —
//!   within one health check ([`HEALTH_CHECK`], 250 ms) of the pod scraping healthy, not after
//!   ZeroMQ's own reconnect backoff.
//! - **Data-parallel servers** (`dp=N`): each engine is a pod of its own with its own SUB
//!   socket, follower and replay, on the server's endpoints with their port + rank (vLLM's
//!   rule); a batch whose `data_parallel_rank` is not the engine's is rejected.
//! - **Bounds**: one SUB socket and one task per pod (per engine of a DP server); replay reads at most
//!   [`MAX_REPLAY_BATCHES`] batches with [`REPLAY_TIMEOUT`] per message; payloads over the core's
//!   `MAX_BATCH_BYTES` are rejected before decoding.

use crate::config::GatewayConfig;
use crate::config::{IndexKind, PodEvents};
use crate::handles::session::SessionHandle;
use crate::metrics::Metrics;
use crate::pods::Pod;
use crate::pods::PodMetrics;
use crate::state::Shared;
use bytes::Bytes;
use kvgate_core::index::PrefixIndex;
use kvgate_core::index::follower::{BatchStep, GapOutcome, KvEventFollower};
use kvgate_core::index::kv_events_wire::decode_batch;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// How long a pod stays stale after an unrecoverable gap while new events rebuild its view.
pub const STALE_REBUILD: Duration = Duration::from_secs(30);
/// Longest wait for one replay message.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Most batches read from one replay (vLLM's `buffer_steps` default is 10,000).
pub const MAX_REPLAY_BATCHES: u64 = 100_000;
/// Replay end marker (`seq = −1`).
const END_SEQ: u64 = u64::MAX;
/// Longest wait between two connect attempts to a pod's PUB socket.
pub const RECONNECT_BACKOFF: Duration = Duration::from_secs(1);
/// How often the task looks at the pod's health while its stream is quiet.
const HEALTH_CHECK: Duration = Duration::from_millis(250);

/// The pod's events config, if it publishes events and the engine index is on. For engine r of
/// a data-parallel server: the server's endpoints with their port + r (vLLM's rule,
/// [`crate::config::rank_endpoint`]).
fn events_of(cfg: &GatewayConfig, pod: &Pod) -> Option<PodEvents> {
    if cfg.index != IndexKind::Engine {
        return None;
    }
    let mut events = cfg
        .pod_events
        .iter()
        .find(|e| e.url == pod.connect_url())
        .cloned()?;
    if let Some(rank) = pod.rank {
        events.endpoint = crate::config::rank_endpoint(&events.endpoint, rank)?;
        events.replay = match events.replay {
            Some(r) => Some(crate::config::rank_endpoint(&r, rank)?),
            None => None,
        };
    }
    Some(events)
}

/// The router's clock for timed state (the engine index's pending routes,
/// `kvgate_core::index::pending`; the session's prefixes still being computed): ms since the
/// first call, one clock for every pod.
pub fn clock_ms() -> f64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
}

/// After each scrape: moves the pending routes' clock (so they expire within a scrape interval
/// of their lifetime), and registers an event-publishing pod in the engine index once its model
/// is known.
pub fn on_scrape(session: &SessionHandle, cfg: &GatewayConfig, pod: &Pod, m: &PodMetrics) {
    let Some(events) = events_of(cfg, pod) else {
        return;
    };
    let now = clock_ms();
    session.engine_index(|engine| {
        engine.advance_clock(now);
        let Some(model) = events.model.or_else(|| m.model_name.clone()) else {
            return;
        };
        if engine.is_live(pod.id) || engine.is_stale(pod.id) {
            return;
        }
        engine.add_pod(pod.id, &model);
        let blocks = pod.snapshot().kv_blocks;
        engine.set_capacity(pod.id, blocks);
        tracing::info!(pod = %pod.url, %model, "engine index follows the pod's KV events");
    });
}

/// Starts the pod's subscriber task if it publishes events and `--index engine` is on.
pub fn spawn_for(shared: &Arc<Shared>, pod: &Arc<Pod>) -> Option<tokio::task::JoinHandle<()>> {
    let events = events_of(&shared.config(), pod)?;
    Some(tokio::spawn(subscribe_loop(
        shared.clone(),
        pod.clone(),
        events,
    )))
}

fn registered(session: &SessionHandle, pod: &Pod) -> bool {
    session.engine_index(|engine| engine.is_live(pod.id) || engine.is_stale(pod.id))
}

async fn subscribe_loop(shared: Arc<Shared>, pod: Arc<Pod>, events: PodEvents) {
    while !registered(&shared.session, &pod) {
        if pod.removed.load(Ordering::Relaxed) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut follower = Follower {
        session: &shared.session,
        metrics: &shared.telemetry.metrics,
        pod: &pod,
        replay: events.replay.as_deref(),
        sequence: KvEventFollower::new(pod.id, STALE_REBUILD.as_secs_f64() * 1e3),
        epoch: Instant::now(),
    };
    let mut first = true;
    loop {
        let Some(mut socket) = subscribe(&pod, &events.endpoint).await else {
            return;
        };
        if !first {
            // The pod was down: its engine most likely restarted with an empty cache.
            follower.restarted();
        }
        first = false;
        // Learn what the pod already holds (its replay buffer), then follow the live stream.
        follower.replay_buffer().await;
        if !follow(&mut follower, &mut socket).await {
            return;
        }
        tracing::info!(pod = %pod.url, "pod back after being down: resubscribing to its KV events");
    }
}

/// A connected, subscribed SUB socket (connect retried with a backoff of at most
/// [`RECONNECT_BACKOFF`]); None once the pod is removed.
async fn subscribe(pod: &Pod, endpoint: &str) -> Option<SubSocket> {
    let mut backoff = Duration::from_millis(100);
    loop {
        if pod.removed.load(Ordering::Relaxed) {
            return None;
        }
        let mut socket = SubSocket::new();
        match socket.connect(endpoint).await {
            Ok(()) => match socket.subscribe("").await {
                Ok(()) => {
                    tracing::info!(pod = %pod.url, %endpoint, "subscribed to KV events");
                    return Some(socket);
                }
                Err(e) => {
                    tracing::warn!(pod = %pod.url, error = %e, "KV events subscribe failed; retrying")
                }
            },
            Err(e) => {
                tracing::debug!(pod = %pod.url, %endpoint, error = %e, "KV events connect failed; retrying");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RECONNECT_BACKOFF);
    }
}

/// Follows the live stream until the pod is removed (false) or comes back after its scrapes
/// failed (true: the caller resubscribes, since the engine behind it is most likely new).
async fn follow(follower: &mut Follower<'_>, socket: &mut SubSocket) -> bool {
    let pod = follower.pod.clone();
    // An outage (healthy → unhealthy, counted by the pod) since we subscribed, and the pod
    // healthy again: resubscribe. A pod just registered and not yet marked healthy had none.
    let outages = pod.outages();
    loop {
        if pod.removed.load(Ordering::Relaxed) {
            return false;
        }
        if pod.outages() != outages && pod.healthy.load(Ordering::Relaxed) {
            return true;
        }
        let msg = match tokio::time::timeout(HEALTH_CHECK, socket.recv()).await {
            Err(_) => {
                follower.maybe_rebuilt();
                continue;
            }
            Ok(Err(e)) => {
                tracing::debug!(pod = %pod.url, error = %e, "KV events receive error");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Ok(Ok(msg)) => msg,
        };
        let frames = msg.into_vec();
        match parse_frames(&frames) {
            Some((seq, payload)) => follower.on_batch(seq, payload).await,
            None => follower.reject(&format!("{} frames", frames.len())),
        }
        follower.maybe_rebuilt();
    }
}

/// `[topic, seq, payload]` → (seq, payload).
fn parse_frames(frames: &[Bytes]) -> Option<(u64, &Bytes)> {
    let [_topic, seq, payload] = frames else {
        return None;
    };
    let seq = <[u8; 8]>::try_from(seq.as_ref()).ok()?;
    Some((u64::from_be_bytes(seq), payload))
}

/// One pod's subscription: the core's sequence follower and the I/O around it.
struct Follower<'a> {
    session: &'a SessionHandle,
    metrics: &'a Metrics,
    pod: &'a Arc<Pod>,
    replay: Option<&'a str>,
    sequence: KvEventFollower,
    /// Time zero of the follower's clock (ms since it).
    epoch: Instant,
}

impl Follower<'_> {
    fn now_ms(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1e3
    }

    fn reject(&self, why: &str) {
        self.metrics
            .kv_events_rejected
            .get_or_create(&self.pod.label())
            .inc();
        tracing::debug!(pod = %self.pod.url, why, "KV events message skipped");
    }

    fn count(
        &self,
        family: &prometheus_client::metrics::family::Family<
            crate::pods::PodLabel,
            prometheus_client::metrics::counter::Counter,
        >,
    ) {
        family.get_or_create(&self.pod.label()).inc();
    }

    fn apply(&self, payload: &[u8]) {
        match decode_batch(payload) {
            // A data-parallel engine's stream carries its rank; another rank's batch (a
            // mis-wired endpoint) would put its blocks on the wrong engine.
            Ok(batch)
                if self.pod.rank.is_some()
                    && batch.data_parallel_rank != self.pod.rank.map(i64::from) =>
            {
                self.reject(&format!(
                    "batch of data-parallel rank {:?} on rank {:?}'s stream",
                    batch.data_parallel_rank, self.pod.rank
                ));
            }
            Ok(batch) => {
                {
                    let now = clock_ms();
                    self.session.engine_index(|engine| {
                        engine.advance_clock(now);
                        for event in &batch.events {
                            engine.apply(self.pod.id, event);
                        }
                    });
                }
                self.count(&self.metrics.kv_events_batches);
                self.pod.last_kv_batch_unix_ms.store(
                    crate::decisions::unix_ms(),
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
            Err(e) => self.reject(&e.to_string()),
        }
    }

    async fn on_batch(&mut self, seq: u64, payload: &Bytes) {
        let now = self.now_ms();
        let sequence = &mut self.sequence;
        let step = self
            .session
            .engine_index(|engine| sequence.on_batch(seq, now, engine));
        match step {
            BatchStep::Skip => {
                tracing::debug!(pod = %self.pod.url, seq, "duplicate KV events batch skipped");
                return;
            }
            BatchStep::Apply { restarted: false } => {}
            BatchStep::Apply { restarted: true } => {
                self.count(&self.metrics.kv_events_restarts);
                tracing::info!(pod = %self.pod.url, "KV events restarted from 0: engine restarted, its entries cleared");
            }
            BatchStep::JoinedLate { to } => {
                // Joined late: learn what the pod already holds (partial if the buffer
                // rotated; blocks whose parents are gone are skipped by the index).
                if self.replay.is_some() {
                    let _ = self.fill(0, to).await;
                }
            }
            BatchStep::Restarted { to } => {
                self.count(&self.metrics.kv_events_restarts);
                tracing::info!(pod = %self.pod.url, seq, "KV events sequence went backwards: a new engine; its entries cleared, resyncing from 0");
                if self.replay.is_some() {
                    let _ = self.fill(0, to).await;
                }
            }
            BatchStep::Gap { from, to } => {
                self.count(&self.metrics.kv_events_gaps);
                let complete = self.fill(from, to).await;
                let now = self.now_ms();
                let sequence = &mut self.sequence;
                let outcome = self
                    .session
                    .engine_index(|engine| sequence.gap_result(complete, now, engine));
                if outcome == GapOutcome::Stale {
                    self.count(&self.metrics.kv_events_replay_failures);
                    tracing::warn!(pod = %self.pod.url, missing_from = from, missing_to = to, "KV events lost and not replayed: pod's engine index is stale, routed index stands in");
                }
            }
        }
        self.apply(payload);
    }

    /// The engine restarted (the pod was down): its entries are cleared, the sequence starts
    /// again.
    fn restarted(&mut self) {
        let now = self.now_ms();
        let sequence = &mut self.sequence;
        self.session
            .engine_index(|engine| sequence.restarted(now, engine));
        self.count(&self.metrics.kv_events_restarts);
    }

    /// On (re)subscribe: replays the pod's whole buffer, so blocks it cached before kvgate
    /// subscribed are known; later live batches the replay covered are skipped.
    async fn replay_buffer(&mut self) {
        let Some(endpoint) = self.replay else { return };
        match replay(endpoint, 0, END_SEQ).await {
            Ok(batches) => {
                for (_, payload) in &batches {
                    self.apply(payload);
                }
                if let Some((last, _)) = batches.last() {
                    self.sequence.replayed(*last);
                }
                tracing::info!(pod = %self.pod.url, batches = batches.len(), "KV events replayed on subscribe");
            }
            Err(why) => {
                self.count(&self.metrics.kv_events_replay_failures);
                tracing::warn!(pod = %self.pod.url, %why, "KV events replay on subscribe failed; only new events are learnt");
            }
        }
    }

    /// Un-stales the pod once it has rebuilt for [`STALE_REBUILD`].
    fn maybe_rebuilt(&mut self) {
        if !self.sequence.is_stale() {
            return;
        }
        let now = self.now_ms();
        let sequence = &mut self.sequence;
        let rebuilt = self
            .session
            .engine_index(|engine| sequence.tick(now, engine));
        if rebuilt {
            tracing::info!(pod = %self.pod.url, "KV events view rebuilt; engine index live again");
        }
    }

    /// Replays batches `start..end` from the replay socket and applies them; true when all of
    /// them arrived.
    async fn fill(&self, start: u64, end: u64) -> bool {
        let Some(endpoint) = self.replay else {
            return false;
        };
        match replay(endpoint, start, end).await {
            Ok(batches) => {
                let complete = batches.len() as u64 == end - start
                    && batches.first().is_none_or(|(s, _)| *s == start);
                for (_, payload) in &batches {
                    self.apply(payload);
                }
                tracing::debug!(pod = %self.pod.url, start, end, got = batches.len(), complete, "KV events replay");
                complete
            }
            Err(why) => {
                tracing::debug!(pod = %self.pod.url, %why, "KV events replay failed");
                false
            }
        }
    }
}

/// Asks the replay ROUTER for `start..`, keeping the batches with `seq` in `start..end`, in
/// order, without duplicates.
async fn replay(endpoint: &str, start: u64, end: u64) -> Result<Vec<(u64, Bytes)>, String> {
    let mut socket = DealerSocket::new();
    tokio::time::timeout(REPLAY_TIMEOUT, socket.connect(endpoint))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&start.to_be_bytes()),
    ])
    .map_err(|e| format!("{e:?}"))?;
    socket.send(request).await.map_err(|e| e.to_string())?;
    let mut out: Vec<(u64, Bytes)> = Vec::new();
    for _ in 0..=MAX_REPLAY_BATCHES {
        let msg = tokio::time::timeout(REPLAY_TIMEOUT, socket.recv())
            .await
            .map_err(|_| "replay timed out".to_string())?
            .map_err(|e| e.to_string())?;
        let frames = msg.into_vec();
        // [empty, topic, seq, payload] (vLLM 0.32, the mock pod), [empty, seq, payload] (older
        // publishers) or [seq, payload]; the end marker is any of them with seq = −1.
        let (seq, payload) = match frames.as_slice() {
            [empty, _topic, seq, payload] if empty.is_empty() => (seq, payload),
            [empty, seq, payload] if empty.is_empty() => (seq, payload),
            [seq, payload] => (seq, payload),
            _ => return Err(format!("replay message of {} frames", frames.len())),
        };
        let seq = <[u8; 8]>::try_from(seq.as_ref())
            .map(u64::from_be_bytes)
            .map_err(|_| "replay seq is not 8 bytes".to_string())?;
        if seq == END_SEQ {
            return Ok(out);
        }
        if (start..end).contains(&seq) && out.last().is_none_or(|(s, _)| *s < seq) {
            out.push((seq, payload.clone()));
        }
    }
    Err("replay longer than the limit".to_string())
}
