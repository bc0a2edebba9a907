//! Ranks of one node share its L1: two ranks retiring their shards of the
//! same step at once must both succeed. The one that finds the directory
//! not yet empty syncs it, and may find it gone meanwhile (the other
//! removed it): that is done, not an error. (Seen as "retention failed:
//! steps/… not found" with two ranks of a DCP job keeping two steps.)

use strata_tiered::{ChunkStore, EngineChoice, L1Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_retiring_one_step_at_once_both_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(L1Store::open(dir.path(), EngineChoice::Psync).unwrap());
    let job = "shared";
    // What a job's first write creates: its temporary files' directory.
    std::fs::create_dir_all(dir.path().join(job).join("tmp")).unwrap();
    for step in 0..300u64 {
        let sd = dir
            .path()
            .join(job)
            .join("steps")
            .join(format!("{step:020}"));
        std::fs::create_dir_all(&sd).unwrap();
        for rank in 0..2 {
            std::fs::write(sd.join(format!("m-{rank}")), b"m").unwrap();
            std::fs::write(sd.join(format!("c-{rank}")), b"c").unwrap();
        }
        let (a, b) = (store.clone(), store.clone());
        let ta = tokio::spawn(async move { a.delete_shard(job, step, 0).await });
        let tb = tokio::spawn(async move { b.delete_shard(job, step, 1).await });
        let (ra, rb) = (ta.await.unwrap(), tb.await.unwrap());
        assert!(ra.is_ok() && rb.is_ok(), "step {step}: {ra:?} {rb:?}");
        assert!(
            !sd.exists(),
            "step {step}: the directory outlived its last shard"
        );
    }
}
