//! The checkpointer, for Python (private: wrapped by `strata.Checkpointer`,
//! which turns state dicts into the flat entry lists taken here).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use strata::format::{DType, EntryKind};
use strata::{Checkpointer, DeviceBytes, Entry, RestorePlan, RestoreStats, StepSelector};

use crate::config::build;
use crate::coordinator::{gather_reduces, PyCoordinator};
use crate::errors::{invalid, to_py, IntoPy};
use crate::handle::PySaveHandle;
use crate::logs::drain;

/// Memory of one entry to save.
enum Source<'py> {
    /// A Python `bytes` object (a blob, or a small tensor).
    Bytes(Bound<'py, PyBytes>),
    /// Host memory: address and length.
    Host(usize, usize),
    /// Device memory: address, length, device ordinal.
    Device(u64, u64, usize),
}

/// One parsed entry: name, tensor dtype and shape (or a blob), memory.
struct Parsed<'py> {
    name: String,
    tensor: Option<(DType, Vec<u64>)>,
    source: Source<'py>,
}

/// Host memory named from Python: an address and length that fit this
/// machine, at most `isize::MAX` long, and not null unless empty.
pub(crate) fn host_range(name: &str, ptr: u64, len: u64) -> PyResult<(usize, usize)> {
    let ptr = usize::try_from(ptr).map_err(|_| invalid("address out of range"))?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= isize::MAX as usize)
        .ok_or_else(|| invalid("length out of range"))?;
    if ptr == 0 && len > 0 {
        return Err(invalid(format!("{name:?}: null address")));
    }
    Ok((ptr, len))
}

fn parse_entry<'py>(item: &Bound<'py, PyAny>) -> PyResult<Parsed<'py>> {
    let t = item
        .cast::<PyTuple>()
        .map_err(|_| invalid("each entry is a tuple (name, dtype, shape, data)"))?;
    if t.len() != 4 {
        return Err(invalid("each entry is a tuple (name, dtype, shape, data)"));
    }
    let name: String = t.get_item(0)?.extract()?;
    let dtype: Option<String> = t.get_item(1)?.extract()?;
    let shape: Option<Vec<u64>> = t.get_item(2)?.extract()?;
    let tensor = match (dtype, shape) {
        (Some(d), Some(s)) => Some((d.parse::<DType>().map_err(|e| invalid(e.to_string()))?, s)),
        (None, None) => None,
        _ => {
            return Err(invalid(format!(
                "{name:?}: a tensor needs a dtype and a shape"
            )))
        }
    };
    let data = t.get_item(3)?;
    let source = if let Ok(b) = data.cast::<PyBytes>() {
        Source::Bytes(b.clone())
    } else {
        let (ptr, len, device): (u64, u64, Option<usize>) = data.extract().map_err(|_| {
            invalid(format!(
                "{name:?}: data is bytes or (address, length, device)"
            ))
        })?;
        match device {
            Some(d) => Source::Device(ptr, len, d),
            None => {
                let (ptr, len) = host_range(&name, ptr, len)?;
                Source::Host(ptr, len)
            }
        }
    };
    Ok(Parsed {
        name,
        tensor,
        source,
    })
}

fn parse_entries<'py>(entries: &Bound<'py, PyList>) -> PyResult<Vec<Parsed<'py>>> {
    entries.iter().map(|e| parse_entry(&e)).collect()
}

/// The entries of parsed items, borrowing their memory.
fn entries_of<'a>(parsed: &'a [Parsed<'_>]) -> PyResult<Vec<Entry<'a>>> {
    let mut list: Vec<Entry<'a>> = Vec::with_capacity(parsed.len());
    for p in parsed {
        let bytes: &[u8] = match &p.source {
            Source::Bytes(b) => b.as_bytes(),
            // SAFETY: the Python layer passes the address and length of a
            // C-contiguous host tensor or array that it keeps referenced
            // until the native call returns; a save copies the bytes into
            // staging before returning, `prepare` reads only the lengths.
            // A precondition the package documents and cannot enforce: no
            // other thread frees or resizes the tensor's storage during the
            // call (the GIL is released for it).
            Source::Host(ptr, len) if *len > 0 => unsafe {
                std::slice::from_raw_parts(*ptr as *const u8, *len)
            },
            Source::Host(..) | Source::Device(..) => &[],
        };
        let e = match (&p.tensor, &p.source) {
            (Some((dtype, shape)), Source::Device(ptr, len, device)) => {
                // SAFETY: as above, for device memory the caller's tensor
                // owns on `device`; a save reads it before returning.
                let at = unsafe { DeviceBytes::new(*ptr, *len, *device) };
                Entry::device_tensor(&p.name, *dtype, shape, at)
            }
            (Some((dtype, shape)), _) => Entry::tensor(&p.name, *dtype, shape, bytes),
            (None, Source::Device(..)) => {
                return Err(invalid(format!("{:?}: a blob in device memory", p.name)))
            }
            (None, _) => Entry::blob(&p.name, bytes),
        };
        list.push(e);
    }
    Ok(list)
}

/// Refuses destination ranges that overlap: each becomes a `&mut [u8]`.
fn disjoint(dests: &[(String, u64, u64)]) -> PyResult<()> {
    let mut ranges: Vec<(u64, u64, &str)> = dests
        .iter()
        .filter(|(_, _, len)| *len > 0)
        .map(|(name, ptr, len)| (*ptr, ptr.saturating_add(*len), name.as_str()))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(invalid(format!(
                "the buffers for {:?} and {:?} overlap",
                w[0].2, w[1].2
            )));
        }
    }
    Ok(())
}

/// The caller's buffers as slices, by entry name.
///
/// # Safety
///
/// Each `(address, length)` is a live, writable host buffer that stays
/// alive and is touched by nothing else for `'b`, and no two of the
/// buffers of one read overlap (checked with [`disjoint`] over every list
/// of the read).
unsafe fn buffers<'b>(dests: &[(String, u64, u64)]) -> PyResult<Vec<(&str, &'b mut [u8])>> {
    let mut slots: Vec<(&str, &mut [u8])> = Vec::with_capacity(dests.len());
    for (name, ptr, len) in dests {
        let (ptr, len) = host_range(name, *ptr, *len)?;
        let buf: &mut [u8] = if len == 0 {
            &mut []
        } else {
            // SAFETY: this function's contract: a live, writable buffer of
            // `len` bytes at `ptr`, aliased by no other slice, for `'b`.
            unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) }
        };
        slots.push((name.as_str(), buf));
    }
    Ok(slots)
}

fn selector(step: Option<u64>) -> StepSelector {
    step.map_or(StepSelector::Latest, StepSelector::Step)
}

fn restore_dict<'py>(py: Python<'py>, s: &RestoreStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("step", s.step)?;
    d.set_item("chunks", s.chunks)?;
    d.set_item("bytes_read", s.bytes_read)?;
    d.set_item("bytes_from_l2", s.bytes_from_l2)?;
    d.set_item("bytes_from_l3", s.bytes_from_l3)?;
    d.set_item("chunks_repaired", s.chunks_repaired)?;
    d.set_item("rehydrated", s.rehydrated)?;
    d.set_item("duration_s", s.duration.as_secs_f64())?;
    if let Some(t) = s.first_usable {
        d.set_item("first_usable_s", t.as_secs_f64())?;
    }
    Ok(d)
}

/// A step every rank agreed to restore, with this rank's manifest.
#[pyclass(name = "RestorePlan", module = "strata._strata", frozen)]
pub(crate) struct PyRestorePlan {
    inner: RestorePlan,
}

#[pymethods]
impl PyRestorePlan {
    /// The step.
    #[getter]
    fn step(&self) -> u64 {
        self.inner.step()
    }

    /// The entries: `(name, dtype, shape, length)` each (`dtype` and
    /// `shape` `None` for a blob).
    #[getter]
    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for e in &self.inner.manifest().entries {
            let (dtype, shape) = match &e.kind {
                EntryKind::Tensor { dtype, shape } => (Some(dtype.name()), Some(shape.clone())),
                _ => (None, None),
            };
            out.append((e.name.as_str(), dtype, shape, e.len))?;
        }
        Ok(out)
    }

    /// The user metadata saved with the step.
    #[getter]
    fn metadata(&self) -> BTreeMap<String, String> {
        self.inner.manifest().metadata.clone()
    }
}

/// The Rust checkpointer (private: see `strata.Checkpointer`).
#[pyclass(name = "Checkpointer", module = "strata._strata", frozen)]
pub(crate) struct PyCheckpointer {
    inner: Mutex<Option<Arc<Checkpointer>>>,
    config_json: String,
    /// The counters as they were at `close` (readable after it).
    closed_health: Mutex<Option<strata::Health>>,
}

impl PyCheckpointer {
    fn get(&self) -> PyResult<Arc<Checkpointer>> {
        self.inner
            .lock()
            .ok()
            .and_then(|g| g.clone())
            .ok_or_else(|| invalid("the checkpointer is closed"))
    }
}

#[pymethods]
impl PyCheckpointer {
    /// Opens a checkpointer. `settings` is a JSON object of `Config` keys
    /// (winning over the environment, which wins over the TOML file at
    /// `path`). `gather`, if given, is the coordinator callable
    /// `gather(rank, key, value, timeout_secs) -> list[bytes]`.
    #[new]
    #[pyo3(signature = (settings, path=None, gather=None))]
    fn new(
        py: Python<'_>,
        settings: &str,
        path: Option<&str>,
        gather: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let settings = settings.to_string();
        let path = path.map(str::to_string);
        // Whether the gather also reduces is asked once, here, with the GIL.
        let gather = gather.map(|g| {
            let reduces = gather_reduces(py, &g);
            (g, reduces)
        });
        let r = py.detach(move || -> strata::Result<(Checkpointer, String)> {
            let cfg = build(&settings, path.as_deref())?;
            // What Python shows as `Checkpointer.config`: secrets redacted.
            let json = cfg.redacted().to_string();
            let ckpt = match gather {
                Some((g, reduces)) => Checkpointer::with_coordinator(
                    cfg.clone(),
                    Arc::new(PyCoordinator {
                        job: cfg.job.clone(),
                        world: cfg.world_size,
                        gather: g,
                        reduces,
                    }),
                )?,
                None => Checkpointer::new(cfg)?,
            };
            Ok((ckpt, json))
        });
        drain(py);
        let (ckpt, config_json) = r.py_err()?;
        Ok(PyCheckpointer {
            inner: Mutex::new(Some(Arc::new(ckpt))),
            config_json,
            closed_health: Mutex::new(None),
        })
    }

    /// The resolved configuration, as JSON.
    #[getter]
    fn config_json(&self) -> &str {
        &self.config_json
    }

    /// The disk I/O engine in use.
    fn engine_name(&self) -> PyResult<String> {
        Ok(self.get()?.engine_name())
    }

    /// Saves `step`: `entries` is a list of `(name, dtype, shape, data)`,
    /// `dtype` a safetensors name (`"BF16"`) and `shape` a list for a
    /// tensor, both `None` for a blob; `data` is `bytes`, or
    /// `(address, length, device)` of memory the caller keeps alive and
    /// unmoved until this returns (`device` is `None` for host memory, the
    /// CUDA ordinal for device memory). Blocks (without the GIL) only for
    /// the snapshot; returns a handle.
    #[pyo3(signature = (step, entries, metadata=None))]
    fn save(
        &self,
        py: Python<'_>,
        step: u64,
        entries: &Bound<'_, PyList>,
        metadata: Option<BTreeMap<String, String>>,
    ) -> PyResult<PySaveHandle> {
        let ckpt = self.get()?;
        let parsed = parse_entries(entries)?;
        let list = entries_of(&parsed)?;
        let metadata = metadata.unwrap_or_default();
        let r = py.detach(move || ckpt.save_with_metadata(step, &list, metadata));
        drain(py);
        Ok(PySaveHandle { inner: r.py_err()? })
    }

    /// Allocates and pre-faults the staging memory a save of `entries`
    /// (as for `save`) needs, so the first save stalls only for its copy.
    fn prepare(&self, py: Python<'_>, entries: &Bound<'_, PyList>) -> PyResult<()> {
        let ckpt = self.get()?;
        let parsed = parse_entries(entries)?;
        let list = entries_of(&parsed)?;
        let r = py.detach(move || ckpt.prepare(&list));
        drain(py);
        r.py_err()
    }

    /// Agrees with every rank on a step (`None`: the newest every rank can
    /// restore) and loads this rank's manifest; reads no chunk. All ranks
    /// call it together.
    #[pyo3(signature = (step=None))]
    fn plan(&self, py: Python<'_>, step: Option<u64>) -> PyResult<PyRestorePlan> {
        let ckpt = self.get()?;
        let r = py.detach(move || ckpt.plan_restore(selector(step)));
        drain(py);
        Ok(PyRestorePlan { inner: r.py_err()? })
    }

    /// Reads entries of a planned step into memory the caller owns:
    /// `dests` is a list of `(name, address, length)` of live, writable,
    /// C-contiguous host buffers the caller keeps alive until this returns,
    /// each exactly the entry's length. Every byte is verified. Local to
    /// this rank (no agreement).
    ///
    /// A priority load reads in two parts: `along` (the rest's buffers, in
    /// the same form) makes this the first part, which also fills the
    /// rest's bytes that the chunks it reads hold; `after` (the first
    /// part's entry names) makes this the rest, which skips those chunks.
    #[pyo3(signature = (plan, dests, along=None, after=None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        plan: &PyRestorePlan,
        dests: Vec<(String, u64, u64)>,
        along: Option<Vec<(String, u64, u64)>>,
        after: Option<Vec<String>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let ckpt = self.get()?;
        let along = along.unwrap_or_default();
        let after = after.unwrap_or_default();
        if !along.is_empty() && !after.is_empty() {
            return Err(invalid(
                "read: `along` (a first part) and `after` (a rest) together",
            ));
        }
        let both: Vec<(String, u64, u64)> = dests.iter().chain(&along).cloned().collect();
        disjoint(&both)?;
        // SAFETY: the Python layer passes the address and length of a
        // writable, C-contiguous host buffer (a tensor or array it
        // allocated, or the caller's own, checked contiguous and writable)
        // and keeps it referenced until this returns, which is as long as
        // the slices live; the ranges of both lists were checked disjoint
        // above. Documented precondition: no other thread frees or resizes
        // a buffer's storage during the call.
        let (mut slots, mut also) = unsafe { (buffers(&dests)?, buffers(&along)?) };
        let after: Vec<&str> = after.iter().map(String::as_str).collect();
        let plan = &plan.inner;
        let r = py.detach(move || {
            if !also.is_empty() {
                ckpt.restore_planned_first(plan, &mut slots, &mut also)
            } else if !after.is_empty() {
                ckpt.restore_planned_rest(plan, &mut slots, &after)
            } else {
                ckpt.restore_planned_into(plan, &mut slots)
            }
        });
        drain(py);
        restore_dict(py, &r.py_err()?)
    }

    /// The steps this rank committed on some tier, oldest first: a list of
    /// dicts (`step`, `l1`, `l3`, `peers`, `upload`).
    fn steps<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let ckpt = self.get()?;
        let r = py.detach(move || ckpt.steps());
        drain(py);
        let out = PyList::empty(py);
        for st in r.py_err()? {
            let d = PyDict::new(py);
            d.set_item("step", st.step)?;
            d.set_item("l1", st.l1)?;
            d.set_item("l3", st.l3)?;
            d.set_item("peers", st.replication.as_ref().map(l2_text))?;
            d.set_item("upload", st.upload.as_ref().map(l3_text))?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Deletes `steps` from every tier (this rank's shards, retired); all
    /// ranks call it together. Returns the steps this rank held.
    fn delete(&self, py: Python<'_>, steps: Vec<u64>) -> PyResult<Vec<u64>> {
        let ckpt = self.get()?;
        let r = py.detach(move || ckpt.delete(&steps));
        drain(py);
        r.py_err()
    }

    /// Deletes every step newer than `step` this rank holds; all ranks
    /// call it together (`restored` false: this rank's load of `step`
    /// failed, it votes no and nothing is deleted). Returns the steps
    /// deleted.
    #[pyo3(signature = (step, restored=true))]
    fn discard_newer(&self, py: Python<'_>, step: u64, restored: bool) -> PyResult<Vec<u64>> {
        let ckpt = self.get()?;
        let r = py.detach(move || ckpt.discard_newer_if(step, restored));
        drain(py);
        r.py_err()
    }

    /// Queues `step` for upload to L3.
    fn upload(&self, py: Python<'_>, step: u64) -> PyResult<()> {
        let ckpt = self.get()?;
        let r = py.detach(move || ckpt.upload(step));
        drain(py);
        r.py_err()
    }

    /// Waits (without the GIL) for the save in flight, every queued upload
    /// and every queued replication; then raises an earlier save's
    /// background failure that no handle reported (once).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let ckpt = self.get()?;
        let r = py.detach(move || {
            let r = ckpt.flush();
            ckpt.wait_replication();
            ckpt.wait_uploads();
            r
        });
        drain(py);
        r.py_err()
    }

    /// Finishes what was started (the save in flight, queued uploads and
    /// pushes) and releases the checkpointer; then raises an earlier save's
    /// background failure that no handle reported. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self
            .inner
            .lock()
            .map_err(|_| to_py(strata::Error::Pipeline("poisoned".into())))?
            .take();
        let Some(ckpt) = taken else {
            return Ok(());
        };
        let (r, health) = py.detach(move || {
            // Everything finished first, so the health kept for after the
            // close counts every failure.
            let r = ckpt.flush();
            ckpt.wait_replication();
            ckpt.wait_uploads();
            let health = ckpt.health();
            // The last reference joins the workers (a call still running
            // on another thread holds the other).
            let closed = match Arc::try_unwrap(ckpt) {
                Ok(ckpt) => ckpt.close(),
                Err(_) => Ok(()),
            };
            (r.and(closed), health)
        });
        if let Ok(mut h) = self.closed_health.lock() {
            *h = Some(health);
        }
        drain(py);
        r.py_err()
    }

    /// The background's counters and newest failure: a dict of
    /// `failed_saves`, `skipped_saves`, `dropped_uploads`,
    /// `dropped_pushes` and `last_error` (the exception, or None).
    /// Readable after `close` (as it was then).
    fn health<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let h = match self.inner.lock().ok().and_then(|g| g.clone()) {
            Some(ckpt) => ckpt.health(),
            None => self
                .closed_health
                .lock()
                .ok()
                .and_then(|h| h.clone())
                .ok_or_else(|| invalid("the checkpointer is closed"))?,
        };
        let d = PyDict::new(py);
        d.set_item("failed_saves", h.failed_saves)?;
        d.set_item("skipped_saves", h.skipped_saves)?;
        d.set_item("dropped_uploads", h.dropped_uploads)?;
        d.set_item("dropped_pushes", h.dropped_pushes)?;
        let last = h.last_error.map(|e| to_py(e).into_value(py));
        d.set_item("last_error", last)?;
        Ok(d)
    }

    /// This process's metrics in Prometheus' text format (what
    /// `metrics_listen` serves at `/metrics`).
    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        let ckpt = self.get()?;
        Ok(py.detach(move || ckpt.metrics_text()))
    }

    /// Where `/metrics` is served (`"host:port"`, the port chosen where
    /// `metrics_listen` named 0), or None.
    #[getter]
    fn metrics_address(&self) -> PyResult<Option<String>> {
        Ok(self.get()?.metrics_addr().map(|a| a.to_string()))
    }
}

impl Drop for PyCheckpointer {
    fn drop(&mut self) {
        // Dropping the checkpointer joins its workers, and a commit round
        // through the torch.distributed store takes the GIL: joining while
        // holding it (Python deallocates with the GIL held) would deadlock.
        let taken = self.inner.get_mut().ok().and_then(Option::take);
        if let Some(ckpt) = taken {
            Python::attach(|py| py.detach(move || drop(ckpt)));
        }
    }
}

fn l2_text(s: &strata::L2State) -> String {
    match s {
        strata::L2State::Pending => "pending".into(),
        strata::L2State::Replicated { peers, .. } => format!("replicated to {}", peers.join(", ")),
        strata::L2State::Degraded { peers, wanted, .. } => {
            format!("degraded: {} of {wanted} peers", peers.len())
        }
    }
}

fn l3_text(s: &strata::L3State) -> String {
    match s {
        strata::L3State::Queued => "queued".into(),
        strata::L3State::Uploading { done, total } => format!("uploading {done}/{total}"),
        strata::L3State::Committed { .. } => "committed".into(),
        strata::L3State::Failed(why) => format!("failed: {why}"),
    }
}
