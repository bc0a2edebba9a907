"""The exceptions Strata raises: one class per Rust ``ErrorKind``.

Each says what to do about the error (the same words as the Rust docs), and
derives from the built-in exception a Python caller would expect, so
``except ValueError`` catches a bad argument and ``except TimeoutError`` a
wait that ran out.
"""


class StrataError(Exception):
    """Any error from Strata. ``kind`` names the Rust ``ErrorKind``."""

    kind = "internal"


class NotFoundError(StrataError, LookupError):
    """Nothing to restore, or the thing asked for is in no tier: save first,
    or ask for something else."""

    kind = "not_found"


class CorruptError(StrataError):
    """Stored bytes are damaged in every tier that was tried: restore an
    older step; ``strata verify --repair`` fixes what a good copy exists for."""

    kind = "corrupt"


class UnavailableError(StrataError):
    """A tier, a peer or a rank is unreachable, or the pipeline is busy:
    retry later (the same call may succeed)."""

    kind = "unavailable"


class WaitTimeoutError(UnavailableError, TimeoutError):
    """``SaveHandle.wait`` ran out of time; the save goes on."""

    kind = "unavailable"


class InvalidError(StrataError, ValueError):
    """The caller passed something invalid (configuration, state, a buffer
    of the wrong size): fix the input; retrying does not help."""

    kind = "invalid"


class ConflictError(StrataError):
    """The operation conflicts with what is already there (a committed step
    saved again): use a new step number or remove the old one first."""

    kind = "conflict"


class UnauthorizedError(StrataError, PermissionError):
    """A tier refused the credentials: fix them."""

    kind = "unauthorized"


class NoSpaceError(StrataError, OSError):
    """A device or budget is full: free space (retention) or grow it."""

    kind = "no_space"


class InternalError(StrataError):
    """A bug or an unexpected condition: report it."""

    kind = "internal"


__all__ = [
    "StrataError",
    "NotFoundError",
    "CorruptError",
    "UnavailableError",
    "WaitTimeoutError",
    "InvalidError",
    "ConflictError",
    "UnauthorizedError",
    "NoSpaceError",
    "InternalError",
]
