//! L2 replication: every step committed on L1 is pushed, in the
//! background, over the rank's peer group ([`strata_peer::PeerGroup`],
//! which owns placement and the R-copy policy: `replicas` members at once,
//! a member that is down replaced by the next of the ring); a step that
//! reaches fewer than `replicas` peers is marked degraded (the save itself
//! never fails for it); degraded steps still on L1 are pushed again once a later step replicates
//! fully, and every `replication_retry_secs` while the worker is idle.
//! Most of a step's chunks usually went already, beside the L1 write
//! ([`super::eager`]); this push completes it.
//!
//! A push sends only the chunk ids the peer lacks (one presence check for
//! the shard), read back verified from L1 in bounded batches, then the
//! manifest, then L1's commit record. Steps being replicated stay on L1
//! until their push ends.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};

use strata_tiered::ChunkStore;

use super::Lane;
use crate::coord::commit::Committed;
use crate::error::Result;
use crate::shared::Shared;
use crate::step_states::StepStates;
use crate::tier_states::{L2State, Replication};
use crate::tiers::copy::{copy_step, CopyOptions, Verify};
use strata_peer::Member;

/// Chunk bytes read from L1 and pushed per batch.
const PUSH_BATCH_BYTES: u64 = 64 << 20;

/// Replication as a [`Lane`] of the shared subscription: every committed
/// step is marked pending at once (L1 retention keeps it) and queued.
pub(crate) struct PeersLane {
    pub(crate) repl: Arc<Replication>,
    pub(crate) tx: Mutex<mpsc::Sender<u64>>,
    /// Replicas wanted.
    pub(crate) wanted: usize,
}

impl Lane for PeersLane {
    type State = L2State;
    const TO: &'static str = "the peers";
    const LIMIT: &'static str = "max_pending_pushes";

    fn states(&self) -> &StepStates<L2State> {
        &self.repl.states
    }

    fn wants(&self, _: &Committed) -> bool {
        true
    }

    /// Pending, and not being pushed. Called under the state map's lock,
    /// where the worker also marks what it takes.
    fn waiting(&self, step: u64, st: &L2State) -> bool {
        matches!(st, L2State::Pending) && !in_flight(&self.repl).contains(&step)
    }

    fn queue(&self, step: u64) {
        self.repl.set(step, L2State::Pending);
        let sent = self.tx.lock().ok().map(|tx| tx.send(step));
        if !matches!(sent, Some(Ok(()))) {
            self.repl.set(
                step,
                L2State::Degraded {
                    peers: Vec::new(),
                    wanted: self.wanted,
                    errors: vec!["the replication worker stopped".into()],
                },
            );
        }
    }

    /// Degraded: if still on L1 it is pushed again later, like any
    /// degraded step.
    fn dropped(&self, why: String) -> L2State {
        L2State::Degraded {
            peers: Vec::new(),
            wanted: self.wanted,
            errors: vec![why],
        }
    }

    fn count_dropped(&self) {
        self.repl.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// The steps being pushed now (lock order: the state map, then this set).
fn in_flight(repl: &Replication) -> std::collections::BTreeSet<u64> {
    repl.in_flight.lock().map(|g| g.clone()).unwrap_or_default()
}

fn set_in_flight(repl: &Replication, steps: &[u64], on: bool) {
    if let Ok(mut g) = repl.in_flight.lock() {
        for s in steps {
            if on {
                g.insert(*s);
            } else {
                g.remove(s);
            }
        }
    }
}

/// The replication worker's loop. Degraded steps still on L1 are pushed
/// again at once after a later step replicates fully (a peer came back, a
/// link was restored), and every `replication_retry_secs` while the worker
/// is idle, so a returning peer gets them without a new save.
pub(crate) fn run(s: &Shared, rx: &mpsc::Receiver<u64>) {
    let every = std::time::Duration::from_secs(s.cfg.replication_retry_secs.max(1));
    loop {
        let step = match rx.recv_timeout(every) {
            Ok(step) => step,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Not marked pending: `wait_replication` must not wait on
                // a peer that may stay down.
                for old in degraded_on_l1(s, u64::MAX) {
                    retry(s, old);
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        let _span = tracing::info_span!("replicate", step).entered();
        // Taken off the backlog (never dropped now), unless it was dropped
        // while it waited.
        let dropped = s
            .replication
            .states
            .update(|m| {
                let gone = !matches!(m.get(&step), Some(L2State::Pending));
                if !gone {
                    set_in_flight(&s.replication, &[step], true);
                }
                gone
            })
            .unwrap_or(false);
        if dropped {
            continue;
        }
        let st = replicate_caught(s, step);
        match &st {
            L2State::Replicated { peers, .. } => {
                tracing::info!(step, ?peers, "step replicated");
            }
            L2State::Degraded { errors, .. } => {
                tracing::warn!(step, ?errors, "step replicated to fewer peers than wanted");
            }
            L2State::Pending => {}
        }
        // Older degraded steps are marked pending before this step's state
        // is final, so `wait_replication` waits for their retry too.
        let again = if matches!(st, L2State::Replicated { .. }) {
            degraded_on_l1(s, step)
        } else {
            Vec::new()
        };
        // In flight before they are pending again: never dropped.
        set_in_flight(&s.replication, &again, true);
        for old in &again {
            s.replication.set(*old, L2State::Pending);
        }
        s.replication.set(step, st);
        set_in_flight(&s.replication, &[step], false);
        for old in again {
            retry(s, old);
            set_in_flight(&s.replication, &[old], false);
        }
    }
}

/// Pushes a degraded step again and records the outcome.
fn retry(s: &Shared, step: u64) {
    let _span = tracing::info_span!("re-replicate", step).entered();
    let st = replicate_caught(s, step);
    if matches!(st, L2State::Replicated { .. }) {
        tracing::info!(step, "degraded step replicated again");
    }
    s.replication.set(step, st);
}

/// Once a step replicates fully again (a peer came back, a link was
/// restored), the older steps left degraded and still on L1 are pushed
/// again (chunks the peers already hold are not resent): these.
fn degraded_on_l1(s: &Shared, newer_than: u64) -> Vec<u64> {
    let degraded: Vec<u64> = s
        .replication
        .snapshot()
        .into_iter()
        .filter(|(st, state)| *st < newer_than && matches!(state, L2State::Degraded { .. }))
        .map(|(st, _)| st)
        .collect();
    if degraded.is_empty() {
        return degraded;
    }
    match s.rt.block_on(s.l1.list_steps(&s.cfg.job)) {
        Ok(steps) => {
            let on_l1 = crate::coord::commit::restorable(&s.cfg, &steps);
            degraded
                .into_iter()
                .filter(|st| on_l1.contains(st))
                .collect()
        }
        Err(_) => Vec::new(),
    }
}

/// [`replicate`], a panic in it reported as a degraded step: the step is
/// never left pending (`wait_replication` would wait for it forever), and
/// the worker goes on.
fn replicate_caught(s: &Shared, step: u64) -> L2State {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| replicate(s, step))).unwrap_or_else(
        |_| L2State::Degraded {
            peers: Vec::new(),
            wanted: s.cfg.replicas,
            errors: vec!["the push panicked".into()],
        },
    )
}

/// Pushes `step` over the peer group: the group puts it on `replicas`
/// members, replacing each that fails by the next of the ring
/// ([`strata_peer::PeerGroup::spread`]); fewer than wanted is `Degraded`.
fn replicate(s: &Shared, step: u64) -> L2State {
    // What went beside the L1 write is not sent again: the push below
    // sends what each peer still lacks.
    let early = super::eager::finished(s, step);
    let spread = s.group.spread(|m| push(s, m, step));
    let mut sent = 0;
    let mut sent_early = 0;
    for (node, n) in &spread.holders {
        let e = early.get(node).copied().unwrap_or(0);
        sent += n + e;
        sent_early += e;
    }
    if spread.is_degraded() {
        L2State::Degraded {
            peers: spread.nodes(),
            wanted: spread.wanted,
            errors: spread.errors,
        }
    } else {
        L2State::Replicated {
            peers: spread.nodes(),
            wanted: spread.wanted,
            sent,
            early: sent_early,
        }
    }
}

/// Pushes this rank's shard of `step` from L1 to one peer and commits it
/// there ([`copy_step`]; the peer verifies every chunk it receives, so
/// L1's copies are not hashed on the way out). Returns the bytes the peer
/// wrote (those it received meanwhile from the eager push are not).
fn push(s: &Shared, peer: &Member, step: u64) -> Result<u64> {
    // The ranks of this node share the chunks they hold identically: each
    // goes to the peer once (see `push_claims`).
    let claims = s.claims.as_ref().map(|c| c.for_peer(&peer.node));
    let opts = CopyOptions {
        batch_bytes: PUSH_BATCH_BYTES,
        verify: Verify::Receiver,
        siblings: claims
            .as_ref()
            .map(|c| c as &dyn crate::tiers::copy::PushCoordination),
        pause: Some(&s.foreground),
    };
    let st = s.rt.block_on(copy_step(
        &s.l1,
        &*peer.store,
        &s.cfg.job,
        step,
        s.cfg.rank,
        opts,
        &|_| {},
    ))?;
    Ok(st.bytes_written)
}
