"""``strata.dcp.StorageReader``: DCP's storage reader on Strata's catalog."""

from __future__ import annotations

import io
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.checkpoint import StorageReader as _DcpReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from .._arrays import STRATA_TO_TORCH
from .._catalog import Catalog
from .._errors import InvalidError, NotFoundError, UnavailableError
from ._names import COORDINATOR_KEY, DCP_KEY, LAYOUT_KEY, METADATA_ENTRY, is_step, parse_step
from ._pickle import load_metadata
from ._synth import synthesize

log = logging.getLogger("strata")

# Ranges of one entry closer than this are read as one (fewer requests,
# a little more data).
COALESCE_GAP = 1 << 20


class StorageReader(_DcpReader):
    """Loads a Strata step through ``torch.distributed.checkpoint``::

        import torch.distributed.checkpoint as dcp
        from strata.dcp import StorageReader

        dcp.load(state, storage_reader=StorageReader(job="my-run", l1_dir="/nvme/strata"))

    ``checkpoint_id`` is the step; without one the newest DCP step is
    read. Any world size reads any step: each rank reads only the byte
    ranges its tensors need, from whichever rank wrote them, each chunk
    verified, from the fastest tier holding a good copy (this node's L1,
    the peers, L3). A step the native ``Checkpointer`` saved loads too
    (its tensors, DTensor shards placed by their recorded layout).

    Every rank of the step must be committed: a rank whose commit record
    is not (yet) in any tier is waited for (the records of a step follow
    its vote by milliseconds); after ``roll_forward_after_s`` it is rolled
    forward where a tier holds its manifest (it died after its vote);
    after ``wait_s`` an explicit step is an ``UnavailableError`` naming it,
    and the newest step is passed over for the next older one. Without a
    ``checkpoint_id`` each rank picks the newest step itself: while
    another job is saving steps, pass the step. A damaged chunk is read
    from another tier, or is a ``CorruptError``; nothing is ever filled
    with zeros.
    """

    def __init__(
        self,
        config: Optional[str] = None,
        checkpoint_id: Any = None,
        *,
        wait_s: float = 30.0,
        roll_forward_after_s: float = 10.0,
        threads: int = 8,
        **settings: Any,
    ) -> None:
        super().__init__()
        self._config = config
        self._settings = dict(settings)
        self._step = parse_step(checkpoint_id)
        self._wait_s = float(wait_s)
        self._roll_after_s = min(float(roll_forward_after_s), self._wait_s)
        self._threads = max(1, int(threads))
        self._catalog: Optional[Catalog] = None
        self._storage: Dict[Any, Any] = {}
        self._read_step: Optional[int] = None
        self._entries: Dict[int, Dict[str, Tuple[Optional[str], Optional[List[int]], int]]] = {}
        #: What the last ``read_data`` did: ``bytes_read``, ``reads``,
        #: ``fallbacks``, ``served_by`` ({tier: chunks}).
        self.last_read: Dict[str, Any] = {}

    def __getstate__(self) -> Dict[str, Any]:
        return {
            "config": self._config,
            "settings": self._settings,
            "step": self._step,
            "wait_s": self._wait_s,
            "roll_forward_after_s": self._roll_after_s,
            "threads": self._threads,
        }

    def __setstate__(self, s: Dict[str, Any]) -> None:
        self.__init__(
            s["config"],
            s["step"],
            wait_s=s["wait_s"],
            roll_forward_after_s=s["roll_forward_after_s"],
            threads=s["threads"],
            **s["settings"],
        )

    @property
    def checkpoint_id(self) -> Optional[int]:
        """The step read (after ``read_metadata``: the step found)."""
        return self._read_step if self._read_step is not None else self._step

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return is_step(checkpoint_id)

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id is not None:
            self._step = parse_step(checkpoint_id)
        self._read_step = None
        self._entries = {}

    # -- metadata ---------------------------------------------------------

    def _cat(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog(self._config, **self._settings)
        else:
            self._catalog.refresh()
        return self._catalog

    # No **kwargs: DCP (2.15) would then retry a failed read_metadata as
    # ``read_metadata(rank=...)`` on that rank alone and have it skip the
    # collectives the others run (a hang); a failure here fails every rank.
    def read_metadata(self, *args: Any) -> Metadata:
        cat = self._cat()
        self._entries = {}
        if self._step is not None:
            step, world = self._step, self._complete(cat, self._step, must=True)
        else:
            step, world = self._newest(cat)
        first = min(cat.ranks(step))
        meta = cat.metadata(step, first)
        if DCP_KEY in meta:
            try:
                holder = int(meta.get(COORDINATOR_KEY, "0"))
            except ValueError:
                raise InvalidError(f"step {step}: {COORDINATOR_KEY} is {meta.get(COORDINATOR_KEY)!r}") from None
            if not 0 <= holder < world:
                raise InvalidError(f"step {step}: .metadata is said to be on rank {holder} of {world}")
            # Verified chunk by chunk (BLAKE3) before it is unpickled.
            md = load_metadata(cat.read(step, holder, METADATA_ENTRY))
        else:
            md = synthesize(cat, step, world)
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = uuid.uuid4().hex
        self._read_step = step
        return md

    def _newest(self, cat: Catalog) -> Tuple[int, int]:
        """The newest decided step a DCP reader can load, every rank of it
        committed (or rolled forward); a step with a rank no tier holds is
        passed over for the next older one, as a restore does."""
        passed: List[str] = []
        for step in sorted(cat.decided_steps(), reverse=True):
            ranks = cat.ranks(step)
            if not ranks:
                continue
            meta = cat.metadata(step, min(ranks))
            if not (DCP_KEY in meta or LAYOUT_KEY in meta or "strata.tree" in meta):
                continue
            world = self._complete(cat, step, must=False)
            if world is not None:
                if passed:
                    log.warning("reading step %s: newer steps lack ranks (%s)", step, "; ".join(passed))
                return step, world
            passed.append(f"step {step}: ranks {sorted(set(range(cat.world_size(step) or 0)) - set(cat.ranks(step)))}")
        failed = [f"{n}: {err}" for n, _, err in cat.tiers() if err]
        hint = f" (tiers that could not be listed: {'; '.join(failed)})" if failed else ""
        if failed:
            raise UnavailableError(f"no checkpoint found, and some tiers could not be listed{hint}")
        more = f" (steps lacking ranks in every tier: {'; '.join(passed)})" if passed else ""
        raise NotFoundError(f"no complete checkpoint of job {self._settings.get('job', '?')!r} in any tier{more}")

    def _complete(self, cat: Catalog, step: int, must: bool) -> Optional[int]:
        """Waits until every rank of ``step`` is committed in some tier and
        returns the world size. A rank still missing after
        ``roll_forward_after_s`` (its record trails the vote by
        milliseconds: it died after voting) is rolled forward where a tier
        holds its manifest. Still missing after ``wait_s``: an error
        (``must``) or None."""
        start = time.monotonic()
        rolled: Dict[int, List[Any]] = {}
        while True:
            world = cat.world_size(step)
            ranks = set(cat.ranks(step))
            if world is not None and ranks >= set(range(world)):
                return world
            waited = time.monotonic() - start
            if world is not None and not rolled and waited >= self._roll_after_s:
                # The step is decided (a record names its world size). Not
                # sooner: a live commit writing its record meanwhile would
                # find the reader's in its place.
                for r in sorted(set(range(world)) - ranks):
                    rolled[r] = cat.roll_forward(step, r)
                if any(err is None for got in rolled.values() for _, err in got):
                    log.warning("step %s: rolled forward %s", step, {r: g for r, g in rolled.items() if g})
                    cat.refresh()
                    continue
            if waited >= self._wait_s:
                break
            time.sleep(0.05)
            cat.refresh()
        if not must:
            return None
        if world is None:
            if step in cat.steps() or step in cat.decided_steps():
                raise InvalidError(f"step {step} has no commit record naming its world size")
            failed = [n for n, _, err in cat.tiers() if err]
            if failed:
                raise UnavailableError(f"step {step} is in no readable tier; could not list {', '.join(failed)}")
            raise NotFoundError(f"step {step} is not committed in any tier")
        missing = sorted(set(range(world)) - ranks)
        why = "; ".join(f"rank {r} in {t}: {e}" for r, got in rolled.items() for t, e in got if e)
        raise UnavailableError(
            f"step {step}: ranks {missing} of {world} are committed in no tier after {self._wait_s:.0f} s "
            "and no tier this reader opens holds their shard to roll forward (a rank that died after "
            "the vote keeps it on its node's L1: `strata verify --repair` there rolls it forward)"
            + (f"; roll-forward failed: {why}" if why else "")
        )

    # -- the read ---------------------------------------------------------

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise InvalidError("the checkpoint's metadata has no storage data")
        self._storage = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def _entry(self, cat: Catalog, step: int, rank: int, name: str) -> Tuple[Optional[str], Optional[List[int]], int]:
        by_name = self._entries.get(rank)
        if by_name is None:
            by_name = {n: (d, s, ln) for n, d, s, ln in cat.entries(step, rank)}
            self._entries[rank] = by_name
        e = by_name.get(name)
        if e is None:
            raise NotFoundError(f"step {step} rank {rank} holds no entry {name!r}")
        return e

    def _where(self, req: ReadItem) -> Tuple[int, str]:
        loc = self._storage.get(req.storage_index)
        if not (isinstance(loc, tuple) and len(loc) == 2 and isinstance(loc[0], int) and isinstance(loc[1], str)):
            raise InvalidError(f"{req.storage_index.fqn}: the checkpoint's metadata does not place it ({loc!r})")
        return loc

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        cat = self._catalog
        step = self._read_step
        if cat is None or step is None:
            raise InvalidError("read_data before read_metadata")
        ranges: List[_Range] = []
        by_entry: Dict[Tuple[int, str], List[Tuple[int, int, ReadItem]]] = {}
        for req in plan.items:
            rank, name = self._where(req)
            dtype, shape, length = self._entry(cat, step, rank, name)
            if req.type == LoadItemType.BYTE_IO:
                by_entry.setdefault((rank, name), []).append((0, length, req))
                continue
            if dtype is None or shape is None:
                raise InvalidError(f"{req.storage_index.fqn}: step {step} rank {rank} holds {name!r} as bytes")
            lo, hi = _span(shape, _itemsize(dtype), req.storage_offsets, req.lengths)
            by_entry.setdefault((rank, name), []).append((lo, hi, req))
        for (rank, name), items in by_entry.items():
            items.sort(key=lambda x: x[0])
            cur: Optional[_Range] = None
            for lo, hi, req in items:
                if cur is not None and lo <= cur.hi + COALESCE_GAP:
                    cur.hi = max(cur.hi, hi)
                    cur.reqs.append((lo, req))
                else:
                    cur = _Range(rank, name, lo, hi, [(lo, req)])
                    ranges.append(cur)
        stats = {"bytes_read": 0, "reads": 0, "fallbacks": 0, "served_by": {}}

        def fetch(r: _Range) -> Tuple[_Range, Any, Dict[str, Any]]:
            n = r.hi - r.lo
            if r.direct is not None:
                buf = r.direct
            else:
                buf = torch.empty(n, dtype=torch.uint8)
            st = cat._native.read_into(step, r.rank, r.name, r.lo, buf.data_ptr() if n else 0, n)
            return r, buf, st

        # A range read straight into its destination: one tensor item
        # wanting the whole stored chunk, into contiguous CPU memory of the
        # same dtype.
        direct_at = set()
        for r in ranges:
            if len(r.reqs) == 1 and r.reqs[0][1].type != LoadItemType.BYTE_IO:
                req = r.reqs[0][1]
                dtype, shape, length = self._entry(cat, step, r.rank, r.name)
                target = planner.resolve_tensor(req).detach()
                r.target = target
                if (
                    r.lo == 0
                    and r.hi == length
                    and target.device.type == "cpu"
                    and target.is_contiguous()
                    and STRATA_TO_TORCH.get(dtype) == str(target.dtype).replace("torch.", "")
                    and target.numel() * target.element_size() == length
                    and (length == 0 or target.data_ptr() not in direct_at)
                ):
                    # (Tied weights: two targets over one memory are filled
                    # by copy, never by two reads into the same bytes.)
                    direct_at.add(target.data_ptr())
                    r.direct = target.view(-1).view(torch.uint8) if length else target

        with ThreadPoolExecutor(max_workers=min(self._threads, max(1, len(ranges)))) as pool:
            for r, buf, st in pool.map(fetch, ranges):
                stats["bytes_read"] += r.hi - r.lo
                stats["reads"] += 1
                stats["fallbacks"] += int(st.get("fallbacks", 0))
                for tier, n in st.get("served_by", []):
                    stats["served_by"][tier] = stats["served_by"].get(tier, 0) + n
                self._deliver(cat, step, r, buf, planner)
        self.last_read = stats
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _deliver(self, cat: Catalog, step: int, r: "_Range", buf: Any, planner: LoadPlanner) -> None:
        for lo, req in r.reqs:
            if req.type == LoadItemType.BYTE_IO:
                # A bytes item is its entry, whole: its range is that entry.
                data = buf.numpy().tobytes() if r.hi > r.lo else b""
                planner.load_bytes(req, io.BytesIO(data))
                continue
            target = r.target if r.target is not None else planner.resolve_tensor(req).detach()
            if r.direct is None:
                dtype, shape, _ = self._entry(cat, step, r.rank, r.name)
                region = _region(buf, lo - r.lo, dtype, shape, req.storage_offsets, req.lengths)
                if tuple(target.shape) != tuple(region.shape):
                    raise InvalidError(
                        f"{req.dest_index.fqn}: {tuple(region.shape)} stored for a target of {tuple(target.shape)}"
                    )
                with torch.no_grad():
                    target.copy_(region)
            planner.commit_tensor(req, target)


class _Range:
    """One read: bytes ``lo..hi`` of an entry, serving ``reqs``."""

    __slots__ = ("rank", "name", "lo", "hi", "reqs", "direct", "target")

    def __init__(self, rank: int, name: str, lo: int, hi: int, reqs: List[Tuple[int, ReadItem]]) -> None:
        self.rank = rank
        self.name = name
        self.lo = lo
        self.hi = hi
        self.reqs = reqs
        self.direct: Any = None
        self.target: Any = None


def _itemsize(dtype: str) -> int:
    """Bytes per element of a stored dtype (torch's own itemsize)."""
    tn = STRATA_TO_TORCH.get(dtype)
    td = getattr(torch, tn, None) if tn else None
    if td is None:
        raise InvalidError(f"stored dtype {dtype} has no torch dtype in this torch")
    return int(td.itemsize)


def _strides(shape: List[int]) -> List[int]:
    out = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        out[i] = out[i + 1] * int(shape[i + 1])
    return out


def _span(shape: List[int], size: int, offsets: Any, lengths: Any) -> Tuple[int, int]:
    """The bytes of a row-major tensor of ``shape`` that hold the box at
    ``offsets`` of ``lengths``: first to last element."""
    if len(offsets) != len(shape) or len(lengths) != len(shape):
        raise InvalidError(f"a read of rank {len(offsets)} from a stored tensor of rank {len(shape)}")
    for o, n, d in zip(offsets, lengths, shape):
        if o < 0 or n < 0 or o + n > d:
            raise InvalidError(f"a read of {list(lengths)} at {list(offsets)} outside a stored {list(shape)}")
    if any(int(n) == 0 for n in lengths):
        return 0, 0
    st = _strides(shape)
    first = sum(int(o) * s for o, s in zip(offsets, st))
    last = sum((int(o) + int(n) - 1) * s for o, n, s in zip(offsets, lengths, st))
    return first * size, (last + 1) * size


def _region(buf: Any, at: int, dtype: str, shape: List[int], offsets: Any, lengths: Any) -> Any:
    td = getattr(torch, STRATA_TO_TORCH[dtype])
    if any(int(n) == 0 for n in lengths):
        return torch.empty([int(n) for n in lengths], dtype=td)
    lo, hi = _span(shape, _itemsize(dtype), offsets, lengths)
    flat = buf[at : at + (hi - lo)].view(td)
    return flat.as_strided([int(n) for n in lengths], _strides(shape))
