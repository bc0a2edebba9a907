"""Strata's rounds over torch.distributed's TCPStore (``strata._dist``), four
processes against one real store: a retry never mixes attempts, a rank that
gave up is not counted, two claimants of one rank fail, and two rounds at
once never wait for each other on the store client."""

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


def run(scenario, out, extra=()):
    """Runs the scenario's four ranks (and `extra` processes: (proc id,
    claimed rank)); returns each one's result by name."""
    port = free_port()
    procs = []
    for r in range(WORLD):
        procs.append((f"{scenario}-{r}", subprocess.Popen(
            [sys.executable, WORKER, scenario, str(port), str(r), str(WORLD), out],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    for pid, claim in extra:
        procs.append((f"{scenario}-{pid}-intruder", subprocess.Popen(
            [sys.executable, WORKER, scenario, str(port), str(pid), str(WORLD), out, str(claim)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    results = {}
    for name, p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, f"{name}: {err[-4000:]}"
        with open(os.path.join(out, name + ".json")) as f:
            results[name] = json.load(f)
    return results


def test_a_retry_after_a_timeout_never_sees_the_first_attempts_values(tmp_path):
    res = run("retry", str(tmp_path))
    firsts = [res[f"retry-{r}"]["first"] for r in range(WORLD)]
    # Rank 3 came after the others gave up: the first attempt failed
    # everywhere (rank 3 at once, not after its own timeout).
    assert not any(a["ok"] for a in firsts), firsts
    assert firsts[3]["took"] < 0.9, firsts[3]
    for r in range(WORLD):
        second = res[f"retry-{r}"]["second"]
        assert second["ok"], second
        assert second["values"] == [f"{q}-a2" for q in range(WORLD)], second


def test_a_rank_that_gave_up_is_not_counted(tmp_path):
    res = run("timedout", str(tmp_path))
    rounds = [res[f"timedout-{r}"]["round"] for r in range(WORLD)]
    assert not rounds[1]["ok"], rounds[1]
    # Rank 1 gave up: nobody completes the round on its "yes", and the
    # ranks still waiting learn it at once (not after their own 10 s).
    assert not any(r["ok"] for r in rounds), rounds
    for r in (2, 3):
        assert rounds[r]["took"] < 5, rounds[r]


def test_two_processes_claiming_one_rank_fail(tmp_path):
    res = run("claim", str(tmp_path), extra=[(4, 2)])
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


def test_a_second_checkpointer_on_a_claimed_rank_fails_and_so_does_the_holders_commit(tmp_path):
    res = run("claimckpt", str(tmp_path), extra=[(4, 2)])
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


def test_two_rounds_at_once_never_wait_for_each_other(tmp_path):
    res = run("concurrent", str(tmp_path))
    for r in range(WORLD):
        fast = res[f"concurrent-{r}"]["fast"]
        slow = res[f"concurrent-{r}"]["slow"]
        assert fast["ok"], (r, fast)
        assert fast["values"] == [f"{q}-fast" for q in range(WORLD)]
        assert fast["took"] < 1.5, (r, fast)
        assert slow["ok"], (r, slow)
        assert slow["values"] == [f"{q}-slow" for q in range(WORLD)]
