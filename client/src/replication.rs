//! L2 replication: every step committed on L1 is pushed, in the
//! background, to `replicas` peer services chosen by the ring
//! (`strata_peer::ring`), the preferred ones first; a peer that is down is
//! replaced by the next node in the ring, and a step that reaches fewer than
//! `replicas` peers is marked degraded (the save itself never fails for it);
//! once a later step replicates fully, degraded steps still on L1 are
//! pushed again.
//!
//! A push sends only the chunk ids the peer lacks (one presence check for
//! the shard), read back verified from L1 in bounded batches, then the
//! manifest, then L1's commit record. Steps being replicated stay on L1
//! until their push ends.

use std::collections::{BTreeMap, HashSet};
use std::sync::{mpsc, Arc, Mutex};

use strata_format::ChunkId;
use strata_peer::PeerStore;
use strata_tiered::ChunkStore;

use crate::checkpointer::Shared;
use crate::error::{Error, Result};

/// Chunk bytes read from L1 and pushed per batch.
const PUSH_BATCH_BYTES: u64 = 64 << 20;

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

/// One peer in ring order.
pub(crate) struct Peer {
    pub(crate) name: String,
    pub(crate) store: Arc<PeerStore>,
}

/// Replication state shared by the worker and the API.
#[derive(Default)]
pub(crate) struct Replication {
    state: Mutex<BTreeMap<u64, L2State>>,
}

impl Replication {
    fn set(&self, step: u64, st: L2State) {
        if let Ok(mut m) = self.state.lock() {
            m.insert(step, st);
        }
    }

    /// Every step's state.
    pub(crate) fn snapshot(&self) -> BTreeMap<u64, L2State> {
        self.state.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Steps still being pushed: L1 retention keeps them.
    pub(crate) fn pinned(&self) -> HashSet<u64> {
        self.state
            .lock()
            .map(|m| {
                m.iter()
                    .filter(|(_, st)| matches!(st, L2State::Pending))
                    .map(|(s, _)| *s)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Opens the peers of `s.cfg` in ring order (none without `peers`).
pub(crate) fn open_peers(cfg: &crate::Config, rt: &tokio::runtime::Runtime) -> Result<Vec<Peer>> {
    let list = cfg.peer_list()?;
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let Some(dir) = &cfg.peer_certs else {
        return Ok(Vec::new());
    };
    let names: Vec<String> = list.iter().map(|(n, _)| n.clone()).collect();
    let order = strata_peer::ring::placement(&names, &cfg.node, cfg.rank);
    let certs = strata_peer::tls::CertFiles::in_dir(dir, &format!("client-{}", cfg.job));
    let _guard = rt.enter();
    order
        .into_iter()
        .filter_map(|name| list.iter().find(|(n, _)| *n == name).cloned())
        .map(|(name, addr)| {
            let store = PeerStore::new(addr, &name, &certs, strata_peer::PeerOptions::default())
                .map_err(|e| Error::Config(format!("peer {name}: {e}")))?;
            Ok(Peer {
                name,
                store: Arc::new(store),
            })
        })
        .collect()
}

/// Queues `step` for replication (after its L1 commit).
pub(crate) fn after_commit(s: &Shared, step: u64) {
    if s.l2.is_empty() {
        return;
    }
    s.replication.set(step, L2State::Pending);
    let sent = s
        .repl_tx
        .lock()
        .ok()
        .and_then(|tx| tx.as_ref().map(|tx| tx.send(step)));
    if !matches!(sent, Some(Ok(()))) {
        s.replication.set(
            step,
            L2State::Degraded {
                peers: Vec::new(),
                wanted: s.cfg.replicas,
                errors: vec!["the replication worker stopped".into()],
            },
        );
    }
}

/// The replication worker's loop.
pub(crate) fn run(s: &Shared, rx: &mpsc::Receiver<u64>) {
    while let Ok(step) = rx.recv() {
        let _span = tracing::info_span!("replicate", step).entered();
        let st = replicate(s, step);
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
        let retry = if matches!(st, L2State::Replicated { .. }) {
            degraded_on_l1(s, step)
        } else {
            Vec::new()
        };
        for old in &retry {
            s.replication.set(*old, L2State::Pending);
        }
        s.replication.set(step, st);
        for old in retry {
            let _span = tracing::info_span!("re-replicate", step = old).entered();
            let st = replicate(s, old);
            if matches!(st, L2State::Replicated { .. }) {
                tracing::info!(step = old, "degraded step replicated again");
            }
            s.replication.set(old, st);
        }
    }
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
            let on_l1 = crate::restore::restorable(&s.cfg, &steps);
            degraded
                .into_iter()
                .filter(|st| on_l1.contains(st))
                .collect()
        }
        Err(_) => Vec::new(),
    }
}

fn replicate(s: &Shared, step: u64) -> L2State {
    let wanted = s.cfg.replicas.min(s.l2.len());
    let mut peers = Vec::new();
    let mut errors = Vec::new();
    let mut sent = 0;
    for p in &s.l2 {
        if peers.len() == wanted {
            break;
        }
        match push(s, &p.store, step) {
            Ok(n) => {
                sent += n;
                peers.push(p.name.clone());
            }
            Err(e) => errors.push(format!("{}: {e}", p.name)),
        }
    }
    if peers.len() == wanted {
        L2State::Replicated {
            peers,
            wanted,
            sent,
        }
    } else {
        L2State::Degraded {
            peers,
            wanted: s.cfg.replicas,
            errors,
        }
    }
}

/// Pushes this rank's shard of `step` from L1 to one peer and commits it
/// there. Returns the chunk bytes sent.
fn push(s: &Shared, peer: &PeerStore, step: u64) -> Result<u64> {
    let job = &s.cfg.job;
    let steps = s.rt.block_on(s.l1.list_steps(job))?;
    let (m, bytes, record) = crate::restore::load_manifest(s, &s.l1, &steps, step)?;
    let ids: Vec<ChunkId> = m.chunks.iter().map(|c| c.id).collect();
    let present = s.rt.block_on(peer.has_chunks(job, &ids))?;
    let missing: Vec<usize> = (0..ids.len())
        .filter(|&i| present.get(i) != Some(&true))
        .collect();
    let sent = crate::readback::send_from_l1(
        s,
        &m,
        &missing,
        PUSH_BATCH_BYTES,
        crate::readback::Check::Receiver,
        |puts| {
            // These ids were just found missing: no second check per chunk.
            Ok(s.rt
                .block_on(peer.put_missing_chunks(job, puts))?
                .bytes_written)
        },
    )?;
    s.rt.block_on(peer.put_manifest(job, step, s.cfg.rank, &bytes))?;
    s.rt.block_on(peer.commit(&record))?;
    Ok(sent)
}
