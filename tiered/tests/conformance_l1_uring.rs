//! The conformance suite on L1 with the io_uring engine (damage by
//! writing into its files).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

strata_tiered::conformance_tests!(damage {
    let dir = tempfile::tempdir().unwrap();
    let store =
        strata_tiered::L1Store::open(dir.path(), strata_tiered::EngineChoice::IoUring).unwrap();
    assert_eq!(store.engine_name(), "io_uring");
    let damage = strata_tiered::conformance::L1Damage(store.clone());
    (store, dir, damage)
});
