use std::sync::Arc;

use strata_format::codec::ElemHint;
use strata_format::ChunkId;
use strata_tiered::{
    ChunkData, ChunkPut, ChunkStore, FaultPlan, FaultStore, MemoryStore, StoreErrorKind,
};

use super::{Member, PeerGroup};
use strata_tiered::ChunkStoreExt;

const JOB: &str = "job";

fn put(b: &[u8]) -> ChunkPut {
    ChunkPut {
        id: ChunkId::of(b),
        hint: ElemHint::BYTES,
        data: ChunkData::copy_from(b),
    }
}

/// `n` memory members named a, b, c...; those in `down` always fail.
fn group(n: usize, replicas: usize, down: &[usize]) -> (PeerGroup, Vec<Arc<MemoryStore>>) {
    let mems: Vec<Arc<MemoryStore>> = (0..n).map(|_| Arc::new(MemoryStore::new())).collect();
    let members = mems
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let store: Arc<dyn ChunkStore> = if down.contains(&i) {
                Arc::new(FaultStore::new(
                    m.clone(),
                    FaultPlan {
                        outage_after: Some(0),
                        ..FaultPlan::default()
                    },
                ))
            } else {
                m.clone()
            };
            Member {
                node: ((b'a' + i as u8) as char).to_string(),
                store,
            }
        })
        .collect();
    (PeerGroup::new(members, replicas), mems)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn writes_go_to_the_first_r_members_and_skip_a_dead_one() {
    rt().block_on(async {
        let c = put(b"chunk bytes");
        let (g, mems) = group(4, 2, &[]);
        g.put_chunks(JOB, vec![c.clone()]).await.unwrap();
        let held: Vec<bool> = futures::future::join_all(
            mems.iter()
                .map(|m| async { m.has_chunks(JOB, &[c.id]).await.unwrap()[0] }),
        )
        .await;
        assert_eq!(held, vec![true, true, false, false]);

        // b is down: a and the next one, c, take it.
        let (g, mems) = group(4, 2, &[1]);
        g.put_chunks(JOB, vec![c.clone()]).await.unwrap();
        let held: Vec<bool> = futures::future::join_all(
            mems.iter()
                .map(|m| async { m.has_chunks(JOB, &[c.id]).await.unwrap()[0] }),
        )
        .await;
        assert_eq!(held, vec![true, false, true, false]);
        assert_eq!(
            g.get_chunk(JOB, &c.id, None).await.unwrap().as_slice(),
            b"chunk bytes"
        );

        // Everyone down: the write fails, Unavailable.
        let (g, _) = group(3, 2, &[0, 1, 2]);
        let e = g.put_chunks(JOB, vec![c]).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    });
}

#[test]
fn a_damaged_or_missing_copy_is_read_from_the_next_member() {
    rt().block_on(async {
        let (g, mems) = group(3, 2, &[]);
        let a = put(b"first chunk");
        let b = put(b"second chunk");
        g.put_chunks(JOB, vec![a.clone(), b.clone()]).await.unwrap();
        mems[0].corrupt_chunk(JOB, &a.id, b"first chunK").unwrap();
        mems[0].delete_chunks(JOB, &[b.id]).await.unwrap();
        let got = g.get_chunks(JOB, &[a.id, b.id]).await;
        assert_eq!(got[0].as_ref().unwrap().as_slice(), b"first chunk");
        assert_eq!(got[1].as_ref().unwrap().as_slice(), b"second chunk");
        // Damaged on both holders: Corrupt (not NotFound from the third).
        mems[1].corrupt_chunk(JOB, &a.id, b"first chunK").unwrap();
        let e = g.get_chunk(JOB, &a.id, None).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
        // Missing from the members that answered: NotFound, as any tier
        // says of what it lacks; Unavailable only when nobody answered.
        let (g, _) = group(3, 1, &[0]);
        let e = g.get_chunk(JOB, &b.id, None).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::NotFound, "{e}");
        let (g, _) = group(2, 1, &[0, 1]);
        let e = g.get_chunk(JOB, &b.id, None).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    });
}

#[test]
fn the_first_reachable_member_arbitrates_commit_records() {
    rt().block_on(async {
        let (g, mems) = group(3, 2, &[0]);
        g.put_manifest(JOB, 5, 0, b"m").await.unwrap();
        let rec = |ms| strata_format::CommitRecord {
            job: JOB.into(),
            step: 5,
            world_size: 1,
            committed_unix_ms: ms,
            shards: vec![strata_format::ShardRef {
                rank: 0,
                manifest: ChunkId::of(b"m"),
                logical_bytes: 1,
            }],
        };
        g.commit(&rec(1)).await.unwrap();
        // b arbitrates (a is down) and c holds the copy.
        for m in &mems[1..] {
            let steps = m.list_steps(JOB).await.unwrap();
            assert_eq!(steps[0].records.get(&0), Some(&rec(1)));
        }
        assert!(mems[0].list_steps(JOB).await.unwrap().is_empty());
        let e = g.commit(&rec(2)).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::AlreadyExists, "{e}");
    });
}

#[test]
fn spread_replaces_failed_members_and_reports_degraded() {
    let (g, _) = group(4, 2, &[]);
    let s = g.spread(|m| {
        if m.node == "a" {
            Err("refused")
        } else {
            Ok(m.node.len() as u64)
        }
    });
    assert_eq!(s.nodes(), vec!["b", "c"]);
    assert!(!s.is_degraded());
    assert_eq!(s.errors, vec!["a: refused"]);

    let s = g.spread(|m| if m.node == "d" { Ok(1) } else { Err("down") });
    assert_eq!(s.nodes(), vec!["d"]);
    assert!(s.is_degraded());
    assert_eq!(s.errors.len(), 3);

    let (small, _) = group(1, 2, &[]);
    let s = small.spread(|_| Ok::<u64, String>(7));
    assert!(s.is_degraded());
    assert_eq!(s.holders, vec![("a".to_string(), 7)]);
    assert!(
        s.errors[0].contains("ring has 1 other nodes"),
        "{:?}",
        s.errors
    );
}
