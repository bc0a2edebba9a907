//! A Rust [`Coordinator`] over a Python callable: how ranks agree through
//! torch.distributed (`strata/_dist.py` implements the callable over the
//! process group's key-value store). The callable is
//! `gather(rank, key, value: bytes, timeout_secs: float) -> list[bytes]`;
//! one whose `_strata_reduces` is true also has `gather.reduce(rank, key,
//! value, timeout_secs, reducer) -> bytes`, and runs the reducing rounds (the commit barrier, the
//! restore agreement) there: one rank runs `reducer` on every value and
//! the others read only its result.
//!
//! Rounds are keyed and may run on the caller's thread (a restore) and on
//! the background commit worker at the same time, so the exchange must be
//! addressed by key, not by call order: that is why it is the store and not
//! collectives on a process group (see docs/python.md).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCFunction, PyDict, PyList, PyTuple};
use strata::coordinator::Reduce;
use strata::{Coordinator, Error, Result};

/// A round's reduction, lent to Python for the length of one call of
/// `gather.reduce`: the callable Python gets says so and does nothing once
/// the call has returned (Python may keep a reference to it).
struct Lent {
    reduce: Mutex<Option<&'static Reduce<'static>>>,
    world: usize,
}

/// Takes the reduction back from Python when the call ends (returned,
/// raised or unwound).
struct TakeBack(Arc<Lent>);

impl Drop for TakeBack {
    fn drop(&mut self) {
        *self.0.reduce.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// `reducer(values: list[bytes]) -> bytes` over `lent`.
fn reducer<'py>(py: Python<'py>, lent: Arc<Lent>) -> PyResult<Bound<'py, PyCFunction>> {
    PyCFunction::new_closure(
        py,
        Some(c"strata_round_reduce"),
        Some(c"Reduces every rank's value of a Strata round (by rank) to its decision."),
        move |args: &Bound<'_, PyTuple>,
              _kw: Option<&Bound<'_, PyDict>>|
              -> PyResult<Py<PyBytes>> {
            let (values,): (Vec<Vec<u8>>,) = args.extract()?;
            if values.len() != lent.world {
                return Err(PyRuntimeError::new_err(format!(
                    "a round of {} ranks reduced over {} values",
                    lent.world,
                    values.len()
                )));
            }
            let py = args.py();
            // The lock is taken without the GIL (and the reduction runs
            // without it): a thread holding the lock never waits for the
            // GIL while another holds the GIL and waits for the lock.
            let out = py
                .detach(|| {
                    let held = lent.reduce.lock().unwrap_or_else(PoisonError::into_inner);
                    held.map(|reduce| reduce(&values))
                })
                .ok_or_else(|| {
                    PyRuntimeError::new_err(
                        "this round's reduction was called after its round had ended",
                    )
                })?;
            Ok(PyBytes::new(py, &out).unbind())
        },
    )
}

/// Ranks agreeing through a Python callable.
pub(crate) struct PyCoordinator {
    pub(crate) job: String,
    pub(crate) world: u32,
    pub(crate) gather: Py<PyAny>,
    /// `gather` runs reducing rounds too ([`gather_reduces`], asked once
    /// when the coordinator is made).
    pub(crate) reduces: bool,
}

/// Whether `gather` runs reducing rounds too (`gather.reduce`): Strata's
/// own store rounds say so with `_strata_reduces`.
pub(crate) fn gather_reduces(py: Python<'_>, gather: &Py<PyAny>) -> bool {
    gather
        .bind(py)
        .getattr("_strata_reduces")
        .and_then(|v| v.is_truthy())
        .unwrap_or(false)
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

    fn all_reduce(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
        reduce: &Reduce<'_>,
    ) -> Result<Vec<u8>> {
        let fail = |what: String| Error::Coordination(format!("{key}: {what}"));
        if !self.reduces {
            // A plain gather: every rank reduces every value itself.
            return strata::coordinator::reduce_gathered(self, rank, key, value, timeout, reduce);
        }
        // SAFETY: only the lifetimes change. The reference is read only
        // under `lent.reduce`'s lock while it is Some, and `_back` sets it
        // to None (taking the same lock, so after any call in progress
        // ends) before this function returns or unwinds: no use outlives
        // the borrow of `reduce`.
        let forever: &'static Reduce<'static> =
            unsafe { std::mem::transmute::<&Reduce<'_>, &'static Reduce<'static>>(reduce) };
        let lent = Arc::new(Lent {
            reduce: Mutex::new(Some(forever)),
            world: self.world as usize,
        });
        let _back = TakeBack(lent.clone());
        let attached = Python::try_attach(|py| {
            let f = reducer(py, lent).map_err(|e| fail(e.to_string()))?;
            let out = self
                .gather
                .call_method1(
                    py,
                    "reduce",
                    (
                        rank,
                        key,
                        PyBytes::new(py, &value),
                        timeout.as_secs_f64(),
                        f,
                    ),
                )
                .map_err(|e| self.error_of(py, rank, key, e))?;
            out.bind(py)
                .cast::<PyBytes>()
                .map(|b| b.as_bytes().to_vec())
                .map_err(|_| fail("the coordinator's reduce did not return bytes".into()))
        });
        attached.unwrap_or_else(|| Err(fail("the Python interpreter is shutting down".into())))
    }
}
