//! What every task shares, passed down as handles: the state (`Shared`: the session, the pod table, admission and flow control, telemetry), the config, and the pieces they are made of. Depends on nothing else in the crate.
//! The module map: the crate root (`lib.rs`).

pub mod capture;
pub mod chat_template;
pub mod config;
pub mod decisions;
pub mod errors;
pub mod flow_gate;
pub mod grace;
pub mod jsonl;
pub mod limits;
pub mod live;
pub mod log_limit;
pub mod metrics;
pub mod otel;
pub mod pods;
pub mod progress;
pub mod reject;
pub mod request_id;
pub mod retry_budget;
pub mod slo;
pub mod state;
pub mod token_cache;
pub mod tokenizer;
