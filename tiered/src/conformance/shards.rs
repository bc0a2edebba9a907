//! Checks of one shard's life: a committed manifest is never replaced,
//! retiring one rank leaves the others, and concurrent writers of one id.

use std::collections::BTreeSet;

use strata_format::{ChunkId, CommitRecord, ShardManifest, ShardRef};

use super::{chunk, ensure, err, futures_join_all, Outcome, JOB};
use crate::error::StoreErrorKind;
use crate::store::ChunkStore;
use crate::store::ChunkStoreExt;

/// A one-rank record naming the very manifest `bytes` (as a real save does).
fn record_of(step: u64, world: u32, rank: u32, bytes: &[u8], ms: u64) -> CommitRecord {
    CommitRecord {
        job: JOB.into(),
        step,
        world_size: world,
        committed_unix_ms: ms,
        shards: vec![ShardRef {
            rank,
            manifest: ShardManifest::id_of(bytes),
            logical_bytes: bytes.len() as u64,
        }],
    }
}

/// Once a record names a rank's manifest, another manifest for that rank
/// is refused (`AlreadyExists`) and the committed one stays; writing the
/// very same bytes again (a repair) succeeds.
pub async fn committed_manifest_is_never_replaced(s: &dyn ChunkStore) -> Outcome {
    let (a, b): (&[u8], &[u8]) = (b"manifest A", b"manifest B");
    s.put_manifest(JOB, 20, 0, a)
        .await
        .map_err(err("put manifest"))?;
    s.commit(&record_of(20, 1, 0, a, 1))
        .await
        .map_err(err("commit"))?;
    let e = s.put_manifest(JOB, 20, 0, b).await.err();
    ensure(
        e.as_ref()
            .is_some_and(|e| e.kind() == StoreErrorKind::AlreadyExists),
        || format!("replacing a committed manifest gave {e:?}"),
    )?;
    let got = s.get_manifest(JOB, 20, 0).await.map_err(err("get"))?;
    ensure(got == a, || "the committed manifest was replaced".into())?;
    s.put_manifest(JOB, 20, 0, a)
        .await
        .map_err(err("rewriting the committed bytes (a repair)"))?;
    let got = s.get_manifest(JOB, 20, 0).await.map_err(err("get"))?;
    ensure(got == a, || "the repaired manifest differs".into())?;
    // A whole-step record in rank 0's slot naming rank 1 too: rank 1's
    // manifest is committed as well, whatever slot names it.
    for (rank, m) in [(0u32, a), (1, b)] {
        s.put_manifest(JOB, 21, rank, m)
            .await
            .map_err(err("put manifest"))?;
    }
    let mut whole = record_of(21, 2, 0, a, 1);
    whole.shards.extend(record_of(21, 2, 1, b, 1).shards);
    s.commit(&whole).await.map_err(err("commit whole step"))?;
    let e = s.put_manifest(JOB, 21, 1, a).await.err();
    ensure(
        e.as_ref()
            .is_some_and(|e| e.kind() == StoreErrorKind::AlreadyExists),
        || format!("replacing rank 1's manifest named in slot 0 gave {e:?}"),
    )
}

/// `delete_shard` of one rank leaves the other rank's record and manifest,
/// leaves no retiring marker behind, and is fine on a missing shard.
pub async fn delete_shard_leaves_other_ranks(s: &dyn ChunkStore) -> Outcome {
    let m: [&[u8]; 2] = [b"rank zero", b"rank one"];
    for (rank, bytes) in m.iter().enumerate() {
        let rank = rank as u32;
        s.put_manifest(JOB, 40, rank, bytes)
            .await
            .map_err(err("put manifest"))?;
        s.commit(&record_of(40, 2, rank, bytes, 1))
            .await
            .map_err(err("commit"))?;
    }
    s.delete_shard(JOB, 40, 0)
        .await
        .map_err(err("delete shard"))?;
    let steps = s.list_steps(JOB).await.map_err(err("list"))?;
    let st = steps
        .iter()
        .find(|st| st.step == 40)
        .ok_or("step 40 not listed after deleting one of its shards")?;
    ensure(
        st.committed_ranks() == BTreeSet::from([1])
            && st.records.keys().copied().collect::<Vec<_>>() == vec![1]
            && st.manifests == BTreeSet::from([1])
            && st.retiring.is_empty()
            && st.unreadable.is_empty(),
        || format!("after deleting rank 0: {st:?}"),
    )?;
    let e = s.get_manifest(JOB, 40, 0).await.err();
    ensure(
        e.as_ref()
            .is_some_and(|e| e.kind() == StoreErrorKind::NotFound),
        || format!("deleted manifest read gave {e:?}"),
    )?;
    let got = s
        .get_manifest(JOB, 40, 1)
        .await
        .map_err(err("get rank 1"))?;
    ensure(got == m[1], || "rank 1's manifest changed".into())?;
    s.delete_shard(JOB, 40, 0)
        .await
        .map_err(err("deleting the shard again"))?;
    s.delete_shard(JOB, 99, 3)
        .await
        .map_err(err("deleting a shard never written"))
}

/// Writers racing on one id: identical manifests and records all succeed;
/// of different records for one slot exactly one wins (commits are
/// create-only: a check-then-write race would let several "win"), the
/// others get `AlreadyExists`, and the slot then holds the winner's record
/// whole.
pub async fn concurrent_writers_of_one_id(s: &dyn ChunkStore) -> Outcome {
    racing_writers(s, true).await
}

/// [`concurrent_writers_of_one_id`] on a server whose create-if-absent is
/// not atomic under a race (s3s-fs evaluates `If-None-Match` before it
/// writes): racing creators of one record may each be told they won, but
/// the slot must still end up holding exactly one of their records, whole
/// and readable, and every other check of the race holds.
pub async fn concurrent_writers_on_a_racy_server(s: &dyn ChunkStore) -> Outcome {
    racing_writers(s, false).await
}

async fn racing_writers(s: &dyn ChunkStore, atomic: bool) -> Outcome {
    const N: usize = 6;
    let m: &[u8] = b"the manifest everyone writes";
    let puts = (0..N).map(|_| s.put_manifest(JOB, 30, 0, m));
    for r in futures_join_all(puts).await {
        r.map_err(err("racing identical manifest puts"))?;
    }
    let rec = record_of(30, 1, 0, m, 7);
    let commits = (0..N).map(|_| s.commit(&rec));
    for r in futures_join_all(commits).await {
        r.map_err(err("racing identical commits"))?;
    }
    // Different records for one slot (step 31, rank 0).
    s.put_manifest(JOB, 31, 0, m)
        .await
        .map_err(err("put manifest"))?;
    let candidates: Vec<CommitRecord> = (0..N as u64)
        .map(|i| record_of(31, 1, 0, m, 100 + i))
        .collect();
    // Each creator on a thread of its own, all released at once: a store
    // whose check and write are apart lets several through, even where no
    // await lies between them.
    let rt = tokio::runtime::Handle::current();
    let gate = std::sync::Barrier::new(N);
    let results = tokio::task::block_in_place(|| {
        std::thread::scope(|sc| {
            let creators: Vec<_> = candidates
                .iter()
                .map(|r| {
                    let (rt, gate) = (&rt, &gate);
                    sc.spawn(move || {
                        gate.wait();
                        rt.block_on(s.commit(r))
                    })
                })
                .collect();
            creators
                .into_iter()
                .map(|h| {
                    h.join()
                        .map_err(|_| "a racing creator panicked".to_string())
                })
                .collect::<Result<Vec<_>, String>>()
        })
    })?;
    let mut won = Vec::new();
    for (r, c) in results.into_iter().zip(&candidates) {
        match r {
            Ok(()) => won.push(c.clone()),
            Err(e) if e.kind() == StoreErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("a racing commit failed with {e}")),
        }
    }
    ensure(won.len() == 1 || (!atomic && !won.is_empty()), || {
        format!(
            "{} of {N} racing creators of one commit record won (create-only: exactly one)",
            won.len()
        )
    })?;
    let steps = s.list_steps(JOB).await.map_err(err("list"))?;
    for (step, want) in [(30, vec![rec]), (31, won)] {
        let st = steps
            .iter()
            .find(|st| st.step == step)
            .ok_or_else(|| format!("step {step} not listed"))?;
        ensure(
            st.records.len() == 1
                && st.unreadable.is_empty()
                && st.records.get(&0).is_some_and(|r| want.contains(r)),
            || format!("after racing commits, step {step} holds {st:?}"),
        )?;
    }
    // Several chunks, overlapping, from racing batches.
    let cs: Vec<_> = (0..4)
        .map(|i| chunk(50_000 + i * 1000, 60 + i as u8))
        .collect();
    let batches =
        (0..N).map(|i| s.put_chunks(JOB, vec![cs[i % 4].clone(), cs[(i + 1) % 4].clone()]));
    for r in futures_join_all(batches).await {
        r.map_err(err("racing overlapping puts"))?;
    }
    let ids: Vec<ChunkId> = cs.iter().map(|c| c.id).collect();
    for (c, r) in cs.iter().zip(s.get_chunks(JOB, &ids).await) {
        let got = r.map_err(err("reading raced chunks"))?;
        ensure(got.as_slice() == c.data.as_slice(), || {
            "racing writers damaged a chunk".into()
        })?;
    }
    Ok(())
}
