//! The conformance suite on L2: a `PeerStore` talking QUIC to a peer
//! service on loopback (one client certificate per job the suite uses).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use strata_tiered::ChunkStoreExt;
mod support;

/// A store whose certificate allows every job the suite touches.
fn store() -> (strata_peer::PeerStore, support::Local) {
    let local = support::Local::start(strata_peer::replicas::Limits::default());
    let jobs: Vec<String> = support::JOBS.iter().map(|s| s.to_string()).collect();
    // One certificate listing all jobs: issued from the same CA files.
    strata_peer::tls::issue_client(
        local.dir.path(),
        &strata_peer::tls::default_ca_dir(local.dir.path()),
        "multi",
        &jobs,
    )
    .unwrap();
    let s = local.client_with(&strata_peer::tls::CertFiles::in_dir(
        local.dir.path(),
        "client-multi",
    ));
    (s, local)
}

strata_tiered::conformance_tests!(store());

/// A job holding more chunk ids than one message carries is listed page
/// by page, every id once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_more_ids_than_a_message_holds_pages() {
    use strata_format::codec::ElemHint;
    use strata_format::ChunkId;
    use strata_tiered::{ChunkData, ChunkPut, ChunkStore};
    let (s, _local) = store();
    let job = "job-a";
    let n = strata_peer::proto::MAX_IDS + 1000;
    let puts: Vec<ChunkPut> = (0..n as u32)
        .map(|i| {
            let d = i.to_le_bytes();
            ChunkPut {
                id: ChunkId::of(&d),
                hint: ElemHint::BYTES,
                data: ChunkData::copy_from(&d),
            }
        })
        .collect();
    let mut want: Vec<ChunkId> = puts.iter().map(|p| p.id).collect();
    s.put_chunks(job, puts).await.unwrap();
    let mut got = s.list_chunks(job).await.unwrap();
    assert_eq!(got.len(), n);
    got.sort_unstable();
    want.sort_unstable();
    assert!(got == want);
}
