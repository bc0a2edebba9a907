"""Ranks in separate processes agreeing through torch.distributed (gloo):
torchrun with two ranks, and a rank killed in the middle of a save."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "dist_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def results(out, world=2):
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)]


def torchrun(mode, l1, job, out, timeout=300):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           WORKER, mode, l1, job, out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    return results(out)


def test_torchrun_two_ranks_save_and_load(tmp_path, l1, job):
    out = str(tmp_path)
    saved = torchrun("save", l1, job, out)
    for r, res in enumerate(saved):
        assert (res["rank"], res["world"]) == (r, 2)
        assert (res["config_rank"], res["config_world"]) == (r, 2), "rank from torch.distributed"
        assert [s["step"] for s in res["stats"]] == [1, 2, 3]
        assert res["steps"] == [1, 2, 3]
    # Both ranks' commit records exist for each step.
    for step in (1, 2, 3):
        d = os.path.join(l1, job, "steps", f"{step:020}")
        assert sorted(f for f in os.listdir(d) if f.startswith("c-")) == ["c-0", "c-1"]
    loaded = torchrun("load", l1, job, out)
    for res in loaded:
        assert res["latest"] == 3 and res["ok"], res
        assert res["load_into"] == 2 and res["into_ok"], res


def test_a_checkpointer_dropped_right_after_a_save_finishes_it(tmp_path, l1, job):
    out = str(tmp_path)
    for res in torchrun("drop", l1, job, out, timeout=120):
        assert res["steps"] == [1], res


def launch(mode, l1, job, out, port):
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, WORKER, mode, l1, job, out], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def test_a_rank_killed_mid_save_commits_nothing_and_the_survivor_gets_an_error(tmp_path, l1, job):
    out = str(tmp_path)
    procs = launch("die", l1, job, out, free_port())
    t0 = time.monotonic()
    survivor_out, survivor_err = procs[0].communicate(timeout=120)
    procs[1].wait(timeout=30)
    assert procs[1].returncode == -9
    assert procs[0].returncode == 0, survivor_err[-4000:]
    assert time.monotonic() - t0 < 90, "an error, not a hang"
    res = json.load(open(os.path.join(out, "rank0.json")))
    assert res["error"] == "UnavailableError", res
    assert res["waited_s"] < 60
    assert "commit" in res["message"], res
    # Step 2 has no commit record from any rank; step 1 has both.
    s1 = os.path.join(l1, job, "steps", f"{1:020}")
    s2 = os.path.join(l1, job, "steps", f"{2:020}")
    assert sorted(f for f in os.listdir(s1) if f.startswith("c-")) == ["c-0", "c-1"]
    assert not os.path.isdir(s2) or not [f for f in os.listdir(s2) if f.startswith("c-")]
    # Restarted, both ranks resume from step 1.
    procs = launch("resume", l1, job, out, free_port())
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-4000:]
    for res in results(out):
        assert res["latest"] == 1 and res["ok"], res


@pytest.fixture
def l1(tmp_path):
    return str(tmp_path / "l1")
