//! Save and restore through L1: byte-identical round trips, the snapshot
//! contract, dedup, retention, ranks, busy policies, and damaged stores.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use strata::format::DType;
use strata::{BusyPolicy, Checkpointer, Config, Entry, Error, InProcessCoordinator, StepSelector};
use strata_tiered::{ChunkStore, StoreErrorKind};

const MIB: usize = 1 << 20;

fn cfg(dir: &std::path::Path) -> Config {
    Config::builder()
        .job("t")
        .l1_dir(dir)
        .chunk_size(MIB as u32)
        .io_engine("auto")
        .gc_grace_secs(0)
}

/// A model-like state: `n` tensors of `len` bytes plus small ones and a blob.
struct State {
    names: Vec<String>,
    shapes: Vec<[u64; 1]>,
    data: Vec<Vec<u8>>,
}

impl State {
    fn new(n: usize, len: usize, seed: u8) -> Self {
        let mut names = Vec::new();
        let mut shapes = Vec::new();
        let mut data = Vec::new();
        for i in 0..n {
            names.push(format!("layer.{i}.weight"));
            shapes.push([(len / 2) as u64]);
            // Not periodic: no two chunks of a state are alike.
            let key = (i as u64) << 40 ^ u64::from(seed) << 32;
            data.push(
                (0..len)
                    .map(|j| ((j as u64 ^ key).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
                    .collect(),
            );
        }
        for i in 0..5 {
            names.push(format!("layer.{i}.norm"));
            shapes.push([100]);
            data.push(vec![seed.wrapping_add(i as u8); 200]);
        }
        names.push("dataloader".into());
        shapes.push([0]);
        data.push(b"position=123".to_vec());
        State {
            names,
            shapes,
            data,
        }
    }

    fn entries(&self) -> Vec<Entry<'_>> {
        self.names
            .iter()
            .zip(&self.shapes)
            .zip(&self.data)
            .map(|((n, s), d)| {
                if n == "dataloader" {
                    Entry::blob(n, d)
                } else {
                    Entry::tensor(n, DType::BF16, s, d)
                }
            })
            .collect()
    }
}

#[test]
fn round_trip_is_byte_identical_and_the_caller_may_overwrite_at_once() {
    for overlap in [false, true] {
        round_trip(overlap);
    }
}

fn round_trip(overlap: bool) {
    let d = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(cfg(d.path()).persist_during_snapshot(overlap)).unwrap();
    // 6 × 12 MiB in 1 MiB chunks: several batches and staging segments.
    let mut st = State::new(6, 12 * MIB + 10, 1);
    let original: Vec<Vec<u8>> = st.data.clone();
    let h = ck.save(10, &st.entries()).unwrap();
    // The snapshot is taken: scribble over everything before it is durable.
    for d in &mut st.data {
        d.fill(0xEE);
    }
    let stats = h.wait().unwrap();
    assert_eq!(stats.step, 10);
    assert!(stats.bytes_written > 0 && stats.bytes_deduped == 0);
    let r = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(r.step, 10);
    assert_eq!(r.entries.len(), st.names.len());
    for ((e, name), want) in r.entries.iter().zip(&st.names).zip(&original) {
        assert_eq!(&e.name, name);
        assert_eq!(&e.bytes, want, "{name}");
    }
}

#[test]
fn unchanged_tensors_are_not_written_again() {
    let d = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(cfg(d.path())).unwrap();
    let mut st = State::new(40, 2 * MIB, 3);
    let full = ck.save(1, &st.entries()).unwrap().wait().unwrap();
    // Change 2 of 40 big tensors (5% of the bytes).
    st.data[7][5] ^= 1;
    st.data[23][99] ^= 1;
    let inc = ck.save(2, &st.entries()).unwrap().wait().unwrap();
    let ratio = inc.bytes_written as f64 / full.bytes_written as f64;
    assert!(ratio <= 0.07, "incremental wrote {ratio:.3} of a full save");
    assert!(inc.bytes_deduped > full.bytes_written * 9 / 10);
    let r = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(r.get("layer.7.weight").unwrap().bytes, st.data[7]);
    let old = ck.restore(StepSelector::Step(1)).unwrap();
    assert_ne!(old.get("layer.7.weight").unwrap().bytes, st.data[7]);
}

#[test]
fn restore_into_caller_buffers_reads_only_what_is_asked() {
    let d = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(cfg(d.path())).unwrap();
    let st = State::new(3, 2 * MIB + 2, 5);
    ck.save(4, &st.entries()).unwrap().wait().unwrap();
    let mut a = vec![0u8; st.data[1].len()];
    let mut b = vec![0u8; st.data[4].len()];
    let stats = ck
        .restore_into(
            StepSelector::Latest,
            &mut [("layer.1.weight", &mut a), ("layer.1.norm", &mut b)],
        )
        .unwrap();
    assert_eq!(stats.step, 4);
    let total: usize = st.data.iter().map(Vec::len).sum();
    assert!(
        stats.bytes_read >= (a.len() + b.len()) as u64 && stats.bytes_read < total as u64 / 2,
        "read {} bytes of {total} for two entries",
        stats.bytes_read
    );
    assert_eq!(a, st.data[1]);
    assert_eq!(b, st.data[4]);
    let mut short = vec![0u8; 3];
    assert!(matches!(
        ck.restore_into(StepSelector::Latest, &mut [("layer.1.weight", &mut short)]),
        Err(Error::InvalidState(_))
    ));
    assert!(matches!(
        ck.restore_into(StepSelector::Latest, &mut [("nope", &mut short)]),
        Err(Error::InvalidState(_))
    ));
}

#[test]
fn retention_keeps_the_newest_steps_and_frees_their_chunks() {
    let d = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(cfg(d.path()).keep_last(2)).unwrap();
    for step in 1..=5u8 {
        let st = State::new(4, MIB, step * 10);
        ck.save(u64::from(step), &st.entries())
            .unwrap()
            .wait()
            .unwrap();
    }
    assert_eq!(ck.committed_steps().unwrap(), vec![4, 5]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let chunks = rt.block_on(ck.l1().unwrap().list_chunks("t")).unwrap();
    // Two steps of 4 distinct 1 MiB tensors plus packed chunks, nothing older.
    assert!(chunks.len() <= 2 * 6, "{} chunks left", chunks.len());
    assert!(ck.restore(StepSelector::Step(3)).is_err());
    ck.restore(StepSelector::Step(4)).unwrap();
}

#[test]
fn damaged_chunks_are_typed_errors_naming_chunk_and_entry() {
    let d = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(cfg(d.path())).unwrap();
    let st = State::new(2, 2 * MIB, 9);
    ck.save(1, &st.entries()).unwrap().wait().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let manifest = strata::format::ShardManifest::decode(
        &rt.block_on(ck.l1().unwrap().get_manifest("t", 1, 0))
            .unwrap(),
    )
    .unwrap();
    let seg = manifest.entry("layer.1.weight").unwrap().segments[0];
    let id = manifest.chunks[seg.chunk as usize].id;
    let path = ck.l1().unwrap().chunk_path("t", &id);

    // A flipped bit.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[1000] ^= 0x80;
    std::fs::write(&path, &bytes).unwrap();
    match ck.restore(StepSelector::Latest) {
        Err(Error::Chunk {
            chunk,
            entries,
            source,
        }) => {
            assert_eq!(chunk, id);
            assert_eq!(entries, vec!["layer.1.weight".to_string()]);
            assert_eq!(source.kind(), StoreErrorKind::Corrupt);
        }
        other => panic!("expected a chunk error, got {other:?}"),
    }
    // A missing chunk.
    std::fs::remove_file(&path).unwrap();
    match ck.restore(StepSelector::Latest) {
        Err(Error::Chunk { chunk, source, .. }) => {
            assert_eq!(chunk, id);
            assert_eq!(source.kind(), StoreErrorKind::NotFound);
        }
        other => panic!("expected a chunk error, got {other:?}"),
    }
    // The other entry still restores into a buffer.
    let mut a = vec![0u8; st.data[0].len()];
    ck.restore_into(StepSelector::Latest, &mut [("layer.0.weight", &mut a)])
        .unwrap();
    assert_eq!(a, st.data[0]);
}

#[test]
fn restores_spanning_many_batches_and_lanes_are_exact_and_report_the_first_damage() {
    let d = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(cfg(d.path()).chunk_size(64 << 10)).unwrap();
    // 40 tensors of 300 KiB in 64 KiB chunks: ~200 chunks, many batches on
    // every restore lane.
    let st = State::new(40, 300 << 10, 3);
    ck.save(1, &st.entries()).unwrap().wait().unwrap();
    let got = ck.restore(StepSelector::Latest).unwrap();
    for (name, data) in st.names.iter().zip(&st.data) {
        assert_eq!(&got.get(name).unwrap().bytes, data, "{name}");
    }
    assert!(got.stats.chunks > 150, "{:?}", got.stats);
    // Damage a late chunk and an early one: the error names the early one,
    // whichever lane met its damage first.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let manifest = strata::format::ShardManifest::decode(
        &rt.block_on(ck.l1().unwrap().get_manifest("t", 1, 0))
            .unwrap(),
    )
    .unwrap();
    let chunk_of = |name: &str| {
        let seg = manifest.entry(name).unwrap().segments[0];
        manifest.chunks[seg.chunk as usize].id
    };
    let (early, late) = (chunk_of("layer.3.weight"), chunk_of("layer.38.weight"));
    for id in [early, late] {
        let p = ck.l1().unwrap().chunk_path("t", &id);
        let mut b = std::fs::read(&p).unwrap();
        b[7] ^= 1;
        std::fs::write(&p, &b).unwrap();
    }
    for _ in 0..3 {
        match ck.restore(StepSelector::Latest) {
            Err(Error::Chunk { chunk, entries, .. }) => {
                assert_eq!(chunk, early);
                assert_eq!(entries, vec!["layer.3.weight".to_string()]);
            }
            other => panic!("expected a chunk error, got {other:?}"),
        }
    }
}

#[test]
fn truncated_manifest_is_a_typed_error_and_earlier_steps_stay_intact() {
    let d = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(cfg(d.path())).unwrap();
    let s1 = State::new(2, MIB, 1);
    let s2 = State::new(2, MIB, 2);
    ck.save(1, &s1.entries()).unwrap().wait().unwrap();
    ck.save(2, &s2.entries()).unwrap().wait().unwrap();
    let p = ck.l1().unwrap().manifest_path("t", 2, 0);
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    // Asked for by number, the damaged step is a typed error...
    assert!(matches!(
        ck.restore(StepSelector::Step(2)),
        Err(Error::Manifest {
            step: 2,
            rank: 0,
            ..
        })
    ));
    let r = ck.restore(StepSelector::Step(1)).unwrap();
    assert_eq!(r.get("layer.0.weight").unwrap().bytes, s1.data[0]);
    // ...and the newest restorable step falls back past it to step 1.
    let r = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(r.step, 1);
    assert_eq!(r.get("layer.0.weight").unwrap().bytes, s1.data[0]);
}

#[test]
fn ranks_on_threads_commit_together_and_restore_the_same_step() {
    let d = tempfile::tempdir().unwrap();
    let world = 4u32;
    let coord = InProcessCoordinator::new(world);
    let results: Vec<(u64, Vec<u8>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                let coord = coord.clone();
                let dir = d.path().to_path_buf();
                s.spawn(move || {
                    let ck = Checkpointer::with_coordinator(
                        cfg(&dir).rank(rank, world).coordination_timeout_secs(30),
                        Arc::new(coord),
                    )
                    .unwrap();
                    for step in [10u64, 20] {
                        let st = State::new(2, MIB, (rank as u8) * 3 + step as u8);
                        ck.save(step, &st.entries()).unwrap().wait().unwrap();
                    }
                    let r = ck.restore(StepSelector::Latest).unwrap();
                    (r.step, r.get("layer.0.weight").unwrap().bytes.clone())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (step, bytes)) in results.iter().enumerate() {
        assert_eq!(*step, 20);
        assert_eq!(bytes, &State::new(2, MIB, (rank as u8) * 3 + 20).data[0]);
    }
}

#[test]
fn checkpointers_on_one_callers_runtime_commit_and_outlive_each_other() {
    let d = tempfile::tempdir().unwrap();
    let world = 2u32;
    let coord = InProcessCoordinator::new(world);
    // One worker for both ranks: each blocks on it while the other's calls
    // run there too.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let cks: Vec<Checkpointer> = (0..world)
        .map(|rank| {
            Checkpointer::builder(
                cfg(d.path())
                    .rank(rank, world)
                    .coordination_timeout_secs(30),
            )
            .coordinator(Arc::new(coord.clone()))
            .runtime(rt.handle().clone())
            .build()
            .unwrap()
        })
        .collect();
    std::thread::scope(|s| {
        for (rank, ck) in cks.iter().enumerate() {
            s.spawn(move || {
                for step in [1u64, 2] {
                    let st = State::new(2, MIB, rank as u8 * 3 + step as u8);
                    ck.save(step, &st.entries()).unwrap().wait().unwrap();
                }
                let got = ck.restore(StepSelector::Latest).unwrap();
                assert_eq!(got.step, 2);
                assert_eq!(
                    got.get("layer.0.weight").unwrap().bytes,
                    State::new(2, MIB, rank as u8 * 3 + 2).data[0]
                );
            });
        }
    });
    let mut cks = cks.into_iter();
    drop(cks.next());
    // The caller's runtime still runs once a checkpointer on it is gone,
    // and the other still reads its disk through it.
    assert_eq!(rt.block_on(rt.spawn(async { 7 })).unwrap(), 7);
    let one = cks.next().unwrap();
    let steps: Vec<(u64, bool)> = one
        .steps()
        .unwrap()
        .iter()
        .map(|s| (s.step, s.l1))
        .collect();
    assert_eq!(steps, [(1, true), (2, true)]);
    // A current-thread runtime is driven by its own thread only: refused.
    let ct = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let refused = Checkpointer::builder(cfg(d.path()))
        .runtime(ct.handle().clone())
        .build();
    assert!(
        matches!(&refused, Err(Error::Config(m)) if m.contains("multi-thread")),
        "{:?}",
        refused.err()
    );
}

#[test]
fn a_rank_that_never_reports_leaves_the_step_uncommitted_and_busy_policies_apply() {
    let d = tempfile::tempdir().unwrap();
    // World of two, but only rank 0 saves: its commit barrier waits (2 s).
    let coord = Arc::new(InProcessCoordinator::new(2));
    let base = cfg(d.path()).rank(0, 2).coordination_timeout_secs(2);
    let st = State::new(2, MIB, 1);

    let ck =
        Checkpointer::with_coordinator(base.clone().busy_policy(BusyPolicy::Error), coord.clone())
            .unwrap();
    let first = ck.save(1, &st.entries()).unwrap();
    assert!(matches!(
        ck.save(2, &st.entries()),
        Err(Error::Busy {
            step: 2,
            busy_with: 1
        })
    ));
    assert!(
        matches!(first.wait(), Err(Error::Coordination(_))),
        "no commit without every rank"
    );
    assert!(ck.committed_steps().unwrap().is_empty());
    drop(ck);

    let ck = Checkpointer::with_coordinator(base.busy_policy(BusyPolicy::Skip), coord).unwrap();
    let first = ck.save(3, &st.entries()).unwrap();
    let skipped = ck.save(4, &st.entries()).unwrap().wait().unwrap();
    assert!(skipped.skipped);
    assert_eq!(ck.skipped_saves(), 1);
    assert!(first.wait().is_err());
}

#[test]
fn invalid_state_is_refused_before_anything_is_written() {
    let d = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(cfg(d.path())).unwrap();
    let b = vec![0u8; 10];
    assert!(matches!(
        ck.save(1, &[Entry::tensor("w", DType::F32, &[3], &b)]),
        Err(Error::InvalidState(_))
    ));
    assert!(matches!(
        ck.save(1, &[Entry::blob("x", &b), Entry::blob("x", &b)]),
        Err(Error::InvalidState(_))
    ));
    assert!(ck.committed_steps().unwrap().is_empty());
    assert!(matches!(
        ck.restore(StepSelector::Latest),
        Err(Error::NothingToRestore(_))
    ));
}

#[test]
fn wait_policy_blocks_until_the_previous_save_is_finished() {
    let d = tempfile::tempdir().unwrap();
    // World of two with only rank 0 saving: step 1 stays in flight until its
    // commit barrier times out (1 s), so the next save must wait for it.
    let coord = Arc::new(InProcessCoordinator::new(2));
    let ck = Checkpointer::with_coordinator(
        cfg(d.path())
            .rank(0, 2)
            .coordination_timeout_secs(1)
            .busy_policy(BusyPolicy::Wait),
        coord,
    )
    .unwrap();
    let st = State::new(2, MIB, 1);
    let first = ck.save(1, &st.entries()).unwrap();
    let t = std::time::Instant::now();
    // Step 1 fails (no rank 1) while the next save waits for it; nobody
    // reported that failure, so the save that waited returns it and saves
    // nothing (background_errors.rs has the rest).
    let waited = ck.save(2, &st.entries());
    assert!(
        first.is_done(),
        "wait returns only once the previous save finished"
    );
    assert!(
        t.elapsed() >= std::time::Duration::from_millis(500),
        "the save waited: {:?}",
        t.elapsed()
    );
    assert!(matches!(waited, Err(Error::Background { step: 1, .. })));
    let second = ck.save(2, &st.entries()).unwrap();
    let third = ck.save(3, &st.entries());
    assert!(second.is_done(), "the third save waited for the second");
    assert!(
        second.wait().is_err() && first.wait().is_err(),
        "neither step commits without rank 1"
    );
    // The second's failure was returned by the third save, not its handle.
    assert!(matches!(third, Err(Error::Background { step: 2, .. })));
    assert_eq!(ck.skipped_saves(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_training_loops_await_durability_and_restore() {
    let d = tempfile::tempdir().unwrap();
    let ck = Arc::new(Checkpointer::new(cfg(d.path())).unwrap());
    let st = State::new(3, MIB + 6, 21);
    // save() only blocks for the snapshot; durability is awaited.
    let h = ck.save(1, &st.entries()).unwrap();
    let stats = h.durable().await.unwrap();
    assert_eq!(stats.step, 1);
    assert!(h.is_done());
    // Awaiting again gives the same counters.
    assert_eq!(h.durable().await.unwrap().step, 1);
    let got = ck.restore_async(StepSelector::Latest).await.unwrap();
    assert_eq!(got.step, 1);
    for (name, data) in st.names.iter().zip(&st.data) {
        assert_eq!(&got.get(name).unwrap().bytes, data);
    }
    // A failed save resolves with the error, not a hang.
    let bad = ck.save(2, &[Entry::tensor("x", DType::F32, &[3], &[0u8; 5])]);
    assert!(matches!(bad, Err(Error::InvalidState(_))));
}

/// Unmounts on drop, so a failing assertion does not leave a mount behind.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A disk that fills in the middle of a save (a 160 MiB tmpfs, a save of
/// ~190 MiB in several batches; with and without the worker writing while
/// the snapshot still copies): the save fails with a no-space error instead of
/// hanging, nothing of it is committed, and the earlier step still restores.
#[test]
fn a_disk_that_fills_mid_save_fails_that_save_and_loses_nothing() {
    for overlap in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=160m", "tmpfs"])
            .arg(d.path())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("SKIPPED mid-save full-disk test: cannot mount a tmpfs here (needs root)");
            return;
        }
        let _mount = Mount(d.path().to_path_buf());
        fill_mid_save(d.path(), overlap);
    }
}

fn fill_mid_save(dir: &std::path::Path, overlap: bool) {
    let ck = Checkpointer::new(cfg(dir).keep_last(5).persist_during_snapshot(overlap)).unwrap();
    let small = State::new(4, 4 * MIB, 1);
    ck.save(1, &small.entries()).unwrap().wait().unwrap();
    let big = State::new(12, 16 * MIB, 2);
    let h = ck.save(2, &big.entries()).unwrap();
    let err = h
        .wait()
        .expect_err("190 MiB cannot fit in what is left of 160 MiB");
    assert!(err.is_no_space(), "{err}");
    assert_eq!(ck.committed_steps().unwrap(), vec![1]);
    let got = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(got.step, 1);
    for (name, data) in small.names.iter().zip(&small.data) {
        assert_eq!(&got.get(name).unwrap().bytes, data);
    }
    // The checkpointer keeps working: a save that fits succeeds.
    ck.save(3, &small.entries()).unwrap().wait().unwrap();
    assert_eq!(ck.committed_steps().unwrap(), vec![1, 3]);
}
