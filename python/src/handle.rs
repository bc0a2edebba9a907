//! A save in progress, for Python: `done()`, `wait(target, timeout)` and
//! the save's counters as a dict.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use strata::{SaveHandle, SaveStats, Target};

use crate::errors::{invalid, IntoPy};
use crate::logs::drain;

/// A save in progress (private: wrapped by `strata.SaveHandle`).
#[pyclass(name = "SaveHandle", module = "strata._strata", frozen)]
pub(crate) struct PySaveHandle {
    pub(crate) inner: SaveHandle,
}

/// The counters of a save, as a dict (durations in seconds).
pub(crate) fn stats_dict<'py>(py: Python<'py>, s: &SaveStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("step", s.step)?;
    d.set_item("skipped", s.skipped)?;
    d.set_item("stall_s", s.stall.as_secs_f64())?;
    d.set_item("to_durable_s", s.to_durable.as_secs_f64())?;
    d.set_item("logical_bytes", s.logical_bytes)?;
    d.set_item("chunks", s.chunks)?;
    d.set_item("bytes_written", s.bytes_written)?;
    d.set_item("bytes_deduped", s.bytes_deduped)?;
    d.set_item("chunks_written", s.chunks_written)?;
    d.set_item("chunks_deduped", s.chunks_deduped)?;
    d.set_item("hash_s", s.hash_time.as_secs_f64())?;
    d.set_item("write_s", s.write_time.as_secs_f64())?;
    d.set_item("barrier_s", s.barrier_time.as_secs_f64())?;
    d.set_item("commit_s", s.commit_time.as_secs_f64())?;
    d.set_item("retired_steps", s.retired_steps)?;
    d.set_item("retired_bytes", s.retired_bytes)?;
    Ok(d)
}

fn target(name: &str) -> PyResult<Target> {
    match name {
        "l1" => Ok(Target::L1),
        "peers" | "l2" => Ok(Target::Peers),
        "l3" => Ok(Target::L3),
        other => Err(invalid(format!(
            "unknown target {other:?} (\"l1\", \"peers\" or \"l3\")"
        ))),
    }
}

#[pymethods]
impl PySaveHandle {
    /// The step.
    #[getter]
    fn step(&self) -> u64 {
        self.inner.step()
    }

    /// Seconds `save` blocked the caller.
    #[getter]
    fn stall_s(&self) -> f64 {
        self.inner.stall().as_secs_f64()
    }

    /// True once the step is durable on L1 (or failed).
    fn done(&self) -> bool {
        self.inner.is_done()
    }

    /// Blocks (without the GIL) until the save reached `target`, or
    /// `timeout` seconds passed; returns the save's counters.
    #[pyo3(signature = (target_name="l1", timeout=None))]
    fn wait<'py>(
        &self,
        py: Python<'py>,
        target_name: &str,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let t = target(target_name)?;
        let timeout = match timeout {
            Some(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s)),
            Some(s) => return Err(invalid(format!("timeout {s} is not a number of seconds"))),
            None => None,
        };
        let r = py.detach(|| self.inner.wait_for(t, timeout));
        drain(py);
        stats_dict(py, &r.py_err()?)
    }
}
