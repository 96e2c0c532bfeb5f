"""Issue 31 on a real GPU: a transformer-like model (blocks of attention and MLP in torch.nn, no
downloads) whose attention scores are materialised, so its memory grows with the square of the sequence.
    python3 where.py T STEPS [--eval N] [--infer N]
One line per step: {"step", "peak"} (torch.cuda.max_memory_allocated over the step, then reset). A T
whose backward does not fit fails with torch.OutOfMemoryError in backward (its forward fits: the
backward of the last block needs two more score-sized tensors than its forward did). --eval N: after the
steps, model.eval() and N calls under torch.no_grad() (an evaluation after training); --infer N: N calls
under torch.inference_mode() with no optimizer at all (STEPS 0). One line per call: {"call", "peak"}."""
import json
import math
import sys

import torch
from torch import nn

D, H, LAYERS, VOCAB = 1024, 16, 6, 32000


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // H))
        att = att.softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, D))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D, 4 * D)
        self.down = nn.Linear(4 * D, D)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(D), Attention()
        self.norm2, self.mlp = nn.LayerNorm(D), MLP()

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def calls(model, ids, n, mode):
    """`n` calls of the model under `mode` (no_grad, inference_mode), each call's own peak."""
    for i in range(n):
        with mode():
            logits = model(ids)
        del logits
        torch.cuda.synchronize()
        print(json.dumps({"call": i + 1, "peak": torch.cuda.max_memory_allocated()}), flush=True)
        torch.cuda.reset_peak_memory_stats()


def main():
    t, steps = int(sys.argv[1]), int(sys.argv[2])
    n = lambda flag: int(sys.argv[sys.argv.index(flag) + 1]) if flag in sys.argv else 0
    torch.manual_seed(0)
    model = Model().cuda()
    ids = torch.randint(0, VOCAB, (1, t), device="cuda")
    if n("--infer"):
        model.eval()
        calls(model, ids, n("--infer"), torch.inference_mode)
        return
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for i in range(steps):
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), ids.view(-1))
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
        torch.cuda.synchronize()
        print(json.dumps({"step": i + 1, "peak": torch.cuda.max_memory_allocated()}), flush=True)
        torch.cuda.reset_peak_memory_stats()
    if n("--eval"):
        model.eval()
        calls(model, ids, n("--eval"), torch.no_grad)


if __name__ == "__main__":
    main()
