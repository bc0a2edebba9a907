//! One background copier of committed steps, configured twice: to the
//! peer group (L2 replication, `to_peers.rs`, accelerated by the eager
//! push of a save's new chunks beside its L1 write, `eager.rs`) and to
//! object storage (L3 tiering, `to_l3.rs`). Both hear of committed steps as subscribers of
//! the commit protocol's events, never from the save path, and copy from
//! L1 with [`crate::tiers::copy`].
//!
//! What they share lives here: the subscription and its backlog policy
//! ([`subscriber`]: with `upload_backlog = "wait"` the commit path waits,
//! bounded, until the backlog is below its limit; with `"drop"` the oldest
//! waiting steps beyond it are dropped, their state saying why) and the
//! per-step states the API waits on (`crate::tier_states`). What differs is a
//! [`Lane`]: which steps it takes, what "queued" and "dropped" are, and
//! its worker loop (the peers retry degraded steps; L3 is throttled and
//! collected after each upload).

use std::sync::Arc;
use std::time::Duration;

use crate::config::UploadBacklog;
use crate::coord::commit::Committed;
use crate::step_states::StepStates;

pub(crate) mod eager;
mod to_l3;
mod to_peers;

pub(crate) use to_l3::{enqueue as enqueue_upload, run as run_uploads, L3Lane};
pub(crate) use to_peers::{run as run_replication, PeersLane};

/// The steps the copiers still need on L1 (waiting for or in an upload or
/// a push): L1 retention keeps them.
pub(crate) fn held_on_l1(s: &crate::shared::Shared) -> std::collections::HashSet<u64> {
    let mut hold = s.uploads.pinned();
    hold.extend(s.replication.pinned());
    hold
}

/// One configured copier, as the shared subscription sees it.
pub(crate) trait Lane: Send + Sync + 'static {
    /// A step's state on this copier's tier.
    type State: Clone;
    /// The destination, for logs ("the peers", "L3").
    const TO: &'static str;
    /// The option that bounds the backlog, for the dropped state's reason.
    const LIMIT: &'static str;
    /// The per-step states.
    fn states(&self) -> &StepStates<Self::State>;
    /// Whether this copier takes the committed step.
    fn wants(&self, ev: &Committed) -> bool;
    /// A step waiting in the backlog, not being copied (called under the
    /// states' lock).
    fn waiting(&self, step: u64, st: &Self::State) -> bool;
    /// Marks `step` queued (L1 retention keeps it from now on) and hands
    /// it to the worker; a worker that stopped leaves a state saying so.
    fn queue(&self, step: u64);
    /// The state of a step dropped from the backlog, with `why`.
    fn dropped(&self, why: String) -> Self::State;
    /// Counts a dropped step.
    fn count_dropped(&self);
}

/// The backlog policy of one lane.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backlog {
    /// Steps that may wait (0: no limit).
    pub(crate) max: usize,
    /// What to do beyond it.
    pub(crate) policy: UploadBacklog,
    /// The longest a commit waits for the backlog to shrink.
    pub(crate) wait_limit: Duration,
}

/// The lane's subscription to "step committed".
pub(crate) fn subscriber<L: Lane>(
    lane: Arc<L>,
    backlog: Backlog,
) -> impl Fn(Committed) + Send + Sync + 'static {
    move |ev: Committed| {
        if !lane.wants(&ev) {
            return;
        }
        let Backlog {
            max,
            policy,
            wait_limit,
        } = backlog;
        if max > 0 && policy == UploadBacklog::Wait {
            // Back-pressure: this runs in the commit path, so the next
            // saves wait (busy policy) while the tier catches up; bounded,
            // so a stopped worker cannot hang the commit.
            if !lane
                .states()
                .wait_below(max, wait_limit, |s, st| lane.waiting(s, st))
            {
                tracing::warn!(
                    step = ev.step,
                    max,
                    "the copies to {} are still behind after {wait_limit:?}; queuing anyway",
                    L::TO
                );
            }
        }
        lane.queue(ev.step);
        if max > 0 && policy == UploadBacklog::Drop {
            drop_oldest_beyond(&*lane, max);
        }
    }
}

/// Drops the oldest steps waiting beyond `max`: their state says why, the
/// worker skips them, and L1 retention no longer holds them.
fn drop_oldest_beyond<L: Lane>(lane: &L, max: usize) {
    let dropped = lane.states().drop_oldest_beyond(
        max,
        |s, st| lane.waiting(s, st),
        || {
            lane.dropped(format!(
                "dropped: more than {max} steps were waiting for {} ({})",
                L::TO,
                L::LIMIT
            ))
        },
    );
    for step in dropped {
        lane.count_dropped();
        tracing::warn!(
            step,
            max,
            "the copies to {} are behind: this step's copy was dropped",
            L::TO
        );
    }
}
