"""`strata mount` of PyTorch DCP steps: `model.safetensors` holds every
global tensor by FQN, assembled from the shards of every rank whatever the
sharding, and reads with the reference `safetensors` package. A real FUSE
mount of the `strata` binary; ranks are processes (spawn) on gloo.

Skips without root, /dev/fuse or fusermount3, unless STRATA_REQUIRE_FUSE=1
(the test command sets it where it can mount)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")
if os.environ.get("STRATA_REQUIRE_FUSE") == "1":
    import safetensors.torch as safetensors_torch  # the test command installs it
else:
    safetensors_torch = pytest.importorskip("safetensors.torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "workers"))

import dcp_ranks  # noqa: E402
from test_catalog import strata_bin  # noqa: E402
from test_dcp import all_equal, results  # noqa: E402


def fuse_ready():
    ok = os.geteuid() == 0 and os.path.exists("/dev/fuse") and shutil.which("fusermount3")
    if not ok:
        if os.environ.get("STRATA_REQUIRE_FUSE") == "1":
            raise AssertionError("FUSE is required (STRATA_REQUIRE_FUSE=1): root, /dev/fuse and fusermount3")
        pytest.skip("mounting needs root, /dev/fuse and fusermount3")


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == os.path.realpath(path) for line in f)


class Mount:
    def __init__(self, args, at):
        os.makedirs(at, exist_ok=True)
        self.at = at
        self.log = open(str(at) + ".log", "w+")
        self.proc = subprocess.Popen([strata_bin(), "mount", *args, str(at), "--foreground"],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        t0 = time.time()
        while not mounted(at):
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise AssertionError(f"strata mount exited: {self.log.read()}")
            assert time.time() - t0 < 30, "not mounted within 30 s"
            time.sleep(0.05)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        assert rc == 0
        assert not mounted(self.at)


@pytest.fixture
def settings(l1, job):
    return {"job": job, "l1_dir": l1, "chunk_size": 1 << 18}


def test_model_safetensors_of_a_dcp_step_is_every_global_tensor_by_fqn(tmp_path, settings):
    fuse_ready()
    out = str(tmp_path / "out")
    os.makedirs(out)
    # Three ranks, uneven splits: Shard(1) of [37, 24], Shard(0) of a
    # bf16 [16, 10], a replicated tensor, a plain one, non-tensor values.
    layout = {"emb": "s1", "w": "s0", "b": "r", "rep": "plain", "big": "s0"}
    dcp_ranks.run_world(3, dcp_ranks.save_rank, {"out": out, "settings": settings, "step": 5, "layout": layout})
    all_equal(results(out, "save"), 3)
    m = Mount(["--job", settings["job"], "--l1", settings["l1_dir"]], tmp_path / "mnt")
    try:
        step = m.at / "latest"
        assert sorted(os.listdir(step)) == [
            "manifest.json", "model.safetensors",
            "rank-0", "rank-0.safetensors", "rank-1", "rank-1.safetensors", "rank-2", "rank-2.safetensors",
        ]
        got = safetensors_torch.load_file(str(step / "model.safetensors"))
        want = {f"model.{k}": v for k, v in dcp_ranks.global_tensors().items()}
        # The non-tensor values (and DCP's .metadata) are blobs: not in it.
        assert sorted(got) == sorted(want)
        for k, t in want.items():
            assert got[k].dtype == t.dtype and got[k].shape == t.shape, k
            assert torch.equal(got[k], t), k
        # One tensor alone, as a notebook would.
        from safetensors import safe_open

        with safe_open(str(step / "model.safetensors"), framework="pt") as f:
            assert torch.equal(f.get_tensor("model.emb"), want["model.emb"])
        # manifest.json names each piece's place; a rank's file is its pieces.
        man = json.loads((step / "manifest.json").read_text())
        places = [e["global"] for r in man["ranks"] for e in r["entries"] if "global" in e]
        assert {p["fqn"] for p in places} == set(want)
        assert {tuple(p["shape"]) for p in places if p["fqn"] == "model.emb"} == {(37, 24)}
        r1 = safetensors_torch.load_file(str(step / "rank-1.safetensors"))
        assert any(v.shape == (37, 8) for v in r1.values())
        del got, r1, f  # their files may stay mapped until then
        import gc

        gc.collect()
    finally:
        m.stop()
