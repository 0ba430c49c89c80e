//! The gateway's SSE scanner (`kvgate_gateway::sse::SseScanner`) on arbitrary bytes, cut into
//! arbitrary chunks (the first byte of the input picks the chunk size): no panic, and with
//! usage stripping off every byte fed comes out unchanged.
#![no_main]

use bytes::Bytes;
use kvgate_gateway::sse::{SseScanner, usage_of_response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(first % 64) + 1;
    let mut pass = SseScanner::new(false);
    let mut strip = SseScanner::new(true);
    let mut out = Vec::with_capacity(rest.len());
    for c in rest.chunks(chunk) {
        out.extend_from_slice(&pass.feed(Bytes::copy_from_slice(c)).out);
        let _ = strip.feed(Bytes::copy_from_slice(c));
    }
    out.extend_from_slice(&pass.finish());
    let _ = strip.finish();
    let _ = (pass.usage(), strip.usage(), usage_of_response(rest));
    assert_eq!(out, rest, "the scanner must pass every byte through");
});
