//! The conformance suite on L2: a `PeerStore` talking QUIC to a peer
//! service on loopback (one client certificate per job the suite uses).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

/// A store whose certificate allows every job the suite touches.
fn store() -> (strata_peer::PeerStore, support::Local) {
    let local = support::Local::start(strata_peer::replicas::Limits::default());
    let jobs: Vec<String> = support::JOBS.iter().map(|s| s.to_string()).collect();
    // One certificate listing all jobs: issued from the same CA files.
    strata_peer::tls::issue_client(local.dir.path(), "multi", &jobs).unwrap();
    let s = local.client_with(&strata_peer::tls::CertFiles::in_dir(
        local.dir.path(),
        "client-multi",
    ));
    (s, local)
}

strata_tiered::conformance_tests!(store());
