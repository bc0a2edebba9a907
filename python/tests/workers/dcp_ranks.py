"""Ranks of the DCP tests, run with torch.multiprocessing.spawn (gloo on
CPU, one process per rank). Each function is ``fn(rank, world, port, args)``
and writes what it found to ``args["out"]/<name>-<rank>.json`` (the test
reads them; an exception in a rank fails spawn)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict


def run_world(world: int, fn: Any, args: Dict[str, Any], timeout: float = 240.0) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(fn, args=(world, port, args), nprocs=world, join=False, start_method="spawn")
    import time

    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"{fn.__name__} at world {world} did not finish in {timeout} s")


def _init(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world)
    os.environ["LOCAL_RANK"] = str(rank)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _done(args: Dict[str, Any], name: str, rank: int, found: Any) -> None:
    """Writes what the rank found and ends the rank's process: the last
    thing every rank function does."""
    with open(os.path.join(args["out"], f"{name}-{rank}.json"), "w") as f:
        json.dump(found, f)
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    # About one exit in 40 here, after every rank wrote its result, a
    # rank died at interpreter exit with "terminate called without an
    # active exception" (a C++ thread still joinable when static
    # destructors run: torch's, not Strata's, whose native module links
    # no C++ runtime). Python's exit handlers run (Strata closes its
    # checkpointers there), then the process ends without the C++ ones.
    import atexit
    import sys

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def global_tensors(seed: int = 7) -> Dict[str, Any]:
    """The global values every test saves: shapes that split unevenly."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "emb": torch.randn(37, 24, generator=g),
        "w": torch.randn(16, 10, generator=g).to(torch.bfloat16),
        "b": torch.arange(41, dtype=torch.int64),
        "rep": torch.randn(5, 3, generator=g),
        "big": torch.randn(300_000, generator=g),  # ~1.2 MB: several chunks
    }


def _placements(kind: str) -> Any:
    from torch.distributed.tensor import Replicate, Shard

    return {"s0": [Shard(0)], "s1": [Shard(1)], "r": [Replicate()]}[kind]


def sharded_state(world: int, layout: Dict[str, str], seed: int = 7, zero: bool = False) -> Dict[str, Any]:
    """The state of one rank: each tensor a DTensor over a 1-D mesh of all
    ranks with the placement ``layout`` names (``"plain"``: a plain
    tensor), plus plain values."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    model: Dict[str, Any] = {}
    for k, t in global_tensors(seed).items():
        v = torch.zeros_like(t) if zero else t
        kind = layout.get(k, "s0")
        if kind == "s1" and v.dim() < 2:
            kind = "s0"
        model[k] = v.clone() if kind == "plain" else distribute_tensor(v, mesh, _placements(kind))
    return {"model": model, "extra": {"step": -1 if zero else 11, "name": "" if zero else "run-a", "lr": [0.0] if zero else [0.1, 0.2]}}


def full(v: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return v.full_tensor() if isinstance(v, DTensor) else v


def compare(state: Dict[str, Any], seed: int = 7) -> Dict[str, Any]:
    import torch

    out: Dict[str, Any] = {}
    for k, t in global_tensors(seed).items():
        got = full(state["model"][k])
        out[k] = bool(got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t))
    out["extra"] = state["extra"] == {"step": 11, "name": "run-a", "lr": [0.1, 0.2]}
    return out


def save_rank(rank: int, world: int, port: int, args: Dict[str, Any]) -> None:
    """Saves ``args["step"]`` with DCP (sync, or async with the executor
    ``args["mode"]`` names) in layout ``args["layout"]``."""
    _init(rank, world, port)
    from strata.dcp import StorageWriter

    state = sharded_state(world, args.get("layout", {}), seed=args.get("seed", 7))
    writer = StorageWriter(**args["settings"])
    found: Dict[str, Any] = {}
    try:
        _save(state, writer, args)
    except BaseException as e:  # noqa: BLE001 - the test checks the error (CheckpointException is a BaseException)
        found = {"error": f"{type(e).__name__}: {e}"}
    writer.close()
    if args.get("flush"):
        # Waits for the pushes to the peers and the uploads to L3.
        writer.checkpointer.flush()
    _done(args, "save", rank, found)


def _save(state: Dict[str, Any], writer: Any, args: Dict[str, Any]) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    mode = args.get("mode", "sync")
    if mode == "sync":
        dcp.save(state, checkpoint_id=args["step"], storage_writer=writer)
    else:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        kind = AsyncCheckpointerType.PROCESS if mode == "process" else AsyncCheckpointerType.THREAD
        fut = dcp.async_save(state, checkpoint_id=args["step"], storage_writer=writer, async_checkpointer_type=kind)
        # Changed right after async_save returned: must not reach the step.
        with torch.no_grad():
            for v in state["model"].values():
                full_local = v.to_local() if hasattr(v, "to_local") else v
                full_local.fill_(0) if full_local.dtype != torch.int64 else full_local.fill_(-5)
        state["extra"]["step"] = 999
        fut.result(timeout=180)


def load_rank(rank: int, world: int, port: int, args: Dict[str, Any]) -> None:
    """Loads (``args["step"]`` or the newest) into a zeroed state of layout
    ``args["layout"]``; records what matched, or the error."""
    _init(rank, world, port)
    import torch.distributed.checkpoint as dcp

    from strata.dcp import StorageReader

    state = sharded_state(world, args.get("layout", {}), zero=True)
    if args.get("model_only"):
        state = {"model": state["model"]}
    reader = StorageReader(
        checkpoint_id=args.get("step"),
        wait_s=args.get("wait_s", 30.0),
        roll_forward_after_s=args.get("roll_after_s", 10.0),
        **args["settings"],
    )
    found: Dict[str, Any] = {}
    try:
        dcp.load(state, storage_reader=reader)
        if args.get("model_only"):
            state["extra"] = {"step": 11, "name": "run-a", "lr": [0.1, 0.2]}
        found = compare(state, seed=args.get("seed", 7))
        found["step"] = reader.checkpoint_id
        found["last_read"] = reader.last_read
    except BaseException as e:  # noqa: BLE001 - the test checks the error (CheckpointException is a BaseException)
        found = {"error": f"{type(e).__name__}: {e}"}
    _done(args, "load", rank, found)


class Counter:
    """A Stateful object (a dataloader's position, say)."""

    def __init__(self, n: int = 0) -> None:
        self.n = n

    def state_dict(self) -> Dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        self.n = int(sd["n"])


def native_rank(rank: int, world: int, port: int, args: Dict[str, Any]) -> None:
    """The native Checkpointer with DTensors and Stateful objects: saves
    (``args["save"]``) or loads into a zeroed state, recording the result
    or the error."""
    _init(rank, world, port)
    import torch

    import strata

    found: Dict[str, Any] = {}
    try:
        with strata.Checkpointer(**args["settings"]) as ckpt:
            if args.get("save"):
                state = sharded_state(world, args.get("layout", {}))
                state["loader"] = Counter(40 + rank)
                ckpt.save(args["step"], state).wait()
            else:
                state = sharded_state(world, args.get("layout", {}), zero=True)
                state["loader"] = Counter(0)
                step = ckpt.load_into(state)
                found = compare(state)
                found["step"] = step
                found["loader"] = state["loader"].n == 40 + rank
                found["local_is_shard"] = all(
                    tuple(v.to_local().shape) != tuple(v.shape) or world == 1
                    for k, v in state["model"].items()
                    if hasattr(v, "to_local") and k != "rep"
                )
                del torch
    except BaseException as e:  # noqa: BLE001 - the test checks the error
        found = {"error": f"{type(e).__name__}: {e}"}
    _done(args, "native", rank, found)


def _gathered(msd: Dict[str, Any], osd: Dict[str, Any]) -> Dict[str, Any]:
    """Every tensor of a model and optimizer state dict, whole."""
    out: Dict[str, Any] = {}
    for k, v in msd.items():
        out["model." + k] = full(v)
    for p, st in osd["state"].items():
        for k, v in st.items():
            out[f"optim.{p}.{k}"] = full(v)
    return out


def fsdp_rank(rank: int, world: int, port: int, args: Dict[str, Any]) -> None:
    """A small model under FSDP2 with AdamW: trains 3 steps and saves
    (``args["save"]``), or loads; either way records the loss on a fixed
    batch, then after one more AdamW step (which uses the restored
    moments and step count)."""
    _init(rank, world, port)
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    from strata.dcp import StorageReader, StorageWriter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 16, generator=g)
    y = torch.randn(8, 4, generator=g)

    def step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.detach())

    found: Dict[str, Any] = {}
    try:
        if args.get("save"):
            for _ in range(3):
                step()
            msd, osd = get_state_dict(model, opt)
            if rank == 0:
                torch.save(_gathered(msd, osd), os.path.join(args["out"], "fsdp-state.pt"))
            else:
                _gathered(msd, osd)  # (a collective: every rank takes part)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=args["step"], storage_writer=StorageWriter(**args["settings"]))
        else:
            # A first step creates AdamW's state (as a resumed loop would).
            step()
            msd, osd = get_state_dict(model, opt)
            sd = {"model": msd, "optim": osd}
            dcp.load(sd, storage_reader=StorageReader(checkpoint_id=args["step"], **args["settings"]))
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
            msd, osd = get_state_dict(model, opt)
            now = _gathered(msd, osd)
            saved = torch.load(os.path.join(args["out"], "fsdp-state.pt"))
            found["state_equal"] = sorted(now) == sorted(saved) and all(torch.equal(now[k], saved[k]) for k in saved)
        with torch.no_grad():
            found["loss"] = float(torch.nn.functional.mse_loss(model(x), y))
        # One more AdamW step uses the optimizer's restored moments.
        step()
        with torch.no_grad():
            found["next_loss"] = float(torch.nn.functional.mse_loss(model(x), y))
    except BaseException as e:  # noqa: BLE001 - the test checks the error
        found = {"error": f"{type(e).__name__}: {e}"}
    _done(args, "fsdp", rank, found)


def behaviours_rank(rank: int, world: int, port: int, args: Dict[str, Any]) -> None:
    """What PyTorch's own DCP tests check of a storage backend, against
    Strata's: a Stateful object at the top level (state_dict on save,
    load_state_dict on load), an empty state, a load of some of the keys, a
    load into a state with a key the step lacks (an error), and that a load
    fills the caller's own tensors (no new objects)."""
    _init(rank, world, port)
    import torch
    import torch.distributed.checkpoint as dcp

    from strata.dcp import StorageReader, StorageWriter

    s = args["settings"]
    found: Dict[str, Any] = {}
    try:
        # The same on every rank (DCP keeps one copy of a replicated item).
        app = Counter(100)
        w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        dcp.save({"app": app, "w": w, "note": "x" * 10}, checkpoint_id=1, storage_writer=StorageWriter(**s))
        # The coordinator's value of a key every rank saves wins (DCP
        # dedups replicated items): rank 0's.
        back = Counter(0)
        dcp.load({"app": back}, storage_reader=StorageReader(checkpoint_id=1, **s))
        found["stateful"] = back.n == 100
        # Keys present, a subset: loaded in place.
        target = torch.zeros(3, 4)
        sd = {"w": target}
        dcp.load(sd, storage_reader=StorageReader(checkpoint_id=1, **s))
        # The caller's own tensor, filled.
        want = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        found["in_place"] = sd["w"] is target and bool(torch.equal(target, want))
        # A key the step lacks: DCP's error, nothing loaded silently.
        try:
            dcp.load({"w": torch.zeros(3, 4), "nope": torch.zeros(2)}, storage_reader=StorageReader(checkpoint_id=1, **s))
            found["missing_key_refused"] = False
        except BaseException as e:  # noqa: BLE001 - CheckpointException
            found["missing_key_refused"] = "nope" in str(e)
        # An empty state round trips.
        dcp.save({}, checkpoint_id=2, storage_writer=StorageWriter(**s))
        empty: Dict[str, Any] = {}
        dcp.load(empty, storage_reader=StorageReader(checkpoint_id=2, **s))
        found["empty"] = empty == {}
        # The newest step without an id.
        r = StorageReader(**s)
        dcp.load({}, storage_reader=r)
        found["newest"] = r.checkpoint_id == 2
    except BaseException as e:  # noqa: BLE001 - the test checks the error
        found = {"error": f"{type(e).__name__}: {e}"}
    _done(args, "behaviours", rank, found)
