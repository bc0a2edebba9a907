"""A decided step commits on every rank, over torch.distributed's store:
ranks in separate processes (each with a disk of its own), one rank's
process killed at a point of step 3's commit; after a restart every rank
restores the same step, none is lost, and the loop goes on."""

import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "split_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(phase, root, job, keep, world, victim=None, kill=None):
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        args = [sys.executable, WORKER, phase, root, job, str(keep)]
        if r == victim:
            args.append(kill)
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        _, err = p.communicate(timeout=240)
        outs.append((p.returncode, err))
    return outs


# The store lives in rank 0's process: the victim is the last rank.
CASES = [(2, keep, kill) for keep in (1, 2) for kill in ("before-vote", "after-vote", "after-record")]
CASES += [(4, 1, kill) for kill in ("before-vote", "after-vote", "after-record")]


@pytest.mark.parametrize("world,keep,kill", CASES)
def test_a_rank_killed_at_each_point_of_the_commit_loses_no_step(tmp_path, job, world, keep, kill):
    root = str(tmp_path)
    victim = world - 1
    outs = run("save", root, job, keep, world, victim, kill)
    for r, (code, err) in enumerate(outs):
        if r == victim:
            assert code == 9, err[-3000:]
            continue
        assert code == 0, err[-3000:]
        res = json.load(open(os.path.join(root, f"rank{r}-save.json")))
        assert res["saved3"] == (kill != "before-vote"), res
    want = 2 if kill == "before-vote" else 3
    outs = run("resume", root, job, keep, world)
    for r, (code, err) in enumerate(outs):
        assert code == 0, err[-3000:]
        res = json.load(open(os.path.join(root, f"rank{r}-resume.json")))
        assert res["latest"] == want and res["ok"], res
        assert res["then"] == want + 1, res
