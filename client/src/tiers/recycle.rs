//! Read buffers a copy or a restore lane reuses from batch to batch
//! ([`super::copy`], `restore::fetch`): a push to a peer or an upload
//! reads each batch of chunks from L1 into buffers, sends them, and reads
//! the next batch meanwhile; a restore lane reads a batch, verifies it
//! and copies it out, then reads the next. A fresh buffer
//! is zeroed and faulted in page by page, which on the project's VMs cost
//! about as much CPU as the read itself; a sent batch's buffers serve a
//! later batch instead, once the destination lets go of them (QUIC holds a
//! sent chunk until its packets are acknowledged, so a buffer comes back a
//! batch or two after its put).

use strata_tiered::aligned::align_up;
use strata_tiered::{AlignedBuf, ChunkData};

/// The buffers of one copy: lent (being sent) and free (for the next
/// reads), the free ones bounded by `limit` bytes. Dropped with the copy.
pub(crate) struct Recycler {
    lent: Vec<ChunkData>,
    free: Vec<AlignedBuf>,
    limit: usize,
}

impl Recycler {
    /// Keeps at most `limit` bytes of free buffers.
    pub(crate) fn new(limit: usize) -> Self {
        Recycler {
            lent: Vec::new(),
            free: Vec::new(),
            limit,
        }
    }

    /// Clones of a batch's chunks being sent: their buffers come back once
    /// nothing else refers to them.
    pub(crate) fn lend(&mut self, data: impl IntoIterator<Item = ChunkData>) {
        self.lent.extend(data);
    }

    /// Buffers to read chunks of `lens` bytes into, in order ([`fit`]).
    pub(crate) fn spares(&mut self, lens: &[usize]) -> Vec<AlignedBuf> {
        self.reclaim();
        fit(&mut self.free, lens)
    }

    /// A buffer for every read of `lens` bytes, in order: the free ones
    /// that fit ([`fit`]); where none does, one of `elsewhere`'s (given
    /// the lengths still wanted, answering as [`fit`]); else a new one
    /// ([`fault_in_missing`]). The free buffers left over are kept only
    /// while they and the returned ones stay within the limit (the smallest
    /// go first): what the caller holds stays under the limit plus one
    /// batch.
    pub(crate) fn buffers_or(
        &mut self,
        lens: &[usize],
        elsewhere: impl FnOnce(&[usize]) -> Vec<AlignedBuf>,
    ) -> Vec<AlignedBuf> {
        self.reclaim();
        let mut out = fit(&mut self.free, lens);
        let fits =
            |b: Option<&AlignedBuf>, len: usize| b.is_some_and(|b| b.capacity() >= align_up(len));
        let missing: Vec<usize> = (0..lens.len())
            .filter(|&i| !fits(out.get(i), lens[i]))
            .collect();
        if !missing.is_empty() {
            let want: Vec<usize> = missing.iter().map(|&i| lens[i]).collect();
            for (b, &i) in elsewhere(&want).into_iter().zip(&missing) {
                if !fits(Some(&b), lens[i]) {
                    continue;
                }
                while out.len() <= i {
                    out.push(AlignedBuf::zeroed(0));
                }
                out[i] = b;
            }
        }
        fault_in_missing(&mut out, lens);
        self.trim(&out);
        out
    }

    /// Keeps the free buffers only while they and `out` (handed out) stay
    /// within the limit, the smallest freed first.
    fn trim(&mut self, out: &[AlignedBuf]) {
        let in_use: usize = out.iter().map(AlignedBuf::capacity).sum();
        self.free = within(std::mem::take(&mut self.free), in_use, self.limit).0;
    }

    /// The free buffers (those lent that came back first), taken out.
    pub(crate) fn take_free(&mut self) -> Vec<AlignedBuf> {
        self.reclaim();
        std::mem::take(&mut self.free)
    }

    /// Keeps `bufs` as free buffers, within the limit (the largest first;
    /// the others are freed).
    pub(crate) fn keep_free(&mut self, bufs: Vec<AlignedBuf>) {
        let held: usize = self.free.iter().map(AlignedBuf::capacity).sum();
        self.free.extend(within(bufs, held, self.limit).0);
    }

    /// Most bytes of free buffers kept.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Moves the lent buffers nothing refers to any more to the free ones
    /// (up to the limit; the others are freed).
    fn reclaim(&mut self) {
        let mut held: usize = self.free.iter().map(AlignedBuf::capacity).sum();
        for d in std::mem::take(&mut self.lent) {
            match d.try_into_buf() {
                // Foreign memory (pinned, a caller's) is never reused.
                Ok(b) if !b.is_foreign() && held + b.capacity() <= self.limit => {
                    held += b.capacity();
                    self.free.push(b);
                }
                Ok(_) => {}
                Err(d) => self.lent.push(d),
            }
        }
    }
}

/// `bufs` split in two: the largest first while they and `held` bytes stay
/// within `limit`, and the others.
pub(crate) fn within(
    mut bufs: Vec<AlignedBuf>,
    held: usize,
    limit: usize,
) -> (Vec<AlignedBuf>, Vec<AlignedBuf>) {
    bufs.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
    let mut held = held;
    bufs.into_iter().partition(|b| {
        let keep = held + b.capacity() <= limit;
        if keep {
            held += b.capacity();
        }
        keep
    })
}

/// Buffers to read chunks of `lens` bytes into, in order (a read takes
/// each in turn, `ReadOptions::spare`), taken from `free`: for each, the
/// smallest buffer that holds it, or a 4 KiB placeholder where none does
/// (the read allocates). Shorter than `lens` once `free` is empty. Offered in
/// the order they came back instead, a buffer too small for the chunk at
/// its place is dropped and a new one faulted in: a shard's chunks differ
/// in size.
pub(crate) fn fit(free: &mut Vec<AlignedBuf>, lens: &[usize]) -> Vec<AlignedBuf> {
    let mut out = Vec::new();
    for &len in lens {
        if free.is_empty() {
            break;
        }
        let need = align_up(len);
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= need)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        out.push(match best {
            Some(i) => free.swap_remove(i),
            None => AlignedBuf::zeroed(0),
        });
    }
    out
}

/// Completes `bufs` (for reads of `lens` bytes, in order) with new
/// buffers where one is missing or too small, faulted in here, on the
/// calling thread. Left to the read, a new buffer is faulted in by the one
/// I/O thread that submits every caller's reads (O_DIRECT pins the pages
/// as it submits): every lane's submissions then wait behind the zeroing
/// of one lane's fresh memory while the disk idles.
pub(crate) fn fault_in_missing(bufs: &mut Vec<AlignedBuf>, lens: &[usize]) {
    for (i, &len) in lens.iter().enumerate() {
        if bufs.get(i).is_some_and(|b| b.capacity() >= align_up(len)) {
            continue;
        }
        let mut b = AlignedBuf::zeroed(len);
        b.prefault();
        match bufs.get_mut(i) {
            Some(slot) => *slot = b,
            None => bufs.push(b),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MIB: usize = 1 << 20;

    fn chunk(len: usize) -> ChunkData {
        ChunkData::whole(AlignedBuf::zeroed(len))
    }

    #[test]
    fn a_sent_buffer_comes_back_once_the_sender_lets_go_and_fits_by_size() {
        let mut r = Recycler::new(64 * MIB);
        let (big, small) = (chunk(16 * MIB), chunk(MIB));
        let (big_at, small_at) = (big.as_slice().as_ptr(), small.as_slice().as_ptr());
        // The sender still holds the big one.
        let held = big.clone();
        r.lend([big, small]);
        let got = r.spares(&[MIB - 5, 16 * MIB]);
        // Only the small one is back: it serves the first read, the second
        // finds nothing free.
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].full().as_ptr(), small_at);
        drop(held);
        // A read too large for the free one gets an empty placeholder and
        // allocates; the one it fits takes it.
        let got = r.spares(&[32 * MIB, 16 * MIB]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].capacity(), align_up(1));
        assert_eq!(got[1].full().as_ptr(), big_at);
        assert!(r.spares(&[MIB]).is_empty());
    }

    #[test]
    fn every_read_gets_a_buffer_that_holds_it() {
        let mut r = Recycler::new(64 * MIB);
        let small = chunk(MIB);
        let small_at = small.as_slice().as_ptr();
        r.lend([small]);
        let lens = [3 * MIB, MIB - 7, 5];
        let got = r.buffers_or(&lens, |_| Vec::new());
        assert_eq!(got.len(), lens.len());
        for (b, &len) in got.iter().zip(&lens) {
            assert!(b.capacity() >= align_up(len), "{} < {len}", b.capacity());
        }
        // The free one went to the read it fits.
        assert_eq!(got[1].full().as_ptr(), small_at);
    }

    #[test]
    fn buffers_in_use_and_free_stay_within_the_limit() {
        let mut r = Recycler::new(21 * MIB);
        r.lend([chunk(16 * MIB), chunk(2 * MIB), chunk(MIB)]);
        // The 16 MiB buffer serves the first read, a new one the second:
        // 20 MiB in use. Of the 2 and 1 MiB left free, only the 1 MiB one
        // still fits in 21 MiB.
        let got = r.buffers_or(&[4 * MIB, 4 * MIB], |_| Vec::new());
        assert_eq!(got[0].capacity(), 16 * MIB);
        assert_eq!(got[1].capacity(), 4 * MIB);
        let free: Vec<usize> = r.free.iter().map(AlignedBuf::capacity).collect();
        assert_eq!(free, [MIB]);
    }

    #[test]
    fn where_none_of_its_own_fits_a_buffer_from_elsewhere_serves_before_a_new_one() {
        let mut r = Recycler::new(64 * MIB);
        let own = chunk(2 * MIB);
        let own_at = own.as_slice().as_ptr();
        r.lend([own]);
        let mut other = vec![AlignedBuf::zeroed(8 * MIB), AlignedBuf::zeroed(3 * MIB)];
        let other_at: Vec<*const u8> = other.iter().map(|b| b.full().as_ptr()).collect();
        let mut asked = Vec::new();
        let got = r.buffers_or(&[MIB, 2 * MIB, 6 * MIB, 12 * MIB], |lens| {
            asked = lens.to_vec();
            fit(&mut other, lens)
        });
        // Its own 2 MiB buffer went to the first read, which it fits; the
        // others were asked for elsewhere, whose 3 and 8 MiB buffers serve
        // the 2 and 6 MiB reads; the 12 MiB read gets a new one.
        assert_eq!(got[0].full().as_ptr(), own_at);
        assert_eq!(asked, [2 * MIB, 6 * MIB, 12 * MIB]);
        assert_eq!(got[1].full().as_ptr(), other_at[1]);
        assert_eq!(got[2].full().as_ptr(), other_at[0]);
        assert!(!other_at.contains(&got[3].full().as_ptr()));
        assert!(other.is_empty());
        for (b, len) in got.iter().zip([MIB, 2 * MIB, 6 * MIB, 12 * MIB]) {
            assert!(b.capacity() >= align_up(len), "{} < {len}", b.capacity());
        }
    }

    #[test]
    fn free_buffers_stay_within_the_limit() {
        let mut r = Recycler::new(20 * MIB);
        r.lend([chunk(16 * MIB), chunk(16 * MIB), chunk(MIB)]);
        let got = r.spares(&[MIB, 16 * MIB, 16 * MIB]);
        // 16 + 1 MiB kept; the second 16 MiB would pass 20 MiB: freed.
        let caps: Vec<usize> = got.iter().map(AlignedBuf::capacity).collect();
        assert_eq!(caps, [MIB, 16 * MIB]);
    }
}
