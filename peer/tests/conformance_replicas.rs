//! The conformance suite on the peer service's own view of its replicas
//! (`Replicas` as a `ChunkStore`): the store its retention collects
//! through `strata_gc`, held to the contract every tier meets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use strata_peer::replicas::{Limits, Replicas};

strata_tiered::conformance_tests!({
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        // Small budgets: the suite's chunks spill to disk too.
        memory_bytes: 1 << 20,
        ..Limits::default()
    };
    let r = Replicas::new(&dir.path().join("spill"), limits).unwrap();
    (r, dir)
});
