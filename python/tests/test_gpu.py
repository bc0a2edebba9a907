"""CUDA tensors through the Python package, on a machine with a GPU.

Skipped, with the reason, where torch sees no GPU or the package was built
without the `cuda` feature (every CI machine: the refusal itself is tested in
test_behaviour.py). Where it runs, it checks bit for bit that GPU state saved
from the device comes back to the device: in place into existing tensors
(all at once, and the model first by a priority load), and into new tensors
on the device.
"""

import pytest

torch = pytest.importorskip("torch")

import strata  # noqa: E402


def _gpu_or_skip(ckpt):
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    probe = {"probe": torch.zeros(4, device="cuda")}
    try:
        ckpt.save(1, probe).wait()
    except strata.InvalidError as e:
        if "`cuda` feature" in str(e):
            pytest.skip(f"the package was built without the GPU path: {e}")
        raise


def _state():
    g = torch.Generator(device="cuda").manual_seed(7)
    return {
        "model": {
            "w": torch.randn(1024, 1024, device="cuda", generator=g).to(torch.bfloat16),
            "b": torch.randn(3 * 1024 + 5, device="cuda", generator=g),
            # Not contiguous: saved by value as the package documents.
            "t": torch.randn(64, 48, device="cuda", generator=g).t(),
        },
        "optim": {"exp_avg": torch.rand(5_000_017, device="cuda", generator=g)},
        "cpu": torch.arange(1000, dtype=torch.int64),
        "step": 12,
    }


def test_gpu_state_round_trips_bit_for_bit(make):
    ckpt = make(keep_last=3)
    _gpu_or_skip(ckpt)
    state = _state()
    want = {
        "w": state["model"]["w"].clone(),
        "b": state["model"]["b"].clone(),
        "t": state["model"]["t"].clone(),
        "exp_avg": state["optim"]["exp_avg"].clone(),
    }
    ckpt.prepare(state)
    ckpt.save(2, state).wait()

    # Training goes on: the device tensors change after the save returned.
    for t in (state["model"]["w"], state["model"]["b"], state["optim"]["exp_avg"]):
        t.add_(1)
    torch.cuda.synchronize()

    ckpt.load_into(state, step=2)
    torch.cuda.synchronize()
    assert state["model"]["w"].device.type == "cuda"
    assert torch.equal(state["model"]["w"], want["w"])
    assert torch.equal(state["model"]["b"], want["b"])
    assert torch.equal(state["optim"]["exp_avg"], want["exp_avg"])
    assert state["step"] == 12

    fresh = ckpt.load(2, device="cuda")
    assert fresh["model"]["w"].device.type == "cuda"
    assert torch.equal(fresh["model"]["w"], want["w"])
    assert torch.equal(fresh["model"]["t"], want["t"])
    assert torch.equal(fresh["optim"]["exp_avg"], want["exp_avg"])
    assert torch.equal(fresh["cpu"].cpu(), torch.arange(1000, dtype=torch.int64))


def test_gpu_priority_load_fills_the_model_first_and_the_rest_on_wait(make):
    """load_into(first="model") with the state on the GPU: the model's
    tensors are on the device, bit for bit, when it returns; the optimizer
    state is untouched until wait() fills it in."""
    ckpt = make(keep_last=3)
    _gpu_or_skip(ckpt)
    state = _state()
    want = {k: v.clone() for k, v in state["model"].items()}
    want_avg = state["optim"]["exp_avg"].clone()
    ckpt.save(2, state).wait()

    for t in (*state["model"].values(), state["optim"]["exp_avg"], state["cpu"]):
        t.zero_()
    state["step"] = 0
    torch.cuda.synchronize()

    loading = ckpt.load_into(state, step=2, first="model")
    torch.cuda.synchronize()
    for k in ("w", "b", "t"):
        assert state["model"][k].device.type == "cuda", k
        assert torch.equal(state["model"][k], want[k]), k
    # The rest is filled in by wait(), not before.
    assert int(torch.count_nonzero(state["optim"]["exp_avg"])) == 0
    assert state["step"] == 0
    assert loading.first_seconds is not None and loading.first_seconds > 0

    assert loading.wait() == 2
    torch.cuda.synchronize()
    assert torch.equal(state["optim"]["exp_avg"], want_avg)
    assert torch.equal(state["cpu"], torch.arange(1000, dtype=torch.int64))
    assert state["step"] == 12
    assert loading.seconds >= loading.first_seconds


def test_dcp_saves_gpu_state_sync_and_async_and_loads_it_back_to_the_gpu(make, l1, job):
    """PyTorch DCP with CUDA tensors through strata.dcp: a synchronous and
    an asynchronous save (the state changes on the device after the async
    call returned), each loaded back in place into tensors on the GPU."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from strata.dcp import StorageReader, StorageWriter

    _gpu_or_skip(make(keep_last=3))
    settings = {"job": job + "-dcp", "l1_dir": l1, "chunk_size": 1 << 20}
    state = _state()
    want = {k: v.clone() for k, v in state["model"].items()}
    want_avg = state["optim"]["exp_avg"].clone()

    dcp.save(state, checkpoint_id=4, storage_writer=StorageWriter(**settings), no_dist=True)
    writer = StorageWriter(**settings)
    future = dcp.async_save(state, checkpoint_id=5, storage_writer=writer, no_dist=True)
    for t in (state["model"]["w"], state["optim"]["exp_avg"]):
        t.add_(1)
    future.result(timeout=120)

    for step in (4, 5):
        back = _state()
        for t in (back["model"]["w"], back["model"]["b"], back["model"]["t"], back["optim"]["exp_avg"], back["cpu"]):
            t.zero_()
        back["step"] = 0
        dcp.load(back, storage_reader=StorageReader(checkpoint_id=step, **settings), no_dist=True)
        torch.cuda.synchronize()
        assert back["model"]["w"].device.type == "cuda", step
        for k in ("w", "b", "t"):
            assert torch.equal(back["model"][k], want[k]), (step, k)
        assert torch.equal(back["optim"]["exp_avg"], want_avg), step
        assert torch.equal(back["cpu"], torch.arange(1000, dtype=torch.int64)), step
        assert back["step"] == 12, step
