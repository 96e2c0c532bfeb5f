"""What loading the shim's torch module costs at `import torch` (bench/README.md): gpudoc._shim.torch loaded
as GpudocFinder loads it, its bytecode cached, ROUNDS times per shim folder, alternated; median and 10th
percentile (the machine's load moves the median more than the shim does).
    python3 bench/shim_load.py FOLDER [FOLDER ...]   (e.g. python/gpudoc/_shim and an older copy)"""
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shim_module  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", 300))


def load(here):
    shim_module.loader(here)  # once a folder: the loader is loaded once a process, before import torch
    # The modules of earlier rounds are garbage, and a collection during this load would walk them: a
    # process loads the shim once.
    sys.modules.pop(shim_module.NAME, None)
    gc.collect()
    t = time.perf_counter()
    shim_module.load(here)
    return time.perf_counter() - t


folders = sys.argv[1:]
times = {f: [] for f in folders}
for f in folders:
    load(f)  # writes the .pyc files where it may
for _ in range(ROUNDS):
    for f in folders:
        times[f].append(load(f))
for f in folders:
    ms = sorted(t * 1e3 for t in times[f])
    print("%-40s median %.2f ms, p10 %.2f ms" % (f, statistics.median(ms), ms[len(ms) // 10]))
