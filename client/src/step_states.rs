//! A map of per-step states that threads wait on: the uploader's and the
//! replicator's progress, which `SaveHandle::wait_for`, `wait_uploads` and
//! `wait_replication` wait for by notification instead of polling.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// States by step, with a condition variable notified on every change.
pub(crate) struct StepStates<T> {
    map: Mutex<BTreeMap<u64, T>>,
    changed: Condvar,
}

impl<T> Default for StepStates<T> {
    fn default() -> Self {
        StepStates {
            map: Mutex::new(BTreeMap::new()),
            changed: Condvar::new(),
        }
    }
}

impl<T: Clone> StepStates<T> {
    /// Changes the map under its lock and wakes every waiter.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut BTreeMap<u64, T>) -> R) -> Option<R> {
        let r = self.map.lock().ok().map(|mut m| f(&mut m));
        self.changed.notify_all();
        r
    }

    /// Sets a step's state.
    pub(crate) fn set(&self, step: u64, st: T) {
        self.update(|m| m.insert(step, st));
    }

    /// Every step's state.
    pub(crate) fn snapshot(&self) -> BTreeMap<u64, T> {
        self.map.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Waits until `done` holds for the state of `step` (None: none yet),
    /// or `deadline` passes. Returns the last state seen.
    pub(crate) fn wait_for(
        &self,
        step: u64,
        deadline: Option<Instant>,
        done: impl Fn(Option<&T>) -> bool,
    ) -> Option<T> {
        let g = self.wait_until(deadline, |m| done(m.get(&step)))?;
        g.get(&step).cloned()
    }

    /// Waits until `done` holds for the whole map or `deadline` passes;
    /// returns the map's guard (the caller looks again), or None if its
    /// lock is poisoned.
    pub(crate) fn wait_until(
        &self,
        deadline: Option<Instant>,
        done: impl Fn(&BTreeMap<u64, T>) -> bool,
    ) -> Option<MutexGuard<'_, BTreeMap<u64, T>>> {
        let mut g = self.map.lock().ok()?;
        while !done(&g) {
            let wait = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) => left,
                    None => return Some(g),
                },
                None => Duration::from_secs(3600),
            };
            g = self.changed.wait_timeout(g, wait).ok()?.0;
        }
        Some(g)
    }
}

/// A backlog of steps waiting for a worker (uploads to L3, pushes to the
/// peers), bounded by `max_pending_uploads` / `max_pending_pushes`.
impl<T: Clone> StepStates<T> {
    /// Waits until fewer than `max` states are `waiting`, or `limit`
    /// passes; returns whether they are.
    pub(crate) fn wait_below(
        &self,
        max: usize,
        limit: Duration,
        waiting: impl Fn(u64, &T) -> bool,
    ) -> bool {
        let count = |m: &BTreeMap<u64, T>| m.iter().filter(|(&s, st)| waiting(s, st)).count();
        self.wait_until(Some(Instant::now() + limit), |m| count(m) < max)
            .is_some_and(|m| count(&m) < max)
    }

    /// Replaces the oldest `waiting` states beyond `max` by `dropped()`,
    /// under the map's lock (so a worker taking a step off the backlog
    /// never races it); returns their steps.
    pub(crate) fn drop_oldest_beyond(
        &self,
        max: usize,
        waiting: impl Fn(u64, &T) -> bool,
        dropped: impl Fn() -> T,
    ) -> Vec<u64> {
        self.update(|m| {
            let oldest: Vec<u64> = m
                .iter()
                .filter(|(&s, st)| waiting(s, st))
                .map(|(&s, _)| s)
                .collect();
            let n = oldest.len().saturating_sub(max);
            for &step in &oldest[..n] {
                m.insert(step, dropped());
            }
            oldest[..n].to_vec()
        })
        .unwrap_or_default()
    }
}
