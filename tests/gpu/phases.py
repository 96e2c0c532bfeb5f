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
Issue 43, the phase and the remedy from what the program was doing (sized by the card's total memory, the
same on a 78 GiB H100 and a 140 GiB H200):
bw_oom         30 training steps of an MLP, then a batch twice as large, loaded for a second (a slow
               step): its forward fits, its backward runs out (a ballast leaves room for the forward only)
fwd_oom        a model whose third block widens its input far too much (`blocks.2.expand`), trained: the
               first training forward runs out there
val_keep       training with a validation every 5 steps, without eval() and without no_grad, that keeps
               its losses as tensors in a list: their graphs fill the GPU
infer_cache    an inference server under inference_mode, no optimizer, that keeps every request's output
               in an attribute (`self.cache`): grows with no step and no graph
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


def total_memory():
    return torch.cuda.get_device_properties(dev).total_memory


def run_steps(model, opt, x, n):
    """`n` training steps on the batch `x`."""
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()


def doubled_batch(width=8192, depth=6, batch=8192):
    """Training whose batch doubles: the larger batch takes a second to load (a slow step), its forward
    fits and its backward runs out of memory (a ballast leaves the GPU room for the forward only)."""
    model = mlp(width, depth)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=dev)
    run_steps(model, opt, x, 30)
    torch.cuda.synchronize()
    # One step measured: what its forward keeps for backward.
    opt.zero_grad(set_to_none=True)
    base = torch.cuda.memory_allocated(dev)
    loss = model(x).pow(2).mean()
    fwd = torch.cuda.memory_allocated(dev) - base
    loss.backward()
    opt.step()
    del loss, x
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    # Room for the doubled batch (its input, twice what the forward keeps) and 768 MiB: the forward's
    # own temporary (the loss's pow, 512 MiB at the doubled batch) fits, PowBackward0's two (1 GiB) not.
    room = 2 * batch * width * 4 + 2 * fwd + 768 * MiB
    free = torch.cuda.mem_get_info(dev)[0]
    ballast = torch.empty(max(0, free - room), dtype=torch.uint8, device=dev)
    time.sleep(1.0)  # the larger batch is loaded
    x = torch.randn(2 * batch, width, device=dev)
    opt.zero_grad(set_to_none=True)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    return {"ballast": ballast.numel()}


class Block(torch.nn.Module):
    def __init__(self, width, widen):
        super().__init__()
        self.expand = torch.nn.Linear(width, width * widen)
        self.proj = torch.nn.Linear(width * widen, width)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.expand(x)))


class Widened(torch.nn.Module):
    """Four blocks; the third widens its input 24 times where the others widen it 4 times."""

    def __init__(self, width):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(width, 24 if i == 2 else 4) for i in range(4)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def first_forward(width=1024):
    """Training that runs out in its first forward, at `blocks.2.expand`: the tokens of a batch are sized
    so that each 4-times block keeps a quarter of the GPU for backward and the third block's widening asks
    for 60% of it."""
    tokens = total_memory() // 40 // (width * 4) // 1024 * 1024
    model = Widened(width).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(tokens, width, device=dev)
    run_steps(model, opt, x, 10)
    return {"tokens": tokens}


def validation_kept(width=8192, depth=4, every=5):
    """Training with a validation every `every` steps, without eval() and without no_grad, that keeps each
    batch's loss as a tensor (its graph with it) to average at the end: a tenth of the GPU each time."""
    model = mlp(width, depth)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2048, width, device=dev)
    vbatch = max(256, total_memory() // 10 // 4 // (2 * depth * width * 4) // 256 * 256)
    xv = torch.randn(vbatch, width, device=dev)
    val_losses = []
    for step in range(1, 400):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
        if step % every == 0:
            for _ in range(4):
                val_losses.append(model(xv).pow(2).mean())
        torch.cuda.synchronize()
        time.sleep(0.02)
    return {"val": float(torch.stack(val_losses).mean())}


class CachingServer(object):
    """An inference server that keeps every request's output, by request id, in an attribute."""

    def __init__(self, width=4096):
        self.model = mlp(width, 2).eval()
        self.cache = {}

    def handle(self, rid, x):
        with torch.inference_mode():
            out = self.model(x)
        self.cache[rid] = out
        return float(out[0, 0])


def cached_requests(n=150):
    server = CachingServer()
    per = total_memory() // 2 // n  # half the GPU in all
    rows = max(1, per // (4096 * 4))
    for rid in range(n):
        server.handle(rid, torch.randn(rows, 4096, device=dev))
        torch.cuda.synchronize()
        time.sleep(0.08)
    return {"cached": len(server.cache)}


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
    if what == "bw_oom":
        return doubled_batch()
    if what == "fwd_oom":
        return first_forward()
    if what == "val_keep":
        return {"val": validation_kept()}
    if what == "infer_cache":
        return cached_requests()
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
