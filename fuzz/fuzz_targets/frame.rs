//! Chunk frames from disk or a peer: header checks, every codec's payload
//! decoder, and hash verification must never panic or over-allocate.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strata_format::fuzzing::frame(data);
});
