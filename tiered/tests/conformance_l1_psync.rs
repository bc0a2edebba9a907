//! The conformance suite on L1 with the pread/pwrite engine.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

strata_tiered::conformance_tests!({
    let dir = tempfile::tempdir().unwrap();
    let store =
        strata_tiered::L1Store::open(dir.path(), strata_tiered::EngineChoice::Psync).unwrap();
    assert_eq!(store.engine_name(), "psync");
    (store, dir)
});
