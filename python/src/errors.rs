//! Rust errors as Python exceptions: the class is chosen by the error's
//! [`ErrorKind`] from the hierarchy defined in `strata/_errors.py` (Python
//! classes, so they can also derive from `ValueError`, `LookupError`,
//! `TimeoutError`, ...).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use strata::{Error, ErrorKind};

/// The exception class for an error.
fn class_name(e: &Error) -> &'static str {
    if matches!(e, Error::Timeout { .. }) {
        return "WaitTimeoutError";
    }
    match e.kind() {
        ErrorKind::NotFound => "NotFoundError",
        ErrorKind::Corrupt => "CorruptError",
        ErrorKind::Unavailable => "UnavailableError",
        ErrorKind::Invalid => "InvalidError",
        ErrorKind::Conflict => "ConflictError",
        ErrorKind::Unauthorized => "UnauthorizedError",
        ErrorKind::NoSpace => "NoSpaceError",
        _ => "InternalError",
    }
}

/// The Python exception for a Rust error (its message carries the whole
/// cause chain).
pub(crate) fn to_py(e: Error) -> PyErr {
    let name = class_name(&e);
    let msg = strata::with_causes(&e);
    Python::attach(|py| {
        let class = py.import("strata._errors").and_then(|m| m.getattr(name));
        match class {
            Ok(class) => match class.call1((msg.clone(),)) {
                Ok(exc) => PyErr::from_value(exc),
                Err(err) => err,
            },
            Err(_) => PyRuntimeError::new_err(msg),
        }
    })
}

/// `.map_err(to_py)` for results.
pub(crate) trait IntoPy<T> {
    /// The result with a Python exception.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for strata::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// An invalid argument, as the package's `InvalidError`.
pub(crate) fn invalid(msg: impl Into<String>) -> PyErr {
    to_py(Error::InvalidState(msg.into()))
}
