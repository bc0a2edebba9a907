//! Properties of the planner over random inventories: no chunk a remaining
//! manifest references is ever planned for deletion; the newest committed
//! step, pinned and held steps are never retired; only the scope's ranks
//! are touched; an unreadable remaining manifest holds every chunk back;
//! only chunks older than the grace period go; with per-rank records (L3)
//! a step newer than every complete one goes only once aged and beyond
//! the newest `keep_last` incomplete ones.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use strata_format::{ChunkId, CommitRecord, ShardRef};
use strata_gc::{plan, plan_bounded, Evidence, Inventory, ManifestRefs, Retention, Scope};
use strata_tiered::{ChunkInfo, StepInfo};

const POOL: u8 = 24;

fn chunk(i: u8) -> ChunkId {
    ChunkId::of(&[i])
}

/// Per (step, rank): manifest chunk indices (None: no manifest), record
/// written, retiring marker, record unreadable, manifest unreadable.
type Shard = (Option<Vec<u8>>, bool, bool, bool, bool);

#[derive(Debug, Clone)]
struct Case {
    world: u32,
    steps: BTreeMap<u64, Vec<Shard>>,
    ages: Vec<Option<u64>>,
    policy: Retention,
    scope: Scope,
    evidence: Evidence,
    pins: BTreeSet<u64>,
    hold: BTreeSet<u64>,
    /// Steps seen incomplete long enough (`plan_bounded`).
    aged: BTreeSet<u64>,
}

fn shard() -> impl Strategy<Value = Shard> {
    (
        prop::option::weighted(0.85, prop::collection::vec(0..POOL, 0..6)),
        prop::bool::weighted(0.7),
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.03),
        prop::bool::weighted(0.03),
    )
}

fn case() -> impl Strategy<Value = Case> {
    (1u32..4).prop_flat_map(|world| {
        (
            prop::collection::btree_map(
                0u64..30,
                prop::collection::vec(shard(), world as usize),
                0..12,
            ),
            prop::collection::vec(prop::option::weighted(0.9, 0u64..2000), POOL as usize),
            (
                1usize..4,
                prop_oneof![Just(0u64), 2u64..6],
                prop::option::of(0u64..1500),
                0u64..1500,
            ),
            (
                prop_oneof![Just(Scope::All), (0..world).prop_map(Scope::Rank)],
                prop_oneof![Just(Evidence::AnyRecord), Just(Evidence::EveryRank)],
            ),
            prop::collection::btree_set(0u64..30, 0..3),
            prop::collection::btree_set(0u64..30, 0..3),
            prop::collection::btree_set(0u64..30, 0..10),
        )
            .prop_map(
                move |(
                    steps,
                    ages,
                    (keep_last, keep_every, within, grace),
                    (scope, evidence),
                    pins,
                    hold,
                    aged,
                )| {
                    Case {
                        world,
                        steps,
                        ages,
                        policy: Retention {
                            keep_last,
                            keep_every,
                            keep_within: within.map(Duration::from_secs),
                            grace: Duration::from_secs(grace),
                        },
                        scope,
                        evidence,
                        pins,
                        hold,
                        aged,
                    }
                },
            )
    })
}

const NOW: u64 = 1_000_000;

fn inventory(c: &Case) -> Inventory {
    let now = UNIX_EPOCH + Duration::from_secs(NOW);
    let mut steps = Vec::new();
    let mut manifests = BTreeMap::new();
    for (&step, shards) in &c.steps {
        let mut st = StepInfo {
            step,
            ..StepInfo::default()
        };
        for (rank, (man, record, retiring, bad_record, bad_manifest)) in shards.iter().enumerate() {
            let rank = rank as u32;
            if let Some(ids) = man {
                st.manifests.insert(rank);
                let refs = if *bad_manifest {
                    ManifestRefs::Unreadable("damaged".into())
                } else {
                    ManifestRefs::Chunks(ids.iter().map(|&i| chunk(i)).collect())
                };
                manifests.insert((step, rank), refs);
            }
            if *bad_record {
                st.unreadable.insert(rank, "damaged".into());
            } else if *record {
                st.records.insert(
                    rank,
                    CommitRecord {
                        job: "j".into(),
                        step,
                        world_size: c.world,
                        committed_unix_ms: (NOW - 2000 + step * 60) * 1000,
                        shards: vec![ShardRef {
                            rank,
                            manifest: chunk(200),
                            logical_bytes: 0,
                        }],
                    },
                );
            }
            if *retiring {
                st.retiring.insert(rank);
            }
        }
        steps.push(st);
    }
    let chunks = c
        .ages
        .iter()
        .enumerate()
        .map(|(i, age)| ChunkInfo {
            id: chunk(i as u8),
            stored_len: Some(100),
            touched: age.map(|a| now - Duration::from_secs(a)),
        })
        .collect();
    Inventory {
        steps,
        manifests,
        chunks,
        pins: c.pins.clone(),
        now,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn a_plan_never_deletes_what_is_kept(c in case()) {
        let inv = inventory(&c);
        let p = plan_bounded(&inv, &c.policy, c.scope, c.evidence, &c.hold, &c.aged);
        let going: HashSet<(u64, u32)> = p.retire.iter().chain(&p.partial).copied().collect();

        // 1. No chunk referenced by a remaining manifest is planned.
        let mut referenced = HashSet::new();
        for (key, refs) in &inv.manifests {
            if !going.contains(key) {
                if let ManifestRefs::Chunks(ids) = refs {
                    referenced.extend(ids.iter().copied());
                }
            }
        }
        for id in &p.chunks {
            prop_assert!(!referenced.contains(id), "planned a referenced chunk");
        }
        // 2. An unreadable remaining manifest holds every chunk back.
        let unreadable_left = inv.manifests.iter().any(|(k, r)| !going.contains(k) && matches!(r, ManifestRefs::Unreadable(_)));
        if unreadable_left {
            prop_assert!(p.chunks.is_empty() && p.held_back.is_some());
        }
        // 3. Only chunks older than the grace period, and only with an age.
        let cutoff = inv.now.checked_sub(c.policy.grace).unwrap_or(UNIX_EPOCH);
        for info in &inv.chunks {
            if p.chunks.contains(&info.id) {
                prop_assert!(info.touched.is_some_and(|t| t < cutoff));
            }
        }
        // 4. Only the scope's ranks.
        if let Scope::Rank(r) = c.scope {
            prop_assert!(going.iter().all(|&(_, rank)| rank == r));
        }
        // 5. The newest committed step, pinned and held steps stay, unless
        //    a retiring marker says their retirement had begun.
        let committed = |st: &StepInfo| match (c.evidence, c.scope) {
            (Evidence::EveryRank, _) => st.is_complete(),
            (_, Scope::Rank(r)) => st.committed_ranks().contains(&r),
            (_, Scope::All) => !st.records.is_empty(),
        };
        let newest = inv.steps.iter().filter(|st| committed(st)).map(|st| st.step).max();
        for &(step, rank) in &going {
            let st = inv.steps.iter().find(|s| s.step == step).unwrap();
            let protected = Some(step) == newest || c.pins.contains(&step) || c.hold.contains(&step);
            prop_assert!(!protected || st.retiring.contains(&rank), "retired protected step {step}");
            // 6. A record that cannot be read is left alone.
            prop_assert!(!st.unreadable.contains_key(&rank));
        }
        if let Some(n) = newest {
            prop_assert!(p.keep.contains(&n));
        }
        // 7. At least keep_last committed steps are kept, when there are.
        let n_committed = inv.steps.iter().filter(|st| committed(st)).count();
        prop_assert!(p.keep.len() >= c.policy.keep_last.min(n_committed));
        // The newest keep_last incomplete steps with a record (per-rank
        // records).
        let newest_incomplete: BTreeSet<u64> = inv
            .steps
            .iter()
            .rev()
            .filter(|st| !st.is_complete() && !st.records.is_empty())
            .take(c.policy.keep_last.max(1))
            .map(|st| st.step)
            .collect();
        let incomplete: BTreeSet<u64> = inv.steps.iter().filter(|st| !st.is_complete()).map(|st| st.step).collect();
        let bounded = |step: u64| {
            c.evidence == Evidence::EveryRank
                && incomplete.contains(&step)
                && c.aged.contains(&step)
                && !newest_incomplete.contains(&step)
        };
        // 8. Partial shards are only uncommitted shards older than every
        //    kept step, or of aged incomplete steps beyond the bound.
        for &(step, rank) in &p.partial {
            let st = inv.steps.iter().find(|s| s.step == step).unwrap();
            prop_assert!(!st.committed_ranks().contains(&rank));
            prop_assert!(p.keep.iter().all(|&k| step < k) || bounded(step));
        }
        // 9. With per-rank records (L3), nothing of a step newer than the
        //    newest complete step goes (another rank may be uploading it),
        //    unless a retiring marker says its retirement had begun, or it
        //    is aged and not among the newest keep_last incomplete steps.
        if c.evidence == Evidence::EveryRank {
            for &(step, rank) in &going {
                let st = inv.steps.iter().find(|s| s.step == step).unwrap();
                let beyond = newest.is_none_or(|n| step > n);
                prop_assert!(
                    !beyond || st.retiring.contains(&rank) || bounded(step),
                    "step {step} beyond the newest complete"
                );
            }
            // 10. Aged incomplete steps beyond the bound go (each shard the
            //     scope covers, but unreadable records), unless pinned or held.
            for st in &inv.steps {
                if bounded(st.step) && !c.pins.contains(&st.step) && !c.hold.contains(&st.step) {
                    for rank in st.manifests.iter().chain(st.records.keys()) {
                        let covered = match c.scope {
                            Scope::All => true,
                            Scope::Rank(r) => r == *rank,
                        };
                        if covered && !st.unreadable.contains_key(rank) {
                            prop_assert!(going.contains(&(st.step, *rank)), "aged step {} rank {rank} kept", st.step);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn keep_every_and_within_keep_old_steps() {
    let mut c = Case {
        world: 1,
        steps: (1..=10)
            .map(|s| (s, vec![(Some(vec![s as u8]), true, false, false, false)]))
            .collect(),
        ages: vec![Some(5000); POOL as usize],
        policy: Retention {
            keep_last: 1,
            keep_every: 4,
            keep_within: None,
            grace: Duration::from_secs(60),
        },
        scope: Scope::All,
        evidence: Evidence::AnyRecord,
        pins: BTreeSet::from([3]),
        hold: BTreeSet::from([5]),
        aged: BTreeSet::new(),
    };
    let p = plan(&inventory(&c), &c.policy, c.scope, &c.hold);
    assert_eq!(p.keep, BTreeSet::from([3, 4, 5, 8, 10]));
    assert_eq!(p.retire, vec![(1, 0), (2, 0), (6, 0), (7, 0), (9, 0)]);
    // Chunk i is referenced by step i: those of retired steps go.
    let mut gone: Vec<ChunkId> = [1u8, 2, 6, 7, 9].iter().map(|&i| chunk(i)).collect();
    gone.extend((11..POOL).map(chunk));
    gone.push(chunk(0));
    let planned: HashSet<_> = p.chunks.iter().copied().collect();
    assert_eq!(planned, gone.into_iter().collect());

    // Steps committed within the last 500 s (by their records: step s at
    // NOW - 2000 + 60 s): 9 and 10 (and 8 was kept already).
    c.policy.keep_every = 0;
    c.policy.keep_within = Some(Duration::from_secs(1500));
    c.pins.clear();
    c.hold.clear();
    let p = plan(&inventory(&c), &c.policy, c.scope, &c.hold);
    assert_eq!(p.keep, BTreeSet::from([9, 10]));
    let _ = SystemTime::now();
}

/// One rank of two never gets its uploads through: no step is ever
/// complete on L3. The steps seen incomplete long enough (aged) go but the
/// newest `keep_last` incomplete ones; a step not yet aged (an upload of it
/// may still run) stays, as do pinned and held ones.
#[test]
fn incomplete_steps_are_bounded_once_aged() {
    let c = Case {
        world: 2,
        // Rank 0 committed each step; rank 1 left a manifest without a
        // record at steps 2 and 6, nothing at the others.
        steps: (1..=8)
            .map(|s| {
                let r1 = if s % 4 == 2 {
                    (Some(vec![s as u8 + 10]), false, false, false, false)
                } else {
                    (None, false, false, false, false)
                };
                (
                    s,
                    vec![(Some(vec![s as u8]), true, false, false, false), r1],
                )
            })
            .collect(),
        ages: vec![Some(5000); POOL as usize],
        policy: Retention {
            keep_last: 2,
            keep_every: 0,
            keep_within: None,
            grace: Duration::from_secs(60),
        },
        scope: Scope::All,
        evidence: Evidence::EveryRank,
        pins: BTreeSet::from([1]),
        hold: BTreeSet::from([3]),
        aged: (1..=6).collect(),
    };
    let inv = inventory(&c);
    let p = plan_bounded(&inv, &c.policy, c.scope, c.evidence, &c.hold, &c.aged);
    assert!(p.keep.is_empty(), "{:?}", p.keep);
    // 7 and 8 are the newest incomplete; 1 pinned, 3 held.
    assert_eq!(p.retire, vec![(2, 0), (4, 0), (5, 0), (6, 0)]);
    assert_eq!(p.partial, vec![(2, 1), (6, 1)]);
    // Without the aged steps, nothing goes (the planner before the bound).
    let p = plan_bounded(
        &inv,
        &c.policy,
        c.scope,
        c.evidence,
        &c.hold,
        &BTreeSet::new(),
    );
    assert!(p.retire.is_empty() && p.partial.is_empty(), "{p:?}");
}
