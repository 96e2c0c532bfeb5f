"""A launch-bound training loop for measuring the shim's cost at fast step rates (bench/README.md):
    python3 shim_loop.py fast|faster [STEPS [BLOCKS_FILE]]
fast: a 4-layer MLP, 1024 wide, GELU, batch 256, AdamW (about 1.7 ms a step on an H200); faster: one layer,
256 wide, batch 64, SGD (about 0.4 ms). 300 warm-up steps, then 3000 timed; prints steps per second.
With BLOCKS_FILE, the time of every block of 100 steps goes there too, one `monotonic_end seconds` line
each (bench/sampling_cost.py compares blocks with and without gpudoc's sampling). With TOGGLE_SHIM=1 in
the environment (under `gpudoc run`), gpudoc's step hook is taken out of PyTorch's optimizer hooks for every
other block and put back for the next, and each line says whether it was in (`1`) or out (`0`): the shim's
cost within one run, where the run-to-run noise cancels. With EVAL_EVERY=N in the environment, every N
steps the model is evaluated: model.eval(), 20 calls under no_grad, model.train() (the evaluation's
forward clock, docs/framework.md); with EVAL_CALL=method too, each call goes through the model's layers
one by one, as a method of the model does (`model.embed(x)`: the model itself is never called). With
EVAL_SYNC=1 too, each evaluation is timed between two synchronizations, and the JSON line has the median
(`eval_ms`): what an evaluation costs, bare and under gpudoc; and the first and the slowest (`eval_first_ms`,
`eval_max_ms`): what is paid once."""
import json
import os
import sys
import time

import torch

kind = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
blocks = open(sys.argv[3], "w", buffering=1) if len(sys.argv) > 3 else None
torch.manual_seed(0)
dev = torch.device("cuda:0")
if kind == "fast":
    width, batch, layers = 1024, 256, 4
else:
    width, batch, layers = 256, 64, 1
layer = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(layers)]
model = torch.nn.Sequential(*layer).to(dev)
opt = (torch.optim.AdamW if kind == "fast" else torch.optim.SGD)(model.parameters(), lr=1e-4)
x = torch.randn(batch, width, device=dev)


def step():
    opt.zero_grad(set_to_none=True)
    model(x).pow(2).mean().backward()
    opt.step()


for _ in range(300):
    step()
torch.cuda.synchronize()
hooks = shim_hook = None
if os.environ.get("TOGGLE_SHIM") == "1":
    from torch.optim import optimizer as _opt

    hooks = _opt._global_optimizer_post_hooks
    shim_hook = next(k for k, f in hooks.items() if getattr(f, "__module__", "") == "gpudoc._shim.torch")
    shim_fn = hooks[shim_hook]
    shim_steps = shim_fn.__globals__["STEP"]
eval_every = int(os.environ.get("EVAL_EVERY", "0"))


def embed(x):
    for m in model:
        x = m(x)
    return x


call = embed if os.environ.get("EVAL_CALL") == "method" else model
sync = os.environ.get("EVAL_SYNC") == "1"
eval_s = []


def evaluate():
    if sync:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        for _ in range(20):
            call(x)
    model.train()
    if sync:
        torch.cuda.synchronize()
        eval_s.append(time.perf_counter() - t0)


t = time.perf_counter()
b = t
for i in range(steps):
    step()
    if eval_every and i % eval_every == eval_every - 1:
        evaluate()
    if blocks and i % 100 == 99:
        torch.cuda.synchronize()
        now = time.perf_counter()
        state = "" if hooks is None else f" {int(shim_hook in hooks)}"
        blocks.write(f"{time.monotonic()} {now - b}{state}\n")
        if hooks is not None:
            if shim_hook in hooks:
                del hooks[shim_hook]
            else:
                hooks[shim_hook] = shim_fn
                # The steps run without the hook still count, so its idea of the step time stays right.
                shim_steps[0] += 100
                shim_steps[1] += 100
        b = time.perf_counter()
torch.cuda.synchronize()
dt = time.perf_counter() - t
out = {"kind": kind, "steps": steps, "ms_per_step": dt / steps * 1e3, "steps_per_s": steps / dt}
if eval_s:
    out["eval_ms"] = sorted(eval_s)[len(eval_s) // 2] * 1e3
    # A cost paid once, at the run's first evaluation (the measured call, the first imports), is no median.
    out["eval_first_ms"] = eval_s[0] * 1e3
    out["eval_max_ms"] = max(eval_s) * 1e3
print(json.dumps(out))
