//! Tests of the restore agreement's payloads and decisions.

use super::*;

fn set(v: &[u64]) -> BTreeSet<u64> {
    v.iter().copied().collect()
}

#[test]
fn holdings_round_trip_and_old_payloads_decode() {
    let h = Holdings {
        committed: set(&[1, 2, 9]),
        partial: set(&[10]),
        foreign: Some((40, 8)),
        unreadable: Some("L3: connection refused".into()),
        l1_empty: true,
        compact: false,
        l3_deferred: false,
        l3: None,
        checked: Some(2),
    };
    let b = h.encode();
    assert_eq!(b.len() % 8, 1);
    assert_eq!(Holdings::decode(&b), Some(h));
    let empty = Holdings::default();
    assert_eq!(Holdings::decode(&empty.encode()), Some(empty));
    // An older build's bare list.
    let old: Vec<u8> = [3u64, 4].iter().flat_map(|s| s.to_le_bytes()).collect();
    assert_eq!(Holdings::decode(&old).unwrap().committed, set(&[3, 4]));
    // Malformed: truncated, a huge count, trailing bytes.
    for cut in 1..b.len() {
        let d = Holdings::decode(&b[..cut]);
        assert!(d.is_none() || cut % 8 == 0, "cut {cut}: {d:?}");
    }
    let mut huge = vec![TAG];
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.resize(9, 0);
    assert_eq!(Holdings::decode(&huge), None);
    let mut trailing = Holdings::default().encode();
    trailing[8] = 7;
    assert_eq!(Holdings::decode(&trailing), None);
}

#[test]
fn a_round_carries_the_newest_steps_and_widens_when_none_is_common() {
    // A long history: only the newest WINDOW steps travel (and the one
    // asked for), so a round's size does not grow with the job's age.
    let long = Holdings {
        committed: (1..=1000).collect(),
        partial: set(&[1001]),
        ..Holdings::default()
    };
    let c = long.compact(Some(5));
    assert!(c.compact);
    assert_eq!(c.committed.len(), WINDOW + 1);
    assert!(c.committed.contains(&5) && c.committed.contains(&1000));
    assert!(!c.committed.contains(&6));
    assert_eq!(c.partial, set(&[1001]));
    assert_eq!(Holdings::decode(&c.encode()), Some(c.clone()));
    assert!(c.encode().len() < 700, "{}", c.encode().len());
    // A short history travels whole and is not marked compact.
    let short = Holdings {
        committed: set(&[3, 4]),
        ..Holdings::default()
    };
    assert_eq!(short.compact(None), short);
    // A rank that lost its newer steps shares only step 10 with one
    // whose newest 64 are 937..1000: nothing common among the newest,
    // so the ranks widen (and then find 10).
    let behind = Holdings {
        committed: set(&[10]),
        ..Holdings::default()
    };
    let ahead: Holdings = Holdings {
        committed: (1..=1000).collect(),
        ..Holdings::default()
    };
    let ag = Agreement::of(&[ahead.compact(None), behind.clone()]).unwrap();
    assert!(ag.common.is_empty() && ag.widen);
    let ag = Agreement::of(&[ahead, behind.clone()]).unwrap();
    assert_eq!((ag.common.clone(), ag.widen), (set(&[10]), false));
    // A step asked for, older than the newest common ones, stays in
    // the decision (before, only the newest 64 were sent).
    let long_ag = Agreement::of(&[long.clone(), long.clone()]).unwrap();
    let plain = Agreement::decode(&long_ag.encode()).unwrap();
    assert!(!plain.common.contains(&5));
    let kept = Agreement {
        wanted: Some(5),
        ..long_ag
    }
    .encode();
    assert!(Agreement::decode(&kept).unwrap().common.contains(&5));
    // A decision round-trips, and a malformed one is refused.
    let mut ag = ag;
    ag.foreign = Some((9, 4));
    ag.blind = (0..100)
        .map(|r| (r, format!("L3: down {r}"), r % 3 == 0))
        .collect();
    let b = ag.encode();
    let back = Agreement::decode(&b).unwrap();
    assert_eq!(back.common, ag.common);
    assert_eq!(back.foreign, ag.foreign);
    assert_eq!(back.blind.len(), 2 * MAX_BLIND);
    assert_eq!(back.blind[0], ag.blind[0], "the first blind tier is kept");
    assert!(back.blind.iter().filter(|b| b.2).count() == MAX_BLIND);
    for cut in 0..b.len() {
        assert!(Agreement::decode(&b[..cut]).is_none(), "cut {cut}");
    }
    let mut huge = b.clone();
    huge[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(Agreement::decode(&huge).is_none());
}

#[test]
fn a_step_committed_by_some_ranks_is_common_to_those_holding_its_manifest() {
    let a = Holdings {
        committed: set(&[4, 5]),
        ..Holdings::default()
    };
    let b = Holdings {
        committed: set(&[4]),
        partial: set(&[5, 6]),
        ..Holdings::default()
    };
    let ag = Agreement::of(&[a.clone(), b]).unwrap();
    assert_eq!(
        ag.common,
        set(&[4, 5]),
        "6 was never committed: not decided"
    );
    assert_eq!(ag.decided, set(&[4, 5]));
    // A rank without the manifest (its disk was lost) cannot roll it
    // forward: the step is not common.
    let c = Holdings {
        committed: set(&[4]),
        ..Holdings::default()
    };
    assert_eq!(Agreement::of(&[a, c]).unwrap().common, set(&[4]));
}

#[test]
fn an_unreadable_tier_fails_every_rank_when_it_may_hide_a_newer_step() {
    let a = Holdings {
        committed: set(&[4]),
        ..Holdings::default()
    };
    // Rank 1 lost its disk and cannot list L3: its steps may be there.
    let lost = Holdings {
        unreadable: Some("L3: dns error".into()),
        l1_empty: true,
        ..Holdings::default()
    };
    let ag = Agreement::of(&[a.clone(), lost]).unwrap();
    let e = ag.check_blind(None).unwrap_err();
    assert!(matches!(e, Error::TierUnavailable { .. }), "{e}");
    assert_eq!(e.kind(), crate::ErrorKind::Unavailable);
    assert!(e.to_string().contains("L3 (seen by rank 1)"), "{e}");
    // Its disk holds step 3, another rank holds 4: 4 may be on L3.
    let behind = Holdings {
        committed: set(&[3]),
        unreadable: Some("L2 node-b: refused".into()),
        ..Holdings::default()
    };
    let a34 = Holdings {
        committed: set(&[3, 4]),
        ..Holdings::default()
    };
    let ag = Agreement::of(&[a34.clone(), behind]).unwrap();
    assert!(ag.check_blind(None).is_err());
    assert!(ag.check_blind(Some(3)).is_ok(), "an explicit common step");
    // Its disk holds the newest step every rank holds: a dead peer
    // (the usual restart after a node died) hides nothing.
    let current = Holdings {
        committed: set(&[3, 4]),
        unreadable: Some("L2 node-b: refused".into()),
        ..Holdings::default()
    };
    assert!(Agreement::of(&[a34, current])
        .unwrap()
        .check_blind(None)
        .is_ok());
}

#[test]
fn a_newer_step_of_another_world_size_is_an_error_naming_both() {
    let cfg = Config::builder().rank(0, 1);
    let ag = Agreement {
        common: set(&[3]),
        decided: set(&[3]),
        foreign: Some((7, 2)),
        blind: Vec::new(),
        widen: false,
        l3: None,
        wanted: None,
        ready: None,
    };
    let e = ag.check_world(&cfg, None).unwrap_err();
    assert!(e.to_string().contains("world of 2"), "{e}");
    assert!(e.to_string().contains("runs 1"), "{e}");
    assert!(
        ag.check_world(&cfg, Some(3)).is_ok(),
        "an explicit older step"
    );
    let older = Agreement {
        foreign: Some((2, 2)),
        ..ag
    };
    assert!(older.check_world(&cfg, None).is_ok());
}

#[test]
fn a_decision_is_ready_only_when_every_rank_checked_the_step_it_picks() {
    let h = |committed: &[u64], checked: Option<u64>| Holdings {
        committed: set(committed),
        checked,
        ..Holdings::default()
    };
    // Every rank checked step 5, the newest common one.
    let all = [h(&[4, 5], Some(5)), h(&[4, 5], Some(5))];
    let ag = Agreement::of(&all).unwrap().asked(None);
    assert_eq!(ag.ready, Some(5));
    let back = Agreement::decode(&ag.encode()).unwrap();
    assert_eq!((back.ready, back.common.clone()), (Some(5), set(&[4, 5])));
    // A payload carries what its rank checked.
    assert_eq!(Holdings::decode(&all[0].encode()), Some(all[0].clone()));
    // One rank could not check it: the ranks ask each other.
    let one_failed = [h(&[4, 5], Some(5)), h(&[4, 5], None)];
    assert_eq!(Agreement::of(&one_failed).unwrap().asked(None).ready, None);
    // Each checked another step (rank 1 holds 6 only as a manifest: 5 is
    // the newest common step, and rank 0 checked 6).
    let apart = [h(&[4, 5, 6], Some(6)), h(&[4, 5], Some(5))];
    assert_eq!(Agreement::of(&apart).unwrap().asked(None).ready, None);
    // Every rank checked 5, but step 4 was asked for.
    let ag = Agreement::of(&all).unwrap().asked(Some(4));
    assert_eq!((ag.target(), ag.ready), (Some(4), None));
    // A decision without it is the same bytes as a build before it sent.
    let plain = Agreement::of(&one_failed).unwrap();
    assert_eq!(plain.encode()[0], 0);
    // A first byte with an unknown bit, or a cut step, is refused.
    let mut b = Agreement::of(&all).unwrap().asked(None).encode();
    for cut in 1..9 {
        assert!(Agreement::decode(&b[..cut]).is_none(), "cut {cut}");
    }
    b[0] |= 4;
    assert!(Agreement::decode(&b).is_none());
}
