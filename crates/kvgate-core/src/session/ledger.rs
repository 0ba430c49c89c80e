//! The router's own in-flight ledger: per pod, the work it dispatched that has not finished
//! ([`InFlight`]), and the one formula that says what a request is charged.
//!
//! # The charge (the only place it is computed)
//!
//! - At dispatch: one request, and `prefill = input_tokens − matched_blocks × block_size_tokens`
//!   (at least 0) uncached prompt tokens: the tokens the pod must compute because the index
//!   does not place them in its prefix cache. Whole blocks only, as engines cache them
//!   ([`prefill_charge_tokens`]).
//! - At the first token: the prefill share is returned and `input_tokens + 1` decode tokens
//!   are charged (the sequence's KV working set: the prompt and the first generated token).
//! - Each further generated token: one more decode token.
//! - At the end (finished, failed, aborted): every share is returned.
//!
//! # Pod generations
//!
//! Pod ids are dense and reused (a removed pod's id goes to the next new pod). Removing a pod
//! zeroes its counters and bumps its generation; a ticket of the old generation then returns
//! nothing, so a request that outlives its pod cannot take load off the pod that reused its id.
//!
//! Bounds: one [`InFlight`] and one generation per pod id (ids < 65,536, the indexes' bound).

use crate::pod::{InFlight, PodId};

/// Uncached prompt tokens charged to a pod at dispatch: the prompt minus the leading blocks
/// the index says the pod holds, never below 0.
pub fn prefill_charge_tokens(
    input_tokens: u32,
    matched_blocks: u32,
    block_size_tokens: u32,
) -> u64 {
    let cached = u64::from(matched_blocks) * u64::from(block_size_tokens);
    u64::from(input_tokens).saturating_sub(cached)
}

/// Per-pod counters with their generation; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    pods: Vec<PodLedger>,
}

#[derive(Debug, Clone, Copy, Default)]
struct PodLedger {
    in_flight: InFlight,
    generation: u32,
}

/// What one request holds on one pod (kept in its [`super::Ticket`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Share {
    pub pod: PodId,
    pub generation: u32,
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
}

impl Ledger {
    /// The pod's counters now (zeros for a pod never charged).
    pub fn in_flight(&self, pod: PodId) -> InFlight {
        self.pods
            .get(pod.index())
            .map(|p| p.in_flight)
            .unwrap_or_default()
    }

    fn slot(&mut self, pod: PodId) -> &mut PodLedger {
        if self.pods.len() <= pod.index() {
            self.pods.resize(pod.index() + 1, PodLedger::default());
        }
        &mut self.pods[pod.index()]
    }

    /// The share of the pod's current generation a share refers to, if it is still that one.
    fn live(&mut self, share: &Share) -> Option<&mut InFlight> {
        self.pods
            .get_mut(share.pod.index())
            .filter(|p| p.generation == share.generation)
            .map(|p| &mut p.in_flight)
    }

    /// Charges one request with `prefill_tokens` uncached prompt tokens.
    pub(crate) fn charge(&mut self, pod: PodId, prefill_tokens: u64) -> Share {
        let p = self.slot(pod);
        p.in_flight.requests = p.in_flight.requests.saturating_add(1);
        p.in_flight.prefill_tokens = p.in_flight.prefill_tokens.saturating_add(prefill_tokens);
        Share {
            pod,
            generation: p.generation,
            prefill_tokens,
            decode_tokens: 0,
        }
    }

    /// The first token: prefill returned, `decode_tokens` charged.
    pub(crate) fn first_token(&mut self, share: &mut Share, decode_tokens: u64) {
        let prefill = std::mem::take(&mut share.prefill_tokens);
        share.decode_tokens = share.decode_tokens.saturating_add(decode_tokens);
        if let Some(f) = self.live(share) {
            f.prefill_tokens = f.prefill_tokens.saturating_sub(prefill);
            f.decode_tokens = f.decode_tokens.saturating_add(decode_tokens);
        }
    }

    /// More decode tokens.
    pub(crate) fn add_decode(&mut self, share: &mut Share, tokens: u64) {
        share.decode_tokens = share.decode_tokens.saturating_add(tokens);
        if let Some(f) = self.live(share) {
            f.decode_tokens = f.decode_tokens.saturating_add(tokens);
        }
    }

    /// Returns everything the share holds.
    pub(crate) fn release(&mut self, share: Share) {
        if let Some(f) = self.live(&share) {
            f.requests = f.requests.saturating_sub(1);
            f.prefill_tokens = f.prefill_tokens.saturating_sub(share.prefill_tokens);
            f.decode_tokens = f.decode_tokens.saturating_sub(share.decode_tokens);
        }
    }

    /// Forgets a pod: counters zeroed, generation bumped (see the module docs).
    pub fn remove_pod(&mut self, pod: PodId) {
        if let Some(p) = self.pods.get_mut(pod.index()) {
            p.in_flight = InFlight::default();
            p.generation = p.generation.wrapping_add(1);
        }
    }

    /// Sum over pods of every counter (0 when nothing is in flight).
    pub fn total(&self) -> u64 {
        self.pods
            .iter()
            .map(|p| {
                u64::from(p.in_flight.requests)
                    + p.in_flight.prefill_tokens
                    + p.in_flight.decode_tokens
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_charge_is_the_prompt_minus_whole_matched_blocks() {
        // 4,010 tokens, 250 of 251 blocks of 16 matched: 4,010 − 4,000 = 10 tokens to compute.
        assert_eq!(prefill_charge_tokens(4_010, 250, 16), 10);
        assert_eq!(prefill_charge_tokens(4_010, 0, 16), 4_010);
        // Cold pod with 128-token blocks (vLLM on CPU): nothing subtracted.
        assert_eq!(prefill_charge_tokens(100, 0, 128), 100);
        // An index that claims more than the prompt never charges below 0.
        assert_eq!(prefill_charge_tokens(10, 5, 16), 0);
        assert_eq!(prefill_charge_tokens(u32::MAX, u32::MAX, u32::MAX), 0);
    }

    #[test]
    fn a_share_returns_exactly_what_it_took_at_every_stage() {
        let mut l = Ledger::default();
        let pod = PodId(3);
        let mut s = l.charge(pod, 100);
        assert_eq!(
            l.in_flight(pod),
            InFlight {
                requests: 1,
                prefill_tokens: 100,
                decode_tokens: 0
            }
        );
        l.first_token(&mut s, 121);
        l.add_decode(&mut s, 3);
        assert_eq!(
            l.in_flight(pod),
            InFlight {
                requests: 1,
                prefill_tokens: 0,
                decode_tokens: 124
            }
        );
        l.release(s);
        assert_eq!(l.in_flight(pod), InFlight::default());
        assert_eq!(l.total(), 0);
    }

    #[test]
    fn a_share_of_a_removed_pod_does_not_touch_the_pod_that_reuses_its_id() {
        let mut l = Ledger::default();
        let old = l.charge(PodId(0), 50);
        l.remove_pod(PodId(0));
        let new = l.charge(PodId(0), 7);
        l.release(old);
        assert_eq!(
            l.in_flight(PodId(0)),
            InFlight {
                requests: 1,
                prefill_tokens: 7,
                decode_tokens: 0
            }
        );
        l.release(new);
        assert_eq!(l.total(), 0);
    }
}
