//! Reading the restore rounds' payloads (a rank's holdings, a decision,
//! L3's view): every read bounded by the bytes at hand, so a malformed or
//! hostile payload is refused (`None`) and never read or allocated past.

/// A payload being read, front to back.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    /// A little-endian `u32`.
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    /// A little-endian `u64`.
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    /// Bytes left.
    pub(crate) fn left(&self) -> usize {
        self.0.len()
    }
}
