//! L3 is collected by rank 0 alone for the whole job: the other ranks'
//! uploaders never list L3, and rank 0 retires every rank's shards of the
//! steps the policy no longer keeps, so L3 ends up holding only whole kept
//! steps, which restore from L3 alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;

use strata::format::DType;
use strata::tiered::wrap::OpFamily;
use strata::tiered::{ChunkStore, MemoryStore, MetricsStore};
use strata::{Checkpointer, Config, Entry, InProcessCoordinator, StepSelector};

const WORLD: u32 = 4;

fn state(rank: u32, step: u64) -> Vec<u8> {
    let mut v = vec![rank as u8; 1 << 16]; // a chunk every step of the rank shares
    v.extend(std::iter::repeat_n(step as u8 ^ 0x5A, 1 << 16)); // one of its own
    v
}

#[test]
fn only_rank_zero_lists_l3_to_collect_it_and_it_retires_every_ranks_shards() {
    let mem = Arc::new(MemoryStore::new());
    // Each rank reaches the one L3 through a counter of its own.
    let seen: Vec<Arc<MetricsStore<Arc<MemoryStore>>>> = (0..WORLD)
        .map(|_| Arc::new(MetricsStore::new(mem.clone())))
        .collect();
    let lists = |r: usize| seen[r].snapshot().family(OpFamily::List).ops;
    let dirs: Vec<tempfile::TempDir> = (0..WORLD).map(|_| tempfile::tempdir().unwrap()).collect();
    let cfg = |rank: u32| {
        let mut c = Config::builder()
            .job("one-collector")
            .rank(rank, WORLD)
            .l1_dir(dirs[rank as usize].path())
            .chunk_size(1 << 16)
            .io_engine("psync")
            .keep_last(2)
            .upload_every(1);
        c.l3_keep_last = 2;
        c.l3_keep_every = 0;
        c.l3_gc_grace_secs = 0;
        c
    };
    let coord = InProcessCoordinator::new(WORLD);
    // Listings after the first save (whose check for committed steps lists
    // L3 once, on rank 0).
    let after_first: Vec<u64> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..WORLD)
            .map(|rank| {
                let (coord, l3, cfg) = (coord.clone(), seen[rank as usize].clone(), &cfg);
                sc.spawn(move || {
                    let ck = Checkpointer::builder(cfg(rank))
                        .coordinator(Arc::new(coord))
                        .remote(Some(l3.clone() as Arc<dyn ChunkStore>))
                        .build()
                        .unwrap();
                    let mut first = 0;
                    for step in 1..=6u64 {
                        let d = state(rank, step);
                        let shape = [d.len() as u64];
                        ck.save(step, &[Entry::tensor("w", DType::U8, &shape, &d)])
                            .unwrap()
                            .wait()
                            .unwrap();
                        ck.wait_uploads();
                        if step == 1 {
                            first = l3.snapshot().family(OpFamily::List).ops;
                        }
                    }
                    first
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, first) in after_first.iter().enumerate().skip(1) {
        assert_eq!(lists(r) - first, 0, "rank {r} listed L3 to collect it");
    }
    assert!(lists(0) > after_first[0], "rank 0 collects");
    // Steps 1..3 are gone for every rank (rank 0 retired the others'
    // shards too); what is left is whole, the newest two complete steps at
    // least (step 4 stays if rank 0's last collection ran before another
    // rank's upload of step 6 ended).
    let rt = tokio::runtime::Runtime::new().unwrap();
    let steps = rt.block_on(mem.list_steps("one-collector")).unwrap();
    let listed: BTreeSet<u64> = steps.iter().map(|s| s.step).collect();
    assert!(
        listed == BTreeSet::from([5, 6]) || listed == BTreeSet::from([4, 5, 6]),
        "{steps:?}"
    );
    assert!(steps.iter().all(|s| s.is_complete()), "{steps:?}");
    // Every node lost: step 6 restores from L3 alone on every rank.
    for d in &dirs {
        std::fs::remove_dir_all(d.path()).unwrap();
    }
    let coord = InProcessCoordinator::new(WORLD);
    std::thread::scope(|sc| {
        for rank in 0..WORLD {
            let (coord, l3, cfg) = (coord.clone(), mem.clone(), &cfg);
            sc.spawn(move || {
                let ck = Checkpointer::builder(cfg(rank))
                    .coordinator(Arc::new(coord))
                    .remote(Some(l3 as Arc<dyn ChunkStore>))
                    .build()
                    .unwrap();
                let got = ck.restore(StepSelector::Latest).unwrap();
                assert_eq!(got.step, 6);
                assert_eq!(got.get("w").unwrap().bytes, state(rank, 6));
                assert!(got.stats.bytes_from_l3 > 0);
            });
        }
    });
}
