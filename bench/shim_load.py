"""What loading the shim's torch module costs at `import torch` (bench/README.md): gpudoc._shim.torch loaded
as GpudocFinder loads it, its bytecode cached, ROUNDS times per shim folder, alternated; median and 10th
percentile (the machine's load moves the median more than the shim does).
    python3 bench/shim_load.py FOLDER [FOLDER ...]   (e.g. python/gpudoc/_shim and an older copy)"""
import gc
import os
import statistics
import sys
import time

ROUNDS = 300


def load(here):
    ext = sys.modules["_frozen_importlib_external"]
    path = os.path.join(here, "_gpudoc_torch.py")
    loader = ext.SourceFileLoader("gpudoc._shim.torch", path)
    # The modules of earlier rounds are garbage, and a collection during this load would walk them: a
    # process loads the shim once.
    sys.modules.pop("gpudoc._shim.torch", None)
    gc.collect()
    t = time.perf_counter()
    code = loader.get_code("gpudoc._shim.torch")
    module = type(sys)("gpudoc._shim.torch")
    module.__file__ = "<gpudoc> " + path
    sys.modules[module.__name__] = module
    exec(code, module.__dict__)
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
