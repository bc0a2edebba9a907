//! The conformance suite on every wrapper (over the in-memory store, with
//! its damage hooks reaching through), on a stack of all of them over L1,
//! and on retries over a store that fails 30% of calls: the retries must
//! hide every fault.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use strata_tiered::conformance::MemoryDamage;
use strata_tiered::wrap::FaultPlan;
use strata_tiered::{MemoryStore, RetryPolicy};

/// A fresh memory store and a damager reaching its bytes.
fn memory() -> (Arc<MemoryStore>, MemoryDamage) {
    let m = Arc::new(MemoryStore::new());
    (m.clone(), MemoryDamage(m))
}

/// Retries quick enough for a test suite, many enough that a 30% fault
/// rate never exhausts them (0.3^30).
fn fast_retries(seed: u64) -> RetryPolicy {
    RetryPolicy {
        max_attempts: 30,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(8),
        deadline: Duration::from_secs(60),
        seed,
    }
}

mod retry {
    strata_tiered::conformance_tests!(damage {
        let (m, d) = super::memory();
        (strata_tiered::RetryStore::new(m), (), d)
    });
}

mod limit {
    strata_tiered::conformance_tests!(damage {
        let (m, d) = super::memory();
        (strata_tiered::LimitStore::new(m, 2), (), d)
    });
}

mod throttle {
    strata_tiered::conformance_tests!(damage {
        let (m, d) = super::memory();
        let caps = strata_tiered::ThrottleConfig {
            read_bytes_per_sec: 1 << 30,
            write_bytes_per_sec: 1 << 30,
            burst_bytes: 0,
        };
        (strata_tiered::ThrottleStore::new(m, caps), (), d)
    });
}

mod metrics {
    strata_tiered::conformance_tests!(damage {
        let (m, d) = super::memory();
        (strata_tiered::MetricsStore::new(m), (), d)
    });
}

mod faults_off {
    strata_tiered::conformance_tests!(damage {
        let (m, d) = super::memory();
        let plan = strata_tiered::FaultPlan {
            seed: 1,
            ..Default::default()
        };
        (strata_tiered::FaultStore::new(m, plan), (), d)
    });
}

mod retry_over_faults {
    strata_tiered::conformance_tests!(damage {
        let (m, d) = super::memory();
        let plan = super::FaultPlan {
            seed: 7,
            error_rate: 0.3,
            ..Default::default()
        };
        let faulty = strata_tiered::FaultStore::new(m, plan);
        let store = strata_tiered::RetryStore::with_policy(faulty, super::fast_retries(7));
        (store, (), d)
    });
}

mod stack_over_l1 {
    // Every wrapper at once, over L1 on psync, faults hidden by retries.
    strata_tiered::conformance_tests!(damage {
        let dir = tempfile::tempdir().unwrap();
        let l1 =
            strata_tiered::L1Store::open(dir.path(), strata_tiered::EngineChoice::Psync).unwrap();
        let d = strata_tiered::conformance::L1Damage(l1.clone());
        let plan = super::FaultPlan {
            seed: 11,
            error_rate: 0.2,
            latency_jitter: std::time::Duration::from_micros(200),
            ..Default::default()
        };
        let caps = strata_tiered::ThrottleConfig {
            read_bytes_per_sec: 1 << 30,
            write_bytes_per_sec: 1 << 30,
            burst_bytes: 1 << 20,
        };
        let store = strata_tiered::RetryStore::with_policy(
            strata_tiered::MetricsStore::new(strata_tiered::LimitStore::new(
                strata_tiered::ThrottleStore::new(strata_tiered::FaultStore::new(l1, plan), caps),
                4,
            )),
            super::fast_retries(11),
        );
        (store, dir, d)
    });
}
