//! Request buffers the service reuses: a put's message is kept as the
//! replica, so a step's chunks live in buffers that retention frees when
//! the step is retired; the next steps' puts take them back instead of
//! asking the kernel for fresh pages.
//!
//! Why: fresh memory is zeroed and faulted in page by page as QUIC copies
//! a request into it. On the 2-core VM of `docs/performance.md` that cost
//! the service about as much CPU as the rest of a push (1.5–1.9 s per GiB
//! against 0.9–1.1 s once a peer reused a retired step's memory), and
//! whether the allocator kept freed memory for the next step varied from
//! run to run.
//!
//! Buffers come in size classes (a request's length rounded up by at most
//! 1/32 of it), so a step's puts of one chunk size find each other's
//! buffers (a model's state has the same chunk sizes step after step). What the pool keeps free is bounded: a buffer given back is
//! kept only while the buffers out (requests and replicas in memory) and
//! those kept free stay within `cap`, the service's memory budget plus its
//! in-flight request budget — what it may hold at its peak anyway.
//! Messages below [`MIN_POOLED`] bytes are plain allocations, never kept,
//! but counted as in use while they live. A reserve faulted in at start
//! ([`Arena::prefault`]) serves the first requests of any class.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Below this, a request is a plain allocation (small requests: lists,
/// manifests, presence checks).
pub(crate) const MIN_POOLED: usize = 256 << 10;

/// The pool of free buffers, by size class.
pub(crate) struct Arena {
    cap: u64,
    pool: Mutex<Pool>,
}

#[derive(Default)]
struct Pool {
    free: HashMap<usize, Vec<Vec<u8>>>,
    /// Buffers faulted in at start ([`Arena::prefault`]): a request that
    /// finds no free buffer of its class takes the smallest of these that
    /// fits, cut to its class (the kept head stays backed), before it asks
    /// the kernel for fresh memory. Counted in `free_bytes`.
    reserve: Vec<Vec<u8>>,
    free_bytes: u64,
    /// Bytes of request buffers handed out and not yet given back (pooled
    /// ones by their class, smaller ones by their length).
    out_bytes: u64,
    /// Takes served from the pool, and takes that allocated.
    reused: u64,
    fresh: u64,
}

impl Pool {
    /// A free buffer for a pooled request of `class` bytes: one of its
    /// class, else one of the reserve; counted as reused or fresh.
    fn take_free(&mut self, class: usize) -> Option<Vec<u8>> {
        let mut got = self.free.get_mut(&class).and_then(Vec::pop);
        if got.is_some() {
            self.free_bytes = self.free_bytes.saturating_sub(class as u64);
        } else {
            got = self.take_reserve(class);
        }
        if got.is_some() {
            self.reused += 1;
        } else {
            self.fresh += 1;
        }
        got
    }

    /// A reserve buffer for a request of `class` bytes: the smallest at
    /// least that large, to be cut with [`cut`] outside the lock. Any
    /// smaller class takes one, since a step's chunks compress to many
    /// sizes (limited to requests of at least half a buffer, the first
    /// push to a new peer was slower: `docs/benchmarks.md`).
    fn take_reserve(&mut self, class: usize) -> Option<Vec<u8>> {
        let at = self
            .reserve
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= class)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i)?;
        let b = self.reserve.swap_remove(at);
        self.free_bytes = self.free_bytes.saturating_sub(b.len() as u64);
        Some(b)
    }

    /// A free buffer of the largest class held (the fewest to free).
    fn evict_one(&mut self) -> Option<Vec<u8>> {
        if let Some(b) = self.reserve.pop() {
            return Some(b);
        }
        let class = self
            .free
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(&c, _)| c)
            .max()?;
        let list = self.free.get_mut(&class)?;
        let b = list.pop();
        if list.is_empty() {
            self.free.remove(&class);
        }
        b
    }
}

/// What the pool holds and has done (for metrics and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Bytes kept free for the next requests.
    pub free_bytes: u64,
    /// Bytes of pooled buffers in use (requests and replicas in memory).
    pub out_bytes: u64,
    /// Requests that reused a buffer.
    pub reused: u64,
    /// Requests that allocated one.
    pub fresh: u64,
    /// What buffers out and free may reach together (`--memory` +
    /// `--inflight`).
    pub cap: u64,
}

/// The size class of a request of `len` bytes: `len` rounded up to a
/// multiple of 1/64 of the next power of two (at least a page), so a
/// pooled buffer is at most 1/32 larger than what it holds: the bound of
/// the service's memory counts that (`docs/protocol.md`).
pub(crate) fn class_of(len: usize) -> usize {
    let step = (len.next_power_of_two() / 64).max(4 << 10);
    len.div_ceil(step).saturating_mul(step)
}

impl Arena {
    /// A pool that keeps buffers free while what is out and free stays
    /// within `cap` bytes.
    pub(crate) fn new(cap: u64) -> Arc<Self> {
        Arc::new(Arena {
            cap,
            pool: Mutex::new(Pool::default()),
        })
    }

    /// A buffer of exactly `len` bytes (its contents are whatever it held
    /// before: the caller overwrites all of it). A request below
    /// [`MIN_POOLED`] is a plain allocation, never kept, but counted as in
    /// use while it lives: it holds the same budgets, so free buffers give
    /// way to it at the cap.
    pub(crate) fn take(self: &Arc<Self>, len: usize) -> ArenaBuf {
        let pooled = len >= MIN_POOLED;
        let size = if pooled { class_of(len) } else { len };
        let mut evicted = Vec::new();
        let reused = self.pool.lock().ok().and_then(|mut p| {
            let got = if pooled { p.take_free(size) } else { None };
            p.out_bytes += size as u64;
            if got.is_none() {
                // New memory: free buffers of other classes go first, so
                // what is out and free stays within the cap (a job whose
                // sizes differ from the retired ones' does not add a
                // second budget's worth).
                while p.out_bytes + p.free_bytes > self.cap {
                    let Some(b) = p.evict_one() else { break };
                    p.free_bytes = p.free_bytes.saturating_sub(b.len() as u64);
                    evicted.push(b);
                }
            }
            got
        });
        // Freed and cut outside the lock.
        drop(evicted);
        let buf = match reused {
            Some(b) => cut(b, size),
            None if pooled => fresh(size),
            None => vec![0u8; len],
        };
        ArenaBuf {
            buf,
            len,
            pooled,
            home: Some(Arc::downgrade(self)),
        }
    }

    /// Faults in reserve buffers large enough for requests of `len` bytes
    /// until `bytes` are held free or the pool's cap is reached, so that
    /// the first steps a new service receives find memory already backed
    /// (a fresh page is zeroed and faulted in as QUIC copies a request
    /// into it: `docs/performance.md`). A request of any class up to
    /// `len`'s takes one cut to its size when none of its own class is
    /// free (a step's chunks compress to many sizes). Blocking: run it off
    /// the runtime. Returns the bytes it added. Requests below
    /// [`MIN_POOLED`] are never pooled: nothing to do for them.
    pub(crate) fn prefault(&self, len: usize, bytes: u64) -> u64 {
        if len < MIN_POOLED {
            return 0;
        }
        let class = class_of(len);
        let mut added = 0u64;
        while added.saturating_add(class as u64) <= bytes {
            // Room first, so a prefault never passes the cap nor evicts.
            let room = self
                .pool
                .lock()
                .map(|p| p.out_bytes + p.free_bytes + class as u64 <= self.cap)
                .unwrap_or(false);
            if !room {
                break;
            }
            let mut b = fresh(class);
            touch_every_page(&mut b);
            let Ok(mut p) = self.pool.lock() else { break };
            if p.out_bytes + p.free_bytes + class as u64 > self.cap {
                // Requests took the room meanwhile: `b` is freed, outside
                // the lock.
                drop(p);
                break;
            }
            p.free_bytes += class as u64;
            p.reserve.push(b);
            added += class as u64;
        }
        added
    }

    /// What the pool holds and has done.
    pub(crate) fn stats(&self) -> ArenaStats {
        self.pool
            .lock()
            .map(|p| ArenaStats {
                free_bytes: p.free_bytes,
                out_bytes: p.out_bytes,
                reused: p.reused,
                fresh: p.fresh,
                cap: self.cap,
            })
            .unwrap_or_default()
    }

    fn give_back(&self, buf: Vec<u8>, pooled: bool) {
        let class = buf.len() as u64;
        let Ok(mut p) = self.pool.lock() else {
            return;
        };
        p.out_bytes = p.out_bytes.saturating_sub(class);
        if pooled && p.out_bytes + p.free_bytes + class <= self.cap {
            p.free_bytes += class;
            p.free.entry(buf.len()).or_default().push(buf);
            return;
        }
        // The pool would pass its cap: `buf` is freed, outside the lock.
        drop(p);
        drop(buf);
    }
}

/// A new pooled buffer of `size` bytes, advised to large pages (they
/// fault in faster).
fn fresh(size: usize) -> Vec<u8> {
    let mut b = vec![0u8; size];
    strata_tiered::aligned::advise_huge_pages(&mut b);
    b
}

/// `b` cut to `size` bytes. The cut is a `realloc` to a smaller size,
/// which keeps the head's pages where they are (glibc `mremap`s a large
/// block in place and splits a small one) and returns the tail to the
/// system.
fn cut(mut b: Vec<u8>, size: usize) -> Vec<u8> {
    if b.len() > size {
        b.truncate(size);
        b.shrink_to_fit();
    }
    b
}

/// Writes one byte in every page, so the kernel backs (and zeroes) all
/// of `buf` now: a fresh allocation's zeroed pages are only mapped when
/// first written.
fn touch_every_page(buf: &mut [u8]) {
    for at in (0..buf.len()).step_by(4096) {
        // SAFETY: `at` < `buf.len()`, so the pointer lies inside `buf`,
        // which is held mutably; a volatile write keeps the compiler from
        // dropping a store of the zero the byte already holds.
        unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(at), 0) };
    }
}

/// A request's bytes: from the pool (given back when the last reference
/// to it drops, a replica's included) or a plain allocation.
pub(crate) struct ArenaBuf {
    buf: Vec<u8>,
    len: usize,
    /// Kept for the next requests when given back (else only counted).
    pooled: bool,
    home: Option<Weak<Arena>>,
}

impl std::ops::Deref for ArenaBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::ops::DerefMut for ArenaBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

impl AsRef<[u8]> for ArenaBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for ArenaBuf {
    fn drop(&mut self) {
        if let Some(arena) = self.home.take().and_then(|w| w.upgrade()) {
            arena.give_back(std::mem::take(&mut self.buf), self.pooled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn classes_round_up_by_at_most_a_thirty_second() {
        for len in [
            MIN_POOLED,
            300_000,
            513 << 10,
            MIB,
            16 * MIB + 41,
            16 * MIB + 4096,
            63 * MIB,
        ] {
            let c = class_of(len);
            assert!(c >= len, "{len}");
            assert!(c - len <= len / 32, "{len}: {c}");
        }
        // A full chunk's frame and its request header share a class.
        assert_eq!(class_of(16 * MIB + 41), class_of(16 * MIB + 300));
    }

    #[test]
    fn a_buffer_given_back_serves_the_next_request_of_its_class() {
        let arena = Arena::new(1 << 30);
        let a = arena.take(16 * MIB + 41);
        let ptr = a.as_ptr();
        assert_eq!(a.len(), 16 * MIB + 41);
        // Kept as a replica: given back only once its last slice drops.
        let frame = bytes::Bytes::from_owner(a).slice(41..);
        assert_eq!(arena.stats().free_bytes, 0);
        drop(frame);
        let s = arena.stats();
        assert_eq!(
            (s.out_bytes, s.free_bytes),
            (0, class_of(16 * MIB + 41) as u64)
        );
        let b = arena.take(16 * MIB + 200);
        assert_eq!(b.as_ptr(), ptr, "the same memory, not a fresh allocation");
        assert_eq!(b.len(), 16 * MIB + 200);
        let s = arena.stats();
        assert_eq!((s.reused, s.fresh, s.free_bytes), (1, 1, 0));
        // Another class does not take it.
        drop(b);
        let c = arena.take(4 * MIB);
        assert_ne!(c.as_ptr(), ptr);
        assert_eq!(arena.stats().fresh, 2);
    }

    #[test]
    fn the_pool_keeps_nothing_past_its_cap_and_small_requests_are_not_pooled() {
        let class = class_of(8 * MIB) as u64;
        // Room for three buffers out or free.
        let arena = Arena::new(3 * class);
        let bufs: Vec<_> = (0..4).map(|_| arena.take(8 * MIB)).collect();
        assert_eq!(arena.stats().out_bytes, 4 * class);
        drop(bufs);
        // The first given back finds three others out: keeping it would
        // pass the cap, so it is freed. The other three fit.
        let s = arena.stats();
        assert_eq!((s.out_bytes, s.free_bytes), (0, 3 * class));
        // A small request is never pooled, but it holds the same budgets:
        // at the cap a free buffer gives way to it.
        let small = arena.take(MIN_POOLED - 1);
        let s = arena.stats();
        assert_eq!(
            (s.out_bytes, s.free_bytes),
            ((MIN_POOLED - 1) as u64, 2 * class)
        );
        drop(small);
        let s = arena.stats();
        assert_eq!((s.out_bytes, s.free_bytes, s.fresh), (0, 2 * class, 4));
    }

    #[test]
    fn a_fresh_buffer_frees_free_ones_of_other_classes_to_stay_within_the_cap() {
        let class = class_of(8 * MIB) as u64;
        let arena = Arena::new(3 * class);
        drop((0..3).map(|_| arena.take(8 * MIB)).collect::<Vec<_>>());
        assert_eq!(arena.stats().free_bytes, 3 * class);
        // Another job's sizes: each fresh buffer frees a free one.
        let other: Vec<_> = (0..3).map(|_| arena.take(8 * MIB - 200_000)).collect();
        let s = arena.stats();
        assert_eq!(s.fresh, 6);
        assert!(s.out_bytes + s.free_bytes <= 3 * class, "{s:?}");
        assert_eq!(s.free_bytes, 0);
        drop(other);
        let s = arena.stats();
        assert!(s.out_bytes + s.free_bytes <= 3 * class, "{s:?}");
    }

    #[test]
    fn a_prefault_fills_the_pool_within_its_cap_and_serves_the_first_requests() {
        let class = class_of(16 * MIB + 1) as u64;
        let arena = Arena::new(5 * class);
        // Asked for more than the cap: stops at the cap.
        assert_eq!(arena.prefault(16 * MIB + 1, 8 * class), 5 * class);
        let s = arena.stats();
        assert_eq!((s.free_bytes, s.out_bytes, s.fresh), (5 * class, 0, 0));
        // A chunk put of any envelope of that chunk size reuses them.
        let bufs: Vec<_> = (0..5).map(|i| arena.take(16 * MIB + 41 + i)).collect();
        let s = arena.stats();
        assert_eq!((s.reused, s.fresh, s.free_bytes), (5, 0, 0));
        drop(bufs);
        // A smaller request takes a reserve buffer cut to its class; a
        // larger one allocates.
        let arena = Arena::new(3 * class);
        assert_eq!(arena.prefault(16 * MIB + 1, 2 * class), 2 * class);
        let small = arena.take(9 * MIB + 7);
        let s = arena.stats();
        assert_eq!((s.reused, s.fresh), (1, 0));
        assert_eq!(s.free_bytes, class, "one reserve buffer left");
        assert_eq!(s.out_bytes, class_of(9 * MIB + 7) as u64);
        let big = arena.take(20 * MIB);
        assert_eq!(arena.stats().fresh, 1, "no reserve buffer is that large");
        // Given back, the cut buffer serves its own class.
        let ptr = small.as_ptr();
        drop(small);
        assert_eq!(arena.take(9 * MIB + 100).as_ptr(), ptr);
        drop(big);
        // Below the smallest pooled size, or with no room: nothing.
        assert_eq!(arena.prefault(MIN_POOLED - 1, 1 << 30), 0);
        assert_eq!(arena.prefault(16 * MIB + 1, class), 0, "the pool is full");
        // A far smaller request takes the last reserve buffer too.
        let tiny = arena.take(MIN_POOLED);
        let s = arena.stats();
        assert_eq!((s.fresh, s.reused), (1, 3));
        drop(tiny);
        // Asked for less than one buffer: nothing.
        let empty = Arena::new(1 << 30);
        assert_eq!(empty.prefault(16 * MIB + 1, class - 1), 0);
    }

    #[test]
    fn a_cut_reserve_buffer_keeps_its_memory_and_the_reserve_goes_first_at_the_cap() {
        let class = class_of(16 * MIB + 1) as u64;
        let arena = Arena::new(2 * class);
        assert_eq!(arena.prefault(16 * MIB + 1, class), class);
        let at = arena.pool.lock().unwrap().reserve[0].as_ptr();
        // Cut in place: the same (faulted-in) memory, not a copy.
        let cut = arena.take(9 * MIB);
        assert_eq!(cut.as_ptr(), at);
        drop(cut);
        // A fresh buffer at the cap frees the reserve before free buffers
        // of other classes.
        assert_eq!(arena.prefault(16 * MIB + 1, class), class);
        let s = arena.stats();
        assert_eq!(s.free_bytes, class + class_of(9 * MIB) as u64);
        let big = arena.take(20 * MIB);
        let p = arena.pool.lock().unwrap();
        assert!(p.reserve.is_empty(), "the reserve went first");
        assert_eq!(p.free.get(&class_of(9 * MIB)).map(Vec::len), Some(1));
        drop(p);
        drop(big);
    }

    #[test]
    fn a_buffer_outliving_its_arena_is_simply_freed() {
        let arena = Arena::new(1 << 30);
        let a = arena.take(MIB);
        drop(arena);
        drop(a);
    }
}
