#!/usr/bin/env python3
"""The safetensors baseline for l1-bench: durable save and cold load.

Usage: safetensors_baseline.py SRC.safetensors OUT.safetensors REPS

Loads SRC once (untimed) to get the tensors as numpy arrays, then REPS times:
  save: safetensors.numpy.save_file(tensors, OUT) + fsync (durable, as a
        checkpoint must be);
  load: evict OUT from the page cache (posix_fadvise DONTNEED, as after a
        node restart), then safetensors.numpy.load_file(OUT).
Prints JSON: {"save_s": [...], "load_s": [...], "bytes": N, versions}.
"""
import json
import os
import sys
import time

import numpy
import safetensors
from safetensors.numpy import load_file, save_file


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main():
    src, out, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tensors = load_file(src)
    total = sum(a.nbytes for a in tensors.values())
    saves, loads = [], []
    for _ in range(reps):
        if os.path.exists(out):
            os.remove(out)
        t = time.perf_counter()
        save_file(tensors, out)
        fd = os.open(out, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        saves.append(time.perf_counter() - t)
        evict(out)
        t = time.perf_counter()
        back = load_file(out)
        loads.append(time.perf_counter() - t)
        if sum(a.nbytes for a in back.values()) != total:
            sys.exit("load_file returned a different number of bytes")
        del back
    print(json.dumps({
        "save_s": saves,
        "load_s": loads,
        "bytes": total,
        "safetensors": safetensors.__version__,
        "numpy": numpy.__version__,
    }))


if __name__ == "__main__":
    main()
