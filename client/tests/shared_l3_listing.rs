//! L3 is listed once per restore for the whole job, not once per rank:
//! rank 0 lists it and the agreement carries what it saw to the others.
//! A rank whose disk was lost still restores its shard from L3 (reading
//! its own commit record directly), and when the lister cannot list L3
//! every rank fails alike.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;

use strata::format::DType;
use strata::tiered::wrap::OpFamily;
use strata::tiered::{ChunkStore, FaultPlan, FaultStore, MemoryStore, MetricsStore};
use strata::{Checkpointer, Config, Entry, Error, InProcessCoordinator, StepSelector};

const WORLD: u32 = 4;
const KIB: usize = 1 << 10;

fn cfg(dir: &Path, rank: u32) -> Config {
    Config::builder()
        .job("shared-l3")
        .rank(rank, WORLD)
        .l1_dir(dir)
        .chunk_size(64 * KIB as u32)
        .io_engine("psync")
        .upload_every(1)
}

fn state(rank: u32, step: u64) -> Vec<u8> {
    (0..192 * KIB)
        .map(|i| (i as u8) ^ (rank as u8).wrapping_mul(17) ^ (step as u8).wrapping_mul(29))
        .collect()
}

/// Runs `f(rank, checkpointer)` on every rank at once, each on its own
/// disk, all sharing `l3`; returns the results by rank.
fn on_every_rank<T: Send>(
    dirs: &[tempfile::TempDir],
    l3: &Arc<dyn ChunkStore>,
    f: impl Fn(u32, &Checkpointer) -> T + Sync,
) -> Vec<T> {
    on_every_rank_with(dirs, |_| l3.clone(), f)
}

/// [`on_every_rank`], each rank reaching L3 through `l3_of(rank)`.
fn on_every_rank_with<T: Send>(
    dirs: &[tempfile::TempDir],
    l3_of: impl Fn(u32) -> Arc<dyn ChunkStore> + Sync,
    f: impl Fn(u32, &Checkpointer) -> T + Sync,
) -> Vec<T> {
    on_every_rank_cfg(dirs, l3_of, |c| c, f)
}

/// [`on_every_rank_with`], each rank's configuration changed by `tweak`.
fn on_every_rank_cfg<T: Send>(
    dirs: &[tempfile::TempDir],
    l3_of: impl Fn(u32) -> Arc<dyn ChunkStore> + Sync,
    tweak: impl Fn(Config) -> Config + Sync,
    f: impl Fn(u32, &Checkpointer) -> T + Sync,
) -> Vec<T> {
    let coord = InProcessCoordinator::new(WORLD);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..WORLD)
            .map(|rank| {
                let (coord, l3, f, tweak) = (coord.clone(), l3_of(rank), &f, &tweak);
                let dir = dirs[rank as usize].path();
                sc.spawn(move || {
                    let ck = Checkpointer::builder(tweak(cfg(dir, rank)))
                        .coordinator(Arc::new(coord))
                        .remote(Some(l3))
                        .build()
                        .unwrap();
                    f(rank, &ck)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Saves steps 1 and 2 on every rank and uploads both to `l3`.
fn save_two_steps(dirs: &[tempfile::TempDir], l3: &Arc<dyn ChunkStore>) {
    on_every_rank(dirs, l3, |rank, ck| {
        for step in 1..=2u64 {
            let d = state(rank, step);
            let shape = [d.len() as u64];
            ck.save(step, &[Entry::tensor("w", DType::U8, &shape, &d)])
                .unwrap()
                .wait()
                .unwrap();
        }
        ck.wait_uploads();
    });
}

/// Every rank failed with `TierUnavailable`; returns the errors' texts.
fn every_rank_unavailable<T>(got: &[strata::Result<T>]) -> Vec<String> {
    got.iter()
        .enumerate()
        .map(|(rank, r)| {
            let e = r
                .as_ref()
                .err()
                .unwrap_or_else(|| panic!("rank {rank} restored"));
            assert!(
                matches!(e, Error::TierUnavailable { .. }),
                "rank {rank}: {e}"
            );
            e.to_string()
        })
        .collect()
}

/// `mem` behind a store that answers nothing (an outage from the start).
fn unreachable(mem: &Arc<MemoryStore>) -> Arc<dyn ChunkStore> {
    blind_until_healed(&(mem.clone() as Arc<dyn ChunkStore>))
}

/// `l3` behind a store that answers nothing until `heal()`.
fn blind_until_healed(l3: &Arc<dyn ChunkStore>) -> Arc<FaultStore<Arc<dyn ChunkStore>>> {
    Arc::new(FaultStore::new(
        l3.clone(),
        FaultPlan {
            outage_after: Some(0),
            ..FaultPlan::default()
        },
    ))
}

/// `rank`'s commit record of `step` on `l3`, if there is one.
fn record_on(
    l3: &Arc<dyn ChunkStore>,
    step: u64,
    rank: u32,
) -> Option<strata::format::CommitRecord> {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(l3.get_commit_record("shared-l3", step, rank))
        .unwrap()
}

fn dirs() -> Vec<tempfile::TempDir> {
    (0..WORLD).map(|_| tempfile::tempdir().unwrap()).collect()
}

#[test]
fn l3_is_listed_once_per_restore_and_a_replaced_node_reads_its_own_record() {
    let store = Arc::new(MetricsStore::new(MemoryStore::new()));
    let l3: Arc<dyn ChunkStore> = store.clone();
    let dirs = dirs();
    save_two_steps(&dirs, &l3);
    let lists = || store.snapshot().family(OpFamily::List).ops;

    // Every disk holds both steps: one listing of L3 for the four ranks
    // (each rank listed it before).
    let before = lists();
    let got = on_every_rank(&dirs, &l3, |_, ck| {
        ck.restore(StepSelector::Latest).unwrap()
    });
    assert_eq!(
        lists() - before,
        1,
        "L3 listings for one restore of 4 ranks"
    );
    for (rank, st) in got.iter().enumerate() {
        assert_eq!(st.step, 2);
        assert_eq!(st.get("w").unwrap().bytes, state(rank as u32, 2));
        assert_eq!(st.stats.bytes_from_l3, 0, "rank {rank} read its own disk");
    }

    // Rank 2's node was replaced: its disk is empty. It did not list L3,
    // yet the lister's view says L3 holds its shard of step 2: it reads
    // its record there directly and restores step 2 with the others.
    std::fs::remove_dir_all(dirs[2].path()).unwrap();
    let (before, records) = (lists(), store.snapshot().family(OpFamily::Manifest).ops);
    let got = on_every_rank(&dirs, &l3, |_, ck| {
        ck.restore(StepSelector::Latest).unwrap()
    });
    assert_eq!(lists() - before, 1, "L3 listings with a replaced node");
    for (rank, st) in got.iter().enumerate() {
        assert_eq!(st.step, 2, "rank {rank}");
        assert_eq!(st.get("w").unwrap().bytes, state(rank as u32, 2));
    }
    assert!(got[2].stats.bytes_from_l3 > 0, "rank 2 read L3");
    // Its record and its manifest, nothing per other rank.
    let reads = store.snapshot().family(OpFamily::Manifest).ops - records;
    assert_eq!(reads, 2, "rank 2's record and manifest read from L3");
    // An explicit older step, also only on L3 for rank 2.
    std::fs::remove_dir_all(dirs[2].path()).unwrap();
    let before = lists();
    let got = on_every_rank(&dirs, &l3, |_, ck| {
        ck.restore(StepSelector::Step(1)).unwrap()
    });
    assert_eq!(lists() - before, 1);
    assert_eq!(got[2].get("w").unwrap().bytes, state(2, 1));
}

#[test]
fn a_lister_blind_to_l3_fails_every_rank_alike_where_l3_may_hold_a_shard() {
    let mem = Arc::new(MemoryStore::new());
    let dirs = dirs();
    save_two_steps(&dirs, &(mem.clone() as Arc<dyn ChunkStore>));
    let down = unreachable(&mem);
    // Every disk holds the newest step: nothing is hidden, the restore
    // goes on from L1 though nobody could list L3.
    let got = on_every_rank(&dirs, &down, |_, ck| ck.restore(StepSelector::Latest));
    for (rank, r) in got.iter().enumerate() {
        let st = r.as_ref().unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(st.step, 2);
    }
    // Rank 3's disk is lost: its shards may be only on L3, which rank 0
    // could not list. Every rank fails, naming the lister's view.
    std::fs::remove_dir_all(dirs[3].path()).unwrap();
    let got = on_every_rank(&dirs, &down, |_, ck| ck.restore(StepSelector::Latest));
    for (rank, e) in every_rank_unavailable(&got).iter().enumerate() {
        assert!(e.contains("seen by rank 0"), "rank {rank}: {e}");
    }
}

#[test]
fn a_rank_that_cannot_read_l3_stops_every_rank_instead_of_going_back() {
    let mem = Arc::new(MemoryStore::new());
    let dirs = dirs();
    save_two_steps(&dirs, &(mem.clone() as Arc<dyn ChunkStore>));
    // Rank 2's node was replaced and its credentials for L3 are wrong:
    // rank 0 lists L3 fine and says rank 2's shard of step 2 is there, but
    // rank 2 cannot read it. Every rank stops with TierUnavailable (before:
    // the ranks dropped the step as unusable and went back to an older
    // one, or failed each with its own error).
    std::fs::remove_dir_all(dirs[2].path()).unwrap();
    let down = unreachable(&mem);
    let got = on_every_rank_with(
        &dirs,
        |r| {
            if r == 2 {
                down.clone()
            } else {
                mem.clone() as Arc<dyn ChunkStore>
            }
        },
        |_, ck| ck.restore(StepSelector::Latest),
    );
    every_rank_unavailable(&got);
    let e = got[2].as_ref().err().unwrap().to_string();
    assert!(e.contains("seen by rank 2"), "{e}");
}

/// After a restore that left L3 to rank 0, a rank knows the L3 steps of
/// the agreement's view only (the newest 64 and the one asked for). A save
/// of an older step this rank committed on L3 is still refused at once
/// (it reads its own record there), before anything is written.
#[test]
fn a_step_older_than_the_restores_view_is_refused_on_every_rank_before_any_write() {
    const STEPS: u64 = 70; // more than a restore's view carries (64)
    let l3: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let dirs = dirs();
    // L3 keeps every step; L1 the newest three.
    let keep_l3 = |mut c: Config| {
        c.l3_keep_last = 0;
        c
    };
    let save = |ck: &Checkpointer, rank: u32, step: u64| {
        let d = state(rank, step);
        let shape = [d.len() as u64];
        ck.save(step, &[Entry::tensor("w", DType::U8, &shape, &d)])
            .and_then(|h| h.wait())
    };
    on_every_rank_cfg(
        &dirs,
        |_| l3.clone(),
        keep_l3,
        |rank, ck| {
            for step in 1..=STEPS {
                save(ck, rank, step).unwrap();
            }
            ck.wait_uploads();
        },
    );
    // A new start of the job: it restores the newest step (rank 0 lists
    // L3 for every rank), then saves step 2 again, which every rank
    // committed on L3 long ago (only L3 holds it now).
    let got = on_every_rank_cfg(
        &dirs,
        |_| l3.clone(),
        keep_l3,
        |rank, ck| {
            let r = ck.restore(StepSelector::Latest).unwrap();
            assert_eq!(r.step, STEPS);
            let files = || {
                let mut f = strata_testkit::files_under(dirs[rank as usize].path());
                f.sort();
                f
            };
            let before = files();
            let again = save(ck, rank, 2);
            // Neither chunks nor a manifest of step 2 written.
            (again, files() != before)
        },
    );
    for (rank, (again, wrote)) in got.into_iter().enumerate() {
        // Refused by its own knowledge, before its save ran: not learned
        // from rank 0 at the barrier after writing a new shard.
        match again {
            Err(Error::AlreadyCommitted { step: 2, tier }) if tier == "by this rank" => {}
            other => panic!("rank {rank}: {other:?}, not refused at once as committed"),
        }
        assert!(!wrote, "rank {rank} wrote to L1 before refusing step 2");
    }
}

#[test]
fn a_jobs_first_save_without_a_restore_lists_l3_once_and_a_step_l3_holds_is_refused_everywhere() {
    let (store, l3) = split_on_l3();
    let records = || -> Vec<Option<strata::format::CommitRecord>> {
        (0..WORLD).map(|r| record_on(&l3, 2, r)).collect()
    };
    let before = records();
    assert!(before[0].is_none() && before[1..].iter().all(Option::is_some));

    // A new start of the job on new disks that saves without restoring
    // first: its first save lists the tiers to refuse a committed step.
    let lists = || store.snapshot().family(OpFamily::List).ops;
    let listed = lists();
    let got = on_every_rank_cfg(
        &dirs(),
        |_| l3.clone(),
        no_uploads,
        |rank, ck| (save_new(ck, rank, 2), save_new(ck, rank, 3)),
    );
    // Rank 0 lists L3 for the job; the others leave it to rank 0 (before:
    // one listing per rank).
    assert_eq!(
        lists() - listed,
        1,
        "L3 listings for the first saves of 4 ranks"
    );
    for (rank, (again, next)) in got.into_iter().enumerate() {
        match again {
            Err(Error::AlreadyCommitted { step: 2, .. }) => {}
            other => panic!("rank {rank} saved step 2 again: {other:?}"),
        }
        assert_eq!(next.unwrap().step, 3, "rank {rank}");
    }
    // L3's step 2 is as it was.
    assert_eq!(records(), before, "L3's records of step 2");
}

/// L3 with steps 1 and 2 of every rank, and a split of step 2: rank 0's
/// record of it is gone, the others' stay (step 2 was decided all the
/// same: no rank may save it again).
fn split_on_l3() -> (Arc<MetricsStore<MemoryStore>>, Arc<dyn ChunkStore>) {
    let store = Arc::new(MetricsStore::new(MemoryStore::new()));
    let l3: Arc<dyn ChunkStore> = store.clone();
    save_two_steps(&dirs(), &l3);
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(l3.delete_shard("shared-l3", 2, 0))
        .unwrap();
    (store, l3)
}

/// Without uploads (a test that counts L3 listings: rank 0's collection of
/// L3 after an upload lists it too).
fn no_uploads(mut c: Config) -> Config {
    c.upload_every = 0;
    c
}

/// Saves `step` with contents of a new start of the job (not the first
/// start's).
fn save_new(ck: &Checkpointer, rank: u32, step: u64) -> strata::Result<strata::SaveStats> {
    let d = state(rank, step + 100);
    let shape = [d.len() as u64];
    ck.save(step, &[Entry::tensor("w", DType::U8, &shape, &d)])
        .and_then(|h| h.wait())
}

#[test]
fn a_step_rank_0_refused_for_the_others_may_be_saved_again_once_deleted_everywhere() {
    let (_, l3) = split_on_l3();
    let got = on_every_rank_cfg(
        &dirs(),
        |_| l3.clone(),
        no_uploads,
        |rank, ck| {
            // The first save lists L3 on rank 0, which then knows step 2
            // committed by ranks 1 to 3 (it holds nothing of it).
            save_new(ck, rank, 3).unwrap();
            ck.delete(&[2]).unwrap();
            save_new(ck, rank, 2)
        },
    );
    for (rank, after) in got.into_iter().enumerate() {
        assert_eq!(
            after.unwrap().step,
            2,
            "rank {rank}: step 2 after its deletion"
        );
    }
}

#[test]
fn a_lister_blind_to_l3_at_the_first_save_uploads_nothing_until_l3_answers_again() {
    let (_, l3) = split_on_l3();
    // Rank 0 cannot reach L3 at its first save: it cannot refuse step 2
    // for the others. L3 answers again just after.
    let blind = blind_until_healed(&l3);
    let record = |step: u64, rank: u32| record_on(&l3, step, rank);
    let before: Vec<_> = (0..WORLD).map(|r| record(2, r)).collect();
    let resumed = on_every_rank_with(
        &dirs(),
        |rank| {
            if rank == 0 {
                blind.clone() as Arc<dyn ChunkStore>
            } else {
                l3.clone()
            }
        },
        |rank, ck| {
            let d = state(rank, 102);
            let shape = [d.len() as u64];
            let h = ck.save(2, &[Entry::tensor("w", DType::U8, &shape, &d)]);
            if rank == 0 {
                blind.heal();
            }
            // Saved on L1: nobody could tell it was committed on L3.
            assert_eq!(h.and_then(|h| h.wait()).unwrap().step, 2);
            ck.wait_uploads();
            // Rank 0 lists L3 again in the background from its next save
            // on; once it has, steps are uploaded again (every rank sees
            // the same: rank 0's vote decides).
            (3..40u64)
                .find(|&step| {
                    save_new(ck, rank, step).unwrap();
                    ck.wait_uploads();
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    record(step, rank).is_some()
                })
                .expect("uploads never resumed")
        },
    );
    // Step 2 was not uploaded: L3 does not hold rank 0's new shard beside
    // the others' old ones.
    let after: Vec<_> = (0..WORLD).map(|r| record(2, r)).collect();
    assert_eq!(after, before, "L3's records of step 2");
    assert!(after[0].is_none());
    // Uploads resumed once rank 0 listed L3, at the same step on every
    // rank.
    assert!(resumed.iter().all(|&s| s == resumed[0]), "{resumed:?}");
}

/// A restart whose restore finds rank 0 unable to list L3 goes on from L1
/// (every disk holds the newest step), and the steps saved after it are
/// not uploaded by any rank until rank 0 can list L3 again: the restore
/// sets the lister's flag from its own listing, not only a first save.
#[test]
fn a_restore_whose_lister_cannot_list_l3_uploads_nothing_until_l3_answers_again() {
    let mem = Arc::new(MemoryStore::new());
    let l3 = mem.clone() as Arc<dyn ChunkStore>;
    let dirs = dirs();
    save_two_steps(&dirs, &l3);
    let blind = blind_until_healed(&l3);
    let record = |step: u64, rank: u32| record_on(&l3, step, rank);
    let gate = std::sync::Barrier::new(WORLD as usize);
    let resumed = on_every_rank_with(
        &dirs,
        |rank| {
            if rank == 0 {
                blind.clone() as Arc<dyn ChunkStore>
            } else {
                l3.clone()
            }
        },
        |rank, ck| {
            assert_eq!(ck.restore(StepSelector::Latest).unwrap().step, 2);
            save_new(ck, rank, 3).unwrap();
            ck.wait_uploads();
            // Every rank has waited for its step 3's uploads before L3
            // answers rank 0 again.
            gate.wait();
            if rank == 0 {
                blind.heal();
            }
            (4..40u64)
                .find(|&step| {
                    save_new(ck, rank, step).unwrap();
                    ck.wait_uploads();
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    record(step, rank).is_some()
                })
                .expect("uploads never resumed")
        },
    );
    let step3: Vec<_> = (0..WORLD).map(|r| record(3, r).is_some()).collect();
    assert_eq!(step3, [false; WORLD as usize], "step 3 reached L3");
    assert!(resumed.iter().all(|&s| s == resumed[0]), "{resumed:?}");
}
