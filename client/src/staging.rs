//! The staging pool: page-aligned, pre-faulted host buffers that hold a
//! snapshot while it persists. Reused from save to save, so a save never
//! pays for fresh memory (first touch runs at under 1 GB/s on these VMs).
//! Saves of GPU tensors get pinned buffers (so device-to-host copies run at
//! full speed and asynchronously); host-only saves get ordinary ones.

use std::sync::{Arc, Mutex};

use strata_tiered::AlignedBuf;

use crate::gpu::Gpu;

/// Free buffers, handed out and returned.
#[derive(Default)]
pub(crate) struct StagingPool {
    free: Mutex<Vec<AlignedBuf>>,
}

impl StagingPool {
    /// A buffer of at least `len` bytes (visible length `len`), reused when
    /// one of the right kind is free and large enough, else allocated and
    /// pre-faulted: pinned through `gpu` when given (falling back to
    /// ordinary memory, with a warning, if pinning fails).
    pub(crate) fn take(&self, len: usize, gpu: Option<&Gpu>) -> AlignedBuf {
        let pinned = gpu.is_some();
        let reused = self.free.lock().ok().and_then(|mut f| {
            let i = f
                .iter()
                .position(|b| b.capacity() >= len && b.is_foreign() == pinned)?;
            Some(f.swap_remove(i))
        });
        let mut buf = match reused {
            Some(b) => b,
            None => {
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

    /// Returns a buffer once no chunk refers to it any more. Keeps at most
    /// two (the snapshot being taken and the one persisting).
    pub(crate) fn give_back(&self, buf: Arc<AlignedBuf>) {
        if let Ok(b) = Arc::try_unwrap(buf) {
            self.give_back_owned(b);
        }
    }

    /// [`Self::give_back`] for a buffer never shared.
    pub(crate) fn give_back_owned(&self, buf: AlignedBuf) {
        if let Ok(mut f) = self.free.lock() {
            if f.len() < 2 {
                f.push(buf);
            } else if let Some(small) = f
                .iter_mut()
                .filter(|b| b.capacity() < buf.capacity())
                .min_by_key(|b| b.capacity())
            {
                // Keep the larger of the two: the next save is likely as big.
                *small = buf;
            }
        }
    }
}
