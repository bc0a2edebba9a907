//! The rounds a restore costs: one, when every rank already read and
//! checked its manifest of the step the ranks pick (the usual restart);
//! a second asking each rank whether it can use the step only when some
//! rank could not check it before (a damaged manifest, a step to roll
//! forward). Each round is a write per node to etcd at scale
//! (`docs/scale.md`), and a restart of 2,048 nodes waits for all of them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata::format::DType;
use strata::tiered::{EngineChoice, L1Store};
use strata::{Checkpointer, Config, Coordinator, Entry, InProcessCoordinator, StepSelector};

const KIB: usize = 1 << 10;
const SHAPE: [u64; 1] = [64 * KIB as u64];
const WORLD: u32 = 4;

fn cfg(dir: &Path, rank: u32) -> Config {
    Config::builder()
        .job("rounds")
        .l1_dir(dir)
        .rank(rank, WORLD)
        .chunk_size(32 * KIB as u32)
        .io_engine("psync")
        .coordination_timeout_secs(20)
}

fn state(rank: u32, step: u64) -> Vec<u8> {
    (0..64 * KIB)
        .map(|j| (j as u8).wrapping_mul(11) ^ (rank as u8 * 5) ^ (step as u8))
        .collect()
}

/// The in-process coordinator, noting the key of every round a rank takes
/// part in.
struct Counting {
    inner: InProcessCoordinator,
    keys: Arc<Mutex<Vec<(u32, String)>>>,
}

impl Coordinator for Counting {
    fn world_size(&self) -> u32 {
        self.inner.world_size()
    }

    fn all_gather(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
    ) -> strata::Result<Vec<Vec<u8>>> {
        self.keys.lock().unwrap().push((rank, key.to_string()));
        self.inner.all_gather(rank, key, value, timeout)
    }
}

/// Every rank (a disk of its own each, as on separate nodes) runs `f` on a
/// thread; returns what each returned, and the keys of its rounds.
fn ranks<T: Send>(
    dirs: &[PathBuf],
    f: impl Fn(u32, &Checkpointer) -> T + Sync,
) -> (Vec<T>, Vec<(u32, String)>) {
    let coord = InProcessCoordinator::new(WORLD);
    let keys = Arc::new(Mutex::new(Vec::new()));
    let out = std::thread::scope(|s| {
        let hs: Vec<_> = (0..WORLD)
            .map(|rank| {
                let (f, coord, keys) = (&f, coord.clone(), keys.clone());
                s.spawn(move || {
                    let ck = Checkpointer::builder(cfg(&dirs[rank as usize], rank))
                        .coordinator(Arc::new(Counting { inner: coord, keys }))
                        .build()
                        .unwrap();
                    f(rank, &ck)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let keys = keys.lock().unwrap().clone();
    (out, keys)
}

/// Saves steps 1 to 3 on every rank.
fn saved() -> (tempfile::TempDir, Vec<PathBuf>) {
    let root = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = (0..WORLD)
        .map(|r| root.path().join(format!("node-{r}")))
        .collect();
    ranks(&dirs, |rank, ck| {
        for step in 1..=3 {
            let d = state(rank, step);
            let e = [Entry::tensor("w", DType::U8, &SHAPE, &d)];
            ck.save(step, &e).unwrap().wait().unwrap();
        }
    });
    (root, dirs)
}

/// What each rank restored (step, bytes), and the keys of the restore's
/// rounds each took part in.
type Restored = (Vec<(u64, Vec<u8>)>, Vec<Vec<String>>);

/// Restores with `which` on every rank.
fn restore(dirs: &[PathBuf], which: StepSelector) -> Restored {
    let (got, keys) = ranks(dirs, |_, ck| {
        let r = ck.restore(which).unwrap();
        (r.step, r.get("w").unwrap().bytes.clone())
    });
    let per_rank = (0..WORLD)
        .map(|rank| {
            keys.iter()
                .filter(|(r, k)| *r == rank && k.starts_with("restore/"))
                .map(|(_, k)| k.clone())
                .collect()
        })
        .collect();
    (got, per_rank)
}

#[test]
fn a_restore_where_every_rank_checked_the_step_before_is_one_round() {
    let (_root, dirs) = saved();
    for which in [StepSelector::Latest, StepSelector::Step(2)] {
        let want = match which {
            StepSelector::Step(s) => s,
            StepSelector::Latest => 3,
        };
        let (got, keys) = restore(&dirs, which);
        for (rank, (step, bytes)) in got.iter().enumerate() {
            assert_eq!(*step, want, "rank {rank}, {which:?}");
            assert!(*bytes == state(rank as u32, want), "rank {rank}'s bytes");
        }
        for (rank, k) in keys.iter().enumerate() {
            assert_eq!(
                k.len(),
                1,
                "rank {rank}, {which:?}: one round, not a second asking \
                 whether every rank can use the step: {k:?}"
            );
        }
    }
}

#[test]
fn a_rank_that_could_not_check_the_step_sends_every_rank_to_the_second_round() {
    let (_root, dirs) = saved();
    // Rank 2's manifest of step 3 is damaged: it cannot use step 3, so
    // every rank asks, drops step 3 together, and restores step 2.
    let l1 = L1Store::open(&dirs[2], EngineChoice::Psync).unwrap();
    let p = l1.manifest_path("rounds", 3, 2);
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() / 2]).unwrap();
    let (got, keys) = restore(&dirs, StepSelector::Latest);
    for (rank, (step, bytes)) in got.iter().enumerate() {
        assert_eq!(*step, 2, "rank {rank}");
        assert!(*bytes == state(rank as u32, 2), "rank {rank}'s bytes");
    }
    for (rank, k) in keys.iter().enumerate() {
        assert_eq!(
            k.len(),
            3,
            "rank {rank}: the agreement, whether step 3 can be used, whether \
             step 2 can: {k:?}"
        );
        assert!(
            k[1].ends_with("/ready/3") && k[2].ends_with("/ready/2"),
            "{k:?}"
        );
    }
}
