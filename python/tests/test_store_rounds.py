"""Strata's rounds over torch.distributed's TCPStore (``strata._dist``), four
processes against one real store: a retry never mixes attempts, a rank that
gave up is not counted, two claimants of one rank fail, and two rounds at
once never wait for each other on the store client. Every test runs with
each rank its own (``flat``) and with two nodes of two ranks that meet on
their node first (``nodes``, ``NodeRounds``)."""

import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "store_worker.py")
WORLD = 4

pytest.importorskip("torch.distributed")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=["flat", "nodes"])
def local(request):
    """Ranks per node meeting on their node first (0: none)."""
    return 2 if request.param == "nodes" else 0


def run(scenario, out, extra=(), local=0):
    """Runs the scenario's four ranks (and `extra` processes: (proc id,
    claimed rank)), `local` ranks per node meeting there first; returns
    each one's result by name."""
    port = free_port()
    procs = []
    env = dict(os.environ, STRATA_TEST_LOCAL_WORLD=str(local))
    for r in range(WORLD):
        procs.append((f"{scenario}-{r}", subprocess.Popen(
            [sys.executable, WORKER, scenario, str(port), str(r), str(WORLD), out],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)))
    for pid, claim in extra:
        procs.append((f"{scenario}-{pid}-intruder", subprocess.Popen(
            [sys.executable, WORKER, scenario, str(port), str(pid), str(WORLD), out, str(claim)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)))
    results = {}
    for name, p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, f"{name}: {err[-4000:]}"
        with open(os.path.join(out, name + ".json")) as f:
            results[name] = json.load(f)
    return results


def test_a_retry_after_a_timeout_never_sees_the_first_attempts_values(tmp_path, local):
    res = run("retry", str(tmp_path), local=local)
    firsts = [res[f"retry-{r}"]["first"] for r in range(WORLD)]
    # Rank 3 came after the others gave up: the first attempt failed
    # everywhere (rank 3 at once, not after its own timeout).
    assert not any(a["ok"] for a in firsts), firsts
    assert firsts[3]["took"] < 0.9, firsts[3]
    for r in range(WORLD):
        second = res[f"retry-{r}"]["second"]
        assert second["ok"], second
        assert second["values"] == [f"{q}-a2" for q in range(WORLD)], second


def test_a_rank_that_gave_up_is_not_counted(tmp_path, local):
    res = run("timedout", str(tmp_path), local=local)
    rounds = [res[f"timedout-{r}"]["round"] for r in range(WORLD)]
    assert not rounds[1]["ok"], rounds[1]
    # Rank 1 gave up: nobody completes the round on its "yes", and the
    # ranks still waiting learn it at once (not after their own 10 s).
    assert not any(r["ok"] for r in rounds), rounds
    for r in (2, 3):
        assert rounds[r]["took"] < 5, rounds[r]


def test_two_processes_claiming_one_rank_fail(tmp_path, local):
    res = run("claim", str(tmp_path), extra=[(4, 2)], local=local)
    intruder = res["claim-4-intruder"]
    assert intruder["open"] == "ConflictError", intruder
    assert "rank 2" in intruder["message"] and "claimed" in intruder["message"], intruder
    # The holder's next round fails too (as with etcd: both hear of it),
    # and so does the round for everyone, without waiting out its timeout.
    holder = res["claim-2"]["round"]
    assert holder["error"] == "ConflictError", holder
    for r in range(WORLD):
        rd = res[f"claim-{r}"]["round"]
        assert not rd["ok"], rd
        assert rd["took"] < 4, rd


def test_a_second_checkpointer_on_a_claimed_rank_fails_and_so_does_the_holders_commit(tmp_path, local):
    res = run("claimckpt", str(tmp_path), extra=[(4, 2)], local=local)
    intruder = res["claimckpt-4-intruder"]
    assert intruder["open"] == "ConflictError", intruder
    assert "rank 2" in intruder["message"], intruder
    # Through the native module: the round's ConflictError stays a
    # conflict (Rust's RankClaimed), and nobody commits step 1.
    holder = res["claimckpt-2"]["round"]
    assert holder["error"] == "ConflictError" and "claimed twice" in holder["message"], holder
    for r in range(WORLD):
        rd = res[f"claimckpt-{r}"]["round"]
        assert not rd["ok"], rd
        assert rd["took"] < 4.5, rd


def test_two_rounds_at_once_never_wait_for_each_other(tmp_path, local):
    res = run("concurrent", str(tmp_path), local=local)
    for r in range(WORLD):
        fast = res[f"concurrent-{r}"]["fast"]
        slow = res[f"concurrent-{r}"]["slow"]
        assert fast["ok"], (r, fast)
        assert fast["values"] == [f"{q}-fast" for q in range(WORLD)]
        assert fast["took"] < 1.5, (r, fast)
        assert slow["ok"], (r, slow)
        assert slow["values"] == [f"{q}-slow" for q in range(WORLD)]


def test_a_reducing_round_reduces_once_and_every_rank_reads_the_result(tmp_path, local):
    res = run("reduce", str(tmp_path), local=local)
    want = "|".join(f"{q}-v" for q in range(WORLD))
    for r in range(WORLD):
        rd = res[f"reduce-{r}"]["round"]
        assert rd["ok"] and rd["values"] == [want], (r, rd)
    # One rank (the last to arrive) ran the reduction, over every value.
    ran = [res[f"reduce-{r}"]["reduced"] for r in range(WORLD)]
    assert sorted(ran, key=len) == [[]] * (WORLD - 1) + [[WORLD]], ran
    # A reduction that raises fails the round on every rank, at once.
    bad = [res[f"reduce-{r}"]["bad"] for r in range(WORLD)]
    assert not any(b["ok"] for b in bad), bad
    assert sum(b["error"] == "ValueError" for b in bad) == 1, bad
    # With nodes, a node's store outlives local rank 0's round until the
    # node's other ranks are done with the failed round too: nobody sees
    # the store vanish (torch's DistNetworkError) while reading it.
    for b in bad:
        assert b["error"] in ("ValueError", "RoundFailed"), b
        assert b["took"] < 5, b


class _TwinRounds:
    """Rounds of a world of two whose other rank always says the same as
    this one; its ``reduce`` keeps the reducers it is lent."""

    _strata_reduces = True

    def __init__(self):
        self.lent = []
        self.miscounted = []

    def __call__(self, rank, key, value, timeout):
        return [value, value]

    def reduce(self, rank, key, value, timeout, reducer):
        self.lent.append((key, reducer))
        try:
            reducer([value])
        except RuntimeError as e:
            self.miscounted.append(str(e))
        return reducer([value, value])


def test_the_reduction_lent_to_the_store_works_only_during_its_round(tmp_path, monkeypatch):
    import torch

    import strata
    import strata._checkpointer as ck

    twin = _TwinRounds()
    monkeypatch.setattr(ck, "torch_world", lambda: (0, 2, None))
    monkeypatch.setattr(ck, "open_rounds", lambda *a: twin)
    c = strata.Checkpointer(job="lent", l1_dir=str(tmp_path), coordination_timeout_secs=5)
    try:
        c.save(1, {"w": torch.arange(8.0)}).wait()
        assert c.load()["w"].tolist() == list(range(8))
    finally:
        c.close()
    keys = [k for k, _ in twin.lent]
    # The commit barrier and the restore agreement reduced in the store.
    assert any(k.startswith("commit/") for k in keys), keys
    assert any(k.startswith("restore/") for k in keys), keys
    assert twin.miscounted and all("2 ranks reduced over 1 values" in m for m in twin.miscounted)
    # Kept past its round, a reduction refuses to run.
    _, late = twin.lent[0]
    with pytest.raises(RuntimeError, match="after its round"):
        late([b"\x01\x00", b"\x01\x00"])


def test_a_nodes_ranks_meet_there_first_so_the_jobs_store_serves_one_of_them(tmp_path):
    # The same round, each rank its own and two nodes of two: with the
    # nodes, one rank per node (the last to arrive) takes part in the job's
    # store (its requests per round fall by the ranks per node, plus the
    # publishing rank's and the cleaning rank's few).
    ops = {}
    for local in (0, 2):
        out = tmp_path / f"l{local}"
        out.mkdir()
        res = run("reduce", str(out), local=local)
        want = "|".join(f"{q}-v" for q in range(WORLD))
        assert all(res[f"reduce-{r}"]["round"]["values"] == [want] for r in range(WORLD)), res
        ops[local] = [res[f"reduce-{r}"]["job_ops_red"] for r in range(WORLD)]
    # Every rank sent the job's store about nine requests, flat; with the
    # nodes, one rank per node did, the other none.
    assert min(ops[0]) >= 8, ops
    assert sorted(ops[2])[:2] == [0, 0] and sum(ops[2]) < 0.7 * sum(ops[0]), ops


def test_ranks_meet_on_nodes_only_when_every_rank_s_place_makes_whole_nodes():
    # Every rank takes the path one round before its first decides from
    # every rank's place (local rank, ranks per node, host): never some
    # ranks on nodes and others on their own (which would wait for each
    # other).
    from strata._dist import _layout

    def place(local_rank, per_node, host="a"):
        return f"{local_rank} {per_node} {host}".encode()

    assert _layout([place(r % 2, 2) for r in range(4)], 4) == b"nodes 2"
    # Slurm's cyclic distribution: rank r on node r % 2.
    assert _layout([place(r // 2, 2, f"h{r % 2}") for r in range(4)], 4) == b"flat"
    # A rank without a place, nodes of unequal size, a node on two hosts.
    assert _layout([place(r % 2, 2) for r in range(3)] + [b""], 4) == b"flat"
    assert _layout([place(r, 4) for r in range(4)] + [place(r, 2, "b") for r in range(2)], 6) == b"flat"
    assert _layout([place(r % 2, 2, "b" if r == 1 else "a") for r in range(4)], 4) == b"flat"
    assert _layout([place(0, 1) for _ in range(4)], 4) == b"flat"


def test_closing_a_nodes_rounds_stops_the_node_store_it_served(tmp_path):
    # Checkpointer.close closes its rounds: the node's store that its
    # process (local rank 0) served stops listening, not only when the
    # process ends, and the node's other ranks' rounds fail from then on.
    res = run("close", str(tmp_path), local=2)
    for r in range(WORLD):
        assert res[f"close-{r}"]["round"]["ok"], res[f"close-{r}"]
    for r in (0, 2):
        got = res[f"close-{r}"]
        assert got["listening_before"] and not got["listening_after"], got
        # The closing process's own next round fails at once, saying why.
        own = got["own_after"]
        assert own["error"] == "RoundFailed" and "closed" in own["message"], own
        assert own["took"] < 1, own
    for r in (1, 3):
        after = res[f"close-{r}"]["after"]
        # Strata's error, saying the node's store is gone; not torch's.
        assert not after["ok"] and after["error"] == "RoundFailed", after
        assert "store" in after["message"], after
