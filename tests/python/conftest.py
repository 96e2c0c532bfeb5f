"""Shared fixtures of the Python side's unit tests (run by tests/python.rs, or by hand with
`PYTHONPATH=python target/py-venv/bin/python -m pytest tests/python` after `cargo test --workspace
--no-run`)."""
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIB = 1 << 30
MIB = 1 << 20


def _fake_nvml_lib():
    path = os.environ.get("GPUDOC_TEST_FAKE_NVML") or os.path.join(ROOT, "target/debug/deps/libfake_nvml.so")
    if not os.path.exists(path):
        pytest.fail("%s is missing: build it with `cargo test --workspace --no-run`" % path)
    return path


class FakeGpus(object):
    """The fake NVML's state file (tests/fake-nvml/src/state.rs): GPUs, the processes on them, and
    errors injected into named functions."""

    def __init__(self, path, n=1):
        self.path = path
        self.lib = _fake_nvml_lib()
        self.state = {
            "driver": "580.159.04",
            "cuda": 13000,
            "devices": [
                {"name": "NVIDIA H200", "uuid": "GPU-fa4e0000-0000-0000-0000-00000000000%d" % i,
                 "total": 143771 * MIB, "reserved": 615 * MIB}
                for i in range(n)
            ],
            "procs": [],
            "errors": [],
        }
        self.store()

    def store(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
        os.rename(tmp, self.path)

    def hold(self, pid, nbytes, gpu=0, ghost=False):
        self.state["procs"].append({"pid": pid, "gpu": gpu, "bytes": nbytes, "ghost": ghost})
        self.store()

    def fail(self, func, code):
        self.state["errors"].append({"func": func, "code": code})
        self.store()


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """One fake H200, loaded through GPUDOC_NVML_LIB as gpudoc loads NVML."""
    gpus = FakeGpus(str(tmp_path / "state.json"))
    monkeypatch.setenv("FAKE_NVML_STATE", gpus.path)
    monkeypatch.setenv("GPUDOC_NVML_LIB", gpus.lib)
    return gpus


# The shim's fixtures (its modules loaded against the real torch), for every test of this folder.
from shim_env import cuda, shim  # noqa: E402, F401
