//! The conformance suite on L2 as one tier: a `PeerGroup` of three members
//! keeping two copies. The damage checks damage every member's copy: the
//! group reports a chunk damaged only when no member has a good one. Then
//! what a member that is down, or that comes back empty, must not do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use async_trait::async_trait;
use strata_format::ChunkId;
use strata_peer::{Member, PeerGroup};
use strata_tiered::conformance::{Damage, MemoryDamage};
use strata_tiered::ChunkStoreExt;
use strata_tiered::{ChunkStore, FaultPlan, FaultStore, MemoryStore};

/// Damages each member's copy; fine where at least one member held it.
struct GroupDamage(Vec<MemoryDamage>);

#[async_trait]
impl Damage for GroupDamage {
    async fn damage_chunk(&self, job: &str, id: &ChunkId) -> Result<(), String> {
        let mut done = 0;
        let mut last = String::new();
        for d in &self.0 {
            match d.damage_chunk(job, id).await {
                Ok(()) => done += 1,
                Err(e) => last = e,
            }
        }
        if done > 0 {
            Ok(())
        } else {
            Err(last)
        }
    }

    async fn damage_record(
        &self,
        job: &str,
        step: u64,
        slot: u32,
        bytes: &[u8],
    ) -> Result<(), String> {
        for d in &self.0 {
            d.damage_record(job, step, slot, bytes).await?;
        }
        Ok(())
    }
}

fn group() -> (PeerGroup, (), GroupDamage) {
    let mems: Vec<Arc<MemoryStore>> = (0..3).map(|_| Arc::new(MemoryStore::new())).collect();
    let members = mems
        .iter()
        .enumerate()
        .map(|(i, m)| Member {
            node: format!("node-{i}"),
            store: m.clone() as Arc<dyn ChunkStore>,
        })
        .collect();
    let damage = GroupDamage(mems.iter().cloned().map(MemoryDamage).collect());
    (PeerGroup::new(members, 2), (), damage)
}

mod whole {
    strata_tiered::conformance_tests!(damage super::group());
}

const JOB: &str = "job";

fn chunk(b: &[u8]) -> strata_tiered::ChunkPut {
    strata_tiered::ChunkPut {
        id: ChunkId::of(b),
        hint: strata_format::codec::ElemHint::BYTES,
        data: strata_tiered::ChunkData::copy_from(b),
    }
}

fn record(ms: u64) -> strata_format::CommitRecord {
    strata_format::CommitRecord {
        job: JOB.into(),
        step: 7,
        world_size: 1,
        committed_unix_ms: ms,
        shards: vec![strata_format::ShardRef {
            rank: 0,
            manifest: ChunkId::of(b"m"),
            logical_bytes: 1,
        }],
    }
}

/// Three members, two copies; `a` behind a fault switch that is down until
/// healed, with its own memory store to empty ("restarted").
/// A member behind a fault switch.
type Switch = Arc<FaultStore<Arc<MemoryStore>>>;

fn switchable() -> (PeerGroup, Switch, Vec<Arc<MemoryStore>>) {
    let mems: Vec<Arc<MemoryStore>> = (0..3).map(|_| Arc::new(MemoryStore::new())).collect();
    let a = Arc::new(FaultStore::new(
        mems[0].clone(),
        FaultPlan {
            outage_after: Some(0),
            ..FaultPlan::default()
        },
    ));
    let mut members = vec![Member {
        node: "a".into(),
        store: a.clone(),
    }];
    for (i, m) in mems.iter().enumerate().skip(1) {
        members.push(Member {
            node: ["a", "b", "c"][i].into(),
            store: m.clone(),
        });
    }
    (PeerGroup::new(members, 2), a, mems)
}

#[tokio::test]
async fn with_a_member_down_reads_and_writes_go_on_and_listings_are_never_partial() {
    let (g, a, _) = switchable();
    let c = chunk(b"bytes");
    g.put_chunks(JOB, vec![c.clone()]).await.unwrap();
    g.put_manifest(JOB, 7, 0, b"m").await.unwrap();
    g.commit(&record(1)).await.unwrap();
    assert_eq!(
        g.get_chunk(JOB, &c.id, None).await.unwrap().as_slice(),
        b"bytes"
    );
    assert_eq!(g.get_manifest(JOB, 7, 0).await.unwrap(), b"m");
    // A listing missing a member could be taken for complete by retention.
    for e in [
        g.list_steps(JOB).await.err(),
        g.list_chunks(JOB).await.err(),
        g.list_pins(JOB).await.err(),
    ] {
        let e = e.expect("an operation that needs every member succeeded with one down");
        assert_eq!(e.kind(), strata_tiered::StoreErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains("peer a"), "{e}");
    }
    // A delete with a member down says so (what it reached is deleted; a
    // retry finishes it).
    let e = g.delete_step(JOB, 7).await.unwrap_err();
    assert_eq!(e.kind(), strata_tiered::StoreErrorKind::Unavailable, "{e}");
    a.heal();
    g.delete_step(JOB, 7).await.unwrap();
    assert!(g.list_steps(JOB).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_member_back_empty_never_lets_a_second_record_win() {
    let (g, a, mems) = switchable();
    g.put_manifest(JOB, 7, 0, b"m").await.unwrap();
    g.commit(&record(1)).await.unwrap();
    // a comes back empty (a restarted service holds nothing).
    a.heal();
    assert!(mems[0].list_steps(JOB).await.unwrap().is_empty());
    let e = g.commit(&record(2)).await.unwrap_err();
    assert_eq!(
        e.kind(),
        strata_tiered::StoreErrorKind::AlreadyExists,
        "{e}"
    );
    // a took the second record before b refused it: the group never shows
    // it as committed; the slot is reported, not picked.
    let st = &g.list_steps(JOB).await.unwrap()[0];
    assert_ne!(st.records.get(&0), Some(&record(2)), "{st:?}");
    assert!(
        st.records.get(&0) == Some(&record(1)) || st.unreadable.contains_key(&0),
        "{st:?}"
    );
    // The same record again is fine.
    let (g, a, _) = switchable();
    g.put_manifest(JOB, 7, 0, b"m").await.unwrap();
    g.commit(&record(1)).await.unwrap();
    a.heal();
    g.commit(&record(1)).await.unwrap();
}

#[tokio::test]
async fn presence_is_what_the_first_r_members_all_hold() {
    let (g, a, mems) = switchable();
    a.heal();
    let c = chunk(b"only on the fallback");
    mems[2].put_chunks(JOB, vec![c.clone()]).await.unwrap();
    assert_eq!(g.has_chunks(JOB, &[c.id]).await.unwrap(), vec![false]);
    g.put_chunks(JOB, vec![c.clone()]).await.unwrap();
    assert_eq!(g.has_chunks(JOB, &[c.id]).await.unwrap(), vec![true]);
    assert!(mems[0].has_chunks(JOB, &[c.id]).await.unwrap()[0]);
    assert!(mems[1].has_chunks(JOB, &[c.id]).await.unwrap()[0]);
}
