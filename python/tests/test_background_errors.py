"""Failures a training loop cannot miss: a save that fails in the
background is raised by the next ``save`` (after the ``busy_policy="wait"``
wait), ``flush`` or ``close`` unless its handle reported it;
``on_background_error="log"`` only logs and counts it; ``last_error`` and
the counters are properties; log records reach ``logging`` on their own,
stamped with the time they happened."""

import logging
import time

import pytest
import torch

import strata
from strata import _checkpointer


@pytest.fixture
def lonely(monkeypatch):
    """Rank 0 of a world of two whose rank 1 never comes (a real TCPStore):
    every commit round times out, so every save fails in the background."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    monkeypatch.setattr(_checkpointer, "torch_world", lambda: (0, 2, store))
    return store


def state(v=1.0):
    return {"w": torch.full((1024,), v), "step": int(v)}


def test_a_dropped_handles_failure_is_raised_by_the_next_save_flush_and_close(make, lonely):
    ckpt = make(coordination_timeout_secs=1)
    ckpt.save(1, state())  # the handle is dropped, as in the README's loop
    t = time.monotonic()
    with pytest.raises(strata.UnavailableError, match="step 1 failed in the background"):
        ckpt.save(2, state(2))
    assert time.monotonic() - t > 0.5, "busy_policy wait: it waited for step 1 first"
    assert ckpt.failed_saves == 1
    assert isinstance(ckpt.last_error, strata.UnavailableError)
    assert "step 1" in str(ckpt.last_error)
    # Raised once: saving again goes ahead.
    h = ckpt.save(2, state(2))
    with pytest.raises(strata.UnavailableError):
        h.wait()
    # Step 2's failure was reported by its handle: not raised again.
    ckpt.save(3, state(3))
    with pytest.raises(strata.UnavailableError, match="step 3"):
        ckpt.flush()
    ckpt.flush()
    ckpt.save(4, state(4))
    with pytest.raises(strata.UnavailableError, match="step 4"):
        ckpt.close()
    # Readable after close.
    assert ckpt.failed_saves == 4
    assert ckpt.health["failed_saves"] == 4 and "step 4" in str(ckpt.last_error)
    ckpt.close()


def test_a_failure_leaving_a_with_block_does_not_hide_the_blocks_own_exception(l1, job, lonely, caplog):
    with pytest.raises(KeyError):
        with strata.Checkpointer(job=job, l1_dir=l1, coordination_timeout_secs=1) as ckpt:
            ckpt.save(1, state())
            raise KeyError("the loop's own error")
    assert ckpt.failed_saves == 1
    assert any("step 1 failed in the background" in r.getMessage() for r in caplog.records)


def test_with_log_a_failure_is_logged_and_counted_not_raised(make, lonely, caplog):
    with caplog.at_level(logging.ERROR, logger="strata"):
        ckpt = make(coordination_timeout_secs=1, on_background_error="log")
        ckpt.save(1, state())
        ckpt.save(2, state(2))
        ckpt.flush()
        ckpt.close()
    assert ckpt.failed_saves == 2
    assert "step 2" in str(ckpt.last_error)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "strata"]
    assert any("save failed in the background" in r.getMessage() for r in errors), errors


def test_skipped_saves_and_dropped_uploads_are_counted(make, tmp_path):
    ckpt = make(busy_policy="skip")
    h = ckpt.save(1, {"w": torch.randn(256 << 20 >> 2)})
    assert ckpt.save(2, state()).wait()["skipped"]
    h.wait()
    assert ckpt.skipped_saves == 1 and ckpt.health["skipped_saves"] == 1
    assert ckpt.failed_saves == 0 and ckpt.last_error is None

    # L3 slower than the saves, one upload allowed to wait: the rest drop.
    ckpt = make(job="up", l3_url=f"file://{tmp_path}/l3", upload_every=1, max_pending_uploads=1,
                upload_bytes_per_sec=4 << 20, keep_last=2)
    for step in range(1, 9):
        ckpt.save(step, {"w": torch.randn(1 << 19)}).wait()
    ckpt.flush()
    dropped = [s for s in ckpt._native.steps() if (s["upload"] or "").startswith("failed: dropped")]
    assert ckpt.dropped_uploads > 0
    assert ckpt.health["dropped_uploads"] == ckpt.dropped_uploads
    assert ckpt.dropped_pushes == 0  # no peers
    assert len(dropped) <= ckpt.dropped_uploads


def test_log_records_arrive_on_their_own_with_the_time_they_happened(make):
    got = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append((record, time.time()))

    logger = logging.getLogger("strata")
    handler = Keep(level=logging.INFO)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        ckpt = make()
        # One C call that holds the GIL for about a second on this
        # machine, whatever its speed (sized from a short one first).
        c0 = time.perf_counter()
        sum(range(2_000_000))
        n = int(2_000_000 * 1.0 / max(time.perf_counter() - c0, 1e-6))
        ckpt.save(1, state())
        # Hold the GIL (one C call that never yields) while the step
        # becomes durable in the background.
        t0 = time.time()
        sum(range(n))
        t1 = time.time()
        assert t1 - t0 > 0.5, "the hold was too short to tell"
        # No call into the package from here on.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("step durable" in r.getMessage() for r, _ in got):
            time.sleep(0.01)
        durable = [(r, at) for r, at in got if "step durable on L1" in r.getMessage()]
        assert durable, "the record reached logging without a call into the package"
        record, received = durable[0]
        # Stamped when the Rust event fired (during the hold), not when
        # Python received it (after).
        assert record.created < t1 - 0.2 < received, (record.created, t0, t1, received)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
