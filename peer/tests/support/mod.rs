//! A peer service started in this process on loopback, with its own CA.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use strata_peer::replicas::Limits;
use strata_peer::service::{Service, ServiceConfig};
use strata_peer::tls::{make_certs, CertFiles};
use strata_peer::{PeerOptions, PeerStore};

/// Jobs the test client certificate allows.
pub(crate) const JOBS: [&str; 4] = ["conformance-job", "job-a", "job-b", "peer-job"];

/// A running service and the directory holding its certificates and spill.
pub(crate) struct Local {
    pub(crate) service: Arc<Service>,
    pub(crate) dir: tempfile::TempDir,
}

impl Local {
    /// Starts a service with `limits`.
    pub(crate) fn start(limits: Limits) -> Local {
        let dir = tempfile::tempdir().unwrap();
        let jobs: Vec<String> = JOBS.iter().map(|s| s.to_string()).collect();
        make_certs(dir.path(), &["node-a".into()], &[], &jobs).unwrap();
        let cfg = ServiceConfig {
            node: "node-a".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            certs: CertFiles::in_dir(dir.path(), "node-a"),
            spill: dir.path().join("spill"),
            limits,
            max_streams: 16,
            inflight_bytes: 256 << 20,
            max_request: ServiceConfig::DEFAULT_MAX_REQUEST,
            work_bytes: ServiceConfig::DEFAULT_WORK_BYTES,
            max_connections: ServiceConfig::DEFAULT_MAX_CONNECTIONS,
        };
        let service = Service::bind(&cfg).unwrap();
        tokio::spawn(service.clone().run());
        Local { service, dir }
    }

    /// A client store with the test client certificate for `job`.
    pub(crate) fn client(&self, job: &str) -> PeerStore {
        self.client_with(&CertFiles::in_dir(
            self.dir.path(),
            &format!("client-{job}"),
        ))
    }

    /// A client store presenting `certs`.
    pub(crate) fn client_with(&self, certs: &CertFiles) -> PeerStore {
        PeerStore::new(
            self.service.local_addr().unwrap(),
            "node-a",
            certs,
            PeerOptions::default(),
        )
        .unwrap()
    }
}

/// A put of `data` as a raw chunk (its id the hash of the bytes).
pub(crate) fn chunk_put(data: &[u8]) -> strata_tiered::ChunkPut {
    strata_tiered::ChunkPut {
        id: strata_format::ChunkId::of(data),
        hint: strata_format::codec::ElemHint::BYTES,
        data: strata_tiered::ChunkData::copy_from(data),
    }
}
