"""Strata's rounds over torch.distributed's TCPStore: the reducing round
(``StoreGather.reduce``: the last rank to arrive reduces once, every other
rank reads the decision) against the all-gather every rank reduced itself
before, and the reducing round with each node's ranks meeting on their
node first (``NodeRounds``, ``--local`` ranks per node), in one run, on one
store.

    python benches/store_rounds_bench.py --worlds 8,32 --rounds 30 --value 520 --local 8

Ranks are processes on this machine (rank 0 hosts the store). A round's
value is ``--value`` bytes (a restore round's is about 520: its newest 64
steps); the reduction is a commit-like one (a few bytes out). Prints, per
world: the median and p90 of a round (the slowest rank's), and the bytes
the ranks read from the store per round, summed over them: the last
rank's read of every value, then each rank's read of the result (every
value for the all-gather, the decision for the reducing round); and the
requests the job's store served per round (every rank's, summed).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decide(values):
    """A commit-like reduction: yes when every value starts with 1."""
    return bytes([int(all(v[:1] == b"\x01" for v in values))])


KINDS = ("gather", "reduce", "node")


def rank_main(port: int, rank: int, world: int, rounds: int, size: int, local: int,
              out: str) -> None:
    import torch.distributed as dist

    import strata._dist as rounds_mod
    from strata._dist import NodeRounds, StoreGather

    store = dist.TCPStore("127.0.0.1", port, world, rank == 0,
                          timeout=timedelta(seconds=120), wait_for_workers=False)
    value = b"\x01" + bytes(size - 1)
    res = {k: [] for k in KINDS}
    res.update({f"{k}_bytes": 0 for k in KINDS})
    res.update({f"{k}_requests": 0 for k in KINDS})
    kind_now = ["gather"]

    class Requests:
        """The job's store client of a round, counting its requests."""

        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            a = getattr(self._inner, name)
            if not callable(a):
                return a

            def call(*args, **kw):
                res[f"{kind_now[0]}_requests"] += 1
                return a(*args, **kw)

            return call

    plain_clients = StoreGather._clients

    def clients(self):
        raw, s = plain_clients(self)
        return (Requests(raw), Requests(s)) if self._base is store else (raw, s)

    rounds_mod.StoreGather._clients = clients

    class Counted(StoreGather):
        def _publish(self, s, k, state, deadline, combine):
            # The last rank to arrive reads every value (one multi_get).
            res[f"{kind_now[0]}_bytes"] += world * len(value)
            return super()._publish(s, k, state, deadline, combine)

    g = Counted(store, world, "bench/rounds")
    node = rank // local
    nodes = NodeRounds.open(store, rank, world, local, "bench/nodes",
                            f"bench/claim/node/{node}", "bench")
    for i in range(rounds):
        for kind in KINDS:
            # Everyone starts a round together (through the store, not a round).
            key = f"go/{kind}/{i}"
            store.add(key, 1)
            if rank == 0:
                while int(store.add(key, 0)) < world:
                    time.sleep(0.0005)
                store.set(f"{key}/all", "1")
            else:
                store.wait([f"{key}/all"])
            kind_now[0] = kind
            t = time.perf_counter()
            if kind == "gather":
                got = g(rank, f"g{i}", value, 60.0)
                decision = decide(got)
                res["gather_bytes"] += 4 + sum(8 + len(v) for v in got)
            elif kind == "reduce":
                decision = g.reduce(rank, f"r{i}", value, 60.0, decide)
                res["reduce_bytes"] += len(decision)
            else:
                decision = nodes.reduce(rank, f"n{i}", value, 60.0, decide)
            res[kind].append(time.perf_counter() - t)
            assert decision == b"\x01", decision
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    nodes.drain()
    store.add("bench/exit", 1)
    if rank == 0:
        while int(store.add("bench/exit", 0)) < world:
            time.sleep(0.01)


def run_world(world: int, rounds: int, size: int, local: int, out: str) -> dict:
    port = free_port()
    os.makedirs(out, exist_ok=True)
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--world", str(world),
                               "--port", str(port), "--rounds", str(rounds), "--value", str(size),
                               "--local", str(local), "--out", out]) for r in range(world)]
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise SystemExit(f"a rank failed ({p.returncode})")
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)]
    row = {"world": world}
    for kind in KINDS:
        row[f"{kind}_requests_per_round"] = sum(rk[f"{kind}_requests"] for rk in ranks) / rounds
        slowest = [max(rk[kind][i] for rk in ranks) for i in range(rounds)]
        slowest.sort()
        row[f"{kind}_median_ms"] = statistics.median(slowest) * 1e3
        row[f"{kind}_p90_ms"] = slowest[int(0.9 * (len(slowest) - 1))] * 1e3
        row[f"{kind}_bytes_per_round"] = sum(rk[f"{kind}_bytes"] for rk in ranks) / rounds
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="8,32")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--value", type=int, default=520)
    ap.add_argument("--local", type=int, default=8, help="ranks per node (NodeRounds)")
    ap.add_argument("--dir", default=os.path.join("/tmp", f"strata-store-bench-{os.getpid()}"))
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.rank is not None:
        rank_main(a.port, a.rank, a.world, a.rounds, a.value, a.local, a.out)
        return
    print(f"store rounds: {a.rounds} rounds of {a.value}-byte values per world, ranks as processes, "
          f"{a.local} per node for the node rounds")
    for w in (int(x) for x in a.worlds.split(",")):
        if w % a.local:
            raise SystemExit(f"--local {a.local} does not divide world {w}")
        r = run_world(w, a.rounds, a.value, a.local, os.path.join(a.dir, str(w)))
        print(f"world={w} gather_median_ms={r['gather_median_ms']:.1f} gather_p90_ms={r['gather_p90_ms']:.1f} "
              f"reduce_median_ms={r['reduce_median_ms']:.1f} reduce_p90_ms={r['reduce_p90_ms']:.1f} "
              f"node_median_ms={r['node_median_ms']:.1f} node_p90_ms={r['node_p90_ms']:.1f} "
              f"gather_bytes_read_per_round={r['gather_bytes_per_round']:.0f} "
              f"reduce_bytes_read_per_round={r['reduce_bytes_per_round']:.0f} "
              f"job_store_requests_per_round: gather={r['gather_requests_per_round']:.0f} "
              f"reduce={r['reduce_requests_per_round']:.0f} node={r['node_requests_per_round']:.0f}",
              flush=True)


if __name__ == "__main__":
    main()
