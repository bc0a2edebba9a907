//! Checks of damaged data: a [`Damage`] hook changes bytes inside a tier
//! (behind its back, as a bad disk or a stray writer would), and the tier
//! must report `Corrupt` chunks and unreadable commit records, never wrong
//! bytes and never a failed listing.
//!
//! A tier whose bytes a test cannot reach runs these checks without a
//! damager: they pass as skipped (and say so). The real S3 servers' tests
//! reach theirs through a second S3 client on the same bucket.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use strata_format::{ChunkId, CommitRecord, ShardManifest, ShardRef};

use super::{chunk, ensure, err, Outcome, JOB};
use crate::chunk_data::ChunkData;
use crate::error::{Result, StoreErrorKind};
use crate::store::ChunkStore;
use crate::store::ChunkStoreExt;
use crate::{L1Store, MemoryStore};

/// Changes bytes stored inside one tier, for the damage checks.
#[async_trait]
pub trait Damage: Send + Sync {
    /// Changes the stored bytes of chunk `id` (one byte, in the middle of
    /// what the tier stores), so they no longer verify.
    async fn damage_chunk(&self, job: &str, id: &ChunkId) -> Result<(), String>;

    /// Overwrites the commit record in slot `slot` of `step` with `bytes`.
    async fn damage_record(
        &self,
        job: &str,
        step: u64,
        slot: u32,
        bytes: &[u8],
    ) -> Result<(), String>;
}

/// No damager: the damage checks skip (the type of "none" in the macro).
#[derive(Clone, Copy, Debug)]
pub struct NoDamage;

#[async_trait]
impl Damage for NoDamage {
    async fn damage_chunk(&self, _job: &str, _id: &ChunkId) -> Result<(), String> {
        Err("no damager".into())
    }
    async fn damage_record(&self, _: &str, _: u64, _: u32, _: &[u8]) -> Result<(), String> {
        Err("no damager".into())
    }
}

fn flip_middle(bytes: &mut [u8]) {
    let mid = bytes.len() / 2;
    if let Some(b) = bytes.get_mut(mid) {
        *b ^= 0x5A;
    }
}

/// Damages a [`MemoryStore`] through its test hooks.
#[derive(Clone, Debug)]
pub struct MemoryDamage(pub Arc<MemoryStore>);

#[async_trait]
impl Damage for MemoryDamage {
    async fn damage_chunk(&self, job: &str, id: &ChunkId) -> Result<(), String> {
        let data = self.0.get_chunk(job, id, None).await.map_err(err("read"))?;
        let mut bytes = data.as_slice().to_vec();
        flip_middle(&mut bytes);
        self.0
            .corrupt_chunk(job, id, &bytes)
            .map_err(err("corrupt"))
    }
    async fn damage_record(
        &self,
        job: &str,
        step: u64,
        slot: u32,
        bytes: &[u8],
    ) -> Result<(), String> {
        self.0
            .corrupt_record(job, step, slot, bytes)
            .map_err(err("corrupt record"))
    }
}

/// Damages an [`L1Store`]'s files.
#[derive(Clone, Debug)]
pub struct L1Damage(pub L1Store);

#[async_trait]
impl Damage for L1Damage {
    async fn damage_chunk(&self, job: &str, id: &ChunkId) -> Result<(), String> {
        let path = self.0.chunk_path(job, id);
        let mut bytes = std::fs::read(&path).map_err(err("read chunk file"))?;
        flip_middle(&mut bytes);
        std::fs::write(&path, bytes).map_err(err("write chunk file"))
    }
    async fn damage_record(
        &self,
        job: &str,
        step: u64,
        slot: u32,
        bytes: &[u8],
    ) -> Result<(), String> {
        let path: PathBuf = self
            .0
            .manifest_path(job, step, 0)
            .with_file_name(format!("c-{slot}"));
        std::fs::write(path, bytes).map_err(err("write record file"))
    }
}

/// Damages an L3 tier's objects through the `ObjectStore` it runs on (an
/// `InMemory` shared with it, or a `LocalFileSystem` on its directory),
/// with keys under `root` as L3 lays them out.
#[derive(Clone, Debug)]
pub struct ObjectDamage {
    /// The object store the L3 tier writes to.
    pub store: Arc<dyn ObjectStore>,
    /// The tier's key prefix ("" for none).
    pub root: String,
}

impl ObjectDamage {
    fn key(&self, rest: String) -> ObjPath {
        if self.root.is_empty() {
            ObjPath::from(rest)
        } else {
            ObjPath::from(format!("{}/{rest}", self.root))
        }
    }
}

#[async_trait]
impl Damage for ObjectDamage {
    async fn damage_chunk(&self, job: &str, id: &ChunkId) -> Result<(), String> {
        let hex = id.to_hex();
        let key = self.key(format!("{job}/chunks/{}/{hex}", &hex[..2]));
        let got = self.store.get(&key).await.map_err(err("get object"))?;
        let mut bytes = got.bytes().await.map_err(err("read object"))?.to_vec();
        flip_middle(&mut bytes);
        self.store
            .put(&key, PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(err("put object"))
    }
    async fn damage_record(
        &self,
        job: &str,
        step: u64,
        slot: u32,
        bytes: &[u8],
    ) -> Result<(), String> {
        let key = self.key(format!("{job}/steps/{step:020}/c-{slot}"));
        self.store
            .put(&key, PutPayload::from(bytes.to_vec()))
            .await
            .map(|_| ())
            .map_err(err("put object"))
    }
}

fn skipped(check: &str) -> Outcome {
    eprintln!("SKIPPED conformance check {check}: no way to damage this tier's bytes");
    Ok(())
}

fn is_corrupt(r: &Result<ChunkData>) -> bool {
    r.as_ref()
        .is_err_and(|e| e.kind() == StoreErrorKind::Corrupt)
}

/// A chunk whose stored bytes changed reads as `Corrupt` through every
/// verified read (whole, ranged, batched, into spare buffers, as a frame
/// once decoded), and the chunks next to it read fine.
pub async fn damaged_chunk_is_corrupt(s: &dyn ChunkStore, d: Option<&dyn Damage>) -> Outcome {
    let Some(d) = d else {
        return skipped("damaged_chunk_is_corrupt");
    };
    let bad = chunk(70_000, 81);
    let good = chunk(3_000, 82);
    s.put_chunks(JOB, vec![bad.clone(), good.clone()])
        .await
        .map_err(err("put"))?;
    d.damage_chunk(JOB, &bad.id).await?;
    let r = s.get_chunk(JOB, &bad.id, None).await;
    ensure(is_corrupt(&r), || {
        format!("whole read of a damaged chunk gave {r:?}")
    })?;
    let r = s.get_chunk(JOB, &bad.id, Some(10..20)).await;
    ensure(is_corrupt(&r), || {
        format!("ranged read of a damaged chunk gave {r:?}")
    })?;
    let ids = [bad.id, good.id];
    let batches = [
        ("get_chunks", s.get_chunks(JOB, &ids).await),
        (
            "get_chunks_reusing",
            s.get_chunks_reusing(JOB, &ids, Vec::new()).await,
        ),
    ];
    for (how, got) in batches {
        ensure(got.len() == 2 && is_corrupt(&got[0]), || {
            format!("{how} of a damaged chunk gave {:?}", got.first())
        })?;
        ensure(
            got[1]
                .as_ref()
                .is_ok_and(|g| g.as_slice() == good.data.as_slice()),
            || format!("{how}: the undamaged chunk next to it gave {:?}", got[1]),
        )?;
    }
    // A frame may come back (it is not verified yet) but must not decode.
    match s.get_frame(JOB, bad.id, Vec::new()).await {
        Err(e) => ensure(e.kind() == StoreErrorKind::Corrupt, || {
            format!("get_frame of a damaged chunk gave {e}")
        }),
        Ok(f) => {
            let mut dst = vec![0u8; bad.data.len()];
            let r = f.raw_len().and_then(|n| {
                dst.resize(n, 0);
                f.decode_into(&mut dst)
            });
            ensure(
                r.as_ref()
                    .is_err_and(|e| e.kind() == StoreErrorKind::Corrupt),
                || format!("a damaged chunk's frame decoded: {r:?}"),
            )
        }
    }
}

fn record(step: u64, world: u32, rank: u32) -> CommitRecord {
    let m = format!("manifest {step}/{rank}");
    CommitRecord {
        job: JOB.into(),
        step,
        world_size: world,
        committed_unix_ms: 3,
        shards: vec![ShardRef {
            rank,
            manifest: ShardManifest::id_of(m.as_bytes()),
            logical_bytes: 1,
        }],
    }
}

/// A commit record slot holding garbage, or a well-formed record of a
/// future version, is reported in `StepInfo::unreadable`: the listing
/// succeeds, the step is listed, its other slots and other steps are read.
pub async fn damaged_record_is_reported(s: &dyn ChunkStore, d: Option<&dyn Damage>) -> Outcome {
    let Some(d) = d else {
        return skipped("damaged_record_is_reported");
    };
    let mut records = Vec::new();
    for (step, world, rank) in [(50, 3, 0), (50, 3, 1), (50, 3, 2), (51, 1, 0)] {
        let m = format!("manifest {step}/{rank}");
        s.put_manifest(JOB, step, rank, m.as_bytes())
            .await
            .map_err(err("put manifest"))?;
        let r = record(step, world, rank);
        s.commit(&r).await.map_err(err("commit"))?;
        records.push(r);
    }
    let mut future = records[1].encode().map_err(err("encode"))?;
    // Bytes 4..6 are the version (u16, little-endian): one nobody knows yet.
    future[4] = future[4].wrapping_add(1);
    for (what, bytes) in [
        ("garbage", b"not a commit record".to_vec()),
        ("future version", future),
    ] {
        d.damage_record(JOB, 50, 1, &bytes).await?;
        let steps = s
            .list_steps(JOB)
            .await
            .map_err(|e| format!("listing with a {what} record failed: {e}"))?;
        let st = steps
            .iter()
            .find(|st| st.step == 50)
            .ok_or_else(|| format!("step 50 (a {what} record) not listed"))?;
        ensure(
            st.unreadable.keys().copied().collect::<Vec<_>>() == vec![1]
                && st.records.get(&0) == Some(&records[0])
                && st.records.get(&2) == Some(&records[2])
                && st.records.len() == 2
                && !st.is_complete(),
            || format!("with a {what} record in slot 1: {st:?}"),
        )?;
        let direct = s.get_commit_record(JOB, 50, 1).await;
        ensure(
            direct
                .as_ref()
                .is_err_and(|e| e.kind() == StoreErrorKind::Corrupt),
            || format!("a {what} record read directly gave {direct:?}"),
        )?;
        let other = steps
            .iter()
            .find(|st| st.step == 51)
            .ok_or("step 51 not listed")?;
        ensure(
            other.records.get(&0) == Some(&records[3]) && other.unreadable.is_empty(),
            || format!("a {what} record at step 50 changed step 51: {other:?}"),
        )?;
    }
    Ok(())
}
