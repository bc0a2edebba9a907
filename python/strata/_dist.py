"""Ranks agreeing through torch.distributed: the coordinator callable the
native module calls for each round (a commit barrier, a restore agreement).

Strata's rounds are keyed and run both on the training thread (``load``)
and on the background commit worker, in an order that differs between
ranks. Collectives on a process group must be issued in the same order on
every rank, so the rounds go through the process group's key-value store
(the TCPStore torchrun or ``init_process_group`` already runs) instead: a
round is addressed by its key, never touches the trainer's NCCL stream,
and never waits behind (or blocks) a barrier on the main thread. Each round
costs O(world) store operations: every rank sets its value, rank 0 gathers
them and publishes the result, and the last rank to read it deletes the
keys.
"""

from __future__ import annotations

import struct
from datetime import timedelta
from typing import Any, List


def _pack(values: List[bytes]) -> bytes:
    out = [struct.pack("<I", len(values))]
    for v in values:
        out.append(struct.pack("<Q", len(v)))
        out.append(v)
    return b"".join(out)


def _unpack(data: bytes, world: int) -> List[bytes]:
    view = memoryview(data)
    if len(view) < 4:
        raise ValueError("short round result")
    (n,) = struct.unpack_from("<I", view, 0)
    if n != world:
        raise ValueError(f"round result for {n} ranks, expected {world}")
    at = 4
    out = []
    for _ in range(n):
        if at + 8 > len(view):
            raise ValueError("short round result")
        (ln,) = struct.unpack_from("<Q", view, at)
        at += 8
        if at + ln > len(view):
            raise ValueError("short round result")
        out.append(bytes(view[at : at + ln]))
        at += ln
    return out


class StoreGather:
    """``gather(rank, key, value, timeout_s) -> list[bytes]`` over a
    torch.distributed ``Store``."""

    def __init__(self, store: Any, world: int, prefix: str) -> None:
        import torch.distributed as dist

        self.store = dist.PrefixStore(prefix, store)
        self.world = world

    def __call__(self, rank: int, key: str, value: bytes, timeout_s: float) -> List[bytes]:
        s = self.store
        timeout = timedelta(seconds=max(timeout_s, 0.001))
        s.set(f"{key}/v/{rank}", value)
        done = f"{key}/all"
        if rank == 0:
            keys = [f"{key}/v/{r}" for r in range(self.world)]
            s.wait(keys, timeout)
            values = [s.get(k) for k in keys]
            s.set(done, _pack(values))
            for k in keys:
                s.delete_key(k)
        else:
            s.wait([done], timeout)
            values = _unpack(s.get(done), self.world)
        if s.add(f"{key}/n", 1) == self.world:
            s.delete_key(done)
            s.delete_key(f"{key}/n")
        return values


def torch_world():
    """``(rank, world, store)`` of the initialised default process group,
    or None when torch.distributed is not in use."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed import distributed_c10d as c10d

    rank = dist.get_rank()
    world = dist.get_world_size()
    store = c10d._get_default_store()
    return rank, world, store
