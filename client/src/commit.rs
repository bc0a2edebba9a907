//! The commit protocol, in one place (its states are written down in
//! `docs/commit-protocol.md`):
//!
//! 1. **Shard committed in a tier**: the rank's chunks are durable there,
//!    then its manifest, then its create-only commit record.
//! 2. **Step committed**: every rank voted that its shard is durable on L1
//!    ([`check_votes`]: exactly `world_size` votes, each rank once, all yes).
//!    Only then does a rank write its commit record, so a rank's own record
//!    proves the step committed by every rank. Subscribers (the uploader,
//!    the replicator) hear of it through [`CommitEvents`].
//! 3. **Retired**: a step leaves a tier only when this rank's record says
//!    it was committed, and then only this rank's files
//!    (`ChunkStore::delete_shard`, a retiring marker first).
//!
//! Restore: each rank lists what it can serve ([`restorable`]), the ranks
//! intersect their lists ([`agree`]), and a step found unreadable on some
//! rank is dropped and the next one tried.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use strata_format::{CommitRecord, ShardManifest, ShardRef};
use strata_tiered::StepInfo;

use crate::config::Config;
use crate::coordinator::Coordinator;
use crate::error::{Error, Result};

/// One rank's vote at a step's commit barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Vote {
    /// The rank's shard is durable on L1.
    pub(crate) ok: bool,
    /// The rank's upload policy wants this step on L3. Only rank 0's vote
    /// counts, so every rank decides the same (no rank trusts another's
    /// clock: they follow one rank's decision).
    pub(crate) upload: bool,
}

impl Vote {
    fn encode(self) -> Vec<u8> {
        vec![u8::from(self.ok), u8::from(self.upload)]
    }

    fn decode(b: &[u8]) -> Option<Vote> {
        match b {
            [ok @ (0 | 1), up @ (0 | 1)] => Some(Vote {
                ok: *ok == 1,
                upload: *up == 1,
            }),
            // A rank of an older build votes with one byte.
            [ok @ (0 | 1)] => Some(Vote {
                ok: *ok == 1,
                upload: false,
            }),
            _ => None,
        }
    }
}

/// What the barrier decided for a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    /// Upload the step to L3 (the same on every rank).
    pub(crate) upload: bool,
}

/// The barrier: exchanges this rank's vote with every rank and checks the
/// result. Every rank votes, failed or not, so nobody waits for a rank that
/// gave up.
pub(crate) fn barrier(
    coord: &dyn Coordinator,
    cfg: &Config,
    step: u64,
    vote: Vote,
) -> Result<Decision> {
    let votes = coord.all_gather(
        cfg.rank,
        &format!("commit/{}/{step}", cfg.job),
        vote.encode(),
        Duration::from_secs(cfg.coordination_timeout_secs),
    )?;
    check_votes(step, cfg.world_size, &votes)
}

/// Checks a barrier's votes: exactly `world` of them (the coordinator
/// returns them by rank, so each rank once), each well formed and yes. A
/// coordinator that returns fewer, more or malformed votes is an error,
/// never a commit.
pub(crate) fn check_votes(step: u64, world: u32, votes: &[Vec<u8>]) -> Result<Decision> {
    if votes.len() != world as usize {
        return Err(Error::Coordination(format!(
            "step {step}: the coordinator returned {} votes for a world of {world}; step not committed",
            votes.len()
        )));
    }
    let mut decoded = Vec::with_capacity(votes.len());
    for (rank, v) in votes.iter().enumerate() {
        let vote = Vote::decode(v).ok_or_else(|| {
            Error::Coordination(format!(
                "step {step}: rank {rank}'s vote is malformed ({} bytes); step not committed",
                v.len()
            ))
        })?;
        if !vote.ok {
            return Err(Error::Coordination(format!(
                "step {step}: rank {rank} failed to persist its shard; step not committed"
            )));
        }
        decoded.push(vote);
    }
    Ok(Decision {
        upload: decoded.first().is_some_and(|v| v.upload),
    })
}

/// This rank's commit record for its shard of `step`.
pub(crate) fn record(
    cfg: &Config,
    step: u64,
    manifest_bytes: &[u8],
    manifest: &ShardManifest,
    now_ms: u64,
) -> CommitRecord {
    CommitRecord {
        job: cfg.job.clone(),
        step,
        world_size: cfg.world_size,
        committed_unix_ms: now_ms,
        shards: vec![ShardRef {
            rank: cfg.rank,
            manifest: ShardManifest::id_of(manifest_bytes),
            logical_bytes: manifest.logical_bytes(),
        }],
    }
}

/// The steps this rank committed in a tier, in a world of the configured
/// size: the steps it can restore from there.
pub(crate) fn restorable(cfg: &Config, steps: &[StepInfo]) -> BTreeSet<u64> {
    steps
        .iter()
        .filter(|st| {
            st.committed_ranks().contains(&cfg.rank) && st.world_size() == Some(cfg.world_size)
        })
        .map(|st| st.step)
        .collect()
}

/// Step agreement: the steps every rank can restore (the intersection of
/// what each rank can serve). `key` names the round.
pub(crate) fn agree(
    coord: &dyn Coordinator,
    cfg: &Config,
    key: &str,
    mine: &BTreeSet<u64>,
) -> Result<BTreeSet<u64>> {
    let payload: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
    let all = coord.all_gather(
        cfg.rank,
        key,
        payload,
        Duration::from_secs(cfg.coordination_timeout_secs),
    )?;
    if all.len() != cfg.world_size as usize {
        return Err(Error::Coordination(format!(
            "{key}: the coordinator returned {} answers for a world of {}",
            all.len(),
            cfg.world_size
        )));
    }
    let mut common = mine.clone();
    for (r, v) in all.iter().enumerate() {
        if v.len() % 8 != 0 {
            return Err(Error::Coordination(format!(
                "{key}: rank {r} sent a malformed step list"
            )));
        }
        let theirs: BTreeSet<u64> = v
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
            .collect();
        common = common.intersection(&theirs).copied().collect();
        if common.is_empty() {
            return Err(Error::NothingToRestore(Some(format!(
                "rank {r} shares no committed step with rank {}",
                cfg.rank
            ))));
        }
    }
    Ok(common)
}

/// Whether every rank could use the step it was asked to restore: each
/// rank says yes or no, and the step is used only if all say yes.
pub(crate) fn all_ready(
    coord: &dyn Coordinator,
    cfg: &Config,
    key: &str,
    ok: bool,
) -> Result<bool> {
    let all = coord.all_gather(
        cfg.rank,
        key,
        vec![u8::from(ok)],
        Duration::from_secs(cfg.coordination_timeout_secs),
    )?;
    if all.len() != cfg.world_size as usize {
        return Err(Error::Coordination(format!(
            "{key}: the coordinator returned {} answers for a world of {}",
            all.len(),
            cfg.world_size
        )));
    }
    Ok(all.iter().all(|v| v.as_slice() == [1]))
}

/// The steps this rank knows committed in some tier: what a listing of
/// the tiers found, plus what this process committed since (whichever came
/// first: a commit noted while the listing runs is kept).
#[derive(Default)]
pub(crate) struct KnownCommitted {
    /// (listed, or None before the listing; noted by this process).
    inner: Mutex<(Option<BTreeSet<u64>>, BTreeSet<u64>)>,
}

impl KnownCommitted {
    /// Notes a step this rank committed.
    pub(crate) fn note(&self, step: u64) {
        if let Ok(mut g) = self.inner.lock() {
            g.1.insert(step);
        }
    }

    /// Records a listing (the first one wins; later ones add).
    pub(crate) fn fill(&self, listed: BTreeSet<u64>) {
        if let Ok(mut g) = self.inner.lock() {
            g.0.get_or_insert_with(BTreeSet::new).extend(listed);
        }
    }

    /// Whether `step` is known committed; None before any listing.
    pub(crate) fn contains(&self, step: u64) -> Option<bool> {
        let g = self.inner.lock().ok()?;
        if g.1.contains(&step) {
            return Some(true);
        }
        Some(g.0.as_ref()?.contains(&step))
    }
}

/// A subscriber: called once per committed step, on the save path's
/// thread, before retention runs; it should only queue work (and mark the
/// step as pinned) for a worker of its own.
pub(crate) type Subscriber = Box<dyn Fn(Committed) + Send + Sync>;

/// "Step committed" events, for the workers that act on them (the
/// uploader, the replicator): the save path publishes, it never calls them.
#[derive(Default)]
pub(crate) struct CommitEvents {
    subscribers: Mutex<Vec<Subscriber>>,
}

/// A step this rank committed on L1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Committed {
    /// The step.
    pub(crate) step: u64,
    /// What the barrier decided for it.
    pub(crate) decision: Decision,
}

impl CommitEvents {
    /// Adds a subscriber.
    pub(crate) fn subscribe(&self, f: Subscriber) {
        if let Ok(mut s) = self.subscribers.lock() {
            s.push(f);
        }
    }

    /// Tells every subscriber.
    pub(crate) fn publish(&self, ev: Committed) {
        if let Ok(s) = self.subscribers.lock() {
            for f in s.iter() {
                f(ev);
            }
        }
    }

    /// Drops every subscriber (and the queues they hold): their workers
    /// finish what was queued, then stop.
    pub(crate) fn close(&self) {
        if let Ok(mut s) = self.subscribers.lock() {
            s.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn votes_must_be_exactly_the_world_each_yes() {
        let yes = Vote {
            ok: true,
            upload: true,
        }
        .encode();
        let no_up = Vote {
            ok: true,
            upload: false,
        }
        .encode();
        let d = check_votes(3, 2, &[yes.clone(), no_up.clone()]).unwrap();
        assert!(d.upload, "rank 0's decision is everyone's");
        let d = check_votes(3, 2, &[no_up.clone(), yes.clone()]).unwrap();
        assert!(!d.upload);
        // Fewer, more, malformed or failed votes never commit.
        assert!(check_votes(3, 2, std::slice::from_ref(&yes)).is_err());
        assert!(check_votes(3, 2, &[yes.clone(), yes.clone(), yes.clone()]).is_err());
        assert!(check_votes(3, 2, &[yes.clone(), vec![]]).is_err());
        assert!(check_votes(3, 2, &[yes.clone(), vec![7, 7]]).is_err());
        let failed = Vote {
            ok: false,
            upload: false,
        }
        .encode();
        let e = check_votes(3, 2, &[yes, failed]).unwrap_err();
        assert!(e.to_string().contains("rank 1 failed"), "{e}");
    }

    #[test]
    fn events_reach_every_subscriber_until_closed() {
        let ev = CommitEvents::default();
        let (ta, a) = mpsc::channel();
        let (tb, b) = mpsc::channel();
        let ta = Mutex::new(ta);
        let tb = Mutex::new(tb);
        ev.subscribe(Box::new(move |c| {
            let _ = ta.lock().map(|t| t.send(c));
        }));
        ev.subscribe(Box::new(move |c| {
            let _ = tb.lock().map(|t| t.send(c));
        }));
        let c = Committed {
            step: 4,
            decision: Decision { upload: true },
        };
        ev.publish(c);
        assert_eq!(a.recv().unwrap(), c);
        assert_eq!(b.recv().unwrap(), c);
        ev.close();
        ev.publish(c);
        assert!(
            a.recv().is_err(),
            "closed: the subscriber and its queue are gone"
        );
    }
}
