"""Read-only access to a job's checkpoints in every tier, any rank's.

``strata.Catalog`` opens the tiers a configuration names (the same
``config``/environment/keyword resolution as ``Checkpointer``), lists what
each holds, and reads entries and byte ranges of any rank's shard: each
chunk verified, from the tier that served the shard's manifest, else the
fastest other tier that holds a good copy (L1, then peers, then L3). With
``repair=True`` a tier that holds the shard committed and was found
lacking a chunk or holding it damaged gets the good copy written back. Nothing here agrees
with other ranks: it is for tools, and for readers that need other ranks'
shards (resharding a checkpoint onto a different layout)::

    cat = strata.Catalog(job="my-run", l1_dir="/nvme/strata", l3_url="s3://b/p")
    step = cat.steps()[-1]
    for name, dtype, shape, length in cat.entries(step, rank=3):
        ...
    head = cat.read(step, 3, "model.embed.weight", offset=0, length=4096)
"""

import json
from typing import Any, Dict, List, Optional, Tuple

from . import _strata
from ._arrays import STRATA_TO_NUMPY
from ._errors import NotFoundError


class Catalog:
    """A job's checkpoints in every tier it names, read-only."""

    def __init__(self, config: Optional[str] = None, **settings: Any) -> None:
        _strata.drain_logs()
        try:
            self._native = _strata.Catalog(json.dumps(settings), config)
        finally:
            _strata.drain_logs()
        #: What the last ``read`` did: ``chunks_read``, ``fallbacks``
        #: (chunks served by a slower tier), ``repaired``, ``cached``, and
        #: ``served_by``: ``{tier name: chunks}``.
        self.last_read: Dict[str, int] = {}

    def refresh(self) -> None:
        """Lists every tier again (steps saved since become visible)."""
        self._native.refresh()

    def tiers(self) -> List[Tuple[str, str, Optional[str]]]:
        """``[(name, kind, listing_error), ...]``, fastest first."""
        return list(self._native.tiers())

    def steps(self) -> List[int]:
        """Steps committed in at least one tier, oldest first."""
        return list(self._native.steps())

    def decided_steps(self) -> List[int]:
        """Steps some tier holds a commit record of (every rank voted them
        durable), whether or not every rank's record is written yet."""
        return list(self._native.decided_steps())

    def world_size(self, step: int) -> Optional[int]:
        """The world size that saved ``step`` (None if no tier holds a
        commit record of it)."""
        return self._native.world_size(step)

    def roll_forward(self, step: int, rank: int) -> List[Tuple[str, Optional[str]]]:
        """Commits rank ``rank``'s shard of the decided ``step`` in each
        tier that holds its manifest without a commit record (the rank died
        after its vote); returns ``[(tier, None or why it failed), ...]``.
        ``refresh`` to see the result."""
        try:
            return [tuple(x) for x in self._native.roll_forward(step, rank)]
        finally:
            _strata.drain_logs()

    def ranks(self, step: int) -> List[int]:
        """The ranks of ``step`` committed in some tier."""
        return list(self._native.ranks(step))

    def held(self, step: int) -> Dict[str, str]:
        """``{tier name: "committed" | "partial"}`` for ``step``."""
        return dict(self._native.held(step))

    def entries(self, step: int, rank: int) -> List[Tuple[str, Optional[str], Optional[List[int]], int]]:
        """Rank ``rank``'s entries of ``step``: ``(name, dtype, shape, length)``."""
        return [tuple(e) for e in self._native.entries(step, rank)]

    def chunks(self, step: int, rank: int, name: str) -> List[Tuple[str, int]]:
        """The chunks entry ``name`` lies in: ``[(id in hex, length), ...]``."""
        return [tuple(c) for c in self._native.chunks(step, rank, name)]

    def metadata(self, step: int, rank: int) -> Dict[str, str]:
        """The metadata saved with rank ``rank``'s shard of ``step``."""
        return dict(self._native.metadata(step, rank))

    def read(
        self,
        step: int,
        rank: int,
        name: str,
        offset: int = 0,
        length: Optional[int] = None,
        repair: bool = False,
    ) -> bytes:
        """Bytes ``offset:offset+length`` of entry ``name`` (the rest of the
        entry without ``length``), verified."""
        try:
            data, stats = self._native.read(step, rank, name, offset, length, repair)
        finally:
            _strata.drain_logs()
        self.last_read = dict(stats)
        self.last_read["served_by"] = dict(self.last_read.get("served_by", []))
        return data

    def read_into(self, step: int, rank: int, name: str, offset: int, buffer: Any, repair: bool = False) -> None:
        """Reads ``len(buffer)`` bytes of entry ``name`` from ``offset`` into
        ``buffer`` (a contiguous CPU tensor, a numpy array or a
        bytearray), verified, without a copy through Python bytes."""
        from ._arrays import writable_host

        ptr, length, pin = writable_host(buffer)
        try:
            stats = self._native.read_into(step, rank, name, offset, ptr, length, repair)
        finally:
            del pin
            _strata.drain_logs()
        self.last_read = dict(stats)
        self.last_read["served_by"] = dict(self.last_read.get("served_by", []))

    def read_array(self, step: int, rank: int, name: str, repair: bool = False) -> Any:
        """A tensor entry as a numpy array of its dtype and shape (bfloat16
        and other dtypes numpy lacks come back as raw bytes of their width)."""
        for n, dtype, shape, _ in self.entries(step, rank):
            if n == name:
                break
        else:
            raise NotFoundError(f"entry {name!r} in step {step} rank {rank}")
        data = self.read(step, rank, name, repair=repair)
        import numpy as np

        if dtype is None:
            return data
        np_dtype = STRATA_TO_NUMPY.get(dtype)
        if np_dtype is None:
            return data
        return np.frombuffer(data, dtype=np.dtype(np_dtype).newbyteorder("<")).reshape(shape)


