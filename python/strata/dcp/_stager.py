"""Staging for ``dcp.async_save``: a copy of the state into memory that is
allocated once and reused by every later save.

DCP's default ``async_save`` allocates a fresh CPU copy of the whole state
on each call (and frees it after): the training loop waits for the page
faults of gigabytes of new memory, every time. Here each tensor (a DTensor's
local shard) is copied into a buffer of its dtype and shape kept from the
previous save (pinned when the source is on a GPU), so a save blocks only
for a warm copy. The copy is taken before ``async_save`` returns: tensors
changed right after it never reach the checkpoint.

The buffers are reused once the previous staged state was written into
Strata's own staging (with the thread executor the writer says so), or
DCP dropped it (the process executor's save finished; a save that failed
before it wrote anything and whose error is no longer referenced). While
they are still held, the next ``stage`` copies into fresh buffers instead:
it never waits, and never overwrites a state a save may still read.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any, Dict, List, Tuple



def _dtensor_type() -> Any:
    try:
        from torch.distributed.tensor import DTensor

        return DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return None


class _Staged(dict):
    """The staged state (a dict that can be watched: its buffers are free
    again once DCP drops it, whatever became of its save)."""


class Staging:
    """A pool of staging tensors, by position in the state and by (dtype,
    shape, pinned). Never blocks: when the previous staged state is still
    held (its save has not copied it yet, or a failed save's error still
    references it), this one goes to fresh buffers, which become the pool."""

    def __init__(self) -> None:
        self.buffers: Dict[Tuple[Any, ...], Any] = {}
        # Which staging the pool's buffers hold, and whether it may be
        # overwritten. Plain attributes (set under the GIL), no lock: the
        # release may come from a finalizer run by the garbage collector
        # on any thread, at any point.
        self.generation = 0
        self.released = True
        # Stagings not yet written, oldest first (the writer releases them
        # in the order DCP writes them).
        self.pending: List[int] = []

    def release(self, generation: int) -> None:
        """Staging ``generation`` was written (or dropped)."""
        if generation in self.pending:
            self.pending.remove(generation)
        if generation == self.generation:
            self.released = True

    def release_oldest(self) -> None:
        """The oldest staging not yet written was written."""
        if self.pending:
            self.release(self.pending[0])

    def stage(self, state: Any) -> Any:
        """A copy of ``state`` whose tensors live in reused buffers."""
        import torch

        if not self.released:
            # Still held (its save has not copied it, or a failed save's
            # error still references it): never overwritten, never waited
            # for, and no garbage collection on the training loop's time.
            self.buffers = {}
        self.generation += 1
        generation = self.generation
        self.released = False
        self.pending.append(generation)
        try:
            dt = _dtensor_type()
            used: List[Tuple[Any, ...]] = []
            out = self._copy(state, (), torch, dt, used)
            # Copies to pinned memory were queued without blocking: wait
            # for them before the caller may change the sources.
            if any(k[-1] for k in used) and torch.cuda.is_available():
                torch.cuda.synchronize()
            # Buffers of tensors no longer in the state are freed.
            keep = set(used)
            for k in list(self.buffers):
                if k not in keep:
                    del self.buffers[k]
            if type(out) is dict:
                out = _Staged(out)
                weakref.finalize(out, self.release, generation)
            return out
        except BaseException:
            self.release(generation)
            raise

    def _buffer(self, path: Tuple[Any, ...], t: Any, torch: Any, used: List[Tuple[Any, ...]]) -> Any:
        pinned = t.device.type == "cuda"
        key = (path, t.dtype, tuple(t.shape), pinned)
        buf = self.buffers.get(key)
        if buf is None:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=pinned)
            self.buffers[key] = buf
        used.append(key)
        buf.copy_(t.detach(), non_blocking=pinned)
        return buf

    def _copy(self, v: Any, path: Tuple[Any, ...], torch: Any, dt: Any, used: List[Tuple[Any, ...]]) -> Any:
        if dt is not None and isinstance(v, dt):
            local = self._buffer(path, v.to_local(), torch, used)
            # The same spec over the staged local shard, left where it is
            # (from_local would move it back to the mesh's device).
            return dt(local, v._spec, requires_grad=False)
        if isinstance(v, torch.Tensor):
            if v.layout != torch.strided or v.is_quantized:
                return v.detach().clone()
            return self._buffer(path, v, torch, used)
        if isinstance(v, dict):
            items = [(k, self._copy(x, path + (k,), torch, dt, used)) for k, x in v.items()]
            return dict(items) if type(v) is dict else type(v)(items)
        if isinstance(v, list):
            return [self._copy(x, path + (i,), torch, dt, used) for i, x in enumerate(v)]
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            return tuple(self._copy(x, path + (i,), torch, dt, used) for i, x in enumerate(v))
        return copy.deepcopy(v)
