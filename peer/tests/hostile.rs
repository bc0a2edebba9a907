//! Hostile clients against a peer service: no certificate, a certificate
//! from another CA, a certificate for another job, garbage and oversized
//! frames, a chunk whose bytes do not match its id, a client announcing
//! huge requests and sending nothing. Each is refused or answered with an
//! error, and the service goes on serving a well-behaved client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use strata_format::codec::{ElemHint, EncodeOptions};
use strata_format::frame::encode_frame;
use strata_format::ChunkId;
use strata_peer::proto::{ErrorCode, Request, Response, MAX_MESSAGE, VERSION};
use strata_peer::replicas::Limits;
use strata_peer::service::ServiceConfig;
use strata_peer::tls::{client_config, make_certs, CertFiles};
use strata_tiered::ChunkStoreExt;
use strata_tiered::{ChunkData, ChunkPut, ChunkStore, StoreErrorKind};

const JOB: &str = "peer-job";

fn put(data: &[u8]) -> ChunkPut {
    ChunkPut {
        id: ChunkId::of(data),
        hint: ElemHint::BYTES,
        data: ChunkData::copy_from(data),
    }
}

/// A well-behaved client still works.
async fn still_serves(local: &support::Local, seed: u8) {
    let s = local.client(JOB);
    let c = put(&[seed; 5000]);
    s.put_chunks(JOB, vec![c.clone()]).await.unwrap();
    let got = s.get_chunk(JOB, &c.id, None).await.unwrap();
    assert_eq!(got.as_slice(), c.data.as_slice());
}

/// A raw QUIC connection with `cfg`, for sending arbitrary bytes.
async fn raw_conn(
    local: &support::Local,
    cfg: quinn::ClientConfig,
) -> Result<quinn::Connection, String> {
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    let conn = ep
        .connect(local.service.local_addr().unwrap(), "node-a")
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// Sends raw bytes on a new stream and returns the raw answer.
async fn send_raw(conn: &quinn::Connection, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let (mut s, mut r) = conn.open_bi().await.map_err(|e| e.to_string())?;
    s.write_all(bytes).await.map_err(|e| e.to_string())?;
    let _ = s.finish();
    r.read_to_end(MAX_MESSAGE + 8)
        .await
        .map_err(|e| e.to_string())
}

fn answer(raw: &[u8]) -> Response {
    Response::decode(&raw[4..]).unwrap()
}

/// The job's client certificate as a raw QUIC client configuration.
fn job_client(local: &support::Local) -> quinn::ClientConfig {
    client_config(
        &CertFiles::in_dir(local.dir.path(), &format!("client-{JOB}")),
        64,
    )
    .unwrap()
}

/// A raw connection with the job's certificate that said `Hello`.
async fn hello_conn(local: &support::Local) -> quinn::Connection {
    let conn = raw_conn(local, job_client(local)).await.unwrap();
    let hello = Request::Hello {
        version: VERSION,
        job: JOB.into(),
    };
    assert!(matches!(
        answer(&send_raw(&conn, &hello.encode()).await.unwrap()),
        Response::HelloOk { .. }
    ));
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_cluster_certificate_are_refused_before_any_request() {
    let local = support::Local::start(Limits::default());
    // No client certificate at all.
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(local.dir.path().join("ca.pem")).unwrap();
    use rustls::pki_types::pem::PemObject;
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![strata_peer::proto::ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let refused_before = local.service.counters().refused.load(Ordering::Relaxed);
    let outcome = match raw_conn(&local, quinn::ClientConfig::new(Arc::new(quic))).await {
        Err(e) => Err(e),
        Ok(conn) => send_raw(&conn, &Request::Stats.encode()).await.map(|_| ()),
    };
    assert!(
        outcome.is_err(),
        "a client without a certificate got an answer"
    );

    // A certificate from another CA (same names, different key).
    let other = tempfile::tempdir().unwrap();
    make_certs(other.path(), &["node-a".into()], &[], &[JOB.into()]).unwrap();
    let foreign = CertFiles {
        ca: local.dir.path().join("ca.pem"),
        cert: other.path().join(format!("client-{JOB}.pem")),
        key: other.path().join(format!("client-{JOB}.key")),
    };
    let outcome = match raw_conn(&local, client_config(&foreign, 16).unwrap()).await {
        Err(e) => Err(e),
        Ok(conn) => send_raw(&conn, &Request::Stats.encode()).await.map(|_| ()),
    };
    assert!(outcome.is_err(), "a foreign certificate got an answer");
    // The PeerStore sees a typed error, not a panic or a hang.
    let s = local.client_with(&foreign);
    let e = s.has_chunks(JOB, &[ChunkId::of(b"x")]).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(local.service.counters().refused.load(Ordering::Relaxed) >= refused_before + 2);
    still_serves(&local, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_job_cannot_reach_this_one() {
    let local = support::Local::start(Limits::default());
    // job-a's certificate asking for peer-job.
    let s = local.client_with(&CertFiles::in_dir(local.dir.path(), "client-job-a"));
    let e = s.list_steps(JOB).await.unwrap_err();
    // Refused credentials are their own kind (was Invalid before the
    // public error kinds had Unauthorized): fix them, do not retry.
    assert_eq!(e.kind(), StoreErrorKind::Unauthorized, "{e}");
    assert!(e.to_string().contains("does not allow"), "{e}");
    // It does reach its own job, which does not see peer-job's data.
    still_serves(&local, 2).await;
    assert!(s.list_chunks("job-a").await.unwrap().is_empty());
    // A record of another job on this job's connection is refused.
    let mine = local.client(JOB);
    let rec = strata_format::CommitRecord {
        job: "job-a".into(),
        step: 1,
        world_size: 1,
        committed_unix_ms: 1,
        shards: vec![strata_format::ShardRef {
            rank: 0,
            manifest: ChunkId::of(b"m"),
            logical_bytes: 1,
        }],
    };
    let e = mine
        .request(JOB, &Request::Commit(rec.encode().unwrap()))
        .await
        .unwrap_err();
    // The service answers Forbidden: Unauthorized (was Invalid).
    assert_eq!(e.kind(), StoreErrorKind::Unauthorized, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_oversized_and_lying_requests_get_errors_and_the_service_goes_on() {
    let local = support::Local::start(Limits::default());
    let conn = hello_conn(&local).await;
    let hello = Request::Hello {
        version: VERSION,
        job: JOB.into(),
    };
    // Garbage after a plausible length.
    let mut g = 40u32.to_le_bytes().to_vec();
    g.extend((0..40u8).map(|i| i.wrapping_mul(97)));
    match answer(&send_raw(&conn, &g).await.unwrap()) {
        Response::Error { code, .. } => assert_eq!(code, ErrorCode::Invalid),
        other => panic!("{other:?}"),
    }
    // A length beyond the limit: refused before anything is allocated.
    let huge = (u32::MAX).to_le_bytes();
    match answer(&send_raw(&conn, &huge).await.unwrap()) {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::Invalid);
            assert!(
                message.contains("exceeds") || message.contains("large"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Within the protocol's limit but beyond this service's.
    let big = ((ServiceConfig::DEFAULT_MAX_REQUEST + 1) as u32).to_le_bytes();
    match answer(&send_raw(&conn, &big).await.unwrap()) {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::Invalid);
            assert!(message.contains("limit"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // A length the stream never delivers.
    let mut short = 1000u32.to_le_bytes().to_vec();
    short.extend([2u8; 10]);
    assert!(matches!(
        answer(&send_raw(&conn, &short).await.unwrap()),
        Response::Error {
            code: ErrorCode::Invalid,
            ..
        }
    ));
    // A chunk whose bytes do not match its id.
    let data = vec![7u8; 4096];
    let frame = encode_frame(&data, ElemHint::BYTES, EncodeOptions::RAW).unwrap();
    let lie = Request::PutChunk {
        id: ChunkId::of(b"something else"),
        frame,
    };
    assert!(matches!(
        answer(&send_raw(&conn, &lie.encode()).await.unwrap()),
        Response::Error {
            code: ErrorCode::Corrupt,
            ..
        }
    ));
    // A second hello on a live connection.
    assert!(matches!(
        answer(&send_raw(&conn, &hello.encode()).await.unwrap()),
        Response::Error {
            code: ErrorCode::Invalid,
            ..
        }
    ));
    // The same connection still works, and nothing was stored.
    match answer(
        &send_raw(&conn, &Request::ListChunks { after: None }.encode())
            .await
            .unwrap(),
    ) {
        Response::Ids(v) => assert!(v.is_empty()),
        other => panic!("{other:?}"),
    }
    assert!(local.service.counters().errors.load(Ordering::Relaxed) >= 5);
    still_serves(&local, 3).await;
}

/// A client announces many maximum-size requests and sends none of their
/// bytes: it holds at most its connection's share of the budget, and
/// another client is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hoarding_request_memory_cannot_starve_others() {
    let local = support::Local::start(Limits::default());
    let conn = hello_conn(&local).await;
    let mut held = Vec::new();
    // As many as the connection's stream limit lets it open (the limit is
    // itself part of the bound).
    for _ in 0..16 {
        let Ok(Ok((mut s, r))) =
            tokio::time::timeout(std::time::Duration::from_secs(2), conn.open_bi()).await
        else {
            break;
        };
        let claim = ServiceConfig::DEFAULT_MAX_REQUEST as u32;
        s.write_all(&claim.to_le_bytes()).await.unwrap();
        held.push((s, r));
    }
    assert!(held.len() >= 8, "opened {} streams", held.len());
    let served =
        tokio::time::timeout(std::time::Duration::from_secs(20), still_serves(&local, 4)).await;
    assert!(served.is_ok(), "another client was starved");
    drop(held);
}

/// A tiny compressed frame claiming a chunk larger than any request (a
/// decompression bomb) is refused from its header, before anything is
/// decoded; a legitimate compressed chunk is still taken. A `Hello` larger
/// than a version and a job id is refused without touching the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_bombs_and_oversized_hellos_are_refused() {
    let local = support::Local::start(Limits::default());
    // An oversized Hello: refused, the connection closed.
    let conn = raw_conn(&local, job_client(&local)).await.unwrap();
    let big_hello = Request::Hello {
        version: VERSION,
        job: "x".repeat(4000),
    };
    let refused = local.service.counters().refused.load(Ordering::Relaxed);
    let got = send_raw(&conn, &big_hello.encode()).await;
    if let Ok(raw) = got {
        match answer(&raw) {
            Response::Error { message, .. } => assert!(message.contains("limit"), "{message}"),
            other => panic!("{other:?}"),
        }
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), conn.closed()).await;
    assert!(local.service.counters().refused.load(Ordering::Relaxed) > refused);

    let conn = hello_conn(&local).await;
    // 80 MiB of zeros compress to a few KiB; the service's largest chunk is
    // its largest request (64 MiB and an envelope).
    let zeros = vec![0u8; 80 << 20];
    let bomb = encode_frame(&zeros, ElemHint::BYTES, EncodeOptions::ZSTD).unwrap();
    assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
    let req = Request::PutChunk {
        id: ChunkId::of(&zeros),
        frame: bomb,
    };
    match answer(&send_raw(&conn, &req.encode()).await.unwrap()) {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::Corrupt);
            assert!(message.contains("limit"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // A real compressed chunk below the limit is verified and kept.
    let small = vec![0u8; 8 << 20];
    let frame = encode_frame(&small, ElemHint::BYTES, EncodeOptions::ZSTD).unwrap();
    let ok = Request::PutChunk {
        id: ChunkId::of(&small),
        frame,
    };
    assert!(matches!(
        answer(&send_raw(&conn, &ok.encode()).await.unwrap()),
        Response::Stored { new: true }
    ));
    // Read back through the job's client: the frame comes as it was
    // stored (encoded) and is decoded and verified there.
    let got = local
        .client(JOB)
        .get_chunk(JOB, &ChunkId::of(&small), None)
        .await
        .unwrap();
    assert_eq!(got.as_slice(), small.as_slice());
    still_serves(&local, 6).await;
}

/// Manifests count against their own budget: past it a put is `NoSpace`,
/// and deleting the step gives the space back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_are_bounded_by_their_budget() {
    let local = support::Local::start(Limits {
        manifest_bytes: 10_000,
        ..Limits::default()
    });
    let s = local.client(JOB);
    let m = vec![9u8; 4000];
    s.put_manifest(JOB, 1, 0, &m).await.unwrap();
    s.put_manifest(JOB, 1, 1, &m).await.unwrap();
    // Rewriting a manifest replaces its bytes: no growth.
    s.put_manifest(JOB, 1, 1, &m).await.unwrap();
    let err = s.put_manifest(JOB, 2, 0, &m).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::NoSpace, "{err}");
    s.delete_step(JOB, 1).await.unwrap();
    s.put_manifest(JOB, 2, 0, &m).await.unwrap();
    assert_eq!(s.get_manifest(JOB, 2, 0).await.unwrap(), m);
}

/// A graceful shutdown lets a request in flight finish (its answer
/// arrives), refuses new requests as `Unavailable`, then closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_requests_in_flight() {
    let local = support::Local::start(Limits::default());
    let conn = hello_conn(&local).await;
    // Half of a put is sent; the shutdown starts; then the rest.
    let data = vec![5u8; 1 << 20];
    let req = Request::PutChunk {
        id: ChunkId::of(&data),
        frame: encode_frame(&data, ElemHint::BYTES, EncodeOptions::RAW).unwrap(),
    }
    .encode();
    let (mut s, mut r) = conn.open_bi().await.unwrap();
    let half = req.len() / 2;
    s.write_all(&req[..half]).await.unwrap();
    let svc = local.service.clone();
    for _ in 0..200 {
        if svc.active_requests() > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(svc.active_requests(), 1);
    let stopping = tokio::spawn(async move { svc.shutdown().await });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        !stopping.is_finished(),
        "shut down with a request in flight"
    );
    // A new request meanwhile is refused as Unavailable.
    match send_raw(&conn, &Request::ListChunks { after: None }.encode()).await {
        Ok(raw) => assert!(matches!(
            answer(&raw),
            Response::Error {
                code: ErrorCode::Unavailable,
                ..
            }
        )),
        Err(e) => panic!("no answer while draining: {e}"),
    }
    s.write_all(&req[half..]).await.unwrap();
    let _ = s.finish();
    let raw = r.read_to_end(1 << 16).await.unwrap();
    assert!(
        matches!(answer(&raw), Response::Stored { new: true }),
        "{:?}",
        answer(&raw)
    );
    tokio::time::timeout(std::time::Duration::from_secs(15), stopping)
        .await
        .expect("shutdown did not finish")
        .unwrap();
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(5), conn.closed())
            .await
            .is_ok()
    );
}

/// `Stats` tells a job's client what is held for its own job only; the
/// service's totals (on `/metrics`) count every job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_show_a_job_only_its_own_holdings() {
    let local = support::Local::start(Limits::default());
    let other = local.client("job-a");
    other
        .put_chunks("job-a", vec![put(&[1; 3000]), put(&[2; 3000])])
        .await
        .unwrap();
    let conn = hello_conn(&local).await;
    let stats = |raw: Vec<u8>| match answer(&raw) {
        Response::Stats(s) => s,
        other => panic!("{other:?}"),
    };
    let mine = stats(send_raw(&conn, &Request::Stats.encode()).await.unwrap());
    assert_eq!((mine.chunks, mine.jobs, mine.bytes_in_memory), (0, 0, 0));
    let all = local.service.stats();
    assert_eq!((all.chunks, all.jobs), (2, 1));
    local
        .client(JOB)
        .put_chunks(JOB, vec![put(&[3; 5000])])
        .await
        .unwrap();
    let mine = stats(send_raw(&conn, &Request::Stats.encode()).await.unwrap());
    assert_eq!((mine.chunks, mine.jobs), (1, 1));
    assert!(mine.bytes_in_memory >= 5000);
    assert_eq!(local.service.stats().jobs, 2);
}
