"""A rank of the multi-node test (torchrun per node, each node in its own
network namespace with its own peer service): Strata configured from the
test bed's TOML (peers, L3), ranks agreeing through torch.distributed.

Usage: node_worker.py MODE CONFIG L1_DIR NODE NODE_ADDR OUT_DIR
  save    saves steps 1..3 and waits until each is on its peers
  resume  loads the newest step; reports where its bytes came from
"""

import json
import os
import subprocess
import sys

mode, config, l1, node, addr, out = sys.argv[1:7]


def interface_of(address):
    """The network interface holding `address` (gloo must use it: in a
    namespace the host name does not resolve to the node's address)."""
    text = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3].split("/")[0] == address:
            return parts[1]
    return "lo"


os.environ.setdefault("GLOO_SOCKET_IFNAME", interface_of(addr))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import strata  # noqa: E402

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
# The ranks agree through torch.distributed here, not through the test
# bed's etcd.
ckpt = strata.Checkpointer(config, l1_dir=l1, node=node, etcd_endpoints=[], coordination_timeout_secs=60)


def state_for(step):
    return {
        "mine": torch.full((1 << 18,), float(rank * 1000 + step)),
        "dp": torch.arange(1 << 18, dtype=torch.float32) * step,
        "meta": {"step": step, "rank": rank, "node": node},
    }


result = {"rank": rank, "world": world, "node": node}
if mode == "save":
    for step in (1, 2, 3):
        h = ckpt.save(step, state_for(step))
        result.setdefault("stats", []).append(h.wait("peers", timeout=120))
        dist.barrier()
elif mode == "resume":
    st = ckpt.latest_step()
    got = ckpt.load()
    want = state_for(st)
    result["latest"] = st
    result["ok"] = (
        torch.equal(got["mine"], want["mine"])
        and torch.equal(got["dp"], want["dp"])
        and got["meta"] == want["meta"]
    )
    result["restore"] = ckpt.last_restore
else:
    raise SystemExit(f"unknown mode {mode}")

with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
ckpt.close()
dist.destroy_process_group()
