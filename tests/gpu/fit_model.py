"""A real training loop whose memory grows with its batch, for `gpudoc fit` on the H200: 8 blocks of
Linear(4096, 16384) → GELU → Linear(16384, 4096) over sequences of 1024 tokens, AdamW, TF32. Steps until
interrupted, or --steps N (then exits 0).
    python3 fit_model.py --batch-size B [--steps N]"""
import sys

import torch

batch = int(sys.argv[sys.argv.index("--batch-size") + 1])
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else None
torch.backends.cuda.matmul.allow_tf32 = True
dev = torch.device("cuda:0")
blocks = [torch.nn.Sequential(torch.nn.Linear(4096, 16384), torch.nn.GELU(), torch.nn.Linear(16384, 4096))
          for _ in range(8)]
model = torch.nn.Sequential(*blocks).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
step = 0
while steps is None or step < steps:
    x = torch.randn(batch, 1024, 4096, device=dev)
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    step += 1
    print(f"step {step} loss {loss.item():.4f} peak {torch.cuda.max_memory_allocated(dev)}", flush=True)
