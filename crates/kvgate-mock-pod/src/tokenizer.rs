//! The pod's tokenizer lives in the core ([`kvgate_core::tokenizer`]) so that the gateway's
//! token mode (`kvgate serve --index engine`) cuts prompts into exactly the pod's blocks.

pub use kvgate_core::tokenizer::PromptTokenizer;
