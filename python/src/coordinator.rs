//! A Rust [`Coordinator`] over a Python callable: how ranks agree through
//! torch.distributed (`strata/_dist.py` implements the callable over the
//! process group's key-value store). The callable is
//! `gather(rank, key, value: bytes, timeout_secs: float) -> list[bytes]`.
//!
//! Rounds are keyed and may run on the caller's thread (a restore) and on
//! the background commit worker at the same time, so the exchange must be
//! addressed by key, not by call order: that is why it is the store and not
//! collectives on a process group (see docs/python.md).

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use strata::{Coordinator, Error, Result};

/// Ranks agreeing through a Python callable.
pub(crate) struct PyCoordinator {
    pub(crate) world: u32,
    pub(crate) gather: Py<PyAny>,
}

impl Coordinator for PyCoordinator {
    fn world_size(&self) -> u32 {
        self.world
    }

    fn all_gather(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        let fail = |what: String| Error::Coordination(format!("{key}: {what}"));
        // Never blocks interpreter shutdown: past it, the round fails.
        let attached = Python::try_attach(|py| {
            let out = self
                .gather
                .call1(
                    py,
                    (rank, key, PyBytes::new(py, &value), timeout.as_secs_f64()),
                )
                .map_err(|e| fail(e.to_string()))?;
            let list = out
                .bind(py)
                .cast::<PyList>()
                .map_err(|_| fail("the coordinator did not return a list".into()))?;
            if list.len() != self.world as usize {
                return Err(fail(format!(
                    "the coordinator returned {} values for {} ranks",
                    list.len(),
                    self.world
                )));
            }
            list.iter()
                .map(|v| {
                    v.cast::<PyBytes>()
                        .map(|b| b.as_bytes().to_vec())
                        .map_err(|_| {
                            fail("the coordinator returned a value that is not bytes".into())
                        })
                })
                .collect()
        });
        attached.unwrap_or_else(|| Err(fail("the Python interpreter is shutting down".into())))
    }
}
