//! # kvgate-core — the routing decision, sans IO
//!
//! Plain data in, a decision out. Nothing here opens a socket, reads a clock, spawns a thread or
//! touches a global RNG: time and a seeded RNG are passed in. The same code runs inside the
//! gateway (real network) and the simulator (discrete-event clock).
//!
//! Data flow of one decision (DESIGN.md §3):
//!
//! ```text
//! OpenAI body ─► request::parse_request ─► blocks::BlockHasher ─► [BlockHash]
//!                                                             │
//! PodSnapshot[] ─► index::PrefixIndex::match_prefix ◄─────────┘  (leading blocks per pod)
//!              ─► predictor::LatencyPredictor::predict         (TTFT/TPOT per pod)
//!              ─► policy::Policy::pick                         (e.g. the affinity gate)
//!              ─► decision::Decision                           (pod, branch, per-pod reasons)
//! ```
//!
//! [`router::Router`] wires these steps together; [`session::RouterSession`] adds the state
//! around them (index, predictor, RNG, in-flight ledger) and the request transitions (route,
//! first token, finish) that the gateway, the ext_proc picker and the simulator all drive.

pub mod adapters;
pub mod blocks;
pub mod config;
pub mod decision;
pub mod fixture;
pub mod flow;
pub mod index;
pub mod json;
pub mod models;
pub mod pod;
pub mod policy;
pub mod predictor;
pub mod request;
pub mod router;
pub mod session;
pub mod tokenizer;

/// The RNG every randomised policy takes. Always seeded by the caller (ChaCha8: its output is
/// specified, so a seed reproduces the same decisions on every machine and rand release).
pub type DecisionRng = rand::rngs::ChaCha8Rng;

pub use adapters::{AdapterFit, AdapterId, AdapterSet, LoraSlots};
pub use blocks::{BlockHash, BlockHasher, SizedBlocks};
pub use config::RouterConfig;
pub use decision::{
    Branch, Decision, DecodeCandidate, DecodeExplanation, GateState, PodExplanation, SloExplanation,
};
pub use models::{ModelPods, ServedModels, pods_for_model, predictor_class};
pub use pod::{InFlight, PodId, PodRole, PodSnapshot};
pub use router::{PromptCut, Router};
pub use session::pd::{PdRouted, Route, Stage};
pub use session::{
    Observed, PodScore, RouteError, RouteRequest, Routed, RouterSession, Ticket, TrainingSample,
};
