//! The pipeline's first half ([`ready`]): prepare the request (parse, SLO headers, blocks,
//! limits, capture ticket; 400 on bad input with no pod touched), check that some pod serves
//! its model (404 `model_not_found` from kvgate itself, [`crate::served_models`]), class it for flow control
//! (priority, tenant), price it (input tokens + `max_tokens`, or
//! `flow::DEFAULT_COST_MAX_TOKENS`), and wait for its flow turn (at once with flow control
//! off), lending the admission slot back while queued. The second half is
//! [`super::dispatch`].
//!
//! Errors are OpenAI-style [`ApiError`]s; those of flow control carry `Retry-After` when the
//! transport answers them ([`crate::flow::retry_after`]).

use crate::config::GatewayConfig;
use crate::errors::ApiError;
use crate::flow::FlowClass;
use crate::flow_gate::Turn;
use crate::limits::Slot;
use crate::routing::Prepared;
use crate::state::Shared;
use bytes::Bytes;
use http::HeaderMap;
use std::sync::Arc;

/// A request that may be routed now.
pub(crate) struct Ready {
    pub prepared: Prepared,
    pub class: FlowClass,
    /// Held until the request is routed (the flow driver counts it as being dispatched).
    pub turn: Turn,
}

/// The flow-control price of a request: its input tokens and the tokens it may generate.
pub(crate) fn cost_tokens(prepared: &Prepared) -> u64 {
    u64::from(prepared.input_tokens)
        + prepared
            .parsed
            .max_tokens
            .map_or(crate::flow::DEFAULT_COST_MAX_TOKENS, u64::from)
}

/// Prepares, classes and prices a completion request and waits for its turn (see the module
/// docs). `deadline`: the request's own; `slot`: its admission slot, lent while queued.
pub(crate) async fn ready(
    shared: &Arc<Shared>,
    cfg: &GatewayConfig,
    path: &str,
    body: &Bytes,
    headers: &HeaderMap,
    deadline: tokio::time::Instant,
    slot: Option<&Slot>,
) -> Result<Ready, ApiError> {
    let prepared = crate::routing::prepare(shared, cfg, path, body, headers).await?;
    // A model no pod serves: kvgate's 404, before any queueing or charge.
    crate::served_models::check(&shared.fleet.pods, &prepared.parsed.model)?;
    let class = crate::flow::request_class(cfg, headers, prepared.fields.priority)?;
    let cost = cost_tokens(&prepared);
    let turn =
        crate::flow::wait_turn(shared, &class, cost, body.len() as u64, deadline, slot).await?;
    Ok(Ready {
        prepared,
        class,
        turn,
    })
}
