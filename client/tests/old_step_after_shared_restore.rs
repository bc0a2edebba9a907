//! After a restore that left L3 to rank 0, a rank knows the L3 steps of
//! the agreement's view only (the newest 64 and the one asked for). A save
//! of an older step this rank committed on L3 is still refused at once
//! (it reads its own record there), before anything is written.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;

use strata::format::DType;
use strata::tiered::{ChunkStore, MemoryStore};
use strata::{Checkpointer, Config, Entry, Error, InProcessCoordinator, StepSelector};

const WORLD: u32 = 2;
/// More steps on L3 than a restore's view carries (64).
const STEPS: u64 = 70;

fn cfg(dir: &Path, rank: u32) -> Config {
    let mut c = Config::builder()
        .job("old-step")
        .rank(rank, WORLD)
        .l1_dir(dir)
        .chunk_size(4 << 10)
        .io_engine("psync")
        .upload_every(1);
    // L3 keeps every step; L1 the newest three.
    c.l3_keep_last = 0;
    c
}

fn state(rank: u32, step: u64) -> Vec<u8> {
    (0..8u32 << 10)
        .map(|i| (i as u8) ^ (rank as u8).wrapping_mul(17) ^ (step as u8).wrapping_mul(29))
        .collect()
}

fn save(ck: &Checkpointer, rank: u32, step: u64) -> Result<(), Error> {
    let d = state(rank, step);
    let shape = [d.len() as u64];
    ck.save(step, &[Entry::tensor("w", DType::U8, &shape, &d)])?
        .wait()
        .map(|_| ())
}

fn on_every_rank<T: Send>(
    dirs: &[tempfile::TempDir],
    l3: &Arc<dyn ChunkStore>,
    f: impl Fn(u32, &Checkpointer) -> T + Sync,
) -> Vec<T> {
    let coord = InProcessCoordinator::new(WORLD);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..WORLD)
            .map(|rank| {
                let (coord, l3, f) = (coord.clone(), l3.clone(), &f);
                let dir = dirs[rank as usize].path();
                sc.spawn(move || {
                    let ck = Checkpointer::builder(cfg(dir, rank))
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

#[test]
fn a_step_older_than_the_restores_view_is_refused_on_every_rank_before_any_write() {
    let l3: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let dirs: Vec<tempfile::TempDir> = (0..WORLD).map(|_| tempfile::tempdir().unwrap()).collect();
    on_every_rank(&dirs, &l3, |rank, ck| {
        for step in 1..=STEPS {
            save(ck, rank, step).unwrap();
        }
        ck.wait_uploads();
    });
    // A new start of the job: it restores the newest step (rank 0 lists
    // L3 for both), then saves step 2 again, which both ranks committed
    // on L3 long ago (only L3 holds it now).
    let got = on_every_rank(&dirs, &l3, |rank, ck| {
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
        let on_l1 = files() != before;
        (again, on_l1)
    });
    for (rank, (again, on_l1)) in got.into_iter().enumerate() {
        // Refused by its own knowledge, before its save ran: not learned
        // from rank 0 at the barrier after writing a new shard.
        match again {
            Err(Error::AlreadyCommitted { step: 2, tier }) if tier == "by this rank" => {}
            other => panic!("rank {rank}: {other:?}, not refused at once as committed"),
        }
        assert!(!on_l1, "rank {rank} wrote step 2 to L1 before refusing it");
    }
}
