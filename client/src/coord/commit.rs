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
//! combine their lists (`crate::restore::agreement`: a step some rank committed is
//! decided, and a rank holding only its manifest rolls it forward), and a
//! step found unreadable on some rank is dropped and the next one tried.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use strata_format::{CommitRecord, ShardManifest, ShardRef};
use strata_tiered::StepInfo;

use crate::config::Config;
use crate::coord::coordinator::Coordinator;
use crate::coord::verdict;
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
    /// The rank already holds this step committed (it refused to save it
    /// again): the step was decided at an earlier barrier, and the ranks
    /// that saved it again keep the shard they voted for then.
    pub(crate) already: bool,
}

impl Vote {
    fn encode(self) -> Vec<u8> {
        // Two bytes unless `already`: a rank of an older build (which
        // reads one or two) then still reads every ordinary vote.
        let mut v = vec![u8::from(self.ok), u8::from(self.upload)];
        if self.already {
            v.push(1);
        }
        v
    }

    fn decode(b: &[u8]) -> Option<Vote> {
        let bit = |v: u8| (v <= 1).then_some(v == 1);
        match *b {
            [ok, up, already] => Some(Vote {
                ok: bit(ok)?,
                upload: bit(up)?,
                already: bit(already)?,
            }),
            // A rank of an older build votes with two bytes, or one.
            [ok, up] => Some(Vote {
                ok: bit(ok)?,
                upload: bit(up)?,
                already: false,
            }),
            [ok] => Some(Vote {
                ok: bit(ok)?,
                upload: false,
                already: false,
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
    /// The step was decided at an earlier barrier: this rank `rank` holds
    /// it committed already. A rank that saved it again must not commit its
    /// new shard; it keeps (and commits) the one it voted for then.
    pub(crate) decided_before: Option<u32>,
}

/// The barrier: sends this rank's vote, and gets back the decision one
/// rank made from every vote ([`check_votes`], through
/// [`Coordinator::all_reduce`]): the same on every rank. Every rank
/// votes, failed or not, so nobody waits for a rank that gave up.
pub(crate) fn barrier(
    coord: &dyn Coordinator,
    cfg: &Config,
    step: u64,
    vote: Vote,
) -> Result<Decision> {
    let key = format!("commit/{}/{step}", cfg.job);
    let world = cfg.world_size;
    let decided = coord.all_reduce(
        cfg.rank,
        &key,
        vote.encode(),
        Duration::from_secs(cfg.coordination_timeout_secs),
        &move |votes| verdict::encode(check_votes(step, world, votes).map(Decision::encode)),
    )?;
    Decision::decode(verdict::decode(&key, &decided)?).ok_or_else(|| {
        Error::Coordination(format!(
            "{key}: the coordinator returned a malformed decision"
        ))
    })
}

impl Decision {
    fn encode(self) -> Vec<u8> {
        let mut out = vec![u8::from(self.upload)];
        if let Some(r) = self.decided_before {
            out.extend_from_slice(&r.to_le_bytes());
        }
        out
    }

    fn decode(b: &[u8]) -> Option<Decision> {
        let upload = match b.first()? {
            0 => false,
            1 => true,
            _ => return None,
        };
        let decided_before = match b.len() {
            1 => None,
            5 => Some(u32::from_le_bytes(b[1..5].try_into().ok()?)),
            _ => return None,
        };
        Some(Decision {
            upload,
            decided_before,
        })
    }
}

/// Checks a barrier's votes: exactly `world` of them (the coordinator
/// returns them by rank, so each rank once), each well formed and yes. A
/// coordinator that returns fewer, more or malformed votes is an error,
/// never a commit. A rank that already holds the step committed decides it
/// for everyone ([`Decision::decided_before`]), whatever the others voted
/// now: the step was decided at an earlier barrier.
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
        decoded.push(vote);
    }
    if let Some(r) = decoded.iter().position(|v| v.already) {
        return Ok(Decision {
            upload: false,
            decided_before: Some(r as u32),
        });
    }
    if let Some(rank) = decoded.iter().position(|v| !v.ok) {
        return Err(Error::Coordination(format!(
            "step {step}: rank {rank} failed to persist its shard; step not committed"
        )));
    }
    Ok(Decision {
        upload: decoded.first().is_some_and(|v| v.upload),
        decided_before: None,
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
    record_of(
        &cfg.job,
        cfg.world_size,
        cfg.rank,
        step,
        manifest_bytes,
        manifest,
        now_ms,
    )
}

/// Rank `rank`'s commit record for its shard of `step` in a world of
/// `world`: it names the manifest by the BLAKE3 of its bytes.
pub(crate) fn record_of(
    job: &str,
    world: u32,
    rank: u32,
    step: u64,
    manifest_bytes: &[u8],
    manifest: &ShardManifest,
    now_ms: u64,
) -> CommitRecord {
    CommitRecord {
        job: job.to_string(),
        step,
        world_size: world,
        committed_unix_ms: now_ms,
        shards: vec![ShardRef {
            rank,
            manifest: ShardManifest::id_of(manifest_bytes),
            logical_bytes: manifest.logical_bytes(),
        }],
    }
}

/// The rank that lists L3 for the whole job, at a restore and at a first
/// save (`restore::shared_l3`, `Shared::list_committed`): the others
/// leave L3 to it.
pub(crate) const L3_LISTER: u32 = 0;

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

/// Whether every rank could use the step it was asked to restore: each
/// rank says yes or no, and the step is used only if all say yes (one
/// rank decides, every rank gets the same answer).
pub(crate) fn all_ready(
    coord: &dyn Coordinator,
    cfg: &Config,
    key: &str,
    ok: bool,
) -> Result<bool> {
    let mine = if ok {
        Readiness::Usable
    } else {
        Readiness::Unusable
    };
    Ok(restore_ready(coord, cfg, key, mine)? == Readiness::Usable)
}

/// What a rank says of the step every rank was asked to restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Its manifest is loaded and checked.
    Usable,
    /// Not usable here (a bad manifest, no copy): try an older step.
    Unusable,
    /// A tier that holds its shard cannot be read: an older step would
    /// silently lose the newer ones, so every rank stops.
    Blind,
}

/// Whether a step every rank was asked to restore (or to roll back) can
/// be used: usable on every rank, or some rank is blind to a tier holding
/// its shard (every rank stops), or not usable somewhere (every rank tries
/// an older step). The same on every rank: one rank decides. ([`all_ready`]
/// is its yes-or-no form.)
pub(crate) fn restore_ready(
    coord: &dyn Coordinator,
    cfg: &Config,
    key: &str,
    mine: Readiness,
) -> Result<Readiness> {
    let code = |r: Readiness| match r {
        Readiness::Unusable => 0u8,
        Readiness::Usable => 1,
        Readiness::Blind => 2,
    };
    let decided = coord.all_reduce(
        cfg.rank,
        key,
        vec![code(mine)],
        Duration::from_secs(cfg.coordination_timeout_secs),
        &|all| {
            let blind = all.iter().any(|v| v.as_slice() == [2]);
            let usable = all.iter().all(|v| v.as_slice() == [1]);
            vec![if blind { 2 } else { u8::from(usable) }]
        },
    )?;
    match decided.as_slice() {
        [0] => Ok(Readiness::Unusable),
        [1] => Ok(Readiness::Usable),
        [2] => Ok(Readiness::Blind),
        _ => Err(Error::Coordination(format!(
            "{key}: the coordinator returned a malformed decision"
        ))),
    }
}

/// The steps this rank knows committed in some tier: what a listing of
/// the tiers found, plus what this process committed since (whichever came
/// first: a commit noted while the listing runs is kept).
#[derive(Default)]
pub(crate) struct KnownCommitted {
    /// (listed, or None before the listing; noted by this process;
    /// deletions forgotten so far).
    inner: Mutex<(Option<BTreeSet<u64>>, BTreeSet<u64>, u64)>,
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

    /// Forgets steps deleted from every tier (they may be saved again).
    pub(crate) fn forget(&self, steps: &BTreeSet<u64>) {
        self.forget_where(&|s| steps.contains(&s));
    }

    /// Forgets every step `gone` selects.
    pub(crate) fn forget_where(&self, gone: &dyn Fn(u64) -> bool) {
        if let Ok(mut g) = self.inner.lock() {
            if let Some(listed) = g.0.as_mut() {
                listed.retain(|&s| !gone(s));
            }
            g.1.retain(|&s| !gone(s));
            g.2 += 1;
        }
    }

    /// How many deletions were forgotten so far (for
    /// [`Self::fill_unless_forgotten_since`]).
    pub(crate) fn forgotten(&self) -> u64 {
        self.inner.lock().map(|g| g.2).unwrap_or(u64::MAX)
    }

    /// [`Self::fill`] with a listing taken when [`Self::forgotten`] said
    /// `since`, unless a deletion was forgotten meanwhile (the listing may
    /// name its steps). Whether it was filled.
    pub(crate) fn fill_unless_forgotten_since(&self, since: u64, listed: BTreeSet<u64>) -> bool {
        let Ok(mut g) = self.inner.lock() else {
            return false;
        };
        if g.2 != since {
            return false;
        }
        g.0.get_or_insert_with(BTreeSet::new).extend(listed);
        true
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

    /// The background relist of L3 (`Shared::relist_l3_in_background`)
    /// takes `forgotten()` before it lists and fills only if no deletion
    /// was forgotten meanwhile: a listing begun before a step was deleted
    /// everywhere may still name it, and must not bring it back.
    #[test]
    fn a_listing_taken_before_a_deletion_does_not_bring_its_steps_back() {
        let k = KnownCommitted::default();
        assert_eq!(k.contains(2), None, "nothing known before a listing");
        k.fill([1, 2].into());
        let since = k.forgotten();
        // Step 2 is deleted on every rank while the listing runs.
        k.forget_where(&|s| s == 2);
        assert_eq!(k.contains(2), Some(false));
        assert!(!k.fill_unless_forgotten_since(since, [1, 2, 3].into()));
        assert_eq!(
            (k.contains(2), k.contains(3)),
            (Some(false), Some(false)),
            "the stale listing was dropped whole"
        );
        // A listing begun after the deletion fills.
        let since = k.forgotten();
        assert!(k.fill_unless_forgotten_since(since, [1, 3].into()));
        assert_eq!((k.contains(2), k.contains(3)), (Some(false), Some(true)));
        // What this process committed is kept, whatever the listings say.
        k.note(9);
        let since = k.forgotten();
        k.forget_where(&|s| s == 1);
        assert!(!k.fill_unless_forgotten_since(since, [1].into()));
        assert_eq!((k.contains(1), k.contains(9)), (Some(false), Some(true)));
    }

    #[test]
    fn decisions_round_trip_and_bad_ones_are_refused() {
        for d in [
            Decision {
                upload: true,
                decided_before: None,
            },
            Decision {
                upload: false,
                decided_before: Some(7),
            },
        ] {
            assert_eq!(Decision::decode(&d.encode()), Some(d));
        }
        assert_eq!(Decision::decode(&[]), None);
        assert_eq!(Decision::decode(&[2]), None);
        assert_eq!(Decision::decode(&[1, 0, 0]), None);
    }

    #[test]
    fn votes_must_be_exactly_the_world_each_yes() {
        let yes = Vote {
            ok: true,
            upload: true,
            already: false,
        }
        .encode();
        let no_up = Vote {
            ok: true,
            upload: false,
            already: false,
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
            already: false,
        }
        .encode();
        let e = check_votes(3, 2, &[yes.clone(), failed.clone()]).unwrap_err();
        assert!(e.to_string().contains("rank 1 failed"), "{e}");
        // A rank that holds the step committed already decides it, whatever
        // the others voted now (a re-save after a split).
        let already = Vote {
            ok: true,
            upload: false,
            already: true,
        }
        .encode();
        for others in [&yes, &failed] {
            let d = check_votes(3, 2, &[others.clone(), already.clone()]).unwrap();
            assert_eq!(d.decided_before, Some(1));
            assert!(!d.upload);
        }
        // Older builds' one- and two-byte votes still decode.
        assert!(check_votes(3, 2, &[vec![1], vec![1, 0]]).is_ok());
        assert!(check_votes(3, 2, &[vec![1, 0, 2], vec![1]]).is_err());
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
            decision: Decision {
                upload: true,
                decided_before: None,
            },
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
