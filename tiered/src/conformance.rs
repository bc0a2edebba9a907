//! The conformance suite every [`ChunkStore`] must pass.
//!
//! Each check takes a fresh, empty store and returns `Err(description)` on a
//! contract violation. [`conformance_tests!`](crate::conformance_tests)
//! expands to one `#[tokio::test]` per check for a store constructor, so a
//! tier's test file needs one line:
//!
//! ```ignore
//! strata_tiered::conformance_tests!((strata_tiered::MemoryStore::new(), ()));
//! ```
//!
//! The constructor expression yields `(store, guard)`; the guard (a temporary
//! directory, a server handle) lives as long as the test. A tier whose
//! stored bytes a test can change passes a [`Damage`] hook too, and the
//! damage checks run on it (without one they pass as skipped):
//!
//! ```ignore
//! strata_tiered::conformance_tests!(damage {
//!     let store = std::sync::Arc::new(strata_tiered::MemoryStore::new());
//!     let damage = strata_tiered::conformance::MemoryDamage(store.clone());
//!     (store, (), damage)
//! });
//! ```

use std::collections::BTreeSet;

use strata_format::codec::ElemHint;
use strata_format::{ChunkId, CommitRecord, ShardRef};

use crate::chunk_data::ChunkData;
use crate::error::StoreErrorKind;
use crate::store::ChunkStoreExt;
use crate::store::{ChunkPut, ChunkStore};

mod damage;
mod shards;

pub use damage::{
    damaged_chunk_is_corrupt, damaged_record_is_reported, Damage, L1Damage, MemoryDamage, NoDamage,
    ObjectDamage,
};
pub use shards::{
    committed_manifest_is_never_replaced, concurrent_writers_of_one_id,
    concurrent_writers_on_a_racy_server, delete_shard_leaves_other_ranks,
};

/// A check's outcome.
pub type Outcome = Result<(), String>;

const JOB: &str = "conformance-job";

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Outcome {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

/// Deterministic bytes of a given length and seed.
pub fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// A chunk to put.
pub fn chunk(len: usize, seed: u8) -> ChunkPut {
    let b = bytes(len, seed);
    ChunkPut {
        id: ChunkId::of(&b),
        hint: ElemHint::BYTES,
        data: ChunkData::copy_from(&b),
    }
}

fn record(step: u64, world: u32, ranks: &[u32]) -> CommitRecord {
    CommitRecord {
        job: JOB.into(),
        step,
        world_size: world,
        committed_unix_ms: 1,
        shards: ranks
            .iter()
            .map(|&rank| ShardRef {
                rank,
                manifest: ChunkId::of(&[rank as u8]),
                logical_bytes: 10,
            })
            .collect(),
    }
}

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Chunks of several sizes (1 byte, page-aligned, unaligned, multi-MiB)
/// round-trip whole and by range; `has_chunks` and `list_chunks` see them.
pub async fn put_get_round_trip(s: &dyn ChunkStore) -> Outcome {
    let chunks: Vec<ChunkPut> = [1usize, 4096, 5000, (3 << 20) + 7]
        .iter()
        .enumerate()
        .map(|(i, &n)| chunk(n, i as u8))
        .collect();
    let stats = s
        .put_chunks(JOB, chunks.clone())
        .await
        .map_err(err("put"))?;
    ensure(stats.written == 4 && stats.deduped == 0, || {
        format!("first put wrote {stats:?}")
    })?;
    for c in &chunks {
        let got = s.get_chunk(JOB, &c.id, None).await.map_err(err("get"))?;
        ensure(got.as_slice() == c.data.as_slice(), || {
            format!("chunk {} read back different bytes", c.id)
        })?;
        let n = c.data.len() as u32;
        let r = n / 3..n - n / 4;
        let part = s
            .get_chunk(JOB, &c.id, Some(r.clone()))
            .await
            .map_err(err("ranged get"))?;
        ensure(
            part.as_slice() == &c.data.as_slice()[r.start as usize..r.end as usize],
            || "ranged read differs".into(),
        )?;
    }
    let missing = ChunkId::of(b"never stored");
    let mut ids: Vec<ChunkId> = chunks.iter().map(|c| c.id).collect();
    ids.push(missing);
    let has = s.has_chunks(JOB, &ids).await.map_err(err("has"))?;
    ensure(has == vec![true, true, true, true, false], || {
        format!("has_chunks said {has:?}")
    })?;
    let listed: BTreeSet<ChunkId> = s
        .list_chunks(JOB)
        .await
        .map_err(err("list"))?
        .into_iter()
        .collect();
    ensure(listed == ids[..4].iter().copied().collect(), || {
        "list_chunks differs from what was put".into()
    })?;
    let batch = s.get_chunks(JOB, &ids).await;
    ensure(batch.len() == 5, || "get_chunks result count".into())?;
    for (c, r) in chunks.iter().zip(&batch) {
        ensure(
            r.as_ref().is_ok_and(|d| d.as_slice() == c.data.as_slice()),
            || format!("batch get of {} failed", c.id),
        )?;
    }
    ensure(
        batch[4]
            .as_ref()
            .is_err_and(|e| e.kind() == StoreErrorKind::NotFound),
        || "batch get of a missing chunk is not NotFound".into(),
    )
}

/// Putting the same chunks again (or twice in one call) writes nothing new.
pub async fn put_is_idempotent(s: &dyn ChunkStore) -> Outcome {
    let a = chunk(10_000, 1);
    let b = chunk(20_000, 2);
    let st = s
        .put_chunks(JOB, vec![a.clone(), a.clone(), b.clone()])
        .await
        .map_err(err("put"))?;
    ensure(
        st.written == 2 && st.deduped == 1 && st.bytes_deduped == 10_000,
        || format!("{st:?}"),
    )?;
    let st = s
        .put_chunks(JOB, vec![a.clone(), b.clone()])
        .await
        .map_err(err("put again"))?;
    ensure(
        st.written == 0 && st.deduped == 2 && st.bytes_written == 0,
        || format!("{st:?}"),
    )?;
    let got = s.get_chunk(JOB, &a.id, None).await.map_err(err("get"))?;
    ensure(got.as_slice() == a.data.as_slice(), || {
        "bytes changed".into()
    })
}

/// Writers racing on the same id all succeed and the bytes are intact.
pub async fn concurrent_puts_of_one_chunk(s: &dyn ChunkStore) -> Outcome {
    let c = chunk(1 << 20, 9);
    let puts = (0..4).map(|_| s.put_chunks(JOB, vec![c.clone()]));
    let results = futures_join_all(puts).await;
    let mut written = 0;
    for r in results {
        written += r.map_err(err("racing put"))?.written;
    }
    ensure(written >= 1, || "nobody wrote the chunk".into())?;
    let got = s.get_chunk(JOB, &c.id, None).await.map_err(err("get"))?;
    ensure(got.as_slice() == c.data.as_slice(), || {
        "racing writers damaged the chunk".into()
    })
}

async fn futures_join_all<F: std::future::Future>(fs: impl Iterator<Item = F>) -> Vec<F::Output> {
    // Poll all futures concurrently on the current task.
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = fs.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in pinned.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// Missing things are `NotFound`; bad arguments are `Invalid`.
pub async fn errors_have_kinds(s: &dyn ChunkStore) -> Outcome {
    let missing = ChunkId::of(b"nope");
    let e = s.get_chunk(JOB, &missing, None).await.err();
    ensure(
        e.as_ref()
            .is_some_and(|e| e.kind() == StoreErrorKind::NotFound),
        || format!("missing chunk gave {e:?}"),
    )?;
    let e = s.get_manifest(JOB, 5, 0).await.err();
    ensure(
        e.as_ref()
            .is_some_and(|e| e.kind() == StoreErrorKind::NotFound),
        || format!("missing manifest gave {e:?}"),
    )?;
    let c = chunk(100, 3);
    s.put_chunks(JOB, vec![c.clone()])
        .await
        .map_err(err("put"))?;
    let e = s.get_chunk(JOB, &c.id, Some(50..200)).await.err();
    ensure(
        e.as_ref()
            .is_some_and(|e| e.kind() == StoreErrorKind::Invalid),
        || format!("range past the end gave {e:?}"),
    )?;
    for bad in ["", "../escape", "a/b"] {
        let e = s.put_chunks(bad, vec![c.clone()]).await.err();
        ensure(
            e.as_ref()
                .is_some_and(|e| e.kind() == StoreErrorKind::Invalid),
            || format!("job id {bad:?} gave {e:?}"),
        )?;
    }
    Ok(())
}

/// Jobs do not see each other's chunks or steps.
pub async fn jobs_are_isolated(s: &dyn ChunkStore) -> Outcome {
    let c = chunk(777, 4);
    s.put_chunks("job-a", vec![c.clone()])
        .await
        .map_err(err("put"))?;
    let has = s.has_chunks("job-b", &[c.id]).await.map_err(err("has"))?;
    ensure(has == vec![false], || "job-b sees job-a's chunk".into())?;
    s.put_manifest("job-a", 1, 0, b"m")
        .await
        .map_err(err("manifest"))?;
    let steps = s.list_steps("job-b").await.map_err(err("list"))?;
    ensure(steps.is_empty(), || "job-b sees job-a's steps".into())
}

/// Manifests round-trip and an uncommitted one can be replaced.
pub async fn manifests(s: &dyn ChunkStore) -> Outcome {
    s.put_manifest(JOB, 7, 2, b"first")
        .await
        .map_err(err("put"))?;
    s.put_manifest(JOB, 7, 2, b"second")
        .await
        .map_err(err("replace"))?;
    let got = s.get_manifest(JOB, 7, 2).await.map_err(err("get"))?;
    ensure(got == b"second", || "manifest not replaced".into())?;
    let steps = s.list_steps(JOB).await.map_err(err("list"))?;
    ensure(
        steps.len() == 1 && steps[0].step == 7 && steps[0].records.is_empty(),
        || format!("{steps:?}"),
    )?;
    ensure(
        steps[0].manifests.contains(&2) && !steps[0].is_complete(),
        || "an uncommitted manifest must list as partial".into(),
    )
}

/// Commit records are create-only, idempotent for identical bytes, and
/// define what is committed.
pub async fn commits_are_create_only(s: &dyn ChunkStore) -> Outcome {
    for r in 0..2 {
        s.put_manifest(JOB, 10, r, b"m")
            .await
            .map_err(err("manifest"))?;
    }
    let r0 = record(10, 2, &[0]);
    s.commit(&r0).await.map_err(err("commit"))?;
    s.commit(&r0).await.map_err(err("identical commit again"))?;
    let mut other = r0.clone();
    other.committed_unix_ms = 2;
    let e = s.commit(&other).await.err();
    ensure(
        e.as_ref()
            .is_some_and(|e| e.kind() == StoreErrorKind::AlreadyExists),
        || format!("a different record gave {e:?}"),
    )?;
    let steps = s.list_steps(JOB).await.map_err(err("list"))?;
    let st = steps
        .iter()
        .find(|s| s.step == 10)
        .ok_or("step 10 not listed")?;
    ensure(
        st.committed_ranks() == BTreeSet::from([0]) && !st.is_complete(),
        || format!("{st:?}"),
    )?;
    ensure(st.records.get(&0) == Some(&r0), || {
        "the first record must win".into()
    })?;
    s.commit(&record(10, 2, &[1]))
        .await
        .map_err(err("commit rank 1"))?;
    let steps = s.list_steps(JOB).await.map_err(err("list"))?;
    let st = steps
        .iter()
        .find(|s| s.step == 10)
        .ok_or("step 10 not listed")?;
    ensure(st.is_complete() && st.world_size() == Some(2), || {
        format!("both ranks committed but {st:?}")
    })?;
    // Each slot read directly, as a restore reads its own record when
    // another rank listed the tier: the first record written, or nothing.
    let direct = s
        .get_commit_record(JOB, 10, 0)
        .await
        .map_err(err("record read directly"))?;
    ensure(direct.as_ref() == Some(&r0), || {
        format!("slot 0 of step 10 read directly gave {direct:?}")
    })?;
    for (step, slot) in [(10, 5), (12, 0)] {
        let none = s
            .get_commit_record(JOB, step, slot)
            .await
            .map_err(err("empty slot read directly"))?;
        ensure(none.is_none(), || {
            format!("slot {slot} of step {step} is empty but gave {none:?}")
        })?;
    }
    // A whole-step record (as L3 writes) for another step.
    s.commit(&record(11, 2, &[0, 1]))
        .await
        .map_err(err("whole-step commit"))?;
    let steps = s.list_steps(JOB).await.map_err(err("list"))?;
    ensure(
        steps.iter().map(|s| s.step).collect::<Vec<_>>() == vec![10, 11],
        || "steps listed oldest first".into(),
    )?;
    ensure(steps[1].is_complete(), || {
        "whole-step record is complete".into()
    })
}

/// Deleting a step removes its records and manifests, not its chunks;
/// deleting chunks removes them; deleting missing things is fine.
pub async fn deletion(s: &dyn ChunkStore) -> Outcome {
    let c = chunk(4096, 5);
    s.put_chunks(JOB, vec![c.clone()])
        .await
        .map_err(err("put"))?;
    s.put_manifest(JOB, 3, 0, b"m")
        .await
        .map_err(err("manifest"))?;
    s.commit(&record(3, 1, &[0])).await.map_err(err("commit"))?;
    s.delete_step(JOB, 3).await.map_err(err("delete step"))?;
    s.delete_step(JOB, 3)
        .await
        .map_err(err("delete step again"))?;
    let steps = s.list_steps(JOB).await.map_err(err("list"))?;
    ensure(steps.iter().all(|s| s.step != 3), || {
        "deleted step still listed".into()
    })?;
    ensure(s.get_manifest(JOB, 3, 0).await.is_err(), || {
        "deleted manifest still readable".into()
    })?;
    let has = s.has_chunks(JOB, &[c.id]).await.map_err(err("has"))?;
    ensure(has == vec![true], || {
        "delete_step must not delete chunks".into()
    })?;
    s.delete_chunks(JOB, &[c.id, ChunkId::of(b"absent")])
        .await
        .map_err(err("delete chunks"))?;
    let has = s.has_chunks(JOB, &[c.id]).await.map_err(err("has"))?;
    ensure(has == vec![false], || "deleted chunk still present".into())?;
    // A deleted chunk can be stored again.
    let st = s
        .put_chunks(JOB, vec![c.clone()])
        .await
        .map_err(err("put again"))?;
    ensure(st.written == 1, || format!("{st:?}"))
}

/// The tier's clock (`now`) is the one that dates its chunks: a chunk just
/// put is no older than a minute and not in the future by it, a sweep with
/// a grace period measured from it keeps the chunk, and (where the tier
/// reports ages) one with a cutoff past `now` deletes it.
pub async fn tier_clock_dates_its_chunks(s: &dyn ChunkStore) -> Outcome {
    let c = chunk(3000, 77);
    s.put_chunks(JOB, vec![c.clone()])
        .await
        .map_err(err("put"))?;
    let now = s.now(JOB).await.map_err(err("now"))?;
    let info = s.list_chunk_info(JOB).await.map_err(err("chunk info"))?;
    let touched = info.iter().find(|i| i.id == c.id).and_then(|i| i.touched);
    let minute = std::time::Duration::from_secs(60);
    if let Some(t) = touched {
        ensure(
            t <= now + minute && now.duration_since(t).unwrap_or_default() < minute,
            || format!("chunk dated {t:?}, tier's now {now:?}"),
        )?;
    }
    let hour_ago = now - 60 * minute;
    s.delete_chunks_untouched_since(JOB, &[c.id], hour_ago)
        .await
        .map_err(err("sweep"))?;
    let has = s.has_chunks(JOB, &[c.id]).await.map_err(err("has"))?;
    ensure(has == vec![true], || "a fresh chunk was swept".into())?;
    if touched.is_some() {
        s.delete_chunks_untouched_since(JOB, &[c.id], now + minute)
            .await
            .map_err(err("sweep"))?;
        let has = s.has_chunks(JOB, &[c.id]).await.map_err(err("has"))?;
        ensure(has == vec![false], || "an old chunk was kept".into())?;
    }
    Ok(())
}

/// Reading into spare buffers (stale bytes, some too small, fewer buffers
/// than chunks) returns exactly each chunk's bytes, and the buffers come back.
pub async fn reads_into_spare_buffers(s: &dyn ChunkStore) -> Outcome {
    let chunks: Vec<ChunkPut> = [10usize, 5000, 70_000, 3 << 20]
        .iter()
        .enumerate()
        .map(|(i, &n)| chunk(n, 40 + i as u8))
        .collect();
    s.put_chunks(JOB, chunks.clone())
        .await
        .map_err(err("put"))?;
    let ids: Vec<ChunkId> = chunks.iter().map(|c| c.id).collect();
    for round in 0..2 {
        let spare: Vec<crate::AlignedBuf> = [4 << 20, 4096, 8 << 20]
            .iter()
            .map(|&n| {
                let mut b = crate::AlignedBuf::zeroed(n);
                b.fill(0xA5);
                b
            })
            .collect();
        let got = s.get_chunks_reusing(JOB, &ids, spare).await;
        ensure(got.len() == ids.len(), || "one result per id".into())?;
        for (c, g) in chunks.iter().zip(got) {
            let g = g.map_err(err("get with spare buffers"))?;
            ensure(g.as_slice() == c.data.as_slice(), || {
                format!(
                    "round {round}: wrong bytes for a {}-byte chunk",
                    c.data.len()
                )
            })?;
            // Dropping the buffer for reuse must be possible.
            drop(g.into_buf());
        }
    }
    Ok(())
}

/// Expands to one `#[tokio::test]` per conformance check for a store built
/// by `$make`, an expression yielding `(store, guard)`. With `optional`, it
/// yields `Option<(store, guard)>` and `None` skips (a server that is not
/// installed; its constructor decides whether that may be skipped). With
/// `damage`, it yields `(store, guard, damager)`, a [`Damage`] for the
/// damage checks (which skip without one); with `optional damage`,
/// `Option<(store, guard, damager)>`.
#[macro_export]
macro_rules! conformance_tests {
    (@all $make:expr) => {
        $crate::conformance_tests!(@plain $make; put_get_round_trip, put_is_idempotent,
            concurrent_puts_of_one_chunk, errors_have_kinds, jobs_are_isolated, manifests,
            commits_are_create_only, deletion, reads_into_spare_buffers,
            committed_manifest_is_never_replaced, delete_shard_leaves_other_ranks,
            concurrent_writers_of_one_id, tier_clock_dates_its_chunks);
        $crate::conformance_tests!(@damage $make; damaged_chunk_is_corrupt,
            damaged_record_is_reported);
    };
    (@plain $make:expr; $($check:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let Some((store, _guard, _damage)) = $make else {
                    eprintln!("SKIPPED conformance check {}: no store", stringify!($check));
                    return;
                };
                if let Err(e) = $crate::conformance::$check(&store).await {
                    panic!("{} failed conformance check {}: {e}", $crate::store::ChunkStore::name(&store), stringify!($check));
                }
            }
        )*
    };
    (@damage $make:expr; $($check:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let Some((store, _guard, damage)) = $make else {
                    eprintln!("SKIPPED conformance check {}: no store", stringify!($check));
                    return;
                };
                let damage = damage.as_ref().map(|d| d as &dyn $crate::conformance::Damage);
                if let Err(e) = $crate::conformance::$check(&store, damage).await {
                    panic!("{} failed conformance check {}: {e}", $crate::store::ChunkStore::name(&store), stringify!($check));
                }
            }
        )*
    };
    // A server whose create-if-absent is not atomic under a race: every
    // check, the racing creators' one with "one record ends up there"
    // instead of "exactly one creator wins".
    (optional damage racy_creates $make:expr) => {
        $crate::conformance_tests!(@plain ($make).map(|(store, guard, damage)| {
            (store, guard, Some(damage))
        }); put_get_round_trip, put_is_idempotent,
            concurrent_puts_of_one_chunk, errors_have_kinds, jobs_are_isolated, manifests,
            commits_are_create_only, deletion, reads_into_spare_buffers,
            committed_manifest_is_never_replaced, delete_shard_leaves_other_ranks,
            concurrent_writers_on_a_racy_server, tier_clock_dates_its_chunks);
        $crate::conformance_tests!(@damage ($make).map(|(store, guard, damage)| {
            (store, guard, Some(damage))
        }); damaged_chunk_is_corrupt, damaged_record_is_reported);
    };
    (optional damage $make:expr) => {
        $crate::conformance_tests!(@all ($make).map(|(store, guard, damage)| {
            (store, guard, Some(damage))
        }));
    };
    (optional $make:expr) => {
        $crate::conformance_tests!(@all ($make).map(|(store, guard)| {
            (store, guard, None::<$crate::conformance::NoDamage>)
        }));
    };
    (damage $make:expr) => {
        $crate::conformance_tests!(@all Some({
            let (store, guard, damage) = $make;
            (store, guard, Some(damage))
        }));
    };
    ($make:expr) => {
        $crate::conformance_tests!(optional Some($make));
    };
}
