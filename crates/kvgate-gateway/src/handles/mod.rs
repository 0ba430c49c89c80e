//! What every task shares, passed down as handles: the state (`Shared`, composed of `SessionHandle`, `FleetHandle`, `AdmissionHandle` and `Telemetry`, each in its own module), the config, and the pieces they are made of. Depends on nothing else in the crate.
//! The module map: the crate root (`lib.rs`).

pub mod admission_handle;
pub mod capture;
pub mod chat_template;
pub mod config;
pub mod decisions;
pub mod errors;
pub mod fleet_handle;
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
pub mod session;
pub mod slo;
pub mod state;
pub mod telemetry;
pub mod token_cache;
pub mod tokenizer;
