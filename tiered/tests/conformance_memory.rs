//! The conformance suite on the in-memory store (damage through its hooks).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

strata_tiered::conformance_tests!(damage {
    let store = std::sync::Arc::new(strata_tiered::MemoryStore::new());
    let damage = strata_tiered::conformance::MemoryDamage(store.clone());
    (store, (), damage)
});
