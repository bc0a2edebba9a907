//! Priority restore ([`Checkpointer::restore_first`]): the entries a caller
//! names (the model's weights, say) are read, verified and handed over
//! first; the rest (optimizer state, blobs) streams behind them on a
//! thread of its own, so training can start its forward passes while the
//! optimizer state is still arriving.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checkpointer::Checkpointer;
use crate::error::{Error, Result};
use strata_format::ShardManifest;

use crate::restore::fetch::{chunks_of, fetch_into};
use crate::restore::place::Loaded;
use crate::restore::StepSelector;
use crate::state::{RestoredEntry, RestoredState};
use crate::stats::RestoreStats;

/// Whether entry `name` is `prefix` or lies below it: `"model"` covers
/// `model.layers.0.weight` and `model/embed`, not `model_ema`.
pub fn entry_under(name: &str, prefix: &str) -> bool {
    match name.strip_prefix(prefix) {
        Some("") => true,
        Some(rest) => rest.starts_with('.') || rest.starts_with('/'),
        None => false,
    }
}

/// A restore whose first entries are in place and whose rest is being
/// read ([`Checkpointer::restore_first`]).
pub struct PriorityRestore {
    /// The step, its metadata, and the entries asked for first (in save
    /// order), every byte verified. `stats.first_usable` is the time they
    /// took.
    pub first: RestoredState,
    rest: mpsc::Receiver<Result<RestoredState>>,
    outcome: Option<Result<RestoredState>>,
    /// Set on drop: the rest's read ends at its next batch.
    stop: Arc<AtomicBool>,
}

impl Drop for PriorityRestore {
    /// Stops the rest's read at its next batch (a batch in flight
    /// finishes) and returns at once; the thread then frees what it read
    /// and lets go of the checkpointer. Nothing is committed or written
    /// back for a step whose rest was not read whole.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for PriorityRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PriorityRestore")
            .field("step", &self.first.step)
            .field("first", &self.first.entries.len())
            .finish()
    }
}

impl PriorityRestore {
    /// Whether the rest was read (or failed): [`Self::wait`] returns at once.
    pub fn is_done(&mut self) -> bool {
        if self.outcome.is_none() {
            match self.rest.try_recv() {
                Ok(r) => self.outcome = Some(r),
                Err(mpsc::TryRecvError::Empty) => return false,
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.outcome = Some(Err(Error::Pipeline("the restore thread stopped".into())));
                }
            }
        }
        true
    }

    /// Waits for the rest and returns it: the other entries (in save
    /// order), every byte verified, with the counters of the whole restore
    /// (`stats.first_usable` the time to the first entries, `duration` the
    /// time to everything). Once it returns, the restore holds no
    /// reference to the checkpointer.
    pub fn wait(mut self) -> Result<RestoredState> {
        if let Some(r) = self.outcome.take() {
            return r;
        }
        self.rest
            .recv()
            .map_err(|_| Error::Pipeline("the restore thread stopped".into()))?
    }
}

impl Checkpointer {
    /// Priority restore: agrees on the selected step with every rank (as
    /// [`Self::restore`]; all ranks call it together), reads and verifies
    /// the entries under the `first` names (an entry's name, or a prefix
    /// of it up to a `.` or `/`: `"model"` covers `model.layers.0.weight`)
    /// and returns them, while the other entries are read behind them on a
    /// thread of its own ([`PriorityRestore::wait`]). The time to the
    /// first entries is `first.stats.first_usable`; it is close to their
    /// share of the bytes, since they are read alone, before the rest.
    ///
    /// A name that covers no entry of this rank's shard is
    /// [`Error::InvalidState`] before any chunk is read (on this rank only:
    /// the ranks agreed on the step already and no round follows). A step
    /// read from L3 is written back to L1 and committed there once both
    /// parts are in, as by [`Self::restore`].
    ///
    /// While the rest is read, the process's background copies hold back
    /// (as for any restore), which slows what waits for them (`flush`,
    /// `delete`, a save's wait for the peers or L3). Dropping the
    /// [`PriorityRestore`] before [`PriorityRestore::wait`] stops the
    /// rest's read at its next batch; such a restore is counted neither
    /// as done nor as failed in the metrics. A chunk holding
    /// entries of both parts (small entries packed together) is read once,
    /// by the first part, which places the rest's bytes of it too (in the
    /// rest's buffers, handed over by [`PriorityRestore::wait`]); the first
    /// part's stats count it.
    pub fn restore_first(
        self: &Arc<Self>,
        which: StepSelector,
        first: &[&str],
    ) -> Result<PriorityRestore> {
        let (step, loaded) = self.agree_counted(which)?;
        let started = Instant::now();
        let m = &loaded.shard.manifest;
        let early: Vec<bool> = m
            .entries
            .iter()
            .map(|e| first.iter().any(|p| entry_under(&e.name, p)))
            .collect();
        // Every name must cover an entry of this rank's shard: a typo
        // beside a good name would silently send its entries to the rest.
        let bare: Vec<&str> = first
            .iter()
            .copied()
            .filter(|p| !m.entries.iter().any(|e| entry_under(&e.name, p)))
            .collect();
        if first.is_empty() || !bare.is_empty() {
            let e = Error::InvalidState(format!(
                "no entry of step {step} lies under {bare:?} (restore_first{})",
                if first.is_empty() {
                    ": no name given"
                } else {
                    ""
                }
            ));
            self.shared.metrics.read_done(Err(&e));
            return Err(e);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let late: Vec<bool> = early.iter().map(|e| !e).collect();
        let first_chunks = chunks_of(m, &early);
        // The first part fills the rest's segments of the chunks it reads
        // (small entries packed beside the first ones), which the rest
        // then does not read again: those entries' buffers now, the
        // others' on the rest's thread (allocating all of them here would
        // delay the first part, by zeroing reused memory).
        let touched: Vec<bool> = m
            .entries
            .iter()
            .zip(&late)
            .map(|(e, &l)| {
                l && e
                    .segments
                    .iter()
                    .any(|seg| first_chunks.get(seg.chunk as usize) == Some(&true))
            })
            .collect();
        let mut touched_entries = alloc_entries(m, &touched);
        let rest_chunks: Vec<bool> = chunks_of(m, &late)
            .iter()
            .zip(&first_chunks)
            .map(|(&r, &f)| r && !f)
            .collect();
        let head = {
            let mut entries = alloc_entries(m, &early);
            let mut dests = slots(&early, &mut entries);
            for (d, r) in dests.iter_mut().zip(slots(&touched, &mut touched_entries)) {
                if d.is_none() {
                    *d = r;
                }
            }
            fetch_into(
                &self.shared,
                &loaded,
                &mut dests,
                Some(&first_chunks),
                true,
                &stop,
            )
            .map(|st| (entries, st))
        };
        let head = match head {
            Ok(part) => part,
            Err(e) => {
                self.shared.metrics.read_done(Err(&e));
                return Err(e);
            }
        };
        let (entries, mut first_stats) = head;
        let first_usable = started.elapsed();
        first_stats.first_usable = Some(first_usable);
        first_stats.duration = first_usable;
        let first_part = RestoredState {
            step,
            entries,
            metadata: m.metadata.clone(),
            stats: first_stats.clone(),
        };
        let (tx, rx) = mpsc::channel();
        let me = self.clone();
        let stopped = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("strata-restore-rest".into())
            .spawn(move || {
                let rest = Rest {
                    which: &late,
                    touched: &touched,
                    entries: touched_entries,
                    chunks: &rest_chunks,
                };
                let r = me.read_rest(step, &loaded, rest, first_stats, started, &stopped);
                // A dropped handle stopped it: neither done nor failed
                // (a failure of the rest is counted, dropped or not).
                let stopped_by_drop = r
                    .as_ref()
                    .err()
                    .is_some_and(crate::restore::fetch::is_stopped);
                if !stopped_by_drop {
                    me.shared.metrics.read_done(r.as_ref().map(|st| &st.stats));
                }
                // Once `wait` returns, nothing holds the checkpointer for
                // this restore (`Arc::try_unwrap` works again).
                drop(me);
                let _ = tx.send(r);
            });
        if let Err(e) = spawned {
            let e = Error::Pipeline(format!("cannot start a restore thread: {e}"));
            self.shared.metrics.read_done(Err(&e));
            return Err(e);
        }
        Ok(PriorityRestore {
            first: first_part,
            rest: rx,
            outcome: None,
            stop,
        })
    }

    /// Reads the entries marked in `which` into fresh memory (every entry:
    /// [`Self::restore`]'s read).
    pub(super) fn read_part(
        &self,
        loaded: &Loaded,
        which: &[bool],
        rehydrate: bool,
        stop: &AtomicBool,
    ) -> Result<(Vec<RestoredEntry>, RestoreStats)> {
        let mut entries = alloc_entries(&loaded.shard.manifest, which);
        let stats = fetch_into(
            &self.shared,
            loaded,
            &mut slots(which, &mut entries),
            None,
            rehydrate,
            stop,
        )?;
        Ok((entries, stats))
    }

    /// The rest of a priority restore, with the whole restore's counters.
    fn read_rest(
        &self,
        step: u64,
        loaded: &Loaded,
        rest: Rest<'_>,
        first: RestoreStats,
        started: Instant,
        stop: &AtomicBool,
    ) -> Result<RestoredState> {
        let Rest {
            which,
            touched,
            entries: filled,
            chunks,
        } = rest;
        // The rest's entries in save order: those the first part began,
        // and fresh buffers for the others.
        let untouched: Vec<bool> = which.iter().zip(touched).map(|(&w, &t)| w && !t).collect();
        let (mut filled, mut fresh) = (
            filled.into_iter(),
            alloc_entries(&loaded.shard.manifest, &untouched).into_iter(),
        );
        let mut entries: Vec<RestoredEntry> = Vec::new();
        for (&w, &t) in which.iter().zip(touched) {
            let next = match (w, t) {
                (true, true) => filled.next(),
                (true, false) => fresh.next(),
                _ => continue,
            };
            entries.extend(next);
        }
        let any = which.contains(&true);
        let rest = if any {
            fetch_into(
                &self.shared,
                loaded,
                &mut slots(which, &mut entries),
                Some(chunks),
                true,
                stop,
            )?
        } else {
            RestoreStats::default()
        };
        let mut stats = merge(&first, &rest, started.elapsed());
        if first.rehydrated && (rest.rehydrated || !any) {
            stats.rehydrated = self.commit_on_l1(loaded);
        } else {
            stats.rehydrated = false;
        }
        Ok(RestoredState {
            step,
            entries,
            metadata: loaded.shard.manifest.metadata.clone(),
            stats,
        })
    }
}

/// The rest of a priority restore: its entries (marked in `which`), the
/// buffers of those the first part began (marked in `touched`, in save
/// order, their segments in the first part's chunks filled), and the
/// chunks left to read for them.
struct Rest<'a> {
    which: &'a [bool],
    touched: &'a [bool],
    entries: Vec<RestoredEntry>,
    chunks: &'a [bool],
}

/// Zeroed buffers for the entries marked in `which`, in save order.
fn alloc_entries(m: &ShardManifest, which: &[bool]) -> Vec<RestoredEntry> {
    m.entries
        .iter()
        .zip(which)
        .filter(|(_, &w)| w)
        .map(|(e, _)| {
            let mut bytes = vec![0u8; e.len as usize];
            // Untouched memory yet: let it fault in as huge pages.
            strata_tiered::aligned::advise_huge_pages(&mut bytes);
            RestoredEntry {
                name: e.name.clone(),
                kind: e.kind.clone(),
                bytes,
            }
        })
        .collect()
}

/// The destinations of a read, one per manifest entry: the buffers of
/// `mine` (the entries marked in `which`, in order) at their marks.
fn slots<'a>(which: &[bool], mine: &'a mut [RestoredEntry]) -> Vec<Option<&'a mut [u8]>> {
    let mut it = mine.iter_mut();
    which
        .iter()
        .map(|&w| {
            if w {
                it.next().map(|e| e.bytes.as_mut_slice())
            } else {
                None
            }
        })
        .collect()
}

/// One restore's counters from its two reads.
fn merge(first: &RestoreStats, rest: &RestoreStats, total: Duration) -> RestoreStats {
    RestoreStats {
        step: first.step,
        chunks: first.chunks + rest.chunks,
        bytes_read: first.bytes_read + rest.bytes_read,
        bytes_from_l3: first.bytes_from_l3 + rest.bytes_from_l3,
        bytes_from_l2: first.bytes_from_l2 + rest.bytes_from_l2,
        chunks_repaired: first.chunks_repaired + rest.chunks_repaired,
        rehydrated: first.rehydrated && rest.rehydrated,
        first_usable: first.first_usable,
        duration: total,
    }
}

#[cfg(test)]
mod tests {
    use super::entry_under;

    #[test]
    fn a_prefix_covers_whole_path_components_only() {
        assert!(entry_under("model", "model"));
        assert!(entry_under("model.layers.0.weight", "model"));
        assert!(entry_under("model/embed", "model"));
        assert!(entry_under("model.layers.0.weight", "model.layers.0"));
        assert!(!entry_under("model_ema.w", "model"));
        assert!(!entry_under("mod", "model"));
        assert!(!entry_under("model.layers.10.weight", "model.layers.1"));
    }
}
