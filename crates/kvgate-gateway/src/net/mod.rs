//! The transports: the traffic listener and its tower layers (auth, admission), the HTTP proxy, the Envoy ext_proc picker. Depend on `pipeline`, `fleet` and `handles`.
//! The module map: the crate root (`lib.rs`).

pub mod admission;
pub mod auth;
pub mod ext_proc;
pub mod listener;
pub mod proxy;
