//! The checkpointer's view of its background copies: where each step is
//! committed ([`StepTiers`]), uploads asked for and waited on, and the
//! replication and upload states the mirror keeps (`mirror/`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use strata_tiered::ChunkStore;

use crate::checkpointer::Checkpointer;
use crate::error::{Error, Result};
use crate::mirror::enqueue_upload;
use crate::tier_states::{L2State, L3State};

/// Where one step is committed, for this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepTiers {
    /// The step.
    pub step: u64,
    /// Committed on L1 (this node's disk).
    pub l1: bool,
    /// Committed on L3.
    pub l3: bool,
    /// This process's upload of it, if any.
    pub upload: Option<L3State>,
    /// This process's replication of it to peers, if any.
    pub replication: Option<L2State>,
}

impl Checkpointer {
    /// Every step this rank has committed on some tier, oldest first, with
    /// where it is committed and how its upload stands.
    pub fn steps(&self) -> Result<Vec<StepTiers>> {
        let s = &self.shared;
        let cfg = &s.cfg;
        let mine = |steps: &[strata_tiered::StepInfo]| crate::coord::commit::restorable(cfg, steps);
        let l1 = mine(&s.rt.block_on(s.l1.list_steps(&cfg.job))?);
        let l3 = match s.l3() {
            Some(l3) => mine(&s.rt.block_on(l3.list_steps(&cfg.job))?),
            None => Default::default(),
        };
        let uploads = s.uploads.snapshot();
        let repl = s.replication.snapshot();
        Ok(l1
            .union(&l3)
            .map(|&step| StepTiers {
                step,
                l1: l1.contains(&step),
                l3: l3.contains(&step),
                upload: uploads.get(&step).cloned(),
                replication: repl.get(&step).cloned(),
            })
            .collect())
    }

    /// Queues `step` (committed on L1 by this rank) for upload to L3, in
    /// the background. Fails if no L3 is configured.
    pub fn upload(&self, step: u64) -> Result<()> {
        if self.shared.l3().is_none() {
            return Err(Error::Config("no L3 configured (l3_url)".into()));
        }
        let tx = self
            .shared
            .upload_tx
            .lock()
            .map_err(|_| Error::Pipeline("poisoned".into()))?;
        let tx = tx
            .as_ref()
            .ok_or_else(|| Error::Pipeline("the uploader stopped".into()))?;
        if let Ok(mut asked) = self.shared.uploads.requested.lock() {
            asked.insert(step);
        }
        enqueue_upload(&self.shared.uploads, tx, step)
    }

    /// Blocks until every queued upload has finished (committed or failed).
    pub fn wait_uploads(&self) {
        let u = &self.shared.uploads;
        // The uploader wakes the map after each decrement.
        drop(
            u.states
                .wait_until(None, |_| u.queued.load(Ordering::SeqCst) == 0),
        );
    }

    /// The L2 state of every step this process replicated (or is
    /// replicating) to peers.
    pub fn replication(&self) -> BTreeMap<u64, L2State> {
        self.shared.replication.snapshot()
    }

    /// Blocks until every step queued for replication has been pushed (or
    /// found degraded).
    pub fn wait_replication(&self) {
        self.shared.replication.wait_idle();
    }

    /// Uploads dropped because more than `max_pending_uploads` steps were
    /// waiting for L3 (with `upload_backlog = "drop"`).
    pub fn dropped_uploads(&self) -> u64 {
        self.shared.uploads.dropped.load(Ordering::Relaxed)
    }

    /// Pushes dropped because more than `max_pending_pushes` steps were
    /// waiting for the peers (with `upload_backlog = "drop"`).
    pub fn dropped_pushes(&self) -> u64 {
        self.shared.replication.dropped.load(Ordering::Relaxed)
    }

    /// The L3 state of every step this process queued for upload.
    pub fn uploads(&self) -> BTreeMap<u64, L3State> {
        self.shared.uploads.snapshot()
    }

    /// The L3 tier, if configured.
    pub fn l3(&self) -> Option<&Arc<dyn ChunkStore>> {
        self.shared.l3()
    }
}
