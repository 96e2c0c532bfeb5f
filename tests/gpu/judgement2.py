"""Held-out judgement, second set: nine programs unlike judgement.py's ten and record_phases.sh's six, each as
an ML engineer writes it, each with what an expert would say of it and the remedies that must NOT be given
(EXPECT2 below; judged by judgement.py's own checker). Run on a GPU by tests/gpu/judgement2.sh:
    python3 judgement2.py NAME           # one program (prints one JSON line at the end: what it did)
    python3 judgement2.py check DIR      # the verdicts in DIR/NAME.report.json against EXPECT2: ok/BAD lines
Every program sizes its memory from torch.cuda.mem_get_info, so it behaves alike on 80 and 141 GB, and aims
to run in under 30 s on an H100.
frac_cap          training in a process capped at 30% of the GPU (torch.cuda.set_per_process_memory_fraction)
                  whose first forward runs out at the cap, the GPU two thirds free: the cap is the remedy
compiled_step     a torch.compile'd model whose first training step runs out in its (compiled) forward:
                  activations, in training; inference_mode is no remedy
soup_load         checkpoint averaging ("model soup") that loads each checkpoint with map_location='cuda'
                  and keeps them all on the GPU to average at the end: it runs out loading, before any
                  forward (load to the CPU, keep a running sum)
prompt_cache      inference under torch.inference_mode() whose prompt embeddings are memoised with an
                  unbounded functools.lru_cache: the cache grows with every new prompt (no OOM)
cuda_collate      a DataLoader with spawned workers whose collate_fn normalises each batch on the GPU: every
                  worker holds a CUDA context of its own
detached_eval     training that starts a background evaluator with subprocess.Popen(start_new_session=True)
                  and exits without waiting: the evaluator keeps its GPU memory after the job (judgement2.sh
                  ends it afterwards)
empty_cache_loop  healthy training that calls torch.cuda.empty_cache() after every step: slow, not short of
                  memory (no retries: a smaller batch is no remedy)
ckpt_snapshot     training that once, at step 30, snapshots model and optimizer state as GPU clones
                  (copy.deepcopy of the state_dicts) before saving: a one-off peak (save from the CPU)
healthy_eval      a long healthy training with a small evaluation under no_grad every 40 steps and metrics
                  kept as numbers: nothing to say"""
import copy
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

# The first set, beside this file, loaded by its path (tests/gpu's other scripts stay off sys.path): its
# helpers, its patterns and its one checker.
_spec = importlib.util.spec_from_file_location(
    "judgement", os.path.join(os.path.dirname(os.path.abspath(__file__)), "judgement.py"))
judgement = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(judgement)
MiB, RECOMPUTE, TRAINING_ONLY = judgement.MiB, judgement.RECOMPUTE, judgement.TRAINING_ONLY
cuda, free_total, mlp = judgement.cuda, judgement.free_total, judgement.mlp


def frac_cap(width=4096, depth=4, fraction=0.3):
    """The process may use 30% of the GPU (set by the launcher of a shared box, here by the program); its
    batch is sized as if it had the GPU to itself: activations for about half of it."""
    torch, dev = cuda()
    torch.cuda.set_per_process_memory_fraction(fraction, dev)
    free, _ = free_total()
    model = mlp(width, depth, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = int(free * 0.5) // (2 * depth * width * 4) // 256 * 256
    for _ in range(3):
        x = torch.randn(batch, width, device=dev)
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
        torch.cuda.synchronize()
    return {"batch": batch}


def compiled_step(width=4096, depth=4):
    """A torch.compile'd MLP (inductor) whose batch's activations need ~1.5 times the free GPU: the first
    training step runs out in the compiled forward, before any optimizer step."""
    torch, dev = cuda()
    free, _ = free_total()
    model = torch.compile(mlp(width, depth, dev))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = int(free * 1.5) // (2 * depth * width * 4) // 256 * 256
    for _ in range(3):
        x = torch.randn(batch, width, device=dev)
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
        torch.cuda.synchronize()
    return {"batch": batch}


def _scratch_dir(need):
    """/dev/shm when it has room (memory, fast), else the temporary directory."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and shutil.disk_usage(shm).free > 2 * need:
        return shm
    return tempfile.gettempdir()


def soup_load(pieces=16, width=8192):
    """Weight averaging ("model soup"): the model (~35% of the GPU, bfloat16) is built on the GPU; then a
    fine-tuned copy's checkpoint of ~1/12 of the GPU (written first, on the CPU: a fine-tuning run's output)
    is loaded once per copy with map_location='cuda', each kept on the GPU for the average: about the 8th
    load runs out, with no forward ever run."""
    torch, dev = cuda()
    free, _ = free_total()
    size = free // 12 // (64 * MiB) * (64 * MiB)
    folder = _scratch_dir(size)
    path = os.path.join(folder, f"judgement2_soup_{os.getpid()}.pt")
    n = size // (pieces * 4 * MiB)
    torch.save({f"layer{i}.weight": torch.empty(n, MiB) for i in range(pieces)}, path)
    depth = max(1, int(free * 0.35) // (width * width * 2))
    with dev:
        model = torch.nn.Sequential(
            *[torch.nn.Linear(width, width, bias=False, dtype=torch.bfloat16) for _ in range(depth)])
    states = []
    try:
        for _ in range(24):
            states.append(torch.load(path, map_location="cuda"))
            torch.cuda.synchronize()
        soup = {k: sum(s[k] for s in states) / len(states) for k in states[0]}
    finally:
        os.unlink(path)
    return {"loaded": len(states), "keys": len(soup), "layers": len(model)}


def prompt_cache(width=4096, requests=160):
    """A retrieval service's loop under inference_mode: each request's prompt embedding is memoised with
    functools.lru_cache(maxsize=None) and nearly every request brings a new prompt, so the cache (GPU
    tensors of ~1/400 of the GPU each) only grows: to ~40% of the GPU in ~20 s."""
    torch, dev = cuda()
    free, _ = free_total()
    rows = free // 400 // (width * 4)
    encoder = torch.nn.Linear(width, width).to(dev).eval()

    @functools.lru_cache(maxsize=None)
    def embed_prompt(prompt_id):
        g = torch.Generator(device=dev).manual_seed(prompt_id)
        return encoder(torch.randn(rows, width, device=dev, generator=g))

    score = 0.0
    with torch.inference_mode():
        for i in range(requests):
            e = embed_prompt(i if i % 8 else 0)  # one prompt in 8 is the popular one
            score += float(e[0, 0])
            torch.cuda.synchronize()
            time.sleep(0.12)
    return {"cached": embed_prompt.cache_info().currsize, "score": score}


class Samples:
    """A dataset of CPU tensors (picklable for spawned workers)."""

    def __init__(self, n, width):
        self.n, self.width = n, width

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        return torch.full((self.width,), float(i % 97))


def gpu_collate(items):
    """Stacks a batch and normalises it on the GPU in the worker (the pattern worker-contexts is about),
    handing back a CPU tensor."""
    import torch
    x = torch.stack(items).to("cuda")
    x = (x - x.mean()) / (x.std() + 1e-6)
    return x.cpu()


def cuda_collate(width=4096, batch=256, epochs=2):
    """Training fed by a DataLoader with 2 spawned workers whose collate_fn uses CUDA."""
    torch, dev = cuda()
    model = mlp(width, 4, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(
        Samples(batch * 60, width), batch_size=batch, num_workers=2, collate_fn=gpu_collate,
        multiprocessing_context="spawn")
    steps = 0
    for _ in range(epochs):
        for x in loader:
            x = x.to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            opt.step()
            steps += 1
            time.sleep(0.05)
    torch.cuda.synchronize()
    return {"steps": steps}


EVALUATOR = r"""
import os, sys, time, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")  # the evaluator's model and buffers
torch.cuda.synchronize()
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(float(sys.argv[3]))  # waits for checkpoints to evaluate (judgement2.sh ends it first)
"""


def detached_eval(width=4096, steps=60):
    """Training that starts an evaluator (its own process, its own session, holding ~3% of the GPU) and
    exits without waiting for it or ending it. The evaluator writes its pid to JUDGEMENT2_PIDFILE (for
    judgement2.sh to end it) and ends by itself after 40 s."""
    torch, dev = cuda()
    free, _ = free_total()
    pidfile = os.environ.get("JUDGEMENT2_PIDFILE") or os.path.join(tempfile.gettempdir(), "detached_eval.pid")
    if os.path.exists(pidfile):
        os.unlink(pidfile)
    subprocess.Popen([sys.executable, "-c", EVALUATOR, str(free // 32), pidfile, "40"],
                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    model = mlp(width, 4, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2048, width, device=dev)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
        torch.cuda.synchronize()
        time.sleep(0.05)
    t0 = time.time()
    while not os.path.exists(pidfile) and time.time() - t0 < 30:
        time.sleep(0.2)  # the evaluator is up (it holds its memory) before the job exits
    return {"evaluator": open(pidfile).read() if os.path.exists(pidfile) else None}


def empty_cache_loop(width=4096, depth=4, batch=8192, steps=150):
    """Healthy training far from the GPU's edge that calls torch.cuda.empty_cache() after every step ("to
    keep memory low"): the cache is rebuilt with cudaMalloc every step; nothing fails, nothing retries."""
    torch, dev = cuda()
    model = mlp(width, depth, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        x = torch.randn(batch, width, device=dev)
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        del x, loss
        torch.cuda.empty_cache()
        time.sleep(0.02)
    torch.cuda.synchronize()
    return {"batch": batch}


def ckpt_snapshot(width=8192, steps=60, at=30):
    """Training of a model of ~5% of the GPU (AdamW: ~20% with gradients and state) that at step 30 takes a
    snapshot for its checkpoint as GPU clones, copy.deepcopy(model.state_dict()) and of the optimizer's,
    ~15% of the GPU more, then saves it (to /dev/null) and drops it."""
    torch, dev = cuda()
    free, _ = free_total()
    depth = max(2, int(free * 0.05) // (width * width * 4))
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, width, bias=False, device=dev) for _ in range(depth)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(512, width, device=dev)
    for step in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
        if step == at:
            snapshot = {"model": copy.deepcopy(model.state_dict()),
                        "optimizer": copy.deepcopy(opt.state_dict()), "step": step}
            with open(os.devnull, "wb") as f:
                torch.save(snapshot, f)
            del snapshot
        torch.cuda.synchronize()
        time.sleep(0.1)
    return {"depth": depth}


def healthy_eval(width=4096, depth=4, steps=400, every=40):
    """400 training steps with an evaluation of 4 batches under no_grad every 40 steps, losses kept as
    numbers: ~20 s, nothing wrong."""
    torch, dev = cuda()
    model = mlp(width, depth, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(1024, width, device=dev)
    held_out = [torch.randn(1024, width, device=dev) for _ in range(4)]
    losses, scores = [], []
    for step in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % every == 0:
            model.eval()
            with torch.no_grad():
                scores.append(sum(float(model(h).pow(2).mean()) for h in held_out) / len(held_out))
            model.train()
        time.sleep(0.03)
    return {"loss": losses[-1], "evals": len(scores)}


PROGRAMS2 = {f.__name__: f for f in (frac_cap, compiled_step, soup_load, prompt_cache, cuda_collate,
                                      detached_eval, empty_cache_loop, ckpt_snapshot, healthy_eval)}

# Keys as in judgement.py's EXPECT (its comment says each).
NO_LEAK = [r"\bleak", r"grows steadily"]
EXPECT2 = {
    "frac_cap": {
        "exit": "gpu_oom", "rules": ["oom-cap"],
        "facts": {"oom.cause": "cap"},
        "advice": [r"set_per_process_memory_fraction"],
        "never": [TRAINING_ONLY, r"expandable_segments"],
        "never_said": [r"filled 9\d(\.\d)?% of the GPU"],
        "why": "it ran out at its 30% cap with the GPU two thirds free: raise or drop the fraction (or fit "
               "the job under it); it is training, so no inference_mode, and no fragmentation"},
    "compiled_step": {
        "exit": "gpu_oom", "rules": ["oom-self-growth"],
        "facts": {"oom.phase": "training_step", "oom.pass": "forward", "oom.steps": 0,
                  "oom.largest_part": "activations"},
        "say": [r"training step"],
        "never": [TRAINING_ONLY, r"optimizer state|8-bit optimizer"],
        "never_said": [r"\bevaluation\b", r"without training"],
        "why": "a compiled model's first training step does not fit its activations: a smaller batch, "
               "activation checkpointing, bf16 autocast; never inference_mode (a backward follows)"},
    "soup_load": {
        "exit": "gpu_oom", "rules": ["oom-self-growth"],
        "facts": {"oom.phase": "loading", "oom.steps": 0},
        "advice": [r"map_location='cpu'"],
        "never": [TRAINING_ONLY, RECOMPUTE, r"optimizer|gradient", r"\bbatch"],
        "never_said": [r"\btraining step\b", r"\d+ forward calls?"],
        "why": "every checkpoint was loaded onto the GPU and kept: load with map_location='cpu' and keep a "
               "running sum; no forward ran, so batch size, checkpointing and no_grad change nothing"},
    "prompt_cache": {
        "exit": "success", "code": 0, "rules": ["steady-growth"], "loud_ok": ["step-leak"],
        "say": [r"embed_prompt|lru_cache"],
        "never": [r"inference_mode|no_grad", RECOMPUTE, r"optimizer|gradient"],
        "never_said": [r"in (a|its) training step"],
        "why": "the unbounded lru_cache of `embed_prompt` keeps every prompt's GPU embedding: bound it "
               "(maxsize) or keep it on the CPU; it already runs under inference_mode"},
    "cuda_collate": {
        "exit": "success", "code": 0, "rules": ["worker-contexts"], "loud_ok": [],
        "advice": [r"collate_fn"],
        "never": [TRAINING_ONLY, RECOMPUTE, r"batch size"], "never_said": NO_LEAK,
        "why": "each DataLoader worker holds a CUDA context for its collate_fn's GPU work: collate on the "
               "CPU and move the batch in the main process (pin_memory=True)"},
    "detached_eval": {
        "exit": "success", "code": 0, "rules": ["leftover-processes"], "loud_ok": [],
        "advice": [r"--kill-orphans|orphans --kill"],
        "never": [TRAINING_ONLY, RECOMPUTE, r"batch size"],
        "never_said": [r"the job ran out of memory", r"the job died"],
        "why": "the evaluator the job started outlived it, holding its GPU memory: end it (gpudoc orphans "
               "--kill, --kill-orphans) and make the program wait for or end its children"},
    "empty_cache_loop": {
        "exit": "success", "code": 0, "rules": ["allocator-thrash"], "loud_ok": [],
        "advice": [r"empty_cache"],
        "never": [r"batch size", r"expandable_segments", TRAINING_ONLY, RECOMPUTE],
        "never_said": NO_LEAK,
        "why": "torch.cuda.empty_cache() every step makes the allocator cudaMalloc every step: drop the "
               "call; it is far from the GPU's edge (no retries), so a smaller batch is no remedy"},
    "ckpt_snapshot": {
        "exit": "success", "code": 0, "rules": ["phase-peak"], "loud_ok": ["cache-bloat"],
        "advice": [r"checkpoints? from the CPU"],
        "never": [TRAINING_ONLY, RECOMPUTE, r"batch size"], "never_said": NO_LEAK,
        "why": "one step's checkpoint snapshot (GPU clones of weights and optimizer state) sets the peak: "
               "save from the CPU ({k: v.cpu()}); not an evaluation, not the batch"},
    "healthy_eval": {
        "exit": "success", "code": 0, "rules": [], "loud_ok": [], "no_error": True,
        "never_said": NO_LEAK,
        "why": "healthy training with small evaluations under no_grad: nothing to say"},
}

if __name__ == "__main__":
    judgement.main(sys.argv, PROGRAMS2, EXPECT2)
