//! The mount's counters, served as `.stats.json`: what was read, how
//! many chunks were fetched from which tier (readahead included), what the
//! cache served, what failed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::Serialize;
use strata::tiers::RangeStats;

/// The mount's counters (`.stats.json`).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) reads: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) chunks_fetched: AtomicU64,
    pub(crate) chunks_cached: AtomicU64,
    pub(crate) fallbacks: AtomicU64,
    pub(crate) read_errors: AtomicU64,
    pub(crate) served_by: Mutex<BTreeMap<String, u64>>,
    pub(crate) refreshes: AtomicU64,
}

#[derive(Serialize)]
struct CountersOut {
    reads: u64,
    bytes: u64,
    chunks_fetched: u64,
    chunks_cached: u64,
    fallbacks: u64,
    read_errors: u64,
    chunks_by_tier: BTreeMap<String, u64>,
    cache_bytes: usize,
    refreshes: u64,
}

impl Counters {
    /// Adds what one read or readahead found.
    pub(crate) fn add(&self, st: &RangeStats) {
        let c = self;
        c.chunks_fetched
            .fetch_add(st.chunks_read, Ordering::Relaxed);
        c.chunks_cached.fetch_add(st.cached, Ordering::Relaxed);
        c.fallbacks.fetch_add(st.fallbacks, Ordering::Relaxed);
        if !st.served_by.is_empty() {
            if let Ok(mut m) = c.served_by.lock() {
                for (k, v) in &st.served_by {
                    *m.entry(k.clone()).or_default() += v;
                }
            }
        }
    }

    /// The counters as JSON, with `cache_bytes` held in the chunk cache.
    pub(crate) fn json(&self, cache_bytes: usize) -> Vec<u8> {
        let c = self;
        let out = CountersOut {
            reads: c.reads.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            chunks_fetched: c.chunks_fetched.load(Ordering::Relaxed),
            chunks_cached: c.chunks_cached.load(Ordering::Relaxed),
            fallbacks: c.fallbacks.load(Ordering::Relaxed),
            read_errors: c.read_errors.load(Ordering::Relaxed),
            chunks_by_tier: c.served_by.lock().map(|m| m.clone()).unwrap_or_default(),
            cache_bytes,
            refreshes: c.refreshes.load(Ordering::Relaxed),
        };
        let mut v = serde_json::to_vec_pretty(&out).unwrap_or_default();
        v.push(b'\n');
        v
    }
}
