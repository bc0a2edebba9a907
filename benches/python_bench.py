#!/usr/bin/env python3
"""Strata from Python against torch.save and PyTorch DCP, same state, same run.

The state is a transformer's weights and its AdamW state (fp32 params,
exp_avg, exp_avg_sq, step counters), --size GiB in all. Each method saves
it --reps times into its own directory on the same disk and loads it back:

* training blocked per save: how long the call stops the training loop,
  against a memcpy of the whole state into preallocated memory;
* time to durable: from the call until the bytes are fsynced (Strata: the
  step committed on L1);
* time to load: back into memory (Strata and DCP fill the existing tensors
  in place; torch.load allocates).

Strata's priority load is printed after the table: load_into(state,
first="model") returns once the weights are in place (a third of the
bytes), the optimizer state is read behind them, and wait() fills it in.

    python benches/python_bench.py --dir /work/bench-py --size 2 --reps 2

With --device cuda the state lives on the GPU: the memcpy baseline is a
device-to-host copy into pinned memory, every method saves from and loads
back to the GPU (torch.load with map_location), and each timer stops after
the device is synchronized.

Page cache: between writing and reading, each method's files are evicted
(posix_fadvise DONTNEED after an fsync) where the OS allows, so loads read
the disk; Strata's L1 reads use O_DIRECT anyway.
"""

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch


DEVICE = "cpu"


def sync():
    if DEVICE != "cpu":
        torch.cuda.synchronize()


def transformer_state(total_bytes):
    """Weights + AdamW state of a GPT-like stack, about `total_bytes`, on DEVICE."""
    d = 2048
    per_layer = 12 * d * d + 13 * d  # attention + MLP weights and biases/norms
    layers = max(1, int(total_bytes / 3 / 4 / per_layer))
    with torch.device(DEVICE):
        return _transformer_state(d, layers)


def _transformer_state(d, layers):
    g = torch.Generator(device=DEVICE).manual_seed(0)
    params = {}
    for i in range(layers):
        p = f"layers.{i}."
        params[p + "attn.qkv.weight"] = torch.randn(3 * d, d, generator=g)
        params[p + "attn.qkv.bias"] = torch.randn(3 * d, generator=g)
        params[p + "attn.out.weight"] = torch.randn(d, d, generator=g)
        params[p + "attn.out.bias"] = torch.randn(d, generator=g)
        params[p + "mlp.up.weight"] = torch.randn(4 * d, d, generator=g)
        params[p + "mlp.up.bias"] = torch.randn(4 * d, generator=g)
        params[p + "mlp.down.weight"] = torch.randn(d, 4 * d, generator=g)
        params[p + "mlp.down.bias"] = torch.randn(d, generator=g)
        params[p + "norm1.weight"] = torch.ones(d)
        params[p + "norm2.weight"] = torch.ones(d)
    optim = {
        "state": {
            i: {"step": torch.tensor(100.0), "exp_avg": torch.randn_like(t), "exp_avg_sq": torch.rand_like(t)}
            for i, t in enumerate(params.values())
        },
        "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
                          "params": list(range(len(params)))}],
    }
    return {"model": params, "optim": optim, "step": 100}


def tensors(state):
    out = []
    stack = [state]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return out


def nbytes(state):
    return sum(t.numel() * t.element_size() for t in tensors(state))


def perturb(state, k):
    # A training step changes every weight: no method may reuse old bytes.
    for t in tensors(state):
        if t.is_floating_point():
            t.add_(1e-3 * (k + 1))
    sync()


def evict(path):
    """Drops `path`'s files from the page cache (fsync first)."""
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            try:
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            except OSError:
                pass


def fsync_tree(path):
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fd = os.open(root, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def bench_memcpy(state, reps):
    # On a GPU: device to pinned host memory, what any snapshot must move.
    src = tensors(state)
    dst = [torch.empty_like(t, device="cpu", pin_memory=DEVICE != "cpu") for t in src]
    for d, s in zip(dst, src):
        d.copy_(s)  # fault the destination in: a warm copy
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for d, s in zip(dst, src):
            d.copy_(s, non_blocking=DEVICE != "cpu")
        sync()
        times.append(time.perf_counter() - t0)
    return {"blocked": min(times)}


def bench_torch_save(state, reps, root):
    out = {"blocked": [], "durable": [], "load": []}
    for r in range(reps):
        perturb(state, r)
        path = os.path.join(root, f"torch-{r}.pt")
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        dt = time.perf_counter() - t0
        out["blocked"].append(dt)
        out["durable"].append(dt)
        evict(root)
        t0 = time.perf_counter()
        back = torch.load(path, weights_only=True, map_location=DEVICE)
        sync()
        out["load"].append(time.perf_counter() - t0)
        del back
        gc.collect()
        os.remove(path)
    return out


def bench_dcp(state, reps, root, asynchronous):
    import torch.distributed.checkpoint as dcp

    out = {"blocked": [], "durable": [], "load": []}
    for r in range(reps):
        perturb(state, r)
        path = os.path.join(root, f"dcp-{'async' if asynchronous else 'sync'}-{r}")
        t0 = time.perf_counter()
        if asynchronous:
            fut = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=True))
            out["blocked"].append(time.perf_counter() - t0)
            fut.result()
        else:
            dcp.save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=True))
            out["blocked"].append(time.perf_counter() - t0)
        out["durable"].append(time.perf_counter() - t0)
        evict(path)
        t0 = time.perf_counter()
        dcp.load(state, storage_reader=dcp.FileSystemReader(path))
        sync()
        out["load"].append(time.perf_counter() - t0)
        shutil.rmtree(path)
        gc.collect()
    return out


def bench_strata(state, reps, root):
    import strata

    out = {"blocked": [], "durable": [], "load": [], "load_fresh": [], "first_usable": [], "priority_load": []}
    with strata.Checkpointer(job="bench", l1_dir=os.path.join(root, "strata"), keep_last=1) as ckpt:
        # Once, before training: the staging memory is faulted in here, not
        # in the first save.
        t0 = time.perf_counter()
        ckpt.prepare(state)
        out["prepare"] = time.perf_counter() - t0
        for r in range(reps):
            perturb(state, r)
            t0 = time.perf_counter()
            h = ckpt.save(r + 1, state)
            out["blocked"].append(time.perf_counter() - t0)
            out.setdefault("rust_stall", []).append(h.stall_s)
            h.wait()
            out["durable"].append(time.perf_counter() - t0)
            evict(os.path.join(root, "strata"))
            t0 = time.perf_counter()
            ckpt.load_into(state)
            sync()
            out["load"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            back = ckpt.load(device=DEVICE if DEVICE != "cpu" else None)
            sync()
            out["load_fresh"].append(time.perf_counter() - t0)
            del back
            gc.collect()
            # Priority load: the weights first (training can start its
            # forward passes), the optimizer state behind them.
            evict(os.path.join(root, "strata"))
            t0 = time.perf_counter()
            loading = ckpt.load_into(state, first="model")
            sync()
            out["first_usable"].append(time.perf_counter() - t0)
            loading.wait()
            sync()
            out["priority_load"].append(time.perf_counter() - t0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary directory)")
    ap.add_argument("--size", type=float, default=2.0, help="GiB of state")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", default="cpu", help="where the state lives: cpu or cuda")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    root = args.dir or tempfile.mkdtemp(prefix="strata-pybench-")
    os.makedirs(root, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)

    import torch.distributed as dist

    if not dist.is_initialized():
        # DCP's async_save wants a process group: a world of one.
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)

    state = transformer_state(int(args.size * (1 << 30)))
    size = nbytes(state)
    print(f"state: {size / (1 << 30):.2f} GiB in {len(tensors(state))} tensors on {DEVICE}; "
          f"{args.reps} reps; dir {root}",
          file=sys.stderr)
    res = {"memcpy": bench_memcpy(state, args.reps)}
    res["torch.save+fsync"] = bench_torch_save(state, args.reps, root)
    res["dcp sync"] = bench_dcp(state, args.reps, root, False)
    res["dcp async_save"] = bench_dcp(state, args.reps, root, True)
    res["strata"] = bench_strata(state, args.reps, root)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)

    def best(m, k):
        v = res[m].get(k)
        return min(v) if isinstance(v, list) else v

    memcpy = best("memcpy", "blocked")
    ts_durable = best("torch.save+fsync", "durable")
    ts_load = best("torch.load" if "torch.load" in res else "torch.save+fsync", "load")
    rows = []
    for m in ["torch.save+fsync", "dcp sync", "dcp async_save", "strata"]:
        b, d, l = best(m, "blocked"), best(m, "durable"), best(m, "load")
        rows.append((m, b, b / memcpy, d, d / ts_durable, l, l / ts_load))
    if args.json:
        print(json.dumps({"bytes": size, "memcpy_s": memcpy, "raw": res}, default=float))
    gib = size / (1 << 30)
    print(f"\n{gib:.2f} GiB state; best of {args.reps}; memcpy of the state {memcpy:.3f} s "
          f"({gib / memcpy:.2f} GiB/s)\n")
    print("| method | blocked per save | × memcpy | time to durable | × torch.save | time to load | × torch.load |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m, b, br, d, dr, l, lr in rows:
        print(f"| {m} | {b:.3f} s | {br:.2f} | {d:.3f} s | {dr:.2f} | {l:.3f} s | {lr:.2f} |")
    fresh = min(res["strata"]["load_fresh"])
    print(f"\nstrata load() into new tensors: {fresh:.3f} s ({fresh / ts_load:.2f} × torch.load); "
          "the table's strata load is load_into (in place, as DCP loads).")
    first, whole = min(res["strata"]["first_usable"]), min(res["strata"]["priority_load"])
    model = nbytes({"m": state["model"]}) / size
    print(f"strata load_into(first=\"model\"): the weights ({model:.0%} of the bytes) in place after {first:.3f} s "
          f"({first / best('strata', 'load'):.2f} × the whole load_into), everything after {whole:.3f} s.")


if __name__ == "__main__":
    main()
