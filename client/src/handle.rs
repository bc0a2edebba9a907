//! [`SaveHandle`]: a save in progress, and what it can wait for
//! ([`Target`]): durable on L1, replicated, uploaded, with a timeout, woken
//! by the pipeline's notifications.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::stats::SaveStats;

/// The outcome slot shared by a save's handle and the worker.
pub(crate) struct Completion {
    slot: Mutex<(bool, Option<Result<SaveStats>>)>,
    cv: Condvar,
    /// Wakes async waiters (any executor: it only uses wakers).
    notify: tokio::sync::Notify,
    /// A handle returned the save's error to its caller: the next `save`,
    /// `flush` or `close` does not return it again.
    reported: AtomicBool,
}

impl Completion {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Completion {
            slot: Mutex::new((false, None)),
            cv: Condvar::new(),
            notify: tokio::sync::Notify::new(),
            reported: AtomicBool::new(false),
        })
    }

    /// True once a handle returned the save's error to its caller.
    pub(crate) fn reported(&self) -> bool {
        self.reported.load(Ordering::SeqCst)
    }

    pub(crate) fn finish(&self, r: Result<SaveStats>) {
        if let Ok(mut s) = self.slot.lock() {
            *s = (true, Some(r));
        }
        self.cv.notify_all();
        self.notify.notify_waiters();
    }

    pub(crate) fn wait_done(&self) {
        if let Ok(mut s) = self.slot.lock() {
            while !s.0 {
                match self.cv.wait(s) {
                    Ok(g) => s = g,
                    Err(_) => return,
                }
            }
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.slot.lock().map(|s| s.0).unwrap_or(true)
    }

    /// Waits until done or `deadline`; returns whether it is done.
    fn wait_done_until(&self, deadline: Option<Instant>) -> bool {
        let Some(deadline) = deadline else {
            self.wait_done();
            return true;
        };
        let Ok(mut s) = self.slot.lock() else {
            return true;
        };
        while !s.0 {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            match self.cv.wait_timeout(s, left) {
                Ok((g, _)) => s = g,
                Err(_) => return true,
            }
        }
        true
    }
}

/// How far a save should have gone before [`SaveHandle::wait_for`]
/// returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// Durable and committed on L1 (what [`SaveHandle::wait`] waits for).
    L1,
    /// Also pushed to and committed on `replicas` peers.
    Peers,
    /// Also uploaded to and committed on L3.
    L3,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Target::L1 => "durable on L1",
            Target::Peers => "replicated to its peers",
            Target::L3 => "uploaded to L3",
        })
    }
}

/// A save in progress. Dropping it does not cancel the save.
pub struct SaveHandle {
    pub(crate) step: u64,
    pub(crate) stall: Duration,
    pub(crate) done: Arc<Completion>,
    pub(crate) shared: Arc<Shared>,
}

impl SaveHandle {
    /// The step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// How long `save` blocked the caller.
    pub fn stall(&self) -> Duration {
        self.stall
    }

    /// True once the step is durable (or failed).
    pub fn is_done(&self) -> bool {
        self.done.is_done()
    }

    /// Resolves when the step is durable and committed on L1, like
    /// [`Self::wait`] without blocking a thread: for async training loops.
    /// Works on any executor.
    pub async fn durable(&self) -> Result<SaveStats> {
        loop {
            let notified = self.done.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Register before checking, so a finish in between is not missed.
            notified.as_mut().enable();
            if self.done.is_done() {
                return self.wait();
            }
            notified.await;
        }
    }

    /// Blocks until the step is durable and committed on L1, and returns its
    /// counters, or the typed error of a failed save (the same error, with
    /// its cause chain, on every call). A failure returned here counts as
    /// reported: the checkpointer's next `save`, `flush` or `close` does
    /// not return it again (see [`crate::OnBackgroundError`]).
    pub fn wait(&self) -> Result<SaveStats> {
        self.done.wait_done();
        self.result()
    }

    fn result(&self) -> Result<SaveStats> {
        let s = self
            .done
            .slot
            .lock()
            .map_err(|_| Error::Pipeline("poisoned".into()))?;
        let r = match &s.1 {
            Some(r) => r.clone(),
            None => Err(Error::Pipeline("no result".into())),
        };
        if r.is_err() {
            self.done.reported.store(true, Ordering::SeqCst);
        }
        r
    }

    /// Blocks until the save reached `target` or `timeout` passed (the
    /// save goes on), woken by the pipeline's own notifications. Returns
    /// the save's counters once it is there; a save that failed, a step
    /// replicated to fewer peers than wanted, an upload that failed, or a
    /// target this checkpointer has no tier for (or, for L3, a step the
    /// upload policy did not pick: see [`crate::Checkpointer::upload`]) is an
    /// error that says so.
    pub fn wait_for(&self, target: Target, timeout: Option<Duration>) -> Result<SaveStats> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let timed_out = || Error::Timeout {
            step: self.step,
            target: target.to_string(),
            waited: timeout.unwrap_or_default(),
        };
        if !self.done.wait_done_until(deadline) {
            return Err(timed_out());
        }
        let stats = self.result()?;
        let s = &self.shared;
        match target {
            Target::L1 => Ok(stats),
            _ if stats.skipped => Err(Error::InvalidState(format!(
                "step {} was skipped by the busy policy",
                self.step
            ))),
            Target::Peers => {
                if s.l2().is_empty() {
                    return Err(Error::Config("no peers configured".into()));
                }
                use crate::tier_states::L2State;
                match s.replication.states.wait_for(self.step, deadline, |st| {
                    !matches!(st, Some(L2State::Pending) | None)
                }) {
                    Some(L2State::Replicated { .. }) => Ok(stats),
                    Some(L2State::Degraded {
                        peers,
                        wanted,
                        errors,
                    }) => Err(Error::Store(strata_tiered::StoreError::Unavailable(
                        format!(
                            "step {} on {} of {wanted} peers: {}",
                            self.step,
                            peers.len(),
                            errors.join("; ")
                        ),
                    ))),
                    _ => Err(timed_out()),
                }
            }
            Target::L3 => {
                if s.l3().is_none() {
                    return Err(Error::Config("no L3 configured (l3_url)".into()));
                }
                use crate::tier_states::L3State;
                let st = s.uploads.states.wait_for(self.step, deadline, |st| {
                    matches!(st, Some(L3State::Committed { .. } | L3State::Failed(_)))
                });
                match st {
                    Some(L3State::Committed { .. }) => Ok(stats),
                    Some(L3State::Failed(why)) => Err(Error::Store(
                        strata_tiered::StoreError::Unavailable(format!(
                            "upload of step {}: {why}",
                            self.step
                        )),
                    )),
                    None => Err(Error::InvalidState(format!(
                        "step {} is not queued for upload (the policy did not pick it; call upload({}))",
                        self.step, self.step
                    ))),
                    _ => Err(timed_out()),
                }
            }
        }
    }
}
