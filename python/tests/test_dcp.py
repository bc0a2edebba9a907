"""PyTorch DCP through Strata: round trips, resharding, async saves, and
what a damaged or missing shard does. Ranks are processes (spawn) on gloo."""

import glob
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "workers"))

import dcp_ranks  # noqa: E402


def results(out, name):
    found = {}
    for p in glob.glob(os.path.join(out, f"{name}-*.json")):
        with open(p) as f:
            found[int(p.rsplit("-", 1)[1].split(".")[0])] = json.load(f)
    for p in glob.glob(os.path.join(out, f"{name}-*.json")):
        os.remove(p)
    return found


def all_equal(found, world):
    assert sorted(found) == list(range(world)), found
    for rank, f in found.items():
        assert "error" not in f, (rank, f)
        bad = {k: v for k, v in f.items() if v is False}
        assert not bad, (rank, f)


@pytest.fixture
def settings(l1, job):
    return {"job": job, "l1_dir": l1, "chunk_size": 1 << 18}


def save(world, out, settings, step, **kw):
    dcp_ranks.run_world(world, dcp_ranks.save_rank, {"out": out, "settings": settings, "step": step, **kw})
    return results(out, "save")


def load(world, out, settings, step=None, **kw):
    dcp_ranks.run_world(world, dcp_ranks.load_rank, {"out": out, "settings": settings, "step": step, **kw})
    return results(out, "load")


def test_save_with_4_ranks_loads_at_4_3_2_and_1(tmp_path, settings):
    out = str(tmp_path)
    save(4, out, settings, 10)
    for world in (4, 3, 2, 1):
        found = load(world, out, settings)
        all_equal(found, world)
        assert all(f["step"] == 10 for f in found.values())


def test_save_with_2_ranks_loads_at_4_in_other_placements(tmp_path, settings):
    out = str(tmp_path)
    save(2, out, settings, 3, layout={"emb": "s0", "w": "r", "rep": "plain"})
    all_equal(load(2, out, settings, step=3, layout={"emb": "s0", "w": "r", "rep": "plain"}), 2)
    # Shard(0) -> Shard(1), replicated -> sharded, plain -> sharded.
    found = load(4, out, settings, step="3", layout={"emb": "s1", "w": "s0", "rep": "s0", "b": "r"})
    all_equal(found, 4)
