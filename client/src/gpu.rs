//! GPU tensors: device memory named by raw CUDA device pointers (what
//! PyTorch's `data_ptr()` and cudarc's `device_ptr()` give), snapshotted
//! device-to-host into pinned staging buffers on a dedicated stream, and
//! restored host-to-device.
//!
//! The CUDA path is built with the `cuda` feature (cudarc with the driver
//! loaded at run time, so no toolkit is needed to build). Before any CUDA
//! call it checks that the driver library is present (cudarc panics
//! otherwise) and reports a typed [`Error::Gpu`] with the reason when it is
//! not, or when the crate was built without the feature. Host tensors never
//! need any of this.

use strata_tiered::AlignedBuf;

use crate::error::{Error, Result};

/// A range of device memory: a CUDA device pointer, a length, and the
/// ordinal of the device that owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBytes {
    ptr: u64,
    len: u64,
    device: usize,
}

impl DeviceBytes {
    /// Names `len` bytes of device memory at `ptr` on device `device`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be device memory allocated on `device`, valid
    /// for the duration of each `save` or restore call it is passed to; a
    /// save reads it before returning, a restore writes it before returning.
    pub unsafe fn new(ptr: u64, len: u64, device: usize) -> Self {
        DeviceBytes { ptr, len, device }
    }

    /// The device pointer.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device ordinal.
    pub fn device(&self) -> usize {
        self.device
    }
}

/// After an error with device copies possibly queued on the stream: gives
/// `buf` back through `give_back` only if `drained` (the stream was
/// synchronized, so no copy still reads or writes it); otherwise leaks it,
/// since a copy still in flight would write into (or read from) whatever
/// reused the memory. Returns whether it was given back.
pub(crate) fn release_after_error(
    drained: bool,
    buf: AlignedBuf,
    give_back: impl FnOnce(AlignedBuf),
) -> bool {
    if drained {
        give_back(buf);
    } else {
        tracing::error!(
            bytes = buf.capacity(),
            "the GPU stream could not be drained after an error: its host buffer is leaked, never reused"
        );
        std::mem::forget(buf);
    }
    drained
}

/// Whether the GPU path can run here: `Ok(())`, or the reason it cannot
/// (built without the `cuda` feature, no driver library, no device).
pub fn availability(device: usize) -> Result<()> {
    Gpu::open(device).map(|_| ())
}

#[cfg(feature = "cuda")]
pub(crate) use cuda::Gpu;

#[cfg(not(feature = "cuda"))]
pub(crate) use no_cuda::Gpu;

#[cfg(not(feature = "cuda"))]
mod no_cuda {
    use super::*;

    /// Stands in for the CUDA engine in builds without the `cuda` feature:
    /// opening it always fails with the reason.
    pub(crate) enum Gpu {}

    impl Gpu {
        pub(crate) fn open(_device: usize) -> Result<Self> {
            Err(Error::Gpu(
                "this build of strata has no GPU support (rebuild with the `cuda` feature)".into(),
            ))
        }

        pub(crate) fn device(&self) -> usize {
            match *self {}
        }

        pub(crate) fn alloc_pinned(&self, _len: usize) -> Result<AlignedBuf> {
            match *self {}
        }

        pub(crate) fn enqueue_dtoh(&self, _dst: &mut [u8], _src: u64) -> Result<()> {
            match *self {}
        }

        pub(crate) fn enqueue_htod(&self, _dst: u64, _src: &[u8]) -> Result<()> {
            match *self {}
        }

        pub(crate) fn synchronize(&self) -> Result<()> {
            match *self {}
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::ptr::NonNull;
    use std::sync::Arc;

    use cudarc::driver::{result, sys, CudaContext, CudaStream};
    use strata_tiered::aligned::{align_up, ALIGN};

    use super::*;

    fn gpu_err(what: &str) -> impl FnOnce(cudarc::driver::DriverError) -> Error + '_ {
        move |e| Error::Gpu(format!("{what}: {e:?}"))
    }

    /// A CUDA context on one device and a stream of Strata's own, so
    /// snapshot copies never queue behind (or block) the training stream.
    pub(crate) struct Gpu {
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        device: usize,
    }

    impl Gpu {
        /// Opens device `device`, after checking the driver library exists.
        pub(crate) fn open(device: usize) -> Result<Self> {
            // SAFETY: only probes for the shared library with libloading; no
            // CUDA function is called.
            if !unsafe { sys::is_culib_present() } {
                return Err(Error::Gpu(
                    "no CUDA driver on this machine (libcuda.so not found); GPU tensors cannot \
                     be saved or restored here, host tensors can"
                        .into(),
                ));
            }
            result::init().map_err(gpu_err("cuInit"))?;
            let count = CudaContext::device_count().map_err(gpu_err("device count"))?;
            if device >= usize::try_from(count).unwrap_or(0) {
                return Err(Error::Gpu(format!(
                    "device {device} asked for; this machine has {count} CUDA device(s)"
                )));
            }
            let ctx = CudaContext::new(device).map_err(gpu_err("creating the context"))?;
            let stream = ctx.new_stream().map_err(gpu_err("creating a stream"))?;
            tracing::info!(device, "GPU snapshots on a dedicated CUDA stream");
            Ok(Gpu {
                ctx,
                stream,
                device,
            })
        }

        pub(crate) fn device(&self) -> usize {
            self.device
        }

        /// Page-locked host memory, zeroed, not write-combined (the CPU
        /// reads it back to hash, and write-combined memory is slow to read).
        pub(crate) fn alloc_pinned(&self, len: usize) -> Result<AlignedBuf> {
            let cap = align_up(len.max(1));
            self.ctx
                .bind_to_thread()
                .map_err(gpu_err("binding the context"))?;
            // SAFETY: flags 0 asks for plain pinned memory; the pointer is
            // checked for null and alignment before use and freed once, by
            // the release function below, with the context bound.
            let raw = unsafe { result::malloc_host(cap, 0) }.map_err(gpu_err("cuMemHostAlloc"))?;
            let Some(ptr) = NonNull::new(raw.cast::<u8>()) else {
                return Err(Error::Gpu("cuMemHostAlloc returned null".into()));
            };
            if ptr.as_ptr() as usize % ALIGN != 0 {
                // SAFETY: raw came from malloc_host just above.
                let _ = unsafe { result::free_host(raw) };
                return Err(Error::Gpu("pinned memory is not page-aligned".into()));
            }
            // SAFETY: ptr is valid for cap writable bytes (just allocated).
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, cap) };
            let ctx = self.ctx.clone();
            let addr = ptr.as_ptr() as usize;
            let release = Box::new(move || {
                let _ = ctx.bind_to_thread();
                // SAFETY: addr came from malloc_host and is freed only here.
                let _ = unsafe { result::free_host(addr as *mut std::ffi::c_void) };
            });
            // SAFETY: ptr is page-aligned, valid and zeroed for cap bytes
            // until `release` runs; the buffer is its only user.
            let mut buf = unsafe { AlignedBuf::from_foreign(ptr, cap, release) };
            buf.set_len(len);
            Ok(buf)
        }

        /// Queues a device-to-host copy of `dst.len()` bytes from `src`.
        /// `dst` must stay untouched until [`Self::synchronize`] returns.
        pub(crate) fn enqueue_dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
            self.ctx
                .bind_to_thread()
                .map_err(gpu_err("binding the context"))?;
            // SAFETY: `src` names device memory the caller vouched for in
            // DeviceBytes::new, at least dst.len() bytes long; dst is host
            // memory that outlives the copy (the caller synchronizes first).
            unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
                .map_err(gpu_err("device-to-host copy"))
        }

        /// Queues a host-to-device copy of `src` to `dst`. `src` must stay
        /// alive and unchanged until [`Self::synchronize`] returns.
        pub(crate) fn enqueue_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
            self.ctx
                .bind_to_thread()
                .map_err(gpu_err("binding the context"))?;
            // SAFETY: as in enqueue_dtoh, the other way round.
            unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
                .map_err(gpu_err("host-to-device copy"))
        }

        /// Waits for every copy queued on the stream.
        pub(crate) fn synchronize(&self) -> Result<()> {
            self.stream
                .synchronize()
                .map_err(gpu_err("synchronizing the stream"))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_buffer_the_device_may_still_use_is_never_given_back() {
        let mut back = Vec::new();
        assert!(release_after_error(true, AlignedBuf::zeroed(4096), |b| {
            back.push(b)
        }));
        assert_eq!(back.len(), 1);
        assert!(!release_after_error(false, AlignedBuf::zeroed(4096), |b| {
            back.push(b)
        }));
        assert_eq!(back.len(), 1, "an undrained buffer went back to the pool");
    }
}
