#!/usr/bin/env python3
"""ZipNN on the same real weights format-bench uses, for a side-by-side figure.

    pip install zipnn numpy          # note: zipnn depends on torch
    python3 benches/zipnn_compare.py [benches/data/model.safetensors] [--threads N]

Prints ratio, compress and decompress GB/s for fp32 and bf16 (bf16 made from
the fp32 weights by round-to-nearest-even, as format-bench does), best of 3.
"""
import json
import struct
import sys
import time

import numpy as np
import zipnn


def load_f32(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    spans = sorted(
        tuple(v["data_offsets"])
        for k, v in header.items()
        if k != "__metadata__" and v["dtype"] == "F32"
    )
    return b"".join(data[a:b] for a, b in spans)


def to_bf16(f32_bytes):
    u = np.frombuffer(f32_bytes, dtype=np.uint32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).tobytes()


def best(f, reps=3):
    t_best, out = None, None
    for _ in range(reps):
        t = time.perf_counter()
        out = f()
        d = time.perf_counter() - t
        t_best = d if t_best is None else min(t_best, d)
    return t_best, out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    threads = 0
    if "--threads" in sys.argv:
        threads = int(sys.argv[sys.argv.index("--threads") + 1])
    path = args[0] if args else "benches/data/model.safetensors"
    f32 = load_f32(path)
    bf16 = to_bf16(f32)
    print(f"# zipnn {getattr(zipnn, '__version__', '?')}, threads={threads or 'default'}, best of 3")
    print("| data | tool | ratio | compress GB/s | decompress GB/s |")
    print("|---|---|---|---|---|")
    for name, data, dtype in (("fp32 weights", f32, "float32"), ("bf16 weights", bf16, "bfloat16")):
        z = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=threads)
        tc, comp = best(lambda: z.compress(data))
        td, back = best(lambda: z.decompress(comp))
        # ZipNN 0.5.4 in byte mode hands back its sign-bit-reordered bytes
        # (seen here): report whether the round trip was exact.
        exact = "exact" if bytes(back) == data else "NOT exact"
        gb = len(data) / 1e9
        print(f"| {name} | ZipNN ({exact} round trip) | {len(data) / len(comp):.3f} | {gb / tc:.2f} | {gb / td:.2f} |")


if __name__ == "__main__":
    main()
