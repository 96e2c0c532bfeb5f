"""A fast training loop with an evaluation every N steps, on the CPU with real torch, for the shim's cost
there (bench/README.md, "An evaluation every 100 steps, on the CPU"; bench/eval_cost.sh runs it bare and
under the shim, alternated):
    python3 bench/eval_loop.py call|method|none STEPS [EVAL_EVERY]
A Sequential subclass of two Sequentials (Linear 64 wide, GELU), batch 16, SGD: thousands of steps a second.
Every EVAL_EVERY steps (default 100) an evaluation: model.eval(), 20 calls under torch.no_grad(), then
model.train(); `call` calls the model (`model(x)`), `method` a method of it (`model.embed(x)`), `none`
evaluates nothing. 300 warm-up steps, then STEPS timed. Prints one JSON line: steps per second, the
process's CPU time a step (less sensitive than the wall time to other processes on a busy machine), and
the time of the training steps and of the evaluations apart.

Under the shim (its folder first on PYTHONPATH and GPUDOC_TORCH set, as `gpudoc run` starts a job) the
shim's hooks module is told that CUDA has started, its allocator readings played (no GPU here: every
reading is of an allocator that holds nothing): what it does on a GPU from CUDA's start on runs, the
forward clock, the train() wrapper's evaluation, the measured step and the measured evaluation call."""
import json
import sys
import time

import torch

STATS = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
         "allocation", "segment", "active", "inactive_split")


def stats(device=0):
    """What torch._C._cuda_memoryStats returns (a new dict each time), all zero."""
    out = dict((k, dict((p, {"current": 0, "peak": 0, "allocated": 0, "freed": 0})
                        for p in ("all", "small_pool", "large_pool"))) for k in STATS)
    out.update(num_alloc_retries=0, num_ooms=0, num_sync_all_streams=0, num_device_alloc=1,
               num_device_free=0, max_split_size=-1)
    return out


class Net(torch.nn.Sequential):
    def embed(self, x):
        for m in self:
            x = m(x)
        return x


def build():
    """The model, its optimizer and a batch."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    width, batch = 64, 16
    model = Net(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(2)])
    return model, torch.optim.SGD(model.parameters(), lr=1e-4), torch.randn(batch, width)


def main():
    shim = sys.modules.get("gpudoc._shim.torch")
    if shim is not None:
        shim.S.orig_stats, shim.S.orig_reset = stats, lambda device=0: None
        shim._devices = lambda: [0]
        shim._on_cuda_init()
    loop(shim is not None)


def loop(shimmed):
    variant = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    every = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    model, opt, x = build()
    call = model.embed if variant == "method" else model


    def step():
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()

    def evaluate():
        model.eval()
        with torch.no_grad():
            for _ in range(20):
                call(x)
        model.train()

    for i in range(300):
        step()
        if variant != "none" and i % every == every - 1:
            evaluate()
    train_s = eval_s = 0.0
    evals = 0
    t, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        train_s += t1 - t0
        if variant != "none" and i % every == every - 1:
            evaluate()
            eval_s += time.perf_counter() - t1
            evals += 1
    dt, cpu = time.perf_counter() - t, time.process_time() - cpu
    print(json.dumps({"variant": variant, "steps": steps, "steps_per_s": steps / dt,
                      "ms_per_step": dt / steps * 1e3,
                      "cpu_ms_per_step": cpu / steps * 1e3,
                      "train_ms_per_step": train_s / steps * 1e3,
                      "ms_per_eval": eval_s / evals * 1e3 if evals else None, "shim": shimmed}))


if __name__ == "__main__":
    main()
