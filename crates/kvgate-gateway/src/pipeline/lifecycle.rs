//! The gateway's side of the core request lifecycle ([`kvgate_core::RouterSession`]): a
//! request's [`Ticket`] held with the pod it went to, given back exactly once.
//!
//! The session ([`crate::handles::session::SessionHandle`]: its mutex held for microseconds)
//! decides, charges and trains; [`TicketGuard`] only carries the ticket between the
//! transitions the HTTP proxy and the ext_proc picker observe (first token, more tokens, the
//! end) and returns it in `Drop` whatever path the request ends on (done, upstream error,
//! client abort, retry elsewhere), so no ending can leak a charge.
//!
//! With `--cluster` the session handle also reports each transition to its observer, the
//! core's replica machine ([`crate::cluster`]): the route with its blocks and charge, the first
//! token, every decode token (the machine sends them in steps of 32), the end. The other
//! replicas apply them as the same transitions of their own sessions.

use crate::decisions::DecisionRecord;
use crate::pods::Pod;
use crate::state::Shared;
use kvgate_core::{BlockHash, Observed, Ticket};
use std::sync::Arc;

/// One request's ticket and pod; see the module docs.
pub struct TicketGuard {
    shared: Arc<Shared>,
    pod: Arc<Pod>,
    ticket: Option<Ticket>,
    /// With `--cluster`: the request's id there.
    shared_as: Option<u64>,
    /// With `--decisions-log`: the request's decision record, completed at its end.
    record: Option<Box<DecisionRecord>>,
}

impl std::fmt::Debug for TicketGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketGuard")
            .field("pod", &self.pod.url)
            .field("ticket", &self.ticket)
            .finish()
    }
}

impl TicketGuard {
    /// A routed request's ticket; `blocks` are the prompt's blocks recorded for the pod (what
    /// the other replicas record too).
    pub fn new(shared: Arc<Shared>, pod: Arc<Pod>, ticket: Ticket, blocks: &[BlockHash]) -> Self {
        let shared_as = shared.session.routed(&pod, &ticket, blocks);
        TicketGuard {
            shared,
            pod,
            ticket: Some(ticket),
            shared_as,
            record: None,
        }
    }

    /// Keeps the request's decision record, to complete and log when the request ends
    /// (`--decisions-log`).
    pub fn keep_record(&mut self, record: DecisionRecord) {
        self.record = Some(Box::new(record));
    }

    /// A request the router does not decide (other `/v1/*`, bodiless): charged as one request
    /// on `pod`, never trained on.
    pub fn unrouted(shared: Arc<Shared>, pod: Arc<Pod>) -> Self {
        let ticket = shared.session.charge_unrouted(&pod);
        TicketGuard::new(shared, pod, ticket, &[])
    }

    pub fn pod(&self) -> &Arc<Pod> {
        &self.pod
    }

    /// The first token arrived (later calls do nothing). `ttft_ms`: the TTFT the predictor may
    /// learn from (dispatch to first token, the response trainable); it does so now when the
    /// router's `predictor_ttft_at_first_token` is on ([`RouterSession::first_token_learnt`]:
    /// the end of the request then trains the TPOT only), and the sample goes to the other
    /// replicas with the first token.
    pub fn first_token(&mut self, ttft_ms: Option<f64>) {
        if let Some(t) = self.ticket.as_mut()
            && !t.has_first_token()
        {
            self.shared.session.first_token(t, ttft_ms, self.shared_as);
        }
    }

    /// `tokens` more tokens streamed after the first.
    pub fn tokens_generated(&mut self, tokens: u64) {
        if tokens == 0 {
            return;
        }
        if let Some(t) = self.ticket.as_mut() {
            self.shared
                .session
                .tokens_generated(t, tokens, self.shared_as);
        }
    }

    /// The request ended; with an observation the predictor learns from it.
    pub fn finish(mut self, observed: Option<Observed>) {
        self.end(observed);
    }

    fn end(&mut self, observed: Option<Observed>) {
        if let Some(t) = self.ticket.take() {
            let sample = observed.as_ref().map(|o| t.training_sample(o));
            if let (Some(s), Some(o)) = (&sample, &observed) {
                // `RUST_LOG=kvgate::samples=debug`: every sample with the prediction made at
                // dispatch, to compare what replicas saw (docs/decisions/cluster-sharing.md).
                let f = &s.features;
                tracing::debug!(
                    target: "kvgate::samples",
                    pod = t.pod().index(),
                    predicted_ttft_ms = t.predicted_ttft_ms(),
                    observed_ttft_ms = o.ttft_ms,
                    kv_usage = f.kv_usage,
                    waiting = f.waiting,
                    running = f.running,
                    prefill_in_flight = f.prefill_tokens_in_flight,
                    decode_in_flight = f.decode_tokens_in_flight,
                    input_tokens = f.input_tokens,
                    prefix_score = f.prefix_score,
                    "training sample"
                );
            }
            if let Some(record) = self.record.take() {
                self.shared.telemetry.decisions.ended(*record, observed);
            }
            self.shared
                .session
                .finish(t, observed, sample, self.shared_as.take());
        }
    }
}

impl Drop for TicketGuard {
    fn drop(&mut self) {
        self.end(None);
    }
}
