"""DCP's ``.metadata`` unpickled with an allowlist.

torch (2.15) unpickles ``.metadata`` with plain ``pickle.load``: a file
that runs code when a checkpoint is opened. Strata's copy is verified
against its chunk ids (BLAKE3, named by a manifest that its commit record
names) before it is unpickled, and then unpickled here, where only DCP's
metadata classes, torch's sizes, dtypes and memory formats, and builtin
containers may be built. Anything else is an ``InvalidError``.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from .._errors import InvalidError

_MODULES_ALL = (
    # Metadata, TensorStorageMetadata, ChunkStorageMetadata, TensorProperties,
    # BytesStorageMetadata, MetadataIndex, StorageMeta.
    "torch.distributed.checkpoint.metadata",
)
_ALLOWED = {
    ("torch", "Size"),
    ("torch", "device"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("builtins", "complex"),
    # torch.layout pickles as a lookup of a layout by its name.
    ("torch.serialization", "_get_layout"),
}


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _MODULES_ALL and "." not in name:
            # Only the module's classes (its dataclasses and enums), never
            # a function or a module it imports.
            v = super().find_class(module, name)
            if isinstance(v, type) and v.__module__ == module:
                return v
        if module == "torch":
            import torch

            v = getattr(torch, name, None)
            if isinstance(v, (torch.dtype, torch.memory_format, torch.layout)):
                return v
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise InvalidError(f".metadata names {module}.{name}, which a DCP metadata file never holds")


def load_metadata(data: bytes) -> Any:
    """The ``Metadata`` pickled in ``data`` (already verified)."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        md = _Restricted(io.BytesIO(data)).load()
    except InvalidError:
        raise
    except Exception as e:  # noqa: BLE001 - any decoding failure is bad input
        raise InvalidError(f".metadata does not unpickle: {type(e).__name__}: {e}") from None
    if not isinstance(md, Metadata):
        raise InvalidError(f".metadata holds a {type(md).__name__}, not DCP Metadata")
    return md


def dump_metadata(md: Any) -> bytes:
    return pickle.dumps(md, protocol=pickle.HIGHEST_PROTOCOL)
