//! Prefill/decode (P/D) disaggregation: one request routed as two stages, a prefill pod and a
//! decode pod, each with its own ticket.
//!
//! [`RouterSession::route_pd`] is the route every driver that can hand a request over between
//! two pods calls (the gateway's HTTP proxy). It answers:
//!
//! - [`Route::Whole`] — the fleet has no pod of a dedicated role (`prefill` or `decode`, see
//!   [`PodRole`]): exactly [`RouterSession::route`], so a fleet without roles routes as before.
//!   Also when the prefill pick is a `both` pod (it serves the request whole: its own prefill is
//!   the one decode reads, no transfer), and the fallback when no usable prefill-capable or no
//!   usable decode-capable pod is left: the request goes whole to a `both` pod, if any.
//! - [`Route::Disaggregated`] — two stages:
//!   1. **prefill**: the router's policy (the affinity gate by default: predicted TTFT and the
//!      prefix score, whose cache is the prefill pod's) over the usable prefill-capable pods
//!      (`prefill` and `both`); the prompt's blocks are recorded for that pod and it is charged
//!      one request and the uncached prompt tokens, as a whole request is. The driver ends the
//!      ticket when the prefill call returns (`finish(ticket, Some(observed))` trains the
//!      pod's class on TTFT only), so the charge is held only while the prefill runs.
//!   2. **decode**: the usable decode-capable pod (`decode` and `both`, the prefill pod apart)
//!      with the least predicted TPOT (the pod's features, prefix score 1: the whole prompt
//!      arrives by transfer), ties to the fewest decode tokens in flight, the fewest requests,
//!      the lower id. It is charged one request and no prefill tokens (it computes none); its
//!      first token moves `input + 1` tokens to decode, like a whole request's. Its `finish`
//!      trains TPOT only. The prompt's blocks are recorded for it too (it holds them once
//!      pulled).
//!
//! "Usable" = healthy and not in `excluded`. The driver's retries follow from that: a failed
//! prefill pod is excluded and the request routed again (another prefill pod, or a whole
//! request on a `both` pod when none is left); a decode pod that fails before its first byte is
//! excluded and the request routed again, with a fresh prefill (the transfer's blocks are
//! single-use).
//!
//! The decision's explanation is the prefill pick's, with [`Decision::decode`] holding the
//! decode pick and its candidates.
//!
//! Bounds: O(pods) per route, freed after it; two tickets per P/D request.

use super::{RouteError, RouteRequest, Routed, RouterSession, Ticket};
use crate::decision::{Decision, DecodeCandidate, DecodeExplanation};
use crate::index::PrefixIndex;
use crate::pod::{PodId, PodRole, PodSnapshot};
use crate::predictor::Features;

/// Which part of a request a [`Ticket`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// A whole request on one pod.
    Whole,
    /// The prefill stage of a P/D request (ends when the prefill call returns).
    Prefill,
    /// The decode stage of a P/D request.
    Decode,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Whole => "whole",
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
        }
    }
}

/// A request routed as two stages.
#[derive(Debug)]
pub struct PdRouted {
    /// The prefill pick's decision, with [`Decision::decode`] set.
    pub decision: Decision,
    pub prefill: Ticket,
    pub decode: Ticket,
}

impl PdRouted {
    pub fn prefill_pod(&self) -> PodId {
        self.prefill.pod()
    }

    pub fn decode_pod(&self) -> PodId {
        self.decode.pod()
    }
}

/// What [`RouterSession::route_pd`] decided.
// `Whole` unboxed: it is what every request of a fleet without roles gets (as `route`'s
// `Routed`, moved once); the rarer split is boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Route {
    Whole(Routed),
    Disaggregated(Box<PdRouted>),
}

impl RouterSession {
    /// Routes one request over `pods`, in two stages when the fleet has pods of a dedicated
    /// role; see the module docs.
    pub fn route_pd(
        &mut self,
        request: &RouteRequest<'_>,
        pods: &mut [PodSnapshot],
        excluded: &[PodId],
    ) -> Result<Route, RouteError> {
        if pods.iter().all(|p| p.role == PodRole::Both) {
            return self.route(request, pods, excluded).map(Route::Whole);
        }
        self.fill_in_flight(pods);
        self.mark_excluded(excluded);
        self.health.clear();
        self.health.extend(pods.iter().map(|s| s.healthy));
        let routed = self.route_stages(request, pods);
        for (s, &h) in pods.iter_mut().zip(&self.health) {
            s.healthy = h;
        }
        routed
    }

    /// `pods[i].healthy` is the pod's health before exclusions (also in `self.health`).
    fn route_stages(
        &mut self,
        request: &RouteRequest<'_>,
        pods: &mut [PodSnapshot],
    ) -> Result<Route, RouteError> {
        let usable: Vec<bool> = pods
            .iter()
            .map(|s| s.healthy && !self.excluded.get(s.id.index()).copied().unwrap_or(false))
            .collect();
        let any = |f: fn(PodRole) -> bool| pods.iter().zip(&usable).any(|(s, &u)| u && f(s.role));
        if !(any(PodRole::can_prefill) && any(PodRole::can_decode)) {
            // No split possible: a whole request on a `both` pod.
            for (s, &u) in pods.iter_mut().zip(&usable) {
                s.healthy = u && s.role == PodRole::Both;
            }
            return self.route_healthy(request, pods).map(Route::Whole);
        }
        for (s, &u) in pods.iter_mut().zip(&usable) {
            s.healthy = u && s.role.can_prefill();
        }
        let mut prefill = self.route_healthy(request, pods)?;
        let prefill_pod = prefill.decision.pod_id;
        let prefill_role = pods
            .iter()
            .find(|s| s.id == prefill_pod)
            .map_or(PodRole::Both, |s| s.role);
        if prefill_role == PodRole::Both {
            return Ok(Route::Whole(prefill));
        }
        let Some(pick) = self.pick_decode(request, pods, &usable, prefill_pod) else {
            // Cannot happen (a decode-capable usable pod exists and the prefill pod is not
            // one); return the charge rather than trust it.
            self.ledger.release(prefill.ticket.share);
            return Err(RouteError::NoHealthyPod);
        };
        let snap = &pods[pick.index];
        let (blocks, _) = request.cut().blocks_for(snap);
        self.index.record_routed(snap.id, blocks);
        // The decode pod runs the adapter too: booked as on a whole request's pod.
        let adapter = request.adapter.filter(|&a| {
            snap.lora.is_some_and(|l| l.base_model != Some(a)) && self.adapters.routed(snap.id, a)
        });
        let decode = Ticket {
            adapter,
            share: self.ledger.charge(snap.id, 0),
            class: snap.class.clone(),
            features: pick.features,
            input_tokens: request.input_tokens,
            // The request's predicted TTFT is the prefill pick's (the transfer not included):
            // what a driver reports next to the TTFT its client saw.
            predicted_ttft_ms: prefill.ticket.predicted_ttft_ms,
            predicted_tpot_ms: pick.predicted_tpot_ms,
            first_token: false,
            ttft_learnt: false,
            stage: Stage::Decode,
            prefilling: None,
        };
        prefill.ticket.stage = Stage::Prefill;
        prefill.decision.decode = Some(pick.explanation);
        Ok(Route::Disaggregated(Box::new(PdRouted {
            decision: prefill.decision,
            prefill: prefill.ticket,
            decode,
        })))
    }

    /// The decode pick over the usable decode-capable pods other than `prefill_pod`.
    fn pick_decode(
        &self,
        request: &RouteRequest<'_>,
        pods: &[PodSnapshot],
        usable: &[bool],
        prefill_pod: PodId,
    ) -> Option<DecodePick> {
        let mut candidates = Vec::new();
        let mut best: Option<(usize, f64, Features)> = None;
        for (i, (s, &u)) in pods.iter().zip(usable).enumerate() {
            if !u || !s.role.can_decode() || s.id == prefill_pod {
                continue;
            }
            let features = Features::new(s, request.input_tokens, 1.0);
            let tpot = self.predictor.predict(&s.class, &features).tpot_ms;
            candidates.push(DecodeCandidate {
                id: s.name.clone(),
                predicted_tpot_ms: tpot,
                decode_tokens_in_flight: s.in_flight.decode_tokens,
                requests_in_flight: s.in_flight.requests,
            });
            let key = |s: &PodSnapshot| (s.in_flight.decode_tokens, s.load_requests(), s.id);
            let better = match &best {
                None => true,
                Some((b, btpot, _)) => tpot
                    .total_cmp(btpot)
                    .then_with(|| key(s).cmp(&key(&pods[*b])))
                    .is_lt(),
            };
            if better {
                best = Some((i, tpot, features));
            }
        }
        let (index, predicted_tpot_ms, features) = best?;
        Some(DecodePick {
            index,
            predicted_tpot_ms,
            features,
            explanation: DecodeExplanation {
                pod: pods[index].name.clone(),
                pod_id: pods[index].id,
                pods: candidates,
            },
        })
    }
}

struct DecodePick {
    index: usize,
    predicted_tpot_ms: f64,
    features: Features,
    explanation: DecodeExplanation,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::BlockHash;
    use crate::policy::RequestSlo;
    use crate::session::Observed;

    fn session() -> RouterSession {
        super::super::test_session(7)
    }

    fn pod(id: u32, role: PodRole) -> PodSnapshot {
        let mut p = PodSnapshot::idle(id, "c", 10_000);
        p.role = role;
        p
    }

    fn request(blocks: &[BlockHash], input_tokens: u32) -> RouteRequest<'_> {
        RouteRequest {
            blocks,
            input_tokens,
            block_size_tokens: 16,
            other_sizes: &[],
            slo: RequestSlo::default(),
            adapter: None,
        }
    }

    fn blocks(n: u64, salt: u64) -> Vec<BlockHash> {
        (0..n).map(|i| salt * 1000 + i).collect()
    }

    fn split(route: Route) -> Box<PdRouted> {
        match route {
            Route::Disaggregated(pd) => pd,
            Route::Whole(r) => panic!("routed whole to {}", r.decision.pod),
        }
    }

    #[test]
    fn a_fleet_without_roles_routes_whole_requests_as_route_does() {
        let b = blocks(4, 1);
        let mut pods = vec![pod(0, PodRole::Both), pod(1, PodRole::Both)];
        let (mut a, mut c) = (session(), session());
        let whole = match a.route_pd(&request(&b, 64), &mut pods, &[]).unwrap() {
            Route::Whole(r) => r,
            Route::Disaggregated(_) => panic!("split without roles"),
        };
        let plain = c.route(&request(&b, 64), &mut pods, &[]).unwrap();
        assert_eq!(whole.decision, plain.decision);
        assert_eq!(whole.ticket.stage(), Stage::Whole);
        assert_eq!(whole.ticket.prefill_tokens(), plain.ticket.prefill_tokens());
    }

    #[test]
    fn prefill_goes_to_a_prefill_pod_and_decode_to_a_decode_pod_with_both_explained() {
        let b = blocks(4, 1);
        let mut pods = vec![
            pod(0, PodRole::Decode),
            pod(1, PodRole::Prefill),
            pod(2, PodRole::Decode),
        ];
        pods[0].in_flight.decode_tokens = 0;
        let mut s = session();
        let pd = split(s.route_pd(&request(&b, 64), &mut pods, &[]).unwrap());
        assert_eq!(pd.prefill_pod(), PodId(1));
        assert_eq!(pd.prefill.stage(), Stage::Prefill);
        assert_eq!(pd.decode.stage(), Stage::Decode);
        // The request's predicted TTFT rides on the decode ticket too (drivers report it).
        assert!(pd.prefill.predicted_ttft_ms() > 0.0);
        assert_eq!(
            pd.decode.predicted_ttft_ms(),
            pd.prefill.predicted_ttft_ms()
        );
        assert_eq!(&*pd.decision.pod, "pod-1");
        // Only the prefill pod was a prefill candidate.
        assert_eq!(pd.decision.pods.len(), 1);
        let decode = pd.decision.decode.as_ref().unwrap();
        assert_eq!(decode.pods.len(), 2);
        // Idle twins: the lower id.
        assert_eq!(&*decode.pod, "pod-0");
        assert_eq!(pd.decode_pod(), PodId(0));
        // Charges: the prefill pod the uncached prompt, the decode pod one request, no prefill.
        assert_eq!(s.in_flight(PodId(1)).prefill_tokens, 64);
        assert_eq!(s.in_flight(PodId(1)).requests, 1);
        assert_eq!(s.in_flight(PodId(0)).prefill_tokens, 0);
        assert_eq!(s.in_flight(PodId(0)).requests, 1);
        let json = serde_json::to_value(&pd.decision).unwrap();
        assert_eq!(json["pod"], "pod-1");
        assert_eq!(json["decode"]["pod"], "pod-0");
    }

    #[test]
    fn each_stage_trains_its_own_targets_and_a_ttft_learnt_early_is_not_trained_again() {
        let b = blocks(4, 1);
        let mut pods = vec![pod(0, PodRole::Decode), pod(1, PodRole::Prefill)];
        let mut s = session();
        let mut pd = split(s.route_pd(&request(&b, 64), &mut pods, &[]).unwrap());
        let observed = Observed {
            ttft_ms: 20.0,
            tpot_ms: Some(5.0),
        };
        let targets = |t: &Ticket| {
            let sample = t.training_sample(&observed);
            (sample.ttft_ms, sample.tpot_ms)
        };
        assert_eq!(targets(&pd.prefill), (Some(20.0), None));
        assert_eq!(targets(&pd.decode), (None, Some(5.0)));
        s.first_token_learnt(&mut pd.prefill, 20.0);
        assert_eq!(
            targets(&pd.prefill),
            (None, None),
            "learnt once, at the first token"
        );
    }

    #[test]
    fn the_prefill_charge_ends_with_the_prefill_call_and_decode_load_stays_on_the_decode_pod() {
        let b = blocks(4, 1);
        let mut pods = vec![pod(0, PodRole::Prefill), pod(1, PodRole::Decode)];
        let mut s = session();
        let mut pd = *split(s.route_pd(&request(&b, 64), &mut pods, &[]).unwrap());
        let observed = Observed {
            ttft_ms: 40.0,
            tpot_ms: None,
        };
        s.finish(pd.prefill, Some(observed));
        assert_eq!(s.in_flight(PodId(0)), crate::InFlight::default());
        s.first_token(&mut pd.decode);
        s.tokens_generated(&mut pd.decode, 9);
        assert_eq!(s.in_flight(PodId(1)).decode_tokens, 64 + 1 + 9);
        assert_eq!(s.in_flight(PodId(1)).requests, 1);
        s.finish(
            pd.decode,
            Some(Observed {
                ttft_ms: 5.0,
                tpot_ms: Some(12.0),
            }),
        );
        assert_eq!(s.in_flight_total(), 0);
    }

    #[test]
    fn decode_goes_to_the_pod_with_fewer_decode_tokens_when_predictions_tie() {
        let b = blocks(2, 3);
        let mut pods = vec![
            pod(0, PodRole::Prefill),
            pod(1, PodRole::Decode),
            pod(2, PodRole::Decode),
        ];
        let mut s = session();
        // Load pod 1 with a decoding request.
        let mut first = *split(s.route_pd(&request(&b, 500), &mut pods, &[]).unwrap());
        assert_eq!(first.decode_pod(), PodId(1));
        s.finish(first.prefill, None);
        s.first_token(&mut first.decode);
        let second = split(s.route_pd(&request(&b, 32), &mut pods, &[]).unwrap());
        let d = second.decision.decode.as_ref().unwrap();
        let tpot = |name: &str| {
            d.pods
                .iter()
                .find(|c| &*c.id == name)
                .map(|c| c.predicted_tpot_ms)
                .unwrap()
        };
        // The loaded pod is predicted no faster, so the idle one wins.
        assert!(tpot("pod-1") >= tpot("pod-2"));
        assert_eq!(second.decode_pod(), PodId(2));
    }

    #[test]
    fn the_prefill_pick_follows_the_prefill_pods_prefix_cache() {
        let b = blocks(8, 5);
        let mut pods = vec![
            pod(0, PodRole::Prefill),
            pod(1, PodRole::Prefill),
            pod(2, PodRole::Decode),
        ];
        let mut s = session();
        s.index_mut().record_routed(PodId(1), &b);
        let pd = split(s.route_pd(&request(&b, 128), &mut pods, &[]).unwrap());
        assert_eq!(pd.prefill_pod(), PodId(1));
        assert_eq!(pd.decision.branch.as_str(), "exploit");
        // Everything was cached: no prefill tokens charged.
        assert_eq!(pd.prefill.prefill_tokens(), 0);
    }

    #[test]
    fn a_failed_prefill_pod_is_excluded_and_without_prefill_pods_a_both_pod_serves_it_whole() {
        let b = blocks(2, 9);
        let mut pods = vec![
            pod(0, PodRole::Prefill),
            pod(1, PodRole::Prefill),
            pod(2, PodRole::Decode),
            pod(3, PodRole::Both),
        ];
        // Pod 3 is busy, so the first picks are the dedicated pods.
        pods[3].waiting = 50;
        pods[3].running = 50;
        let mut s = session();
        let first = split(s.route_pd(&request(&b, 64), &mut pods, &[]).unwrap());
        let p1 = first.prefill_pod();
        assert!(p1 == PodId(0) || p1 == PodId(1));
        let other = if p1 == PodId(0) { PodId(1) } else { PodId(0) };
        let second = split(s.route_pd(&request(&b, 64), &mut pods, &[p1]).unwrap());
        assert_eq!(second.prefill_pod(), other);
        // Both prefill pods failed: the `both` pod (prefill-capable) is the last prefill
        // candidate and serves the request whole.
        match s.route_pd(&request(&b, 64), &mut pods, &[PodId(0), PodId(1)]) {
            Ok(Route::Whole(r)) => assert_eq!(r.decision.pod_id, PodId(3)),
            other => panic!("{other:?}"),
        }
        // Health is restored after the exclusions.
        assert!(pods.iter().all(|p| p.healthy));
    }

    #[test]
    fn no_decode_pod_left_falls_back_to_a_whole_request_on_a_both_pod_or_fails() {
        let b = blocks(2, 9);
        let mut pods = vec![pod(0, PodRole::Prefill), pod(1, PodRole::Decode)];
        let mut s = session();
        assert_eq!(
            s.route_pd(&request(&b, 64), &mut pods, &[PodId(1)])
                .unwrap_err(),
            RouteError::NoHealthyPod
        );
        pods.push(pod(2, PodRole::Both));
        pods[2].waiting = 99;
        // Pod 0 (prefill) and pod 2 (both, busy) are prefill candidates; pod 2 is the only
        // decode-capable one left: prefill on the idle pod 0, decode on pod 2.
        let pd = split(
            s.route_pd(&request(&b, 64), &mut pods, &[PodId(1)])
                .unwrap(),
        );
        assert_eq!((pd.prefill_pod(), pd.decode_pod()), (PodId(0), PodId(2)));
        // Without the prefill pod either, pod 2 serves it whole.
        match s.route_pd(&request(&b, 64), &mut pods, &[PodId(0), PodId(1)]) {
            Ok(Route::Whole(r)) => assert_eq!(r.decision.pod_id, PodId(2)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stages_train_their_own_target() {
        let b = blocks(2, 4);
        let mut pods = vec![pod(0, PodRole::Prefill), pod(1, PodRole::Decode)];
        let mut s = session();
        let before = s.predictor().accuracy();
        let pd = *split(s.route_pd(&request(&b, 64), &mut pods, &[]).unwrap());
        let both = Observed {
            ttft_ms: 30.0,
            tpot_ms: Some(10.0),
        };
        s.finish(pd.prefill, Some(both));
        let after_prefill = s.predictor().accuracy();
        s.finish(pd.decode, Some(both));
        let after_decode = s.predictor().accuracy();
        assert_eq!(after_prefill.samples, before.samples + 1);
        assert_eq!(after_prefill.tpot_samples, before.tpot_samples);
        assert_eq!(after_decode.samples, after_prefill.samples);
        assert_eq!(after_decode.tpot_samples, after_prefill.tpot_samples + 1);
    }
}
