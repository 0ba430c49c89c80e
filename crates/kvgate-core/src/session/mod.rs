//! One request's life in the router, sans IO: the state machine every driver runs.
//!
//! [`RouterSession`] owns the decision state — the [`Router`] (policy), the prefix index
//! ([`HybridIndex`]), the latency predictor, the seeded decision RNG and the in-flight
//! [`Ledger`] — and moves each request through explicit transitions:
//!
//! ```text
//! route ──► (first_token ──► tokens_generated*)? ──► finish(observed) | finish(None)
//!   │
//!   └─ decide over the pods' snapshots with the ledger's in-flight counters (excluded pods
//!      count as unhealthy; a request's objectives reach only a policy that reads them, the
//!      llm-d chain model) ─► the index learns the route ─► features taken ─► the pod is charged
//! ```
//!
//! `route` returns a [`Ticket`]; every later transition takes it, and `finish` consumes it, so
//! a request returns its charge exactly once: with an observation (`Some`: the predictor
//! trains on the features taken at dispatch) or without (failed, aborted, retried elsewhere).
//!
//! The HTTP proxy, the Envoy ext_proc picker and the simulator are drivers of this type: they
//! do I/O (or model it), measure time, and call these transitions; none of them decides,
//! charges or trains on its own. Time never enters: observations are durations the driver
//! measured.
//!
//! Parameters: everything comes from [`RouterConfig`] and the
//! [`PredictorConfig`]; the RNG is ChaCha8 seeded by the caller (`seed`).
//!
//! Bounds: the ledger holds one counter set per pod id; a decision allocates O(pods) and frees
//! it; a ticket is a few words plus the pod's class name.

pub mod adapter_book;
pub mod ledger;
pub mod pd;
pub mod peers;
pub mod prefilling;
pub mod replica;

use crate::DecisionRng;
use crate::adapters::AdapterId;
use crate::blocks::{BlockHash, SizedBlocks};
use crate::config::RouterConfig;
use crate::decision::Decision;
use crate::index::PrefixIndex;
use crate::index::engine::HybridIndex;
use crate::pod::{InFlight, PodId, PodSnapshot};
use crate::policy::{PolicyKind, RequestSlo};
use crate::predictor::{Features, LatencyPredictor, PredictorConfig};
use crate::router::{PromptCut, Router};
use adapter_book::AdapterBook;
use ledger::{Ledger, Share, prefill_charge_tokens};
use prefilling::{Mark, Prefilling};
use rand::SeedableRng;

/// What the router needs to know about a request to route it.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// The prompt's chained block hashes.
    pub blocks: &'a [BlockHash],
    /// Prompt tokens (counted, or estimated from characters).
    pub input_tokens: u32,
    /// Tokens per block in `blocks`: what one matched block saves the pod.
    pub block_size_tokens: u32,
    /// The prompt at the other block sizes pods of the fleet cache in (engine mode with a
    /// mixed fleet; empty otherwise): a pod is scored, recorded and charged by its own size.
    pub other_sizes: &'a [SizedBlocks],
    /// The request's latency objectives: recorded with its decision; they route only a policy
    /// that reads them ([`crate::Router::uses_slo`]: the llm-d chain model, as upstream).
    pub slo: RequestSlo,
    /// The LoRA adapter the request names: [`AdapterId::of`] its `model` (a pod whose base
    /// model that is counts it as no adapter). `None`: adapter-blind for this request.
    pub adapter: Option<AdapterId>,
}

impl<'a> RouteRequest<'a> {
    /// The request's blocks as the router scores them.
    pub fn cut(&self) -> PromptCut<'a> {
        PromptCut {
            blocks: self.blocks,
            block_size_tokens: self.block_size_tokens,
            other_sizes: self.other_sizes,
            adapter: self.adapter,
        }
    }
}

/// One pod's view of a request in [`RouterSession::score`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PodScore {
    #[serde(skip)]
    pub pod: PodId,
    /// The pod's name (its URL in the gateway).
    #[serde(rename = "pod")]
    pub name: std::sync::Arc<str>,
    /// Leading blocks of the prompt the pod holds, in blocks of `block_size_tokens`.
    pub matched_blocks: u32,
    pub block_size_tokens: u32,
    pub prefix_score: f64,
    pub predicted_ttft_ms: f64,
    pub predicted_tpot_ms: f64,
}

/// Why a request could not be routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("no healthy pod")]
    NoHealthyPod,
    #[error("the policy chose no pod")]
    NoDecision,
}

/// A routed request: the decision with its explanation, and the request's ticket.
#[derive(Debug)]
pub struct Routed {
    pub decision: Decision,
    pub ticket: Ticket,
}

/// One request's hold on a pod, from dispatch to its end. Not `Clone`: it is given back once.
#[derive(Debug)]
pub struct Ticket {
    share: Share,
    /// The adapter recorded in the session's [`AdapterBook`] for this request, if any.
    adapter: Option<AdapterId>,
    class: std::sync::Arc<str>,
    features: Features,
    input_tokens: u32,
    predicted_ttft_ms: f64,
    predicted_tpot_ms: f64,
    first_token: bool,
    /// The TTFT was learnt at the first token ([`RouterSession::first_token_learnt`]), so
    /// `finish` trains TPOT only.
    ttft_learnt: bool,
    /// Which stage of the request the ticket holds (what `finish` trains).
    stage: pd::Stage,
    /// The blocks this request brought to its pod, being computed until its first token
    /// ([`prefilling`]).
    prefilling: Option<Mark>,
}

impl Ticket {
    /// The stage the ticket holds: a whole request, or one stage of a P/D request.
    pub fn stage(&self) -> pd::Stage {
        self.stage
    }

    pub fn pod(&self) -> PodId {
        self.share.pod
    }

    /// The features taken at dispatch (what the predictor trains on).
    pub fn features(&self) -> &Features {
        &self.features
    }

    pub fn predicted_ttft_ms(&self) -> f64 {
        self.predicted_ttft_ms
    }

    pub fn predicted_tpot_ms(&self) -> f64 {
        self.predicted_tpot_ms
    }

    /// Uncached prompt tokens charged at dispatch and not yet returned (0 after the first
    /// token).
    pub fn prefill_tokens(&self) -> u64 {
        self.share.prefill_tokens
    }

    pub fn has_first_token(&self) -> bool {
        self.first_token
    }

    /// Decode tokens charged and not yet returned (0 before the first token).
    pub fn decode_tokens(&self) -> u64 {
        self.share.decode_tokens
    }

    /// Prompt tokens of the request.
    pub fn input_tokens(&self) -> u32 {
        self.input_tokens
    }

    /// What [`RouterSession::finish`] trains the predictor on for this ticket and `observed`:
    /// the features at dispatch and the targets of its stage (a whole request TTFT and TPOT,
    /// a P/D prefill stage TTFT only, a P/D decode stage TPOT only).
    /// Once the TTFT was learnt at the first token, only a whole request's TPOT is left to
    /// train (a prefill stage has none).
    pub fn training_sample(&self, observed: &Observed) -> TrainingSample {
        let (ttft_ms, tpot_ms) = match self.stage {
            pd::Stage::Whole if self.ttft_learnt => (None, observed.tpot_ms),
            pd::Stage::Prefill if self.ttft_learnt => (None, None),
            pd::Stage::Whole => (Some(observed.ttft_ms), observed.tpot_ms),
            pd::Stage::Prefill => (Some(observed.ttft_ms), None),
            pd::Stage::Decode => (None, observed.tpot_ms),
        };
        TrainingSample {
            features: self.features,
            ttft_ms,
            tpot_ms,
        }
    }
}

/// What the driver measured of a request that completed normally.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Observed {
    pub ttft_ms: f64,
    /// Mean time per output token after the first; `None` with fewer than two tokens.
    pub tpot_ms: Option<f64>,
}

/// One finished request's lesson for the predictor ([`Ticket::training_sample`]): what
/// router replicas share (`kvgate serve --cluster`) so that each one's predictor learns from
/// the whole fleet's requests, not only its own ([`RouterSession::learn`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainingSample {
    pub features: Features,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
}

/// The router's decision state and the request transitions; see the module docs.
pub struct RouterSession {
    router: Router,
    index: HybridIndex,
    predictor: LatencyPredictor,
    rng: DecisionRng,
    /// The seed `rng` last started from ([`RouterSession::new`], [`RouterSession::reseed`]).
    seed: u64,
    ledger: Ledger,
    /// LoRA adapters routed per pod: in flight and most recent ([`crate::adapters`]).
    adapters: AdapterBook,
    /// The blocks routed requests are still computing, per pod ([`prefilling`]).
    prefilling: Prefilling,
    /// The driver's clock at its last [`RouterSession::advance_clock`] (ms).
    now_ms: f64,
    /// Scratch: the pods' health before exclusions, and the excluded ids as a dense bitmap.
    health: Vec<bool>,
    excluded: Vec<bool>,
}

impl RouterSession {
    pub fn new(
        router: RouterConfig,
        policy: PolicyKind,
        predictor: PredictorConfig,
        seed: u64,
    ) -> Self {
        let mut index = HybridIndex::new();
        index
            .engine
            .set_pending_ttl_ms(router.engine_pending_ttl_ms);
        RouterSession {
            router: Router::new(router, policy),
            index,
            predictor: LatencyPredictor::new(predictor),
            rng: DecisionRng::seed_from_u64(seed),
            seed,
            ledger: Ledger::default(),
            adapters: AdapterBook::default(),
            prefilling: Prefilling::default(),
            now_ms: 0.0,
            health: Vec::new(),
            excluded: Vec::new(),
        }
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Restarts the decision RNG from `seed`. A gateway replica joining a cluster mixes its
    /// replica id into its configured seed, so replicas started from one config do not make the
    /// same random draws (exploration, random picks) in lockstep.
    pub fn reseed(&mut self, seed: u64) {
        self.rng = DecisionRng::seed_from_u64(seed);
        self.seed = seed;
    }

    /// The seed the decision RNG last started from.
    pub fn decision_seed(&self) -> u64 {
        self.seed
    }

    /// Replaces the policy and its parameters (a config reload); index, predictor, RNG,
    /// ledger and the prefix-popularity counts are kept.
    pub fn set_router(&mut self, router: RouterConfig, policy: PolicyKind) {
        self.index
            .engine
            .set_pending_ttl_ms(router.engine_pending_ttl_ms);
        let old = std::mem::replace(&mut self.router, Router::new(router, policy));
        self.router.keep_popularity_from(old);
    }

    pub fn index(&self) -> &HybridIndex {
        &self.index
    }

    pub fn index_mut(&mut self) -> &mut HybridIndex {
        &mut self.index
    }

    pub fn predictor(&self) -> &LatencyPredictor {
        &self.predictor
    }

    pub fn predictor_mut(&mut self) -> &mut LatencyPredictor {
        &mut self.predictor
    }

    /// Starts the predictor over (a reload changed its model).
    pub fn set_predictor(&mut self, predictor: LatencyPredictor) {
        self.predictor = predictor;
    }

    /// The router's in-flight counters for a pod.
    pub fn in_flight(&self, pod: PodId) -> InFlight {
        self.ledger.in_flight(pod)
    }

    /// Sum of every in-flight counter over all pods (0 when every request has ended).
    pub fn in_flight_total(&self) -> u64 {
        self.ledger.total()
    }

    /// Sets each snapshot's `in_flight` to the ledger's counters, and adds the adapters the
    /// session routed to each LoRA pod to its `lora` slots ([`AdapterBook::fill`]).
    pub fn fill_in_flight(&self, pods: &mut [PodSnapshot]) {
        for s in pods {
            s.in_flight = self.ledger.in_flight(s.id);
            if let Some(slots) = &mut s.lora {
                self.adapters.fill(s.id, slots);
            }
        }
    }

    /// Requests for `adapter` in flight on `pod`, as the session routed them.
    pub fn adapter_in_flight(&self, pod: PodId, adapter: AdapterId) -> u32 {
        self.adapters.in_flight(pod, adapter)
    }

    /// The pod left the fleet: its index entries and its ledger go (see [`ledger`]).
    pub fn remove_pod(&mut self, pod: PodId) {
        self.index.remove_pod(pod);
        self.ledger.remove_pod(pod);
        self.adapters.remove_pod(pod);
        self.prefilling.remove_pod(pod);
    }

    /// Moves the clock of the session's timed state to the driver's `now_ms`: a prefix still
    /// being computed counts only within its window ([`prefilling`]).
    pub fn advance_clock(&mut self, now_ms: f64) {
        self.now_ms = now_ms;
    }

    /// Each healthy pod's prefix score and predictions for `request`, as a decision would see
    /// them now (`in_flight` filled from the ledger). Nothing is decided, recorded or charged:
    /// the dry run behind the gateway's `/debug/score`.
    pub fn score(&mut self, request: &RouteRequest<'_>, pods: &mut [PodSnapshot]) -> Vec<PodScore> {
        self.fill_in_flight(pods);
        self.fill_prefill_caps(&request.cut(), pods);
        let (_, candidates) = self.router.evaluate_cut(
            request.cut(),
            request.input_tokens,
            pods,
            &self.index,
            &self.predictor,
        );
        candidates
            .iter()
            .map(|c| PodScore {
                pod: c.pod.id,
                name: c.pod.name.clone(),
                matched_blocks: c.matched_blocks,
                block_size_tokens: c.block_size_tokens,
                prefix_score: c.prefix_score,
                predicted_ttft_ms: c.predicted_ttft_ms,
                predicted_tpot_ms: c.predicted_tpot_ms,
            })
            .collect()
    }

    /// Routes one request over `pods` (their scraped state; `in_flight` is overwritten with
    /// the ledger's), with the `excluded` pods counted as unhealthy: the decision, the route
    /// recorded in the index, the features taken and the pod charged.
    pub fn route(
        &mut self,
        request: &RouteRequest<'_>,
        pods: &mut [PodSnapshot],
        excluded: &[PodId],
    ) -> Result<Routed, RouteError> {
        self.fill_in_flight(pods);
        self.mark_excluded(excluded);
        self.health.clear();
        for s in pods.iter_mut() {
            self.health.push(s.healthy);
            if self.excluded.get(s.id.index()).copied().unwrap_or(false) {
                s.healthy = false;
            }
        }
        let routed = self.route_healthy(request, pods);
        for (s, &h) in pods.iter_mut().zip(&self.health) {
            s.healthy = h;
        }
        routed
    }

    /// Before a decision: the blocks of `cut` still being computed on each pod, for the
    /// predictions (`predict_computed_prefix`; none otherwise).
    fn fill_prefill_caps(&mut self, cut: &crate::router::PromptCut<'_>, pods: &[PodSnapshot]) {
        let on = self.router.config().predict_computed_prefix;
        let caps = self.router.prefill_caps_mut();
        if on {
            self.prefilling.caps(cut, pods, self.now_ms, caps);
        } else {
            caps.clear();
        }
    }

    /// How long a request predicted `ttft_ms` with `features` waits before its prefill starts:
    /// its prediction less the same request's on an idle pod of its class (with
    /// `predict_computed_prefix` only; 0 otherwise). A request that reaches the pod meanwhile
    /// is scheduled in the same step.
    fn join_window_ms(&self, class: &str, features: &Features, ttft_ms: f64) -> f64 {
        if !self.router.config().predict_computed_prefix {
            return 0.0;
        }
        let idle = Features {
            kv_usage: 0.0,
            waiting: 0.0,
            running: 0.0,
            prefill_tokens_in_flight: 0.0,
            decode_tokens_in_flight: 0.0,
            ..*features
        };
        (ttft_ms - self.predictor.predict(class, &idle).ttft_ms).max(0.0)
    }

    /// After a route to `pod`, which held the first `held` of `blocks`: the rest are being
    /// computed there until the request's first token, and a request arriving within
    /// `window_ms` would compute them again (`predict_computed_prefix`).
    fn mark_prefilling(
        &mut self,
        pod: PodId,
        blocks: &[BlockHash],
        held: u32,
        window_ms: f64,
    ) -> Option<Mark> {
        if self.router.config().predict_computed_prefix {
            self.prefilling
                .start(pod, blocks, held, self.now_ms + window_ms.max(0.0))
        } else {
            None
        }
    }

    fn mark_excluded(&mut self, excluded: &[PodId]) {
        self.excluded.clear();
        for p in excluded {
            if self.excluded.len() <= p.index() {
                self.excluded.resize(p.index() + 1, false);
            }
            self.excluded[p.index()] = true;
        }
    }

    fn route_healthy(
        &mut self,
        request: &RouteRequest<'_>,
        pods: &[PodSnapshot],
    ) -> Result<Routed, RouteError> {
        if !pods.iter().any(|s| s.healthy) {
            return Err(RouteError::NoHealthyPod);
        }
        let slo_mode = self.router.uses_slo() && request.slo != RequestSlo::default();
        let cut = request.cut();
        self.fill_prefill_caps(&cut, pods);
        let decision = self
            .router
            .decide_cut(
                cut,
                request.input_tokens,
                slo_mode.then_some(request.slo),
                pods,
                &self.index,
                &self.predictor,
                &mut self.rng,
            )
            .map_err(|_| RouteError::NoDecision)?;
        // Drivers keep pod `i` at index `i`: then no search (ids are unique in a fleet).
        let snap = pods
            .get(decision.pod_id.index())
            .filter(|s| s.id == decision.pod_id)
            .or_else(|| pods.iter().find(|s| s.id == decision.pod_id))
            .ok_or(RouteError::NoDecision)?;
        let (pod_blocks, pod_block_size) = cut.blocks_for(snap);
        let matched = self.router.matched_blocks(decision.pod_id);
        self.index.record_routed(decision.pod_id, pod_blocks);
        let chosen = self
            .router
            .chosen_explanation(decision.pod_id)
            .and_then(|i| decision.pods.get(i));
        // What the pod has computed (a prefix still being prefilled there by an earlier request
        // is computed again): what the prediction was made on.
        let computed = self.router.computed_blocks(decision.pod_id);
        let prefix_score = if computed < matched {
            crate::index::prefix_score(computed, pod_blocks.len())
        } else {
            chosen.map_or(0.0, |p| p.prefix_score)
        };
        let features = Features::new(snap, request.input_tokens, prefix_score);
        let window_ms = chosen.map_or(0.0, |p| {
            self.join_window_ms(
                &snap.class,
                &features,
                p.predicted_ttft_ms - p.adapter_cost_ms,
            ) + p.predicted_tpot_ms
        });
        let prefilling = self.mark_prefilling(decision.pod_id, pod_blocks, matched, window_ms);
        let charge = prefill_charge_tokens(request.input_tokens, computed, pod_block_size);
        let share = self.ledger.charge(decision.pod_id, charge);
        // Only adapters (not the pod's base model) on LoRA pods are booked.
        let adapter = request.adapter.filter(|&a| {
            snap.lora.is_some_and(|l| l.base_model != Some(a))
                && self.adapters.routed(decision.pod_id, a)
        });
        let ticket = Ticket {
            adapter,
            share,
            class: snap.class.clone(),
            features,
            input_tokens: request.input_tokens,
            predicted_ttft_ms: chosen.map_or(0.0, |p| p.predicted_ttft_ms),
            predicted_tpot_ms: chosen.map_or(0.0, |p| p.predicted_tpot_ms),
            first_token: false,
            ttft_learnt: false,
            stage: pd::Stage::Whole,
            prefilling,
        };
        Ok(Routed { decision, ticket })
    }

    /// The healthy pod outside `excluded` with the least load
    /// ([`PodSnapshot::load_requests`] with the ledger's counters), ties to the lower id: where
    /// requests the router does not decide go (other `/v1/*` paths, bodiless requests).
    pub fn least_loaded(&mut self, pods: &mut [PodSnapshot], excluded: &[PodId]) -> Option<PodId> {
        self.fill_in_flight(pods);
        self.mark_excluded(excluded);
        let excluded = &self.excluded;
        pods.iter()
            .filter(|p| p.healthy && !excluded.get(p.id.index()).copied().unwrap_or(false))
            .min_by_key(|p| (p.load_requests(), p.id))
            .map(|p| p.id)
    }

    /// Charges a request the router did not decide (no prompt, never trained on): one request
    /// on `pod`, no tokens.
    pub fn charge_unrouted(&mut self, pod: &PodSnapshot) -> Ticket {
        Ticket {
            adapter: None,
            share: self.ledger.charge(pod.id, 0),
            class: pod.class.clone(),
            features: Features::default(),
            input_tokens: 0,
            predicted_ttft_ms: 0.0,
            predicted_tpot_ms: 0.0,
            first_token: false,
            ttft_learnt: false,
            stage: pd::Stage::Whole,
            prefilling: None,
        }
    }

    /// Another router replica routed a request to `pod` (`kvgate serve --cluster`, see
    /// [`peers`]): the same two state changes [`RouterSession::route`] makes after deciding —
    /// the prompt's `blocks` recorded in the routed index for `pod`, the pod charged one request
    /// and `prefill_tokens` (the charge the deciding replica computed) — without deciding. The
    /// ticket then moves through [`RouterSession::first_token`],
    /// [`RouterSession::tokens_generated`] and [`RouterSession::finish`] (`None`: a remote
    /// request never trains this replica's predictor) like a local one.
    pub fn route_remote(
        &mut self,
        pod: PodId,
        blocks: &[BlockHash],
        input_tokens: u32,
        prefill_tokens: u64,
    ) -> Ticket {
        if !blocks.is_empty() {
            self.index.record_routed(pod, blocks);
        }
        Ticket {
            adapter: None,
            share: self.ledger.charge(pod, prefill_tokens),
            class: "".into(),
            features: Features::default(),
            input_tokens,
            predicted_ttft_ms: 0.0,
            predicted_tpot_ms: 0.0,
            first_token: false,
            ttft_learnt: false,
            stage: pd::Stage::Whole,
            // Per replica: a sibling of another replica's request is predicted as before.
            prefilling: None,
        }
    }

    /// The first token arrived: the prefill charge moves to decode (`input + 1` tokens).
    /// Later calls do nothing.
    pub fn first_token(&mut self, ticket: &mut Ticket) {
        if ticket.first_token {
            return;
        }
        ticket.first_token = true;
        if let Some(mark) = ticket.prefilling.take() {
            self.prefilling.end(mark);
        }
        let decode = u64::from(ticket.input_tokens) + 1;
        self.ledger.first_token(&mut ticket.share, decode);
    }

    /// [`RouterSession::first_token`], and the predictor learns the TTFT now, `ttft_ms` after
    /// dispatch, instead of when the request finishes: a sample as soon as it is known, not a
    /// whole decode later (shared-prefix B in the simulator: 1000 output tokens, 8 s, while a
    /// new class answers with the analytic estimate; docs/decisions/predictor-ttft-at-first-token.md). `finish` then
    /// trains TPOT only. Returns the TTFT sample (to share with other replicas), or `None` for
    /// a P/D decode stage (its first token waits on the transfer; it trains no TTFT) and when
    /// the first token was already seen.
    pub fn first_token_learnt(
        &mut self,
        ticket: &mut Ticket,
        ttft_ms: f64,
    ) -> Option<TrainingSample> {
        if ticket.first_token {
            return None;
        }
        self.first_token(ticket);
        if ticket.stage == pd::Stage::Decode {
            return None;
        }
        ticket.ttft_learnt = true;
        let sample = TrainingSample {
            features: ticket.features,
            ttft_ms: Some(ttft_ms),
            tpot_ms: None,
        };
        self.learn(&ticket.class, &sample);
        Some(sample)
    }

    /// The first token arrived, `ttft_ms` after dispatch when the driver may train on it (the
    /// response trainable): the router's `predictor_ttft_at_first_token` decides whether the
    /// predictor learns it now ([`RouterSession::first_token_learnt`]) or the request's end
    /// does ([`RouterSession::first_token`]). The one first-token rule both drivers (gateway,
    /// simulator) run; returns the TTFT sample learnt now, for the other replicas.
    pub fn first_token_seen(
        &mut self,
        ticket: &mut Ticket,
        ttft_ms: Option<f64>,
    ) -> Option<TrainingSample> {
        match ttft_ms {
            Some(ms) if self.router.config().predictor_ttft_at_first_token => {
                self.first_token_learnt(ticket, ms)
            }
            _ => {
                self.first_token(ticket);
                None
            }
        }
    }

    /// `tokens` more tokens were generated after the first.
    pub fn tokens_generated(&mut self, ticket: &mut Ticket, tokens: u64) {
        self.ledger.add_decode(&mut ticket.share, tokens);
    }

    /// The request (or its stage) ended: its charge is returned; with an observation the
    /// predictor learns from it (features at dispatch, the pod's class): a whole request TTFT
    /// and TPOT, a P/D prefill stage TTFT only, a P/D decode stage TPOT only.
    pub fn finish(&mut self, mut ticket: Ticket, observed: Option<Observed>) {
        if let Some(a) = ticket.adapter {
            self.adapters.finished(ticket.share.pod, a);
        }
        if let Some(mark) = ticket.prefilling.take() {
            self.prefilling.end(mark);
        }
        self.ledger.release(ticket.share);
        if let Some(o) = observed {
            self.learn(&ticket.class, &ticket.training_sample(&o));
        }
    }

    /// The predictor learns `sample` for pods of `class` (a local finish, or another
    /// replica's request on one of its pods). A sample with non-finite features or targets
    /// out of the predictor's bounds is refused and counted there, never applied.
    pub fn learn(&mut self, class: &str, sample: &TrainingSample) {
        self.predictor
            .observe_targets(class, &sample.features, sample.ttft_ms, sample.tpot_ms);
    }
}

#[cfg(test)]
mod tests;

/// A session with the default router, the affinity gate and the default predictor, seeded with
/// `seed`: the starting point of the session modules' unit tests.
#[cfg(test)]
pub(crate) fn test_session(seed: u64) -> RouterSession {
    RouterSession::new(
        crate::config::RouterConfig::default(),
        crate::policy::PolicyKind::AffinityGate,
        crate::predictor::PredictorConfig::default(),
        seed,
    )
}
