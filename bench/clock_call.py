"""The forward clock's cost per call, on the CPU with real torch (bench/README.md):
    python3 bench/clock_call.py [CALLS]
A module whose forward returns its input, called CALLS times (default 200000) in blocks, alternating:
bare; clocked (the shim's `__call__` on its class, the call counted); another instance of the same class
while the first is clocked (the identity check only). Prints the median ns per call of each, and the
difference to bare. The shim's _gpudoc_torch.py is loaded as a GPU run loads it, without CUDA (no record
is taken: every call is a count)."""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shim_module  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "gpudoc", "_shim")


def load():
    file = os.environ.get("SHIM_FILE")
    shim = shim_module.load(os.path.dirname(file) if file else HERE)
    shim._install_peaks(torch)
    return shim


class Same(torch.nn.Module):
    def forward(self, x):
        return x


def per_call(m, x, n):
    t0 = time.perf_counter()
    for _ in range(n):
        m(x)
    return (time.perf_counter() - t0) / n * 1e9


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
    shim = load()
    clocked, other, x = Same(), Same(), torch.empty(1)
    shim._forward_clock_on(torch)
    clocked(x)  # the clock adopts it
    assert shim.F.root() is clocked
    block = 2000
    times = {"bare": [], "clocked": [], "same class": []}
    for _ in range(calls // block):
        shim._forward_clock_off()
        times["bare"].append(per_call(clocked, x, block))
        shim.F.on = shim._wrap(clocked)
        times["clocked"].append(per_call(clocked, x, block))
        times["same class"].append(per_call(other, x, block))
    shim._forward_clock_off()
    bare = statistics.median(times["bare"])
    for k, v in times.items():
        med = statistics.median(v)
        print("%-11s %7.0f ns a call  %+6.0f ns" % (k, med, med - bare))


main()
