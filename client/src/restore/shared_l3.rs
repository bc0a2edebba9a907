//! One listing of L3 per restore for the whole job.
//!
//! L3 is one store that every rank sees alike, and listing it is costly: a
//! listing of the steps, one of each step, and a read of every commit
//! record (one per rank and step). When every rank listed it at every
//! restore, a job of N ranks sent N listings against one prefix (an
//! object store answers such a storm with throttling) and N² record reads.
//! Now rank [`LISTER`] lists L3 and puts in its restore round's payload
//! which ranks each step of this world is committed for there
//! ([`L3View`]); the decision carries that view back to every rank. The
//! other ranks list only their own tiers (L1, their node's peers), count
//! the view's steps as theirs where it names them, and a rank that must
//! read its shard from L3 reads its own commit record there directly (one
//! request, `ChunkStore::get_commit_record`).

use std::collections::{BTreeMap, BTreeSet};

use strata_tiered::StepInfo;

use crate::config::Config;
use crate::restore::payload::Reader;

/// The rank that lists L3 for the job at a restore.
pub(crate) use crate::coord::commit::L3_LISTER as LISTER;

/// Longest reason carried for an L3 that could not be listed.
const MAX_WHY: usize = 512;

/// A set of ranks as sorted, disjoint, half-open ranges: a step every rank
/// committed is one range whatever the world.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ranks(Vec<(u32, u32)>);

impl Ranks {
    /// The ranges of `ranks`.
    pub(crate) fn of(ranks: &BTreeSet<u32>) -> Ranks {
        let mut out: Vec<(u32, u32)> = Vec::new();
        for &r in ranks {
            match out.last_mut() {
                Some((_, end)) if *end == r => *end = r + 1,
                _ => out.push((r, r + 1)),
            }
        }
        Ranks(out)
    }

    /// Whether `rank` is in the set.
    pub(crate) fn contains(&self, rank: u32) -> bool {
        let i = self.0.partition_point(|&(start, _)| start <= rank);
        i > 0 && rank < self.0[i - 1].1
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Encodes as ranges or as a bitmap, whichever is shorter (a step
    /// committed by every other rank costs world / 8 bytes, not 4 per rank).
    fn encode(&self, out: &mut Vec<u8>) {
        let end = self.0.last().map_or(0, |&(_, e)| e);
        let as_ranges = 4 + 8 * self.0.len();
        let as_bitmap = 4 + end.div_ceil(8) as usize;
        if as_ranges <= as_bitmap {
            out.push(0);
            out.extend_from_slice(&(self.0.len() as u32).to_le_bytes());
            for &(s, e) in &self.0 {
                out.extend_from_slice(&s.to_le_bytes());
                out.extend_from_slice(&e.to_le_bytes());
            }
        } else {
            out.push(1);
            out.extend_from_slice(&end.to_le_bytes());
            let mut bits = vec![0u8; end.div_ceil(8) as usize];
            for &(s, e) in &self.0 {
                for r in s..e {
                    bits[(r / 8) as usize] |= 1 << (r % 8);
                }
            }
            out.extend_from_slice(&bits);
        }
    }

    /// What [`Ranks::encode`] wrote; `None` when malformed (ranges out of
    /// order, a count or length past the payload).
    fn decode(r: &mut Reader<'_>) -> Option<Ranks> {
        match r.take(1)? {
            [0] => {
                let n = r.u32()? as usize;
                if n > r.left() / 8 {
                    return None;
                }
                let mut out: Vec<(u32, u32)> = Vec::with_capacity(n);
                for _ in 0..n {
                    let (s, e) = (r.u32()?, r.u32()?);
                    if s >= e || out.last().is_some_and(|&(_, pe)| s <= pe) {
                        return None;
                    }
                    out.push((s, e));
                }
                Some(Ranks(out))
            }
            [1] => {
                let end = r.u32()?;
                let bits = r.take(end.div_ceil(8) as usize)?;
                // Straight to ranges: never more than one per set bit, and
                // no set of every rank on the way.
                let mut out: Vec<(u32, u32)> = Vec::new();
                for i in (0..end).filter(|&i| bits[(i / 8) as usize] & (1 << (i % 8)) != 0) {
                    match out.last_mut() {
                        Some((_, e)) if *e == i => *e = i + 1,
                        _ => out.push((i, i + 1)),
                    }
                }
                Some(Ranks(out))
            }
            _ => None,
        }
    }
}

/// L3 as the lister saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum L3View {
    /// For each step of this world some rank committed in L3: the ranks
    /// whose readable commit record L3 holds.
    Listed(BTreeMap<u64, Ranks>),
    /// L3 could not be listed (`"tier: why"`).
    Unreadable(String),
}

impl L3View {
    /// The view of a listing of L3, for a job of `cfg`'s world size.
    pub(crate) fn of(cfg: &Config, steps: &[StepInfo]) -> L3View {
        L3View::Listed(
            steps
                .iter()
                .filter(|st| st.world_size() == Some(cfg.world_size))
                .map(|st| (st.step, Ranks::of(&st.committed_ranks())))
                .filter(|(_, ranks)| !ranks.is_empty())
                .collect(),
        )
    }

    /// Steps some rank committed in L3.
    pub(crate) fn steps(&self) -> BTreeSet<u64> {
        match self {
            L3View::Listed(m) => m.keys().copied().collect(),
            L3View::Unreadable(_) => BTreeSet::new(),
        }
    }

    /// Steps `rank` committed in L3.
    pub(crate) fn steps_of(&self, rank: u32) -> BTreeSet<u64> {
        match self {
            L3View::Listed(m) => m
                .iter()
                .filter(|(_, r)| r.contains(rank))
                .map(|(&s, _)| s)
                .collect(),
            L3View::Unreadable(_) => BTreeSet::new(),
        }
    }

    /// Only the steps `keep` says (a round's window, a decision's steps).
    pub(crate) fn only(&self, keep: impl Fn(u64) -> bool) -> L3View {
        match self {
            L3View::Listed(m) => L3View::Listed(
                m.iter()
                    .filter(|(&s, _)| keep(s))
                    .map(|(&s, r)| (s, r.clone()))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            L3View::Listed(m) => {
                out.push(0);
                out.extend_from_slice(&(m.len() as u32).to_le_bytes());
                for (s, ranks) in m {
                    out.extend_from_slice(&s.to_le_bytes());
                    ranks.encode(out);
                }
            }
            L3View::Unreadable(why) => {
                out.push(1);
                let mut n = why.len().min(MAX_WHY);
                while !why.is_char_boundary(n) {
                    n -= 1;
                }
                out.extend_from_slice(&(n as u16).to_le_bytes());
                out.extend_from_slice(&why.as_bytes()[..n]);
            }
        }
    }

    /// What [`L3View::encode`] wrote, from the front of `b`; returns the
    /// view and the bytes after it. `None` when malformed.
    pub(crate) fn decode(b: &[u8]) -> Option<(L3View, &[u8])> {
        let mut r = Reader(b);
        let view = match r.take(1)? {
            [0] => {
                let n = r.u32()? as usize;
                if n > r.left() / 9 {
                    return None;
                }
                let mut m = BTreeMap::new();
                for _ in 0..n {
                    let step = r.u64()?;
                    if m.insert(step, Ranks::decode(&mut r)?).is_some() {
                        return None;
                    }
                }
                L3View::Listed(m)
            }
            [1] => {
                let n = u16::from_le_bytes(r.take(2)?.try_into().ok()?) as usize;
                L3View::Unreadable(String::from_utf8_lossy(r.take(n)?).into_owned())
            }
            _ => return None,
        };
        Some((view, r.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore::agreement::{Agreement, Holdings};

    fn ranks(v: impl IntoIterator<Item = u32>) -> Ranks {
        Ranks::of(&v.into_iter().collect())
    }

    fn round_trip(v: &L3View) -> L3View {
        let mut b = Vec::new();
        v.encode(&mut b);
        b.push(0xEE);
        let (back, rest) = L3View::decode(&b).unwrap();
        assert_eq!(rest, [0xEE], "the bytes after the view are left");
        back
    }

    #[test]
    fn rank_sets_are_ranges_or_a_bitmap_and_round_trip() {
        let all = ranks(0..16_384);
        assert_eq!(all.0, vec![(0, 16_384)]);
        assert!(all.contains(0) && all.contains(16_383) && !all.contains(16_384));
        let holes = ranks([0, 1, 2, 7, 9, 10]);
        assert!(holes.contains(9) && !holes.contains(8) && !holes.contains(3));
        // Every other rank of 16,384: a bitmap (2 KiB), not 8 KiB ranges.
        let odd = ranks((0..16_384).filter(|r| r % 2 == 1));
        let mut b = Vec::new();
        odd.encode(&mut b);
        assert!(b.len() < 2_100, "{}", b.len());
        let view = L3View::Listed(BTreeMap::from([(4, all), (5, holes), (6, odd)]));
        assert_eq!(round_trip(&view), view);
        let mut b = Vec::new();
        view.encode(&mut b);
        for cut in 0..b.len() {
            assert!(L3View::decode(&b[..cut]).is_none(), "cut {cut}");
        }
        let down = L3View::Unreadable("L3: connection refused ".repeat(100));
        match round_trip(&down) {
            L3View::Unreadable(w) => assert_eq!(w.len(), MAX_WHY),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_views_are_refused_without_allocating() {
        // A huge step count, a huge range count, overlapping ranges.
        let mut huge = vec![0u8];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(L3View::decode(&huge).is_none());
        let mut b = vec![0u8];
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&3u64.to_le_bytes());
        b.push(0);
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(L3View::decode(&b).is_none());
        let mut b = vec![0u8];
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&3u64.to_le_bytes());
        b.push(0);
        b.extend_from_slice(&2u32.to_le_bytes());
        for v in [0u32, 5, 4, 6] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        assert!(L3View::decode(&b).is_none(), "overlapping ranges");
        assert!(L3View::decode(&[7]).is_none(), "unknown tag");
    }

    #[test]
    fn a_listing_becomes_the_ranks_committed_per_step_of_this_world() {
        use strata_format::{CommitRecord, ShardRef};
        let rec = |step: u64, world: u32, rank: u32| CommitRecord {
            job: "j".into(),
            step,
            world_size: world,
            committed_unix_ms: 1,
            shards: vec![ShardRef {
                rank,
                manifest: strata_format::ChunkId::of(b"m"),
                logical_bytes: 1,
            }],
        };
        let info = |step: u64, recs: Vec<CommitRecord>| StepInfo {
            step,
            records: recs.into_iter().map(|r| (r.shards[0].rank, r)).collect(),
            ..StepInfo::default()
        };
        let cfg = Config::builder().rank(1, 2);
        let steps = vec![
            info(3, vec![rec(3, 2, 0), rec(3, 2, 1)]),
            info(4, vec![rec(4, 2, 0)]),
            info(5, vec![rec(5, 4, 1)]),
            info(6, vec![]),
        ];
        let v = L3View::of(&cfg, &steps);
        assert_eq!(
            v.steps(),
            BTreeSet::from([3, 4]),
            "other worlds, no records: out"
        );
        assert_eq!(v.steps_of(1), BTreeSet::from([3]));
        assert_eq!(v.steps_of(0), BTreeSet::from([3, 4]));
        assert_eq!(v.only(|s| s > 3).steps(), BTreeSet::from([4]));
    }

    #[test]
    fn ranks_that_left_l3_to_the_lister_count_its_steps_as_theirs() {
        // L1s hold step 3; L3 holds 4 of every rank, and 5 without rank 1.
        let view = L3View::Listed(BTreeMap::from([
            (4, Ranks::of(&set32(&[0, 1, 2]))),
            (5, Ranks::of(&set32(&[0, 2]))),
        ]));
        let lister = Holdings {
            committed: set(&[3, 4, 5]),
            l3: Some(view),
            ..Holdings::default()
        };
        let other = Holdings {
            committed: set(&[3]),
            l3_deferred: true,
            ..Holdings::default()
        };
        let ag = Agreement::of(&[lister.clone(), other.clone(), other.clone()]).unwrap();
        assert_eq!(ag.common, set(&[3, 4]), "5 is not in L3 for rank 1");
        assert_eq!(ag.decided, set(&[3, 4, 5]));
        assert_eq!(ag.l3.as_ref().unwrap().steps_of(1), set(&[4]));
        for h in [&lister, &other, &lister.compact(None)] {
            assert_eq!(Holdings::decode(&h.encode()).as_ref(), Some(h));
        }
        let back = Agreement::decode(&ag.encode()).unwrap();
        assert_eq!(back.l3, ag.l3);
        // Without a deferring rank, the decision is what an older build
        // reads: no view appended.
        let alone = Agreement::of(std::slice::from_ref(&lister)).unwrap();
        assert!(alone.l3.is_none());
        // The lister could not list L3: every rank is as blind, and a rank
        // whose L1 is empty fails the restore on all, naming the lister.
        let down = Holdings {
            committed: set(&[3]),
            l3: Some(L3View::Unreadable("L3: connection refused".into())),
            ..Holdings::default()
        };
        let lost = Holdings {
            l1_empty: true,
            l3_deferred: true,
            ..Holdings::default()
        };
        let e = Agreement::of(&[down.clone(), other.clone(), lost.clone()])
            .unwrap()
            .check_blind(None)
            .unwrap_err();
        assert!(e.to_string().contains("L3 (seen by rank 0)"), "{e}");
        assert!(e.to_string().contains("connection refused"), "{e}");
        let fine = Agreement::of(&[down, other.clone(), other.clone()]).unwrap();
        assert!(
            fine.check_blind(None).is_ok(),
            "every L1 holds the newest step"
        );
        // A lister that sent no view (a build without shared listings):
        // the ranks that left L3 to it are blind to it.
        let old = Holdings {
            committed: set(&[3]),
            ..Holdings::default()
        };
        let ag = Agreement::of(&[old, other, lost]).unwrap();
        assert!(ag.blind[0].1.contains("sent no listing"), "{:?}", ag.blind);
        assert!(ag.check_blind(None).is_err());
    }

    fn set32(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    fn set(v: &[u64]) -> BTreeSet<u64> {
        v.iter().copied().collect()
    }
}
