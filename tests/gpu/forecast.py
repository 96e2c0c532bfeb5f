"""Issue 33 on a real GPU: a training loop (a small transformer, as torch_steps.py's) that prints
`step N t=S` (seconds since it started) after every optimizer step. leak: keeps --mib MiB more every step
alive in the list `kept`, until the GPU runs out; healthy: keeps nothing, and stops after --secs seconds.
    python3 forecast.py leak|healthy [--mib 128] [--secs 75]"""
import sys
import time

import torch


def arg(name, default):
    return float(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


mode = sys.argv[1]
mib = int(arg("--mib", 128))
secs = arg("--secs", 75)
torch.manual_seed(0)
dev = torch.device("cuda:0")
model = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True),
    num_layers=6,
).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(32, 256, 1024, device=dev)
kept = []
t0 = time.time()
step = 0
while True:
    opt.zero_grad(set_to_none=True)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    if mode == "leak":
        kept.append(torch.empty(mib << 20, dtype=torch.uint8, device=dev))
    torch.cuda.synchronize()
    step += 1
    print("step %d t=%.3f" % (step, time.time() - t0), flush=True)
    if mode == "healthy" and time.time() - t0 >= secs:
        break
