//! Tiering to L3: the upload policy, dedup across steps, restore of a node
//! whose L1 is gone, per-chunk fallback with repair, resumed uploads; on a
//! local-directory object store and on a real S3 server (s3s-fs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use strata_testkit::servers;

use strata::format::DType;
use strata::{Checkpointer, Config, Entry, L3State, StepSelector};
use strata_tiered::ChunkStore;
use strata_tiered::ChunkStoreExt;

const MIB: usize = 1 << 20;

/// Ten 2 MiB tensors; `step` changes tensor `step % 10` only.
fn state(step: u64) -> Vec<Vec<u8>> {
    (0..10u64)
        .map(|i| {
            let version = if i == step % 10 { step } else { 0 };
            let key = (i << 40) ^ (version << 20);
            (0..2 * MIB as u64)
                .map(|j| ((j ^ key).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
                .collect()
        })
        .collect()
}

fn names() -> Vec<String> {
    (0..10).map(|i| format!("layer.{i}.weight")).collect()
}

fn entries<'a>(names: &'a [String], data: &'a [Vec<u8>]) -> Vec<Entry<'a>> {
    const SHAPE: [u64; 1] = [MIB as u64];
    names
        .iter()
        .zip(data)
        .map(|(n, d)| Entry::tensor(n, DType::BF16, &SHAPE, d))
        .collect()
}

fn cfg(l1: &std::path::Path, l3_url: &str, opts: &[(String, String)]) -> Config {
    let mut c = Config::builder()
        .job("tier")
        .l1_dir(l1)
        .chunk_size(MIB as u32)
        .keep_last(2)
        .gc_grace_secs(0)
        .l3_url(l3_url)
        .upload_every(2);
    for (k, v) in opts {
        c = c.l3_option(k.clone(), v.clone());
    }
    c
}

/// Saves steps 1..=4 with every 2nd uploaded, checks the upload states and
/// dedup, then loses L1 and restores step 4 from L3 alone.
fn policy_uploads_and_restore_after_losing_l1(l3_url: &str, opts: &[(String, String)]) {
    let l1 = tempfile::tempdir().unwrap();
    let names = names();
    {
        let ck = Checkpointer::new(cfg(l1.path(), l3_url, opts)).unwrap();
        for step in 1..=4 {
            let data = state(step);
            ck.save(step, &entries(&names, &data))
                .unwrap()
                .wait()
                .unwrap();
        }
        ck.wait_uploads();
        let ups = ck.uploads();
        assert_eq!(
            ups.keys().copied().collect::<Vec<_>>(),
            vec![2, 4],
            "{ups:?}"
        );
        let full = match &ups[&2] {
            L3State::Committed { sent, deduped } => {
                assert_eq!(*deduped, 0);
                *sent
            }
            other => panic!("step 2: {other:?}"),
        };
        assert_eq!(full, 20 * MIB as u64);
        match &ups[&4] {
            // Step 4 differs from step 2 in two tensors (2 and 4).
            L3State::Committed { sent, .. } => {
                assert!(*sent <= 4 * MIB as u64, "step 4 sent {sent} bytes")
            }
            other => panic!("step 4: {other:?}"),
        }
        let l3_steps = ck
            .l3()
            .map(|l3| {
                tokio::runtime::Runtime::new()
                    .unwrap()
                    .block_on(l3.list_steps("tier"))
                    .unwrap()
            })
            .unwrap();
        let committed: Vec<u64> = l3_steps
            .iter()
            .filter(|s| s.is_complete())
            .map(|s| s.step)
            .collect();
        assert_eq!(committed, vec![2, 4]);
    }
    // The node's disk is lost.
    std::fs::remove_dir_all(l1.path()).unwrap();
    let ck = Checkpointer::new(cfg(l1.path(), l3_url, opts)).unwrap();
    assert!(ck.committed_steps().unwrap().is_empty());
    let got = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(got.step, 4);
    assert_eq!(got.stats.bytes_from_l3, got.stats.bytes_read);
    let want = state(4);
    for (n, d) in names.iter().zip(&want) {
        assert_eq!(&got.get(n).unwrap().bytes, d, "{n}");
    }
    // The restore put the step back on L1: it is committed there, the next
    // restore is local, and the next save only writes what changed.
    assert!(got.stats.rehydrated);
    assert_eq!(ck.committed_steps().unwrap(), vec![4]);
    assert_eq!(
        ck.restore(StepSelector::Latest)
            .unwrap()
            .stats
            .bytes_from_l3,
        0
    );
    let s5 = state(5);
    let st = ck.save(5, &entries(&names, &s5)).unwrap().wait().unwrap();
    assert!(
        st.bytes_written <= 4 * MIB as u64,
        "after the restore, step 5 wrote {} bytes",
        st.bytes_written
    );
    // An older L3 step restores too.
    let got = ck.restore(StepSelector::Step(2)).unwrap();
    assert_eq!(got.get("layer.2.weight").unwrap().bytes, state(2)[2]);
}

#[test]
fn policy_uploads_and_restore_after_losing_l1_on_a_local_object_store() {
    let l3 = tempfile::tempdir().unwrap();
    policy_uploads_and_restore_after_losing_l1(&format!("file://{}", l3.path().display()), &[]);
}

#[test]
fn policy_uploads_and_restore_after_losing_l1_on_s3s_fs() {
    let Some(server) = servers::s3s_fs() else {
        return;
    };
    policy_uploads_and_restore_after_losing_l1(
        &format!("s3://{}/tiering", servers::BUCKET),
        &server.options(),
    );
}

/// A chunk damaged (then deleted) on L1 is read from L3 and L1 is repaired.
#[test]
fn damaged_l1_chunks_are_read_from_l3_and_repaired() {
    let (l1, l3) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = format!("file://{}", l3.path().display());
    let ck = Checkpointer::new(cfg(l1.path(), &url, &[])).unwrap();
    let names = names();
    let data = state(2);
    ck.save(2, &entries(&names, &data)).unwrap().wait().unwrap();
    ck.wait_uploads();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = strata::format::ShardManifest::decode(
        &rt.block_on(ck.l1().unwrap().get_manifest("tier", 2, 0))
            .unwrap(),
    )
    .unwrap();
    let (a, b) = (m.chunks[3].id, m.chunks[7].id);
    let pa = ck.l1().unwrap().chunk_path("tier", &a);
    let mut bytes = std::fs::read(&pa).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&pa, &bytes).unwrap();
    std::fs::remove_file(ck.l1().unwrap().chunk_path("tier", &b)).unwrap();

    let got = ck.restore(StepSelector::Latest).unwrap();
    for (n, d) in names.iter().zip(&data) {
        assert_eq!(&got.get(n).unwrap().bytes, d, "{n}");
    }
    assert_eq!(got.stats.chunks_repaired, 2);
    assert_eq!(got.stats.bytes_from_l3, 2 * MIB as u64);
    // Repaired: the next restore reads everything from L1.
    let again = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(again.stats.bytes_from_l3, 0);
    assert_eq!(again.stats.chunks_repaired, 0);
}

/// An upload interrupted after some chunks (no commit record yet) is
/// finished by the next upload of the step, which sends only the rest.
#[test]
fn an_interrupted_upload_resumes_without_resending() {
    let (l1, l3) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = format!("file://{}", l3.path().display());
    let ck = Checkpointer::new(cfg(l1.path(), &url, &[]).upload_every(0)).unwrap();
    let names = names();
    let data = state(1);
    ck.save(1, &entries(&names, &data)).unwrap().wait().unwrap();
    assert!(
        ck.uploads().is_empty(),
        "upload_every = 0 uploads nothing by itself"
    );
    // The interrupted run: 6 of the 20 1-MiB chunks reached L3, no
    // manifest, no record.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = strata::format::ShardManifest::decode(
        &rt.block_on(ck.l1().unwrap().get_manifest("tier", 1, 0))
            .unwrap(),
    )
    .unwrap();
    let ids: Vec<_> = m.chunks.iter().take(6).map(|c| c.id).collect();
    let chunks = rt.block_on(ck.l1().unwrap().get_chunks("tier", &ids));
    let puts = ids
        .iter()
        .zip(chunks)
        .zip(&m.chunks)
        .map(|((id, d), c)| strata_tiered::ChunkPut {
            id: *id,
            hint: c.hint,
            data: d.unwrap(),
        })
        .collect();
    let l3 = ck.l3().unwrap();
    rt.block_on(l3.put_chunks("tier", puts)).unwrap();
    assert!(rt
        .block_on(l3.list_steps("tier"))
        .unwrap()
        .iter()
        .all(|s| !s.is_complete()));

    ck.upload(1).unwrap();
    ck.wait_uploads();
    match &ck.uploads()[&1] {
        L3State::Committed { sent, deduped } => {
            assert_eq!(*sent, 14 * MIB as u64);
            assert_eq!(*deduped, 6 * MIB as u64);
        }
        other => panic!("{other:?}"),
    }
    // Asking again is harmless: nothing is sent, the commit stands.
    ck.upload(1).unwrap();
    ck.wait_uploads();
    assert!(matches!(
        ck.uploads()[&1],
        L3State::Committed { sent: 0, .. }
    ));
}

/// Through a faulty object store (seeded 503s, timeouts, dropped
/// connections): uploads still commit, and a node with an empty L1 still
/// restores byte-identical. Then the store goes down for writes: saves keep
/// succeeding on L1, the upload is reported failed, L3 holds no commit for
/// it, and the step still restores from L1.
#[test]
fn faults_on_l3_never_cost_a_save_or_a_restore() {
    use std::sync::Arc;
    use strata_tiered::{FaultPlan, FaultStore};
    let seed = std::env::var("STRATA_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0xFA17_u64);
    eprintln!("fault seed {seed} (STRATA_FAULT_SEED={seed} replays it)");
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let opts = strata_tiered::L3Options {
        max_retries: 8,
        ..strata_tiered::L3Options::default()
    };
    let flaky = |plan: FaultPlan| {
        // A store that is down gives up sooner (the retries are proven above).
        let opts = match plan.writes_before_outage {
            Some(_) => strata_tiered::L3Options {
                max_retries: 3,
                ..opts.clone()
            },
            None => opts.clone(),
        };
        strata_tiered::L3Store::with_store(
            Arc::new(FaultStore::new(inner.clone(), plan)),
            "root",
            "faulty",
            opts,
        )
    };
    let transient = FaultPlan {
        seed,
        error_rate: 0.1,
        timeout_rate: 0.02,
        timeout: std::time::Duration::from_millis(20),
        drop_rate: 0.05,
        ..FaultPlan::default()
    };
    let names = names();
    let l1 = tempfile::tempdir().unwrap();
    let cfg = || cfg(l1.path(), "memory://", &[]);
    {
        let ck = Checkpointer::with_tiers(
            cfg(),
            Arc::new(strata::SoloCoordinator),
            Some(flaky(transient.clone())),
        )
        .unwrap();
        for step in 1..=2 {
            let data = state(step);
            ck.save(step, &entries(&names, &data))
                .unwrap()
                .wait()
                .unwrap();
        }
        ck.wait_uploads();
        assert!(
            matches!(ck.uploads()[&2], L3State::Committed { .. }),
            "{:?}",
            ck.uploads()
        );
    }
    std::fs::remove_dir_all(l1.path()).unwrap();
    {
        let ck = Checkpointer::with_tiers(
            cfg(),
            Arc::new(strata::SoloCoordinator),
            Some(flaky(transient)),
        )
        .unwrap();
        let got = ck.restore(StepSelector::Latest).unwrap();
        assert_eq!(got.step, 2);
        for (n, d) in names.iter().zip(&state(2)) {
            assert_eq!(&got.get(n).unwrap().bytes, d, "{n}");
        }
    }
    // Writes to L3 fail from now on.
    let down = FaultPlan {
        seed,
        writes_before_outage: Some(0),
        ..FaultPlan::default()
    };
    let ck = Checkpointer::with_tiers(cfg(), Arc::new(strata::SoloCoordinator), Some(flaky(down)))
        .unwrap();
    for step in 3..=4 {
        let data = state(step);
        ck.save(step, &entries(&names, &data))
            .unwrap()
            .wait()
            .unwrap();
    }
    ck.wait_uploads();
    assert!(
        matches!(ck.uploads()[&4], L3State::Failed(_)),
        "{:?}",
        ck.uploads()
    );
    let tiers = ck.steps().unwrap();
    let s4 = tiers.iter().find(|t| t.step == 4).unwrap();
    assert!(s4.l1 && !s4.l3, "{s4:?}");
    let got = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(got.step, 4);
    assert_eq!(got.stats.bytes_from_l3, 0);
}

/// The bandwidth cap holds an upload to its rate, and L1 retention keeps a
/// step until its upload is done: with keep_last = 1, step 4 waits in the
/// queue behind step 2's capped upload (20 MiB at 20 MiB/s) while steps 5
/// and 6 are saved; it still uploads (without the pin, retention would
/// delete it from L1 first and its upload would fail).
#[test]
fn capped_uploads_take_their_time_and_keep_their_step_on_l1() {
    let (l1, l3) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = format!("file://{}", l3.path().display());
    let cap = 20 * MIB as u64;
    let ck = Checkpointer::new(
        cfg(l1.path(), &url, &[])
            .keep_last(1)
            .upload_bytes_per_sec(cap),
    )
    .unwrap();
    let names = names();
    let t = std::time::Instant::now();
    for step in 2..=6 {
        let data = state(step);
        ck.save(step, &entries(&names, &data))
            .unwrap()
            .wait()
            .unwrap();
    }
    ck.wait_uploads();
    let took = t.elapsed();
    let ups = ck.uploads();
    let sent: u64 = ups
        .values()
        .map(|u| match u {
            L3State::Committed { sent, .. } => *sent,
            other => panic!("{other:?} in {ups:?}"),
        })
        .sum();
    assert_eq!(ups.keys().copied().collect::<Vec<_>>(), vec![2, 4, 6]);
    assert!(
        took.as_secs_f64() >= 0.9 * sent as f64 / cap as f64,
        "{sent} bytes uploaded in {took:?} under a cap of {cap} B/s"
    );
    // Retention caught up once the uploads ended: only the newest on L1.
    let data = state(7);
    ck.save(7, &entries(&names, &data)).unwrap().wait().unwrap();
    assert_eq!(ck.committed_steps().unwrap(), vec![7]);
}

/// `upload_min_interval_secs`: at most one policy upload per interval.
#[test]
fn the_minimum_upload_interval_skips_policy_uploads() {
    let (l1, l3) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = format!("file://{}", l3.path().display());
    let mut c = cfg(l1.path(), &url, &[]).upload_every(1);
    c.upload_min_interval_secs = 3600;
    let ck = Checkpointer::new(c).unwrap();
    let names = names();
    for step in 1..=3 {
        let data = state(step);
        ck.save(step, &entries(&names, &data))
            .unwrap()
            .wait()
            .unwrap();
    }
    ck.wait_uploads();
    assert_eq!(ck.uploads().keys().copied().collect::<Vec<_>>(), vec![1]);
    // An explicit upload is not subject to the policy.
    ck.upload(3).unwrap();
    ck.wait_uploads();
    assert!(matches!(ck.uploads()[&3], L3State::Committed { .. }));
}

/// Large tensors (whole chunks, decoded in place) and small ones (packed
/// several to a chunk) of every length, for the L3 restore paths.
fn mixed() -> (Vec<String>, Vec<Vec<u8>>) {
    let mut names = Vec::new();
    let mut data = Vec::new();
    for i in 0..40usize {
        let len = match i % 4 {
            0 => 2 * MIB,
            1 => 2 * (1 + i * 37),
            2 => MIB / 2 + 2 * i,
            _ => 3 * MIB + 2,
        };
        names.push(format!("t{i}"));
        data.push(
            (0..len)
                .map(|j| {
                    ((j as u64 ^ (i as u64) << 32).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as u8
                })
                .collect(),
        );
    }
    (names, data)
}

/// The mixed state as bf16 tensors (`shapes` holds their element counts).
fn mixed_entries<'a>(
    names: &'a [String],
    data: &'a [Vec<u8>],
    shapes: &'a [[u64; 1]],
) -> Vec<Entry<'a>> {
    names
        .iter()
        .zip(data)
        .zip(shapes)
        .map(|((n, d), s)| Entry::tensor(n, DType::BF16, s, d))
        .collect()
}

fn shapes(data: &[Vec<u8>]) -> Vec<[u64; 1]> {
    data.iter().map(|d| [d.len() as u64 / 2]).collect()
}

/// A node with an empty L1 and `rehydrate_l1 = false` restores from L3 into
/// memory only: every byte of whole and packed chunks right (also through
/// ranged reads and `restore_into` of a subset), nothing written to L1.
#[test]
fn restore_from_l3_without_write_back_leaves_l1_untouched() {
    let (l1, l3) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = format!("file://{}", l3.path().display());
    let (names, data) = mixed();
    {
        let ck = Checkpointer::new(cfg(l1.path(), &url, &[]).upload_every(1)).unwrap();
        ck.save(1, &mixed_entries(&names, &data, &shapes(&data)))
            .unwrap()
            .wait()
            .unwrap();
        ck.wait_uploads();
        assert!(matches!(ck.uploads()[&1], L3State::Committed { .. }));
    }
    let fresh = tempfile::tempdir().unwrap();
    let opts = [("range_size".to_string(), "65536".to_string())];
    let ck = Checkpointer::new(cfg(fresh.path(), &url, &opts).rehydrate_l1(false)).unwrap();
    let got = ck.restore(StepSelector::Latest).unwrap();
    for (n, d) in names.iter().zip(&data) {
        assert!(&got.get(n).unwrap().bytes == d, "{n}");
    }
    assert_eq!(got.stats.bytes_from_l3, got.stats.bytes_read);
    assert!(!got.stats.rehydrated);
    assert!(ck.committed_steps().unwrap().is_empty());
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(rt
        .block_on(ck.l1().unwrap().list_chunks("tier"))
        .unwrap()
        .is_empty());

    // A subset into caller buffers: a packed entry and a large one.
    let (mut a, mut b) = (vec![0u8; data[5].len()], vec![0u8; data[3].len()]);
    let st = ck
        .restore_into(
            StepSelector::Latest,
            &mut [("t5", a.as_mut_slice()), ("t3", b.as_mut_slice())],
        )
        .unwrap();
    assert!(a == data[5] && b == data[3]);
    assert!(st.bytes_read < got.stats.bytes_read / 4, "{st:?}");
    assert!(!st.rehydrated);
}

/// The write-back of an L3 restore runs into a full L1 (an 8 MiB tmpfs for
/// a 63 MiB step): the restore still returns every byte, reports that L1
/// was not rehydrated, and commits nothing there.
#[test]
fn a_full_l1_during_the_write_back_still_restores_from_l3() {
    let (l1, l3) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = format!("file://{}", l3.path().display());
    let (names, data) = mixed();
    {
        let ck = Checkpointer::new(cfg(l1.path(), &url, &[]).upload_every(1)).unwrap();
        ck.save(1, &mixed_entries(&names, &data, &shapes(&data)))
            .unwrap()
            .wait()
            .unwrap();
        ck.wait_uploads();
    }
    let small = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(small.path())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("SKIPPED full-L1 write-back test: cannot mount a tmpfs here (needs root)");
        return;
    }
    struct Mount(std::path::PathBuf);
    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _mount = Mount(small.path().to_path_buf());
    let ck = Checkpointer::new(cfg(small.path(), &url, &[])).unwrap();
    let got = ck.restore(StepSelector::Latest).unwrap();
    for (n, d) in names.iter().zip(&data) {
        assert!(&got.get(n).unwrap().bytes == d, "{n}");
    }
    assert!(!got.stats.rehydrated);
    assert!(ck.committed_steps().unwrap().is_empty());
}
