"""Holds GiB of GPU memory on cuda:0 until killed (a foreign process for OOM scenarios).
    python3 hold.py 100      # hold 100 GiB
    python3 hold.py all 2    # hold all free memory but 2 GiB"""
import sys
import time

import torch

GiB = 1 << 30
if sys.argv[1] == "all":
    free, _ = torch.cuda.mem_get_info(0)
    n = free - int(float(sys.argv[2]) * GiB)
else:
    n = int(float(sys.argv[1]) * GiB)
x = torch.empty(n, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print(f"held {n}", flush=True)
while True:
    time.sleep(1)
