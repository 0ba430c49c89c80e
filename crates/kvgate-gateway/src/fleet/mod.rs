//! The pods as the gateway learns them: scraping, KV events, discovery, config reload, the models each serves, breakers. Depends on `handles`.
//! The module map: the crate root (`lib.rs`).

pub mod breaker;
pub mod discovery;
pub mod kv_events;
pub mod models;
pub mod reload;
pub mod scrape;
pub mod scrape_pace;
pub mod served_models;
