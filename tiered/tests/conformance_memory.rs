//! The conformance suite on the in-memory store.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

strata_tiered::conformance_tests!((strata_tiered::MemoryStore::new(), ()));
