"""Shared fixtures: a fresh L1 directory and job per test."""

import os
import sys
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def l1(tmp_path):
    return str(tmp_path / "l1")


@pytest.fixture
def job():
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def make(l1, job):
    """Opens checkpointers on the test's L1 directory; closes them after."""
    import strata

    opened = []

    def open_(**kw):
        kw.setdefault("job", job)
        kw.setdefault("l1_dir", l1)
        kw.setdefault("chunk_size", 1 << 20)
        c = strata.Checkpointer(**kw)
        opened.append(c)
        return c

    yield open_
    for c in opened:
        c.close()


def python():
    return sys.executable
