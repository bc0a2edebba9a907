"""``strata.Checkpointer``: save and load nested state dicts."""

from __future__ import annotations

import atexit
import json
import logging
import time
import weakref
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from . import _strata
from ._arrays import (
    address,
    alloc_numpy,
    alloc_torch,
    fillable,
    numpy_entry,
    torch_entry,
)
from ._dist import open_rounds, torch_world
from ._errors import InvalidError, NotFoundError, StrataError
from ._layout import LAYOUT_KEY, layout_json, parse_layout
from ._loading import Loading, copy_into, first_paths, under
from ._tree import TREE_ENTRY, Leaf, dtensor_type, entry_refs, flatten, is_stateful, parse, path_text, unflatten

log = logging.getLogger("strata")

# Open checkpointers, closed at interpreter exit (background work must
# finish before Python goes away).
_OPEN: "weakref.WeakSet[Checkpointer]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for c in list(_OPEN):
        try:
            c.close()
        except Exception:  # noqa: BLE001 - exiting; the error was logged
            log.exception("closing a checkpointer at exit")
    # No thread may take the GIL once the interpreter finalizes: the log
    # delivery thread ends here (later records are handed over by calls).
    _strata.stop_log_delivery()


class SaveHandle:
    """A save in progress. ``wait`` blocks until it reached a tier;
    ``done`` says whether it is durable on L1 (or failed). Dropping the
    handle does not cancel the save, nor hide its failure: one that no
    handle reported is raised by the checkpointer's next ``save``,
    ``flush`` or ``close``."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.stats: Optional[Dict[str, Any]] = None

    @property
    def step(self) -> int:
        """The step."""
        return self._native.step

    @property
    def stall_s(self) -> float:
        """Seconds ``save`` blocked the training loop."""
        return self._native.stall_s

    def done(self) -> bool:
        """True once the step is durable and committed on L1, or failed."""
        return self._native.done()

    def wait(self, target: str = "l1", timeout: Optional[float] = None) -> Dict[str, Any]:
        """Blocks until the step is committed on ``target`` (``"l1"``,
        ``"peers"`` or ``"l3"``) and returns the save's counters; raises
        ``WaitTimeoutError`` after ``timeout`` seconds (the save goes on),
        or the save's error (then reported: the checkpointer does not raise
        it again)."""
        self.stats = self._native.wait(target, timeout)
        return self.stats

    def __repr__(self) -> str:
        return f"SaveHandle(step={self.step}, done={self.done()})"


class Checkpointer:
    """Saves and restores a training job's state through Strata's tiers.

    Configuration: ``config`` (a TOML file), then the environment (the
    launcher's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ... and
    ``STRATA_*``), then the keyword arguments, each winning over the one
    before; the keys are those of the Rust ``Config`` (``job``, ``l1_dir``,
    ``keep_last``, ``peers``, ``l3_url``, ``upload_every``, ...).

    Ranks: with torch.distributed initialised, rank and world size come
    from it and ranks agree through its store; otherwise a world of one, or
    etcd when ``etcd_endpoints`` is configured. Use as a context manager, or
    call ``close``.

    Background failures: a save that fails after ``save`` returned (its L1
    write, its commit round) and that no handle reported is raised, once,
    by the next ``save`` (which then saves nothing: call it again),
    ``flush`` or ``close``, as the class of its kind (``on_background_error
    = "log"``: only logged and counted). ``failed_saves``,
    ``skipped_saves``, ``dropped_uploads``, ``dropped_pushes`` and
    ``last_error`` say what went wrong so far.
    """

    def __init__(self, config: Optional[str] = None, **settings: Any) -> None:
        gather = None
        world = torch_world()
        if world is not None:
            rank, size, store = world
            for k, v in (("rank", rank), ("world_size", size)):
                if k in settings and settings[k] != v:
                    raise InvalidError(f"{k}={settings[k]} but torch.distributed says {v}")
                settings[k] = v
            # The whole configuration decides (file, environment, keywords):
            # with etcd configured, ranks agree through etcd instead.
            resolved = json.loads(_strata.resolve_config(json.dumps(settings), config))
            if size > 1 and not resolved.get("etcd_endpoints"):
                # A restarted job (torchrun's restart count, Slurm's requeue
                # count) never meets its previous start's rounds in a store
                # that outlived it; the n-th checkpointer a rank opens meets
                # the n-th of every other rank (each opens them in program
                # order), never an earlier one's rounds.
                # A second process claiming this rank (a broken launcher) is
                # a ConflictError here, and fails the holder's next round.
                start = resolved.get("incarnation") or "0"
                job = str(resolved["job"])
                # The node's ranks meet on the node first where the launcher
                # says where this rank sits (torchrun, Slurm), as with etcd.
                local = None
                lr, lw = resolved.get("local_rank"), resolved.get("local_world_size")
                if resolved.get("etcd_node_rounds", True) and lr is not None and lw is not None:
                    local = (int(lr), int(lw))
                gather = open_rounds(store, rank, size, f"strata/{job}/{start}", job, local)
        self._rounds = gather
        # Also picks up the `strata` logger's level before anything logs.
        _strata.drain_logs()
        try:
            self._native = _strata.Checkpointer(json.dumps(settings), config, gather)
        finally:
            _strata.drain_logs()
        self.config: Dict[str, Any] = json.loads(self._native.config_json)
        #: The counters of the last ``load`` or ``load_into``: bytes read,
        #: and how many came from peers (``bytes_from_l2``) and from L3.
        self.last_restore: Optional[Dict[str, Any]] = None
        #: The steps the last ``load(..., discard_newer=True)`` deleted.
        self.discarded: List[int] = []
        _OPEN.add(self)

    # -- properties -------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once ``close`` was called."""
        return getattr(self, "_closed", False)

    @property
    def rank(self) -> int:
        return int(self.config["rank"])

    @property
    def world_size(self) -> int:
        return int(self.config["world_size"])

    @property
    def job(self) -> str:
        return str(self.config["job"])

    @property
    def health(self) -> Dict[str, Any]:
        """What went wrong in the background so far: ``failed_saves``,
        ``skipped_saves``, ``dropped_uploads``, ``dropped_pushes`` (counts
        since the checkpointer opened) and ``last_error`` (the newest
        background save failure as an exception, or None). Readable after
        ``close``."""
        return self._native.health()

    @property
    def metrics_address(self) -> Optional[str]:
        """Where this process's Prometheus metrics are served
        (``"host:port"``; ``metrics_listen="0.0.0.0:0"`` picks the port),
        or None when ``metrics_listen`` is not set."""
        return self._native.metrics_address

    def metrics(self) -> str:
        """This process's metrics in Prometheus' text format, served or
        not: saves, their stall and time to durable, bytes written and
        deduplicated, restores and the bytes each tier served, errors by
        kind, uploads and replicas waiting, failed or dropped; labelled
        with the job, rank and node."""
        return self._native.metrics_text()

    @property
    def failed_saves(self) -> int:
        """Saves that failed after ``save`` returned (not committed)."""
        return int(self.health["failed_saves"])

    @property
    def skipped_saves(self) -> int:
        """Saves skipped by ``busy_policy="skip"``."""
        return int(self.health["skipped_saves"])

    @property
    def dropped_uploads(self) -> int:
        """Uploads to L3 dropped from a backlog past
        ``max_pending_uploads``."""
        return int(self.health["dropped_uploads"])

    @property
    def dropped_pushes(self) -> int:
        """Pushes to the peers dropped from a backlog past
        ``max_pending_pushes``."""
        return int(self.health["dropped_pushes"])

    @property
    def last_error(self) -> Optional[StrataError]:
        """The newest save that failed in the background, as the exception
        it was (or is) raised as; None if none did. Kept after it was
        raised."""
        return self.health["last_error"]

    # -- save -------------------------------------------------------------

    def _entries(self, state: Any, keep: List[Any], layouts: Optional[Dict[str, Any]] = None) -> List[tuple]:
        tree, leaves = flatten(state, layouts)
        entries = [self._entry(leaf, keep) for leaf in leaves]
        entries.append((TREE_ENTRY, None, None, tree))
        _sync_devices(entries)
        return entries

    def prepare(self, state: Any) -> None:
        """Allocates and pre-faults the staging memory a save of ``state``
        needs, so the first save blocks training only for its copy (without
        it, the first save also pays for fresh memory). Call it once before
        training starts; optional."""
        keep: List[Any] = []
        self._native.prepare(self._entries(state, keep))
        del keep

    def save(self, step: int, state: Any, *, metadata: Optional[Dict[str, str]] = None) -> SaveHandle:
        """Snapshots ``state`` (a nested dict of tensors, numpy arrays and
        plain values; a DTensor is stored as its local shard with its place
        in the global tensor; an object with ``state_dict`` and
        ``load_state_dict``, such as a module or an optimizer, as its
        ``state_dict()``) as ``step`` and returns at once; the step becomes
        durable in the background (``SaveHandle.wait``). The state's tensors
        may be changed as soon as this returns. Raises ``ConflictError`` if
        this rank already committed ``step``; raises an earlier save's
        background failure that no handle reported (then nothing is saved:
        call it again). A priority load's rest in flight (``Loading``) is
        waited for and filled in first; if it failed, the save raises
        ``InvalidError`` (the state is half loaded) and saves nothing."""
        self._settle_loading()
        keep: List[Any] = []
        layouts: Dict[str, Any] = {}
        entries = self._entries(state, keep, layouts)
        md = {"strata.tree": "1"}
        if layouts:
            md[LAYOUT_KEY] = layout_json(layouts)
        if metadata:
            md.update({str(k): str(v) for k, v in metadata.items()})
        try:
            return SaveHandle(self._native.save(int(step), entries, md))
        finally:
            del keep

    @staticmethod
    def _entry(leaf: Leaf, keep: List[Any]) -> tuple:
        where = path_text(leaf.path)
        if leaf.kind == "bytes":
            return (leaf.name, None, None, leaf.value)
        if leaf.kind == "torch":
            e, obj = torch_entry(leaf.name, leaf.value, where)
        else:
            e, obj = numpy_entry(leaf.name, leaf.value, where)
        keep.append(obj)
        return e

    # -- load -------------------------------------------------------------

    def _plan(self, step: Optional[int]) -> Tuple[Any, Dict[str, tuple], Any]:
        """Agrees with every rank on the step (the only collective of a
        load); returns the plan, its entries by name and its tree (None for
        a step saved without one, e.g. from Rust)."""
        plan = self._native.plan(None if step is None else int(step))
        by_name = {e[0]: e for e in plan.entries}
        root = None
        if plan.metadata.get("strata.tree") == "1" and TREE_ENTRY in by_name:
            buf = bytearray(by_name[TREE_ENTRY][3])
            self._native.read(plan, [(TREE_ENTRY, *address(buf))])
            root = parse(bytes(buf))
        return plan, by_name, root

    def load(self, step: Optional[int] = None, *, device: Any = None, discard_newer: bool = False) -> Dict[str, Any]:
        """Restores ``step`` (default: the newest step every rank can
        restore) and returns the state as it was saved: torch tensors with
        their dtype and shape (on ``device`` if given, else on the CPU),
        numpy arrays, and the plain values. Every byte is verified. All
        ranks call it together. Raises ``NotFoundError`` if there is
        nothing to restore. With ``discard_newer`` (a rollback, after a loss
        spike), every step newer than the one loaded is then deleted from
        every tier (see ``delete``), so the latest step and retention follow
        the branch trained from here."""
        self._settle_loading("drop")
        plan, by_name, root = self._plan(step)
        st = plan.step
        if root is None:
            # A step saved without a tree (from Rust): a flat dict.
            root = {"d": [[n, {"B" if e[1] is None else "T": n}] for n, e in by_name.items()]}
        refs = entry_refs(root)
        values: Dict[str, Any] = {}
        dests: List[tuple] = []
        try:
            for name, tag in refs.items():
                obj = _alloc(st, by_name, name, tag)
                values[name] = obj
                dests.append((name, *address(obj)))
            self.last_restore = self._native.read(plan, dests)
        except BaseException:
            self._decline_discard(st, discard_newer)
            raise
        if device is not None:
            for name, tag in refs.items():
                if tag == "T":
                    values[name] = values[name].to(device)

        def entry(tag: str, name: str, path: Tuple[Any, ...]) -> Any:
            v = values[name]
            return bytes(v) if tag == "B" else v

        out = unflatten(root, entry)
        if discard_newer:
            self.discarded = self._native.discard_newer(st)
        return out

    def _decline_discard(self, step: int, discard_newer: bool) -> None:
        """This rank's load failed after the ranks agreed on ``step``: with
        ``discard_newer``, it still takes part in the deletion's rounds,
        voting no, so that no rank deletes anything or waits for it."""
        if discard_newer:
            try:
                self._native.discard_newer(step, False)
            except StrataError:
                pass

    def load_into(
        self,
        state: Any,
        step: Optional[int] = None,
        *,
        strict: bool = True,
        discard_newer: bool = False,
        first: Any = None,
    ) -> Any:
        """Restores ``step`` (default: the newest step every rank can
        restore) into ``state`` in place: every tensor and numpy array in
        ``state`` is filled with the stored bytes (the model's and the
        optimizer's own memory), and the plain values in its dicts and
        lists are replaced by the stored ones. With ``strict``, a tensor in
        ``state`` that the step does not hold with the same dtype and shape
        is an ``InvalidError``. All or nothing: the bytes are read into
        staging memory first, and ``state`` changes only once every byte
        was read and verified (a ``CorruptError`` or ``UnavailableError``
        leaves it as it was); the cost is one copy of the state in memory
        during the load. Returns the step. All ranks call it together.
        ``discard_newer``: as for ``load``.

        Priority load: with ``first`` (a path of the state such as
        ``"model"``, or a list of them), the tensors under those paths are
        read, verified and filled first, and ``load_into`` returns a
        ``Loading`` handle as soon as they are in place (training can start
        its forward passes); the rest is read behind them on a thread of
        its own, and ``Loading.wait()`` fills it in (tensors, plain values,
        ``load_state_dict`` of stateful objects) and returns the step.
        ``Loading.first_seconds`` and ``seconds`` are the times to the
        first part and to everything. A path that covers no tensor is an
        ``InvalidError``; ``discard_newer`` cannot be combined with it
        (call ``delete`` after ``wait``)."""
        started = time.perf_counter()
        prefixes = None if first is None else first_paths(first)
        if prefixes is not None and discard_newer:
            raise InvalidError("discard_newer with first: wait() for the load, then delete() the newer steps")
        self._settle_loading("drop")
        plan, by_name, root = self._plan(step)
        try:
            out = self._fill(state, plan, by_name, root, strict, prefixes, started)
        except BaseException:
            self._decline_discard(plan.step, discard_newer)
            raise
        if isinstance(out, Loading):
            self._loading = out
            return out
        if discard_newer:
            self.discarded = self._native.discard_newer(out)
        return out

    def _settle_loading(self, then: str = "raise") -> None:
        """A priority load's rest in flight is read and filled in before
        anything else touches the state. If it failed: ``then="raise"`` (a
        save) raises ``InvalidError`` (the state is half loaded: saving it
        would commit new weights with old optimizer state), ``"log"`` (close)
        logs it, ``"drop"`` (a new load replaces the state) goes on. Either
        way it is forgotten once settled (``Loading.wait`` still raises it);
        an interrupt while waiting keeps it pending."""
        loading = getattr(self, "_loading", None)
        if loading is None:
            return
        try:
            loading.wait()
        except BaseException as e:
            if not loading.finished():
                raise  # interrupted while waiting: still pending
            self._loading = None
            if then == "raise":
                raise InvalidError(
                    f"the rest of the priority load of step {loading.step} failed ({e}); the state is half loaded: "
                    "load it again before saving"
                ) from e
            if then == "log":
                log.error("the rest of the priority load of step %s failed: %s", loading.step, e)
            return
        self._loading = None

    def _fill(
        self,
        state: Any,
        plan: Any,
        by_name: Dict[str, tuple],
        root: Any,
        strict: bool,
        first: Optional[List[str]] = None,
        started: float = 0.0,
    ) -> Any:
        """``load_into``'s work once the ranks agreed on ``plan``: the step,
        or with ``first`` a ``Loading`` for the rest."""
        st = plan.step
        if root is None:
            raise InvalidError(f"step {st} was not saved from Python; use load()")
        # The saved structure, with each entry reference as a marker.
        markers = unflatten(root, lambda tag, name, path: _Ref(tag, name))
        # Every target is read through staging and copied only after the
        # whole read is verified: nothing is written into the caller's
        # memory before then (a read that fails half way changes nothing).
        layouts = parse_layout(plan.metadata.get(LAYOUT_KEY))
        dtensor = dtensor_type()
        statefuls: List[Tuple[Any, Any]] = []  # (object, its state_dict, filled in place)
        stateful_sds: Dict[int, Any] = {}  # id(object) -> its state_dict
        covered: set = set()  # ids of targets filled (a DTensor, besides its local shard)
        copies: Dict[str, Any] = {}  # entry name -> (staging, target)
        aliases: List[Tuple[str, Any]] = []  # (entry name, another target)
        early: set = set()  # entries with a target under the `first` paths
        early_paths: List[Tuple[Any, ...]] = []  # those targets' paths
        early_targets: set = set()  # id() of the targets under `first`
        ops: List[Tuple[Any, Any, Any]] = []  # (container, key, value), applied last
        problems: List[str] = []

        def match(target: Any, saved: Any, path: Tuple[Any, ...]) -> Any:
            if isinstance(saved, _Ref):
                e = by_name.get(saved.name)
                if e is None:
                    problems.append(f"{path_text(path)}: the manifest lacks entry {saved.name!r}")
                    return target
                _, dtype, shape, _ = e
                if saved.tag == "B" or not _is_array(target):
                    return saved
                arr = target
                if dtensor is not None and isinstance(target, dtensor):
                    why = _same_place(target, layouts.get(saved.name), st)
                    if why is not None:
                        problems.append(f"{path_text(path)}: {why}")
                        return target
                    # Filled through its local shard (the same memory).
                    arr = target.to_local()
                    covered.add(id(target))
                why = fillable(arr, dtype, shape)
                if why is not None:
                    problems.append(f"{path_text(path)}: {why}")
                    return target
                if saved.name in copies:
                    # The same entry again: copied from the staging after the read.
                    aliases.append((saved.name, arr))
                else:
                    copies[saved.name] = (_alloc(st, by_name, saved.name, saved.tag, like=arr), arr)
                if first is not None and under(path, first):
                    early.add(saved.name)
                    early_paths.append(path)
                    early_targets.add(id(arr))
                return target
            if is_stateful(target) and isinstance(saved, dict):
                # Filled through its state_dict(), then given back to it.
                sd = target.state_dict()
                statefuls.append((target, sd))
                stateful_sds[id(target)] = sd
                match(sd, saved, path)
                return target
            if isinstance(target, dict) and isinstance(saved, dict):
                for k, v in saved.items():
                    ops.append((target, k, match(target.get(k), v, path + (k,))))
                return target
            if isinstance(target, list) and isinstance(saved, list) and len(target) == len(saved):
                for i, v in enumerate(saved):
                    ops.append((target, i, match(target[i], v, path + (i,))))
                return target
            if isinstance(target, tuple) and isinstance(saved, tuple) and len(target) == len(saved):
                return type(saved)(match(t, v, path + (i,)) for i, (t, v) in enumerate(zip(target, saved)))
            if strict and _contains_array(target):
                problems.append(f"{path_text(path)}: the state holds tensors here, the step does not")
            return saved

        result = match(state, markers, ())
        if strict:
            _check_covered(state, copies, aliases, problems, covered, stateful_sds)
        if problems:
            raise InvalidError(f"step {st} does not fit the state: " + "; ".join(problems[:10]))
        if first is not None:
            bare = [p for p in first if not any(under(path, [p]) for path in early_paths)]
            if bare:
                raise InvalidError(f"first: no tensor of the state lies under {bare}")
        # Entries the state had no array for (new values) are restored fresh.
        fresh: Dict[str, Any] = {}
        dests: List[tuple] = [(name, *address(stage)) for name, (stage, _) in copies.items() if name not in early]
        for name, tag in entry_refs(root).items():
            if name not in copies:
                fresh[name] = _alloc(st, by_name, name, tag)
                dests.append((name, *address(fresh[name])))

        def pairs_of(head: bool) -> List[Tuple[Any, Any]]:
            # Each target in its phase: under `first` (`head`) or not (an
            # entry read early may also have a target outside `first`,
            # filled with the rest). Targets whose memory overlaps (views
            # of one storage) are filled one after another, in this order.
            pairs = list(copies.values()) + [(copies[n][0], target) for n, target in aliases]
            return [(s, t) for s, t in pairs if (id(t) in early_targets) == head]

        def apply_rest() -> None:
            copy_into(pairs_of(head=False))
            for container, key, value in ops:
                container[key] = _replace_refs(value, fresh)
            _replace_refs(result, fresh)
            for obj, sd in statefuls:
                obj.load_state_dict(_replace_refs(sd, fresh))

        if first is None:
            self.last_restore = self._native.read(plan, dests)
            # Every byte was read and verified: now the state changes.
            apply_rest()
            return st
        # Priority: the tensors under `first`, read, verified and filled
        # in; then the rest behind them.
        head = [(name, *address(copies[name][0])) for name in copies if name in early]
        # A chunk holding entries of both parts (small tensors packed
        # together) is read once, by this first part, which fills the
        # rest's staging with its bytes of it; the rest skips it.
        self.last_restore = self._native.read(plan, head, along=dests)
        copy_into(pairs_of(head=True))
        loading = Loading(st, started, self.last_restore, on_done=lambda stats: setattr(self, "last_restore", stats))
        head_names = [name for name, _, _ in head]

        def read_rest() -> Dict[str, Any]:
            return self._native.read(plan, dests, after=head_names) if dests else {}

        loading._start(read_rest, apply_rest)
        return loading

    # -- inspection -------------------------------------------------------

    def latest_step(self) -> Optional[int]:
        """The newest step every rank can restore, or None. All ranks call
        it together (it is an agreement, like ``load``)."""
        try:
            return self._native.plan(None).step
        except NotFoundError:
            return None

    def steps(self) -> List[int]:
        """The steps this rank has committed on some tier, oldest first."""
        return [d["step"] for d in self._native.steps()]

    def status(self, step: int) -> Dict[str, Any]:
        """Where ``step`` stands for this rank, per tier: ``l1`` and ``l3``
        (committed there), ``peers`` (this process's replication of it) and
        ``upload`` (this process's upload of it)."""
        for d in self._native.steps():
            if d["step"] == step:
                return d
        return {"step": step, "l1": False, "l3": False, "peers": None, "upload": None}

    def delete(self, steps: Union[int, Iterable[int]]) -> List[int]:
        """Deletes ``steps`` from every tier (L1, the peers, L3) as a
        retirement of each rank's shard: a step is never left half-usable,
        and a call that fails part-way (``UnavailableError``) finishes when
        called again. All ranks call it together; waits for this process's
        background copies first. A step pinned in some tier is refused
        (``InvalidError``) before anything is deleted. The freed step
        numbers may be saved again. Returns the steps this rank held."""
        self._settle_loading("drop")
        if isinstance(steps, int):
            steps = [steps]
        return list(self._native.delete([int(s) for s in steps]))

    def upload(self, step: int) -> None:
        """Queues ``step`` for upload to L3 (beyond what ``upload_every``
        picks)."""
        self._native.upload(int(step))

    def flush(self) -> None:
        """Waits for the save in flight and every queued push and upload;
        then raises an earlier save's background failure that no handle
        reported."""
        self._native.flush()

    def close(self) -> None:
        """Finishes what was started and releases the checkpointer; then
        raises an earlier save's background failure that no handle
        reported. Idempotent."""
        _OPEN.discard(self)
        self._closed = True
        try:
            self._settle_loading("log")
            self._native.close()
        finally:
            close = getattr(getattr(self, "_rounds", None), "close", None)
            if close is not None:
                close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is None:
            self.close()
            return
        # The block's own exception goes on; a background failure is
        # logged instead of replacing it.
        try:
            self.close()
        except StrataError as e:
            log.error("closing the checkpointer after %s: %s", kind.__name__, e)

    def __repr__(self) -> str:
        c = getattr(self, "config", None)
        if c is None:
            return "Checkpointer(<not open>)"
        return f"Checkpointer(job={self.job!r}, rank={self.rank}, world_size={self.world_size})"


def _alloc(step: int, by_name: Dict[str, tuple], name: str, tag: str, like: Any = None) -> Any:
    """Memory for entry ``name`` of the kind its tree reference says."""
    e = by_name.get(name)
    if e is None:
        raise InvalidError(f"step {step}: the state tree names an entry {name!r} the manifest lacks")
    _, dtype, shape, length = e
    if tag == "B":
        if dtype is not None:
            raise InvalidError(f"step {step}: entry {name!r} is a tensor where the tree expects bytes")
        return bytearray(length)
    if dtype is None:
        raise InvalidError(f"step {step}: entry {name!r} is a blob where the tree expects an array")
    torch_kind = hasattr(like, "data_ptr") if like is not None else tag == "T"
    return alloc_torch(dtype, shape, name) if torch_kind else alloc_numpy(dtype, shape, name)


def _sync_devices(entries: List[tuple]) -> None:
    """Waits for the work queued on each CUDA device whose tensors are
    saved: Strata copies them on its own stream, which must see what the
    trainer's kernels (an optimizer step) have written."""
    devices = {e[3][2] for e in entries if isinstance(e[3], tuple) and e[3][2] is not None}
    if devices:
        import torch

        for d in devices:
            torch.cuda.current_stream(d).synchronize()


def _same_place(target: Any, place: Any, step: int) -> Optional[str]:
    """Why DTensor ``target`` cannot take the stored shard in place (None
    if it can): the stored shard must be the same piece of the same global
    tensor."""
    chunks = target.__create_chunk_list__()
    offsets = [int(x) for x in chunks[0].offsets] if chunks else [0] * target.dim()
    shape = [int(x) for x in target.shape]
    if place is None:
        return f"a DTensor where step {step} holds a plain tensor (load it with strata.dcp.StorageReader)"
    _, gshape, goffsets = place
    if list(gshape) != shape or list(goffsets) != offsets:
        return (
            f"this rank's shard is at {offsets} of {shape}, step {step} holds the one at {list(goffsets)} "
            f"of {list(gshape)} here: it was saved by another world size or placement "
            "(strata.dcp.StorageReader reshards it)"
        )
    return None


class _Ref:
    __slots__ = ("tag", "name")

    def __init__(self, tag: str, name: str) -> None:
        self.tag = tag
        self.name = name


def _is_array(v: Any) -> bool:
    import sys

    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    return (torch is not None and isinstance(v, torch.Tensor)) or (np is not None and isinstance(v, np.ndarray))


def _contains_array(v: Any) -> bool:
    if _is_array(v):
        return True
    if isinstance(v, dict):
        return any(_contains_array(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(_contains_array(x) for x in v)
    return False


def _check_covered(
    state: Any,
    copies: Dict[str, Any],
    aliases: List[Tuple[str, Any]],
    problems: List[str],
    also: set,
    stateful_sds: Dict[int, Any],
) -> None:
    covered = {id(t) for _, t in copies.values()}
    covered |= {id(t) for _, t in aliases}
    covered |= also

    def walk(v: Any, path: Tuple[Any, ...]) -> None:
        if id(v) in stateful_sds:
            walk(stateful_sds[id(v)], path)
        elif _is_array(v):
            if id(v) not in covered:
                problems.append(f"{path_text(path)}: the step holds no tensor here")
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, path + (k,))
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(x, path + (i,))

    walk(state, ())


def _replace_refs(v: Any, fresh: Dict[str, Any]) -> Any:
    """Replaces the remaining entry markers in the merged state."""
    if isinstance(v, _Ref):
        obj = fresh[v.name]
        return bytes(obj) if v.tag == "B" else obj
    if isinstance(v, dict):
        for k in list(v.keys()):
            v[k] = _replace_refs(v[k], fresh)
        return v
    if isinstance(v, list):
        for i in range(len(v)):
            v[i] = _replace_refs(v[i], fresh)
        return v
    if isinstance(v, tuple):
        return type(v)(_replace_refs(x, fresh) for x in v)
    return v
