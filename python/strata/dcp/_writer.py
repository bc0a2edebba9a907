"""``strata.dcp.StorageWriter``: DCP's storage writer on Strata's pipeline."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import uuid
from typing import Any, Dict, List, Optional, Tuple

from torch.distributed.checkpoint import StorageWriter as _DcpWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .._arrays import TORCH_TO_STRATA, torch_dtype_name, torch_entry
from .._checkpointer import Checkpointer, SaveHandle, _sync_devices
from .._dist import torch_world
from .._errors import ConflictError, InvalidError, StrataError
from ._names import (
    COORDINATOR_KEY,
    DCP_KEY,
    DCP_VERSION,
    LAYOUT_KEY,
    METADATA_ENTRY,
    EntryNames,
    Place,
    is_step,
    layout_json,
    parse_step,
)
from ._pickle import dump_metadata
from ._stager import Staging

log = logging.getLogger("strata")

# One checkpointer per configuration per process, shared by every writer
# made with it (a loop that builds a writer per save, and the process
# executor, which unpickles a new writer for every save, reuse one).
_OPEN: Dict[str, Checkpointer] = {}
_OPEN_LOCK = threading.Lock()


def _checkpointer(config: Optional[str], settings: Dict[str, Any]) -> Checkpointer:
    # The world it joins is part of the key: a world of one (no_dist)
    # and the job's ranks are two checkpointers.
    world = torch_world()
    where = None if world is None else (world[0], world[1])
    key = json.dumps([config, settings, where], sort_keys=True, default=str)
    with _OPEN_LOCK:
        c = _OPEN.get(key)
        if c is None or c.closed:
            c = Checkpointer(config, **settings)
            _OPEN[key] = c
        return c


class StorageWriter(_DcpWriter, AsyncStager):
    """Saves a ``torch.distributed.checkpoint`` checkpoint as a Strata step::

        import torch.distributed.checkpoint as dcp
        from strata.dcp import StorageWriter

        writer = StorageWriter(job="my-run", l1_dir="/nvme/strata")
        dcp.save(state, checkpoint_id=step, storage_writer=writer)
        # or, blocking only for a copy into reused staging:
        fut = dcp.async_save(state, checkpoint_id=step, storage_writer=writer)

    ``config`` and ``settings`` are those of :class:`strata.Checkpointer`
    (TOML, ``STRATA_*``, the launcher's variables, keywords). The
    ``checkpoint_id`` is the step (an int, or a string of one). Each rank's
    write items become the entries of its shard (chunked,
    content-addressed, deduplicated against earlier steps); the
    coordinator's shard also holds DCP's ``.metadata``. ``finish`` is
    Strata's commit: the step exists for readers once every rank's shard is
    durable on L1, and then goes to the peers and L3 like any step.

    A step is saved once: saving a committed step again is a
    ``ConflictError`` (raised while planning, before anything is written).
    """

    # The copy in ``stage`` is synchronous: nothing to wait for after it.
    _synchronize_after_execute = False

    def __init__(self, config: Optional[str] = None, checkpoint_id: Any = None, **settings: Any) -> None:
        super().__init__()
        self._config = config
        self._settings = dict(settings)
        self._step = parse_step(checkpoint_id)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._ckpt: Optional[Checkpointer] = None
        # What one save knows (its step, whether this rank coordinates it,
        # the coordinator's entries held for finish): per thread, because
        # DCP runs each save, from its reset to its finish, on one thread,
        # and two async saves through one writer run on two.
        self._tls = threading.local()
        self._pending: Optional[SaveHandle] = None
        self._staging = Staging()

    def _save(self) -> Any:
        t = self._tls
        if not hasattr(t, "step"):
            t.step = self._step
            t.coordinator = False
            t.deferred = None
            t.save_id = uuid.uuid4().hex
        return t

    # The process executor pickles the writer into its daemon process,
    # which opens its own checkpointer there.
    def __getstate__(self) -> Dict[str, Any]:
        return {"config": self._config, "settings": self._settings, "step": self._step}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self._config = state["config"]
        self._settings = state["settings"]
        self._step = state["step"]
        self._init_runtime()

    @property
    def checkpointer(self) -> Checkpointer:
        """This process's :class:`strata.Checkpointer` for this writer's
        configuration (shared by the writers made with it): ``flush`` waits
        for the pushes to peers and uploads to L3, ``status`` says where a
        step stands."""
        return self._need()

    # -- identity ---------------------------------------------------------

    @property
    def checkpoint_id(self) -> Optional[int]:
        """The step this writer saves (on this thread)."""
        return self._save().step

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return is_step(checkpoint_id)

    def reset(self, checkpoint_id: Any = None) -> None:
        t = self._save()
        t.step = parse_step(checkpoint_id) if checkpoint_id is not None else self._step
        t.deferred = None
        t.save_id = uuid.uuid4().hex

    def storage_meta(self) -> Optional[StorageMeta]:
        job = self._settings.get("job", "")
        t = self._save()
        return StorageMeta(checkpoint_id=f"strata:{job}/{t.step}", save_id=t.save_id)

    # -- staging ----------------------------------------------------------

    def stage(self, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        """A copy of ``state_dict`` in staging memory reused from the
        previous save (DCP's stager: ``dcp.async_save`` calls it)."""
        return self._staging.stage(state_dict)

    def synchronize_staging(self) -> None:
        """Nothing to wait for: ``stage`` copies before it returns."""

    def close(self) -> None:
        """Waits for this rank's last save; the checkpointer stays open for
        other writers (it is closed at exit)."""
        self._settle()

    # -- the save ---------------------------------------------------------

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._save().coordinator = bool(is_coordinator)
        self._settle()
        if self._ckpt is None:
            self._ckpt = _checkpointer(self._config, self._settings)

    def _settle(self) -> None:
        """Waits for this rank's previous save. Its failure was raised on
        every rank by the coordinator's commit; here it is only logged."""
        h, self._pending = self._pending, None
        if h is not None:
            try:
                h.wait("l1")
            except StrataError as e:
                log.debug("step %s failed on this rank (reported by the commit): %s", h.step, e)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        # Everything that could make a rank refuse is checked here, while
        # planning, before any rank has started a save (a save that started
        # waits at the commit barrier for every rank).
        step = self._save().step
        if step is None:
            raise InvalidError("no step to save: pass checkpoint_id (the step) to dcp.save")
        ckpt = self._need()
        if step in ckpt.steps():
            raise ConflictError(f"step {step} is already committed by rank {ckpt.rank}")
        for item in plan.items:
            if item.type != WriteItemType.BYTE_IO and item.tensor_data is not None:
                dt = torch_dtype_name(item.tensor_data.properties.dtype)
                if dt not in TORCH_TO_STRATA:
                    raise InvalidError(f"{item.index.fqn}: dtype {dt} is not supported")
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        me = self._need().rank
        return [dataclasses.replace(p, storage_data={"coordinator": me}) for p in plans]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        ckpt = self._need()
        t = self._save()
        step = t.step
        if step is None:
            raise InvalidError("no step to save: pass checkpoint_id (the step) to dcp.save")
        try:
            names = EntryNames()
            entries: List[tuple] = []
            keep: List[Any] = []
            places: Dict[str, Place] = {}
            results: List[WriteResult] = []
            for item in plan.items:
                data = planner.resolve_data(item)
                fqn = item.index.fqn
                if item.type == WriteItemType.BYTE_IO:
                    raw = data.getvalue() if hasattr(data, "getvalue") else bytes(data)
                    name = names.name(fqn)
                    entries.append((name, None, None, raw))
                    size = len(raw)
                else:
                    td = item.tensor_data
                    offsets = list(td.chunk.offsets) if td is not None else None
                    name = names.name(fqn, offsets)
                    e, obj = torch_entry(name, data, fqn)
                    entries.append(e)
                    keep.append(obj)
                    size = e[3][1]
                    if td is not None:
                        places[name] = (fqn, [int(x) for x in td.size], [int(x) for x in td.chunk.offsets])
                results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=(ckpt.rank, name)))
            coordinator = (plan.storage_data or {}).get("coordinator", 0) if isinstance(plan.storage_data, dict) else 0
            md = {
                DCP_KEY: DCP_VERSION,
                COORDINATOR_KEY: str(int(coordinator)),
                LAYOUT_KEY: layout_json(places),
            }
            if t.coordinator:
                # The coordinator's shard also holds .metadata, known only
                # at finish: its save waits until then (its data is stable:
                # dcp.save has not returned, async_save saves a staged copy).
                t.deferred = (entries, keep, md)
            else:
                _sync_devices(entries)
                self._pending = SaveHandle(ckpt._native.save(int(step), entries, md))
                del keep
        finally:
            if not t.coordinator:
                self._staging.release_oldest()
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        ckpt = self._need()
        t = self._save()
        step = t.step
        try:
            storage: Dict[Any, Any] = {}
            for rank_results in results:
                for wr in rank_results:
                    storage[wr.index] = wr.storage_data
            metadata.storage_data = storage
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = self.storage_meta()
            blob = dump_metadata(metadata)
            entries, keep, md = t.deferred or ([], [], {DCP_KEY: DCP_VERSION, LAYOUT_KEY: "{}"})
            md = dict(md)
            md[COORDINATOR_KEY] = str(ckpt.rank)
            entries = entries + [(METADATA_ENTRY, None, None, blob)]
            _sync_devices(entries)
            handle = SaveHandle(ckpt._native.save(int(step), entries, md))
            del keep
        finally:
            t.deferred = None
            self._staging.release_oldest()
        # The commit: every rank voted its shard durable on L1.
        handle.wait("l1")

    def _need(self) -> Checkpointer:
        if self._ckpt is None:
            self._ckpt = _checkpointer(self._config, self._settings)
        return self._ckpt

    def __repr__(self) -> str:
        return f"strata.dcp.StorageWriter(step={self._save().step}, settings={self._settings!r})"
