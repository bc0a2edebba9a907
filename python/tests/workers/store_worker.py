"""One process of the torch-store round tests: Strata's rounds
(``strata._dist``) over a real TCPStore, without a process group.

Usage: store_worker.py SCENARIO PORT RANK WORLD OUT_DIR [CLAIM_AS]
  Rank 0 hosts the TCPStore. CLAIM_AS (default RANK) is the rank this
  process claims: a second process claiming a taken rank passes it.

Scenarios:
  retry     rank 3 reaches round "r" after the others gave up; everyone
            retries: the second attempts meet, with second-attempt values only
  timedout  rank 1 gives up on round "t" before rank 0 arrives: nobody
            may complete that round (rank 1's value is not counted)
  claim     ranks 0..3 claim their ranks, then a fifth process claims rank 2;
            then ranks 0..3 run a round
  concurrent  a slow round on a thread (rank 3 joins it late) and a fast
            round on the main thread at the same time
  reduce    a reducing round "red": one rank runs the reducer on every
            value, every rank reads its result; then round "bad", whose
            reducer raises: the round fails on every rank at once (with
            nodes, local rank 0 comes last to its node, and the node's
            other ranks take 0.5 s over what follows reading that
            outcome, while local rank 0's process exits)
  close     (nodes only) a round; then each node's local rank 0 closes
            its rounds: the node's store it served stops listening, and
            the node's other rank's next round fails
  claimckpt as claim, through strata.Checkpointer (the store given as
            torch.distributed's): the intruder's Checkpointer() fails, and
            the holder's next commit fails with ConflictError
STRATA_TEST_LOCAL_WORLD=L (L > 1): every scenario with each node's ranks
meeting on the node first (L consecutive ranks per node, ``NodeRounds``).
Each result counts the requests this process sent the job's store from
its rounds ("job_ops").
Writes OUT_DIR/<scenario>-<rank>[-intruder].json.
"""

import json
import os
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from strata import ConflictError, StrataError

import strata._dist as rounds_mod
from strata._dist import open_rounds

scenario, port, rank, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
claim_as = int(sys.argv[6]) if len(sys.argv) > 6 else rank
intruder = claim_as != rank
store = dist.TCPStore("127.0.0.1", port, world, rank == 0 and not intruder,
                      timeout=timedelta(seconds=60), wait_for_workers=False)
base = f"strata/j-{scenario}/0"
result = {"rank": rank, "claim_as": claim_as}
t0 = time.monotonic()
LOCAL = int(os.environ.get("STRATA_TEST_LOCAL_WORLD", "0"))
job_ops = [0]


def local_for(r):
    return (r % LOCAL, LOCAL) if LOCAL > 1 else None


class Counted:
    """A store client that counts the requests sent through it."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        a = getattr(self._inner, name)
        if not callable(a):
            return a

        def call(*args, **kw):
            job_ops[0] += 1
            return a(*args, **kw)

        return call


_clients = rounds_mod.StoreGather._clients


def counted_clients(self):
    raw, s = _clients(self)
    if self._base is store:
        return Counted(raw), Counted(s)
    return raw, s


rounds_mod.StoreGather._clients = counted_clients

if scenario == "reduce" and LOCAL > 1 and rank % LOCAL != 0:
    # A node's other ranks read round "bad"'s outcome late: what they
    # send the node's store after it (their value's removal) comes after
    # local rank 0's process has finished its round and gone to exit.
    _settled = rounds_mod.StoreGather._settled

    def late_settled(self, s, state, now):
        out = _settled(self, s, state, now)
        if state.startswith("bad/") and self._base is not store:
            time.sleep(0.5)
        return out

    rounds_mod.StoreGather._settled = late_settled


def attempt(gather, key, value, timeout):
    started = time.monotonic()
    try:
        got = gather(claim_as, key, value, timeout)
        return {"ok": True, "values": [v.decode() for v in got], "took": time.monotonic() - started}
    except StrataError as e:
        return {"ok": False, "error": type(e).__name__, "message": str(e), "took": time.monotonic() - started}
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"ok": False, "error": type(e).__name__, "message": str(e), "took": time.monotonic() - started}


def barrier(name):
    """All four ranks here (through the store, not a round)."""
    store.add(f"test/{scenario}/{name}", 1)
    while int(store.add(f"test/{scenario}/{name}", 0)) < world:
        time.sleep(0.01)


def open_checkpointer(as_rank):
    import strata
    import strata._checkpointer as ck

    ck.torch_world = lambda: (as_rank, world, store)
    if LOCAL > 1:
        os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"] = str(as_rank % LOCAL), str(LOCAL)
    return strata.Checkpointer(job="j-claimckpt", l1_dir=os.path.join(out, f"l1-{rank}"),
                               coordination_timeout_secs=5)


if scenario == "claimckpt":
    import torch

    if intruder:
        store.wait([f"test/{scenario}/claimed"], timedelta(seconds=60))
        try:
            open_checkpointer(claim_as)
            result["open"] = "ok"
        except ConflictError as e:
            result["open"] = "ConflictError"
            result["message"] = str(e)
        store.add(f"test/{scenario}/intruder-done", 1)
    else:
        ckpt = open_checkpointer(rank)
        barrier("opened")
        if rank == 0:
            store.set(f"test/{scenario}/claimed", "1")
        store.wait([f"test/{scenario}/intruder-done"], timedelta(seconds=60))
        started = time.monotonic()
        try:
            ckpt.save(1, {"w": torch.ones(16)}).wait()
            result["round"] = {"ok": True}
        except StrataError as e:
            result["round"] = {"ok": False, "error": type(e).__name__, "message": str(e)}
        result["round"]["took"] = time.monotonic() - started
        ckpt.close()
elif scenario == "claim":
    if intruder:
        # Starts once the four ranks hold their claims.
        store.wait([f"test/{scenario}/claimed"], timedelta(seconds=60))
        try:
            open_rounds(store, claim_as, world, base, "j-claim", local_for(claim_as))
            result["open"] = "ok"
        except ConflictError as e:
            result["open"] = "ConflictError"
            result["message"] = str(e)
        store.add(f"test/{scenario}/intruder-done", 1)
    else:
        gather = open_rounds(store, rank, world, base, "j-claim", local_for(rank))
        barrier("opened")
        if rank == 0:
            store.set(f"test/{scenario}/claimed", "1")
        store.wait([f"test/{scenario}/intruder-done"], timedelta(seconds=60))
        result["round"] = attempt(gather, "after", f"{rank}".encode(), 5.0)
else:
    gather = open_rounds(store, rank, world, base, f"j-{scenario}", local_for(rank))
    barrier("opened")
    if scenario == "retry":
        # Attempt 1: rank 3 comes 1.5 s late to a round of 1 s.
        if rank == 3:
            time.sleep(1.5)
        result["first"] = attempt(gather, "r", f"{rank}-a1".encode(), 1.0)
        result["second"] = attempt(gather, "r", f"{rank}-a2".encode(), 10.0)
    elif scenario == "timedout":
        # Rank 1 gives up after 0.5 s; rank 0 arrives at 1.5 s.
        if rank == 0:
            time.sleep(1.5)
        timeout = 0.5 if rank == 1 else 10.0
        result["round"] = attempt(gather, "t", f"{rank}-yes".encode(), timeout)
    elif scenario == "concurrent":
        slow = {}

        def run_slow():
            if rank == 3:
                time.sleep(3.0)
            slow.update(attempt(gather, "slow", f"{rank}-slow".encode(), 20.0))

        th = threading.Thread(target=run_slow)
        th.start()
        time.sleep(0.5)
        result["fast"] = attempt(gather, "fast", f"{rank}-fast".encode(), 2.0)
        th.join()
        result["slow"] = slow
    elif scenario == "reduce":
        ran = []

        def reducer(values):
            ran.append(len(values))
            return b"|".join(values)

        # The first round also decides whether the node's ranks meet
        # first (one round of its own): counted apart.
        result["warm"] = attempt(gather, "warm", b"w", 10.0)
        before = job_ops[0]
        result["round"] = attempt(lambda r, k, v, t: [gather.reduce(r, k, v, t, reducer)], "red",
                                  f"{rank}-v".encode(), 10.0)
        result["reduced"] = ran
        result["job_ops_red"] = job_ops[0] - before

        def refuses(values):
            raise ValueError("this reduction refuses")

        if LOCAL > 1 and rank % LOCAL == 0:
            # Local rank 0 comes last to its node: it runs the round among
            # the nodes, while the node's other ranks wait for it.
            time.sleep(0.3)
        result["bad"] = attempt(lambda r, k, v, t: [gather.reduce(r, k, v, t, refuses)], "bad",
                                f"{rank}".encode(), 10.0)
    elif scenario == "close":
        import socket

        def listening(port):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        result["round"] = attempt(gather, "before", f"{rank}".encode(), 10.0)
        node = rank // LOCAL
        port = int(bytes(store.get(f"{base}/1/node/{node}/port")).decode())
        barrier("rounds-done")
        if rank % LOCAL == 0:
            result["listening_before"] = listening(port)
            gather.close()
            # The server goes with the last reference to it: at once, or
            # after a moment.
            deadline = time.monotonic() + 5
            while listening(port) and time.monotonic() < deadline:
                time.sleep(0.05)
            result["listening_after"] = listening(port)
            result["own_after"] = attempt(gather, "own", f"{rank}".encode(), 10.0)
        barrier("closed")
        if rank % LOCAL != 0:
            result["after"] = attempt(gather, "after", f"{rank}".encode(), 3.0)
    else:
        raise SystemExit(f"unknown scenario {scenario}")

result["job_ops"] = job_ops[0]
name = f"{scenario}-{rank}" + ("-intruder" if intruder else "") + ".json"
with open(os.path.join(out, name), "w") as f:
    json.dump(result, f)
# The store lives in rank 0's process: it leaves last.
store.add(f"test/{scenario}/exit", 1)
if rank == 0 and not intruder:
    procs = world + (1 if scenario in ("claim", "claimckpt") else 0)
    deadline = time.monotonic() + 30
    while int(store.add(f"test/{scenario}/exit", 0)) < procs and time.monotonic() < deadline:
        time.sleep(0.05)
