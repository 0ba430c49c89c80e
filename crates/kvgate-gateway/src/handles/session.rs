//! [`SessionHandle`]: the core's request lifecycle ([`RouterSession`]: router, prefix index,
//! predictor, RNG and in-flight ledger) behind its one mutex, with `--cluster`'s link to the
//! other replicas ([`ReplicaLink`]) as the observer of every transition.
//!
//! The session is single-threaded by design, so the mutex is held only for a transition (a
//! decision, a first token, a finish: microseconds), never across an `.await`. A request's
//! transitions go through the methods here, which tell the cluster link after releasing the
//! lock; [`SessionHandle::lock`] is for the reads and decisions that need the session itself.
//!
//! Memory: the session's own bounds (ARCHITECTURE.md: the routed index ≤ 96 B per block, the
//! engine index ≤ 192 B per block, the ledger one counter set per pod id); the link holds none.

use crate::config::GatewayConfig;
use crate::metrics::ClusterMetrics;
use crate::pods::Pod;
use kvgate_core::index::engine::EngineIndex;
use kvgate_core::predictor::{AccuracyReport, LatencyPredictor, PredictorConfig};
use kvgate_core::{
    BlockHash, InFlight, Observed, PodId, PodScore, PodSnapshot, RouteRequest, RouterSession,
    Ticket, TrainingSample,
};
use parking_lot::{Mutex, MutexGuard};
use std::sync::Arc;

/// `--cluster`'s link to the other replicas, as the session's observer: the request
/// transitions [`SessionHandle`] reports, and the gauges refreshed before `/metrics` is
/// encoded. Implemented by [`crate::cluster::Cluster`] (given at start); a trait, so that this
/// module does not depend on the cluster's.
pub trait ReplicaLink: Send + Sync {
    /// A request was routed to `pod` (its prompt's `blocks`); returns its id for the
    /// transitions below.
    fn routed(
        &self,
        pod: &Pod,
        blocks: &[BlockHash],
        input_tokens: u32,
        prefill_tokens: u64,
    ) -> u64;

    /// The request's first token (with the training sample learnt at it, if any).
    fn first_token(&self, request: u64, decode_tokens: u64, sample: Option<TrainingSample>);

    /// `tokens` more decode tokens.
    fn tokens(&self, request: u64, tokens: u64);

    /// The request ended (with its training sample when it completed normally).
    fn finish(&self, request: u64, sample: Option<TrainingSample>);

    /// Refreshes `kvgate_cluster_*`'s gauges.
    fn refresh_gauges(&self, m: &ClusterMetrics);

    /// The implementation itself, for [`crate::cluster::Cluster::of`].
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// The session and its observer; see the module docs.
pub struct SessionHandle {
    session: Mutex<RouterSession>,
    /// `--cluster`: this replica's membership, given at start.
    cluster: Option<Arc<dyn ReplicaLink>>,
}

impl SessionHandle {
    pub fn new(session: RouterSession, cluster: Option<Arc<dyn ReplicaLink>>) -> SessionHandle {
        SessionHandle {
            session: Mutex::new(session),
            cluster,
        }
    }

    /// The session itself, for a decision or a read; held for microseconds, never across an
    /// `.await`. A request's transitions go through the methods below instead.
    pub fn lock(&self) -> MutexGuard<'_, RouterSession> {
        self.session.lock()
    }

    /// `--cluster`'s link, when one was given at start.
    pub fn cluster(&self) -> Option<&Arc<dyn ReplicaLink>> {
        self.cluster.as_ref()
    }

    /// Pod `pod`'s in-flight counters in the ledger.
    pub fn in_flight(&self, pod: PodId) -> InFlight {
        self.session.lock().in_flight(pod)
    }

    /// A routed request's ticket was issued: the cluster learns of it; returns the request's
    /// id there (none without `--cluster`).
    pub fn routed(&self, pod: &Pod, ticket: &Ticket, blocks: &[BlockHash]) -> Option<u64> {
        self.cluster
            .as_ref()
            .map(|c| c.routed(pod, blocks, ticket.input_tokens(), ticket.prefill_tokens()))
    }

    /// A request the router does not decide, charged as one request on `pod`.
    pub fn charge_unrouted(&self, pod: &Pod) -> Ticket {
        self.session.lock().charge_unrouted(&pod.snapshot())
    }

    /// The ticket's first token ([`RouterSession::first_token_seen`]); the cluster (request
    /// `shared_as` there) learns it with the sample trained on, if any.
    pub fn first_token(&self, ticket: &mut Ticket, ttft_ms: Option<f64>, shared_as: Option<u64>) {
        let sample = self.session.lock().first_token_seen(ticket, ttft_ms);
        if let (Some(c), Some(id)) = (self.cluster.as_ref(), shared_as) {
            c.first_token(id, ticket.decode_tokens(), sample);
        }
    }

    /// `tokens` more tokens on the ticket; the cluster learns them.
    pub fn tokens_generated(&self, ticket: &mut Ticket, tokens: u64, shared_as: Option<u64>) {
        self.session.lock().tokens_generated(ticket, tokens);
        if let (Some(c), Some(id)) = (self.cluster.as_ref(), shared_as) {
            c.tokens(id, tokens);
        }
    }

    /// The ticket's request ended (`observed`: trained on); the cluster learns it with
    /// `sample`.
    pub fn finish(
        &self,
        ticket: Ticket,
        observed: Option<Observed>,
        sample: Option<TrainingSample>,
        shared_as: Option<u64>,
    ) {
        self.session.lock().finish(ticket, observed);
        if let (Some(c), Some(id)) = (self.cluster.as_ref(), shared_as) {
            // A sample with nothing left to teach (the TTFT went out with the first token,
            // no TPOT with under two tokens) is not sent: the machine filters it.
            c.finish(id, sample);
        }
    }

    /// The predictor's accuracy now (`/debug/predictor`, the live page's samples).
    pub fn accuracy(&self) -> AccuracyReport {
        self.session.lock().predictor().accuracy()
    }

    /// Reseeds the decision RNG (`--cluster`: before anything routes).
    pub fn reseed(&self, seed: u64) {
        self.session.lock().reseed(seed);
    }

    /// The least-loaded pod of `pods` not in `excluded`, for a request the router does not
    /// decide ([`RouterSession::least_loaded`]).
    pub fn least_loaded(&self, pods: &mut [PodSnapshot], excluded: &[PodId]) -> Option<PodId> {
        self.session.lock().least_loaded(pods, excluded)
    }

    /// Every pod's score for `request`, nothing decided or charged (`/debug/score`).
    pub fn score(&self, request: &RouteRequest<'_>, pods: &mut [PodSnapshot]) -> Vec<PodScore> {
        self.session.lock().score(request, pods)
    }

    /// A pod's KV capacity (`pod_blocks` of `pod_block_size` tokens) into the index, whose
    /// routed side cuts its prompts at `routed_block_size`.
    pub fn set_pod_kv(
        &self,
        pod: PodId,
        pod_blocks: u32,
        pod_block_size: u32,
        routed_block_size: u32,
    ) {
        self.session.lock().index_mut().set_pod_kv(
            pod,
            pod_blocks,
            pod_block_size,
            routed_block_size,
        );
    }

    /// A config reload: the router rebuilt if its parameters or policy changed, the predictor
    /// if its config did.
    pub fn reconfigure(&self, old: &GatewayConfig, new: &GatewayConfig) {
        let mut session = self.session.lock();
        if old.router != new.router || old.policy != new.policy {
            session.set_router(new.router, new.policy);
        }
        if PredictorConfig::for_router(&old.router) != PredictorConfig::for_router(&new.router) {
            session.set_predictor(LatencyPredictor::new(PredictorConfig::for_router(
                &new.router,
            )));
        }
    }

    /// `f` on the engine index (the pods' caches as their KV events tell them), for the
    /// KV-event followers ([`crate::kv_events`]).
    pub fn engine_index<T>(&self, f: impl FnOnce(&mut EngineIndex) -> T) -> T {
        f(&mut self.session.lock().index_mut().engine)
    }

    /// Removed pods' index entries and in-flight counters go away.
    pub fn remove_pods(&self, pods: &[Arc<Pod>]) {
        let mut session = self.session.lock();
        for pod in pods {
            session.remove_pod(pod.id);
        }
    }
}
