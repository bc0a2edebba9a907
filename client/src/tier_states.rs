//! Where each step stands beyond L1, for this rank: its upload to L3
//! ([`L3State`]) and its replication to peers ([`L2State`]), in waitable
//! maps the workers update and the API (and [`SaveHandle`]) reads.
//!
//! [`SaveHandle`]: crate::SaveHandle

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::AtomicU64;

use crate::step_states::StepStates;

/// Where a step stands on L3, for this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum L3State {
    /// Waiting in the upload queue.
    Queued,
    /// Uploading: chunk bytes sent so far of those L3 lacked.
    Uploading {
        /// Bytes sent.
        done: u64,
        /// Bytes to send.
        total: u64,
    },
    /// Committed on L3 by this rank.
    Committed {
        /// Chunk bytes this upload sent (the rest L3 already held).
        sent: u64,
        /// Chunk bytes L3 already held.
        deduped: u64,
    },
    /// The upload failed (it is retried when asked for again).
    Failed(String),
}

/// Upload progress, shared by the uploader thread and the API.
#[derive(Default)]
pub(crate) struct Uploads {
    pub(crate) states: StepStates<L3State>,
    pub(crate) queued: AtomicU64,
    /// Uploads dropped from a backlog past `max_pending_uploads`.
    pub(crate) dropped: AtomicU64,
    /// Steps uploaded on request (`Checkpointer::upload`): L3 retention
    /// keeps them for the life of the process.
    pub(crate) requested: std::sync::Mutex<std::collections::BTreeSet<u64>>,
    /// When L3's collector (rank 0) first saw each step incomplete there.
    pub(crate) incomplete: strata_gc::IncompleteSeen,
    /// Each rank's progress on L3 as the collector (rank 0) saw it: an
    /// incomplete step is bounded only where the ranks it lacks stalled.
    pub(crate) progress: strata_gc::RankProgress,
    /// The first and the last failure of this process's uploads that no
    /// full collection has covered yet: such an upload may have left
    /// chunks on L3 that no manifest names, and no step need retire for
    /// a lazy collection to look at them (none does while uploads keep
    /// failing). Once a grace period has passed since the first, the
    /// next collection lists every chunk (see `mirror::to_l3`).
    pub(crate) sweep_due: std::sync::Mutex<Option<(std::time::Instant, std::time::Instant)>>,
}

impl Uploads {
    pub(crate) fn set(&self, step: u64, st: L3State) {
        self.states.set(step, st);
    }

    /// Adds `n` to an upload's progress.
    pub(crate) fn add_done(&self, step: u64, n: u64, total: u64) {
        self.states.update(|m| {
            let done = match m.get(&step) {
                Some(L3State::Uploading { done, .. }) => done + n,
                _ => n,
            };
            m.insert(step, L3State::Uploading { done, total });
        });
    }

    /// The state of every step this process queued for upload.
    pub(crate) fn snapshot(&self) -> BTreeMap<u64, L3State> {
        self.states.snapshot()
    }

    /// Steps queued or uploading: L1 retention must keep them.
    pub(crate) fn pinned(&self) -> std::collections::HashSet<u64> {
        self.snapshot()
            .into_iter()
            .filter(|(_, st)| matches!(st, L3State::Queued | L3State::Uploading { .. }))
            .map(|(s, _)| s)
            .collect()
    }
}

/// What the uploader thread receives: the step to upload.
pub(crate) type UploadJob = u64;

/// A step's replication, for this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum L2State {
    /// Waiting or being pushed.
    Pending,
    /// On `peers.len()` of the wanted peers (replicated r/R).
    Replicated {
        /// Peers holding the step (committed there).
        peers: Vec<String>,
        /// Replicas wanted.
        wanted: usize,
        /// Chunk bytes sent (the rest the peers held already).
        sent: u64,
        /// Of `sent`, the bytes that went beside the L1 write (the eager
        /// push); the rest went after the L1 commit, from L1.
        early: u64,
    },
    /// On fewer peers than wanted: every candidate in the ring was tried.
    Degraded {
        /// Peers holding the step.
        peers: Vec<String>,
        /// Replicas wanted.
        wanted: usize,
        /// Why the others failed.
        errors: Vec<String>,
    },
}

/// Replication state shared by the worker and the API.
pub(crate) struct Replication {
    pub(crate) states: StepStates<L2State>,
    /// Steps the worker is pushing now (taken off the queue, or retried):
    /// never dropped.
    pub(crate) in_flight: std::sync::Mutex<std::collections::BTreeSet<u64>>,
    /// Pushes dropped from a backlog past `max_pending_pushes`.
    pub(crate) dropped: AtomicU64,
}

impl Default for Replication {
    fn default() -> Self {
        Replication {
            states: StepStates::default(),
            in_flight: Default::default(),
            dropped: AtomicU64::new(0),
        }
    }
}

impl Replication {
    pub(crate) fn set(&self, step: u64, st: L2State) {
        self.states.set(step, st);
    }

    /// Waits until no step is pending.
    pub(crate) fn wait_idle(&self) {
        drop(self.states.wait_until(None, |m| {
            !m.values().any(|st| matches!(st, L2State::Pending))
        }));
    }

    /// Every step's state.
    pub(crate) fn snapshot(&self) -> BTreeMap<u64, L2State> {
        self.states.snapshot()
    }

    /// Steps still being pushed: L1 retention keeps them.
    pub(crate) fn pinned(&self) -> HashSet<u64> {
        self.snapshot()
            .into_iter()
            .filter(|(_, st)| matches!(st, L2State::Pending))
            .map(|(s, _)| s)
            .collect()
    }
}
