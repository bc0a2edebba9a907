//! Warm memory for the requests a service receives.
//!
//! A put's frame is kept where it was received, so every push needs fresh
//! memory for its bytes, and the first touch of fresh memory is what a push
//! costs a peer most (0.5–7 GB/s in these VMs, against a copy at 10+). The
//! pool keeps the buffers of replicas that retention or a delete freed, and
//! can be filled at start (`strata peer serve --prefault`), so steady-state
//! pushes land in memory already faulted in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Buffers of received requests, free for reuse.
#[derive(Debug)]
pub struct FramePool {
    free: Mutex<Free>,
    /// Bytes kept free at most.
    limit: AtomicUsize,
}

#[derive(Debug, Default)]
struct Free {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

impl FramePool {
    /// A pool keeping at most `limit` free bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(FramePool {
            free: Mutex::new(Free::default()),
            limit: AtomicUsize::new(limit),
        })
    }

    /// Fills the pool with buffers of `buf_len` bytes, each page touched,
    /// until it holds `bytes` (its limit rises to that if lower). Blocking.
    pub fn prefault(&self, bytes: usize, buf_len: usize) {
        let buf_len = buf_len.max(1);
        self.limit.fetch_max(bytes, Ordering::Relaxed);
        let mut made = 0;
        while made + buf_len <= bytes {
            let mut v = vec![0u8; buf_len];
            strata_tiered::aligned::advise_huge_pages(&mut v);
            // A write per page faults it in (a store of 1, which the
            // compiler cannot drop as it could a zero into calloc memory).
            v.iter_mut().step_by(4096).for_each(|b| *b = 1);
            made += buf_len;
            self.give(v);
        }
    }

    /// A buffer of exactly `len` bytes: a free one that fits (not more
    /// than twice as large, or 1 MiB larger), else a new one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let fit = len.saturating_mul(2).max(len.saturating_add(1 << 20));
        let reused = self.free.lock().ok().and_then(|mut f| {
            let i = f
                .bufs
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= len && b.capacity() <= fit)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i)?;
            let b = f.bufs.swap_remove(i);
            f.bytes = f.bytes.saturating_sub(b.capacity());
            Some(b)
        });
        match reused {
            Some(mut b) => {
                // Warm memory: extending writes at memcpy speed.
                b.resize(len, 0);
                b
            }
            None => {
                let mut v = vec![0u8; len];
                // Kept as it lands: large pages fault in faster.
                strata_tiered::aligned::advise_huge_pages(&mut v);
                v
            }
        }
    }

    /// Returns a buffer (dropped if the pool is full).
    pub fn give(&self, buf: Vec<u8>) {
        if buf.capacity() == 0 {
            return;
        }
        if let Ok(mut f) = self.free.lock() {
            if f.bytes + buf.capacity() <= self.limit.load(Ordering::Relaxed) {
                f.bytes += buf.capacity();
                f.bufs.push(buf);
            }
        }
    }

    /// Free bytes held.
    pub fn free_bytes(&self) -> usize {
        self.free.lock().map_or(0, |f| f.bytes)
    }
}

/// A received buffer that goes back to its pool when the last `Bytes`
/// made from it is dropped.
pub struct Pooled {
    buf: Vec<u8>,
    pool: Arc<FramePool>,
}

impl Pooled {
    /// Wraps `buf`, to be returned to `pool`.
    pub fn new(buf: Vec<u8>, pool: Arc<FramePool>) -> Self {
        Pooled { buf, pool }
    }
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn buffers_come_back_and_are_reused_within_bounds() {
        let pool = FramePool::new(64 << 20);
        pool.prefault(32 << 20, 16 << 20);
        assert_eq!(pool.free_bytes(), 32 << 20);
        let a = pool.take((16 << 20) - 100);
        assert_eq!(a.len(), (16 << 20) - 100);
        assert_eq!(pool.free_bytes(), 16 << 20);
        // Too small a request for a 16 MiB buffer: a new one.
        let small = pool.take(4096);
        assert_eq!(small.len(), 4096);
        assert_eq!(pool.free_bytes(), 16 << 20);
        let cap = a.capacity();
        let bytes = bytes::Bytes::from_owner(Pooled::new(a, pool.clone()));
        let part = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(pool.free_bytes(), 16 << 20, "a slice still holds it");
        drop(part);
        assert_eq!(pool.free_bytes(), (16 << 20) + cap);
        // Beyond the limit, buffers are dropped.
        pool.give(vec![0u8; 64 << 20]);
        assert!(pool.free_bytes() <= 64 << 20);
    }
}
