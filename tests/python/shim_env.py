"""The shim's modules loaded against the real torch of target/py-venv, as a GPU run puts them in place (the
same loader, _gpudoc_pipe.py's, as the notebook extension's `load_shim` runs it, under their own names in
sys.modules), with the pipe going to a file the test reads. Imported by the test_shim_*.py files (a module
beside them, not conftest.py: one place per helper)."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "python", "gpudoc", "_shim")
NAMES = ("gpudoc._shim.torch", "gpudoc._shim.hunt", "gpudoc._shim.where", "gpudoc._shim.patch",
         "gpudoc._shim.pipe")


class Shim(object):
    """The loaded modules (`torch`: _gpudoc_torch.py; `hunt`, `where`) and the pipe's file."""

    def __init__(self, tmp_path, torch, full=False):
        """`full`: every hook `import torch` puts in place under gpudoc run (_install), not only the
        peaks' wrappers."""
        for name in NAMES:
            sys.modules.pop(name, None)
        from gpudoc.notebook import load_shim

        shim = load_shim()
        self.pipe = str(tmp_path / "pipe")
        open(self.pipe, "w").close()
        shim._connect(self.pipe)
        shim.S.here = HERE
        if full:
            shim._install(torch)
        else:
            shim._install_peaks(torch)
        self.torch = shim
        self.hunt = shim._hunt_module()
        self.hunt._prepare(torch)
        self.where = shim.SHARED.load(HERE, "_gpudoc_where.py", NAMES[2])
        shim.S.where_module = self.where

    def messages(self):
        with open(self.pipe) as f:
            return [json.loads(line) for line in f if line.strip()]

    def remove(self):
        """Every change the shim made is taken back through its registry (torch's functions are torch's
        again, its hooks gone), and its modules leave sys.modules."""
        self.torch._forward_clock_off()
        S = self.torch.S
        if S.where_module is not None:
            S.where_module.close(self.torch)  # a measure's hooks, left by a test that failed
        self.torch._patches().remove_all()
        for name in NAMES:
            sys.modules.pop(name, None)


@pytest.fixture
def shim(tmp_path):
    torch = pytest.importorskip("torch")
    s = Shim(tmp_path, torch)
    yield s
    s.remove()


def _stats(device=0):
    return {"allocated_bytes": {"all": {"current": 0, "peak": 0}},
            "reserved_bytes": {"all": {"current": 0, "peak": 0}}}


@pytest.fixture
def cuda(shim, monkeypatch):
    """The shim's hooks module as after CUDA's start, the allocator's readings played (no CUDA here:
    allocated and reserved stay 0)."""
    T = shim.torch
    monkeypatch.setattr(T.S, "orig_stats", _stats)
    monkeypatch.setattr(T.S, "orig_reset", lambda device=0: None)
    monkeypatch.setattr(T.S, "cuda", True)
    monkeypatch.setattr(T.S, "devices", [0])
    return T
