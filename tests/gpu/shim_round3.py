"""Issue 42 on a real GPU (tests/gpu/shim_round3.sh runs it bare and under gpudoc run, and compares):
    python3 tests/gpu/shim_round3.py ckpt|offload|compiled|copy
ckpt: 4 blocks under torch.utils.checkpoint(use_reentrant=False), 20 steps (the measured step comes at
11 or later): the blocks' forward count and the last loss. offload: the same blocks under save_on_cpu and
a counting pack/unpack hook: the hook's calls and the last loss. compiled: torch.compile(opt.step), 20
steps: the steps gpudoc counted are read from its report by the .sh. copy: 30 inference calls (the
forward clock takes the model), a deepcopy with a Lightning-like __getstate__, the original zeroed: the
copy's output must stay. Each prints `name value` lines; the .sh diffs bare against gpudoc."""
import copy
import sys

import torch
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
dev = torch.device("cuda:0")
mode = sys.argv[1]


class Block(torch.nn.Module):
    forwards = 0

    def __init__(self, n):
        super().__init__()
        self.a, self.b = torch.nn.Linear(n, 4 * n), torch.nn.Linear(4 * n, n)

    def forward(self, x):
        Block.forwards += 1
        return x + self.b(torch.nn.functional.gelu(self.a(x)))


class Net(torch.nn.Module):
    def __init__(self, n=1024, depth=4):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(n) for _ in range(depth))

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if mode == "ckpt" else b(x)
        return x

    def __getstate__(self):  # as LightningModule's: the whole __dict__
        return dict(self.__dict__)


model = Net().to(dev)
x = torch.randn(64, 1024, device=dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
packs = [0, 0]


def pack(t):
    packs[0] += 1
    return t


def unpack(t):
    packs[1] += 1
    return t


if mode in ("ckpt", "offload", "compiled"):
    step = torch.compile(opt.step) if mode == "compiled" else opt.step
    for i in range(20):
        if mode == "offload":
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                with torch.autograd.graph.save_on_cpu():
                    loss = model(x).pow(2).mean()
        else:
            loss = model(x).pow(2).mean()
        loss.backward()
        step()
        opt.zero_grad()
    torch.cuda.synchronize()
    print("loss %.6f" % loss.item())
    print("forwards", Block.forwards)
    print("hook_calls", packs)
elif mode == "copy":
    with torch.no_grad():
        for _ in range(30):
            model(x)
        best = copy.deepcopy(model)
        want = best(x).sum().item()
        for p in model.parameters():
            p.zero_()
        print("copy_output %.4f" % best(x).sum().item(), "before %.4f" % want)
        print("original_zeroed %.4f" % model(x).sub(x).abs().sum().item())
