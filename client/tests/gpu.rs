//! GPU tensors. Where the GPU path cannot run (no `cuda` feature, no
//! driver, no device: every machine this project's CI has), the tests say
//! so plainly and check that device tensors fail with a clear typed error
//! that loses nothing. With the feature and a GPU, they run the real path:
//! device-to-host snapshot into pinned staging, verified restore to device.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use strata::format::DType;
use strata::{Checkpointer, Config, DeviceBytes, Entry, Error, StepSelector};

fn cfg(dir: &std::path::Path) -> Config {
    Config::builder()
        .job("gpu")
        .l1_dir(dir)
        .chunk_size(1 << 20)
        .gc_grace_secs(0)
}

#[test]
fn gpu_tensors_are_saved_and_restored_or_the_skip_is_explained() {
    match strata::gpu::availability(0) {
        Ok(()) => real_gpu_round_trip(),
        Err(reason) => {
            println!("GPU path skipped: {reason}");
            without_a_gpu_device_tensors_are_typed_errors_and_lose_nothing(reason);
        }
    }
}

fn without_a_gpu_device_tensors_are_typed_errors_and_lose_nothing(reason: Error) {
    assert!(matches!(reason, Error::Gpu(_)), "{reason:?}");
    let msg = reason.to_string();
    if cfg!(feature = "cuda") {
        assert!(
            msg.contains("CUDA") || msg.contains("device"),
            "unclear reason: {msg}"
        );
    } else {
        assert!(msg.contains("`cuda` feature"), "unclear reason: {msg}");
    }
    let d = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(cfg(d.path())).unwrap();
    let host = vec![7u8; 4096];
    ck.save(1, &[Entry::tensor("h", DType::U8, &[4096], &host)])
        .unwrap()
        .wait()
        .unwrap();
    // SAFETY: never dereferenced: no GPU path can run in this build/machine.
    let dev = unsafe { DeviceBytes::new(0x1000, 4096, 0) };
    let shape = [2048u64];
    let err = ck
        .save(
            2,
            &[
                Entry::tensor("h", DType::U8, &[4096], &host),
                Entry::device_tensor("w", DType::BF16, &shape, dev),
            ],
        )
        .err()
        .expect("a device tensor cannot be saved without a GPU");
    assert!(matches!(err, Error::Gpu(_)), "{err:?}");
    // Nothing half-done: step 1 is still the newest, and restores.
    assert_eq!(ck.committed_steps().unwrap(), vec![1]);
    let got = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(got.get("h").unwrap().bytes, host);
    let err = ck
        .restore_into_device(StepSelector::Latest, &[("h", dev)])
        .expect_err("no restore to a device without a GPU");
    assert!(matches!(err, Error::Gpu(_)), "{err:?}");
    // Tensors on two devices are refused before any CUDA call.
    // SAFETY: as above.
    let dev1 = unsafe { DeviceBytes::new(0x2000, 4096, 1) };
    let err = ck
        .save(
            3,
            &[
                Entry::device_tensor("a", DType::BF16, &shape, dev),
                Entry::device_tensor("b", DType::BF16, &shape, dev1),
            ],
        )
        .err()
        .expect("two devices");
    assert!(err.to_string().contains("devices 0 and 1"), "{err}");
}

#[cfg(not(feature = "cuda"))]
fn real_gpu_round_trip() {
    unreachable!("availability() is an error without the cuda feature");
}

#[cfg(feature = "cuda")]
fn real_gpu_round_trip() {
    use cudarc::driver::{CudaContext, DevicePtr};

    println!("GPU path running on device 0");
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let n = (3 << 20) + 123;
    let weights: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    let mut on_gpu = stream.clone_htod(&weights).unwrap();
    let host = vec![9u8; 100];
    let d = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(cfg(d.path())).unwrap();
    let shape = [n as u64];
    {
        let (ptr, _sync) = on_gpu.device_ptr(&stream);
        stream.synchronize().unwrap();
        // SAFETY: `on_gpu` holds n bytes on device 0 and outlives the save.
        let dev = unsafe { DeviceBytes::new(ptr, n as u64, 0) };
        let stats = ck
            .save(
                1,
                &[
                    Entry::device_tensor("w", DType::U8, &shape, dev),
                    Entry::blob("host", &host),
                ],
            )
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(stats.logical_bytes, n as u64 + 100);
    }
    // The host restore sees the device bytes.
    let got = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(got.get("w").unwrap().bytes, weights);
    // Clear the device buffer and restore into it.
    stream.memset_zeros(&mut on_gpu).unwrap();
    {
        let (ptr, _sync) = on_gpu.device_ptr(&stream);
        stream.synchronize().unwrap();
        // SAFETY: as above; the restore writes n bytes into it.
        let dev = unsafe { DeviceBytes::new(ptr, n as u64, 0) };
        ck.restore_into_device(StepSelector::Latest, &[("w", dev)])
            .unwrap();
    }
    let back = stream.clone_dtoh(&on_gpu).unwrap();
    assert_eq!(back, weights);
}
