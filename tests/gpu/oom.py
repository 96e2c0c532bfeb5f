"""Provokes a real out-of-memory failure on cuda:0, one scenario per run, and lets the exception escape so
the real traceback is printed (what gpudoc's scanner must read).
    python3 oom.py too_big | fragmentation | cublas | squeeze"""
import sys

import torch

GiB = 1 << 30
MiB = 1 << 20
dev = torch.device("cuda:0")
what = sys.argv[1]

if what == "too_big":
    # Far more than the card has.
    x = torch.empty(200 * GiB, dtype=torch.uint8, device=dev)
elif what == "squeeze":
    # Ask for more than is free now (another process may hold memory): free + 10 GiB.
    free, _ = torch.cuda.mem_get_info(0)
    keep = torch.empty(10 * GiB, dtype=torch.uint8, device=dev)
    x = torch.empty(free, dtype=torch.uint8, device=dev)
elif what == "fragmentation":
    # 3 MiB tensors share 20 MiB segments; keep one in six so no segment can be released, then ask for
    # one block larger than any free piece once the device is full.
    blocks = []
    try:
        while True:
            blocks.append(torch.empty(3 * MiB, dtype=torch.uint8, device=dev))
    except torch.OutOfMemoryError:
        pass
    kept = [b for i, b in enumerate(blocks) if i % 6 == 0]
    del blocks
    print(f"kept {len(kept)} blocks; allocated {torch.cuda.memory_allocated(dev)} "
          f"reserved {torch.cuda.memory_reserved(dev)}", file=sys.stderr, flush=True)
    x = torch.empty(4 * GiB, dtype=torch.uint8, device=dev)
elif what == "cublas":
    # Fill the device, then make cuBLAS create its handle and workspace.
    a = torch.randn(64, 64, device=dev)
    free, _ = torch.cuda.mem_get_info(0)
    fill = []
    try:
        while True:
            fill.append(torch.empty(64 * MiB, dtype=torch.uint8, device=dev))
    except torch.OutOfMemoryError:
        pass
    try:
        while True:
            fill.append(torch.empty(1 * MiB, dtype=torch.uint8, device=dev))
    except torch.OutOfMemoryError:
        pass
    torch.cuda.empty_cache()
    b = a @ a
    torch.cuda.synchronize()
    print("cublas: no failure", file=sys.stderr)
else:
    sys.exit(f"unknown scenario {what}")
