"""What a training loop relies on: saves isolated from later mutation,
in-place loads, typed errors, many saves keeping only the retained steps,
logs. (Flat memory and the GIL released are timings: benches/python_behaviour.py.)"""

import glob
import logging
import os
import threading
import time

import numpy as np
import pytest
import torch

import strata


def test_tensors_mutated_right_after_save_do_not_change_the_step(make):
    ckpt = make()
    w = torch.randn(256, 1024)
    a = np.arange(1000, dtype=np.float64)
    expect_w, expect_a = w.clone(), a.copy()
    h = ckpt.save(1, {"w": w, "a": a})
    # Training goes on at once and overwrites everything in place.
    w.add_(1.0)
    a += 1.0
    w.zero_()
    h.wait()
    back = ckpt.load()
    assert torch.equal(back["w"], expect_w)
    assert np.array_equal(back["a"], expect_a)


def test_load_into_fills_the_models_and_optimizers_own_memory(make):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    ckpt = make()
    saved = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3}
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt.save(7, saved).wait()

    # A fresh model and optimizer (same architecture), trained differently.
    torch.manual_seed(1)
    model2 = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt2 = torch.optim.Adam(model2.parameters(), lr=5e-2)
    model2(torch.randn(8, 16)).sum().backward()
    opt2.step()
    ptrs = {n: p.data_ptr() for n, p in model2.named_parameters()}
    state = {"model": model2.state_dict(), "optim": opt2.state_dict(), "epoch": 0}
    exp_avg = state["optim"]["state"][0]["exp_avg"]
    assert ckpt.load_into(state) == 7
    opt2.load_state_dict(state["optim"])
    for n, p in model2.named_parameters():
        assert p.data_ptr() == ptrs[n], "filled in place, not replaced"
        assert torch.equal(p.detach(), snapshot[n])
    assert state["epoch"] == 3
    assert state["optim"]["state"][0]["exp_avg"] is exp_avg
    assert torch.equal(exp_avg, opt.state_dict()["state"][0]["exp_avg"])
    assert opt2.param_groups[0]["lr"] == 1e-3


def test_load_into_non_contiguous_targets_and_new_keys(make):
    ckpt = make()
    ckpt.save(1, {"t": torch.arange(12.0).reshape(3, 4), "extra": torch.ones(2), "n": 5}).wait()
    target = torch.zeros(4, 3).t()  # non-contiguous view, shape (3, 4)
    state = {"t": target}
    ckpt.load_into(state, strict=False)
    assert state["t"] is target and torch.equal(target, torch.arange(12.0).reshape(3, 4))
    assert torch.equal(state["extra"], torch.ones(2)) and state["n"] == 5


def test_load_into_refuses_a_state_that_does_not_fit(make):
    ckpt = make()
    ckpt.save(1, {"w": torch.zeros(4, 4)}).wait()
    target = torch.full((4, 5), 9.0)
    with pytest.raises(strata.InvalidError, match="shape"):
        ckpt.load_into({"w": target})
    assert torch.equal(target, torch.full((4, 5), 9.0)), "nothing written"
    with pytest.raises(strata.InvalidError, match="dtype"):
        ckpt.load_into({"w": torch.zeros(4, 4, dtype=torch.float64)})
    with pytest.raises(strata.InvalidError, match="holds no tensor"):
        ckpt.load_into({"w": torch.zeros(4, 4), "other": torch.zeros(1)})


def test_errors_raise_the_class_of_their_kind(make, l1, job):
    ckpt = make()
    with pytest.raises(strata.NotFoundError) as e:
        ckpt.load()
    assert isinstance(e.value, LookupError) and isinstance(e.value, strata.StrataError)
    assert ckpt.latest_step() is None
    with pytest.raises(strata.InvalidError) as e:
        strata.Checkpointer(job=job, l1_dir=l1, no_such_setting=1)
    assert isinstance(e.value, ValueError) and "no_such_setting" in str(e.value)
    with pytest.raises(strata.InvalidError):
        strata.Checkpointer(job="bad/job", l1_dir=l1)
    with pytest.raises(strata.InvalidError, match="cannot store"):
        ckpt.save(1, {"x": object()})
    with pytest.raises(strata.InvalidError, match="not supported"):
        ckpt.save(1, {"x": torch.zeros(2, dtype=torch.complex64)})
    h = ckpt.save(2, {"x": torch.ones(3)})
    with pytest.raises(strata.InvalidError, match="target"):
        h.wait("l9")
    with pytest.raises(strata.InvalidError, match="no L3"):
        h.wait("l3")
    with pytest.raises(strata.InvalidError, match="no peers"):
        h.wait("peers")
    assert h.wait()["step"] == 2 and h.done()


def test_saving_a_committed_step_again_is_a_conflict_and_keeps_it(make):
    ckpt = make()
    ckpt.save(3, {"w": torch.ones(8)}).wait()
    with pytest.raises(strata.ConflictError, match="already committed"):
        ckpt.save(3, {"w": torch.zeros(8)}).wait()
    assert torch.equal(ckpt.load(3)["w"], torch.ones(8))


def test_damaged_chunk_on_the_only_tier_is_a_corrupt_error(make, l1, job):
    ckpt = make()
    ckpt.save(1, {"w": torch.randn(1 << 16)}).wait()
    chunks = sorted(glob.glob(os.path.join(l1, job, "chunks", "*", "*")), key=os.path.getsize)
    assert chunks
    with open(chunks[-1], "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(strata.CorruptError):
        ckpt.load()


def test_load_into_a_damaged_step_changes_no_weight(make, damage):
    """A chunk damaged on the only tier: ``load_into`` raises CorruptError
    and every tensor of the model keeps its bytes (none half overwritten)."""
    ckpt = make(chunk_size=1 << 20)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512, bias=True) for _ in range(8)])
    saved = {"model": model.state_dict(), "arr": np.arange(1 << 18, dtype=np.float32)}
    ckpt.save(1, saved).wait()
    # The chunk holding the last layer's weight (1 MiB: a chunk of its own).
    damage(model[7].weight.detach().numpy().tobytes()[:4096], 1000)

    torch.manual_seed(1)
    other = torch.nn.Sequential(*[torch.nn.Linear(512, 512, bias=True) for _ in range(8)])
    state = {"model": other.state_dict(), "arr": np.full(1 << 18, 7.0, dtype=np.float32)}
    before = {k: v.clone() for k, v in state["model"].items()}
    with pytest.raises(strata.CorruptError):
        ckpt.load_into(state)
    changed = [k for k, v in state["model"].items() if not torch.equal(v, before[k])]
    assert changed == [], f"half overwritten: {changed}"
    assert np.all(state["arr"] == 7.0)


def test_wait_timeout_is_a_timeout_error(make):
    ckpt = make()
    h = ckpt.save(1, {"w": torch.randn(256 << 20 >> 2)})  # 256 MiB: not durable within 1 ms
    with pytest.raises(strata.WaitTimeoutError) as e:
        h.wait("l1", timeout=0.001)
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, strata.UnavailableError)
    with pytest.raises(strata.InvalidError):
        h.wait("l1", timeout=-1.0)
    assert h.wait()["step"] == 1, "the save went on"


def test_a_thousand_saves_keep_only_the_retained_steps(make):
    # Flat memory over these saves is measured, not asserted, in
    # benches/python_behaviour.py (an RSS limit depends on the machine).
    ckpt = make(keep_last=2, chunk_size=1 << 18)
    w = torch.randn(1 << 18)  # 1 MiB
    for step in range(1, 1001):
        w[step % w.numel()] += 1.0
        h = ckpt.save(step, {"w": w, "step": step, "blob": b"x" * 100})
        if step % 50 == 0:
            h.wait()
    ckpt.flush()
    assert ckpt.steps() == [999, 1000]
    got = ckpt.load(1000)
    assert torch.equal(got["w"], w) and got["step"] == 1000


# The GIL released while saving and waiting is measured in
# benches/python_behaviour.py: it can only be told by timing another
# thread against the save, which a loaded machine distorts.


def test_logs_reach_python_logging(make, caplog):
    with caplog.at_level(logging.INFO, logger="strata"):
        ckpt = make()
        ckpt.save(1, {"w": torch.ones(4)}).wait()
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "strata")
    assert "checkpointer ready" in text and "step durable on L1" in text


def test_a_calls_records_come_before_it_returns_even_with_a_slow_handler(make):
    # A handler that releases the GIL (here: sleeps) lets the calling
    # thread run while the delivery thread is still handing records over.
    # The call must still not return before its records were handled.
    got = []

    class Slow(logging.Handler):
        def emit(self, record):
            time.sleep(0.02)
            got.append(record.getMessage())

    log = logging.getLogger("strata")
    handler, old = Slow(level=logging.INFO), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        ckpt = make()
        for step in range(1, 6):
            ckpt.save(step, {"w": torch.ones(4)}).wait()
            assert any(
                "step durable on L1" in m and f"step={step} " in m + " " for m in got
            ), f"step {step}: {got}"
    finally:
        log.removeHandler(handler)
        log.setLevel(old)


def test_a_handler_that_calls_into_strata_or_raises_blocks_nothing(make):
    # A handler calling into the module (here: the drain itself) returns at
    # once instead of waiting for the drain it runs in; one that raises
    # leaves no drain marked as running (the next calls would wait).
    from strata import _strata

    calls, nested = [], []

    class Reentrant(logging.Handler):
        def emit(self, record):
            calls.append(record.getMessage())
            t0 = time.monotonic()
            _strata.drain_logs()
            nested.append(time.monotonic() - t0)
            if "step durable" in record.getMessage():
                raise RuntimeError("a broken handler")

    log = logging.getLogger("strata")
    handler, old = Reentrant(level=logging.INFO), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    old_raise, logging.raiseExceptions = logging.raiseExceptions, False
    try:
        done = threading.Event()

        def saves():
            ckpt = make()
            for step in range(1, 4):
                ckpt.save(step, {"w": torch.ones(4)}).wait()
            done.set()

        t = threading.Thread(target=saves, daemon=True)
        started = time.monotonic()
        t.start()
        t.join(60)
        assert done.is_set(), "the saves hung (a drain waited for itself)"
        assert time.monotonic() - started < 30
        # A drain left marked as running would make this wait two seconds.
        t0 = time.monotonic()
        _strata.drain_logs()
        assert time.monotonic() - t0 < 1.0
        assert sum("step durable on L1" in m for m in calls) == 3, calls
        # A nested call that waited for the drain it runs in would take the
        # whole two-second bound.
        assert max(nested) < 1.0, nested
    finally:
        logging.raiseExceptions = old_raise
        log.removeHandler(handler)
        log.setLevel(old)


def test_configuration_layers_file_env_keywords(tmp_path, monkeypatch, l1):
    cfg = tmp_path / "strata.toml"
    cfg.write_text('job = "from-file"\nkeep_last = 7\nchunk_size = 1048576\n')
    monkeypatch.setenv("STRATA_KEEP_LAST", "5")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    r = strata.resolve_config(str(cfg), l1_dir=l1)
    assert r["job"] == "from-file" and r["keep_last"] == 5 and r["chunk_size"] == 1 << 20
    assert (r["rank"], r["world_size"], r["local_rank"]) == (1, 4, 1)
    r = strata.resolve_config(str(cfg), keep_last=9, rank=0, world_size=1)
    assert r["keep_last"] == 9 and r["rank"] == 0
    monkeypatch.setenv("STRATA_KEEP_LAST", "many")
    with pytest.raises(strata.InvalidError, match="STRATA_KEEP_LAST"):
        strata.resolve_config()


def test_a_world_above_one_needs_a_coordinator(l1, job, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(strata.InvalidError, match="coordinat"):
        strata.Checkpointer(job=job, l1_dir=l1)


def test_context_manager_closes_and_finishes_the_save(l1, job):
    with strata.Checkpointer(job=job, l1_dir=l1) as ckpt:
        ckpt.save(1, {"w": torch.ones(1 << 20)})
    with pytest.raises(strata.InvalidError, match="closed"):
        ckpt.steps()
    with strata.Checkpointer(job=job, l1_dir=l1) as again:
        assert again.steps() == [1]


def test_prepare_takes_the_first_saves_memory_cost(make):
    ckpt = make()
    state = {"w": torch.randn(32 << 20 >> 2), "n": 1}
    ckpt.prepare(state)
    h = ckpt.save(1, state)
    h.wait()
    assert torch.equal(ckpt.load()["w"], state["w"])
    with pytest.raises(strata.InvalidError):
        ckpt.prepare({"x": object()})


def test_device_memory_without_the_gpu_build_is_refused_before_anything_is_written(make, l1, job):
    ckpt = make()
    # What a CUDA tensor turns into: a device address (the package is built
    # without the `cuda` feature here, and there is no driver).
    with pytest.raises(strata.InvalidError, match="(?i)gpu|cuda"):
        ckpt._native.save(1, [("w", "F32", [4], (0xDEAD0000, 16, 0))], {}).wait("l1", None)
    assert ckpt.steps() == []
    assert not os.path.exists(os.path.join(l1, job, "steps", f"{1:020}"))


def test_the_store_coordinator_round_trip_and_its_bounds():
    from strata._dist import _pack, _unpack

    vals = [b"", b"abc", bytes(range(256))]
    assert _unpack(_pack(vals), 3) == vals
    with pytest.raises(ValueError):
        _unpack(_pack(vals), 2)
    with pytest.raises(ValueError):
        _unpack(_pack(vals)[:-1], 3)
    with pytest.raises(ValueError):
        _unpack(b"\x01\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x7f", 1)


def test_tied_weights_are_stored_once_and_load_into_a_tied_model(make):
    torch.manual_seed(0)

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 8)
            self.head = torch.nn.Linear(8, 50, bias=False)
            self.head.weight = self.emb.weight

    m = Tied()
    ckpt = make()
    ckpt.save(1, {"model": m.state_dict()}).wait()
    plan = ckpt._native.plan(None)
    assert [e[0] for e in plan.entries if e[0].startswith("model.")] == ["model.emb.weight"]
    back = ckpt.load()["model"]
    assert back["emb.weight"] is back["head.weight"]
    m2 = Tied()
    state = {"model": m2.state_dict()}
    ckpt.load_into(state)
    assert torch.equal(m2.emb.weight, m.emb.weight) and m2.head.weight is m2.emb.weight


def test_overlapping_views_as_targets_are_read_safely(make):
    ckpt = make()
    ckpt.save(1, {"a": torch.arange(6.0), "b": torch.arange(10.0, 16.0)}).wait()
    base = torch.zeros(10)
    state = {"a": base[:6], "b": base[4:]}  # overlap at base[4:6]
    ckpt.load_into(state)
    assert torch.equal(base[:4], torch.arange(4.0)) and torch.equal(base[6:], torch.arange(12.0, 16.0))
    # The native read itself refuses overlapping destinations.
    plan = ckpt._native.plan(None)
    buf = torch.zeros(16)
    p = buf.data_ptr()
    with pytest.raises(strata.InvalidError, match="overlap"):
        ckpt._native.read(plan, [("a", p, 24), ("b", p + 16, 24)])


def test_zero_dimensional_numpy_arrays_keep_their_shape(make):
    ckpt = make()
    a = np.array(3.5)
    f = np.asfortranarray(np.arange(6.0).reshape(2, 3))[:, ::2]
    ckpt.save(1, {"a": a, "f": f}).wait()
    back = ckpt.load()
    assert back["a"].shape == () and back["a"] == 3.5
    assert np.array_equal(back["f"], f)
    target = {"a": np.array(0.0), "f": np.zeros((2, 2))}
    ckpt.load_into(target)
    assert target["a"] == 3.5 and np.array_equal(target["f"], f)


def test_a_big_endian_target_is_refused(make):
    ckpt = make()
    ckpt.save(1, {"a": np.arange(4, dtype="<f4")}).wait()
    with pytest.raises(strata.InvalidError, match="byte order"):
        ckpt.load_into({"a": np.zeros(4, dtype=">f4")})


def test_load_into_changes_nothing_when_it_fails(make):
    ckpt = make()
    ckpt.save(1, {"w": torch.ones(4), "epoch": 7, "extra": {"x": 1}}).wait()
    state = {"w": torch.zeros(5), "epoch": 0}
    with pytest.raises(strata.InvalidError):
        ckpt.load_into(state)
    assert state["epoch"] == 0 and set(state) == {"w", "epoch"} and torch.equal(state["w"], torch.zeros(5))


def test_bytes_keys_and_set_members_stay_inline(make):
    ckpt = make()
    big = b"k" * 5000
    state = {big: 1, (b"t" * 5000, 2): "v", "s": {big, 3}}
    ckpt.save(1, state).wait()
    assert ckpt.load() == state
    target = {}
    ckpt.load_into(target)
    assert target == state


def test_odd_keys_get_entry_names_the_format_accepts(make):
    ckpt = make()
    state = {"": torch.ones(2), "a\nb": torch.zeros(3), "x" * 5000: torch.full((1,), 2.0)}
    ckpt.save(1, state).wait()
    back = ckpt.load()
    assert set(back) == set(state)
    for k in state:
        assert torch.equal(back[k], state[k])


@pytest.mark.parametrize("tree", [
    b"[" * 200000,
    b"not json",
    b'{"strata_tree": 1, "root": {"np": ["V", 2147483647]}}',
    b'{"strata_tree": 1, "root": {"np": ["O", 1]}}',
    b'{"strata_tree": 1, "root": {"d": [[{"l": []}, 1]]}}',
    b'{"strata_tree": 1, "root": {"c": [{"d": []}, 1]}}',
    b'{"strata_tree": 1, "root": {"dev": "nonsense:7"}}',
    b'{"strata_tree": 1, "root": {"T": "blob"}}',
    b'{"strata_tree": 1, "root": {"B": "w"}}',
    b'{"strata_tree": 1, "root": {"T": "missing"}}',
    b'{"strata_tree": 2, "root": 1}',
])
def test_a_damaged_or_hostile_state_tree_is_an_invalid_error(make, tree):
    ckpt = make()
    w = torch.ones(4)
    ckpt._native.save(1, [("w", "F32", [4], (w.data_ptr(), 16, None)), ("blob", None, None, b"xy"),
                          ("__strata_tree__", None, None, tree)], {"strata.tree": "1"}).wait("l1", None)
    with pytest.raises(strata.InvalidError):
        ckpt.load()


def test_metrics_are_served_to_prometheus_and_readable_in_process(make, job):
    import urllib.request

    ckpt = make(metrics_listen="127.0.0.1:0", node="node-3")
    addr = ckpt.metrics_address
    assert addr and not addr.endswith(":0"), addr
    state = {"w": torch.arange(1 << 16, dtype=torch.float32)}
    for step in (1, 2):
        ckpt.save(step, state).wait()
    ckpt.load(2)
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        assert r.status == 200
        body = r.read().decode()
    labels = f'job="{job}",rank="0",node="node-3"'
    assert f"strata_saves_total{{{labels}}} 2" in body.splitlines(), body
    assert f"strata_restores_total{{{labels}}} 1" in body.splitlines(), body
    assert f"strata_last_committed_step{{{labels}}} 2" in body.splitlines(), body
    assert "strata_save_stall_seconds_count" in ckpt.metrics()
    unserved = make(job=job + "-b")
    assert unserved.metrics_address is None
    assert "strata_saves_total{" in unserved.metrics()


def test_slurm_peers_given_as_a_keyword_are_the_allocations_nodes(monkeypatch, tmp_path):
    # The configuration resolves its peers' names: a list of names this
    # machine resolves (the expansion itself is tested in Rust).
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost")
    monkeypatch.setenv("SLURMD_NODENAME", "localhost")
    monkeypatch.delenv("STRATA_NODE", raising=False)
    r = strata.resolve_config(peers=["slurm:7070"], peer_certs=str(tmp_path))
    assert r["peers"] == ["localhost=localhost:7070"]
    assert r["node"] == "localhost"
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    with pytest.raises(strata.InvalidError, match="SLURM_JOB_NODELIST"):
        strata.resolve_config(peers=["slurm:7070"], peer_certs=str(tmp_path))
