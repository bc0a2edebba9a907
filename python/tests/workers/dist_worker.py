"""A rank of a multi-process test: torch.distributed (gloo) plus Strata.

Usage: dist_worker.py MODE L1_DIR JOB OUT_DIR
  save    saves steps 1..3, the trainer's own collectives interleaved
  load    loads the newest step and checks every rank's own tensors
  die     saves step 1, then rank 1 is killed in the middle of saving step 2
          while rank 0 waits for step 2 (and reports what it got)
  drop    saves step 1 and drops the checkpointer without closing it
  resume  checks the newest step every rank can restore is 1
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import strata

mode, l1, job, out = sys.argv[1:5]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
timeout = 8 if mode in ("die", "resume") else 60
ckpt = strata.Checkpointer(job=job, l1_dir=l1, chunk_size=1 << 20, coordination_timeout_secs=timeout)
result = {"rank": rank, "world": world, "config_rank": ckpt.rank, "config_world": ckpt.world_size}


def state_for(step):
    return {
        "mine": torch.full((1 << 18,), float(rank * 1000 + step)),
        "shared": torch.arange(1 << 16, dtype=torch.float32),
        "meta": {"step": step, "rank": rank},
    }


if mode == "save":
    handles = []
    for step in (1, 2, 3):
        handles.append(ckpt.save(step, state_for(step)))
        # The trainer's collectives while Strata's commit rounds run behind.
        t = torch.ones(4)
        dist.all_reduce(t)
        assert t.tolist() == [float(world)] * 4
        dist.barrier()
    result["stats"] = [h.wait() for h in handles]
    dist.barrier()
    result["steps"] = ckpt.steps()
elif mode == "load":
    st = ckpt.latest_step()
    got = ckpt.load()
    result["latest"] = st
    result["ok"] = (
        torch.equal(got["mine"], state_for(st)["mine"])
        and torch.equal(got["shared"], state_for(st)["shared"])
        and got["meta"] == {"step": st, "rank": rank}
    )
    into = state_for(0)
    result["load_into"] = ckpt.load_into(into, 2)
    result["into_ok"] = torch.equal(into["mine"], state_for(2)["mine"]) and into["meta"]["step"] == 2
elif mode == "die":
    ckpt.save(1, state_for(1)).wait()
    dist.barrier()
    big = {"mine": torch.randn(64 << 20 >> 2)}
    if rank == 1:
        ckpt.save(2, big)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        ckpt.save(2, big).wait()
        result["error"] = None
    except strata.StrataError as e:
        result["error"] = type(e).__name__
        result["message"] = str(e)
    result["waited_s"] = time.monotonic() - t0
elif mode == "drop":
    # Dropped without close() right after a save: the commit round (which
    # takes the GIL) must still finish while the checkpointer is torn down.
    ckpt.save(1, state_for(1))
    del ckpt
    import gc

    gc.collect()
    ckpt = strata.Checkpointer(job=job, l1_dir=l1, chunk_size=1 << 20, coordination_timeout_secs=timeout)
    result["steps"] = ckpt.steps()
elif mode == "resume":
    result["latest"] = ckpt.latest_step()
    got = ckpt.load()
    result["ok"] = torch.equal(got["mine"], state_for(1)["mine"])
else:
    raise SystemExit(f"unknown mode {mode}")

with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
ckpt.close()
if mode != "die":
    dist.destroy_process_group()
