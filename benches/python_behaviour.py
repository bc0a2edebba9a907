#!/usr/bin/env python3
"""Timings and memory of Strata from Python that a test cannot assert on a
loaded machine (moved here from python/tests/test_behaviour.py):

* memory stays flat over a thousand saves (RSS growth between save 100
  and save 1000, limit 24 MiB);
* the GIL is released while saving and waiting: another Python thread
  keeps running during the snapshot of a 256 MiB state (its longest gap
  under half the save's time) and during the wait (at least one tick per
  5 ms).

    python benches/python_behaviour.py [--dir /tmp/strata-bench]

Prints each measurement with its limit and exits 1 if one is past it.
"""

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

import torch

import strata


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_over_a_thousand_saves(root):
    ckpt = strata.Checkpointer(job="flat", l1_dir=os.path.join(root, "flat"), keep_last=2,
                               chunk_size=1 << 18)
    w = torch.randn(1 << 18)  # 1 MiB
    marks = {}
    for step in range(1, 1001):
        w[step % w.numel()] += 1.0
        h = ckpt.save(step, {"w": w, "step": step, "blob": b"x" * 100})
        if step % 50 == 0:
            h.wait()
        if step in (100, 1000):
            h.wait()
            marks[step] = rss_bytes()
    ckpt.close()
    return marks[1000] - marks[100]


def gil_during_save_and_wait(root):
    ckpt = strata.Checkpointer(job="gil", l1_dir=os.path.join(root, "gil"))
    state = {"w": torch.randn(256 << 20 >> 2)}  # 256 MiB
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.05)
        start = time.perf_counter()
        h = ckpt.save(1, state)
        saved = time.perf_counter()
        h.wait()
        end = time.perf_counter()
    finally:
        stop.set()
        t.join()
    ckpt.close()
    in_save = [x for x in ticks if start <= x <= saved]
    edges = [start] + in_save + [saved]
    longest_gap = max(b - a for a, b in zip(edges, edges[1:]))
    in_wait = len([x for x in ticks if saved <= x <= end])
    return saved - start, longest_gap, end - saved, in_wait


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="where to save (default: a temporary directory)")
    a = ap.parse_args()
    root = a.dir or tempfile.mkdtemp(prefix="strata-behaviour-")
    os.makedirs(root, exist_ok=True)
    failed = False
    try:
        grown = memory_over_a_thousand_saves(root)
        ok = grown < 24 << 20
        failed |= not ok
        print(f"RSS growth over saves 100..1000: {grown / (1 << 20):.1f} MiB "
              f"(limit 24 MiB) {'ok' if ok else 'OVER'}")
        save_s, gap_s, wait_s, in_wait = gil_during_save_and_wait(root)
        told = save_s > 0.02
        print(f"save call {save_s * 1e3:.1f} ms, other thread's longest gap in it "
              f"{gap_s * 1e3:.1f} ms ({gap_s / save_s:.2f} of it, limit 0.5)"
              + ("" if told else " (too short to tell)"))
        ok = not told or gap_s < 0.5 * save_s
        failed |= not ok
        per_5ms = in_wait / max(wait_s * 200, 1e-9)
        print(f"wait {wait_s * 1e3:.1f} ms, other thread's ticks {in_wait} "
              f"({per_5ms:.2f} per 5 ms, limit 1)")
        ok2 = in_wait >= 0.2 * wait_s * 1000
        failed |= not ok2
        print("GIL released while saving and waiting:", "ok" if ok and ok2 else "NO")
    finally:
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
