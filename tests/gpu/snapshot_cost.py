"""What `torch.cuda.memory._snapshot()` costs where the shim takes it (--snapshot on an inference program:
the measured call's analysis took 3.9-7.5 s on the H200, a training step's 0.03 s). where.py's model at
T under inference_mode, memory history recorded as the shim records it; then the snapshot timed outside a
call, inside the model's forward hook under inference_mode, and after a synchronize, with pickle.dump.
    python3 snapshot_cost.py T"""
import io
import pickle
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import where  # noqa: E402

t = int(sys.argv[1])
model = where.Model().cuda().eval()
ids = torch.randint(0, where.VOCAB, (1, t), device="cuda")
torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=100000)


def timed(what, fn):
    t0 = time.perf_counter()
    s = fn()
    t1 = time.perf_counter()
    n = len(pickle.dumps(s)) if isinstance(s, dict) else 0
    t2 = time.perf_counter()
    print("%-46s snapshot %.4f s, pickle %.4f s (%d bytes, %d events)" % (
        what, t1 - t0, t2 - t1, n, sum(len(x) for x in s["device_traces"]) if isinstance(s, dict) else 0),
        flush=True)


for i in range(3):
    with torch.inference_mode():
        model(ids)
    torch.cuda.synchronize()
timed("outside, after synchronize", torch.cuda.memory._snapshot)
with torch.inference_mode():
    timed("outside, under inference_mode", torch.cuda.memory._snapshot)
    out = model(ids)
    timed("right after a call (queued kernels)", torch.cuda.memory._snapshot)
del out
seen = []
h = model.register_forward_hook(lambda m, a, o: seen.append(timed("in the forward hook, inference_mode", torch.cuda.memory._snapshot)))
with torch.inference_mode():
    model(ids)
h.remove()
torch.cuda.synchronize()
t0 = time.perf_counter()
with torch.inference_mode():
    model(ids)
t1 = time.perf_counter()
torch.cuda.synchronize()
print("a call: %.4f s to return, %.4f s to finish" % (t1 - t0, time.perf_counter() - t0))
t0 = time.perf_counter()
torch.cuda.memory_stats()
print("memory_stats: %.4f s" % (time.perf_counter() - t0))
