//! The request pipeline of every completion, one stack for both transports (the HTTP proxy
//! and the ext_proc picker), one file per stage:
//!
//! ```text
//! transport (proxy | ext_proc): admission slot, body read
//!   ─► ready::ready      prepare (parse, SLO, blocks, limits, capture) ─► flow class ─► cost
//!                        ─► flow turn (the slot lent back while queued)
//!   ─► dispatch::dispatch  decide (excluded, closed pods) ─► [P/D: prefill call, decode pick]
//!                        ─► Deliver::deliver (transport: forward and stream | name the pod to
//!                           Envoy) ─► failed before any byte: retry (budget) on another pod
//! ```
//!
//! The transports keep only transport work: reading the request, answering errors in their own
//! wire form, and sending or naming the pod.

pub(crate) mod dispatch;
mod ready;

// The pipeline's parts the stages share (the crate root re-exports them).
pub mod body;
pub mod flow;
pub mod lifecycle;
pub mod pd;
pub mod routing;
pub mod sse;
pub mod upstream;

pub(crate) use dispatch::{
    Deliver, Delivery, Dispatch, DispatchError, Failure, PodAnswer, Target, dispatch,
};
pub(crate) use ready::{Ready, ready};
