//! Read buffers a copy reuses from batch to batch ([`super::copy`]): a
//! push to a peer or an upload reads each batch of chunks from L1 into
//! buffers, sends them, and reads the next batch meanwhile. A fresh buffer
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

    /// Buffers to read chunks of `lens` bytes into, in order (a read takes
    /// each in turn, `ReadOptions::spare`): for each, the smallest free
    /// buffer that holds it, or an empty one where none does (the read
    /// allocates). Shorter than `lens` once no free buffer is left.
    pub(crate) fn spares(&mut self, lens: &[usize]) -> Vec<AlignedBuf> {
        self.reclaim();
        let mut out = Vec::new();
        for &len in lens {
            if self.free.is_empty() {
                break;
            }
            let need = align_up(len);
            let best = self
                .free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= need)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            out.push(match best {
                Some(i) => self.free.swap_remove(i),
                None => AlignedBuf::zeroed(0),
            });
        }
        out
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
    fn free_buffers_stay_within_the_limit() {
        let mut r = Recycler::new(20 * MIB);
        r.lend([chunk(16 * MIB), chunk(16 * MIB), chunk(MIB)]);
        let got = r.spares(&[MIB, 16 * MIB, 16 * MIB]);
        // 16 + 1 MiB kept; the second 16 MiB would pass 20 MiB: freed.
        let caps: Vec<usize> = got.iter().map(AlignedBuf::capacity).collect();
        assert_eq!(caps, [MIB, 16 * MIB]);
    }
}
