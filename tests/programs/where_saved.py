"""Records the where-walk's record at an OOM in a forward whose graph below holds saved tensors packed by
saved-tensor hooks (fixtures/where/cpu_hooked_oom.json): real torch on the CPU, the shim's modules loaded
as a GPU run loads them (tests/python/shim_env.py). Two blocks checkpointed (use_reentrant=False), one
plain, and the OOM's walk called in the fourth block's forward under save_on_cpu, where the OOM observer
would call it. No GPU: the walk counts no tensor of the device (the parts are zero, allocated is 0).
    target/py-venv/bin/python tests/programs/where_saved.py > fixtures/where/cpu_hooked_oom.json"""
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from shim_env import Shim  # noqa: E402

shim = Shim(Path(tempfile.mkdtemp()), torch)
records = []


class Block(torch.nn.Module):
    def __init__(self, n, oom=False):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)
        self.oom = oom

    def forward(self, x):
        y = torch.tanh(self.lin(x))
        if self.oom:
            records.append(shim.where.at_oom(torch, shim.hunt, 0, 0))
        return y.sin()


class Net(torch.nn.Module):
    def __init__(self, n=8):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(n), Block(n), Block(n), Block(n, oom=True)])

    def forward(self, x):
        for b in self.blocks[:2]:
            x = checkpoint(b, x, use_reentrant=False)
        x = self.blocks[2](x)
        with torch.autograd.graph.save_on_cpu():
            x = self.blocks[3](x)
        return x


def main():
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(3, 8, requires_grad=True)
    net(x).sum().backward()
    (record,) = records
    record["pid"] = os.getpid()
    json.dump(record, sys.stdout, indent=1, sort_keys=True)
    print()


main()
shim.remove()
