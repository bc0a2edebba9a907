"""A rank of the roll-forward test: its own L1 (a node of its own), ranks
agreeing through torch.distributed's store, and one rank's process killed
at a point of step 3's commit.

Usage: split_worker.py PHASE ROOT JOB KEEP [KILL_AT]
  save    saves steps 1 and 2, then step 3; with KILL_AT (before-vote,
          after-vote, after-record) this process dies there (os._exit)
  resume  loads the newest step, checks its bytes, saves the next one and
          checks it is the newest
Writes ROOT/rank<r>-<phase>.json.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

import strata
import strata._dist as sdist

phase, root, job, keep = sys.argv[1:5]
kill = sys.argv[5] if len(sys.argv) > 5 else None
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
commit3 = f"commit/{job}/3"

if kill in ("before-vote", "after-vote"):
    # The store round of this rank's vote on step 3: the process dies just
    # before it, or just after it (the vote reached the store). Every round
    # this rank takes part in is one `StoreGather._round`, or one
    # `NodeRounds.reduce` where its node's ranks meet first (the launcher's
    # LOCAL_RANK and LOCAL_WORLD_SIZE say where it sits).
    def dying(original):
        def round_(self, r, key, value, timeout_s, combine):
            if key == commit3 and kill == "before-vote":
                os._exit(9)
            got = original(self, r, key, value, timeout_s, combine)
            if key == commit3:
                os._exit(9)
            return got

        return round_

    sdist.StoreGather._round = dying(sdist.StoreGather._round)
    sdist.NodeRounds.reduce = dying(sdist.NodeRounds.reduce)

ckpt = strata.Checkpointer(job=job, l1_dir=os.path.join(root, f"node-{rank}"), chunk_size=1 << 16,
                           keep_last=int(keep), gc_grace_secs=0, coordination_timeout_secs=6)


def state_for(step):
    return {"w": torch.full((1 << 15,), float(rank * 1000 + step)), "step": step}


result = {"rank": rank}
if phase == "save":
    ckpt.save(1, state_for(1)).wait()
    ckpt.save(2, state_for(2)).wait()
    try:
        ckpt.save(3, state_for(3)).wait()
        result["saved3"] = True
    except strata.StrataError as e:
        result["saved3"] = False
        result["error"] = type(e).__name__
    if kill == "after-record":
        os._exit(9)
else:
    latest = ckpt.latest_step()
    got = ckpt.load()
    result["latest"] = latest
    result["ok"] = torch.equal(got["w"], state_for(latest)["w"]) and got["step"] == latest
    ckpt.save(latest + 1, state_for(latest + 1)).wait()
    result["then"] = ckpt.latest_step()
ckpt.close()
with open(os.path.join(root, f"rank{rank}-{phase}.json"), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
