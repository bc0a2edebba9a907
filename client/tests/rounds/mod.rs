//! What the etcd round tests share: options, a reduce, and the check that
//! a rank's rounds and all-gather agree with every other rank's.
#![allow(clippy::unwrap_used, dead_code)]

use std::sync::Arc;
use std::time::Duration;

use strata::{Coordinator, EtcdCoordinator, EtcdOptions};

/// A round's timeout long enough never to decide a test.
pub(crate) const LONG: Duration = Duration::from_secs(60);

/// etcd at `url`, with a lease of `lease` seconds.
pub(crate) fn opts(url: &str, lease: u64) -> EtcdOptions {
    EtcdOptions {
        endpoints: vec![url.to_string()],
        lease_ttl: Duration::from_secs(lease),
        ..EtcdOptions::default()
    }
}

/// The sum of every rank's one-byte value, and how many values there were.
pub(crate) fn sum(all: &[Vec<u8>]) -> Vec<u8> {
    let s: u32 = all.iter().map(|v| u32::from(v[0])).sum();
    let mut out = s.to_le_bytes().to_vec();
    out.push(all.len() as u8);
    out
}

/// `rounds` reducing rounds of `rank` in a world of `world` (rank r gives
/// r + round; every rank must get the sum over the world and `world`
/// values), then an all-gather of `width` bytes per rank (every rank's
/// value, by rank).
pub(crate) fn rounds_agree(c: &dyn Coordinator, rank: u32, world: u32, rounds: u8, width: usize) {
    for round in 0..rounds {
        let got = c
            .all_reduce(
                rank,
                &format!("r/{round}"),
                vec![rank as u8 + round],
                LONG,
                &sum,
            )
            .unwrap();
        let want = (0..world).map(|r| r + u32::from(round)).sum::<u32>();
        assert_eq!(got[..4], want.to_le_bytes(), "round {round}");
        assert_eq!(u32::from(got[4]), world);
    }
    // An all-gather made of a round: every value, by rank.
    let all = c
        .all_gather(rank, "g", vec![rank as u8; width], LONG)
        .unwrap();
    assert_eq!(
        all,
        (0..world as u8).map(|r| vec![r; width]).collect::<Vec<_>>()
    );
}

/// `nodes` processes of `per` consecutive ranks each, of job `job`.
pub(crate) fn connect_nodes(
    o: &EtcdOptions,
    job: &str,
    nodes: u32,
    per: u32,
) -> Vec<Arc<EtcdCoordinator>> {
    (0..nodes)
        .map(|n| {
            EtcdCoordinator::connect_node(o.clone(), job, n * per..(n + 1) * per, nodes * per)
                .unwrap()
        })
        .collect()
}

/// Runs `each` with every rank of `nodes` (its handle and its rank), a
/// thread per rank, and returns once all have returned.
pub(crate) fn on_every_rank(
    nodes: &[Arc<EtcdCoordinator>],
    each: impl Fn(&dyn Coordinator, u32) + Sync,
) {
    let each = &each;
    std::thread::scope(|s| {
        for node in nodes {
            for rank in node.ranks() {
                let h = node.rank_handle(rank).unwrap();
                s.spawn(move || each(&h, rank));
            }
        }
    });
}
