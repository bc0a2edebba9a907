//! The state the benchmarks save and restore.

use strata::format::EntrySpec;
use strata::par::default_threads;
use strata::{synthetic, Entry};

/// A benchmark's state: synthetic mixed-dtype tensors
/// ([`strata::synthetic`]), changed in place between steps.
pub struct State {
    /// Each entry's name, dtype and shape.
    pub specs: Vec<EntrySpec>,
    /// Each entry's bytes.
    pub data: Vec<Vec<u8>>,
}

impl State {
    /// About `size` bytes of tensors, generated from `seed`.
    pub fn new(size: u64, seed: u64) -> Self {
        let (specs, data) = synthetic::generate(size, seed, default_threads());
        State { specs, data }
    }

    /// The entries to save.
    pub fn entries(&self) -> Vec<Entry<'_>> {
        synthetic::as_entries(&self.specs, &self.data)
    }

    /// The state's own buffers as restore destinations.
    pub fn dests(&mut self) -> Vec<(&str, &mut [u8])> {
        self.specs
            .iter()
            .zip(self.data.iter_mut())
            .map(|(s, d)| (s.name.as_str(), d.as_mut_slice()))
            .collect()
    }

    /// Bytes of all entries.
    pub fn logical(&self) -> u64 {
        self.data.iter().map(|d| d.len() as u64).sum()
    }

    /// Changes one byte in every chunk-sized block of every entry, so every
    /// chunk gets a new id.
    pub fn touch_all(&mut self, chunk: usize, salt: u8) {
        for d in &mut self.data {
            for at in (0..d.len()).step_by(chunk) {
                d[at] ^= salt | 1;
            }
        }
    }

    /// Changes every 20th entry (whole tensors change between steps, as
    /// when part of a model is frozen), one byte per chunk-sized block.
    /// Returns the bytes of the entries changed.
    pub fn touch_every_20th_entry(&mut self, chunk: usize, salt: u8) -> u64 {
        let mut bytes = 0u64;
        for d in self.data.iter_mut().skip(7).step_by(20) {
            for at in (0..d.len()).step_by(chunk) {
                d[at] ^= salt | 1;
            }
            bytes += d.len() as u64;
        }
        bytes
    }
}
