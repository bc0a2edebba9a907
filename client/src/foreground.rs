//! Foreground work first: while a save's snapshot or a restore's reads run
//! in this process, its background copies (the push to the peers after a
//! commit, the upload to L3) hold back at their next batch boundary, so
//! the snapshot gets the cores and the memory bandwidth and the restore
//! gets the disk, the network and the cores. A nice value (see
//! [`crate::priority`]) only weighs CPU contention; this also stops the
//! copies' reads from competing with a restore's and their memcpys with a
//! snapshot's.
//!
//! A copy holds back at most [`MAX_HOLD`] per batch, then sends one batch
//! anyway: foreground work that never ends (a restore loop) slows the
//! copies down, it cannot starve them, and nothing the foreground waits
//! for can wait on a held copy for long.
//!
//! A held copy also leaves its free read buffers to the foreground work
//! ([`Foreground::lend_spares`]): a restore's lanes read into them instead
//! of faulting in new memory (zeroing fresh pages took a third of a busy
//! restore's CPU on two cores), and the copies take back what is left
//! when they go on. At their end the lanes give the copies their free
//! buffers, but only as many bytes as the copies lent and did not get
//! back: the process never holds more read buffers than it would without
//! the loan, and once no copy is held the loan's leftovers are freed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use strata_tiered::AlignedBuf;

use crate::tiers::copy::Pause;
use crate::tiers::recycle::{fit, within};
use strata_tiered::aligned::align_up;

/// Longest a background copy holds back before its next batch.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(1);

/// This process's foreground work in progress.
#[derive(Debug, Default)]
pub(crate) struct Foreground {
    /// Snapshots and restores running now.
    active: AtomicUsize,
    /// Wakes held copies when the last one ends.
    idle: tokio::sync::Notify,
    /// Total time copies held back, for the metrics (nanoseconds).
    held_ns: AtomicU64,
    /// Read buffers the held copies left to the foreground work.
    spares: std::sync::Mutex<Spares>,
    /// Bytes of those buffers a restore read into, for the metrics.
    spares_used: AtomicU64,
}

/// Free read buffers of held copies ([`Foreground::lend_spares`]).
#[derive(Debug, Default)]
struct Spares {
    bufs: Vec<AlignedBuf>,
    /// Bytes of `bufs`.
    bytes: usize,
    /// Bytes the copies lent and did not take back yet: what the pool
    /// takes from a restore's lanes stays within it, so the process holds
    /// no more than the copies did.
    owed: usize,
    /// Copies that lent buffers and have not taken them back: the last to
    /// go on frees what none took.
    lenders: usize,
}

/// Foreground work in progress: background copies hold back until every
/// guard is dropped.
#[must_use = "the foreground work ends when the guard is dropped"]
pub(crate) struct ForegroundGuard<'a>(&'a Foreground);

impl Drop for ForegroundGuard<'_> {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Foreground {
    /// Marks foreground work (a snapshot, a restore's reads) until the
    /// guard is dropped.
    pub(crate) fn enter(&self) -> ForegroundGuard<'_> {
        self.active.fetch_add(1, Ordering::AcqRel);
        ForegroundGuard(self)
    }

    /// Whether foreground work runs now.
    pub(crate) fn busy(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0
    }

    /// Leaves the free read buffers of a copy about to hold back to the
    /// foreground work. Taken (`Ok`) only while foreground work runs: the
    /// copy then calls [`Self::take_back`] once it goes on. Otherwise
    /// (or an empty loan) they are handed back.
    pub(crate) fn lend_spares(
        &self,
        bufs: Vec<AlignedBuf>,
    ) -> std::result::Result<(), Vec<AlignedBuf>> {
        if bufs.is_empty() || !self.busy() {
            return Err(bufs);
        }
        match self.spares.lock() {
            Ok(mut p) => {
                let n: usize = bufs.iter().map(AlignedBuf::capacity).sum();
                p.bufs.extend(bufs);
                p.bytes += n;
                p.owed += n;
                p.lenders += 1;
                Ok(())
            }
            Err(_) => Err(bufs),
        }
    }

    /// Buffers for reads of `lens` bytes, in order, from those the held
    /// copies lent (as [`fit`]: shorter than `lens`, or a placeholder too
    /// small, where none fits).
    pub(crate) fn spares_for(&self, lens: &[usize]) -> Vec<AlignedBuf> {
        let Ok(mut p) = self.spares.lock() else {
            return Vec::new();
        };
        let out = fit(&mut p.bufs, lens);
        let used: usize = out
            .iter()
            .zip(lens)
            .filter(|(b, &len)| b.capacity() >= align_up(len))
            .map(|(b, _)| b.capacity())
            .sum();
        p.bytes = p.bufs.iter().map(AlignedBuf::capacity).sum();
        drop(p);
        self.spares_used.fetch_add(used as u64, Ordering::Relaxed);
        out
    }

    /// Gives a restore lane's free read buffers to the held copies at the
    /// lane's end, as far as they make up for what the copies lent (and
    /// do not find in the pool); the others are freed (after the lock).
    pub(crate) fn return_spares(&self, bufs: Vec<AlignedBuf>) {
        let rest = match self.spares.lock() {
            Ok(mut p) if p.lenders > 0 => {
                let room = p.owed.saturating_sub(p.bytes);
                let (kept, rest) = within(bufs, 0, room);
                p.bytes += kept.iter().map(AlignedBuf::capacity).sum::<usize>();
                p.bufs.extend(kept);
                rest
            }
            _ => bufs,
        };
        drop(rest);
    }

    /// What a copy that lent its buffers takes back as it goes on: the
    /// largest left, up to `limit` bytes. The last lender to go on frees
    /// what is left (after the lock), so nothing is held once every copy
    /// went on.
    pub(crate) fn take_back(&self, limit: usize) -> Vec<AlignedBuf> {
        let Ok(mut p) = self.spares.lock() else {
            return Vec::new();
        };
        let (out, left) = within(std::mem::take(&mut p.bufs), 0, limit);
        let taken: usize = out.iter().map(AlignedBuf::capacity).sum();
        p.owed = p.owed.saturating_sub(taken);
        p.lenders = p.lenders.saturating_sub(1);
        let freed = if p.lenders > 0 {
            p.bufs = left;
            Vec::new()
        } else {
            p.owed = 0;
            left
        };
        p.bytes = p.bufs.iter().map(AlignedBuf::capacity).sum();
        drop(p);
        drop(freed);
        out
    }

    /// Bytes of the held copies' buffers that restores read into.
    pub(crate) fn spares_used(&self) -> u64 {
        self.spares_used.load(Ordering::Relaxed)
    }

    /// Time background copies spent holding back so far.
    pub(crate) fn held(&self) -> Duration {
        Duration::from_nanos(self.held_ns.load(Ordering::Relaxed))
    }

    /// Waits until no foreground work runs, at most `max`. Returns the
    /// time waited.
    pub(crate) async fn until_idle(&self, max: Duration) -> Duration {
        if !self.busy() {
            return Duration::ZERO;
        }
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + max;
        loop {
            // Registered before the check, so the last guard's
            // notify_waiters between the two is not missed.
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if !self.busy() {
                break;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                break;
            }
        }
        let waited = started.elapsed();
        self.held_ns.fetch_add(
            u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        waited
    }
}

impl Pause for Foreground {
    fn before_batch(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            self.until_idle(MAX_HOLD).await;
        })
    }

    fn lend_spares(&self, spares: Vec<AlignedBuf>) -> std::result::Result<(), Vec<AlignedBuf>> {
        Foreground::lend_spares(self, spares)
    }

    fn take_back(&self, limit: usize) -> Vec<AlignedBuf> {
        Foreground::take_back(self, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    }

    #[test]
    fn a_copy_holds_back_until_the_foreground_work_ends() {
        let fg = std::sync::Arc::new(Foreground::default());
        let guard_owner = fg.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let g = guard_owner.enter();
            tx.send(()).ok();
            std::thread::sleep(Duration::from_millis(200));
            drop(g);
        });
        rx.recv().ok();
        let waited = rt().block_on(fg.until_idle(Duration::from_secs(10)));
        t.join().ok();
        assert!(waited >= Duration::from_millis(150), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        assert!(!fg.busy());
        assert!(fg.held() >= waited);
    }

    #[test]
    fn held_copies_lend_their_spare_buffers_to_the_foreground_and_get_back_what_is_left() {
        const MIB: usize = 1 << 20;
        let fg = Foreground::default();
        let bufs = |sizes: &[usize]| -> Vec<AlignedBuf> {
            sizes.iter().map(|&s| AlignedBuf::zeroed(s * MIB)).collect()
        };
        // Nothing in the foreground: nothing is taken.
        assert_eq!(fg.lend_spares(bufs(&[4])).map_err(|b| b.len()), Err(1));
        let g = fg.enter();
        assert!(fg.lend_spares(Vec::new()).is_err(), "an empty loan");
        // Two copies lend theirs.
        assert!(fg.lend_spares(bufs(&[4, 4, 1])).is_ok());
        assert!(fg.lend_spares(bufs(&[8])).is_ok());
        // A restore's read of 3 and 6 MiB takes the smallest that fit.
        let got = fg.spares_for(&[3 * MIB, 6 * MIB]);
        let caps: Vec<usize> = got.iter().map(|b| b.capacity() / MIB).collect();
        assert_eq!(caps, [4, 8]);
        assert_eq!(fg.spares_used(), 12 * MIB as u64);
        // Its lane gives back its free ones at its end (copies lent).
        fg.return_spares(bufs(&[2]));
        drop(g);
        // The first copy to go on takes back the largest within its limit;
        // the last frees what is left.
        let back: Vec<usize> = fg
            .take_back(5 * MIB)
            .iter()
            .map(|b| b.capacity() / MIB)
            .collect();
        assert_eq!(back, [4, 1]);
        let back: Vec<usize> = fg
            .take_back(MIB)
            .iter()
            .map(|b| b.capacity() / MIB)
            .collect();
        assert!(back.is_empty(), "{back:?}");
        let p = fg.spares.lock().expect("pool");
        assert!(p.bufs.is_empty() && p.lenders == 0, "{} left", p.bufs.len());
        drop(p);
        // With no lender waiting, what a lane gives back is freed.
        fg.return_spares(bufs(&[2]));
        assert!(fg.spares.lock().expect("pool").bufs.is_empty());
    }

    #[test]
    fn what_the_lanes_give_back_stays_within_what_the_copies_lent() {
        const MIB: usize = 1 << 20;
        let fg = Foreground::default();
        let bufs =
            |n: usize| -> Vec<AlignedBuf> { (0..n).map(|_| AlignedBuf::zeroed(2 * MIB)).collect() };
        let _g = fg.enter();
        assert!(fg.lend_spares(bufs(1)).is_ok());
        // The pool holds all that was lent: a lane's buffers are freed.
        fg.return_spares(bufs(3));
        assert_eq!(fg.spares.lock().expect("pool").bufs.len(), 1);
        // A restore took it: one of the lane's makes up for it, no more.
        assert_eq!(fg.spares_for(&[MIB]).len(), 1);
        fg.return_spares(bufs(2));
        let p = fg.spares.lock().expect("pool");
        assert_eq!((p.bufs.len(), p.bytes, p.owed), (1, 2 * MIB, 2 * MIB));
    }

    /// The copy's side of the loan: a held copy lends its free buffers and
    /// takes them back as it goes on; one dropped while held ends its
    /// loan all the same (the pool is emptied once no copy lends).
    #[test]
    fn a_held_copy_takes_its_buffers_back_and_a_dropped_one_ends_its_loan() {
        use crate::tiers::copy::hold;
        use crate::tiers::recycle::Recycler;
        use strata_tiered::ChunkData;
        const MIB: usize = 1 << 20;
        let fg = Foreground::default();
        let rt = rt();
        let free = |r: &mut Recycler| -> Vec<*const u8> {
            let f = r.take_free();
            let at = f.iter().map(|b| b.full().as_ptr()).collect();
            r.keep_free(f);
            at
        };
        let mut r = Recycler::new(8 * MIB);
        r.lend([ChunkData::whole(AlignedBuf::zeroed(MIB))]);
        let before = free(&mut r);
        assert_eq!(before.len(), 1);
        // Nothing in the foreground: nothing lent, nothing held.
        rt.block_on(hold(Some(&fg), &mut r));
        assert_eq!(free(&mut r), before);
        // Held: lent while it waits, taken back after.
        let g = fg.enter();
        let waited = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(100), hold(Some(&fg), &mut r)).await
        });
        assert!(waited.is_err(), "a held copy waits");
        // Dropped while held: the loan ended, and the pool is empty.
        {
            let p = fg.spares.lock().expect("pool");
            assert_eq!((p.lenders, p.bufs.len(), p.owed), (0, 0, 0));
        }
        assert!(free(&mut r).is_empty(), "lent, never taken back");
        // Held and let go: it goes on with what it lent.
        r.lend([ChunkData::whole(AlignedBuf::zeroed(MIB))]);
        let before = free(&mut r);
        std::thread::scope(|sc| {
            sc.spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                drop(g);
            });
            rt.block_on(hold(Some(&fg), &mut r));
        });
        assert_eq!(free(&mut r), before);
        assert_eq!(fg.spares.lock().expect("pool").lenders, 0);
    }

    #[test]
    fn a_copy_never_waits_past_its_bound_nor_when_idle() {
        let fg = Foreground::default();
        let rt = rt();
        assert_eq!(
            rt.block_on(fg.until_idle(Duration::from_secs(10))),
            Duration::ZERO
        );
        let g1 = fg.enter();
        let g2 = fg.enter();
        let waited = rt.block_on(fg.until_idle(Duration::from_millis(100)));
        assert!(waited >= Duration::from_millis(90), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        drop(g1);
        // One guard still out: still busy.
        assert!(fg.busy());
        drop(g2);
        assert!(!fg.busy());
    }

    /// A restore beside held copies reads into the buffers they lent
    /// before it faults in new ones, and its lanes give theirs back at
    /// their end (within what the copies lent); the bytes are the step's.
    #[test]
    fn a_restore_reads_into_the_buffers_the_held_copies_lent() {
        use crate::{Checkpointer, Config, StepSelector};
        const MIB: usize = 1 << 20;
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = Config::builder()
            .job("lent")
            .l1_dir(dir.path().join("l1"))
            .io_engine("psync")
            .chunk_size(MIB as u32);
        let ck = Checkpointer::new(cfg).expect("checkpointer");
        // Eight 1 MiB chunks, each unlike the others (1 MiB is no
        // multiple of 251).
        let data: Vec<u8> = (0..8 * MIB).map(|i| (i % 251) as u8).collect();
        ck.save_bytes(1, &data);
        let fg = &ck.shared.foreground;
        let copy = fg.enter();
        let lent: Vec<AlignedBuf> = (0..8).map(|_| AlignedBuf::zeroed(MIB)).collect();
        assert!(fg.lend_spares(lent).is_ok());
        let back = ck.restore(StepSelector::Step(1)).expect("restore");
        assert_eq!(back.get("w").expect("entry").bytes, data);
        // Eight chunks of 1 MiB, one batch: every read into a lent buffer,
        // and the lane's eight given back to the copy at its end.
        assert_eq!(fg.spares_used(), 8 * MIB as u64);
        assert_eq!(fg.spares.lock().expect("pool").bufs.len(), 8);
        drop(copy);
        assert_eq!(fg.take_back(8 * MIB).len(), 8);
        assert_eq!(
            ck.metric("strata_restore_lent_buffer_bytes_total"),
            Some(8.0 * MIB as f64)
        );
        // `metric` reads only series without labels of their own.
        assert_eq!(ck.metric("strata_restores_total"), Some(1.0));
        assert_eq!(ck.metric("strata_restore_bytes_total"), None);
        assert_eq!(ck.metric("strata_restore"), None);
    }

    /// The upload of a committed step holds back while foreground work
    /// runs (what a restore and a snapshot enter), and goes on after it.
    #[test]
    fn the_upload_to_l3_holds_back_for_foreground_work() {
        use crate::{Checkpointer, Config, L3State};
        let dir = tempfile::tempdir().expect("tempdir");
        let l3 = dir.path().join("l3");
        let cfg = Config::builder()
            .job("fg")
            .l1_dir(dir.path().join("l1"))
            .io_engine("psync")
            .chunk_size(1 << 20)
            .l3_url(format!("file://{}", l3.display()))
            .upload_every(1);
        let ck = Checkpointer::new(cfg).expect("checkpointer");
        let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
        let restore = ck.shared.foreground.enter();
        ck.save_bytes(1, &data);
        // The upload starts and holds back before its first batch.
        let t = Instant::now();
        while !matches!(ck.uploads().get(&1), Some(L3State::Uploading { .. })) {
            assert!(t.elapsed() < Duration::from_secs(20), "{:?}", ck.uploads());
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(300));
        let chunks_on_l3 = |p: &std::path::Path| {
            strata_testkit::files_under(p)
                .iter()
                .filter(|f| f.to_string_lossy().contains("chunks"))
                .count()
        };
        assert_eq!(chunks_on_l3(&l3), 0, "sent while held");
        drop(restore);
        ck.wait_uploads();
        assert!(
            matches!(ck.uploads().get(&1), Some(L3State::Committed { .. })),
            "{:?}",
            ck.uploads()
        );
        assert!(chunks_on_l3(&l3) > 0);
        assert!(ck.shared.foreground.held() >= Duration::from_millis(200));
        assert!(ck
            .metrics_text()
            .contains("strata_background_held_seconds_total{"));
    }
}
