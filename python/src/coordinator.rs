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
    pub(crate) job: String,
    pub(crate) world: u32,
    pub(crate) gather: Py<PyAny>,
}

impl PyCoordinator {
    /// The Rust error of the callable's exception: its `ConflictError`
    /// (another process claimed this rank) stays a conflict
    /// ([`Error::RankClaimed`]); anything else is a failed round.
    fn error_of(&self, py: Python<'_>, rank: u32, key: &str, e: PyErr) -> Error {
        let conflict = py
            .import("strata._errors")
            .and_then(|m| m.getattr("ConflictError"))
            .map(|c| e.is_instance(py, &c))
            .unwrap_or(false);
        if conflict {
            let other = e
                .value(py)
                .getattr("other")
                .and_then(|o| o.extract::<String>())
                .unwrap_or_else(|_| e.value(py).to_string());
            return Error::RankClaimed {
                job: self.job.clone(),
                rank,
                other,
            };
        }
        Error::Coordination(format!("{key}: {e}"))
    }
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
                .map_err(|e| self.error_of(py, rank, key, e))?;
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
