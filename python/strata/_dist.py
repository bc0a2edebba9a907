"""Ranks agreeing through torch.distributed: the coordinator callable the
native module calls for each round (a commit barrier, a restore agreement).

Strata's rounds are keyed and run both on the training thread (``load``)
and on the background commit worker, in an order that differs between
ranks. Collectives on a process group must be issued in the same order on
every rank, so the rounds go through the process group's key-value store
(the TCPStore torchrun or ``init_process_group`` already runs) instead: a
round is addressed by its key, never touches the trainer's NCCL stream,
and never waits behind (or blocks) a barrier on the main thread.

The commit barrier and the restore rounds are reducing rounds
(``StoreGather.reduce``): the last rank to arrive reads every value and
runs the (deterministic) reduction once; every other rank reads only the
small decision, so a round moves O(world) bytes in total, not O(world)
to every rank.

A round (see ``StoreGather``) is one *attempt* at a key: each rank counts
its own attempts of a key, so the n-th attempts of every rank meet and a
retry never reads an earlier attempt's values. An attempt ends exactly
one way for everyone, decided by one compare-and-set on its state key:
``done`` (set by the last rank to arrive, after it published every value)
or ``abort`` (set by a rank that gave up, or that found its rank claimed by
another process). A rank that times out is therefore never counted: its
abort either wins, and nobody completes the attempt, or loses to ``done``,
and it completes it too. Each round costs O(world) store operations.

Where the launcher says where a rank sits on its node, a node's ranks
meet on a store of the node's own first, and one of them takes part in
the job's store for all of them (``NodeRounds``): a round costs the job's
store O(nodes) requests, not O(world).

Every thread gets a store client of its own (``Store.clone()``): a
TCPStore client serves one request at a time, and a round's ``wait`` on the
commit worker would otherwise hold up a restore's round on the main thread.

A process claims its rank when it opens its rounds (``open_rounds``): a
second process claiming the same rank of the same job and start gets a
``ConflictError``, and the first one's next round fails with one too, as
with the etcd coordinator.
"""

from __future__ import annotations

import atexit
import os
import socket
import struct
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._errors import ConflictError, UnavailableError

_DONE = b"done"
_ABORT = b"abort"
# A node's attempt whose last rank runs the round among the nodes: its
# state holds this and that rank's deadline (wall clock, one host).
_RUNNING = "running:"
# How long the ranks of a node wait past that deadline (it hands the
# outcome out), and at most past now whatever it wrote.
_BUSY_GRACE_S = 5.0
_MAX_BUSY_S = 7 * 24 * 3600.0
# Keys whose attempts a rank remembers (the newest; a commit key is used
# by one step, so an old one is never retried).
_REMEMBERED = 65536


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


_TOKEN: Dict[int, str] = {}


def _process_token() -> str:
    """Who this process is, for a rank claim: host, pid and a random part
    (a pid alone repeats across containers); new after a fork."""
    pid = os.getpid()
    if pid not in _TOKEN:
        _TOKEN[pid] = f"{socket.gethostname()} pid {pid} ({uuid.uuid4().hex[:12]})"
    return _TOKEN[pid]


class RoundFailed(UnavailableError):
    """A round's attempt ended without a result (timed out, or a rank gave
    up on it) on every rank alike, or its store stopped answering (the
    process serving it ended); the message says why. Retry: the next
    attempt has keys of its own."""


def _store_failures() -> Tuple[type, ...]:
    """torch's errors of a store that failed a request (its server gone,
    the connection lost, a request timed out): a round's, not the
    caller's, so they become ``RoundFailed``. Empty without torch."""
    import sys

    dist = getattr(sys.modules.get("torch"), "distributed", None)
    failed = getattr(dist, "DistError", None)
    return (failed,) if isinstance(failed, type) else ()


def _unreachable(key: str, where: str, e: BaseException) -> RoundFailed:
    return RoundFailed(f"round {key} failed: {where} stopped answering "
                       f"({type(e).__name__}: {e})")


class StoreGather:
    """``gather(rank, key, value, timeout_s) -> list[bytes]`` over a
    torch.distributed ``Store`` (see the module documentation)."""

    #: Tells the native module that ``reduce`` is this protocol's.
    _strata_reduces = True

    #: Whether the last rank to arrive marks the attempt busy while its
    #: combine runs (a node's rounds, whose combine is a round among nodes).
    marks_busy = False
    #: Called with (key, attempt) when an attempt ends without a result on
    #: this rank (a node's rounds: the attempt among the nodes ends too).
    on_abort: Optional[Callable[[str, int], None]] = None
    #: Whether a "rank" is a node (the rounds among nodes): for messages.
    per_node = False

    def __init__(self, store: Any, world: int, prefix: str, claim: Optional[str] = None,
                 job: str = "?") -> None:
        self._base = store
        self.world = world
        self.prefix = prefix
        self.job = job
        # The key holding this rank's claim ("<key>/contested" is set by a
        # second claimant), or None when nothing was claimed.
        self.claim = claim
        self._local = threading.local()
        self._lock = threading.Lock()
        self._attempts: "OrderedDict[str, int]" = OrderedDict()

    def _clients(self) -> Any:
        """This thread's client of the store: (unprefixed, under the
        rounds' prefix)."""
        c = getattr(self._local, "clients", None)
        if c is None:
            import torch.distributed as dist

            raw = self._base
            try:
                raw = raw.clone()
            except (AttributeError, NotImplementedError, RuntimeError):
                # A store without clients of its own (not a TCPStore):
                # rounds on two threads share it.
                pass
            c = (raw, dist.PrefixStore(self.prefix, raw))
            self._local.clients = c
        return c

    def _attempt(self, key: str) -> int:
        with self._lock:
            n = self._attempts.pop(key, 0) + 1
            self._attempts[key] = n
            while len(self._attempts) > _REMEMBERED:
                self._attempts.popitem(last=False)
            return n

    def __call__(self, rank: int, key: str, value: bytes, timeout_s: float) -> List[bytes]:
        """An all-gather: every rank gets every rank's value (O(world)
        bytes each)."""
        out = self._round(rank, key, value, timeout_s, _pack)
        return _unpack(out, self.world)

    def reduce(self, rank: int, key: str, value: bytes, timeout_s: float,
               reducer: Callable[[List[bytes]], bytes]) -> bytes:
        """A reducing round: the last rank to arrive reads every value and
        runs ``reducer`` on them (by rank) once; every rank reads only its
        result. O(world) bytes in total, where an all-gather moves
        O(world) to every rank. ``reducer`` must be deterministic and the
        same on every rank (any rank may be the one that runs it)."""
        return self._round(rank, key, value, timeout_s, reducer)

    def _round(self, rank: int, key: str, value: bytes, timeout_s: float,
               combine: Callable[[List[bytes]], bytes]) -> bytes:
        try:
            return self._round_at(rank, key, self._attempt(key), value, timeout_s, combine)
        except _store_failures() as e:
            raise _unreachable(key, "the job's store", e) from e

    def _round_at(self, rank: int, key: str, n: int, value: bytes, timeout_s: float,
                  combine: Callable[[List[bytes]], bytes]) -> bytes:
        """Attempt ``n`` of round ``key`` (see the module documentation)."""
        raw, s = self._clients()
        deadline = time.monotonic() + max(timeout_s, 0.001)
        k = f"{key}/{n}"
        state, mine = f"{k}/state", f"{k}/v/{rank}"
        if self.claim is not None and raw.check([f"{self.claim}/contested"]):
            # Another process claimed this rank: neither may complete a round.
            self._decide(s, state, _ABORT)
            other = bytes(raw.get(f"{self.claim}/contested")).decode(errors="replace")
            if self.per_node:
                e = ConflictError(f"a rank of job {self.job} is claimed twice: {other} "
                                  f"claimed it after its holder")
                e.other = f"{other} claimed it after its holder"
            else:
                e = ConflictError(f"rank {rank} of job {self.job} is claimed twice: {other} claimed it "
                                  f"after this process ({_process_token()})")
                e.other = f"{other} claimed it after this process ({_process_token()})"
            raise e
        s.set(mine, value)
        arrived = s.add(f"{k}/arrived", 1)
        if arrived == self.world:
            try:
                self._publish(s, k, state, deadline, combine)
            except BaseException:
                # The reduction raised (the attempt is aborted): this
                # rank's value goes, as a rank's that gives up does.
                s.delete_key(mine)
                self._settle(s, k)
                raise
        outcome = self._wait(s, k, state, deadline)
        if outcome != _DONE:
            # Given up: this attempt's value goes (the state stays, so a
            # rank arriving later learns at once that it failed).
            s.delete_key(mine)
            if self.on_abort is not None:
                self.on_abort(key, n)
            failed: BaseException
            if self.marks_busy and s.check([f"{k}/conflict"]):
                failed = ConflictError(bytes(s.get(f"{k}/conflict")).decode(errors="replace"))
            else:
                why = "a rank gave up on it" if outcome == _ABORT else f"state {outcome!r}"
                if outcome == b"":
                    why = f"only some of {self.world} ranks reported within {timeout_s:g} s"
                failed = RoundFailed(f"round {key} (attempt {n}) failed: {why}")
            self._settle(s, k)
            raise failed
        out = bytes(s.get(f"{k}/all"))
        # The decision is final: this rank's value is no longer needed, and
        # the last rank to read the result removes the round's keys, its
        # state last (``NodeRounds.drain`` waits for that).
        s.delete_key(mine)
        if s.add(f"{k}/read", 1) == self.world:
            for suffix in ("all", "arrived", "read", "state"):
                s.delete_key(f"{k}/{suffix}")
        return out

    def _settle(self, s: Any, k: str) -> None:
        """A node's rank is done with a failed attempt: its last request
        for it. A failed attempt's state stays, so ``NodeRounds.drain``
        counts these instead."""
        if not self.marks_busy:
            return
        try:
            s.add(f"{k}/settled", 1)
        except _store_failures():
            pass  # the node's store is gone already: nothing to tell it

    def _publish(self, s: Any, k: str, state: str, deadline: float,
                 combine: Callable[[List[bytes]], bytes]) -> None:
        """The last rank to arrive: publishes what every rank reads (every
        value, or their reduction), then decides ``done`` unless a rank
        already gave up."""
        # A node's round: the attempt is "running" (with this rank's
        # deadline) before the round among the nodes starts, so no rank of
        # the node can give up on an attempt that then completes: only this
        # rank ends a running attempt (or, past its deadline and a grace,
        # a rank that finds it dead).
        expect = ""
        if self.marks_busy:
            expect = _RUNNING + repr(time.time() + max(0.0, deadline - time.monotonic()))
            if bytes(s.compare_set(state, "", expect)).decode(errors="replace") != expect:
                return  # decided already (aborted)
        elif s.check([state]):
            return  # decided already (aborted)
        keys = [f"{k}/v/{r}" for r in range(self.world)]
        # A value is removed only once the attempt is aborted; bound the
        # read so a removal between the check and the read cannot hold it.
        before = s.timeout
        s.set_timeout(timedelta(seconds=max(0.001, min(5.0, deadline - time.monotonic()))))
        try:
            values = s.multi_get(keys)
        except Exception:  # noqa: BLE001 - a value vanished: the attempt was aborted
            self._decide(s, state, _ABORT, expect)
            return
        finally:
            s.set_timeout(before)
        try:
            out = combine([bytes(v) for v in values])
        except BaseException as e:
            # Nobody completes an attempt whose result was never written;
            # a rank of the node claimed twice is every one's conflict.
            if self.marks_busy and isinstance(e, ConflictError):
                s.set(f"{k}/conflict", str(e))
            self._decide(s, state, _ABORT, expect)
            raise
        s.set(f"{k}/all", out)
        if self._decide(s, state, _DONE, expect) != _DONE:
            s.delete_key(f"{k}/all")

    @staticmethod
    def _decide(s: Any, state: str, want: bytes, expect: str = "") -> bytes:
        """The attempt's outcome: ``want`` if this call decided it (the
        state was ``expect``), else what was decided before."""
        return bytes(s.compare_set(state, expect, want.decode()))

    def _wait(self, s: Any, k: str, state: str, deadline: float) -> bytes:
        left = deadline - time.monotonic()
        if left > 0:
            try:
                s.wait([state], timedelta(seconds=left))
            except Exception:  # noqa: BLE001 - a timeout (the store's own error type)
                pass
        if s.check([state]):
            return self._settled(s, state, bytes(s.get(state)))
        # Timed out: give up, unless the attempt was decided meanwhile.
        return self._settled(s, state, self._decide(s, state, _ABORT))

    def _settled(self, s: Any, state: str, now: bytes) -> bytes:
        """The outcome, once a running attempt (a node's, whose last rank
        runs the round among the nodes) has ended: polled until then; past
        that rank's deadline and a grace, it is taken as dead and the
        attempt aborted."""
        pause, started = 0.002, time.time()
        while now.startswith(_RUNNING.encode()):
            try:
                until = float(now[len(_RUNNING):].decode())
            except ValueError:
                until = 0.0
            if time.time() > min(until + _BUSY_GRACE_S, started + _MAX_BUSY_S):
                return self._decide(s, state, _ABORT, now.decode(errors="replace"))
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            now = bytes(s.get(state))
        return now


def claim_rank(store: Any, key: str, rank: int, job: str, any_key: Optional[str] = None) -> None:
    """Claims ``rank`` for this process (held for the process's life): a
    rank another process holds is a ``ConflictError``, and the holder's
    next round fails with one too (with ``any_key``, the job's: the rounds
    among nodes check that one key)."""
    me = _process_token()
    held = bytes(store.compare_set(key, "", me)).decode(errors="replace")
    if held != me:
        store.set(f"{key}/contested", me)
        if any_key is not None:
            store.set(f"{any_key}/contested", f"rank {rank}: {me}")
        e = ConflictError(f"rank {rank} of job {job} is claimed twice: {held} holds it (this process is {me}); "
                          "two processes were given one rank: fix the launcher's rank assignment")
        e.other = f"{held} holds it (this process is {me})"
        raise e


def open_rounds(store: Any, rank: int, world: int, base: str, job: str,
                local: Optional[Tuple[int, int]] = None) -> "Rounds":
    """The rounds of this process's next checkpointer on ``rank``: claims
    the rank, then numbers the checkpointer (the n-th a rank opens meets
    the n-th of every other rank: each opens them in program order).

    ``local`` (this rank's local rank and its node's rank count, as the
    launcher says): where every rank's place makes whole nodes of
    consecutive ranks on one host each, the node's ranks meet on a store of
    their own first and one of them takes part in the job's store for all
    of them (``NodeRounds``). Every rank takes the same path, which its
    first round decides (``Rounds``)."""
    any_claim = f"{base}/claim/any"
    claim = f"{base}/claim/{rank}"
    claim_rank(store, claim, rank, job, any_claim)
    nth = store.add(f"{base}/opened/{rank}", 1)
    flat = StoreGather(store, world, f"{base}/{nth}", claim=claim, job=job)
    place = b"" if local is None else f"{local[0]} {local[1]} {socket.gethostname()}".encode()

    def nodes(per_node: int) -> NodeRounds:
        return NodeRounds.open(store, rank, world, per_node, f"{base}/{nth}", any_claim, job)

    return Rounds(flat, place, world, nodes)


class Rounds:
    """A checkpointer's rounds: each rank on its own (``StoreGather``), or
    its node's ranks meeting first (``NodeRounds``). Which is decided by a
    round of its own before the first one, from every rank's place
    (``_layout``), so every rank takes the same path; it is a part of that
    first round (its timeout, its failure), so opening a checkpointer
    waits for no other rank."""

    _strata_reduces = True

    def __init__(self, flat: StoreGather, place: bytes, world: int,
                 nodes: Callable[[int], "NodeRounds"]) -> None:
        self._flat = flat
        self._place = place
        self._world = world
        self._nodes = nodes
        self._chosen: Any = None
        self._lock = threading.Lock()

    def _rounds(self, rank: int, timeout_s: float) -> Any:
        with self._lock:
            if self._chosen is None:
                world = self._world
                layout = self._flat.reduce(rank, "layout", self._place, timeout_s,
                                           lambda places: _layout(places, world))
                if layout.startswith(b"nodes "):
                    self._chosen = self._nodes(int(layout[len(b"nodes "):].decode()))
                else:
                    self._chosen = self._flat
            return self._chosen

    def __call__(self, rank: int, key: str, value: bytes, timeout_s: float) -> List[bytes]:
        """An all-gather (``StoreGather.__call__``)."""
        return self._rounds(rank, timeout_s)(rank, key, value, timeout_s)

    def reduce(self, rank: int, key: str, value: bytes, timeout_s: float,
               reducer: Callable[[List[bytes]], bytes]) -> bytes:
        """A reducing round (``StoreGather.reduce``)."""
        return self._rounds(rank, timeout_s).reduce(rank, key, value, timeout_s, reducer)

    @property
    def on_nodes(self) -> Optional[bool]:
        """Whether the node's ranks meet first; None before the first round."""
        return None if self._chosen is None else self._chosen is not self._flat

    def close(self) -> None:
        """Closes the node's rounds, if chosen (``NodeRounds.close``)."""
        close = getattr(self._chosen, "close", None)
        if close is not None:
            close()


def _layout(places: List[bytes], world: int) -> bytes:
    """``b"nodes L"`` when every rank named its place and they make whole
    nodes of L > 1 consecutive ranks, each node's on one host (torchrun;
    Slurm's block distribution); else ``b"flat"`` (a rank without a place,
    cyclic placement, nodes of unequal size)."""
    parsed = []
    for p in places:
        parts = p.decode(errors="replace").split(" ", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
            return b"flat"
        parsed.append((int(parts[0]), int(parts[1]), parts[2]))
    if len(parsed) != world:
        return b"flat"
    per_node = parsed[0][1]
    if per_node < 2 or world % per_node:
        return b"flat"
    for r, (local_rank, local_world, host) in enumerate(parsed):
        if local_world != per_node or local_rank != r % per_node:
            return b"flat"
        if host != parsed[r - local_rank][2]:
            return b"flat"
    return f"nodes {per_node}".encode()


class NodeRounds:
    """Rounds whose ranks meet on their node first: each node's ranks run
    the round among themselves on a store of the node's own (a TCPStore
    that local rank 0's process serves on this host), and the last of them
    to arrive runs it among the nodes, on the job's store, with one value
    holding its node's values; its outcome is the node round's. A round
    costs the job's store O(nodes) requests, not O(world) (about nine per
    node, where each rank made about nine).

    Both levels are ``StoreGather`` rounds, so a round ends one way on
    every rank: attempt n of a key on a node meets attempt n of it on every
    other node (every rank counts its own attempts of a key alike). The
    ranks of a node wait for the one running the round among the nodes
    until its deadline (``StoreGather.marks_busy``: the attempt is
    "running" from before the round among the nodes starts, and only that
    rank ends it), and a rank claimed twice anywhere fails every node's
    round (the job's claim key, one check per node and round). The node's store lives as long as local rank 0's process: when
    it ends, the node's rounds fail, as a rank that died makes them fail."""

    _strata_reduces = True

    def __init__(self, node_rounds: StoreGather, job_rounds: StoreGather, node: int,
                 local_world: int, world: int, keep: Any = None) -> None:
        self._node = node_rounds
        self._job = job_rounds
        self.node = node
        self.local_world = local_world
        self.world = world
        # Local rank 0's process serves the node's store: held here, and
        # kept until the node's ranks read the rounds it took part in.
        self._keep = keep
        self._served: "OrderedDict[str, None]" = OrderedDict()
        self._served_lock = threading.Lock()
        self._closed = False
        if keep is not None:
            atexit.register(_close_at_exit, weakref.ref(self))

    @classmethod
    def open(cls, store: Any, rank: int, world: int, local_world: int, prefix: str,
             any_claim: str, job: str) -> "NodeRounds":
        import torch.distributed as dist

        node, local_rank = divmod(rank, local_world)
        where = f"{prefix}/node/{node}/port"
        timeout = store.timeout
        served = None
        if local_rank == 0:
            served = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timeout,
                                   wait_for_workers=False)
            store.set(where, str(served.port))
            local = served
        else:
            port = int(bytes(store.get(where)).decode())
            local = dist.TCPStore("127.0.0.1", port, None, False, timeout=timeout)
        node_rounds = StoreGather(local, local_world, f"{prefix}/local", job=job)
        node_rounds.marks_busy = True
        job_rounds = StoreGather(store, world // local_world, f"{prefix}/nodes",
                                 claim=any_claim, job=job)
        job_rounds.per_node = True
        me = cls(node_rounds, job_rounds, node, local_world, world, keep=served)
        node_rounds.on_abort = me._abort_among_nodes
        return me

    def _abort_among_nodes(self, key: str, n: int) -> None:
        """This node's attempt ended without a result (a rank of it gave
        up, or came after that): so does the attempt among the nodes, at
        once, not at the other nodes' deadlines. Idempotent; an attempt
        already decided keeps its outcome."""
        _, s = self._job._clients()
        try:
            self._job._decide(s, f"{key}/{n}/state", _ABORT)
        except Exception:  # noqa: BLE001 - the job's store is unreachable: its deadline ends it
            pass

    def __call__(self, rank: int, key: str, value: bytes, timeout_s: float) -> List[bytes]:
        """An all-gather: every rank gets every rank's value."""
        return _unpack(self.reduce(rank, key, value, timeout_s, _pack), self.world)

    def reduce(self, rank: int, key: str, value: bytes, timeout_s: float,
               reducer: Callable[[List[bytes]], bytes]) -> bytes:
        """A reducing round (``StoreGather.reduce``), met on the node first."""
        if self._closed:
            raise RoundFailed(f"round {key}: this process's rounds on node {self.node} are closed")
        node, local_rank = divmod(rank, self.local_world)
        if node != self.node:
            raise ValueError(f"rank {rank} is not on node {self.node} "
                             f"({self.local_world} ranks per node)")
        deadline = time.monotonic() + max(timeout_s, 0.001)
        n = self._node._attempt(key)
        nodes = self._job.world
        local_world = self.local_world

        def every_rank(packs: List[bytes]) -> bytes:
            values: List[bytes] = []
            for p in packs:
                values.extend(_unpack(p, local_world))
            if len(values) != nodes * local_world:
                raise ValueError(f"{len(values)} values from {nodes} nodes")
            return reducer(values)

        def among_nodes(local_values: List[bytes]) -> bytes:
            left = max(deadline - time.monotonic(), 0.001)
            try:
                return self._job._round_at(self.node, key, n, _pack(local_values), left,
                                           every_rank)
            except _store_failures() as e:
                raise _unreachable(key, "the job's store", e) from e

        try:
            return self._node._round_at(local_rank, key, n, value, timeout_s, among_nodes)
        except _store_failures() as e:
            # Local rank 0's process serves the node's store: it ended.
            raise _unreachable(key, f"node {self.node}'s store (local rank 0's process)",
                               e) from e
        finally:
            # Failed or not: the node's ranks may still be reading it.
            if self._keep is not None:
                self._note(f"{key}/{n}")

    def _note(self, attempt: str) -> None:
        """An attempt of a round this process serves that the node's other
        ranks may not be done with yet (``_read_by_all``)."""
        with self._served_lock:
            self._served[attempt] = None
            if len(self._served) > 64:
                try:
                    _, s = self._node._clients()
                    for k in [k for k in self._served if self._read_by_all(s, k)]:
                        del self._served[k]
                except Exception:  # noqa: BLE001 - the store is gone: nobody reads it
                    self._served.clear()
                while len(self._served) > 64:
                    self._served.popitem(last=False)

    def _read_by_all(self, s: Any, attempt: str) -> bool:
        """Whether every rank of the node is done with ``attempt``: its
        state is gone (the last reader of a result removes it last), or
        it failed and every rank settled it."""
        if not s.check([f"{attempt}/state"]):
            return True
        settled = f"{attempt}/settled"
        return bool(s.check([settled])) and int(bytes(s.get(settled))) >= self.local_world

    def drain(self, within_s: float = 5.0) -> None:
        """Waits (at most ``within_s``) until the node's ranks have read
        every round this process served, so that ending it (and the node's
        store with it) never takes an outcome from a rank still reading it.
        Called by ``Checkpointer.close`` and at exit."""
        if self._keep is None:
            return
        _, s = self._node._clients()
        end = time.monotonic() + within_s
        with self._served_lock:
            pending = list(self._served)
        for k in pending:
            while time.monotonic() < end:
                try:
                    if self._read_by_all(s, k):
                        break
                except Exception:  # noqa: BLE001 - the store is gone: nothing to wait for
                    return
                time.sleep(0.01)
        with self._served_lock:
            self._served.clear()

    def close(self) -> None:
        """``drain``, then stops serving the node's store (local rank 0;
        the node's other ranks' rounds fail from then on). This process's
        rounds on the node fail from then on too."""
        self.drain()
        self._closed = True
        if self._keep is not None:
            self._keep = None
            # The node's rounds used the server as their store: their
            # reference goes too, or the server would listen on until the
            # checkpointer itself is collected.
            self._node._base = None
            self._node._local = threading.local()


def _close_at_exit(ref: "weakref.ReferenceType[NodeRounds]") -> None:
    rounds = ref()
    if rounds is not None:
        rounds.close()


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
