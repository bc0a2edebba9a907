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
from test_catalog import peer  # noqa: E402,F401 - the fixture: a peer service


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


def save(world, out, settings, step, ok=True, **kw):
    dcp_ranks.run_world(world, dcp_ranks.save_rank, {"out": out, "settings": settings, "step": step, **kw})
    found = results(out, "save")
    if ok:
        all_equal(found, world)
    return found


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


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_async_save_keeps_the_state_as_it_was_when_it_returned(tmp_path, settings, mode):
    # Each rank zeroes its tensors right after async_save returns: the step
    # must hold the values from before (pytorch#144657 is DCP's own bug).
    out = str(tmp_path)
    save(2, out, settings, 7, mode=mode)
    all_equal(load(2, out, settings, step=7), 2)
    all_equal(load(1, out, settings, step=7), 1)


def test_a_second_save_of_a_committed_step_is_refused_on_every_rank(tmp_path, settings):
    out = str(tmp_path)
    save(2, out, settings, 4)
    found = save(2, out, settings, 4, ok=False, seed=99)
    assert all("already committed" in f.get("error", "") for f in found.values()), found
    all_equal(load(2, out, settings, step=4), 2)


def damage_chunk(l1, job, step, rank):
    """Flips a byte of one chunk that rank's entry 'big' lies in."""
    import strata

    cat = strata.Catalog(job=job, l1_dir=l1)
    names = [e[0] for e in cat.entries(step, rank) if e[0].startswith("model.big")]
    hexid, _ = cat.chunks(step, rank, names[0])[0]
    hits = [p for p in glob.glob(os.path.join(l1, "**", "*"), recursive=True) if hexid in os.path.basename(p)]
    assert hits, f"chunk {hexid} not found under {l1}"
    with open(hits[0], "r+b") as f:
        f.seek(os.path.getsize(hits[0]) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


def test_a_damaged_chunk_with_no_other_copy_is_a_corrupt_error(tmp_path, settings, l1, job):
    out = str(tmp_path)
    save(2, out, settings, 5)
    damage_chunk(l1, job, 5, 1)
    found = load(2, out, settings, step=5)
    assert all("CorruptError" in f.get("error", "") or "corrupt" in f.get("error", "").lower() for f in found.values()), found


def test_a_rank_that_died_after_its_vote_is_rolled_forward_and_one_lost_is_an_error(tmp_path, settings, l1, job):
    out = str(tmp_path)
    save(2, out, settings, 6)
    step_dir = os.path.join(l1, job, "steps", f"{6:020d}")
    # Rank 1 died after its vote, before its commit record: the step is
    # decided (rank 0's record), rank 1's manifest is on L1 without one.
    os.remove(os.path.join(step_dir, "c-1"))
    found = load(2, out, settings, wait_s=2.0, roll_after_s=0.5)
    all_equal(found, 2)
    assert all(f["step"] == 6 for f in found.values()), found
    assert os.path.exists(os.path.join(step_dir, "c-1")), "the reader rolled rank 1 forward"
    # Rank 1's shard is gone from every tier: an error naming it, never zeros.
    os.remove(os.path.join(step_dir, "c-1"))
    os.remove(os.path.join(step_dir, "m-1"))
    found = load(2, out, settings, step=6, wait_s=1.0, roll_after_s=0.5)
    assert all("ranks [1] of 2" in f.get("error", "") for f in found.values()), found
    # Without a step: step 6 lacks a rank everywhere, so the newest
    # complete one is read (none here: an error saying why, never zeros).
    found = load(2, out, settings, wait_s=1.0, roll_after_s=0.5)
    assert all("no complete checkpoint" in f.get("error", "") and "step 6: ranks [1]" in f["error"] for f in found.values()), found


def test_loads_from_the_peers_or_l3_alone_and_a_damaged_chunk_from_another_tier(tmp_path, l1, job, peer, monkeypatch):
    peers, certs = peer
    for var in ("STRATA_L1_DIR", "STRATA_L3_URL", "STRATA_PEERS", "STRATA_PEER_CERTS", "STRATA_JOB"):
        monkeypatch.delenv(var, raising=False)
    l3 = tmp_path / "l3"
    l3.mkdir()
    out = str(tmp_path)
    every = dict(job=job, l1_dir=l1, peers=[peers], peer_certs=certs, node="node-a",
                 l3_url=f"file://{l3}", chunk_size=1 << 18)
    save(2, out, dict(every, upload_every=1, replicas=1), 8, flush=True)
    missing = str(tmp_path / "no-l1")
    only_l2 = dict(job=job, l1_dir=missing, peers=[peers], peer_certs=certs, node="node-a")
    only_l3 = dict(job=job, l1_dir=missing, l3_url=f"file://{l3}")
    for world, settings in ((3, only_l2), (1, only_l3)):
        found = load(world, out, settings)
        all_equal(found, world)
        assert all(f["step"] == 8 for f in found.values())
    # A chunk damaged on L1: read from the peer or L3 instead.
    damage_chunk(l1, job, 8, 1)
    found = load(2, out, every, step=8)
    all_equal(found, 2)
    assert sum(f["last_read"]["fallbacks"] for f in found.values()) >= 1, found


def native(world, out, settings, **kw):
    dcp_ranks.run_world(world, dcp_ranks.native_rank, {"out": out, "settings": settings, **kw})
    return results(out, "native")


def test_the_native_checkpointer_saves_dtensors_and_stateful_objects_that_dcp_reshards(tmp_path, settings):
    out = str(tmp_path)
    found = native(2, out, settings, save=True, step=12, layout={"w": "s1", "rep": "r"})
    all_equal(found, 2)
    # The same world restores each rank's shard in place, and the
    # Stateful object through load_state_dict.
    found = native(2, out, settings, layout={"w": "s1", "rep": "r"})
    all_equal(found, 2)
    assert all(f["step"] == 12 and f["loader"] and f["local_is_shard"] for f in found.values()), found
    # Another world size: an error naming both sizes, never None.
    found = native(3, out, settings)
    assert all("world of 2 ranks and this job runs 3" in f.get("error", "") for f in found.values()), found
    # DCP's reader reshards the native step (its tensors, by their layout).
    all_equal(load(3, out, settings, step=12, model_only=True, layout={"emb": "s1"}), 3)
    all_equal(load(1, out, settings, model_only=True), 1)


def test_fsdp2_model_and_adamw_state_round_trip_through_get_and_set_state_dict(tmp_path, settings):
    # FSDP2 (fully_shard) on CPU with gloo: get_state_dict's model and
    # optimizer state saved at 2 ranks, set_state_dict after a load at 2
    # and at 4 ranks; the next training step's loss equals the one an
    # uninterrupted run computes.
    out = str(tmp_path)
    found = fsdp(2, out, settings, save=True, step=30)
    all_equal(found, 2)
    want = found[0]
    for world in (2, 4, 1):
        found = fsdp(world, out, settings, step=30)
        all_equal(found, world)
        # The whole model and AdamW state, gathered, equals what was saved.
        assert all(f["state_equal"] for f in found.values()), found
        for f in found.values():
            assert f["loss"] == want["loss"], (world, f, want)
            if world == 2:
                assert f["next_loss"] == want["next_loss"], (world, f, want)
            elif world == 1:
                continue
            else:
                # Gradients reduced over 4 ranks round differently.
                assert abs(f["next_loss"] - want["next_loss"]) <= 1e-5 * abs(want["next_loss"]), (world, f, want)


def fsdp(world, out, settings, **kw):
    dcp_ranks.run_world(world, dcp_ranks.fsdp_rank, {"out": out, "settings": settings, **kw})
    return results(out, "fsdp")


def test_dcp_steps_are_ordinary_steps_for_the_cli(tmp_path, settings, l1, job):
    import subprocess

    from test_catalog import strata_bin

    out = str(tmp_path)
    save(2, out, settings, 9, layout={"w": "s1"})
    exe = strata_bin()
    base = ["--l1", l1, "--job", job]
    v = subprocess.run([exe, "verify", "9", *base], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    s = subprocess.run([exe, "show", "9", "--rank", "1", "--json", *base], capture_output=True, text=True)
    assert s.returncode == 0, s.stdout + s.stderr
    shown = json.loads(s.stdout)
    places = {e["name"]: e.get("global") for e in shown["entries"]}
    # w (16 x 10, Shard(1) over 2 ranks): rank 1 holds columns 5..10.
    assert places["model.w@0,5"] == {"fqn": "model.w", "shape": [16, 10], "offsets": [0, 5]}, places
    assert places["model.emb@19,0"] == {"fqn": "model.emb", "shape": [37, 24], "offsets": [19, 0]}, places
    t = subprocess.run([exe, "show", "9", "--rank", "0", *base], capture_output=True, text=True)
    assert t.returncode == 0 and "FQN" in t.stdout and "GLOBAL" in t.stdout and "__dcp_metadata__" in t.stdout, t.stdout


def test_the_behaviours_pytorchs_dcp_tests_check_of_a_backend(tmp_path, settings):
    dcp_ranks.run_world(2, dcp_ranks.behaviours_rank, {"out": str(tmp_path), "settings": settings})
    all_equal(results(str(tmp_path), "behaviours"), 2)


def test_no_dist_save_and_load_in_one_process(settings):
    import torch.distributed.checkpoint as dcp

    from strata.dcp import StorageReader, StorageWriter

    state = {"a": torch.randn(5, 5), "b": {"c": torch.arange(7), "s": "text"}}
    dcp.save(state, checkpoint_id="3", storage_writer=StorageWriter(**settings), no_dist=True)
    back = {"a": torch.zeros(5, 5), "b": {"c": torch.zeros(7, dtype=torch.int64), "s": ""}}
    dcp.load(back, storage_reader=StorageReader(**settings), no_dist=True)
    assert torch.equal(back["a"], state["a"]) and torch.equal(back["b"]["c"], state["b"]["c"])
    assert back["b"]["s"] == "text"
    assert StorageWriter.validate_checkpoint_id(3) and StorageWriter.validate_checkpoint_id("3")
    assert not StorageReader.validate_checkpoint_id("/some/path")
    with pytest.raises(Exception, match="not a step"):
        StorageWriter(checkpoint_id="/some/path", **settings)


def test_dot_metadata_runs_no_code_when_unpickled():
    import pickle

    from strata import InvalidError
    from strata.dcp._pickle import load_metadata

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > /tmp/strata-pwned",))

    with pytest.raises(InvalidError, match="never holds"):
        load_metadata(pickle.dumps(Evil()))
    assert not os.path.exists("/tmp/strata-pwned")
    with pytest.raises(InvalidError, match="not DCP Metadata"):
        load_metadata(pickle.dumps({"a": 1}))
    with pytest.raises(InvalidError):
        load_metadata(b"\x80\x05garbage")


def test_a_failed_async_save_never_blocks_the_next_one(settings):
    import threading

    import torch.distributed.checkpoint as dcp

    from strata.dcp import StorageReader, StorageWriter

    writer = StorageWriter(**settings)
    state = {"a": torch.randn(64, 64)}
    dcp.async_save(state, checkpoint_id=5, storage_writer=writer, no_dist=True).result(timeout=60)
    # Step 5 again: refused while planning, before anything is written;
    # the staged copy it took is released when DCP drops it.
    def refused():
        try:
            dcp.async_save(state, checkpoint_id=5, storage_writer=writer, no_dist=True).result(timeout=60)
        except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException
            return str(e)
        return ""

    # Only the message is kept (not the exception, whose traceback holds
    # the staged state, as a caller that handled the error would).
    assert "already committed" in refused()
    state["a"].add_(1)
    done = []
    t = threading.Thread(
        target=lambda: done.append(
            dcp.async_save(state, checkpoint_id=6, storage_writer=writer, no_dist=True).result(timeout=60)
        ),
        daemon=True,
    )
    t.start()
    t.join(60)
    assert done, "the save after a failed one waited for its staging"
    back = {"a": torch.zeros(64, 64)}
    dcp.load(back, storage_reader=StorageReader(checkpoint_id=6, **settings), no_dist=True)
    assert torch.equal(back["a"], state["a"])


def test_two_async_saves_back_to_back_each_keep_their_own_state(settings):
    import torch.distributed.checkpoint as dcp

    from strata.dcp import StorageReader, StorageWriter

    writer = StorageWriter(**settings)
    state = {"a": torch.randn(256, 256), "b": torch.arange(1000)}
    first = {k: v.clone() for k, v in state.items()}
    f1 = dcp.async_save(state, checkpoint_id=7, storage_writer=writer, no_dist=True)
    # Not waiting for the first: its staged copy may still be unread, so
    # the second must not reuse its buffers.
    with torch.no_grad():
        state["a"].mul_(-1)
        state["b"].add_(5)
    f2 = dcp.async_save(state, checkpoint_id=8, storage_writer=writer, no_dist=True)
    f1.result(timeout=60)
    f2.result(timeout=60)
    for step, want in ((7, first), (8, state)):
        back = {"a": torch.zeros(256, 256), "b": torch.zeros(1000, dtype=torch.int64)}
        dcp.load(back, storage_reader=StorageReader(checkpoint_id=step, **settings), no_dist=True)
        assert torch.equal(back["a"], want["a"]) and torch.equal(back["b"], want["b"]), step


def test_staging_reuses_buffers_only_once_the_previous_state_is_released():
    from strata.dcp._stager import Staging

    s = Staging()
    a = s.stage({"w": torch.ones(4)})
    # Not released yet (no write, still referenced): fresh buffers.
    b = s.stage({"w": torch.full((4,), 2.0)})
    assert a["w"].data_ptr() != b["w"].data_ptr() and torch.equal(a["w"], torch.ones(4))
    # A late release of the older staging frees nothing newer.
    s.release(1)
    c = s.stage({"w": torch.full((4,), 3.0)})
    assert c["w"].data_ptr() not in (a["w"].data_ptr(), b["w"].data_ptr())
    # Written (the writer releases in order): the next reuses the buffers.
    s.release_oldest()
    s.release_oldest()
    ptr = c["w"].data_ptr()
    d = s.stage({"w": torch.full((4,), 4.0)})
    assert d["w"].data_ptr() == ptr and torch.equal(d["w"], torch.full((4,), 4.0))
    # Dropped by DCP (a failed save): released too.
    ptr = d["w"].data_ptr()
    del a, b, c, d
    e = s.stage({"w": torch.full((4,), 5.0)})
    assert e["w"].data_ptr() == ptr
