"""``dcp.load`` of a step that only L3 holds (a node replaced, its peers
gone) against raw parallel ranged GETs of the same number of bytes, on a
local s3s-fs (authenticated S3 on loopback), in one process.

The state (``--size``, float32 tensors of 32 MiB) is saved once with
``dcp.save`` through Strata and uploaded; each load then opens a new
``StorageReader`` on an empty L1 directory, so every byte comes from L3
(checked: the reader's ``served_by``), decoded and verified, into tensors
allocated and touched before. The baseline PUTs one object of the same size and GETs
it in 8 MiB ranges on 16 connections at once (Strata's L3 concurrency)
into one buffer, signed with AWS SigV4 by the standard library alone.
Both are taken ``--reps`` times, alternating; medians are reported.

    python benches/dcp_l3_bench.py [--size 1GiB] [--reps 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import http.client
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List

import torch
import torch.distributed.checkpoint as dcp

import strata
from strata.dcp import StorageReader, StorageWriter

KEY, SECRET, REGION, BUCKET = "bench-key", "bench-secret", "us-east-1", "bench"
RANGE = 8 << 20
CONNECTIONS = 16


def _size(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    t = text.strip().lower()
    for u, m in units.items():
        if t.endswith(u):
            return int(float(t[: -len(u)]) * m)
    return int(t)


def _signed(method: str, host: str, path: str, extra: Dict[str, str]) -> Dict[str, str]:
    """Headers of a SigV4-signed request with an unsigned payload."""
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {"host": host, "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [method, path, "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed, "UNSIGNED-PAYLOAD"]
    )
    scope = f"{day}/{REGION}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = ("AWS4" + SECRET).encode()
    for part in (day, REGION, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = f"AWS4-HMAC-SHA256 Credential={KEY}/{scope}, SignedHeaders={signed}, Signature={sig}"
    headers.update(extra)
    return headers


def _raw_put(port: int, path: str, data: memoryview) -> None:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    h = _signed("PUT", f"127.0.0.1:{port}", path, {"Content-Length": str(len(data))})
    c.request("PUT", path, body=data, headers=h)
    r = c.getresponse()
    r.read()
    if r.status != 200:
        raise RuntimeError(f"raw PUT: HTTP {r.status}")
    c.close()


def _raw_get(port: int, path: str, dst: memoryview) -> float:
    """GETs the object in RANGE pieces on CONNECTIONS connections into
    ``dst``; returns the seconds taken."""
    n = len(dst)
    pieces = [(a, min(a + RANGE, n)) for a in range(0, n, RANGE)]
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=300) for _ in range(CONNECTIONS)]

    def lane(i: int) -> None:
        c = conns[i]
        for a, b in pieces[i::CONNECTIONS]:
            h = _signed("GET", f"127.0.0.1:{port}", path, {"Range": f"bytes={a}-{b - 1}"})
            c.request("GET", path, headers=h)
            r = c.getresponse()
            if r.status != 206:
                raise RuntimeError(f"raw GET: HTTP {r.status}")
            at = a
            while at < b:
                got = r.readinto(dst[at:b])
                if not got:
                    raise RuntimeError("raw GET: short body")
                at += got
            r.read()

    t = time.perf_counter()
    with ThreadPoolExecutor(CONNECTIONS) as pool:
        list(pool.map(lane, range(CONNECTIONS)))
    took = time.perf_counter() - t
    for c in conns:
        c.close()
    return took


def _server(root: str) -> "tuple[subprocess.Popen, int]":
    exe = shutil.which("s3s-fs") or os.path.join(os.path.dirname(__file__), "..", ".tools", "bin", "s3s-fs")
    os.makedirs(os.path.join(root, BUCKET), exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen(
        [exe, "--host", "127.0.0.1", "--port", str(port), "--access-key", KEY, "--secret-key", SECRET, root],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p, port
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError("s3s-fs did not start (benches/l3-bench.sh installs it)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    size = _size(a.size)
    work = tempfile.mkdtemp(prefix="dcp-l3-bench-", dir=a.dir)
    srv, port = _server(os.path.join(work, "s3"))
    try:
        opts = {"endpoint": f"http://127.0.0.1:{port}", "allow_http": "true", "region": REGION,
                "access_key_id": KEY, "secret_access_key": SECRET}
        common = dict(job="dcp-l3-bench", l3_url=f"s3://{BUCKET}/strata", l3_options=opts)
        g = torch.Generator().manual_seed(7)
        per = 8 << 20  # float32 elements: 32 MiB per tensor
        state = {f"layers.{i}.weight": torch.randn(per, generator=g) for i in range(max(1, size // (per * 4)))}
        total = sum(t.numel() * t.element_size() for t in state.values())
        dcp.save(state, checkpoint_id=1, storage_writer=StorageWriter(l1_dir=os.path.join(work, "l1"), **common))
        ck = strata.Checkpointer(l1_dir=os.path.join(work, "l1"), **common)
        ck.upload(1)
        ck.flush()
        ck.close()
        raw_path = f"/{BUCKET}/raw/object"
        src = torch.randint(0, 255, (total,), dtype=torch.uint8, generator=g)
        _raw_put(port, raw_path, memoryview(src.numpy()))
        # Destinations allocated and touched before: no sample pays the
        # first touch of its memory.
        raw_dst = torch.zeros(total, dtype=torch.uint8)
        dst = {k: torch.zeros_like(v) for k, v in state.items()}
        strata_s: List[float] = []
        raw_s: List[float] = []
        for _ in range(a.reps):
            empty = tempfile.mkdtemp(dir=work)
            r = StorageReader(checkpoint_id=1, l1_dir=empty, **common)
            t = time.perf_counter()
            dcp.load(dst, storage_reader=r)
            strata_s.append(time.perf_counter() - t)
            served = r.last_read["served_by"]
            if set(served) != {"L3"}:
                raise RuntimeError(f"the load was served by {served}, not L3 alone")
            if not all(torch.equal(dst[k], state[k]) for k in state):
                raise RuntimeError("the load from L3 differs from the state saved")
            shutil.rmtree(empty)
            raw_s.append(_raw_get(port, raw_path, memoryview(raw_dst.numpy())))
            if not torch.equal(raw_dst, src):
                raise RuntimeError("the raw GETs differ from the object put")
        s, b = statistics.median(strata_s), statistics.median(raw_s)
        print(f"dcp-l3-bench: {total / 2**30:.2f} GiB in {len(state)} tensors, medians of {a.reps}")
        print(f"  dcp.load from L3 alone   {s:.3f} s ({total / s / 1e9:.2f} GB/s)   samples {[round(x, 3) for x in strata_s]}")
        print(f"  raw ranged GETs (8 MiB x {CONNECTIONS})  {b:.3f} s ({total / b / 1e9:.2f} GB/s)   samples {[round(x, 3) for x in raw_s]}")
        print(f"  ratio (raw time / Strata time) {b / s:.2f}")
        return 0
    finally:
        srv.terminate()
        srv.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
