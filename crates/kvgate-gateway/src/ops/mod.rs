//! The admin listener and the live page. Depend on `pipeline` and `handles`.
//! The module map: the crate root (`lib.rs`).

pub mod admin;
pub mod ui;
