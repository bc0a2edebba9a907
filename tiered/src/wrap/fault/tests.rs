//! The faults each layer gained when the two injectors became one: on the
//! chunk store, timeouts, dropped connections and a write outage; on the
//! object store, damaged bodies and the call outage with `heal`.

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use strata_format::codec::ElemHint;
use strata_format::ChunkId;

use super::{FaultPlan, FaultStore};
use crate::store::ChunkStoreExt;
use crate::{ChunkData, ChunkPut, ChunkStore, MemoryStore, StoreErrorKind};

const JOB: &str = "faults";

fn chunk(i: u8) -> ChunkPut {
    let b = vec![i; 300];
    ChunkPut {
        id: ChunkId::of(&b),
        hint: ElemHint::BYTES,
        data: ChunkData::copy_from(&b),
    }
}

#[tokio::test(start_paused = true)]
async fn chunk_store_timeouts_hang_then_fail_and_drops_keep_the_write() {
    let plan = FaultPlan {
        timeout_rate: 1.0,
        timeout: Duration::from_secs(5),
        ..FaultPlan::default()
    };
    let s = FaultStore::new(MemoryStore::new(), plan);
    let t = tokio::time::Instant::now();
    let e = s.list_chunks(JOB).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable);
    assert!(t.elapsed() >= Duration::from_secs(5));
    assert_eq!(s.counts().timeouts, 1);

    let plan = FaultPlan {
        drop_rate: 1.0,
        ..FaultPlan::default()
    };
    let s = FaultStore::new(MemoryStore::new(), plan);
    let c = chunk(1);
    let e = s.put_chunks(JOB, vec![c.clone()]).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable);
    assert_eq!(s.inner().has_chunks(JOB, &[c.id]).await.unwrap(), [true]);
    assert_eq!(s.counts().drops, 1);
}

#[tokio::test]
async fn chunk_store_writes_stop_after_the_write_outage_until_healed() {
    let plan = FaultPlan {
        writes_before_outage: Some(2),
        ..FaultPlan::default()
    };
    let s = FaultStore::new(MemoryStore::new(), plan);
    for i in 0..2 {
        s.put_chunks(JOB, vec![chunk(i)]).await.unwrap();
    }
    let e = s.put_chunks(JOB, vec![chunk(9)]).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable);
    s.list_chunks(JOB).await.unwrap();
    s.heal();
    s.put_chunks(JOB, vec![chunk(9)]).await.unwrap();
    assert_eq!(s.counts().outage_failures, 1);
}

#[tokio::test]
async fn object_store_bodies_come_back_damaged_and_outages_heal() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let key = Path::from("a/b");
    inner.put(&key, vec![7u8; 100].into()).await.unwrap();
    let plan = FaultPlan {
        corrupt_rate: 1.0,
        ..FaultPlan::default()
    };
    let s = FaultStore::new(inner.clone(), plan);
    let got = s.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(got.len(), 100);
    assert_ne!(&got[..], &[7u8; 100][..]);
    let plan = FaultPlan {
        truncate_rate: 1.0,
        ..FaultPlan::default()
    };
    let s = FaultStore::new(inner.clone(), plan);
    assert!(s.get(&key).await.unwrap().bytes().await.unwrap().len() < 100);

    let plan = FaultPlan {
        outage_after: Some(1),
        ..FaultPlan::default()
    };
    let s = FaultStore::new(inner, plan);
    s.get(&key).await.unwrap();
    assert!(s.get(&key).await.is_err());
    s.heal();
    s.get(&key).await.unwrap();
    assert_eq!(s.counts().outage_failures, 1);
}
