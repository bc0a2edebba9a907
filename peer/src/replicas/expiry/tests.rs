//! Idle jobs expire: unpinned steps and the chunks only they name go; a
//! pinned step, a job in use, and a service without an idle limit keep
//! everything.
use std::time::Duration;

use bytes::Bytes;
use strata_format::codec::{ElemHint, EncodeOptions};
use strata_format::frame::encode_frame;
use strata_format::{ChunkId, CommitRecord, ShardRef};

use super::super::test_support::manifest_of;
use super::super::{Limits, Replicas};
use super::Expired;

fn data(i: u8) -> Vec<u8> {
    (0..1000u32)
        .map(|j| (j as u8).wrapping_mul(31) ^ i)
        .collect()
}

fn frame(d: &[u8]) -> Bytes {
    encode_frame(d, ElemHint::BYTES, EncodeOptions::RAW)
        .unwrap()
        .into()
}

/// Step `step` of `job`, one rank, holding chunks `ids`, committed.
async fn save(r: &Replicas, job: &str, step: u64, ids: &[u8]) {
    let cs: Vec<Vec<u8>> = ids.iter().map(|&i| data(i)).collect();
    for c in &cs {
        r.put_chunk(job, ChunkId::of(c), frame(c)).unwrap();
    }
    let m = manifest_of(job, step, 0, 1, &cs);
    r.put_manifest(job, step, 0, &m).await.unwrap();
    r.commit(&CommitRecord {
        job: job.into(),
        step,
        world_size: 1,
        committed_unix_ms: 1,
        shards: vec![ShardRef {
            rank: 0,
            manifest: ChunkId::of(&m),
            logical_bytes: 1000 * ids.len() as u64,
        }],
    })
    .await
    .unwrap();
}

fn held(r: &Replicas, job: &str, i: u8) -> bool {
    r.get_frame(job, &ChunkId::of(&data(i))).is_ok()
}

async fn steps(r: &Replicas, job: &str) -> Vec<u64> {
    r.list_steps(job)
        .await
        .unwrap()
        .iter()
        .filter(|s| !s.records.is_empty())
        .map(|s| s.step)
        .collect()
}

#[tokio::test]
async fn an_idle_job_loses_its_unpinned_steps_and_their_chunks_only() {
    let dir = tempfile::tempdir().unwrap();
    let r = Replicas::new(
        &dir.path().join("spill"),
        Limits {
            // Memory for two frames: the others spill, and go too.
            memory_bytes: 2100,
            job_idle: Some(Duration::from_millis(200)),
            ..Limits::default()
        },
    )
    .unwrap();
    // Job "done": step 1 pinned (chunks 1, 2), step 2 (chunks 2, 3).
    save(&r, "done", 1, &[1, 2]).await;
    save(&r, "done", 2, &[2, 3]).await;
    r.set_pin("done", 1, true).await.unwrap();
    // Job "busy" holds one step and keeps sending requests.
    save(&r, "busy", 7, &[4, 5]).await;
    r.touch_job("done");
    r.touch_job("busy");
    // Not idle yet: nothing expires.
    assert_eq!(r.expire_idle().await.unwrap(), Vec::<Expired>::new());
    tokio::time::sleep(Duration::from_millis(150)).await;
    r.touch_job("busy");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let gone = r.expire_idle().await.unwrap();
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!(
        (gone[0].job.as_str(), gone[0].steps, gone[0].chunks),
        ("done", 1, 1)
    );
    assert_eq!(gone[0].bytes, frame(&data(3)).len() as u64);
    assert_eq!(steps(&r, "done").await, [1], "the pinned step stays");
    assert!(held(&r, "done", 1) && held(&r, "done", 2));
    assert!(!held(&r, "done", 3), "named by the expired step only");
    assert_eq!(steps(&r, "busy").await, [7]);
    assert!(held(&r, "busy", 4) && held(&r, "busy", 5));
    // Checked again only an idle period later: nothing more to drop.
    assert_eq!(r.expire_idle().await.unwrap(), Vec::<Expired>::new());
    // Unpinned and idle again: the rest goes, and the budgets are free.
    r.set_pin("done", 1, false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    r.touch_job("busy");
    let gone = r.expire_idle().await.unwrap();
    assert_eq!((gone.len(), gone[0].steps, gone[0].chunks), (1, 1, 2));
    assert!(steps(&r, "done").await.is_empty());
    assert_eq!(r.job_stats("done").unwrap(), (0, 0, 0));
    // Nothing of it is left, not even its directory: it is not looked at
    // again.
    assert!(!dir.path().join("spill/steps/done").exists());
    assert_eq!(r.held_jobs().unwrap(), ["busy"]);
}

#[tokio::test]
async fn without_an_idle_limit_nothing_expires() {
    let dir = tempfile::tempdir().unwrap();
    let r = Replicas::new(
        &dir.path().join("spill"),
        Limits {
            job_idle: None,
            ..Limits::default()
        },
    )
    .unwrap();
    save(&r, "done", 1, &[1, 2]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(r.expire_idle().await.unwrap().is_empty());
    assert_eq!(steps(&r, "done").await, [1]);
}

#[tokio::test]
async fn a_job_never_named_since_the_start_counts_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    let limits = Limits {
        job_idle: Some(Duration::from_millis(200)),
        ..Limits::default()
    };
    {
        let r = Replicas::new(&spill, limits.clone()).unwrap();
        save(&r, "old", 3, &[1]).await;
        r.keep_memory_on_disk().unwrap();
    }
    let r = Replicas::new(&spill, limits).unwrap();
    assert_eq!(steps(&r, "old").await, [3]);
    // Reloaded, not yet idle for a whole period since this start.
    assert!(r.expire_idle().await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(250)).await;
    let gone = r.expire_idle().await.unwrap();
    assert_eq!((gone.len(), gone[0].steps, gone[0].chunks), (1, 1, 1));
    assert!(steps(&r, "old").await.is_empty());
}

#[tokio::test]
async fn a_job_with_a_request_running_is_not_expired_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let r = Replicas::new(
        &dir.path().join("spill"),
        Limits {
            job_idle: Some(Duration::from_millis(100)),
            ..Limits::default()
        },
    )
    .unwrap();
    save(&r, "slow", 1, &[1, 2]).await;
    // A request of the job started, and runs longer than the idle time.
    let running = r.enter_job("slow").await.expect("the job's gate");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(r.expire_idle().await.unwrap().is_empty());
    assert_eq!(steps(&r, "slow").await, [1]);
    drop(running);
    // Answered, and idle since: now it goes.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let gone = r.expire_idle().await.unwrap();
    assert_eq!((gone.len(), gone[0].steps, gone[0].chunks), (1, 1, 2));
    // A request that comes during or after the expiry finds the job empty.
    let _again = r.enter_job("slow").await.expect("the job's gate");
    assert!(!held(&r, "slow", 1));
}
