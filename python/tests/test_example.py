"""examples/train.py killed with SIGKILL at random moments and rerun: it
resumes from the newest committed step and its loss curve equals an
uninterrupted run's, bit for bit. Also under torchrun with two ranks, and
after the node's L1 is lost (resumed from L3)."""

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "train.py")
STEPS = 300


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmd(d, ranks, extra=()):
    base = [EXAMPLE, "--dir", d, "--steps", str(STEPS), "--every", "20", "--l3", "file://" + d + "-l3", *extra]
    if ranks == 1:
        return [sys.executable, *base]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *base]


def run(d, ranks, extra=()):
    p = subprocess.run(cmd(d, ranks, extra), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    return p.stdout


def curve(d, rank=0):
    with open(os.path.join(d, f"loss-rank{rank}.txt")) as f:
        return f.read().splitlines()


def logged(d):
    try:
        with open(os.path.join(d, "loss-rank0.txt")) as f:
            return len(f.read().splitlines())
    except FileNotFoundError:
        return 0


def run_and_kill(d, ranks, at_line):
    """Starts the example, SIGKILLs it (every process of it) once its log
    has `at_line` lines."""
    p = subprocess.Popen(cmd(d, ranks, ["--step-sleep", "0.01"]), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while logged(d) < at_line and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert p.poll() is None, "the run ended before it could be killed"
    kill_all(p)


def kill_all(p):
    """SIGKILLs `p` (started with start_new_session) and every process
    under it: torchrun's workers may sit in sessions of their own, and all
    die as on a node that loses power (a survivor would go on writing into
    the directory the next run resumes from)."""
    tree = descendants(p.pid)
    os.killpg(p.pid, signal.SIGKILL)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()


def descendants(pid):
    """Every process below `pid`, from /proc."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def test_killed_at_random_moments_the_example_resumes_bit_for_bit(tmp_path):
    ref = str(tmp_path / "ref")
    run(ref, 1)
    assert len(curve(ref)) == STEPS
    rnd = random.Random(os.environ.get("STRATA_TEST_SEED", str(time.time_ns())))
    d = str(tmp_path / "killed")
    # Each kill comes after the previous partial run's last logged step, so
    # it always lands in the middle of training.
    kills = []
    at = rnd.randrange(30, 90)
    while at < STEPS - 10:
        kills.append(at)
        at = rnd.randrange(at + 50, at + 100)
    resumed = []
    for at in kills:
        run_and_kill(d, 1, at)
        out = run(d, 1, ["--steps", str(at + 40)]) if at + 40 < STEPS else run(d, 1)
        m = re.search(r"resumed from step (\d+)", out)
        assert m, out
        resumed.append(int(m.group(1)))
    run(d, 1)
    assert curve(d) == curve(ref), f"kills at {kills}, resumed from {resumed}"
    assert all(r > 0 for r in resumed), resumed


def test_the_node_loses_its_disk_and_the_example_resumes_from_l3(tmp_path):
    ref = str(tmp_path / "ref")
    run(ref, 1)
    d = str(tmp_path / "lost")
    run_and_kill(d, 1, 170)
    shutil.rmtree(os.path.join(d, "l1"))  # the node's NVMe is gone
    out = run(d, 1)
    m = re.search(r"resumed from step (\d+)", out)
    # L3 holds every second checkpoint (steps 40, 80, ...).
    assert m and int(m.group(1)) % 40 == 0 and int(m.group(1)) >= 80, out
    assert curve(d) == curve(ref)


def test_under_torchrun_two_ranks_resume_bit_for_bit(tmp_path):
    ref = str(tmp_path / "ref")
    run(ref, 2)
    d = str(tmp_path / "killed")
    run_and_kill(d, 2, random.Random().randrange(50, 250))
    out = run(d, 2)
    assert "resumed from step" in out, out
    for r in range(2):
        assert curve(d, r) == curve(ref, r)
        assert len(curve(d, r)) == STEPS
