//! Restore: agree on a step ([`agreement`]), read the manifest from the
//! fastest tier with a good copy (the catalog, `crate::tiers`), fetch and
//! verify every chunk ([`fetch`]; a step only L3 holds by ranged frame
//! reads, [`l3`]), and place the bytes in the destination buffers
//! ([`place`]).

pub(crate) mod agreement;
pub(crate) mod fetch;
pub(crate) mod l3;
pub(crate) mod payload;
pub(crate) mod place;
pub(crate) mod priority;
pub(crate) mod shared_l3;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::checkpointer::Checkpointer;
use crate::error::{Error, Result};
use crate::gpu::DeviceBytes;
use crate::restore::agreement::Holdings;
use crate::restore::fetch::{chunks_of, fetch_into};
use crate::restore::place::{Loaded, Source};
use crate::restore::shared_l3::{L3View, LISTER};
use crate::state::RestoredState;
use crate::stats::RestoreStats;
use crate::tiers::copy::commit_copy;
use crate::tiers::{Catalog, TierKind};
use strata_tiered::aligned::align_up;

/// Every tier's listing for one restore, and what this rank tells the
/// others it can restore.
struct Listed {
    catalog: Catalog,
    holdings: Holdings,
}

/// Which step to restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepSelector {
    /// The newest step every rank can restore.
    Latest,
    /// This step (every rank must be able to restore it).
    Step(u64),
}

pub(crate) use crate::coord::commit::restorable;

/// A step every rank agreed to restore, with this rank's manifest loaded
/// and checked against its commit record ([`Checkpointer::plan_restore`]).
pub struct RestorePlan {
    step: u64,
    loaded: Loaded,
}

impl RestorePlan {
    /// The step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// This rank's manifest of the step: its entries and metadata.
    pub fn manifest(&self) -> &strata_format::ShardManifest {
        &self.loaded.shard.manifest
    }
}

impl std::fmt::Debug for RestorePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestorePlan")
            .field("step", &self.step)
            .field("entries", &self.loaded.shard.manifest.entries.len())
            .finish()
    }
}

impl Checkpointer {
    /// The steps this rank has committed on L1, oldest first.
    pub fn committed_steps(&self) -> Result<Vec<u64>> {
        let s = &self.shared;
        let steps = s.rt.block_on(s.l1.list_steps(&s.cfg.job))?;
        Ok(restorable(&s.cfg, &steps).into_iter().collect())
    }

    /// Restores the selected step and returns the state (entries in save
    /// order, every byte verified). All ranks must call this together.
    pub fn restore(&self, which: StepSelector) -> Result<RestoredState> {
        let (step, loaded) = self.agree_counted(which)?;
        let r = self.restore_whole(step, loaded);
        self.shared
            .metrics
            .read_done(r.as_ref().map(|st| &st.stats));
        r
    }

    /// [`Self::agree_and_load`], counted in the metrics (a restore, or a
    /// failed one).
    fn agree_counted(&self, which: StepSelector) -> Result<(u64, Loaded)> {
        let latest = matches!(which, StepSelector::Latest);
        let r = self.agree_and_load(which);
        match &r {
            Ok(_) => self.shared.metrics.restore_agreed(),
            // A job's first start: nothing saved yet is not a failure.
            Err(Error::NothingToRestore(_)) if latest => {}
            Err(e) => self.shared.metrics.restore_failed(e),
        }
        r
    }

    fn restore_whole(&self, step: u64, loaded: Loaded) -> Result<RestoredState> {
        let all = vec![true; loaded.shard.manifest.entries.len()];
        let (entries, mut stats) = self.read_part(&loaded, &all, true, &AtomicBool::new(false))?;
        if stats.rehydrated {
            stats.rehydrated = self.commit_on_l1(&loaded);
        }
        Ok(RestoredState {
            step,
            entries,
            metadata: loaded.shard.manifest.metadata,
            stats,
        })
    }

    /// [`Self::restore`] for async code: runs on a thread of its own (the
    /// restore blocks on disk I/O and hashing, which must not run on an
    /// async runtime's workers) and resolves with the state. Works on any
    /// executor.
    pub fn restore_async(
        self: &std::sync::Arc<Self>,
        which: StepSelector,
    ) -> impl std::future::Future<Output = Result<RestoredState>> + Send + 'static {
        let me = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("strata-restore".into())
            .spawn(move || {
                let _ = tx.send(me.restore(which));
            });
        async move {
            spawned.map_err(|e| Error::Pipeline(format!("cannot start a restore thread: {e}")))?;
            rx.await
                .map_err(|_| Error::Pipeline("the restore thread stopped".into()))?
        }
    }

    /// Agrees with every rank on the selected step, exactly as
    /// [`Self::restore`] does, and loads this rank's manifest, reading no
    /// chunk. All ranks call it together. The plan's manifest says what the
    /// step holds (names, dtypes, shapes, lengths, metadata), so a caller
    /// can allocate its own buffers (the Python bindings allocate tensors)
    /// and then read into them with [`Self::restore_planned_into`], once or
    /// in parts, without agreeing again.
    pub fn plan_restore(&self, which: StepSelector) -> Result<RestorePlan> {
        let (step, loaded) = self.agree_counted(which)?;
        Ok(RestorePlan { step, loaded })
    }

    /// Restores the selected step into caller-provided buffers, by entry name
    /// (a subset of the entries is fine; only their chunks are read). Each
    /// buffer must be exactly the entry's length. Returns what was read
    /// (the step is `stats.step`).
    pub fn restore_into(
        &self,
        which: StepSelector,
        dests: &mut [(&str, &mut [u8])],
    ) -> Result<RestoreStats> {
        let plan = self.plan_restore(which)?;
        self.restore_planned_into(&plan, dests)
    }

    /// Reads the entries named in `dests` of a planned step (see
    /// [`Self::plan_restore`]) into caller-provided buffers, each exactly
    /// the entry's length, every chunk verified. Local to this rank: no
    /// agreement with the others.
    pub fn restore_planned_into(
        &self,
        plan: &RestorePlan,
        dests: &mut [(&str, &mut [u8])],
    ) -> Result<RestoreStats> {
        let r = self.read_planned(plan, dests, &mut [], &[]);
        self.shared.metrics.read_done(r.as_ref());
        r
    }

    /// The first part of a priority read of a planned step, in
    /// caller-provided buffers: reads the chunks of the entries in `first`
    /// and fills them whole, and fills the bytes of the entries in `rest`
    /// that those chunks hold too (small entries packed beside them), so
    /// that [`Self::restore_planned_rest`] does not read those chunks
    /// again. The other bytes of `rest`'s buffers are left as they are.
    pub fn restore_planned_first(
        &self,
        plan: &RestorePlan,
        first: &mut [(&str, &mut [u8])],
        rest: &mut [(&str, &mut [u8])],
    ) -> Result<RestoreStats> {
        let r = self.read_planned(plan, first, rest, &[]);
        self.shared.metrics.read_done(r.as_ref());
        r
    }

    /// The rest of a priority read begun by [`Self::restore_planned_first`]
    /// with `first` (its entries' names) and the same buffers in `rest`:
    /// reads the chunks of `rest`'s entries that hold no entry of `first`;
    /// the bytes of the others are in place already. The buffers must be
    /// the ones that call filled (the bytes it placed are not read again,
    /// nor checked); a name in both `rest` and `first` is
    /// [`Error::InvalidState`].
    pub fn restore_planned_rest(
        &self,
        plan: &RestorePlan,
        rest: &mut [(&str, &mut [u8])],
        first: &[&str],
    ) -> Result<RestoreStats> {
        let r = self.read_planned(plan, rest, &mut [], first);
        self.shared.metrics.read_done(r.as_ref());
        r
    }

    /// Reads `dests` whole and `along` where the chunks read hold it,
    /// skipping the chunks of the entries named in `after`.
    fn read_planned(
        &self,
        plan: &RestorePlan,
        dests: &mut [(&str, &mut [u8])],
        along: &mut [(&str, &mut [u8])],
        after: &[&str],
    ) -> Result<RestoreStats> {
        let (step, loaded) = (plan.step, &plan.loaded);
        let manifest = &loaded.shard.manifest;
        let index: HashMap<&str, usize> = manifest
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.as_str(), i))
            .collect();
        let find = |name: &str| {
            index
                .get(name)
                .copied()
                .ok_or_else(|| Error::InvalidState(format!("step {step} has no entry {name:?}")))
        };
        let n = manifest.entries.len();
        let mut slots: Vec<Option<&mut [u8]>> = (0..n).map(|_| None).collect();
        let mut seen = std::collections::HashSet::new();
        for (name, _) in dests.iter().chain(along.iter()) {
            if !seen.insert(*name) {
                return Err(Error::InvalidState(format!(
                    "two buffers for entry {name:?}"
                )));
            }
        }
        let mut wanted = vec![false; n];
        for (name, buf) in dests.iter_mut() {
            let i = find(name)?;
            wanted[i] = true;
            slots[i] = Some(fit(manifest, i, name, buf)?);
        }
        for (name, buf) in along.iter_mut() {
            let i = find(name)?;
            slots[i] = Some(fit(manifest, i, name, buf)?);
        }
        let mut before = vec![false; n];
        for name in after {
            let i = find(name)?;
            // An entry of both parts would be left as the caller's buffer
            // held it.
            if wanted[i] {
                return Err(Error::InvalidState(format!(
                    "entry {name:?} is both read now and named as read before"
                )));
            }
            before[i] = true;
        }
        // The chunks of `dests`, less those a first part read already.
        let read: Vec<bool> = chunks_of(manifest, &wanted)
            .into_iter()
            .zip(chunks_of(manifest, &before))
            .map(|(w, done)| w && !done)
            .collect();
        fetch_into(
            &self.shared,
            loaded,
            &mut slots,
            Some(&read),
            false,
            &AtomicBool::new(false),
        )
    }

    /// Restores the selected step into GPU memory, by entry name: each
    /// chunk is read and verified into pinned host memory, then copied to
    /// its device buffer on Strata's own stream; returns once every copy
    /// has landed. Each buffer must be exactly the entry's length. Needs the
    /// `cuda` feature and a driver, else [`Error::Gpu`] (before any read).
    pub fn restore_into_device(
        &self,
        which: StepSelector,
        dests: &[(&str, DeviceBytes)],
    ) -> Result<RestoreStats> {
        let s = &self.shared;
        let Some(gpu) = s.gpu_for(dests.iter().map(|(_, d)| *d))? else {
            return self.restore_into(which, &mut []);
        };
        let mut offsets = Vec::with_capacity(dests.len());
        let mut total = 0usize;
        for (_, d) in dests {
            offsets.push(total);
            let len = usize::try_from(d.len())
                .map_err(|_| Error::InvalidState("device buffer too large".into()))?;
            total += align_up(len);
        }
        let mut host = s.pool.take(total, Some(&gpu));
        let result = (|| {
            let stats = {
                let mut slots: Vec<(&str, &mut [u8])> = Vec::with_capacity(dests.len());
                let mut rest: &mut [u8] = &mut host;
                let mut at = 0usize;
                for ((name, d), &off) in dests.iter().zip(&offsets) {
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(off - at);
                    let (mine, tail) = tail.split_at_mut(d.len() as usize);
                    slots.push((name, mine));
                    rest = tail;
                    at = off + d.len() as usize;
                }
                self.restore_into(which, &mut slots)?
            };
            let _span = tracing::info_span!("htod").entered();
            for ((_, d), &off) in dests.iter().zip(&offsets) {
                gpu.enqueue_htod(d.ptr(), &host[off..off + d.len() as usize])?;
            }
            gpu.synchronize()?;
            Ok(stats)
        })();
        // After an error, copies queued before it may still read `host`.
        let drained = result.is_ok() || gpu.synchronize().is_ok();
        crate::gpu::release_after_error(drained, host, |h| s.pool.give_back_owned(h));
        result
    }

    /// After a full restore from L3 wrote every chunk back to L1: the
    /// manifest and the commit record too, so the step is on L1 again (the
    /// next save deduplicates against it, the next restore is local).
    /// Returns whether it worked; failures are logged, not fatal.
    fn commit_on_l1(&self, loaded: &Loaded) -> bool {
        let s = &self.shared;
        let step = loaded.shard.manifest.info.step;
        match s
            .rt
            .block_on(commit_copy(&*s.l1, &s.cfg.job, &loaded.shard))
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(step, error = %e, "could not commit the restored step on L1");
                false
            }
        }
    }

    /// Agrees with every rank on the step and reads and checks this rank's
    /// manifest against its commit record (before the agreement where it
    /// can, `load_in_advance`; writing that record first when
    /// this rank holds the manifest of a step another rank committed: it
    /// rolls the decided step forward).
    fn agree_and_load(&self, which: StepSelector) -> Result<(u64, Loaded)> {
        let s = &self.shared;
        let cfg = &s.cfg;
        // A save of this process between its vote and its record would
        // list as a partial step, and rolling it forward would race its
        // own record: wait for it first (its handle reports its outcome).
        self.wait_inflight();
        let Listed {
            ref mut catalog,
            ref mut holdings,
        } = self.list_tiers()?;
        let n = s.restores.fetch_add(1, Ordering::Relaxed);
        let wanted = match which {
            StepSelector::Latest => None,
            StepSelector::Step(st) => Some(st),
        };
        // The step this rank expects every rank to restore, read and
        // checked before the round: when every rank checked the step the
        // decision picks, the round asking whether each can use it is
        // skipped (`Agreement::ready`), a restore's second round of etcd
        // writes from every node.
        let mut early = self.load_in_advance(catalog, holdings, wanted);
        holdings.checked = early.as_ref().and_then(|(st, r)| r.is_ok().then_some(*st));
        let agreement = crate::restore::agreement::agree(
            &*s.coord,
            cfg,
            &format!("restore/{}/{n}", cfg.job),
            holdings,
            wanted,
        )?;
        agreement.check_blind(wanted)?;
        agreement.check_world(cfg, wanted)?;
        // What L3 holds of this rank as the lister saw it, when this rank
        // left L3 to it (`shared_l3`).
        let view = agreement.l3.as_ref().filter(|_| holdings.l3_deferred);
        let l3_mine = view.map_or_else(Default::default, |v| v.steps_of(cfg.rank));
        // What this rank committed anywhere: a later save of one of these
        // steps is refused without listing the tiers again. (Only once the
        // ranks agreed: a failed agreement leaves the first save to list.)
        // Where L3 was left to the lister, the view holds every L3 step
        // from the oldest of the newest decided ones a decision carries:
        // only a save of a step older than that reads this rank's record
        // there first (`Shared::refuse_committed`; a save past the window,
        // the rare case, not every save).
        s.committed.fill(holdings.committed.clone());
        s.committed.fill(l3_mine.clone());
        if view.is_some() {
            let window = crate::restore::agreement::WINDOW;
            if let Some(&edge) = agreement.decided.iter().rev().nth(window - 1) {
                s.l3_unlisted_below.fetch_max(edge, Ordering::Relaxed);
            }
        }
        let ready = agreement.ready;
        let mut common = agreement.common;
        // The newest common step (or the one asked for); if its manifest
        // turns out unusable on some rank, every rank drops it together and
        // tries the next older one (only for `Latest`).
        let mut last_err = None;
        loop {
            let step = match which {
                StepSelector::Latest => match common.last() {
                    Some(&st) => st,
                    None => {
                        return Err(last_err.unwrap_or(Error::NothingToRestore(Some(
                            "the ranks share no committed step".into(),
                        ))));
                    }
                },
                StepSelector::Step(st) if common.contains(&st) => st,
                StepSelector::Step(st) => {
                    return Err(last_err.unwrap_or_else(|| {
                        Error::NothingToRestore(Some(format!(
                            "step {st} is not committed by every rank"
                        )))
                    }))
                }
            };
            // Read before the round: kept when it succeeded. A failure is
            // read again now, as before the check moved: the agreement may
            // have waited long for slow ranks, and a passing error (a peer's
            // timeout) must not drop the step on every rank.
            let before = early
                .take_if(|(st, r)| *st == step && r.is_ok())
                .and_then(|(_, r)| r.ok());
            let here = if let Some(loaded) = before {
                if ready == Some(step) {
                    // Every rank checked this step before the round.
                    return Ok((step, loaded));
                }
                Ok(loaded)
            } else if holdings.committed.contains(&step) || l3_mine.contains(&step) {
                self.load_step(catalog, step, l3_mine.contains(&step))
            } else {
                // Decided (another rank committed it) and held here without
                // a record: roll it forward, then read it from L1. L3 gets
                // this shard too if it holds the step of other ranks.
                let upload = s.tiers.remote().is_some_and(|l3| match view {
                    Some(v) => v.steps().contains(&step),
                    None => catalog
                        .info(l3, step)
                        .is_some_and(|st| !st.records.is_empty()),
                });
                crate::roll_forward::roll_forward(s, step, upload).map(|shard| Loaded {
                    shard,
                    source: Source::L1,
                })
            };
            use crate::coord::commit::Readiness;
            let mine = match &here {
                Ok(_) => Readiness::Usable,
                Err(Error::TierUnavailable { .. }) => Readiness::Blind,
                Err(_) => Readiness::Unusable,
            };
            let ready = crate::coord::commit::restore_ready(
                &*s.coord,
                cfg,
                &format!("restore/{}/{n}/ready/{step}", cfg.job),
                mine,
            )?;
            match here {
                Ok(loaded) if ready == Readiness::Usable => return Ok((step, loaded)),
                Err(e @ Error::TierUnavailable { .. }) => return Err(e),
                _ if ready == Readiness::Blind => {
                    return Err(Error::TierUnavailable {
                        tier: "L3 (seen by another rank)".into(),
                        reason: format!("a rank could not read its shard of step {step} there"),
                    })
                }
                Ok(_) => {
                    tracing::warn!(
                        step,
                        "another rank cannot use this step; trying an older one"
                    );
                    last_err = Some(Error::NothingToRestore(Some(format!(
                        "step {step} is unreadable on another rank"
                    ))));
                }
                Err(e) => {
                    tracing::warn!(step, error = %e, "this rank cannot use the step; trying an older one");
                    last_err = Some(e);
                }
            }
            common.remove(&step);
            if let StepSelector::Step(_) = which {
                common.clear();
            }
        }
    }

    /// Reads and checks, before the restore's round, this rank's manifest
    /// of the step it expects the ranks to pick: the one asked for, or its
    /// newest committed step (none when it holds a newer manifest without
    /// a record: another rank may have committed that one, and this rank
    /// rolls it forward only once the ranks agree).
    fn load_in_advance(
        &self,
        catalog: &mut Catalog,
        holdings: &Holdings,
        wanted: Option<u64>,
    ) -> Option<(u64, Result<Loaded>)> {
        let step = match wanted {
            Some(w) => holdings.committed.contains(&w).then_some(w)?,
            None => *holdings.committed.last()?,
        };
        if wanted.is_none() && holdings.partial.last().is_some_and(|p| *p > step) {
            return None;
        }
        Some((step, self.load_step(catalog, step, false)))
    }

    /// Lists every tier for a restore: what each holds, and this rank's
    /// [`Holdings`]. L1 must list. A tier that cannot be listed (an L3, a
    /// peer) is reported to every rank through the agreement, which fails
    /// the restore on all with [`Error::TierUnavailable`] when it may hide
    /// a newer step ([`crate::restore::agreement::Agreement::check_blind`]: this
    /// rank's L1 holds no committed step, or another rank holds a newer
    /// one), unless `skip_unreadable_tiers` is set.
    ///
    /// In a job of several ranks, only rank [`LISTER`] lists L3; it sends
    /// what it saw ([`L3View`]) in its holdings, and the others leave L3
    /// out of theirs (`shared_l3`).
    fn list_tiers(&self) -> Result<Listed> {
        let s = &self.shared;
        let cfg = &s.cfg;
        let shared = cfg.world_size > 1 && s.tiers.remote().is_some();
        let (catalog, defer) = s.catalog_leaving_l3_to_the_lister();
        let mut holdings = Holdings {
            l3_deferred: defer,
            ..Holdings::default()
        };
        let mut unreadable = Vec::new();
        for l in catalog.listings() {
            let local = l.tier.kind == TierKind::L1;
            let l3 = l.tier.kind == TierKind::L3;
            if l3 && defer {
                continue;
            }
            match &l.steps {
                Ok(steps) => {
                    holdings.add_listing(cfg, steps, local);
                    if l3 && shared {
                        holdings.l3 = Some(L3View::of(cfg, steps));
                        // The lister knows what L3 holds: uploads may go
                        // on (`Shared::l3_unlisted`).
                        s.l3_unlisted.store(false, Ordering::Release);
                    }
                }
                Err(e) if local => return Err(e.clone().into()),
                Err(e) => {
                    tracing::warn!(tier = %l.tier.name, error = %e, "cannot list a tier");
                    let name = match l.tier.kind {
                        TierKind::L2 => format!("L2 {}", l.tier.node()),
                        _ => l.tier.name.clone(),
                    };
                    let why = format!("{name}: {e}");
                    if l3 && shared {
                        s.l3_unlisted.store(true, Ordering::Release);
                    }
                    if l3 && shared && !cfg.skip_unreadable_tiers {
                        // Every rank is as blind to it: the agreement says
                        // so for all of them (`Agreement::of`).
                        holdings.l3 = Some(L3View::Unreadable(why));
                    } else {
                        if l3 && shared {
                            holdings.l3 = Some(L3View::Listed(Default::default()));
                        }
                        unreadable.push(why);
                    }
                }
            }
        }
        holdings.settle();
        holdings.l1_empty = s
            .tiers
            .l1()
            .is_none_or(|l1| restorable(cfg, catalog.steps_of(l1)).is_empty());
        if !unreadable.is_empty() {
            if cfg.skip_unreadable_tiers {
                tracing::warn!(tiers = %unreadable.join(" | "), "restoring without tiers that cannot be listed (skip_unreadable_tiers)");
            } else {
                holdings.unreadable = Some(unreadable.join(" | "));
            }
        }
        Ok(Listed { catalog, holdings })
    }

    /// This rank's manifest of `step`, checked against its record, from
    /// the fastest tier that holds a usable copy (one where this rank's
    /// shard of the step is restorable).
    ///
    /// `in_l3`: the lister saw this rank's record of the step in L3, which
    /// this rank did not list: its record is read there directly (one
    /// request) when no faster tier holds a usable copy.
    fn load_step(&self, catalog: &mut Catalog, step: u64, in_l3: bool) -> Result<Loaded> {
        let s = &self.shared;
        let (rank, l3) = (s.cfg.rank, s.tiers.remote().filter(|_| in_l3));
        let faster = catalog
            .listings()
            .iter()
            .filter_map(|l| l.steps.as_ref().ok())
            .any(|steps| restorable(&s.cfg, steps).contains(&step));
        let found = match l3 {
            None => self.find_shard(catalog, step, |_| true),
            Some(l3) if faster => match self.find_shard(catalog, step, |_| true) {
                Ok(found) => Ok(found),
                Err(e) => {
                    tracing::warn!(step, error = %e, "no usable manifest in a faster tier; reading it from L3");
                    self.fill_l3(catalog, l3, step)?;
                    self.find_shard(catalog, step, |t| t.kind == TierKind::L3)
                }
            },
            Some(l3) => {
                self.fill_l3(catalog, l3, step)?;
                self.find_shard(catalog, step, |_| true)
            }
        };
        let found = found.map_err(|e| match e {
            Error::NothingToRestore(Some(why)) if in_l3 => Error::NothingToRestore(Some(format!(
                "{why}; rank {LISTER} listed rank {rank}'s record of it in L3"
            ))),
            e => e,
        })?;
        Ok(found)
    }

    /// L3's listing in `catalog` for `step`, from this rank's own commit
    /// record read directly; the whole listing when the record is keyed by
    /// another rank (a record naming several shards).
    ///
    /// L3 unreachable from here (while the lister read it) is
    /// [`Error::TierUnavailable`]: the ranks then stop together rather
    /// than go back to an older step (unless `skip_unreadable_tiers`).
    fn fill_l3(&self, catalog: &mut Catalog, l3: &crate::tiers::Tier, step: u64) -> Result<()> {
        let s = &self.shared;
        let (job, rank) = (&s.cfg.job, s.cfg.rank);
        let blind = |e: strata_tiered::StoreError| {
            let e = Error::from(e);
            match e.kind() {
                crate::ErrorKind::Unavailable | crate::ErrorKind::Unauthorized
                    if !s.cfg.skip_unreadable_tiers =>
                {
                    Error::TierUnavailable {
                        tier: format!("{} (seen by rank {rank})", l3.name),
                        reason: e.to_string(),
                    }
                }
                _ => e,
            }
        };
        let record =
            s.rt.block_on(l3.store.get_commit_record(job, step, rank))
                .map_err(blind)?;
        let steps = match record {
            Some(record) => vec![strata_tiered::StepInfo {
                step,
                records: [(rank, record)].into(),
                manifests: [rank].into(),
                ..Default::default()
            }],
            None => s.rt.block_on(l3.store.list_steps(job)).map_err(blind)?,
        };
        catalog.set_listing(&l3.name, steps);
        Ok(())
    }

    /// [`Catalog::shard`] over the tiers `tier` picks, where this rank's
    /// shard of `step` is restorable, as a [`Loaded`].
    fn find_shard(
        &self,
        catalog: &Catalog,
        step: u64,
        tier: impl Fn(&crate::tiers::Tier) -> bool,
    ) -> Result<Loaded> {
        let s = &self.shared;
        let found = s.rt.block_on(catalog.shard(step, s.cfg.rank, |t, steps| {
            tier(t) && restorable(&s.cfg, steps).contains(&step)
        }))?;
        for (tier, e) in &found.errors {
            tracing::warn!(step, tier = %tier, error = %e, "manifest unusable; tried the next tier");
        }
        let source = match found.tier.kind {
            TierKind::L1 => Source::L1,
            TierKind::L3 => Source::L3,
            // The catalog lists the stack in its order: L1, the peers, L3.
            TierKind::L2 => Source::L2(found.index - usize::from(s.tiers.l1().is_some())),
        };
        Ok(Loaded {
            shard: found.shard,
            source,
        })
    }
}

/// `buf` as the destination of entry `i` (`name`): exactly its length.
fn fit<'a>(
    m: &strata_format::ShardManifest,
    i: usize,
    name: &str,
    buf: &'a mut [u8],
) -> Result<&'a mut [u8]> {
    let want = m.entries[i].len;
    if buf.len() as u64 != want {
        return Err(Error::InvalidState(format!(
            "{name:?}: buffer of {} bytes for an entry of {want}",
            buf.len()
        )));
    }
    Ok(buf)
}
