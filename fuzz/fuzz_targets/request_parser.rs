//! The OpenAI request parser and the chat renderer (`kvgate_core::request`) on arbitrary bytes:
//! both endpoints; a parse must end in a `ParsedRequest` or a typed `RequestError`, never a
//! panic. A parsed request is also block-hashed, as the gateway does next.
#![no_main]

use kvgate_core::BlockHasher;
use kvgate_core::request::{CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, parse_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    for path in [COMPLETIONS_PATH, CHAT_COMPLETIONS_PATH] {
        if let Ok(parsed) = parse_request(path, body) {
            let mut blocks = Vec::new();
            BlockHasher::default().hash_request(&parsed, &mut blocks);
            let _ = parsed.estimated_input_tokens();
        }
    }
});
