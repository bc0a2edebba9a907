"""strata.Catalog: another rank's shard read by entry and byte range from
each tier on its own (L1, a peer service, L3), and a damaged L1 chunk
served by the next tier and repaired on the way.

Two ranks under torchrun save one step to L1, to a peer service (the
`strata peer serve` binary, QUIC with mutual TLS) and to L3 (a directory).
"""

import os
import re
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import strata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "workers", "tiers_worker.py")


def strata_bin():
    path = os.environ.get("STRATA_BIN") or os.path.join(ROOT, "target", "debug", "strata")
    if not os.path.exists(path):
        if os.environ.get("STRATA_REQUIRE_SERVERS"):
            raise AssertionError(f"no strata binary at {path} (cargo build -p strata-cli)")
        pytest.skip(f"no strata binary at {path}")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def peer(tmp_path, job):
    """A peer service for node-b; yields (peers setting, certs dir)."""
    exe = strata_bin()
    certs = tmp_path / "certs"
    subprocess.run([exe, "peer", "certs", "--out", str(certs), "--node", "node-a",
                    "--node", "node-b", "--job", job], check=True, capture_output=True)
    p = subprocess.Popen([exe, "peer", "serve", "--listen", "127.0.0.1:0", "--certs", str(certs),
                          "--node", "node-b", "--spill", str(tmp_path / "spill")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        m = None
        while m is None:
            line = p.stdout.readline()
            assert line, "the peer service stopped: " + "".join(seen)
            seen.append(line)
            m = re.search(r"listening on (\S+?:\d+)", line)
        # Keep draining its output, so it never blocks on a full pipe.
        threading.Thread(target=p.stdout.read, daemon=True).start()
        yield f"node-b={m.group(1)}", str(certs)
    finally:
        p.kill()
        p.wait()


def save_world(tmp_path, l1, job, peers, certs, l3):
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, STRATA_L1_DIR=l1, STRATA_PEERS=peers, STRATA_PEER_CERTS=certs,
               STRATA_NODE="node-a", STRATA_L3_URL=f"file://{l3}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), WORKER, job, str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    return [torch.load(out / f"state-{r}.pt") for r in range(2)]


def check_rank1(cat, want):
    assert cat.steps() == [5]
    assert cat.ranks(5) == [0, 1]
    # The Python layer's own entry (the state's tree) comes last.
    names = [(n, d, s, ln) for n, d, s, ln in cat.entries(5, 1) if not n.startswith("__strata")]
    w = want["w"].numpy()
    assert names == [("w", "F32", [w.size], w.nbytes), ("b", "I32", [1000], 4000)]
    assert np.array_equal(cat.read_array(5, 1, "w"), w)
    assert np.array_equal(cat.read_array(5, 1, "b"), want["b"].numpy())
    raw = w.tobytes()
    # Ranges inside one chunk, across a chunk boundary, to the end.
    for off, ln in [(0, 16), ((1 << 20) - 8, 64), (2 * (1 << 20) + 3, (1 << 20) + 5), (len(raw) - 4, None)]:
        got = cat.read(5, 1, "w", offset=off, length=ln)
        assert got == raw[off: off + ln if ln is not None else None], (off, ln)
    assert cat.last_read["fallbacks"] == 0
    with pytest.raises(strata.InvalidError):
        cat.read(5, 1, "w", offset=len(raw) - 2, length=3)
    with pytest.raises(strata.NotFoundError):
        cat.read(5, 1, "nope")
    with pytest.raises(strata.NotFoundError):
        cat.chunks(5, 1, "nope")


def test_another_ranks_shard_from_each_tier_and_a_damaged_chunk_repaired(tmp_path, l1, job, peer, monkeypatch):
    peers, certs = peer
    # Each catalog names its own tiers: none may come from the environment.
    for var in ("STRATA_L1_DIR", "STRATA_L3_URL", "STRATA_PEERS", "STRATA_PEER_CERTS", "STRATA_JOB"):
        monkeypatch.delenv(var, raising=False)
    l3 = tmp_path / "l3"
    l3.mkdir()
    states = save_world(tmp_path, l1, job, peers, certs, l3)
    missing = str(tmp_path / "no-l1")
    every = dict(job=job, l1_dir=l1, peers=[peers], peer_certs=certs, l3_url=f"file://{l3}")
    only = {
        "l1": dict(job=job, l1_dir=l1),
        "l2": dict(job=job, l1_dir=missing, peers=[peers], peer_certs=certs),
        "l3": dict(job=job, l1_dir=missing, l3_url=f"file://{l3}"),
    }
    for kind, settings in only.items():
        cat = strata.Catalog(**settings)
        assert [k for _, k, _ in cat.tiers()] == [kind], cat.tiers()
        check_rank1(cat, states[1])

    # Damage one of rank 1's chunks on L1 (the second chunk of "w").
    cat = strata.Catalog(**every)
    assert cat.held(5) == {"L1": "committed", "L2:node-b": "committed", "L3": "committed"}
    raw = states[1]["w"].numpy().tobytes()
    chunks = cat.chunks(5, 1, "w")
    assert len(chunks) == 4 and sum(n for _, n in chunks) >= len(raw), chunks
    victim = chunks[1][0]
    damaged = 0
    for root, _, files in os.walk(os.path.join(l1, job)):
        for f in files:
            if victim in f:
                path = os.path.join(root, f)
                data = bytearray(open(path, "rb").read())
                data[100] ^= 0x5A
                open(path, "wb").write(bytes(data))
                damaged += 1
    assert damaged == 1

    l1_only = strata.Catalog(**only["l1"])
    with pytest.raises(strata.CorruptError):
        l1_only.read(5, 1, "w")

    assert cat.read(5, 1, "w", repair=True) == raw
    assert cat.last_read["fallbacks"] == 1 and cat.last_read["repaired"] == 1, cat.last_read
    # The damaged chunk came from the peer, the other three from L1.
    assert cat.last_read["served_by"] == {"L1": 3, "L2:node-b": 1}, cat.last_read

    l1_only = strata.Catalog(**only["l1"])
    assert l1_only.read(5, 1, "w") == raw
    assert l1_only.last_read["fallbacks"] == 0
