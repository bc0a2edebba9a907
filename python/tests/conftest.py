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


@pytest.fixture
def damage(l1, job):
    """``damage(needle, offset)``: flips the byte ``offset`` bytes past
    ``needle`` in the one L1 chunk file that holds it (asserted unique)."""
    import glob

    def flip(needle: bytes, offset: int) -> None:
        hit = []
        for path in glob.glob(os.path.join(l1, job, "chunks", "*", "*")):
            with open(path, "rb") as f:
                at = f.read().find(needle)
            if at >= 0:
                hit.append((path, at))
        assert len(hit) == 1, hit
        path, at = hit[0]
        with open(path, "r+b") as f:
            f.seek(at + offset)
            b = f.read(1)
            f.seek(at + offset)
            f.write(bytes([b[0] ^ 0xFF]))

    return flip


def python():
    return sys.executable
