//! The state a training loop saves: named tensors and blobs, borrowed.

use strata_format::{DType, EntryKind, EntrySpec};

/// One entry of the state to save, borrowing the caller's bytes (which the
/// caller may overwrite as soon as `save` returns).
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    /// Unique name.
    pub name: &'a str,
    /// Tensor dtype and shape, or `None` for a blob.
    pub tensor: Option<(DType, &'a [u64])>,
    /// The bytes (C-contiguous for tensors).
    pub bytes: &'a [u8],
}

impl<'a> Entry<'a> {
    /// A host tensor.
    pub fn tensor(name: &'a str, dtype: DType, shape: &'a [u64], bytes: &'a [u8]) -> Self {
        Entry {
            name,
            tensor: Some((dtype, shape)),
            bytes,
        }
    }

    /// Opaque bytes (optimizer, data-loader or RNG state).
    pub fn blob(name: &'a str, bytes: &'a [u8]) -> Self {
        Entry {
            name,
            tensor: None,
            bytes,
        }
    }

    pub(crate) fn spec(&self) -> Result<EntrySpec, strata_format::FormatError> {
        match self.tensor {
            Some((dtype, shape)) => {
                let spec = EntrySpec::tensor(self.name, dtype, shape.to_vec())?;
                if spec.len != self.bytes.len() as u64 {
                    return Err(strata_format::FormatError::Invalid {
                        what: "tensor",
                        reason: format!(
                            "{:?}: {} bytes given for {dtype} {shape:?} ({} expected)",
                            self.name,
                            self.bytes.len(),
                            spec.len
                        ),
                    });
                }
                Ok(spec)
            }
            None => Ok(EntrySpec::blob(self.name, self.bytes.len() as u64)),
        }
    }
}

/// A restored entry, owning its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredEntry {
    /// Name.
    pub name: String,
    /// Tensor (dtype, shape) or blob.
    pub kind: EntryKind,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// A restored shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredState {
    /// The step restored.
    pub step: u64,
    /// Entries in save order.
    pub entries: Vec<RestoredEntry>,
    /// User metadata saved with the shard.
    pub metadata: std::collections::BTreeMap<String, String>,
    /// What the restore read and how long it took.
    pub stats: crate::stats::RestoreStats,
}

impl RestoredState {
    /// An entry by name.
    pub fn get(&self, name: &str) -> Option<&RestoredEntry> {
        self.entries.iter().find(|e| e.name == name)
    }
}
