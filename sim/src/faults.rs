//! Seeded faults, and the coordinator a simulated rank sees: the real one,
//! with the node's process dying at a point of the protocol or a rank
//! arriving late.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strata::tiered::SplitMix64;
use strata::{Coordinator, Error, Result};

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The node's process dies as its ranks reach the step's commit
    /// barrier: they never vote, and the step must fail on every rank.
    DiesBeforeVote,
    /// The node's ranks vote, then its process dies before any of them
    /// writes its record: the step is decided, and the next restore rolls
    /// it forward on the node's ranks.
    DiesAfterVote,
    /// The job restarts after the step (preempted), and the node's process
    /// dies inside the next restore's agreement: that restore fails on
    /// every rank, and the one after it restores.
    DiesInRestore,
    /// One rank of the node reaches the barrier late (milliseconds).
    Slow(u64),
    /// etcd is killed and started again (same data) just before the step.
    EtcdRestart,
}

/// A fault at a step, on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Injected {
    /// The step whose save it hits.
    pub step: u64,
    /// The node (ranks `node * per_node ..`).
    pub node: u32,
    /// What happens.
    pub fault: Fault,
}

/// `count` faults at distinct steps in `2..=steps` (step 1 always
/// commits, so every restore has something to agree on), drawn from
/// `seed`: the same seed gives the same faults. `etcd`: etcd restarts are
/// among them.
pub fn plan(seed: u64, steps: u64, nodes: u32, count: usize, etcd: bool) -> Vec<Injected> {
    let mut rng = SplitMix64::new(seed);
    let mut out: Vec<Injected> = Vec::new();
    let kinds = if etcd { 5 } else { 4 };
    let mut tries = 0;
    while out.len() < count && steps >= 2 && tries < 10_000 {
        tries += 1;
        // `up_to(n)` draws from 0..=n.
        let step = 2 + rng.up_to(steps - 2);
        if out.iter().any(|f| f.step == step) {
            continue;
        }
        let node = rng.up_to(u64::from(nodes.max(1) - 1)) as u32;
        let fault = match rng.up_to(kinds - 1) {
            0 => Fault::DiesBeforeVote,
            1 => Fault::DiesAfterVote,
            2 => Fault::DiesInRestore,
            3 => Fault::Slow(50 + rng.up_to(449)),
            _ => Fault::EtcdRestart,
        };
        out.push(Injected { step, node, fault });
    }
    // The deaths the protocol most needs are there whatever the draw.
    let must = [
        Fault::DiesBeforeVote,
        Fault::DiesAfterVote,
        Fault::DiesInRestore,
    ];
    for (slot, f) in out.iter_mut().zip(must) {
        slot.fault = f;
    }
    out.sort_by_key(|f| f.step);
    out
}

/// What the rank's coordinator does at the next round, as the job sets
/// it before each phase.
#[derive(Default)]
pub struct Script {
    /// The node's process is dead: every call fails.
    pub dead: AtomicBool,
    /// Die as the commit round starts (before voting).
    pub die_before_vote: AtomicBool,
    /// Die right after the commit round (after voting).
    pub die_after_vote: AtomicBool,
    /// Die as the restore agreement starts.
    pub die_in_restore: AtomicBool,
    /// Arrive this late at the commit round (ms; 0: on time).
    pub slow_ms: std::sync::atomic::AtomicU64,
}

/// When the last rank entered a round, and when the last one left it.
type Span = (Option<std::time::Instant>, Option<std::time::Instant>);

/// When the last rank entered each round and when the last one left it:
/// the round's own cost, whatever the ranks did before it.
#[derive(Default)]
pub struct RoundTimes {
    rounds: std::sync::Mutex<std::collections::HashMap<String, Span>>,
}

impl RoundTimes {
    fn mark(&self, key: &str, leaving: bool) {
        let now = std::time::Instant::now();
        let mut r = self
            .rounds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let e = r.entry(key.to_string()).or_default();
        let slot = if leaving { &mut e.1 } else { &mut e.0 };
        *slot = Some(slot.map_or(now, |t| t.max(now)));
    }

    /// As [`RoundTimes::take`], forgetting nothing.
    pub fn peek(&self, prefix: &str) -> Duration {
        let r = self
            .rounds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        r.iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .filter_map(|(_, (i, o))| Some(o.as_ref()?.saturating_duration_since(*i.as_ref()?)))
            .sum()
    }

    /// The rounds since the last call whose key starts with `prefix`: the
    /// sum over them of (last rank out − last rank in); the rounds are
    /// forgotten.
    pub fn take(&self, prefix: &str) -> Duration {
        let mut r = self
            .rounds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let total = r
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .filter_map(|(_, (i, o))| Some(o.as_ref()?.saturating_duration_since(*i.as_ref()?)))
            .sum();
        r.clear();
        total
    }
}

/// The coordinator of one simulated rank: the real one, following the
/// node's [`Script`].
pub struct Scripted {
    /// The real coordinator.
    pub inner: Arc<dyn Coordinator>,
    /// The node's script (shared by its ranks).
    pub script: Arc<Script>,
    /// Every rank's round times (shared).
    pub times: Arc<RoundTimes>,
    /// Run reducing rounds as an all-gather reduced on every rank (the
    /// protocol before `all_reduce`, for comparison).
    pub gather: bool,
}

fn died() -> Error {
    Error::Coordination("simulated: this node's process died".into())
}

impl Scripted {
    /// Whether this round dies before reaching the coordinator.
    fn before(&self, key: &str) -> Result<()> {
        let s = &self.script;
        if s.dead.load(Ordering::SeqCst) {
            return Err(died());
        }
        if (key.starts_with("commit/") && s.die_before_vote.load(Ordering::SeqCst))
            || (key.starts_with("restore/") && s.die_in_restore.load(Ordering::SeqCst))
        {
            s.dead.store(true, Ordering::SeqCst);
            return Err(died());
        }
        let late = s.slow_ms.load(Ordering::SeqCst);
        if late > 0 && key.starts_with("commit/") {
            std::thread::sleep(Duration::from_millis(late));
        }
        Ok(())
    }

    fn after<T>(&self, key: &str, got: Result<T>) -> Result<T> {
        if key.starts_with("commit/") && self.script.die_after_vote.load(Ordering::SeqCst) {
            self.script.dead.store(true, Ordering::SeqCst);
            return Err(died());
        }
        got
    }
}

impl Coordinator for Scripted {
    fn world_size(&self) -> u32 {
        self.inner.world_size()
    }

    fn all_gather(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        self.before(key)?;
        self.times.mark(key, false);
        let got = self.inner.all_gather(rank, key, value, timeout);
        self.times.mark(key, true);
        self.after(key, got)
    }

    fn all_reduce(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
        reduce: &strata::coordinator::Reduce<'_>,
    ) -> Result<Vec<u8>> {
        self.before(key)?;
        self.times.mark(key, false);
        let got = if self.gather {
            self.inner
                .all_gather(rank, key, value, timeout)
                .map(|all| reduce(&all))
        } else {
            self.inner.all_reduce(rank, key, value, timeout, reduce)
        };
        self.times.mark(key, true);
        self.after(key, got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_faults_at_distinct_steps() {
        let a = plan(7, 40, 16, 8, true);
        assert_eq!(a, plan(7, 40, 16, 8, true));
        assert_ne!(a, plan(8, 40, 16, 8, true));
        assert_eq!(a.len(), 8);
        let mut steps: Vec<u64> = a.iter().map(|f| f.step).collect();
        steps.dedup();
        assert_eq!(steps.len(), 8);
        assert!(a.iter().all(|f| (2..=40).contains(&f.step) && f.node < 16));
        for must in [
            Fault::DiesBeforeVote,
            Fault::DiesAfterVote,
            Fault::DiesInRestore,
        ] {
            assert!(a.iter().any(|f| f.fault == must), "{must:?} in {a:?}");
        }
        assert!(plan(1, 40, 4, 8, false)
            .iter()
            .all(|f| f.fault != Fault::EtcdRestart));
    }
}
