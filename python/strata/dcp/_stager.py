"""Staging for ``dcp.async_save``: a copy of the state into memory that is
allocated once and reused by every later save.

DCP's default ``async_save`` allocates a fresh CPU copy of the whole state
on each call (and frees it after): the training loop waits for the page
faults of gigabytes of new memory, every time. Here each tensor (a DTensor's
local shard) is copied into a buffer of its dtype and shape kept from the
previous save (pinned when the source is on a GPU), so a save blocks only
for a warm copy. The copy is taken before ``async_save`` returns: tensors
changed right after it never reach the checkpoint.

The buffers are reused: the next ``stage`` waits until the previous
staged state was written into Strata's own staging (with the thread
executor the writer says so; with the process executor, wait for the
previous ``async_save`` future first, as with DCP's cached staging). A
save that failed before it wrote anything (a refused step, a rank that
failed while planning) releases them too, once DCP lets go of its staged
state: a failed save never blocks the next one.
"""

from __future__ import annotations

import copy
import gc
import threading
import weakref
from typing import Any, Dict, List, Tuple

from .._errors import WaitTimeoutError


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
    shape, pinned)."""

    def __init__(self) -> None:
        self.buffers: Dict[Tuple[Any, ...], Any] = {}
        self.released = threading.Event()
        self.released.set()
        self.lock = threading.Lock()
        # Which staging the buffers hold: a late release of an older one
        # never frees the current one.
        self.generation = 0

    def wait_released(self, timeout: float) -> None:
        if self.released.is_set():
            return
        # A failed save's staged state may be kept only by reference
        # cycles (its exception's traceback): collect them first.
        gc.collect()
        if not self.released.wait(timeout):
            raise WaitTimeoutError(
                f"the previous async_save's staged state was not written within {timeout:.0f} s; "
                "wait for its future before the next save"
            )

    def release(self, generation: int = -1) -> None:
        """The buffers may be reused (``generation``: only if they still
        hold that staging; -1: the current one)."""
        with self.lock:
            if generation in (-1, self.generation):
                self.released.set()

    def stage(self, state: Any, timeout: float = 600.0) -> Any:
        """A copy of ``state`` whose tensors live in reused buffers."""
        import torch

        self.wait_released(timeout)
        with self.lock:
            self.released.clear()
            self.generation += 1
            generation = self.generation
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
            self.released.set()
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
