//! # strata-python
//!
//! The native half of Strata's Python package: the module `strata._strata`,
//! which the pure-Python `strata` package wraps. It converts and nothing
//! more: configuration into a Rust [`strata::Config`], raw tensor memory
//! into [`strata::Entry`]s, a Python callable into a Rust
//! [`strata::Coordinator`], Rust errors into the exception classes of
//! `strata._errors`, and `tracing` events into Python `logging` records.
//! Every byte is saved and restored by the Rust crates.
//!
//! The methods here are private API: the tensor methods take raw pointers
//! that the Python layer derives from tensors it keeps alive (see
//! `strata/_checkpointer.py`). Every call that can block releases the GIL;
//! background work takes it only to run the torch.distributed coordinator's
//! callable and, on a thread of its own, to hand log records to `logging`;
//! never to touch tensors.

use pyo3::prelude::*;

mod catalog;
mod checkpointer;
mod config;
mod coordinator;
mod errors;
mod handle;
mod logs;

/// The native module.
#[pymodule]
fn _strata(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logs::install();
    m.add_class::<checkpointer::PyCheckpointer>()?;
    m.add_class::<handle::PySaveHandle>()?;
    m.add_class::<checkpointer::PyRestorePlan>()?;
    m.add_class::<catalog::PyCatalog>()?;
    m.add_function(wrap_pyfunction!(logs::drain_logs, m)?)?;
    m.add_function(wrap_pyfunction!(logs::stop_log_delivery, m)?)?;
    m.add_function(wrap_pyfunction!(config::resolve_config, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
