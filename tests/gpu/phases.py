"""Programs beyond the training step (issue 28), each as a user would write it, run under gpudoc on a GPU by
tests/gpu/record_phases.sh (fixtures/phases/):
    python3 phases.py NAME
infer_leak     a streaming loop without no_grad: a recurrent state carried from chunk to chunk keeps every
               chunk's graph (grows ~1.5 GiB/s for ~12 s to ~19 GiB, never comes back)
infer_healthy  the same loop under torch.inference_mode(): flat after warm-up
load_serve     20 GiB of weights loaded shard by shard, then a healthy inference loop: a ramp, then flat
up_and_back    30 GiB built up over 3 s, then freed (empty_cache), then 3 s of light work
eval_oom       50 training steps, then an evaluation without no_grad that keeps its outputs in a list: the
               outputs' graphs fill the GPU
eval_keep      50 training steps, then an evaluation that keeps its outputs (detached) on the GPU: 15 GiB
               more, then the program ends
eval_healthy   50 training steps, then an evaluation under no_grad that keeps numbers only
load_oom       weights loaded in 4 GiB shards onto the GPU until it is full, before any step
workers_cuda   training fed by a DataLoader with 4 spawned workers whose Dataset makes a CUDA tensor
workers_cpu    the same with a Dataset on the CPU and pin_memory=True
model_leak     an MLP run on 100 batches without no_grad and no optimizer, keeping its outputs in a list:
               each keeps its graph (the leak hunt runs at the model's forward calls)
hook_leak      100 training steps with a debugging probe as forward hook of the third layer, keeping every
               activation it sees (32 MiB a step)
local_leak     100 training steps in a function that adds a validation loss made with its graph to a local
               `total` each step (the validation forward's activations, 64 MiB a step)
Prints one JSON line at the end (what it did), so the recording can be checked against it."""
import json
import sys
import time

import torch
import torch.utils.data

GiB = 1 << 30
MiB = 1 << 20
dev = torch.device("cuda:0")


def mlp(width=4096, depth=4):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(dev)


def train(model, steps=50, batch=2048):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, model[0].in_features, device=dev)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
    torch.cuda.synchronize()
    opt.zero_grad(set_to_none=True)


def stream(grad, chunks=150, pause=0.08):
    """A recurrent model over a stream: each chunk's state depends on the last one's."""
    cell = torch.nn.Linear(4096, 4096).to(dev)
    mix = torch.nn.Linear(4096, 4096).to(dev)
    state = torch.zeros(4096, 4096, device=dev)
    ctx = torch.enable_grad() if grad else torch.inference_mode()
    with ctx:
        for _ in range(chunks):
            x = torch.randn(4096, 4096, device=dev)
            state = torch.tanh(cell(x) + mix(state))
            torch.cuda.synchronize()
            time.sleep(pause)  # the next chunk arrives
    return float(state.float().mean())


def evaluation(model, batches, keep, grad, batch=8192):
    outs = []
    ctx = torch.enable_grad() if grad else torch.no_grad()
    model.eval()
    with ctx:
        for _ in range(batches):
            y = model(torch.randn(batch, model[0].in_features, device=dev))
            if keep == "graph":
                outs.append(y)
            elif keep == "detached":
                outs.append(y.detach())
            else:
                outs.append(float(y.mean()))
            torch.cuda.synchronize()
            time.sleep(0.03)
    return len(outs)


class CudaDataset(torch.utils.data.Dataset):
    """A Dataset that makes its samples on the GPU, then hands back CPU tensors: the worker pays for a
    CUDA context of its own."""

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return torch.randn(4096, device="cuda").cpu()


class CpuDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return torch.randn(4096)


def fed(dataset, pin):
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=256, num_workers=4, multiprocessing_context="spawn", pin_memory=pin,
        persistent_workers=True)
    steps = 0
    t0 = time.time()
    while time.time() - t0 < 8:
        for x in loader:
            x = x.to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            opt.step()
            steps += 1
            time.sleep(0.01)
    return steps


class Probe(object):
    """A debugging probe: keeps what it sees."""

    def __init__(self):
        self.acts = []

    def __call__(self, module, inputs, output):
        self.acts.append(output.detach())


def train_total(model, steps=100):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2048, 4096, device=dev)
    xv = torch.randn(512, 4096, device=dev)
    total = 0
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
        val = model(xv).pow(2).mean()
        total = total + val
        torch.cuda.synchronize()
        time.sleep(0.02)
    return float(total)


def main(what):
    if what == "infer_leak":
        return {"mean": stream(grad=True)}
    if what == "infer_healthy":
        return {"mean": stream(grad=False)}
    if what == "load_serve":
        shards = []
        for _ in range(10):
            shards.append(torch.randn(GiB // 2, device=dev))  # 2 GiB each, as a checkpoint's shards
            torch.cuda.synchronize()
            time.sleep(0.2)
        return {"mean": stream(grad=False, chunks=60)}
    if what == "up_and_back":
        held = []
        for _ in range(30):
            held.append(torch.empty(GiB, dtype=torch.uint8, device=dev))
            torch.cuda.synchronize()
            time.sleep(0.1)
        del held
        torch.cuda.empty_cache()
        return {"mean": stream(grad=False, chunks=40)}
    if what == "load_oom":
        shards = []
        while True:
            shards.append(torch.empty(4 * GiB, dtype=torch.uint8, device=dev))
            torch.cuda.synchronize()
            time.sleep(0.05)
    if what == "model_leak":
        return {"batches": evaluation(mlp(), 100, "graph", grad=True, batch=2048)}
    if what == "hook_leak":
        model = mlp()
        probe = Probe()
        model[2].register_forward_hook(probe)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(2048, 4096, device=dev)
        for _ in range(100):
            opt.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            opt.step()
            torch.cuda.synchronize()
            time.sleep(0.02)
        return {"kept": len(probe.acts)}
    if what == "local_leak":
        return {"total": train_total(mlp())}
    model = mlp(8192)
    if what in ("eval_oom", "eval_keep", "eval_healthy"):
        train(model)
        keep = {"eval_oom": "graph", "eval_keep": "detached", "eval_healthy": "numbers"}[what]
        n = {"eval_oom": 1000, "eval_keep": 60, "eval_healthy": 100}[what]
        return {"batches": evaluation(model, n, keep, grad=what == "eval_oom")}
    if what == "workers_cuda":
        return {"steps": fed(CudaDataset(), pin=False)}
    if what == "workers_cpu":
        return {"steps": fed(CpuDataset(), pin=True)}
    sys.exit("unknown program " + what)


if __name__ == "__main__":
    out = main(sys.argv[1])
    print(json.dumps({"what": sys.argv[1], **out}), flush=True)
