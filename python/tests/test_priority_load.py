"""Priority loads: ``load_into(state, first=[...])`` fills the tensors under
the ``first`` paths, returns a ``Loading`` handle, and fills the rest at
``wait()``."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import strata  # noqa: E402


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])


def _trained(seed):
    """A model and an Adam optimizer with state (two moments per weight)."""
    model = _model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 256)).sum().backward()
    opt.step()
    return model, opt


def test_first_part_is_in_place_when_it_returns_and_the_rest_at_wait(make):
    ckpt = make()
    model, opt = _trained(0)
    saved = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3, "arr": np.arange(4096.0)}
    ckpt.save(7, saved).wait()
    want_model = {k: v.clone() for k, v in model.state_dict().items()}
    want_exp = [s["exp_avg"].clone() for s in opt.state_dict()["state"].values()]

    other, other_opt = _trained(1)
    state = {"model": other.state_dict(), "optim": other_opt, "epoch": 0, "arr": np.zeros(4096)}
    exp_before = [s["exp_avg"].clone() for s in other_opt.state_dict()["state"].values()]
    loading = ckpt.load_into(state, first=["model"])
    assert isinstance(loading, strata.Loading)
    assert loading.step == 7
    # The weights are loaded (the module's own parameters: the state_dict's
    # tensors are views of them)...
    for k, v in other.state_dict().items():
        assert torch.equal(v, want_model[k]), k
    # ...and nothing else changed before wait(): not the optimizer, not the
    # plain values, not the array.
    got_exp = [s["exp_avg"] for s in other_opt.state_dict()["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(got_exp, exp_before))
    assert state["epoch"] == 0 and not state["arr"].any()
    assert loading.stats["bytes_read"] > 0

    assert loading.wait() == 7
    assert loading.done()
    got_exp = [s["exp_avg"] for s in other_opt.state_dict()["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(got_exp, want_exp))
    assert state["epoch"] == 3
    assert np.array_equal(state["arr"], np.arange(4096.0))
    assert 0 < loading.first_seconds <= loading.seconds
    assert loading.stats["first_seconds"] == loading.first_seconds
    assert ckpt.last_restore["seconds"] == loading.seconds
    # Both reads are counted: at least every tensor's bytes.
    total = sum(v.numel() * v.element_size() for v in want_model.values())
    assert loading.stats["bytes_read"] > total
    assert loading.wait() == 7  # again: the same answer


def test_first_must_cover_a_tensor(make):
    ckpt = make()
    model, _ = _trained(0)
    ckpt.save(1, {"model": model.state_dict()}).wait()
    with pytest.raises(strata.InvalidError, match="no tensor"):
        ckpt.load_into({"model": _model(1).state_dict()}, first=["modle"])
    # A prefix matches whole path components only.
    with pytest.raises(strata.InvalidError, match="no tensor"):
        ckpt.load_into({"model": _model(1).state_dict()}, first="mod")
    with pytest.raises(strata.InvalidError):
        ckpt.load_into({"model": _model(1).state_dict()}, first=[])
    # Every path must cover a tensor: a typo beside a good path is refused.
    with pytest.raises(strata.InvalidError, match="optimzer"):
        ckpt.load_into({"model": _model(1).state_dict()}, first=["model", "optimzer"])
    with pytest.raises(strata.InvalidError, match="discard_newer"):
        ckpt.load_into({"model": _model(1).state_dict()}, first="model", discard_newer=True)


def _load_with_a_damaged_rest(make, damage):
    """Step 1 saved with its optimizer's chunk damaged on disk, then a
    priority load of the model into a fresh state (optimizer all 5.0).
    Returns the checkpointer, what was saved, the state and the Loading."""
    ckpt = make(chunk_size=1 << 20)
    torch.manual_seed(0)
    saved = {"model": {"w": torch.randn(1 << 18)}, "optim": {"m": torch.randn(1 << 18)}}
    ckpt.save(1, saved).wait()
    damage(saved["optim"]["m"].numpy().tobytes()[:4096], 100)
    state = {"model": {"w": torch.zeros(1 << 18)}, "optim": {"m": torch.full((1 << 18,), 5.0)}}
    return ckpt, saved, state, ckpt.load_into(state, first="model")


def test_a_damaged_rest_is_raised_by_wait_and_leaves_the_rest_as_it_was(make, damage):
    _, saved, state, loading = _load_with_a_damaged_rest(make, damage)
    assert torch.equal(state["model"]["w"], saved["model"]["w"])
    with pytest.raises(strata.CorruptError):
        loading.wait()
    with pytest.raises(strata.CorruptError):
        loading.wait()
    assert torch.all(state["optim"]["m"] == 5.0)


def test_a_save_after_a_failed_rest_is_refused_once(make, damage):
    """The rest failed and nobody called wait(): saving the half-loaded
    state (new weights, old optimizer) would commit it. The save raises and
    saves nothing."""
    ckpt, _, state, loading = _load_with_a_damaged_rest(make, damage)
    with pytest.raises(strata.InvalidError, match="half loaded") as e:
        ckpt.save(2, state)
    assert isinstance(e.value.__cause__, strata.CorruptError)
    assert ckpt.steps() == [1]
    with pytest.raises(strata.CorruptError):
        loading.wait()


def test_a_save_waits_for_the_rest_of_a_load_first(make):
    ckpt = make()
    torch.manual_seed(0)
    saved = {"model": {"w": torch.randn(1 << 20)}, "optim": {"m": torch.randn(1 << 21)}}
    ckpt.save(1, saved).wait()
    state = {"model": {"w": torch.zeros(1 << 20)}, "optim": {"m": torch.zeros(1 << 21)}}
    loading = ckpt.load_into(state, first="model")
    # Saving the state now would save a half-loaded optimizer: the save
    # settles the load first, so step 2 holds the loaded state.
    ckpt.save(2, state).wait()
    assert loading.done()
    again = ckpt.load(2)
    assert torch.equal(again["optim"]["m"], saved["optim"]["m"])
    assert torch.equal(again["model"]["w"], saved["model"]["w"])


def test_a_shared_entry_fills_only_its_target_under_first_early(make):
    """One tensor saved under two paths is one entry; loaded into two
    tensors, only the one under ``first`` changes before ``wait()``."""
    ckpt = make()
    torch.manual_seed(0)
    w = torch.randn(4096)
    ckpt.save(1, {"model": {"w": w}, "ema": {"w": w}}).wait()
    state = {"model": {"w": torch.zeros(4096)}, "ema": {"w": torch.zeros(4096)}}
    loading = ckpt.load_into(state, first="model")
    assert torch.equal(state["model"]["w"], w)
    assert not state["ema"]["w"].any(), "a target outside first changed early"
    loading.wait()
    assert torch.equal(state["ema"]["w"], w)


def test_a_chunk_holding_tensors_of_both_parts_is_read_once(make):
    # Small tensors (these weights, biases and moments are all under an
    # eighth of a chunk) are packed together: most packs hold weights and
    # moments alike. Each is read once, by the first part.
    ckpt = make()
    model, opt = _trained(0)
    ckpt.save(3, {"model": model.state_dict(), "optim": opt.state_dict()}).wait()
    other, other_opt = _trained(1)
    ckpt.load_into({"model": other.state_dict(), "optim": other_opt})
    whole = dict(ckpt.last_restore)
    other, other_opt = _trained(1)
    loading = ckpt.load_into({"model": other.state_dict(), "optim": other_opt}, first="model")
    loading.wait()
    for k, v in other.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    got = [s["exp_avg_sq"] for s in other_opt.state_dict()["state"].values()]
    want = [s["exp_avg_sq"] for s in opt.state_dict()["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert loading.stats["chunks"] == whole["chunks"]
    assert loading.stats["bytes_read"] == whole["bytes_read"]
