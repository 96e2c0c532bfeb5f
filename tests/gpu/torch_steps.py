"""A real training loop (a small transformer) that prints PyTorch's own numbers after every optimizer step,
to compare with what gpudoc's shim recorded at the same steps.
    python3 torch_steps.py STEPS [--leak]     (--leak keeps 64 MiB per step alive: a step leak)"""
import json
import sys

import torch

steps = int(sys.argv[1])
leak = "--leak" in sys.argv
torch.manual_seed(0)
dev = torch.device("cuda:0")
model = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True),
    num_layers=6,
).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(32, 256, 1024, device=dev)
kept = []
for i in range(steps):
    opt.zero_grad(set_to_none=True)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    if leak:
        kept.append(torch.empty(64 << 20, dtype=torch.uint8, device=dev))
    torch.cuda.synchronize()
    print(json.dumps({"step": i + 1, "allocated": torch.cuda.memory_allocated(dev),
                      "reserved": torch.cuda.memory_reserved(dev)}), flush=True)
