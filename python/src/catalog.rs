//! A job's checkpoints in every tier, read-only, for Python: the client's
//! catalog (steps, what is committed where, each rank's manifest from the
//! fastest good copy) and its reader (entries and byte ranges of any
//! rank's shard, each chunk verified, from the fastest tier with a good
//! copy, optionally repairing the others). Wrapped by `strata.Catalog`.

use std::collections::HashMap;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use strata::format::EntryKind;
use strata::tiers::{Catalog, Held, ShardReader, Tiers};

use crate::checkpointer::host_range;
use crate::config::build;
use crate::errors::{invalid, to_py, IntoPy};
use crate::logs::drain;

/// Readers kept open (one per shard read: a resharding load reads many
/// ranks' shards), and the chunk cache of each: at most 256 MiB of
/// verified chunks per catalog.
const READERS: usize = 32;
const CACHE_BYTES: usize = 8 << 20;

/// The tiers of one job opened read-only, their listing, and readers of
/// the shards read so far.
#[pyclass(module = "strata._strata", name = "Catalog")]
pub(crate) struct PyCatalog {
    tiers: Tiers,
    /// The listing, shared with the readers built from it (a new reader
    /// takes a reference, not a copy of every tier's steps).
    listing: Mutex<std::sync::Arc<Catalog>>,
    readers: Mutex<Readers>,
}

/// Shard readers by (step, rank, repair), built from one listing
/// generation (a `refresh` starts the next).
#[derive(Default)]
struct Readers {
    generation: u64,
    open: Vec<((u64, u32, bool), std::sync::Arc<ShardReader>)>,
}

impl PyCatalog {
    fn listing(&self) -> PyResult<std::sync::MutexGuard<'_, std::sync::Arc<Catalog>>> {
        self.listing.lock().map_err(|_| invalid("catalog poisoned"))
    }

    fn readers(&self) -> PyResult<std::sync::MutexGuard<'_, Readers>> {
        self.readers.lock().map_err(|_| invalid("catalog poisoned"))
    }

    fn reader(
        &self,
        py: Python<'_>,
        step: u64,
        rank: u32,
        repair: bool,
    ) -> PyResult<std::sync::Arc<ShardReader>> {
        let key = (step, rank, repair);
        let generation = {
            let readers = self.readers()?;
            if let Some((_, r)) = readers.open.iter().find(|(k, _)| *k == key) {
                return Ok(r.clone());
            }
            readers.generation
        };
        let cat = self.listing()?.clone();
        let tiers = &self.tiers;
        let r = py
            .detach(|| tiers.shard_reader(&cat, step, rank, repair, CACHE_BYTES))
            .py_err()?;
        let r = std::sync::Arc::new(r);
        let mut readers = self.readers()?;
        // Built from a listing that a `refresh` replaced meanwhile: used
        // for this call, not kept.
        if readers.generation == generation {
            if readers.open.len() >= READERS {
                readers.open.remove(0);
            }
            readers.open.push((key, r.clone()));
        }
        Ok(r)
    }
}

#[pymethods]
impl PyCatalog {
    /// Opens the tiers the configuration names (`settings`: JSON of the
    /// keyword arguments; `path`: a strata.toml) and lists them.
    #[new]
    #[pyo3(signature = (settings, path=None))]
    fn new(py: Python<'_>, settings: &str, path: Option<&str>) -> PyResult<Self> {
        let settings = settings.to_string();
        let path = path.map(str::to_string);
        let (tiers, listing) = py
            .detach(move || {
                let cfg = build(&settings, path.as_deref())?;
                let tiers = Tiers::open(cfg, false)?;
                let all: Vec<_> = tiers.tiers().iter().collect();
                let listing = tiers.catalog(&all);
                Ok::<_, strata::Error>((tiers, listing))
            })
            .py_err()?;
        drain(py);
        Ok(PyCatalog {
            tiers,
            listing: Mutex::new(std::sync::Arc::new(listing)),
            readers: Mutex::new(Readers::default()),
        })
    }

    /// Lists every tier again (steps saved since are then seen).
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        let tiers = &self.tiers;
        let fresh = py.detach(|| {
            let all: Vec<_> = tiers.tiers().iter().collect();
            tiers.catalog(&all)
        });
        *self.listing()? = std::sync::Arc::new(fresh);
        let mut readers = self.readers()?;
        readers.open.clear();
        readers.generation += 1;
        Ok(())
    }

    /// The tiers, fastest first: `[(name, kind), ...]`, with `None` or the
    /// error for each tier's listing: `[(name, kind, error), ...]`.
    fn tiers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for l in self.listing()?.listings() {
            let kind = format!("{:?}", l.tier.kind).to_lowercase();
            let err = l.steps.as_ref().err().map(|e| e.to_string());
            out.append((l.tier.name.as_str(), kind, err))?;
        }
        Ok(out)
    }

    /// Steps committed in at least one tier, oldest first.
    fn steps(&self) -> PyResult<Vec<u64>> {
        Ok(self.listing()?.committed_steps().into_iter().collect())
    }

    /// Steps some tier holds a commit record of: decided steps (every
    /// rank voted them durable), whether or not every rank's record is
    /// written yet.
    fn decided_steps(&self) -> PyResult<Vec<u64>> {
        Ok(self.listing()?.decided_steps().into_iter().collect())
    }

    /// The world size that saved `step`, as its commit records say (None
    /// if no tier holds a record of it).
    fn world_size(&self, step: u64) -> PyResult<Option<u32>> {
        Ok(self.listing()?.world_size(step))
    }

    /// Rolls rank `rank`'s shard of the decided `step` forward: in each
    /// tier that holds its manifest without a commit record (the rank died
    /// after its vote, before its record), checks the manifest and the
    /// chunks it names and writes the record (`docs/commit-protocol.md`,
    /// "Roll-forward"; what `strata verify --repair` does). Returns the
    /// tiers where the shard was committed, and for each tier where it
    /// could not be, why. Call `refresh` afterwards to see it.
    fn roll_forward(
        &self,
        py: Python<'_>,
        step: u64,
        rank: u32,
    ) -> PyResult<Vec<(String, Option<String>)>> {
        let cat = self.listing()?.clone();
        let tiers = &self.tiers;
        let out = py.detach(|| strata::roll_forward::roll_forward_rank(tiers, &cat, step, rank));
        drain(py);
        Ok(out
            .into_iter()
            .map(|(t, r)| (t, r.err().map(|e| e.to_string())))
            .collect())
    }

    /// The ranks of `step` committed in some tier.
    fn ranks(&self, step: u64) -> PyResult<Vec<u32>> {
        Ok(self.listing()?.ranks(step).into_iter().collect())
    }

    /// Where `step` is held: `{tier name: "committed" | "partial"}`.
    fn held<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let cat = self.listing()?;
        for l in cat.listings() {
            let state = match cat.held(&l.tier, step) {
                Held::Committed => "committed",
                Held::Partial => "partial",
                Held::Absent => continue,
            };
            out.set_item(l.tier.name.as_str(), state)?;
        }
        Ok(out)
    }

    /// The entries of rank `rank`'s shard of `step`:
    /// `[(name, dtype or None, shape or None, length), ...]` in save order.
    fn entries<'py>(&self, py: Python<'py>, step: u64, rank: u32) -> PyResult<Bound<'py, PyList>> {
        let r = self.reader(py, step, rank, false)?;
        let out = PyList::empty(py);
        for e in &r.manifest().entries {
            let (dtype, shape) = match &e.kind {
                EntryKind::Tensor { dtype, shape } => (Some(dtype.name()), Some(shape.clone())),
                _ => (None, None),
            };
            out.append((e.name.as_str(), dtype, shape, e.len))?;
        }
        Ok(out)
    }

    /// The chunks entry `name` of rank `rank`'s shard of `step` lies in,
    /// in order: `[(chunk id in hex, chunk length), ...]`.
    fn chunks(
        &self,
        py: Python<'_>,
        step: u64,
        rank: u32,
        name: &str,
    ) -> PyResult<Vec<(String, u32)>> {
        let r = self.reader(py, step, rank, false)?;
        let m = r.manifest();
        let e = m.entry(name).ok_or_else(|| {
            to_py(strata::Error::Store(strata::tiered::StoreError::NotFound {
                what: format!("entry {name:?} in step {step} rank {rank}"),
            }))
        })?;
        let mut out: Vec<(String, u32)> = Vec::new();
        for seg in &e.segments {
            let c = m
                .chunks
                .get(seg.chunk as usize)
                .ok_or_else(|| invalid(format!("{name} names chunk {}", seg.chunk)))?;
            let hex = c.id.to_hex();
            if out.last().map(|(h, _)| h) != Some(&hex) {
                out.push((hex, c.len));
            }
        }
        Ok(out)
    }

    /// The metadata saved with rank `rank`'s shard of `step`.
    fn metadata(&self, py: Python<'_>, step: u64, rank: u32) -> PyResult<HashMap<String, String>> {
        let r = self.reader(py, step, rank, false)?;
        Ok(r.manifest()
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    /// Bytes `offset..offset+length` of entry `name` of rank `rank`'s
    /// shard of `step` (the whole entry without `length`), every chunk
    /// verified, each from the fastest tier with a good copy; with
    /// `repair`, tiers found lacking a chunk or holding it damaged get the
    /// good copy. Returns `(bytes, stats)`, stats a dict of
    /// `chunks_read`, `fallbacks`, `repaired`, `cached`.
    #[pyo3(signature = (step, rank, name, offset=0, length=None, repair=false))]
    #[allow(clippy::too_many_arguments)]
    fn read<'py>(
        &self,
        py: Python<'py>,
        step: u64,
        rank: u32,
        name: &str,
        offset: u64,
        length: Option<u64>,
        repair: bool,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyDict>)> {
        let r = self.reader(py, step, rank, repair)?;
        let len = match length {
            Some(n) => n,
            None => r
                .manifest()
                .entry(name)
                .map(|e| e.len.saturating_sub(offset))
                .unwrap_or(0),
        };
        let tiers = &self.tiers;
        let got = py.detach(|| tiers.block_on(r.read_range(name, offset, len)));
        drain(py);
        let (bytes, stats) = got.py_err()?;
        Ok((PyBytes::new(py, &bytes), stats_dict(py, stats)?))
    }

    /// Like `read`, into memory the caller owns: bytes
    /// `offset..offset+length` of the entry go to the `length` bytes at
    /// `address` (a live, writable host buffer the caller keeps alive
    /// until this returns). The GIL is released for the read and the copy.
    /// Returns the stats of `read`.
    #[pyo3(signature = (step, rank, name, offset, address, length, repair=false))]
    #[allow(clippy::too_many_arguments)]
    fn read_into<'py>(
        &self,
        py: Python<'py>,
        step: u64,
        rank: u32,
        name: &str,
        offset: u64,
        address: u64,
        length: u64,
        repair: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (ptr, len) = host_range(name, address, length)?;
        let r = self.reader(py, step, rank, repair)?;
        let tiers = &self.tiers;
        let got = py.detach(|| {
            let dst: &mut [u8] = if len == 0 {
                &mut []
            } else {
                // SAFETY: the Python layer passes the address and length of
                // a writable host buffer (a tensor it allocated or checked
                // contiguous) that it keeps referenced until this returns,
                // and no other slice of it exists during the call.
                // Documented precondition: no other thread frees or resizes
                // the buffer's storage during the call.
                unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) }
            };
            tiers.block_on(r.read_range_into(name, offset, dst))
        });
        drain(py);
        stats_dict(py, got.py_err()?)
    }
}

/// What a read did, as a dict.
fn stats_dict(
    py: Python<'_>,
    stats: strata::tiers::reader::RangeStats,
) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("chunks_read", stats.chunks_read)?;
    d.set_item("fallbacks", stats.fallbacks)?;
    d.set_item("repaired", stats.repaired)?;
    d.set_item("cached", stats.cached)?;
    let served: Vec<(String, u64)> = stats.served_by.into_iter().collect();
    d.set_item("served_by", served)?;
    Ok(d)
}
