//! Failures a training loop cannot miss: a save that fails after `save`
//! returned is returned by the next `save` (also after a `busy_policy =
//! "wait"` wait), `flush` or `close` unless its handle reported it, once;
//! `on_background_error = "log"` only logs and counts it; `last_error` and
//! the counters (failed and skipped saves, dropped uploads and pushes) are
//! readable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use strata::format::DType;
use strata::tiered::{ChunkStore, FaultPlan, FaultStore, MemoryStore};
use strata::{
    BusyPolicy, Checkpointer, Config, Entry, Error, ErrorKind, InProcessCoordinator,
    OnBackgroundError, UploadBacklog,
};

/// Rank 0 of a world of two whose rank 1 never comes: every commit round
/// times out after a second, so every save fails in the background.
fn lonely(dir: &std::path::Path, policy: OnBackgroundError) -> Checkpointer {
    let cfg = Config::builder()
        .job("bg")
        .l1_dir(dir)
        .chunk_size(1 << 16)
        .rank(0, 2)
        .coordination_timeout_secs(1)
        .busy_policy(BusyPolicy::Wait)
        .on_background_error(policy);
    Checkpointer::with_coordinator(cfg, Arc::new(InProcessCoordinator::new(2))).unwrap()
}

fn save(ck: &Checkpointer, step: u64) -> strata::Result<strata::SaveHandle> {
    let bytes = vec![step as u8; 1 << 16];
    ck.save(step, &[Entry::tensor("w", DType::U8, &[1 << 16], &bytes)])
}

fn background_step(e: &Error) -> Option<u64> {
    match e {
        Error::Background { step, .. } => Some(*step),
        _ => None,
    }
}

#[test]
fn a_dropped_handles_failure_is_returned_by_the_next_save_after_the_busy_wait() {
    let d = tempfile::tempdir().unwrap();
    let ck = lonely(d.path(), OnBackgroundError::Raise);
    drop(save(&ck, 1).unwrap()); // the README's loop drops its handles
    let t = std::time::Instant::now();
    let e = save(&ck, 2).map(|_| ()).unwrap_err();
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "busy_policy wait waited for step 1 first"
    );
    assert_eq!(background_step(&e), Some(1), "{e}");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "the failure's own kind");
    assert!(
        e.to_string().contains("step 1 failed in the background"),
        "{e}"
    );
    assert!(
        ck.committed_steps().unwrap().is_empty(),
        "step 2 did nothing"
    );
    assert_eq!(ck.failed_saves(), 1);
    assert_eq!(ck.last_error().and_then(|e| background_step(&e)), Some(1));
    // Returned once: the next save goes ahead.
    let h = save(&ck, 2).unwrap();
    assert!(h.wait().is_err());
    // Its handle reported step 2's failure: not returned again.
    drop(save(&ck, 3).unwrap());
    let e = ck.flush().unwrap_err();
    assert_eq!(background_step(&e), Some(3), "{e}");
    ck.flush().unwrap();
    drop(save(&ck, 4).unwrap());
    let health = ck.health();
    assert_eq!(health.skipped_saves, 0);
    let e = ck.close().unwrap_err();
    assert_eq!(background_step(&e), Some(4), "{e}");
    assert!(health.failed_saves >= 3, "{health:?}");
}

#[test]
fn with_log_a_failure_is_counted_and_kept_but_not_returned() {
    let d = tempfile::tempdir().unwrap();
    let ck = lonely(d.path(), OnBackgroundError::Log);
    drop(save(&ck, 1).unwrap());
    drop(save(&ck, 2).unwrap());
    ck.flush().unwrap();
    let h = ck.health();
    assert_eq!(h.failed_saves, 2, "{h:?}");
    assert_eq!(h.last_error.as_ref().and_then(background_step), Some(2));
    ck.close().unwrap();
}

#[test]
fn skipped_saves_and_dropped_uploads_and_pushes_are_counted() {
    let d = tempfile::tempdir().unwrap();
    let slow = || -> Arc<dyn ChunkStore> {
        Arc::new(FaultStore::new(
            MemoryStore::new(),
            FaultPlan {
                latency: Duration::from_millis(150),
                ..FaultPlan::default()
            },
        ))
    };
    let mut cfg = Config::builder()
        .job("counters")
        .l1_dir(d.path())
        .chunk_size(1 << 16)
        .keep_last(2)
        .gc_grace_secs(0)
        .upload_every(1);
    cfg.max_pending_uploads = 1;
    cfg.max_pending_pushes = 1;
    cfg.upload_backlog = UploadBacklog::Drop;
    cfg.eager_push = false;
    let ck = Checkpointer::builder(cfg)
        .remote(Some(slow()))
        .peers(vec![strata::Tier::peer("slow", slow())])
        .build()
        .unwrap();
    for step in 1..=12 {
        save(&ck, step).unwrap().wait().unwrap();
    }
    ck.wait_uploads();
    ck.wait_replication();
    let h = ck.health();
    assert!(h.dropped_uploads > 0 && h.dropped_pushes > 0, "{h:?}");
    assert_eq!(h.dropped_uploads, ck.dropped_uploads());
    assert_eq!(h.dropped_pushes, ck.dropped_pushes());
    assert_eq!(h.failed_saves, 0);
    assert!(h.last_error.is_none());
    ck.close().unwrap();

    // A skip: a second save while a large one persists.
    let d = tempfile::tempdir().unwrap();
    let cfg = Config::builder()
        .job("skip")
        .l1_dir(d.path())
        .busy_policy(BusyPolicy::Skip);
    let ck = Checkpointer::new(cfg).unwrap();
    let big = vec![7u8; 256 << 20];
    let first = ck
        .save(1, &[Entry::tensor("w", DType::U8, &[256 << 20], &big)])
        .unwrap();
    let second = save(&ck, 2).unwrap().wait().unwrap();
    assert!(second.skipped);
    first.wait().unwrap();
    assert_eq!(ck.health().skipped_saves, 1);
    ck.close().unwrap();
}

#[test]
fn the_setting_reads_from_toml_and_the_environment() {
    let c = Config::from_toml("on_background_error = \"log\"").unwrap();
    assert_eq!(c.on_background_error, OnBackgroundError::Log);
    assert_eq!(
        Config::default().on_background_error,
        OnBackgroundError::Raise
    );
    let c = c
        .with_env([("STRATA_ON_BACKGROUND_ERROR".into(), "raise".into())])
        .unwrap();
    assert_eq!(c.on_background_error, OnBackgroundError::Raise);
    let e = Config::default()
        .with_env([("STRATA_ON_BACKGROUND_ERROR".into(), "shout".into())])
        .unwrap_err();
    assert!(e.to_string().contains("raise, log"), "{e}");
    assert!(Config::from_toml("on_background_error = \"shout\"").is_err());
}
