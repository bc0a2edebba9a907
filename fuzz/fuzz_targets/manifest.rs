//! Shard manifests: bounded decoding and validation must never panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strata_format::fuzzing::manifest(data);
});
