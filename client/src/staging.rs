//! The staging pool: page-aligned, pre-faulted host buffers that hold a
//! snapshot while it persists. Reused from save to save, so a save never
//! pays for fresh memory (first touch runs at under 1 GB/s on these VMs).
//! Saves of GPU tensors get pinned buffers (so device-to-host copies run at
//! full speed and asynchronously); host-only saves get ordinary ones.

use std::sync::{Arc, Mutex};

use strata_tiered::aligned::align_up;
use strata_tiered::AlignedBuf;

use crate::gpu::Gpu;

/// Longest wait in [`StagingPool::take`] for a lent buffer to come back
/// before a new one is allocated.
const LENT_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// Free buffers, handed out and returned.
#[derive(Default)]
pub(crate) struct StagingPool {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    free: Vec<AlignedBuf>,
    /// The most bytes handed out at once so far: free buffers are kept up
    /// to twice this, so memory stays bounded by the largest save.
    out: usize,
    high_water: usize,
    /// Buffers given back while something still referred to them
    /// (none is expected: a save waits for its writes and its eager copy
    /// before it gives its segments back): reclaimed once it lets go.
    lent: Vec<Arc<AlignedBuf>>,
}

impl Inner {
    /// Moves every lent buffer nothing refers to any more to `free`.
    fn reclaim(&mut self) {
        for a in std::mem::take(&mut self.lent) {
            match Arc::try_unwrap(a) {
                Ok(b) => {
                    self.out = self.out.saturating_sub(b.capacity());
                    self.free.push(b);
                }
                Err(a) => self.lent.push(a),
            }
        }
    }
}

impl StagingPool {
    /// A buffer of at least `len` bytes (visible length `len`), reused when
    /// one of the right kind is free and large enough (waiting up to
    /// [`LENT_WAIT`] for a lent one that would be: `wait_for_lent`), else
    /// allocated and pre-faulted: pinned through `gpu` when given (falling back to
    /// ordinary memory, with a warning, if pinning fails).
    pub(crate) fn take(&self, len: usize, gpu: Option<&Gpu>) -> AlignedBuf {
        let pinned = gpu.is_some();
        self.wait_for_lent(len, pinned);
        let reused = self.inner.lock().ok().and_then(|mut g| {
            g.reclaim();
            // Best fit: a save's segments come in the same sizes every step.
            let i = g
                .free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= len && b.is_foreign() == pinned)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            let b = i.map(|i| g.free.swap_remove(i));
            g.out += b.as_ref().map_or(align_up(len), AlignedBuf::capacity);
            g.high_water = g.high_water.max(g.out);
            b
        });
        let mut buf = match reused {
            Some(b) => b,
            None => {
                tracing::debug!(len, "staging: a new buffer");
                let pinned = gpu.map(|g| g.alloc_pinned(len));
                match pinned {
                    Some(Ok(b)) => b,
                    other => {
                        if let Some(Err(e)) = other {
                            tracing::warn!(error = %e, "pinned staging refused; using pageable memory");
                        }
                        let mut b = AlignedBuf::zeroed(len);
                        b.prefault();
                        b
                    }
                }
            }
        };
        buf.set_len(len);
        buf
    }

    /// Where no free buffer holds `len` bytes but a lent one would (given
    /// back while something still referred to it), waits for it to come
    /// back, at most [`LENT_WAIT`]; a new segment (up to 512 MiB) is
    /// faulted in on the training thread instead, at 0.45–1.7 GB/s on
    /// these VMs (a demo step stalled 1.06 s so), and the pool grows by
    /// it. The eager push was the usual holder (its own copy out of a
    /// segment, at the background priority, could outlast the gap between
    /// two saves); since its copy is made before the save ends
    /// (`mirror::eager`) it holds none, and the debug log says when a wait
    /// still happens.
    fn wait_for_lent(&self, len: usize, pinned: bool) {
        let started = std::time::Instant::now();
        let deadline = started + LENT_WAIT;
        let mut waited = false;
        loop {
            let waiting = self.inner.lock().is_ok_and(|mut g| {
                g.reclaim();
                let fits = |cap: usize, foreign: bool| cap >= len && foreign == pinned;
                !g.free.iter().any(|b| fits(b.capacity(), b.is_foreign()))
                    && g.lent.iter().any(|a| fits(a.capacity(), a.is_foreign()))
            });
            if !waiting || std::time::Instant::now() >= deadline {
                if waited {
                    tracing::debug!(
                        len,
                        waited_ms = started.elapsed().as_millis() as u64,
                        came_back = !waiting,
                        "staging: waited for a lent buffer"
                    );
                }
                return;
            }
            waited = true;
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Buffers given back while still referred to, not yet reclaimed.
    #[cfg(test)]
    pub(crate) fn lent(&self) -> usize {
        self.inner.lock().map_or(0, |mut g| {
            g.reclaim();
            g.lent.len()
        })
    }

    /// Returns a buffer; one still referred to is reclaimed by a later
    /// [`Self::take`] once nothing refers to it.
    pub(crate) fn give_back(&self, buf: Arc<AlignedBuf>) {
        match Arc::try_unwrap(buf) {
            Ok(b) => self.give_back_owned(b),
            Err(shared) => {
                if let Ok(mut g) = self.inner.lock() {
                    g.lent.push(shared);
                }
            }
        }
    }

    /// [`Self::give_back`] for a buffer never shared. Kept while the free
    /// buffers total at most twice the high-water mark; else freed.
    pub(crate) fn give_back_owned(&self, buf: AlignedBuf) {
        if let Ok(mut g) = self.inner.lock() {
            g.out = g.out.saturating_sub(buf.capacity());
            let kept: usize = g.free.iter().map(AlignedBuf::capacity).sum();
            if kept + buf.capacity() <= 2 * g.high_water {
                g.free.push(buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A 1 MiB buffer taken and given back while still referred to: its
    /// address, and the reference still held.
    fn lent_buffer(pool: &StagingPool) -> (*const u8, Arc<AlignedBuf>) {
        let a = Arc::new(pool.take(1 << 20, None));
        let at = a.as_ptr();
        let held = a.clone();
        pool.give_back(a);
        (at, held)
    }

    #[test]
    fn a_take_waits_briefly_for_a_lent_buffer_instead_of_allocating() {
        let pool = StagingPool::default();
        let (at, held) = lent_buffer(&pool);
        // The holder (a write still under way) lets go 50 ms later.
        let t = std::time::Instant::now();
        let b = std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                drop(held);
            });
            pool.take(1 << 20, None)
        });
        assert_eq!(b.as_ptr(), at, "a new buffer instead of the lent one");
        assert!(t.elapsed() >= std::time::Duration::from_millis(40));
        assert!(t.elapsed() < LENT_WAIT, "{:?}", t.elapsed());
    }

    #[test]
    fn a_buffer_given_back_while_referenced_is_reused_once_let_go() {
        let pool = StagingPool::default();
        // Still referenced (a write still under way).
        let (at, held) = lent_buffer(&pool);
        assert_eq!(
            pool.inner.lock().unwrap().lent.len(),
            1,
            "kept, not dropped"
        );
        // Still held after the wait (LENT_WAIT): a new buffer.
        let b = pool.take(1 << 20, None);
        assert_ne!(b.as_ptr(), at, "a buffer in use was handed out again");
        assert_eq!(pool.inner.lock().unwrap().lent.len(), 1);
        drop(held);
        // Nothing refers to it any more: the next take reclaims and reuses
        // it (the only free buffer), never having freed it.
        let c = pool.take(1 << 20, None);
        assert_eq!(c.as_ptr(), at, "the lent buffer was not reused");
        let g = pool.inner.lock().unwrap();
        assert!(g.lent.is_empty() && g.free.is_empty());
        drop(g);
        drop(b);
    }
}
