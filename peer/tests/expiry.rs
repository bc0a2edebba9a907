//! A service drops the replicas of a job no request named for
//! `--job-idle-secs`, while a job that keeps talking to it keeps them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use strata_format::ChunkId;
use strata_peer::replicas::Limits;
use strata_tiered::{ChunkStore, ChunkStoreExt};

async fn put(s: &strata_peer::PeerStore, job: &str, seed: u8) -> ChunkId {
    let put = support::chunk_put(&vec![seed; 64 << 10]);
    let id = put.id;
    s.put_chunks(job, vec![put]).await.unwrap();
    s.put_manifest(job, 1, 0, b"manifest").await.unwrap();
    id
}

fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_jobs_replicas_expire_and_a_busy_jobs_stay() {
    let local = support::Local::start(Limits {
        job_idle: Some(Duration::from_millis(600)),
        ..Limits::default()
    });
    let idle = local.client("job-a");
    let busy = local.client("job-b");
    let gone = put(&idle, "job-a", 1).await;
    let kept = put(&busy, "job-b", 2).await;
    // job-b keeps asking for its chunk; job-a says nothing more.
    let t = std::time::Instant::now();
    loop {
        assert!(t.elapsed() < Duration::from_secs(20), "job-a never expired");
        assert_eq!(busy.has_chunks("job-b", &[kept]).await.unwrap(), [true]);
        let m = strata_peer::metrics::render(&local.service);
        if metric(&m, "strata_peer_jobs_expired_total") == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held: Vec<String> = local.service.jobs().into_iter().map(|j| j.job).collect();
    assert_eq!(held, ["job-b"]);
    assert_eq!(idle.has_chunks("job-a", &[gone]).await.unwrap(), [false]);
    assert!(idle.list_steps("job-a").await.unwrap().is_empty());
    assert_eq!(busy.get_manifest("job-b", 1, 0).await.unwrap(), b"manifest");
}

/// The idle-job ticker sleeps for a minute between looks, holding no
/// reference to the service: a stopped service is released at once (its
/// socket and its spill directory's lock), as without expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_service_is_not_kept_alive_by_its_idle_job_ticker() {
    let local = support::Local::start(Limits {
        job_idle: Some(Duration::from_secs(3600)),
        ..Limits::default()
    });
    let s = local.client("job-a");
    put(&s, "job-a", 3).await;
    drop(s);
    local.service.shutdown().await;
    let t = std::time::Instant::now();
    while std::sync::Arc::strong_count(&local.service) > 1 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "something still holds the stopped service"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
