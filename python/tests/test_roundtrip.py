"""Saving and loading nested state: every dtype, every kind of leaf."""

import math
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch

import strata
from strata._arrays import TORCH_TO_STRATA


def torch_dtypes():
    return [getattr(torch, n) for n in TORCH_TO_STRATA if hasattr(torch, n)]


def make_tensor(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape)) if shape else 1
    raw = torch.randint(0, 256, (n * torch.empty((), dtype=dtype).element_size(),), generator=g, dtype=torch.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def same_bits(a, b):
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), (a.dtype, b.dtype, a.shape, b.shape)
    return bytes(a.contiguous().reshape(-1).view(torch.uint8).numpy()) == bytes(b.contiguous().reshape(-1).view(torch.uint8).numpy())


def test_every_torch_dtype_round_trips_bit_for_bit(make):
    ckpt = make()
    state = {}
    for i, dt in enumerate(torch_dtypes()):
        name = str(dt).replace("torch.", "")
        state[name] = {
            "matrix": make_tensor(dt, (33, 7), i),
            "scalar": make_tensor(dt, (), 100 + i),
            "empty": torch.empty((0, 3), dtype=dt),
        }
    assert "bfloat16" in state and "float8_e4m3fn" in state and "float8_e5m2" in state
    ckpt.save(1, state).wait()
    back = ckpt.load()
    assert set(back) == set(state)
    for name, d in state.items():
        for k, t in d.items():
            assert isinstance(back[name][k], torch.Tensor)
            assert same_bits(t, back[name][k]), (name, k)


def test_numpy_arrays_and_plain_values_round_trip(make):
    ckpt = make()
    rs = np.random.RandomState(7)
    arrays = {str(dt): (rs.rand(5, 3) * 100).astype(dt) for dt in
              ["float64", "float32", "float16", "int64", "int32", "int16", "int8",
               "uint64", "uint32", "uint16", "uint8", "bool"]}
    random.seed(3)
    state = {
        "arrays": arrays,
        "fortran": np.asfortranarray(rs.rand(4, 6)),
        "plain": {
            "lr": 3e-4, "nan": float("nan"), "inf": -math.inf, "big": 2**80, "neg": -1,
            "name": "héllo", "flag": True, "none": None, "c": 1 + 2j,
            "small_bytes": b"\x00\x01abc", "big_bytes": bytes(range(256)) * 40,
            "tuple": (1, (2.5, "x")), "list": [1, [2, [3]]], "set": {1, 2}, "fset": frozenset({"a"}),
            3: "int key", (1, 2): "tuple key", 2.5: "float key",
        },
        "ordered": OrderedDict([("b", 1), ("a", 2)]),
        "np_scalars": [np.float32(1.5), np.int64(-3), np.bool_(True)],
        "torch_meta": {"dtype": torch.bfloat16, "size": torch.Size([2, 3]), "device": torch.device("cpu")},
        "py_random": random.getstate(),
        "np_random": np.random.RandomState(11).get_state(),
        "torch_rng": torch.get_rng_state(),
    }
    ckpt.save(5, state).wait()
    back = ckpt.load()
    for k, a in arrays.items():
        assert isinstance(back["arrays"][k], np.ndarray)
        assert back["arrays"][k].dtype == a.dtype and np.array_equal(back["arrays"][k], a)
    assert np.array_equal(back["fortran"], state["fortran"])
    p, q = state["plain"], back["plain"]
    assert math.isnan(q.pop("nan")) and math.isnan(p["nan"])
    assert q == {k: v for k, v in p.items() if k != "nan"}
    assert type(q["tuple"]) is tuple and type(q["set"]) is set and type(q["fset"]) is frozenset
    assert isinstance(back["ordered"], OrderedDict) and list(back["ordered"]) == ["b", "a"]
    assert [type(x) for x in back["np_scalars"]] == [np.float32, np.int64, np.bool_]
    assert back["np_scalars"] == state["np_scalars"]
    assert back["torch_meta"] == state["torch_meta"]
    assert back["py_random"] == state["py_random"]
    random.setstate(back["py_random"])
    ns = back["np_random"]
    assert ns[0] == "MT19937" and np.array_equal(ns[1], state["np_random"][1]) and ns[2:] == state["np_random"][2:]
    assert torch.equal(back["torch_rng"], state["torch_rng"])


def test_tensors_views_and_non_contiguous_tensors(make):
    ckpt = make()
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    w = torch.nn.Parameter(torch.randn(4, 4))
    state = {"t": base.t(), "slice": base[2:4, 1:7], "param": w, "again": w}
    ckpt.save(2, state).wait()
    back = ckpt.load()
    assert torch.equal(back["t"], base.t().contiguous())
    assert torch.equal(back["slice"], base[2:4, 1:7])
    assert torch.equal(back["param"], w.detach()) and not back["param"].requires_grad
    # One tensor saved under two paths is restored as one tensor.
    assert back["again"] is back["param"]


def test_load_onto_a_device_and_a_chosen_step(make):
    ckpt = make(keep_last=5)
    for step in (10, 20, 30):
        ckpt.save(step, {"w": torch.full((3,), float(step))}).wait()
    assert ckpt.steps() == [10, 20, 30]
    assert ckpt.latest_step() == 30
    back = ckpt.load(20, device="cpu")
    assert torch.equal(back["w"], torch.full((3,), 20.0))
    assert back["w"].device.type == "cpu"
    st = ckpt.status(30)
    assert st["l1"] is True and st["l3"] is False


def test_a_step_saved_without_a_tree_loads_as_a_flat_dict(make):
    ckpt = make()
    # Saved through the native module without a state tree, as a Rust
    # program saves: load returns its entries by name.
    native = ckpt._native
    data = torch.arange(8, dtype=torch.int32)
    native.save(4, [("w", "I32", [8], (data.data_ptr(), 32, None)), ("blob", None, None, b"xyz")], {}).wait("l1", None)
    back = ckpt.load()
    assert torch.equal(back["w"], data) and back["blob"] == b"xyz"
