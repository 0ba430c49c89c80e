//! The gateway's side of the core request lifecycle ([`kvgate_core::RouterSession`]): a
//! request's [`Ticket`] held with the pod it went to, given back exactly once.
//!
//! The session (behind [`crate::state::Shared::session`]'s mutex, held for microseconds)
//! decides, charges and trains; [`TicketGuard`] only carries the ticket between the
//! transitions the HTTP proxy and the ext_proc picker observe (first token, more tokens, the
//! end) and returns it in `Drop` whatever path the request ends on (done, upstream error,
//! client abort, retry elsewhere), so no ending can leak a charge.

use crate::pods::Pod;
use crate::state::Shared;
use kvgate_core::{Observed, Ticket};
use std::sync::Arc;

/// One request's ticket and pod; see the module docs.
pub struct TicketGuard {
    shared: Arc<Shared>,
    pod: Arc<Pod>,
    ticket: Option<Ticket>,
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
    pub fn new(shared: Arc<Shared>, pod: Arc<Pod>, ticket: Ticket) -> Self {
        TicketGuard {
            shared,
            pod,
            ticket: Some(ticket),
        }
    }

    /// A request the router does not decide (other `/v1/*`, bodiless): charged as one request
    /// on `pod`, never trained on.
    pub fn unrouted(shared: Arc<Shared>, pod: Arc<Pod>) -> Self {
        let ticket = shared.session.lock().charge_unrouted(&pod.snapshot());
        TicketGuard::new(shared, pod, ticket)
    }

    pub fn pod(&self) -> &Arc<Pod> {
        &self.pod
    }

    /// The first token arrived (later calls do nothing).
    pub fn first_token(&mut self) {
        if let Some(t) = self.ticket.as_mut()
            && !t.has_first_token()
        {
            self.shared.session.lock().first_token(t);
        }
    }

    /// `tokens` more tokens streamed after the first.
    pub fn tokens_generated(&mut self, tokens: u64) {
        if tokens == 0 {
            return;
        }
        if let Some(t) = self.ticket.as_mut() {
            self.shared.session.lock().tokens_generated(t, tokens);
        }
    }

    /// The request ended; with an observation the predictor learns from it.
    pub fn finish(mut self, observed: Option<Observed>) {
        if let Some(t) = self.ticket.take() {
            self.shared.session.lock().finish(t, observed);
        }
    }
}

impl Drop for TicketGuard {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.shared.session.lock().finish(t, None);
        }
    }
}
