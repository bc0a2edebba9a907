"""Rolling back after a loss spike: ``load(step, discard_newer=True)``
restores an older step and deletes every newer one from L1 and L3, so the
latest step and retention follow the branch trained from there;
``delete`` retires chosen steps; a pinned step is refused."""

import subprocess

import pytest
import torch

import strata
from test_catalog import strata_bin


def state(step, branch=0):
    g = torch.Generator().manual_seed(step * 10 + branch)
    return {"w": torch.randn(64, 64, generator=g), "step": step, "branch": branch}


def test_a_rollback_discards_the_newer_steps_and_training_goes_on_from_it(make, tmp_path):
    l3 = tmp_path / "l3"
    l3.mkdir()
    ck = make(l3_url=f"file://{l3}", upload_every=1, keep_last=10, l3_keep_last=10)
    for step in range(1, 6):
        ck.save(step, state(step)).wait()
    ck.flush()
    assert ck.steps() == [1, 2, 3, 4, 5]

    got = ck.load(3, discard_newer=True)
    assert got["step"] == 3 and torch.equal(got["w"], state(3)["w"])
    assert ck.discarded == [4, 5]
    assert ck.steps() == [1, 2, 3]
    assert ck.latest_step() == 3
    assert all(not ck.status(s)["l3"] for s in (4, 5))

    # The freed step numbers are saved again, on the new branch.
    for step in (4, 5):
        ck.save(step, state(step, branch=1)).wait()
    ck.flush()
    latest = ck.load()
    assert latest["branch"] == 1 and torch.equal(latest["w"], state(5, 1)["w"])


def test_load_into_discards_too_and_delete_retires_chosen_steps(make):
    ck = make(keep_last=10)
    for step in range(1, 5):
        ck.save(step, state(step)).wait()
    target = state(0)
    assert ck.load_into(target, 2, discard_newer=True) == 2
    assert target["step"] == 2 and torch.equal(target["w"], state(2)["w"])
    assert ck.steps() == [1, 2]
    assert ck.delete(1) == [1]
    assert ck.delete([1, 42]) == []
    assert ck.steps() == [2]


def test_a_pinned_step_is_refused_and_nothing_is_deleted(make, l1, job):
    ck = make(keep_last=10)
    for step in range(1, 4):
        ck.save(step, state(step)).wait()
    subprocess.run([strata_bin(), "pin", "3", "--l1", str(l1), "--job", job], check=True)
    with pytest.raises(strata.InvalidError, match="pinned"):
        ck.delete([2, 3])
    assert ck.steps() == [1, 2, 3]
