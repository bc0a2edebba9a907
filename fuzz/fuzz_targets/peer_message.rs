//! Peer protocol messages: bounded decoding must never panic, and what
//! decodes must re-encode to the same bytes.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strata_peer::proto::fuzz_decode(data);
});
