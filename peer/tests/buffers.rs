//! A put's buffer is kept as the replica, and given back for the next
//! puts when the replica is dropped: a peer that retires steps reuses
//! their memory instead of faulting in fresh pages for every step.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use strata_format::ChunkId;
use strata_peer::replicas::Limits;
use strata_tiered::{ChunkStore, ChunkStoreExt};

const JOB: &str = "job-a";

async fn put(s: &strata_peer::PeerStore, seed: u8) -> (ChunkId, Vec<u8>) {
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i as u8) ^ seed).collect();
    let put = support::chunk_put(&data);
    let id = put.id;
    s.put_chunks(JOB, vec![put]).await.unwrap();
    (id, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_replicas_buffer_serves_the_next_put_and_live_replicas_stay_whole() {
    let local = support::Local::start(Limits::default());
    let s = local.client(JOB);
    let (a, _) = put(&s, 1).await;
    let (b, b_data) = put(&s, 2).await;
    let st = local.service.arena();
    assert_eq!((st.fresh, st.reused, st.free_bytes), (2, 0, 0));
    assert!(st.out_bytes >= 2 << 20, "{st:?}");

    // Retention (or `strata rm`) drops a's replica: its buffer is kept.
    s.delete_chunks(JOB, &[a]).await.unwrap();
    assert!(local.service.arena().free_bytes >= 1 << 20);
    let (c, c_data) = put(&s, 3).await;
    let st = local.service.arena();
    assert_eq!(
        (st.fresh, st.reused, st.free_bytes),
        (2, 1, 0),
        "c took a's buffer"
    );

    // Every replica held reads back whole: b was never handed out again,
    // and c's bytes are its own, not a's.
    assert_eq!(
        s.has_chunks(JOB, &[a, b, c]).await.unwrap(),
        [false, true, true]
    );
    let got = s.get_chunks(JOB, &[b, c]).await;
    for (got, want) in got.into_iter().zip([&b_data, &c_data]) {
        assert_eq!(got.unwrap().as_slice(), &want[..]);
    }
    let m = strata_peer::metrics::render(&local.service);
    assert!(
        m.contains("strata_peer_buffers_total{source=\"reused\"} 1"),
        "{m}"
    );
}

/// A service that faulted in buffers for a chunk size at start serves the
/// first puts of that size from them; the prefault stays within the
/// service's memory and in-flight budgets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefaulted_service_serves_its_first_puts_without_allocating() {
    let local = support::Local::start(Limits {
        memory_bytes: 8 << 20,
        ..Limits::default()
    });
    let svc = local.service.clone();
    let added = tokio::task::spawn_blocking(move || svc.prefault(1 << 20, 6 << 20))
        .await
        .unwrap();
    let class = (1u64 << 20) + (32 << 10);
    assert_eq!(added, 5 * class, "five 1 MiB chunks' buffers in 6 MiB");
    let s = local.client(JOB);
    let mut held = Vec::new();
    for seed in 0..5 {
        held.push(put(&s, seed).await);
    }
    let st = local.service.arena();
    assert_eq!((st.fresh, st.reused, st.free_bytes), (0, 5, 0));
    let ids: Vec<ChunkId> = held.iter().map(|(id, _)| *id).collect();
    let got = s.get_chunks(JOB, &ids).await;
    for (got, (_, want)) in got.into_iter().zip(&held) {
        assert_eq!(got.unwrap().as_slice(), &want[..]);
    }
    // Asked for far more than the budgets: held to them.
    let svc = local.service.clone();
    let added = tokio::task::spawn_blocking(move || svc.prefault(1 << 20, 1 << 40))
        .await
        .unwrap();
    let st = local.service.arena();
    assert!(added > 0);
    // The cap: `--memory` and the in-flight budget (support's 256 MiB).
    let cap = st.cap;
    assert!(
        ((8 << 20) + (256 << 20)..(8 << 20) + (257 << 20)).contains(&cap),
        "{cap}"
    );
    let held = st.out_bytes + st.free_bytes;
    assert!(held <= cap && held + class > cap, "{st:?} against {cap}");
}
