#!/usr/bin/env python3
"""A torchtitan-style loop: FSDP2 (``fully_shard``) on the CPU with gloo,
AdamW, a warmup + cosine learning-rate schedule and a resumable data
loader, checkpointed with ``dcp.async_save`` through Strata.

Kill it at any moment (kill -9, every rank) and run it again, with the
same number of ranks or another: it resumes from the newest step every
rank committed (DCP's reader reshards FSDP's shards to the new world).
With the same number of ranks its loss curve equals an uninterrupted
run's bit for bit; with another, the same data in the same order, summed
in another order.

    torchrun --nproc-per-node 4 examples/train_fsdp_dcp.py --dir /tmp/titan
    torchrun --nproc-per-node 2 examples/train_fsdp_dcp.py --dir /tmp/titan   # resumes at 2

Each line of <dir>/loss.txt (written by rank 0) is "step loss", the loss
of the global batch as a float hex; a resumed run rewrites the steps after
the checkpoint it resumed from.
"""

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

import strata
from strata.dcp import StorageReader, StorageWriter


class Loader:
    """A deterministic, resumable loader over a synthetic regression set.
    Each step takes the next global batch of an epoch's permutation; a rank
    trains on its slice of it. Its state (epoch, position) is the same on
    every rank, so it is saved once and fits any world size."""

    def __init__(self, n, batch, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 32, generator=g)
        w = torch.randn(32, 1, generator=g)
        self.y = torch.sin(self.x @ w) + 0.1 * torch.randn(n, 1, generator=g)
        self.batch, self.seed = batch, seed
        self.epoch, self.pos = 0, 0

    def next(self, rank, world):
        if self.pos + self.batch > len(self.x):
            self.epoch, self.pos = self.epoch + 1, 0
        perm = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(self.seed * 1000 + self.epoch))
        idx = perm[self.pos : self.pos + self.batch]
        self.pos += self.batch
        mine = idx[rank::world]
        return self.x[mine], self.y[mine]

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s):
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])


def schedule(warmup, total):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return f


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="strata-titan", help="L1 directory and the loss log")
    ap.add_argument("--job", default="titan-example")
    ap.add_argument("--steps", type=int, default=200, help="train up to this step")
    ap.add_argument("--horizon", type=int, default=200, help="the LR schedule's length (steps)")
    ap.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (to have time to kill it)")
    args = ap.parse_args()

    torch.set_num_threads(1)  # bit for bit: one summation order
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Linear(128, 1)
    )
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(20, args.horizon))
    loader = Loader(4096, 64, args.seed)

    settings = dict(job=args.job, l1_dir=os.path.join(args.dir, "l1"), keep_last=3)
    os.makedirs(args.dir, exist_ok=True)
    log_path = os.path.join(args.dir, "loss.txt")

    def state():
        msd, osd = get_state_dict(model, opt)
        return {"model": msd, "optim": osd, "sched": sched.state_dict(), "loader": loader.state_dict(), "step": 0}

    start = 0
    if strata.Catalog(**settings).decided_steps():
        s = state()
        reader = StorageReader(**settings)
        dcp.load(s, storage_reader=reader)
        set_state_dict(model, opt, model_state_dict=s["model"], optim_state_dict=s["optim"])
        sched.load_state_dict(s["sched"])
        loader.load_state_dict(s["loader"])
        start = int(s["step"])
        if rank == 0:
            print(f"resumed from step {start} (saved by {strata.Catalog(**settings).world_size(start)} ranks, "
                  f"running {world})", flush=True)
    if rank == 0:
        # Keep the log up to the resumed step: the rest is recomputed.
        lines = []
        if os.path.exists(log_path):
            with open(log_path) as f:
                lines = [ln for ln in f if int(ln.split()[0]) <= start]
        with open(log_path, "w") as f:
            f.writelines(lines)

    writer = StorageWriter(**settings)
    # DCP's collectives of an async save run on a thread of their own: on a
    # process group of their own too, never interleaved with training's.
    ckpt_group = dist.new_group(backend="gloo")
    pending = None
    log = open(log_path, "a") if rank == 0 else None
    for step in range(start + 1, args.steps + 1):
        x, y = loader.next(rank, world)
        opt.zero_grad(set_to_none=True)
        # Each rank's share of the global batch's mean squared error.
        loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum") / loader.batch
        loss.backward()
        opt.step()
        sched.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if log is not None:
            log.write(f"{step} {total.item().hex()}\n")
            log.flush()
        if step % args.every == 0:
            if pending is not None:
                pending.result()  # the staging buffers are reused
            s = state()
            s["step"] = step
            pending = dcp.async_save(s, checkpoint_id=step, storage_writer=writer, process_group=ckpt_group)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if pending is not None:
        pending.result()
    writer.close()
    if log is not None:
        log.close()
        print(f"trained to step {args.steps}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
