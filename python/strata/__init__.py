"""Strata: a multi-tier checkpoint store for large-scale AI training.

``strata.Checkpointer`` saves a training job's state (nested dicts of torch
tensors, numpy arrays and plain Python values) asynchronously: ``save``
copies the tensors into staging memory and returns; the step becomes
durable in the background on the node's NVMe (L1), on peer nodes (L2) and
on object storage (L3). ``load`` and ``load_into`` restore the newest step
every rank can restore, every byte verified::

    import strata

    with strata.Checkpointer(job="my-run", l1_dir="/nvme/strata") as ckpt:
        state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step}
        if ckpt.latest_step() is not None:
            ckpt.load_into(state)
            optim.load_state_dict(state["optim"])
        ...
        handle = ckpt.save(step, state)   # training goes on at once
        handle.wait("l1")                 # optional: durable on L1

Under torchrun or Slurm the rank and world size come from the launcher (or
from torch.distributed, when initialised), and ranks agree through the
process group's store. Logs go to the ``strata`` logger. All storage logic
is in the Rust crates; this package converts.
"""

from ._catalog import Catalog
from ._checkpointer import Checkpointer, SaveHandle
from ._loading import Loading
from ._errors import (
    ConflictError,
    CorruptError,
    InternalError,
    InvalidError,
    NoSpaceError,
    NotFoundError,
    StrataError,
    UnauthorizedError,
    UnavailableError,
    WaitTimeoutError,
)
from ._strata import __version__


def resolve_config(config=None, **settings):
    """The configuration a ``Checkpointer(config, **settings)`` would use,
    as a dict (TOML file, then the environment, then the keywords)."""
    import json

    from . import _strata

    return json.loads(_strata.resolve_config(json.dumps(settings), config))


__all__ = [
    "Catalog",
    "Checkpointer",
    "Loading",
    "SaveHandle",
    "resolve_config",
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
    "__version__",
]
