"""Allocates known amounts on cuda:0 in steps, so gpudoc's numbers can be checked against PyTorch's own.

    gpudoc run --json report.json -- python3 tests/gpu/alloc_known.py

Prints one JSON line at the end with torch's view: max_memory_reserved, max_memory_allocated. Without
torch or a GPU it says so and exits 0, so the command still shows gpudoc at work.
"""
import json
import sys
import time

try:
    import torch
except ImportError:
    print("alloc_known: torch is not installed; nothing to allocate", file=sys.stderr)
    sys.exit(0)
if not torch.cuda.is_available():
    print("alloc_known: no CUDA GPU here; nothing to allocate", file=sys.stderr)
    sys.exit(0)

GiB = 1 << 30
dev = torch.device("cuda:0")


def nvml_own_bytes():
    """This process's memory on GPU 0 as NVML sees it (None without pynvml)."""
    try:
        import os
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid():
                return p.usedGpuMemory
    except Exception:
        return None


torch.cuda.init()
torch.cuda.synchronize()
context_at_start = nvml_own_bytes()
held = []
for gib in (1, 2, 4, 8):  # 15 GiB in all, held at the peak
    held.append(torch.empty(gib * GiB, dtype=torch.uint8, device=dev))
    torch.cuda.synchronize()
    time.sleep(0.3)
time.sleep(0.5)
del held[-1]  # back to 7 GiB live; the cache still reserves 15
torch.cuda.synchronize()
time.sleep(0.3)
nvml_now = nvml_own_bytes()
print(json.dumps({
    "context_at_start": context_at_start,
    "non_pytorch_at_end": None if nvml_now is None else nvml_now - torch.cuda.memory_reserved(dev),
    "max_memory_reserved": torch.cuda.max_memory_reserved(dev),
    "max_memory_allocated": torch.cuda.max_memory_allocated(dev),
    "memory_reserved": torch.cuda.memory_reserved(dev),
}), flush=True)
