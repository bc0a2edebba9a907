//! L3 is collected by each rank's uploader after an upload: the newest
//! `l3_keep_last` steps (and every `l3_keep_every`-th) stay, the rest and
//! the chunks no manifest references go; the kept steps restore from L3
//! alone. An upload that reuses a chunk older than half the grace period
//! writes it again, so a collection that planned to delete that chunk
//! before the upload and sweeps after it spares it (tested with that very
//! interleaving).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use strata::format::DType;
use strata::tiered::{ChunkStore, L3Options, L3Store};
use strata::{Checkpointer, Config, Entry, StepSelector};
use strata_tiered::ChunkStoreExt;

fn l3(refresh_after: Option<Duration>) -> Arc<L3Store> {
    l3_over(
        Arc::new(object_store::memory::InMemory::new()),
        L3Options {
            refresh_after,
            ..L3Options::default()
        },
    )
}

/// L3 over `objects`.
fn l3_over(objects: Arc<dyn object_store::ObjectStore>, opts: L3Options) -> Arc<L3Store> {
    Arc::new(L3Store::with_store(objects, "root", "memory://l3", opts))
}

fn cfg(dir: &std::path::Path) -> Config {
    let mut c = Config::builder()
        .job("l3gc")
        .l1_dir(dir)
        .chunk_size(1 << 16)
        .keep_last(2)
        .upload_every(1);
    c.l3_keep_last = 3;
    c.l3_keep_every = 5;
    c.l3_gc_grace_secs = 0;
    c
}

fn state(step: u64) -> Vec<u8> {
    let mut v = vec![7u8; 1 << 17]; // a chunk every step shares
    v.extend(std::iter::repeat_n(step as u8, 1 << 16)); // one of its own
    v
}

fn save(ck: &Checkpointer, step: u64) {
    save_bytes(ck, step, &state(step));
}

/// Saves `bytes` as entry `w` of `step`, then waits for its upload.
fn save_bytes(ck: &Checkpointer, step: u64, bytes: &[u8]) {
    let shape = [bytes.len() as u64];
    ck.save(step, &[Entry::tensor("w", DType::U8, &shape, bytes)])
        .unwrap()
        .wait()
        .unwrap();
    ck.wait_uploads();
}

/// The steps every rank committed on `store`.
fn complete_steps(rt: &tokio::runtime::Runtime, store: &L3Store) -> BTreeSet<u64> {
    rt.block_on(store.list_steps("l3gc"))
        .unwrap()
        .iter()
        .filter(|st| st.is_complete())
        .map(|st| st.step)
        .collect()
}

/// The node loses its disk (`dir`): each of `steps` restores from `store`
/// alone, byte for byte `want(step)`.
fn restore_from_l3_alone(
    dir: &std::path::Path,
    cfg: Config,
    store: &Arc<L3Store>,
    steps: &[u64],
    want: fn(u64) -> Vec<u8>,
) {
    std::fs::remove_dir_all(dir).unwrap();
    let ck = Checkpointer::builder(cfg)
        .remote(Some(store.clone() as Arc<dyn ChunkStore>))
        .build()
        .unwrap();
    for &step in steps {
        let got = ck.restore(StepSelector::Step(step)).unwrap();
        assert_eq!(got.get("w").unwrap().bytes, want(step), "step {step}");
    }
}

#[test]
fn l3_keeps_its_policys_steps_and_only_their_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let store = l3(Some(Duration::ZERO));
    let ck = Checkpointer::builder(cfg(dir.path()))
        .remote(Some(store.clone() as Arc<dyn ChunkStore>))
        .build()
        .unwrap();
    for step in 1..=12 {
        save(&ck, step);
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let on_l3 = complete_steps(&rt, &store);
    assert_eq!(on_l3, BTreeSet::from([5, 10, 11, 12]));
    // Chunks: the shared one and one per kept step.
    let chunks = rt.block_on(store.list_chunks("l3gc")).unwrap();
    assert_eq!(chunks.len(), 1 + on_l3.len(), "{chunks:?}");
    drop(ck);
    restore_from_l3_alone(dir.path(), cfg(dir.path()), &store, &[5, 12], state);
}

#[test]
fn a_reused_chunk_older_than_the_refresh_age_counts_as_missing() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let put = |s: &L3Store| {
        let b = vec![3u8; 1000];
        let id = strata::format::ChunkId::of(&b);
        rt.block_on(s.put_chunks(
            "j",
            vec![strata::tiered::ChunkPut {
                id,
                hint: strata::format::codec::ElemHint::BYTES,
                data: strata::tiered::ChunkData::copy_from(&b),
            }],
        ))
        .unwrap();
        id
    };
    let fresh = l3(Some(Duration::from_secs(3600)));
    let id = put(&fresh);
    assert_eq!(rt.block_on(fresh.has_chunks("j", &[id])).unwrap(), [true]);
    let stale = l3(Some(Duration::ZERO));
    let id = put(&stale);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(rt.block_on(stale.has_chunks("j", &[id])).unwrap(), [false]);
    let plain = l3(None);
    let id = put(&plain);
    assert_eq!(rt.block_on(plain.has_chunks("j", &[id])).unwrap(), [true]);
}

#[test]
fn a_step_uploaded_on_request_stays_on_l3() {
    let dir = tempfile::tempdir().unwrap();
    let store = l3(Some(Duration::ZERO));
    let mut c = cfg(dir.path()).keep_last(10);
    c.l3_keep_last = 2;
    c.l3_keep_every = 0;
    let ck = Checkpointer::builder(c)
        .remote(Some(store.clone() as Arc<dyn ChunkStore>))
        .build()
        .unwrap();
    for step in 1..=6 {
        save(&ck, step);
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(complete_steps(&rt, &store), BTreeSet::from([5, 6]));
    // Asked for again, step 2 goes back to L3 and stays there while the
    // policy's uploads go on.
    ck.upload(2).unwrap();
    ck.wait_uploads();
    for step in 7..=8 {
        save(&ck, step);
    }
    assert_eq!(complete_steps(&rt, &store), BTreeSet::from([2, 7, 8]));
}

/// The interleaving a collection and an upload can have: the collection
/// plans (a chunk no manifest references any more, older than its
/// cutoff), an upload then reuses that chunk, and only then does the
/// collection sweep (`delete_chunks_untouched_since` with the planned
/// cutoff, as `strata_gc::collect` does). The upload wrote the old chunk
/// again, so the sweep spares it and the new step restores from L3 alone.
#[test]
fn a_chunk_reused_by_an_upload_between_a_collections_plan_and_sweep_survives() {
    let dir = tempfile::tempdir().unwrap();
    let store = l3(Some(Duration::ZERO));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let shared = strata::format::ChunkId::of(&state(1)[..1 << 16]);
    {
        let ck = Checkpointer::builder(cfg(dir.path()))
            .remote(Some(store.clone() as Arc<dyn ChunkStore>))
            .build()
            .unwrap();
        save(&ck, 1);
    }
    // Step 1 leaves L3: its chunks are unreferenced there.
    rt.block_on(store.delete_step("l3gc", 1)).unwrap();
    // The collection plans: L3's time now, every chunk older than it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let cutoff = loop {
        let now = rt.block_on(store.now("l3gc")).unwrap();
        let infos = rt.block_on(store.list_chunk_info("l3gc")).unwrap();
        if infos.iter().all(|c| c.touched.is_some_and(|t| t < now)) {
            break now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "L3's clock stood still"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let doomed = rt.block_on(store.list_chunks("l3gc")).unwrap();
    assert!(doomed.contains(&shared));
    // An upload of step 2 reuses the shared chunk.
    std::fs::remove_dir_all(dir.path()).unwrap();
    {
        let ck = Checkpointer::builder(cfg(dir.path()))
            .remote(Some(store.clone() as Arc<dyn ChunkStore>))
            .build()
            .unwrap();
        save(&ck, 2);
    }
    // The collection sweeps what it planned: the reused chunk stays.
    rt.block_on(store.delete_chunks_untouched_since("l3gc", &doomed, cutoff))
        .unwrap();
    assert!(
        rt.block_on(store.list_chunks("l3gc"))
            .unwrap()
            .contains(&shared),
        "the sweep deleted a chunk the upload had just reused"
    );
    std::fs::remove_dir_all(dir.path()).unwrap();
    let ck = Checkpointer::builder(cfg(dir.path()))
        .remote(Some(store.clone() as Arc<dyn ChunkStore>))
        .build()
        .unwrap();
    let got = ck.restore(StepSelector::Step(2)).unwrap();
    assert_eq!(got.get("w").unwrap().bytes, state(2));
}

/// A state whose every 64 KiB chunk is its step's own: four of them.
fn own_chunks(step: u64) -> Vec<u8> {
    (0..4u8)
        .flat_map(|i| std::iter::repeat_n(step as u8 ^ (i << 4) ^ 0x80, 1 << 16))
        .collect()
}

/// Every chunk the complete steps on `store` reference.
fn referenced(rt: &tokio::runtime::Runtime, store: &L3Store) -> BTreeSet<strata::format::ChunkId> {
    let mut out = BTreeSet::new();
    for st in rt.block_on(store.list_steps("l3gc")).unwrap() {
        if !st.is_complete() {
            continue;
        }
        for &rank in st.records.keys() {
            let bytes = rt
                .block_on(store.get_manifest("l3gc", st.step, rank))
                .unwrap();
            let m = strata::format::ShardManifest::decode(&bytes).unwrap();
            out.extend(m.chunks.iter().map(|c| c.id));
        }
    }
    out
}

/// An upload cut off half way (L3 stops taking writes after two of its
/// chunks) leaves chunks no step references; the step stays on L1 and its
/// upload is reported failed. No step retires here (`l3_keep_last` 10), so
/// a lazy collection never looks at them: once L3 takes writes again and
/// the grace period (0 s, and the 2 s L3's stamps are given) has passed,
/// the collection after the next upload lists every chunk and removes
/// them: L3 then holds exactly the chunks of its complete steps, and those
/// restore from L3 alone.
#[test]
fn chunks_of_a_failed_upload_are_collected_once_l3_takes_writes_again() {
    use strata_tiered::{FaultPlan, FaultStore};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let over = |s: Arc<dyn object_store::ObjectStore>| {
        l3_over(
            s,
            L3Options {
                max_retries: 1,
                ..L3Options::default()
            },
        )
    };
    let plain = over(inner.clone());
    let cfg = |dir: &std::path::Path| {
        let mut c = cfg(dir);
        c.l3_keep_last = 10;
        c
    };
    let save_own = |ck: &Checkpointer, step: u64| save_bytes(ck, step, &own_chunks(step));
    {
        let ck = Checkpointer::builder(cfg(dir.path()))
            .remote(Some(plain.clone() as Arc<dyn ChunkStore>))
            .build()
            .unwrap();
        save_own(&ck, 1);
        save_own(&ck, 2);
    }
    let faulty = Arc::new(FaultStore::new(
        inner.clone(),
        FaultPlan {
            writes_before_outage: Some(2),
            ..FaultPlan::default()
        },
    ));
    let ck = Checkpointer::builder(cfg(dir.path()))
        .remote(Some(over(faulty.clone()) as Arc<dyn ChunkStore>))
        .build()
        .unwrap();
    // The failure falls between these two instants.
    let before_failure = std::time::Instant::now();
    save_own(&ck, 3);
    let after_failure = std::time::Instant::now();
    assert!(
        matches!(ck.uploads().get(&3), Some(strata::L3State::Failed(_))),
        "{:?}",
        ck.uploads()
    );
    let on_l3: BTreeSet<_> = rt
        .block_on(plain.list_chunks("l3gc"))
        .unwrap()
        .into_iter()
        .collect();
    let orphans: BTreeSet<_> = on_l3
        .difference(&referenced(&rt, &plain))
        .copied()
        .collect();
    assert!(
        !orphans.is_empty(),
        "the cut-off upload left no chunk behind: nothing to collect"
    );

    faulty.heal();
    save_own(&ck, 4);
    assert!(
        matches!(
            ck.uploads().get(&4),
            Some(strata::L3State::Committed { .. })
        ),
        "{:?}",
        ck.uploads()
    );
    if before_failure.elapsed() < Duration::from_millis(1900) {
        // Not yet due (2 s after the failure): the collection after step 4
        // was lazy. (Skipped where the machine was too slow to tell.)
        let on_l3: BTreeSet<_> = rt
            .block_on(plain.list_chunks("l3gc"))
            .unwrap()
            .into_iter()
            .collect();
        assert!(orphans.is_subset(&on_l3), "swept before due");
    }
    std::thread::sleep(Duration::from_millis(2100).saturating_sub(after_failure.elapsed()));
    save_own(&ck, 5);
    let on_l3: BTreeSet<_> = rt
        .block_on(plain.list_chunks("l3gc"))
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(on_l3, referenced(&rt, &plain));
    assert!(on_l3.is_disjoint(&orphans), "{orphans:?} still on L3");
    assert_eq!(complete_steps(&rt, &plain), BTreeSet::from([1, 2, 4, 5]));
    drop(ck);
    restore_from_l3_alone(dir.path(), cfg(dir.path()), &plain, &[2, 5], own_chunks);
}
