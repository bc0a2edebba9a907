//! The ranks of one process in a reducing round together: the last of
//! them to arrive runs the round in etcd for all of them (one value, one
//! decision to read), the others wait for it. A process that holds one
//! rank runs its round at once.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{poisoned, EtcdCoordinator};
use crate::coord::coordinator::{Coordinator, Reduce};
use crate::error::{Error, Result};

/// The rounds this process's ranks are in.
#[derive(Default)]
pub(super) struct Local {
    rounds: Mutex<HashMap<String, LocalRound>>,
    changed: Condvar,
    /// Ranks whose process left the node link cleanly (locked after
    /// `rounds`): a round that lacks one of their values fails at once.
    departed: Mutex<std::collections::BTreeSet<u32>>,
}

#[derive(Default)]
struct LocalRound {
    /// The values of the ranks that arrived (until one runs the round).
    values: BTreeMap<u32, Vec<u8>>,
    /// A rank is running the round in etcd.
    running: bool,
    /// The round's outcome, for every rank of the process.
    result: Option<Result<Vec<u8>>>,
    /// Ranks that took the outcome (the round goes when all did).
    took: std::collections::BTreeSet<u32>,
    /// The earliest deadline of the ranks that arrived: the round in etcd
    /// ends by it, so no rank gives up on a round that then succeeds.
    deadline: Option<Instant>,
}

/// One rank of a process that runs several ([`EtcdCoordinator::connect_node`]):
/// the coordinator its `Checkpointer` uses. Cheap to clone.
#[derive(Clone)]
pub struct EtcdRank {
    node: Arc<EtcdCoordinator>,
    rank: u32,
}

impl std::fmt::Debug for EtcdRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EtcdRank({} of {:?})", self.rank, self.node)
    }
}

impl EtcdRank {
    /// The process's coordinator this rank takes part through.
    pub fn node(&self) -> &Arc<EtcdCoordinator> {
        &self.node
    }
}

impl EtcdCoordinator {
    /// The coordinator of `rank`, one of the ranks this process holds.
    pub fn rank_handle(self: &Arc<Self>, rank: u32) -> Result<EtcdRank> {
        if !self.ranks().contains(&rank) {
            return Err(Error::Config(format!(
                "this coordinator holds ranks {:?}, not {rank}",
                self.ranks()
            )));
        }
        Ok(EtcdRank {
            node: self.clone(),
            rank,
        })
    }

    /// The ranks this process holds.
    pub fn ranks(&self) -> Range<u32> {
        self.rank..self.rank + self.count
    }

    /// A reducing round for `rank`: with the node's other ranks, then in
    /// etcd ([`EtcdCoordinator::decide`]) by a rank that brought `reduce`
    /// once every value is in: the last to arrive among the ranks on this
    /// process's threads. A rank of another process of the node (through
    /// the node link, [`super::node_leader`]) brings none: the leader's
    /// own rank runs the round for it.
    pub(super) fn reduce_locally(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
        reduce: Option<&Reduce<'_>>,
    ) -> Result<Vec<u8>> {
        if !self.ranks().contains(&rank) {
            return Err(Error::Config(format!(
                "this coordinator holds rank {}, not {rank}",
                if self.count == 1 {
                    self.rank.to_string()
                } else {
                    format!("s {:?}", self.ranks())
                }
            )));
        }
        self.check_lost()?;
        if let (1, Some(reduce)) = (self.count, reduce) {
            return self.block_on(self.decide(key, vec![(rank, value)], timeout, reduce));
        }
        let deadline = Instant::now() + timeout;
        let local = &self.local;
        let mut rounds = local.rounds.lock().map_err(poisoned)?;
        // A round of the same key that is still handing out its outcome
        // is not this one (this rank took it): wait for it to go. One this
        // rank never took was given up by the others (a rank came late):
        // its outcome is this call's.
        loop {
            let r = rounds.entry(key.to_string()).or_default();
            if let Some(out) = r.result.clone().filter(|_| !r.took.contains(&rank)) {
                r.took.insert(rank);
                if self.everyone_took(r) {
                    rounds.remove(key);
                }
                local.changed.notify_all();
                return out;
            }
            if r.result.is_none() && !r.running && !r.values.contains_key(&rank) {
                break;
            }
            self.check_lost()?;
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Coordination(format!(
                    "{key}: an earlier round of the same key never finished on this process"
                )));
            }
            rounds = local
                .changed
                .wait_timeout(rounds, deadline - now)
                .map_err(poisoned)?
                .0;
        }
        let round = rounds.entry(key.to_string()).or_default();
        round.values.insert(rank, value);
        round.deadline = Some(round.deadline.map_or(deadline, |d| d.min(deadline)));
        local.changed.notify_all();
        loop {
            let Some(round) = rounds.get_mut(key) else {
                return Err(Error::Coordination(format!("{key}: the round vanished")));
            };
            if let (Some(reduce), None, false) = (reduce, &round.result, round.running) {
                if round.values.len() == self.count as usize {
                    round.running = true;
                    let values: Vec<(u32, Vec<u8>)> =
                        std::mem::take(&mut round.values).into_iter().collect();
                    let until = round.deadline.map_or(deadline, |d| d.min(deadline));
                    drop(rounds);
                    let left = until.saturating_duration_since(Instant::now());
                    let outcome = self.block_on(self.decide(key, values, left, reduce));
                    rounds = local.rounds.lock().map_err(poisoned)?;
                    if let Some(r) = rounds.get_mut(key) {
                        r.running = false;
                        r.result = Some(outcome);
                    }
                    local.changed.notify_all();
                    continue;
                }
            }
            if round.result.is_none() && !round.running {
                // The node gave up (a rank's process ended without leaving):
                // no round of it can complete.
                if let Some(e) = self.state.lock().map_err(poisoned)?.lost.clone() {
                    round.values.clear();
                    round.result = Some(Err(e));
                    continue;
                }
                // A rank whose process left cleanly never brings its value.
                let gone: Vec<u32> = local
                    .departed
                    .lock()
                    .map_err(poisoned)?
                    .iter()
                    .copied()
                    .filter(|r| !round.values.contains_key(r))
                    .collect();
                if !gone.is_empty() {
                    round.values.clear();
                    round.result = Some(Err(Error::Coordination(format!(
                        "{key}: local rank(s) {gone:?} left this node (their processes ended)"
                    ))));
                    continue;
                }
            }
            let now = Instant::now();
            // All values in: the rank that brought `reduce` is about to
            // run it (never given up under it).
            let complete = round.values.len() == self.count as usize;
            if round.result.is_none() && now >= deadline && !round.running && !complete {
                // Given up: every rank of this process gets this outcome
                // (one that comes later too), and the process's count of
                // rounds of this key moves on as the other processes' did.
                let have = round.values.len();
                round.values.clear();
                round.result = Some(Err(Error::Coordination(format!(
                    "{key}: only {have} of this process's {} ranks reported within {timeout:?}",
                    self.count
                ))));
                if let Ok(mut st) = self.state.lock() {
                    *st.attempts.entry(format!("decide {key}")).or_insert(0) += 1;
                }
            }
            if let Some(out) = round.result.clone() {
                round.took.insert(rank);
                if self.everyone_took(round) {
                    rounds.remove(key);
                }
                local.changed.notify_all();
                return out;
            }
            // The rank running the round ends it by its own deadline.
            let wait = deadline
                .saturating_duration_since(now)
                .max(Duration::from_millis(50));
            rounds = local
                .changed
                .wait_timeout(rounds, wait)
                .map_err(poisoned)?
                .0;
        }
    }
}

impl EtcdCoordinator {
    /// The node cannot go on (a rank's process ended without leaving the
    /// node link): every round of it fails from now on with `e`, and its
    /// claims go at once (the lease revoked), so the other nodes see its
    /// ranks gone as they would see a dead process's.
    pub(super) fn give_up(&self, e: Error) {
        match self.state.lock() {
            Ok(mut st) if st.lost.is_none() => st.lost = Some(e),
            _ => return,
        }
        // Waiters first: they fail at once, the revocation may take a while.
        if let Ok(_rounds) = self.local.rounds.lock() {
            self.local.changed.notify_all();
        }
        let (api, lease) = (self.api.clone(), self.lease);
        let t = self.opts.request_timeout.min(Duration::from_secs(2));
        if let Err(e) = self.block_on(async move { api.revoke(lease, t).await }) {
            tracing::warn!(error = %e, "could not revoke the node's lease; it expires");
        }
    }

    /// Every rank of this process took `round`'s outcome, or left the node
    /// (it never will: the round would stay until the process ends).
    /// Called under the rounds' lock (`departed` is locked after it).
    fn everyone_took(&self, round: &LocalRound) -> bool {
        let left = self
            .local
            .departed
            .lock()
            .map(|d| d.iter().filter(|r| !round.took.contains(r)).count())
            .unwrap_or(0);
        round.took.len() + left >= self.count as usize
    }

    /// The rounds this process's ranks are in now, decided or not (none
    /// between rounds: a round goes once every rank took its outcome, or
    /// left the node).
    pub fn rounds_open(&self) -> usize {
        self.local.rounds.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// `rank`'s process left the node link cleanly (`true`) or joined it
    /// again (`false`).
    pub(super) fn set_departed(&self, rank: u32, gone: bool) {
        if let Ok(_rounds) = self.local.rounds.lock() {
            if let Ok(mut d) = self.local.departed.lock() {
                if gone {
                    d.insert(rank);
                } else {
                    d.remove(&rank);
                }
            }
            self.local.changed.notify_all();
        }
    }
}

/// An all-gather made of a reducing round whose outcome is every value
/// (every rank reads all of them: O(world) each).
pub(super) fn gather_through_reduce(
    c: &(impl Coordinator + ?Sized),
    rank: u32,
    key: &str,
    value: Vec<u8>,
    timeout: Duration,
) -> Result<Vec<Vec<u8>>> {
    let all = c.all_reduce(rank, key, value, timeout, &concat)?;
    split(key, c.world_size(), &all)
}

/// Every rank's value, one after another with its length: the outcome of
/// an all-gather made of a reducing round.
fn concat(all: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(all.iter().map(|v| v.len() + 4).sum());
    for v in all {
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
    }
    out
}

fn split(key: &str, world: u32, mut b: &[u8]) -> Result<Vec<Vec<u8>>> {
    let bad = || Error::Coordination(format!("{key}: a malformed all-gather outcome"));
    let mut out = Vec::with_capacity((world as usize).min(b.len() / 4));
    while !b.is_empty() {
        let (len, rest) = b.split_first_chunk::<4>().ok_or_else(bad)?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return Err(bad());
        }
        out.push(rest[..len].to_vec());
        b = &rest[len..];
    }
    if out.len() != world as usize {
        return Err(bad());
    }
    Ok(out)
}

impl Coordinator for EtcdRank {
    fn world_size(&self) -> u32 {
        self.node.world
    }

    /// An all-gather made of a reducing round whose outcome is every
    /// value (every rank reads all of them: O(world) each).
    fn all_gather(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        gather_through_reduce(self, rank, key, value, timeout)
    }

    fn all_reduce(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
        reduce: &Reduce<'_>,
    ) -> Result<Vec<u8>> {
        if rank != self.rank {
            return Err(Error::Config(format!(
                "this coordinator holds rank {}, not {rank}",
                self.rank
            )));
        }
        self.node
            .reduce_locally(rank, key, value, timeout, Some(reduce))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_values_split_back_and_bad_ones_are_errors() {
        let all = vec![vec![1, 2], vec![], vec![3]];
        assert_eq!(split("k", 3, &concat(&all)).unwrap(), all);
        assert!(split("k", 2, &concat(&all)).is_err());
        let b = concat(&all);
        for cut in 1..b.len() {
            assert!(split("k", 3, &b[..cut]).is_err(), "cut {cut}");
        }
        assert!(split("k", 1, &[255, 255, 255, 255]).is_err());
    }
}
