"""A fixed training loop (an 8-layer bf16 MLP with AdamW) that prints its own throughput, for measuring
gpudoc's overhead: run it bare and under `gpudoc run`, alternating, in one session (bench/README.md)."""
import json
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
d, batch = 4096, 2048
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU()) for _ in range(8)])
model = model.cuda().to(torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(batch, d, device="cuda", dtype=torch.bfloat16)


def step():
    opt.zero_grad(set_to_none=True)
    model(x).float().pow(2).mean().backward()
    opt.step()


for _ in range(30):
    step()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(steps):
    step()
torch.cuda.synchronize()
dt = time.perf_counter() - t
print(json.dumps({"steps": steps, "seconds": dt, "steps_per_s": steps / dt}), flush=True)
