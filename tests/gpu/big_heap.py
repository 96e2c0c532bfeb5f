"""Issue 27 on a real GPU: a leak on a 2M-object Python heap, bare or under `gpudoc run --hunt-leaks`.
    python3 big_heap.py list|local|compiled [N [STEPS]]
A 4-layer MLP (1024 wide, batch 256, AdamW) steps STEPS times after N small objects are made (lists,
dicts, instances, kept in a global made first). list: each step's output is kept, detached, in a global
list; local: inside `def train()` a loss is accumulated with its graph (`total = total + loss`), then
dropped (`total = 0`) while train() still runs, and memory_allocated is printed right after (it must be
the same bare and under gpudoc: the hunt never keeps what the program dropped); compiled: the step is
`torch.compile(opt.step, backend="eager")` (graph breaks counted by Dynamo, printed). Prints one JSON
line: the longest optimizer step (ms, host time, synchronised), collections the program's gc.callbacks saw
inside a step, peak RSS (MiB), what was left allocated after the drop (local), graph breaks (compiled)."""
import gc
import json
import resource
import sys
import time

import torch

mode = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 2000000
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 300
MiB = 1 << 20


class Item(object):
    def __init__(self, i):
        self.i = i


heap = [[i] if i % 3 == 0 else {"i": i} if i % 3 == 1 else Item(i) for i in range(N)]
kept = []
dev = torch.device("cuda:0")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU())
                              for _ in range(4)]).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(256, 1024, device=dev)
step_fn = torch.compile(opt.step, backend="eager") if mode == "compiled" else opt.step
in_step, collections, longest = [False], [], [0.0]
gc.callbacks.append(lambda phase, info: in_step[0] and phase == "start" and collections.append(info))


def timed_step():
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    in_step[0] = True
    step_fn()
    in_step[0] = False
    torch.cuda.synchronize()
    longest[0] = max(longest[0], time.perf_counter() - t0)


def train():
    total = 0
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = out.pow(2).mean()
        loss.backward(retain_graph=mode == "local")
        if mode == "list":
            kept.append(out.detach())
        elif mode == "local":
            total = total + loss
        timed_step()
    total = 0
    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() // MiB


left = train()
result = {"mode": mode, "objects": N, "longest_ms": round(longest[0] * 1e3, 2), "gc_in_step": len(collections),
          "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, "left_mib": left}
if mode == "compiled":
    from torch._dynamo.utils import counters

    result["graph_breaks"] = sum(counters["graph_break"].values())
print(json.dumps(result))
