"""DDP training under torchrun, in one of four situations (rank 0 keeps an extra 16 GiB, rank 1 runs out of
memory, every rank loads a checkpoint onto the default device first, or none of these):
    torchrun --nproc-per-node 2 ddp.py correct | stray | rank0_extra | oom
    (or one process on each of two "nodes": --nnodes 2 --node-rank N --nproc-per-node 1)"""
import os
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
local_rank = int(os.environ["LOCAL_RANK"])
rank = int(os.environ["RANK"])
GiB = 1 << 30

if mode == "stray":
    # The classic bug: every rank loads a checkpoint onto the default device before set_device.
    ckpt = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
dev = torch.device("cuda", local_rank)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).to(dev)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
x = torch.randn(512, 4096, device=dev)
extra = []
for step in range(40):
    opt.zero_grad(set_to_none=True)
    ddp(x).pow(2).mean().backward()
    opt.step()
    if mode == "rank0_extra" and rank == 0 and step == 5:
        # Rank 0 keeps an evaluation copy of the model and a large eval buffer on its GPU.
        extra.append(torch.empty(16 * GiB, dtype=torch.uint8, device=dev))
    if mode == "oom" and rank == 1 and step == 20:
        torch.empty(200 * GiB, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    time.sleep(0.05)
dist.destroy_process_group()
