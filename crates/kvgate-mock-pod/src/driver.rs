//! Drives the simulator's [`Engine`] in wall-clock time: one tokio task per pod.
//!
//! The engine model is sans-IO (`kvgate_sim::engine`); this task is its clock. Model time is
//! wall time since the pod started × `time_scale` (`--time-scale 10` runs ten times faster
//! than the profile). The loop:
//!
//! 1. add every submitted request at the current model time ([`Engine::add_request`]);
//! 2. run the next step at the time the engine schedules it ([`Engine::next_step_time`]):
//!    back-to-back steps follow the model's schedule exactly, so timer jitter does not
//!    accumulate; when the task has fallen more than [`LATE_RESYNC_MS`] (wall) behind, the step
//!    starts now instead and `kvgate_mock_pod_late_steps_total` counts it;
//! 3. sleep until the step's end (`end_ms / time_scale`), then hand each emitted token to its
//!    request's channel, record TTFT / inter-token / e2e latencies in wall time, publish the
//!    step's cache changes as one KV event batch and refresh the gauges, vLLM's per-step
//!    `vllm:iteration_tokens_total` and per-request queue / prefill / decode times.
//!
//! A client that goes away aborts its request, as vLLM does: the HTTP layer holds an
//! [`AbortOnDrop`] guard for the request's id ([`RequestEvent::Queued`]) whose drop (the SSE body
//! dropped by hyper on a broken connection, or the handler future dropped) sends the id on the
//! abort channel; the driver takes it out of the engine ([`Engine::abort`]: it leaves the running
//! or waiting count and its KV blocks are freed) before the next step, and counts it in
//! `kvgate_mock_pod_aborted_requests_total` (vLLM 0.32 does not count a client's disconnect in
//! `vllm:request_success_total{finished_reason="abort"}`, which stays 0).
//!
//! Bounds: at most [`MAX_LIVE_REQUESTS`] requests queued or running (more are refused, HTTP
//! 503); the submission queue holds [`SUBMIT_QUEUE`] requests (senders wait); a request's
//! event channel holds at most `max_tokens + 1` events, so it is bounded by the request; the
//! abort channel holds at most one id per live request; the block → token-ids map for KV events
//! holds one entry per distinct prompt block of the live requests.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvgate_core::BlockHash;
use kvgate_sim::engine::{Admission, AdmitError, Emission, Engine, EngineRequest, KvEvent};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::kv_events::{CacheEvent, KvEventsEncoding, encode_batch};
use crate::metrics::PodMetrics;

/// Requests queued or running in one pod before new ones are refused.
pub const MAX_LIVE_REQUESTS: usize = 100_000;
/// Submissions waiting for the driver to pick them up.
pub const SUBMIT_QUEUE: usize = 4096;
/// How far (wall milliseconds) the driver may fall behind the model's schedule before it
/// gives up on catching up and restarts the schedule from now.
pub const LATE_RESYNC_MS: f64 = 50.0;

/// What a request hears from the engine.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    /// The engine accepted the request as `id` (always the first event unless refused).
    Queued { id: u64 },
    /// The request was scheduled; `cached_tokens` of its prompt were prefix-cache hits.
    Admitted { cached_tokens: u32 },
    /// Output token number `index` (1-based) was produced.
    Token { index: u32, finished: bool },
    /// The engine refused the request.
    Rejected(AdmitError),
    /// Too many requests in the pod.
    Overloaded,
}

/// A request for the engine.
#[derive(Debug)]
pub struct Submission {
    pub prompt_tokens: Arc<[u32]>,
    /// Chained hashes of the prompt's full blocks (of the engine's block size).
    pub blocks: Arc<[BlockHash]>,
    pub max_tokens: u32,
    /// P/D decode stage: the prompt's KV comes from a prefill pod
    /// ([`Engine::add_transferred_request`]).
    pub transferred: bool,
    pub events: mpsc::UnboundedSender<RequestEvent>,
}

/// Sends requests to a pod's engine task.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Submission>,
    aborts: mpsc::UnboundedSender<u64>,
    block_size_tokens: u32,
}

impl EngineHandle {
    /// Queues a request; waits while the submission queue is full. Returns false when the
    /// engine task is gone.
    pub async fn submit(&self, submission: Submission) -> bool {
        self.tx.send(submission).await.is_ok()
    }

    /// Tokens per KV block of the engine.
    pub fn block_size_tokens(&self) -> u32 {
        self.block_size_tokens
    }

    /// A guard that aborts request `id` (from [`RequestEvent::Queued`]) when dropped, unless
    /// [`AbortOnDrop::finished`] was called.
    pub fn abort_on_drop(&self, id: u64) -> AbortOnDrop {
        AbortOnDrop {
            id,
            tx: Some(self.aborts.clone()),
        }
    }
}

/// Aborts its request in the engine when dropped before [`AbortOnDrop::finished`].
#[derive(Debug)]
pub struct AbortOnDrop {
    id: u64,
    tx: Option<mpsc::UnboundedSender<u64>>,
}

impl AbortOnDrop {
    /// The request ended normally (its last token was handed over): nothing to abort.
    pub fn finished(&mut self) {
        self.tx = None;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            // The engine task being gone already freed everything.
            let _ = tx.send(self.id);
        }
    }
}

struct Live {
    events: mpsc::UnboundedSender<RequestEvent>,
    arrival: Instant,
    /// Start of the step that first scheduled it.
    scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    admitted: bool,
    blocks: Arc<[BlockHash]>,
}

struct BlockInfo {
    parent: Option<BlockHash>,
    /// The block's `block_size_tokens` token ids.
    tokens: Box<[u32]>,
    refs: u32,
}

/// Where the driver publishes KV event batches.
pub struct EventSink {
    pub tx: mpsc::Sender<bytes::Bytes>,
    pub encoding: KvEventsEncoding,
    /// The engine's data-parallel rank, in every batch (0 for a pod with one engine).
    pub rank: u32,
}

struct Driver {
    engine: Engine,
    epoch: Instant,
    time_scale: f64,
    block_size_tokens: usize,
    next_id: u64,
    live: FxHashMap<u64, Live>,
    block_info: FxHashMap<BlockHash, BlockInfo>,
    metrics: Arc<Mutex<PodMetrics>>,
    sink: Option<EventSink>,
    // Per-step buffers, reused.
    emissions: Vec<Emission>,
    admitted: Vec<Admission>,
    kv_events: Vec<KvEvent>,
    cache_events: Vec<CacheEvent>,
}

/// Starts the engine task; it ends when every [`EngineHandle`] is dropped and the engine is idle.
pub fn spawn(
    mut engine: Engine,
    time_scale: f64,
    metrics: Arc<Mutex<PodMetrics>>,
    sink: Option<EventSink>,
) -> (EngineHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(SUBMIT_QUEUE);
    let (aborts_tx, aborts) = mpsc::unbounded_channel();
    let block_size_tokens = engine.block_size_tokens();
    engine.set_record_kv_events(sink.is_some());
    if let Ok(mut m) = metrics.lock() {
        m.engine = engine.metrics();
    }
    let driver = Driver {
        engine,
        epoch: Instant::now(),
        time_scale,
        block_size_tokens: block_size_tokens as usize,
        next_id: 0,
        live: FxHashMap::default(),
        block_info: FxHashMap::default(),
        metrics,
        sink,
        emissions: Vec::new(),
        admitted: Vec::new(),
        kv_events: Vec::new(),
        cache_events: Vec::new(),
    };
    let task = tokio::spawn(driver.run(rx, aborts));
    let handle = EngineHandle {
        tx,
        aborts: aborts_tx,
        block_size_tokens,
    };
    (handle, task)
}

impl Driver {
    fn model_now_ms(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1000.0 * self.time_scale
    }

    fn wall_at(&self, model_ms: f64) -> Instant {
        let secs = (model_ms / 1000.0 / self.time_scale).max(0.0);
        self.epoch + Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX / 4)
    }

    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Submission>,
        mut aborts: mpsc::UnboundedReceiver<u64>,
    ) {
        loop {
            while let Ok(id) = aborts.try_recv() {
                self.abort(id);
            }
            let mut closed = false;
            loop {
                match rx.try_recv() {
                    Ok(s) => self.add(s),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            let Some(t) = self.engine.next_step_time() else {
                if closed {
                    return;
                }
                match rx.recv().await {
                    Some(s) => self.add(s),
                    None => return,
                }
                continue;
            };
            self.step(t).await;
            if self.emissions.is_empty() && self.admitted.is_empty() && self.kv_events.is_empty() {
                // Nothing could be scheduled (cannot happen with the engine's admission
                // checks, but never spin): wait for a new request or a millisecond.
                tokio::select! {
                    s = rx.recv(), if !closed => if let Some(s) = s { self.add(s) },
                    _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                }
            }
        }
    }

    fn add(&mut self, s: Submission) {
        if self.live.len() >= MAX_LIVE_REQUESTS {
            let _ = s.events.send(RequestEvent::Overloaded);
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        let input_tokens = u32::try_from(s.prompt_tokens.len()).unwrap_or(u32::MAX);
        let req = EngineRequest {
            id,
            blocks: s.blocks.clone(),
            input_tokens,
            output_tokens: s.max_tokens,
            adapter: None,
        };
        let now = self.model_now_ms();
        let added = if s.transferred {
            self.engine.add_transferred_request(now, req)
        } else {
            self.engine.add_request(now, req)
        };
        if let Err(e) = added {
            let _ = s.events.send(RequestEvent::Rejected(e));
            return;
        }
        let _ = s.events.send(RequestEvent::Queued { id });
        if self.sink.is_some() {
            for (i, (&hash, chunk)) in s
                .blocks
                .iter()
                .zip(s.prompt_tokens.chunks_exact(self.block_size_tokens))
                .enumerate()
            {
                let parent = i.checked_sub(1).and_then(|p| s.blocks.get(p).copied());
                let entry = self.block_info.entry(hash).or_insert_with(|| BlockInfo {
                    parent,
                    tokens: chunk.into(),
                    refs: 0,
                });
                entry.refs += 1;
            }
        }
        self.live.insert(
            id,
            Live {
                events: s.events,
                arrival: Instant::now(),
                scheduled: None,
                first_token: None,
                last_token: None,
                admitted: false,
                blocks: s.blocks,
            },
        );
    }

    /// The client of request `id` went away (see the module docs).
    fn abort(&mut self, id: u64) {
        let Some(live) = self.live.remove(&id) else {
            return;
        };
        self.engine.abort(id);
        release_blocks(&mut self.block_info, &live.blocks);
        tracing::debug!(id, "request aborted: the client went away");
        if let Ok(mut m) = self.metrics.lock() {
            m.requests_aborted += 1;
            m.engine = self.engine.metrics();
        }
    }

    async fn step(&mut self, scheduled_ms: f64) {
        let now_ms = self.model_now_ms();
        let late = (now_ms - scheduled_ms) / self.time_scale > LATE_RESYNC_MS;
        let start = if late { now_ms } else { scheduled_ms };
        let step_start = self.wall_at(start);
        let o = self.engine.step(start);
        let end_ms = o.end_ms;
        let step_tokens = o.prefill_tokens + o.decode_seqs;
        self.emissions.clear();
        self.emissions.extend_from_slice(&o.emissions);
        self.admitted.clear();
        self.admitted.extend_from_slice(&o.admitted);
        self.kv_events.clear();
        self.kv_events.extend_from_slice(&o.kv_events);
        // Before finished requests release their blocks' token ids.
        if self.sink.is_some() {
            to_cache_events(
                &self.kv_events,
                &self.block_info,
                self.block_size_tokens as u32,
                &mut self.cache_events,
            );
        }

        tokio::time::sleep_until(self.wall_at(end_ms)).await;
        let delivered = Instant::now();
        let ts_unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());

        let Ok(mut m) = self.metrics.lock() else {
            return;
        };
        if late {
            m.late_steps += 1;
        }
        if step_tokens > 0 {
            m.iteration_tokens.observe(step_tokens as f64);
        }
        for a in &self.admitted {
            if let Some(live) = self.live.get_mut(&a.request_id)
                && !live.admitted
            {
                live.admitted = true;
                live.scheduled = Some(step_start);
                m.queue_time.observe(
                    step_start
                        .saturating_duration_since(live.arrival)
                        .as_secs_f64(),
                );
                let _ = live.events.send(RequestEvent::Admitted {
                    cached_tokens: a.cached_tokens,
                });
            }
        }
        for e in &self.emissions {
            let Some(live) = self.live.get_mut(&e.request_id) else {
                continue;
            };
            let _ = live.events.send(RequestEvent::Token {
                index: e.output_tokens_so_far,
                finished: e.finished,
            });
            match live.last_token {
                None => {
                    m.ttft.observe((delivered - live.arrival).as_secs_f64());
                    let scheduled = live.scheduled.unwrap_or(live.arrival);
                    m.prefill_time
                        .observe(delivered.saturating_duration_since(scheduled).as_secs_f64());
                    live.first_token = Some(delivered);
                }
                Some(last) => m.itl.observe((delivered - last).as_secs_f64()),
            }
            live.last_token = Some(delivered);
            if e.finished {
                let first = live.first_token.unwrap_or(delivered);
                m.decode_time
                    .observe(delivered.saturating_duration_since(first).as_secs_f64());
                m.e2e.observe((delivered - live.arrival).as_secs_f64());
                m.requests_finished_length += 1;
                if let Some(live) = self.live.remove(&e.request_id) {
                    release_blocks(&mut self.block_info, &live.blocks);
                }
            }
        }
        if let Some(sink) = &self.sink
            && !self.cache_events.is_empty()
        {
            let payload = encode_batch(ts_unix_s, &self.cache_events, sink.encoding, sink.rank);
            if sink.tx.try_send(payload).is_err() {
                m.kv_event_batches_dropped += 1;
            }
        }
        m.engine = self.engine.metrics();
    }
}

fn release_blocks(info: &mut FxHashMap<BlockHash, BlockInfo>, blocks: &[BlockHash]) {
    for h in blocks {
        if let Some(entry) = info.get_mut(h) {
            entry.refs = entry.refs.saturating_sub(1);
            if entry.refs == 0 {
                info.remove(h);
            }
        }
    }
}

/// Groups the engine's per-block changes into vLLM events: consecutive stored blocks of one
/// chain become one `BlockStored`; each removed block is one `BlockRemoved`.
fn to_cache_events(
    kv: &[KvEvent],
    info: &FxHashMap<BlockHash, BlockInfo>,
    block_size: u32,
    out: &mut Vec<CacheEvent>,
) {
    out.clear();
    for ev in kv {
        match *ev {
            KvEvent::Stored(h) => {
                let (parent, tokens) = match info.get(&h) {
                    Some(i) => (i.parent, &i.tokens[..]),
                    None => {
                        tracing::warn!("no token ids known for stored block {h:#x}");
                        (None, &[][..])
                    }
                };
                if let Some(CacheEvent::BlockStored {
                    block_hashes,
                    token_ids,
                    ..
                }) = out.last_mut()
                    && parent.is_some()
                    && block_hashes.last().copied() == parent
                {
                    block_hashes.push(h);
                    token_ids.extend_from_slice(tokens);
                    continue;
                }
                out.push(CacheEvent::BlockStored {
                    block_hashes: vec![h],
                    parent_block_hash: parent,
                    token_ids: tokens.to_vec(),
                    block_size,
                });
            }
            KvEvent::Removed(h) => out.push(CacheEvent::BlockRemoved {
                block_hashes: vec![h],
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(parent: Option<BlockHash>, t: u32) -> BlockInfo {
        BlockInfo {
            parent,
            tokens: vec![t; 16].into(),
            refs: 1,
        }
    }

    #[test]
    fn consecutive_stored_blocks_of_a_chain_become_one_block_stored() {
        let mut map = FxHashMap::default();
        map.insert(1, info(None, 1));
        map.insert(2, info(Some(1), 2));
        map.insert(9, info(Some(8), 9));
        let mut out = Vec::new();
        to_cache_events(
            &[
                KvEvent::Stored(1),
                KvEvent::Stored(2),
                KvEvent::Removed(5),
                KvEvent::Stored(9),
            ],
            &map,
            16,
            &mut out,
        );
        assert_eq!(
            out,
            vec![
                CacheEvent::BlockStored {
                    block_hashes: vec![1, 2],
                    parent_block_hash: None,
                    token_ids: [[1u32; 16], [2; 16]].concat(),
                    block_size: 16,
                },
                CacheEvent::BlockRemoved {
                    block_hashes: vec![5]
                },
                CacheEvent::BlockStored {
                    block_hashes: vec![9],
                    parent_block_hash: Some(8),
                    token_ids: vec![9; 16],
                    block_size: 16,
                },
            ]
        );
    }
}
