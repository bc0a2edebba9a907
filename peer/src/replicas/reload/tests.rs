//! A service's replicas across a restart: kept on a graceful stop and
//! reloaded whole; damaged frames and shards naming lost chunks dropped;
//! another layout cleared.

use bytes::Bytes;
use strata_format::codec::{ElemHint, EncodeOptions};
use strata_format::frame::encode_frame;
use strata_format::{ChunkId, CommitRecord, ShardManifest, ShardRef};

use super::super::test_support::manifest_of;
use super::super::{Limits, Replicas};
use super::{chunk_root, Reloaded};

const JOB: &str = "reload-job";

fn chunk(rank: u32, i: u32) -> Vec<u8> {
    (0..1000u32)
        .map(|j| (j.wrapping_mul(13) ^ rank.wrapping_mul(101) ^ i.wrapping_mul(7)) as u8)
        .collect()
}

fn frame(data: &[u8]) -> Bytes {
    encode_frame(data, ElemHint::BYTES, EncodeOptions::RAW)
        .unwrap()
        .into()
}

/// Rank `rank`'s manifest of four chunks.
fn manifest(step: u64, rank: u32) -> Vec<u8> {
    let cs: Vec<Vec<u8>> = (0..4).map(|i| chunk(rank, i)).collect();
    manifest_of(JOB, step, rank, 2, &cs)
}

/// Small budgets: of the eight chunks, some stay in memory and some spill.
fn limits() -> Limits {
    Limits {
        memory_bytes: 4000,
        ..Limits::default()
    }
}

/// Step 5 of two ranks, committed, and a pin.
async fn save(r: &Replicas) {
    for rank in 0..2 {
        for i in 0..4 {
            let c = chunk(rank, i);
            r.put_chunk(JOB, ChunkId::of(&c), frame(&c)).unwrap();
        }
        let m = manifest(5, rank);
        r.put_manifest(JOB, 5, rank, &m).await.unwrap();
        r.commit(&CommitRecord {
            job: JOB.into(),
            step: 5,
            world_size: 2,
            committed_unix_ms: 1,
            shards: vec![ShardRef {
                rank,
                manifest: ChunkId::of(&m),
                logical_bytes: 4000,
            }],
        })
        .await
        .unwrap();
    }
    r.set_pin(JOB, 5, true).await.unwrap();
}

fn spilled(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(chunk_root(dir).join(JOB))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

#[tokio::test]
async fn a_graceful_stop_keeps_every_replica_and_a_start_reloads_them_verified() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    let (held, manifests) = {
        let r = Replicas::new(&spill, limits()).unwrap();
        assert_eq!(r.reloaded(), Reloaded::default());
        save(&r).await;
        let (mem, disk, n, _) = r.stats().unwrap();
        assert!(mem > 0 && disk > 0, "some in memory, some spilled");
        assert_eq!(n, 8);
        let on_disk = spilled(&spill).len() as u64;
        let (kept, lost) = r.keep_memory_on_disk().unwrap();
        assert_eq!((kept, lost), (8 - on_disk, 0));
        assert_eq!(spilled(&spill).len(), 8);
        assert_eq!(r.stats().unwrap().0, 0, "nothing left only in memory");
        ((mem + disk, n), r.manifest_bytes().unwrap())
    };
    let r = Replicas::new(&spill, limits()).unwrap();
    let got = r.reloaded();
    assert_eq!(
        (got.chunks, got.bytes, got.steps, got.jobs),
        (8, held.0, 1, 1)
    );
    assert_eq!((got.damaged, got.shards_dropped), (0, 0));
    let (_, disk, n, _) = r.stats().unwrap();
    assert_eq!((disk, n), held);
    assert_eq!(r.manifest_bytes().unwrap(), manifests, "the ledger rebuilt");
    for rank in 0..2 {
        for i in 0..4 {
            let c = chunk(rank, i);
            assert_eq!(r.get_frame(JOB, &ChunkId::of(&c)).unwrap(), frame(&c));
        }
        assert_eq!(
            r.get_manifest(JOB, 5, rank).await.unwrap(),
            manifest(5, rank)
        );
    }
    let steps = r.list_steps(JOB).await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].records.len(), 2);
    assert!(r.list_pins(JOB).await.unwrap().contains(&5));
    // New puts do not reuse a reloaded file's name.
    let extra = vec![9u8; 5000];
    r.put_chunk(JOB, ChunkId::of(&extra), frame(&extra))
        .unwrap();
    r.keep_memory_on_disk().unwrap();
    drop(r);
    assert_eq!(
        Replicas::new(&spill, limits()).unwrap().reloaded().chunks,
        9
    );
}

#[tokio::test]
async fn damaged_frames_and_shards_naming_lost_chunks_are_dropped_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    {
        let r = Replicas::new(&spill, limits()).unwrap();
        save(&r).await;
        r.keep_memory_on_disk().unwrap();
    }
    // One of rank 1's frames flipped on disk; a leftover temporary file.
    let victim = ChunkId::of(&chunk(1, 2)).to_hex();
    let path = spilled(&spill)
        .into_iter()
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&victim)
        })
        .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    std::fs::write(chunk_root(&spill).join(JOB).join(".tmp-99"), b"half").unwrap();

    let r = Replicas::new(&spill, limits()).unwrap();
    let got = r.reloaded();
    assert_eq!((got.chunks, got.damaged, got.shards_dropped), (7, 1, 1));
    assert!(!path.exists(), "the damaged frame is deleted");
    assert_eq!(spilled(&spill).len(), 7, "the leftover is gone");
    // Rank 0's shard stays whole; rank 1's is retired, not half served.
    let steps = r.list_steps(JOB).await.unwrap();
    assert_eq!(steps[0].manifests.iter().copied().collect::<Vec<_>>(), [0]);
    assert!(r.get_manifest(JOB, 5, 1).await.is_err());
    assert!(r
        .get_frame(JOB, &ChunkId::of(&chunk(1, 2)))
        .is_err_and(|e| e.kind() == strata_tiered::StoreErrorKind::NotFound));
}

#[tokio::test]
async fn a_killed_service_loses_only_what_was_in_memory_and_lists_nothing_it_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    {
        let r = Replicas::new(&spill, limits()).unwrap();
        save(&r).await;
        // No keep_memory_on_disk: as if killed.
    }
    let r = Replicas::new(&spill, limits()).unwrap();
    let got = r.reloaded();
    assert!(got.chunks > 0 && got.chunks < 8, "{got:?}");
    assert_eq!(got.damaged, 0);
    // Every manifest still listed names only chunks held.
    for st in r.list_steps(JOB).await.unwrap() {
        for rank in st.manifests {
            let m = ShardManifest::decode(&r.get_manifest(JOB, 5, rank).await.unwrap()).unwrap();
            assert!(r
                .has(JOB, &m.chunks.iter().map(|c| c.id).collect::<Vec<_>>())
                .unwrap()
                .iter()
                .all(|&h| h));
        }
    }
    assert!(got.shards_dropped >= 1);
}

#[test]
fn a_spill_directory_in_another_layout_is_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    std::fs::create_dir_all(spill.join("old-job")).unwrap();
    std::fs::write(spill.join("old-job").join("x.1"), b"old").unwrap();
    let r = Replicas::new(&spill, limits()).unwrap();
    assert_eq!(r.reloaded(), Reloaded::default());
    assert!(!spill.join("old-job").exists());
    assert!(spill.join("FORMAT").is_file());
}

#[test]
fn a_second_service_on_a_spill_directory_in_use_is_refused_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    let first = Replicas::new(&spill, limits()).unwrap();
    let c = chunk(0, 0);
    first.put_chunk(JOB, ChunkId::of(&c), frame(&c)).unwrap();
    first.keep_memory_on_disk().unwrap();
    let e = Replicas::new(&spill, limits()).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
    assert_eq!(spilled(&spill).len(), 1);
    drop(first);
    assert_eq!(
        Replicas::new(&spill, limits()).unwrap().reloaded().chunks,
        1
    );
}

#[test]
fn a_layout_this_version_does_not_know_is_refused_not_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    std::fs::create_dir_all(spill.join("chunks")).unwrap();
    std::fs::write(spill.join("FORMAT"), "strata-peer-spill 2\n").unwrap();
    let e = Replicas::new(&spill, limits()).unwrap_err();
    assert!(e.to_string().contains("does not know"), "{e}");
    assert!(spill.join("chunks").is_dir());
}

#[tokio::test]
async fn a_start_applies_its_own_retention_to_every_reloaded_job() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    let keep = |n| Limits {
        keep_last: n,
        grace: std::time::Duration::ZERO,
        ..limits()
    };
    {
        let r = Replicas::new(&spill, keep(10)).unwrap();
        for step in [5, 6] {
            for rank in 0..2 {
                let m = manifest(step, rank);
                r.put_manifest(JOB, step, rank, &m).await.unwrap();
                r.commit(&CommitRecord {
                    job: JOB.into(),
                    step,
                    world_size: 2,
                    committed_unix_ms: 1,
                    shards: vec![ShardRef {
                        rank,
                        manifest: ChunkId::of(&m),
                        logical_bytes: 4000,
                    }],
                })
                .await
                .unwrap();
            }
        }
        for rank in 0..2 {
            for i in 0..4 {
                let c = chunk(rank, i);
                r.put_chunk(JOB, ChunkId::of(&c), frame(&c)).unwrap();
            }
        }
        r.keep_memory_on_disk().unwrap();
        let steps: Vec<u64> = r
            .list_steps(JOB)
            .await
            .unwrap()
            .iter()
            .map(|s| s.step)
            .collect();
        assert_eq!(steps, [5, 6]);
    }
    // Started again keeping one step: step 5 goes at start, with no commit
    // from the job (a finished job sends none).
    let r = Replicas::new(&spill, keep(1)).unwrap();
    let steps: Vec<u64> = r
        .list_steps(JOB)
        .await
        .unwrap()
        .iter()
        .map(|s| s.step)
        .collect();
    assert_eq!(steps, [6]);
    assert_eq!(r.reloaded().steps, 2, "both were reloaded before retention");
}

#[tokio::test]
async fn graceful_stops_keep_the_spill_within_memory_plus_disk_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    let one = frame(&chunk(0, 0)).len() as u64;
    // Memory takes four frames, the disk two: the spill directory is
    // sized for six (docs/operations.md), across any number of restarts.
    let limits = Limits {
        memory_bytes: 4 * one,
        disk_bytes: 2 * one,
        ..Limits::default()
    };
    let room = limits.memory_bytes + limits.disk_bytes;
    let put = |r: &Replicas, cs: &[(u32, u32)]| -> Vec<ChunkId> {
        cs.iter()
            .map(|&(rank, i)| {
                let c = chunk(rank, i);
                r.put_chunk(JOB, ChunkId::of(&c), frame(&c)).unwrap();
                // Puts told apart by the clock that orders what is kept.
                std::thread::sleep(std::time::Duration::from_millis(2));
                ChunkId::of(&c)
            })
            .collect()
    };
    let on_disk = || -> u64 {
        spilled(&spill)
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum()
    };
    let first = {
        let r = Replicas::new(&spill, limits.clone()).unwrap();
        let ids = put(&r, &[(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]);
        assert_eq!(r.stats().unwrap().1, one, "one frame spilled past memory");
        assert_eq!(r.keep_memory_on_disk().unwrap(), (4, 0));
        ids
    };
    assert_eq!(on_disk(), 5 * one);
    // The next run reloads five frames (over the disk budget, admitted
    // before) and takes four new ones into its empty memory; its stop
    // has room for one: the one put last.
    let second = {
        let r = Replicas::new(&spill, limits.clone()).unwrap();
        assert_eq!(r.reloaded().chunks, 5);
        let ids = put(&r, &[(1, 1), (1, 2), (1, 3), (2, 0)]);
        assert_eq!(r.stats().unwrap().0, 4 * one, "the new frames in memory");
        assert_eq!(r.keep_memory_on_disk().unwrap(), (1, 3));
        let (_, disk, _, _) = r.stats().unwrap();
        assert!(disk <= room, "{disk} bytes on disk, room {room}");
        ids
    };
    assert!(
        on_disk() <= room,
        "{} bytes in the spill, room {room}",
        on_disk()
    );
    let r = Replicas::new(&spill, limits).unwrap();
    assert_eq!(r.reloaded().chunks, 6);
    for id in first.iter().chain(&second[3..]) {
        assert!(r.get_frame(JOB, id).is_ok(), "{id} kept");
    }
    for id in &second[..3] {
        assert!(r.get_frame(JOB, id).is_err(), "{id} is over the room");
    }
}
