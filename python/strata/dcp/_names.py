"""How a DCP checkpoint lies in a Strata step.

* ``checkpoint_id`` is the step: an int, or a string holding one.
* Each rank's write items are the entries of its shard: a tensor item is a
  tensor entry holding exactly the item's chunk (C-contiguous), a bytes item
  a blob entry. An item's ``storage_data`` is ``(rank, entry name)``: plain
  builtins, so ``.metadata`` unpickles with nothing but DCP's own classes.
* The coordinator's shard also holds DCP's ``.metadata`` (a pickled
  ``Metadata``) as the blob :data:`METADATA_ENTRY`.
* Every shard's manifest metadata says what it is: ``strata.dcp`` (this
  layout's version), ``strata.dcp.coordinator`` (the rank holding
  ``.metadata``) and :data:`LAYOUT_KEY`, a JSON object naming, for each
  tensor entry, its FQN, the global shape and the chunk's offsets in it.
  The native ``Checkpointer`` writes the same key for DTensors, so tools
  (``strata show``) and the DCP reader know a shard's place in the global
  tensor without unpickling anything.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .._errors import InvalidError
from .._layout import LAYOUT_KEY, Place, layout_json, parse_layout
from .._tree import EntryNames as _Names

__all__ = ["LAYOUT_KEY", "Place", "layout_json", "parse_layout"]

DCP_KEY = "strata.dcp"
DCP_VERSION = "1"
COORDINATOR_KEY = "strata.dcp.coordinator"
METADATA_ENTRY = "__dcp_metadata__"



def parse_step(checkpoint_id: Any) -> Optional[int]:
    """The step a ``checkpoint_id`` names (None for None); an
    ``InvalidError`` for anything else than a non-negative int or a string
    of one."""
    if checkpoint_id is None:
        return None
    if isinstance(checkpoint_id, bool):
        raise InvalidError(f"checkpoint_id {checkpoint_id!r} is not a step")
    if isinstance(checkpoint_id, int):
        step = checkpoint_id
    elif isinstance(checkpoint_id, str) and checkpoint_id.strip().isdigit():
        step = int(checkpoint_id.strip())
    else:
        raise InvalidError(
            f"checkpoint_id {checkpoint_id!r} is not a step: Strata names a DCP checkpoint by its "
            "step, an int or a string of digits"
        )
    if step < 0 or step >= 1 << 64:
        raise InvalidError(f"checkpoint_id {checkpoint_id!r} is out of range")
    return step


def is_step(checkpoint_id: Any) -> bool:
    try:
        return parse_step(checkpoint_id) is not None
    except InvalidError:
        return False


class EntryNames:
    """Entry names of one shard of a DCP checkpoint: the FQN, with ``@``
    and the chunk's offsets for a piece of a tensor, made valid and unique
    as every entry name is (``strata._tree.EntryNames``)."""

    def __init__(self) -> None:
        self.names = _Names({METADATA_ENTRY})

    def name(self, fqn: str, offsets: Optional[Sequence[int]] = None) -> str:
        base = fqn
        if offsets is not None and any(int(o) != 0 for o in offsets):
            base = f"{fqn}@{','.join(str(int(o)) for o in offsets)}"
        return self.names.name(base, f"item.{len(self.names.names)}")
