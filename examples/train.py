#!/usr/bin/env python3
"""A small model trained on the CPU, checkpointed with Strata, resumable.

Kill it at any moment (kill -9) and run it again: it resumes from the
newest step every rank committed, and its loss curve equals an
uninterrupted run's bit for bit (the model, the optimizer, every RNG and
the data loader's position are in the checkpoint).

    python examples/train.py --dir /tmp/run --steps 300 --every 20
    torchrun --nproc-per-node 2 examples/train.py --dir /tmp/run2
    srun -n 2 python examples/train.py --dir /tmp/run3                 # under Slurm
    python examples/train.py --dir /tmp/run --l3 file:///tmp/run-l3   # + L3
    STRATA_PEERS=... STRATA_PEER_CERTS=... python examples/train.py    # + peers

Each line of <dir>/loss-rank<R>.txt is "step loss" (loss as a float hex);
a resumed run rewrites the steps after the checkpoint it resumed from.
"""

import argparse
import os
import random
import subprocess

import numpy as np
import torch
import torch.distributed as dist

import strata


class Loader:
    """A deterministic, resumable loader over a synthetic regression set:
    each epoch is a permutation drawn from (seed, epoch); its state is the
    epoch and the position in it."""

    def __init__(self, n, batch, seed, rank, world):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 32, generator=g)
        w = torch.randn(32, 1, generator=g)
        self.y = torch.sin(self.x @ w) + 0.1 * torch.randn(n, 1, generator=g)
        self.batch, self.seed, self.rank, self.world = batch, seed, rank, world
        self.epoch, self.pos = 0, 0

    def next(self):
        perm = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(self.seed * 1000 + self.epoch))
        mine = perm[self.rank :: self.world]
        if self.pos + self.batch > len(mine):
            self.epoch, self.pos = self.epoch + 1, 0
            return self.next()
        idx = mine[self.pos : self.pos + self.batch]
        self.pos += self.batch
        return self.x[idx], self.y[idx]

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s):
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])


def launcher():
    """``(rank, world, init_method)`` of this process: from torchrun
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``), else from
    srun (``SLURM_PROCID``, ``SLURM_NTASKS``; the rendezvous on the
    step's first node, ``MASTER_ADDR``/``MASTER_PORT`` if set, else a port
    derived from ``SLURM_JOB_ID``), else a world of one (None). A batch
    script's own shell has ``SLURM_PROCID=0`` and the job's
    ``SLURM_NTASKS`` too, but no ``SLURM_STEP_ID``: run there without
    srun, this is one process, not rank 0 of the job."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1")), "env://"
    if "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ:
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        addr = os.environ.get("MASTER_ADDR")
        if addr is None and world > 1:
            # The step's first node, where SLURM_PROCID 0 runs.
            nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ["SLURM_JOB_NODELIST"]
            out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True,
                                 text=True, check=True).stdout
            addr = out.split()[0]
        port = os.environ.get("MASTER_PORT") or str(15000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 15000)
        return rank, world, f"tcp://{addr}:{port}"
    return 0, 1, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="strata-train", help="L1 directory and loss logs")
    ap.add_argument("--job", default="train-example")
    ap.add_argument("--config", default=None,
                    help="a strata.toml (peers, peer_certs, l3_url, keep_last, ...); STRATA_* and the flags here win")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=20, help="checkpoint every N steps")
    ap.add_argument("--l3", default=None, help="object storage URL for L3 (s3://, file://, ...)")
    ap.add_argument("--upload-every", type=int, default=2, help="every K-th checkpoint goes to L3")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (to have time to kill it)")
    args = ap.parse_args()

    torch.set_num_threads(1)  # bit-for-bit: one summation order
    rank, world, init_method = launcher()
    distributed = world > 1
    if distributed:
        # Strata's checkpointer takes rank and world from the process
        # group and agrees through its store (it also reads SLURM_LOCALID,
        # SLURM_NTASKS_PER_NODE, SLURM_NODEID and SLURM_RESTART_COUNT).
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Linear(128, 1),
    )
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    loader = Loader(4096, 64, args.seed, rank, world)

    # Rank and world said outright: Strata would otherwise also read the
    # launcher's variables (SLURM_PROCID/SLURM_NTASKS of a batch shell).
    settings = dict(job=args.job, l1_dir=os.path.join(args.dir, "l1"), rank=rank, world_size=world)
    if args.config is None:
        settings.update(keep_last=2, chunk_size=1 << 20)
    if args.l3:
        settings.update(l3_url=args.l3, upload_every=args.every * args.upload_every)
    os.makedirs(args.dir, exist_ok=True)
    log_path = os.path.join(args.dir, f"loss-rank{rank}.txt")

    with strata.Checkpointer(args.config, **settings) as ckpt:

        def state():
            return {
                "model": model.state_dict(),
                "optim": opt.state_dict(),
                "loader": loader.state_dict(),
                "rng": {
                    "torch": torch.get_rng_state(),
                    "python": random.getstate(),
                    "numpy": np.random.get_state(),
                },
            }

        start = 0
        if ckpt.latest_step() is not None:
            s = state()
            start = ckpt.load_into(s)
            opt.load_state_dict(s["optim"])
            loader.load_state_dict(s["loader"])
            torch.set_rng_state(s["rng"]["torch"])
            random.setstate(s["rng"]["python"])
            np.random.set_state(s["rng"]["numpy"])
            print(f"rank {rank}: resumed from step {start}", flush=True)
        # Keep the log up to the resumed step: the rest is recomputed.
        lines = []
        if os.path.exists(log_path):
            with open(log_path) as f:
                lines = [ln for ln in f if int(ln.split()[0]) <= start]
        with open(log_path, "w") as f:
            f.writelines(lines)

        model.train()
        with open(log_path, "a") as log:
            for step in range(start + 1, args.steps + 1):
                x, y = loader.next()
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                log.write(f"{step} {loss.item().hex()}\n")
                log.flush()
                if step % args.every == 0:
                    ckpt.save(step, state())
                if args.step_sleep:
                    import time

                    time.sleep(args.step_sleep)
        ckpt.flush()
        print(f"rank {rank}: trained to step {args.steps}; steps held: {ckpt.steps()}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
