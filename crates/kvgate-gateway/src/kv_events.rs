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
//! - **Sequence**: the core's [`KvEventFollower`] (the same state machine the simulator runs)
//!   says what to do with each batch's `seq`; this task does the I/O. A jump forward is a gap
//!   (`kv_events_gaps_total`): the task asks the replay socket (DEALER sends
//!   `[empty, start_seq BE]`, reads `[empty, seq, payload]` until `seq = −1`) for the missing
//!   batches; if that fails or does not cover the gap (`kv_events_replay_failures_total`), the
//!   follower clears the pod's entries and marks it **stale**: the routed index stands in for it
//!   ([`kvgate_core::index::engine::HybridIndex`]) for [`STALE_REBUILD`], while new events
//!   rebuild its view. A `seq` back to 0 means the engine restarted (`kv_events_restarts_total`):
//!   the pod's entries are cleared (its cache is empty) and it stays live. The first message of
//!   a subscription with `seq > 0` replays from 0 to learn what the pod already holds.
//! - **Bounds**: one SUB socket and one task per pod; replay reads at most
//!   [`MAX_REPLAY_BATCHES`] batches with [`REPLAY_TIMEOUT`] per message; payloads over the core's
//!   `MAX_BATCH_BYTES` are rejected before decoding.

use crate::config::{IndexKind, PodEvents};
use crate::pods::Pod;
use crate::scrape::PodMetrics;
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

/// The pod's events config, if it publishes events and the engine index is on.
fn events_of(shared: &Shared, pod: &Pod) -> Option<PodEvents> {
    let cfg = shared.config();
    if cfg.index != IndexKind::Engine {
        return None;
    }
    cfg.pod_events.iter().find(|e| e.url == pod.url).cloned()
}

/// After each scrape: registers an event-publishing pod in the engine index once its model is
/// known.
pub fn on_scrape(shared: &Shared, pod: &Pod, m: &PodMetrics) {
    let Some(events) = events_of(shared, pod) else {
        return;
    };
    let Some(model) = events.model.or_else(|| m.model_name.clone()) else {
        return;
    };
    let mut session = shared.session.lock();
    let engine = &mut session.index_mut().engine;
    if engine.is_live(pod.id) || engine.is_stale(pod.id) {
        return;
    }
    engine.add_pod(pod.id, &model);
    let blocks = pod.snapshot().kv_blocks;
    engine.set_capacity(pod.id, blocks);
    tracing::info!(pod = %pod.url, %model, "engine index follows the pod's KV events");
}

/// Starts the pod's subscriber task if it publishes events and `--index engine` is on.
pub fn spawn_for(shared: &Arc<Shared>, pod: &Arc<Pod>) -> Option<tokio::task::JoinHandle<()>> {
    let events = events_of(shared, pod)?;
    Some(tokio::spawn(subscribe_loop(
        shared.clone(),
        pod.clone(),
        events,
    )))
}

fn registered(shared: &Shared, pod: &Pod) -> bool {
    let session = shared.session.lock();
    let engine = &session.index().engine;
    engine.is_live(pod.id) || engine.is_stale(pod.id)
}

async fn subscribe_loop(shared: Arc<Shared>, pod: Arc<Pod>, events: PodEvents) {
    while !registered(&shared, &pod) {
        if pod.removed.load(Ordering::Relaxed) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut socket = SubSocket::new();
    let mut backoff = Duration::from_millis(100);
    loop {
        if pod.removed.load(Ordering::Relaxed) {
            return;
        }
        match socket.connect(&events.endpoint).await {
            Ok(()) => break,
            Err(e) => {
                tracing::debug!(pod = %pod.url, endpoint = %events.endpoint, error = %e, "KV events connect failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    if let Err(e) = socket.subscribe("").await {
        tracing::warn!(pod = %pod.url, error = %e, "KV events subscribe failed");
        return;
    }
    tracing::info!(pod = %pod.url, endpoint = %events.endpoint, "subscribed to KV events");
    let mut follower = Follower {
        shared: &shared,
        pod: &pod,
        replay: events.replay.as_deref(),
        sequence: KvEventFollower::new(pod.id, STALE_REBUILD.as_secs_f64() * 1e3),
        epoch: Instant::now(),
    };
    loop {
        if pod.removed.load(Ordering::Relaxed) {
            return;
        }
        let msg = match tokio::time::timeout(Duration::from_secs(1), socket.recv()).await {
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
    shared: &'a Arc<Shared>,
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
        self.shared
            .metrics
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
            Ok(batch) => {
                {
                    let mut session = self.shared.session.lock();
                    let engine = &mut session.index_mut().engine;
                    for event in &batch.events {
                        engine.apply(self.pod.id, event);
                    }
                }
                self.count(&self.shared.metrics.kv_events_batches);
            }
            Err(e) => self.reject(&e.to_string()),
        }
    }

    async fn on_batch(&mut self, seq: u64, payload: &Bytes) {
        let now = self.now_ms();
        let step = {
            let mut session = self.shared.session.lock();
            self.sequence
                .on_batch(seq, now, &mut session.index_mut().engine)
        };
        match step {
            BatchStep::Skip => {
                tracing::debug!(pod = %self.pod.url, seq, "duplicate KV events batch skipped");
                return;
            }
            BatchStep::Apply { restarted: false } => {}
            BatchStep::Apply { restarted: true } => {
                self.count(&self.shared.metrics.kv_events_restarts);
                tracing::info!(pod = %self.pod.url, "KV events restarted from 0: engine restarted, its entries cleared");
            }
            BatchStep::JoinedLate { to } => {
                // Joined late: learn what the pod already holds (partial if the buffer
                // rotated; blocks whose parents are gone are skipped by the index).
                if self.replay.is_some() {
                    let _ = self.fill(0, to).await;
                }
            }
            BatchStep::Gap { from, to } => {
                self.count(&self.shared.metrics.kv_events_gaps);
                let complete = self.fill(from, to).await;
                let now = self.now_ms();
                let outcome = {
                    let mut session = self.shared.session.lock();
                    self.sequence
                        .gap_result(complete, now, &mut session.index_mut().engine)
                };
                if outcome == GapOutcome::Stale {
                    self.count(&self.shared.metrics.kv_events_replay_failures);
                    tracing::warn!(pod = %self.pod.url, missing_from = from, missing_to = to, "KV events lost and not replayed: pod's engine index is stale, routed index stands in");
                }
            }
        }
        self.apply(payload);
    }

    /// Un-stales the pod once it has rebuilt for [`STALE_REBUILD`].
    fn maybe_rebuilt(&mut self) {
        if !self.sequence.is_stale() {
            return;
        }
        let now = self.now_ms();
        let rebuilt = {
            let mut session = self.shared.session.lock();
            self.sequence.tick(now, &mut session.index_mut().engine)
        };
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
        // [empty, seq, payload] (vLLM, our mock pod) or [seq, payload].
        let (seq, payload) = match frames.as_slice() {
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
