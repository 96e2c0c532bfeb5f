"""What `%load_ext gpudoc` costs a notebook cell in which nothing changes: IPython's own run_cell of an
empty cell (`pass`) timed with the extension loaded and not, alternated in one process (an in-process
IPython shell, no kernel: the callbacks are the same). Prints one JSON line: µs per cell, each round.
    python bench/notebook_cell.py [CELLS] [--cuda]
With --cuda, torch (real or the fake) and CUDA are initialised first, so the extension reads torch's
statistics through the shim and, where NVML loads, the process's memory at every cell."""
import json
import sys
import time

from IPython.core.interactiveshell import InteractiveShell

cells = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2000
shell = InteractiveShell.instance()
if "--cuda" in sys.argv:
    shell.run_cell("import torch\ntorch.cuda.init()\nkept = torch.empty(1 << 20) if hasattr(torch, '_C') and "
                   "torch.__version__.endswith('fake') else torch.zeros(1 << 18, device='cuda')")


def per_cell(n):
    t = time.perf_counter()
    for _ in range(n):
        shell.run_cell("pass", store_history=True)
    return (time.perf_counter() - t) / n * 1e6


per_cell(200)
rounds = []
for _ in range(3):
    bare = per_cell(cells)
    shell.run_cell("%load_ext gpudoc")
    per_cell(50)
    loaded = per_cell(cells)
    shell.run_cell("%unload_ext gpudoc")
    rounds.append({"bare_us": round(bare, 1), "loaded_us": round(loaded, 1), "cost_us": round(loaded - bare, 1)})
print(json.dumps({"cells": cells, "rounds": rounds}))
