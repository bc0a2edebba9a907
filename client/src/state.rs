//! The state a training loop saves: named tensors and blobs, borrowed.

use strata_format::{DType, EntryKind, EntrySpec};

use crate::gpu::DeviceBytes;

/// One entry of the state to save, borrowing the caller's bytes (which the
/// caller may overwrite as soon as `save` returns).
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    /// Unique name.
    pub name: &'a str,
    /// Tensor dtype and shape, or `None` for a blob.
    pub tensor: Option<(DType, &'a [u64])>,
    /// The bytes (C-contiguous for tensors); empty for a device tensor.
    pub bytes: &'a [u8],
    /// For a tensor in GPU memory: where (then `bytes` is unused).
    pub device: Option<DeviceBytes>,
}

impl<'a> Entry<'a> {
    /// A host tensor.
    pub fn tensor(name: &'a str, dtype: DType, shape: &'a [u64], bytes: &'a [u8]) -> Self {
        Entry {
            name,
            tensor: Some((dtype, shape)),
            bytes,
            device: None,
        }
    }

    /// A tensor in GPU memory (needs the `cuda` feature and a driver at
    /// run time; otherwise `save` fails with [`crate::Error::Gpu`]).
    pub fn device_tensor(name: &'a str, dtype: DType, shape: &'a [u64], at: DeviceBytes) -> Self {
        Entry {
            name,
            tensor: Some((dtype, shape)),
            bytes: &[],
            device: Some(at),
        }
    }

    /// The entry's length in bytes.
    pub fn len(&self) -> u64 {
        self.device.map_or(self.bytes.len() as u64, |d| d.len())
    }

    /// True for an entry of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Opaque bytes (optimizer, data-loader or RNG state).
    pub fn blob(name: &'a str, bytes: &'a [u8]) -> Self {
        Entry {
            name,
            tensor: None,
            bytes,
            device: None,
        }
    }

    pub(crate) fn spec(&self) -> Result<EntrySpec, strata_format::FormatError> {
        match self.tensor {
            Some((dtype, shape)) => {
                let spec = EntrySpec::tensor(self.name, dtype, shape.to_vec())?;
                if spec.len != self.len() {
                    return Err(strata_format::FormatError::Invalid {
                        what: "tensor",
                        reason: format!(
                            "{:?}: {} bytes given for {dtype} {shape:?} ({} expected)",
                            self.name,
                            self.len(),
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
