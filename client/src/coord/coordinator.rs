//! Ranks agreeing with each other: the [`Coordinator`] trait, and an
//! in-process implementation for ranks on threads.
//!
//! A step is committed only when every rank's shard is durable (each rank
//! learns this at a barrier before writing its commit record), and all ranks
//! restore the same step (the newest one every rank can serve).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};

/// How ranks exchange small values. `all_gather` blocks until every rank has
/// called it with the same `key`, and returns every rank's value by rank.
pub trait Coordinator: Send + Sync {
    /// Number of ranks.
    fn world_size(&self) -> u32;
    /// Exchanges `value` with every rank; fails after `timeout`.
    fn all_gather(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>>;

    /// Every rank contributes `value`; `reduce` combines all of them (by
    /// rank) into one decision, and every rank returns that same decision.
    /// The commit barrier and the restore rounds use this: a coordinator
    /// for large worlds (etcd) runs `reduce` once, on one rank, and sends
    /// only the decision back, so a round costs O(world) in total instead
    /// of every rank reading every value. `reduce` must be deterministic;
    /// this default gathers every value on every rank and runs it there.
    fn all_reduce(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
        reduce: &Reduce<'_>,
    ) -> Result<Vec<u8>> {
        reduce_gathered(self, rank, key, value, timeout, reduce)
    }
}

/// [`Coordinator::all_reduce`] by gathering: every rank reads every value
/// and runs `reduce` on them itself (the trait's default; for a
/// coordinator whose own reducing round serves only some callers).
pub fn reduce_gathered<C: Coordinator + ?Sized>(
    coord: &C,
    rank: u32,
    key: &str,
    value: Vec<u8>,
    timeout: Duration,
    reduce: &Reduce<'_>,
) -> Result<Vec<u8>> {
    let all = coord.all_gather(rank, key, value, timeout)?;
    if all.len() != coord.world_size() as usize {
        return Err(Error::Coordination(format!(
            "{key}: the coordinator returned {} answers for a world of {}",
            all.len(),
            coord.world_size()
        )));
    }
    Ok(reduce(&all))
}

/// What [`Coordinator::all_reduce`] runs on every rank's value (by rank).
pub type Reduce<'a> = dyn Fn(&[Vec<u8>]) -> Vec<u8> + Send + Sync + 'a;

/// A world of one: nothing to agree on.
#[derive(Debug, Default)]
pub struct SoloCoordinator;

impl Coordinator for SoloCoordinator {
    fn world_size(&self) -> u32 {
        1
    }

    fn all_gather(
        &self,
        _rank: u32,
        _key: &str,
        value: Vec<u8>,
        _timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        Ok(vec![value])
    }
}

#[derive(Default)]
struct Round {
    values: HashMap<u32, Vec<u8>>,
    taken: u32,
}

/// Ranks on threads of one process.
#[derive(Clone)]
pub struct InProcessCoordinator {
    world: u32,
    state: Arc<(Mutex<HashMap<String, Round>>, Condvar)>,
}

impl InProcessCoordinator {
    /// A coordinator for `world` ranks; clone it into each rank's thread.
    pub fn new(world: u32) -> Self {
        InProcessCoordinator {
            world,
            state: Arc::new((Mutex::new(HashMap::new()), Condvar::new())),
        }
    }
}

impl Coordinator for InProcessCoordinator {
    fn world_size(&self) -> u32 {
        self.world
    }

    fn all_gather(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        fn poisoned<T>(_: T) -> Error {
            Error::Coordination("coordinator lock poisoned".into())
        }
        let (lock, cv) = &*self.state;
        let mut rounds = lock.lock().map_err(poisoned)?;
        rounds
            .entry(key.to_string())
            .or_default()
            .values
            .insert(rank, value);
        cv.notify_all();
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let round = rounds
                .get(key)
                .ok_or_else(|| Error::Coordination(format!("round {key} vanished")))?;
            if round.values.len() == self.world as usize {
                let out: Vec<Vec<u8>> = (0..self.world)
                    .map(|r| round.values.get(&r).cloned().unwrap_or_default())
                    .collect();
                let round = rounds
                    .get_mut(key)
                    .ok_or_else(|| Error::Coordination(format!("round {key} vanished")))?;
                round.taken += 1;
                if round.taken == self.world {
                    rounds.remove(key);
                }
                return Ok(out);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                let have = round.values.len();
                if let Some(r) = rounds.get_mut(key) {
                    r.values.remove(&rank);
                }
                return Err(Error::Coordination(format!(
                    "{key}: only {have} of {} ranks reported within {timeout:?}",
                    self.world
                )));
            }
            rounds = cv.wait_timeout(rounds, deadline - now).map_err(poisoned)?.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_gather_and_timeout() {
        let c = InProcessCoordinator::new(3);
        let out: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let c = c.clone();
                    s.spawn(move || {
                        c.all_gather(r, "k", vec![r as u8], Duration::from_secs(5))
                            .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for o in out {
            assert_eq!(o, vec![vec![0], vec![1], vec![2]]);
        }
        let e = c
            .all_gather(0, "lonely", vec![], Duration::from_millis(50))
            .unwrap_err();
        assert!(e.to_string().contains("only 1 of 3"), "{e}");
    }
}
