"""A rank of the catalog test: saves one step to L1, a peer and L3 (the
tiers come from STRATA_* variables), waits until it is on all three.

Usage: tiers_worker.py JOB OUT_DIR (L1 and the tiers from the environment)
"""

import json
import os
import sys

import torch
import torch.distributed as dist

import strata

job, out = sys.argv[1:3]
dist.init_process_group("gloo")
rank = dist.get_rank()
ckpt = strata.Checkpointer(job=job, chunk_size=1 << 20, upload_every=1, replicas=1)
g = torch.Generator().manual_seed(1234 + rank)
state = {
    "w": torch.randn(3 * (1 << 18) + 77, generator=g),  # ~3 MiB: several chunks
    "b": torch.arange(1000, dtype=torch.int32) * (rank + 1),
}
h = ckpt.save(5, state)
h.wait("l1")
h.wait("peers", timeout=60)
h.wait("l3", timeout=60)
ckpt.close()
torch.save(state, os.path.join(out, f"state-{rank}.pt"))
with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank}, f)
dist.destroy_process_group()
