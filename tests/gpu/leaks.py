"""Planted leaks for gpudoc's leak hunt on a real GPU (fixtures/leaks/), each in a small training loop whose
activations are 16 MiB a step:
    python3 leaks.py list | dict | graph | helper | healthy | plateau [STEPS]
list: the step's output kept in a list; dict: a cache keyed by step; graph: a loss accumulated with its
graph (no backward through it); helper: a second module keeps a copy; plateau: a cache that fills in the
first 15 steps, then stays. Prints the step times (ms) as one JSON line at the end."""
import json
import sys
import time

import torch

import leak_helper

what = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
dev = torch.device("cuda:0")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(2048, 2048, device=dev)
kept = []
cache = {}
total = 0
times = []
for step in range(steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    y = model(x)
    y.pow(2).mean().backward()
    opt.step()
    if what == "list":
        kept.append(y.detach())
    elif what == "dict":
        cache[step] = torch.randn(1024, 2048, device=dev)
    elif what == "graph":
        total = total + model(x).mean()
    elif what == "helper":
        leak_helper.remember(x)
    elif what == "plateau" and step < 15:
        kept.append(torch.randn(2048, 2048, device=dev))
    torch.cuda.synchronize()
    times.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"step_ms": [round(t, 3) for t in times]}), flush=True)
