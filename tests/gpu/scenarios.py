"""Real runs for gpudoc's rules, one situation each, and near misses that must not fire (run under gpudoc on a
GPU by tests/gpu/record_fixtures.sh; reports and traces are kept in fixtures/runs/).
    python3 scenarios.py NAME        (NAME: see the branches below)"""
import sys
import time

what = sys.argv[1]
GiB = 1 << 30
MiB = 1 << 20

if what == "jax_prealloc":
    import jax.numpy as jnp

    x = jnp.ones((1024,))
    x.block_until_ready()
    time.sleep(1.0)
    sys.exit(0)

import torch

dev = torch.device("cuda:0")


def mlp_steps(n, hook=None, sync=True):
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(1024, 4096, device=dev)
    for i in range(n):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
        if hook:
            hook(i)
        if sync:
            torch.cuda.synchronize()
            time.sleep(0.01)
    torch.cuda.synchronize()


def evaluation(extra):
    """An evaluation pass that needs `extra` bytes more, then gives them back to the driver."""
    t = torch.empty(extra, dtype=torch.uint8, device=dev)
    t.fill_(1)
    del t
    torch.cuda.empty_cache()


def hog(gib):
    """A child process of the job (started with subprocess, so in the job) holding `gib` GiB."""
    import os
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.Popen([sys.executable, os.path.join(here, "hold.py"), str(gib)], stdout=subprocess.PIPE)
    p.stdout.readline()
    return p


if what == "healthy":
    mlp_steps(60)
elif what == "cache_bloat":
    # 40 GiB of activations freed without empty_cache: the cache keeps it reserved.
    big = [torch.empty(256 * MiB, dtype=torch.uint8, device=dev) for _ in range(160)]
    del big
    mlp_steps(40)
elif what == "spike":
    def spike(i):
        if i == 30:  # an "eval" that briefly needs 50 GiB, then releases it
            t = torch.empty(50 * GiB, dtype=torch.uint8, device=dev)
            torch.cuda.synchronize()
            time.sleep(0.3)
            del t
            torch.cuda.empty_cache()

    mlp_steps(60, spike)
elif what == "thrash":
    mlp_steps(60, lambda i: torch.cuda.empty_cache())
elif what == "near_capacity":
    free, total = torch.cuda.mem_get_info(dev)
    t = torch.empty(free - 2 * GiB, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    time.sleep(1.0)
elif what == "spike_small":
    # Near miss for transient-spike: a 3 GiB "eval" (the rule wants 4 GiB).
    def spike(i):
        if i == 30:
            t = torch.empty(3 * GiB, dtype=torch.uint8, device=dev)
            torch.cuda.synchronize()
            time.sleep(0.3)
            del t
            torch.cuda.empty_cache()

    mlp_steps(60, spike)
elif what == "periodic_eval":
    # Every 25 steps an evaluation needs 60 GiB more, then empty_cache(); no synchronisation in the loop,
    # so the CPU runs ahead and NVML sees a plateau, not a spike.
    mlp_steps(200, lambda i: evaluation(60 * GiB) if (i + 1) % 25 == 0 else None, sync=False)
elif what == "eval_small":
    # Near miss for phase-peak: the evaluation needs 1 GiB more (the rule wants 2 GiB).
    mlp_steps(200, lambda i: evaluation(1 * GiB) if (i + 1) % 25 == 0 else None, sync=False)
elif what == "cache_small":
    # Near miss for cache-bloat: 3 GiB of freed temporaries stay cached (the rule wants 4 GiB).
    big = [torch.empty(256 * MiB, dtype=torch.uint8, device=dev) for _ in range(12)]
    del big
    mlp_steps(40)
elif what == "near_capacity_miss":
    # Near miss for near-capacity: the job fills the GPU to about 90% (the rule wants 95%).
    free, total = torch.cuda.mem_get_info(dev)
    t = torch.empty(int(total * 0.90) - (total - free), dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    time.sleep(1.0)
elif what == "fraction_cap":
    # The process may use a quarter of the GPU; the loop grows until it hits that cap.
    torch.cuda.set_per_process_memory_fraction(0.25, dev)
    kept = []
    mlp_steps(10_000, lambda i: kept.append(torch.empty(2 * GiB, dtype=torch.uint8, device=dev)))
elif what == "grow_oom":
    # A loop that keeps 2 GiB a step until the GPU is full (the allocator's retries come from the OOM).
    kept = []
    mlp_steps(10_000, lambda i: kept.append(torch.empty(2 * GiB, dtype=torch.uint8, device=dev)))
elif what == "child_hog":
    # The job's own child holds 110 GiB; the trainer then asks for more than is left.
    p = hog(110)
    try:
        mlp_steps(5)
        x = torch.empty(40 * GiB, dtype=torch.uint8, device=dev)
    finally:
        p.kill()
elif what == "leftover":
    # The job leaves a child holding 2 GiB (gpudoc --kill-orphans ends it).
    hog(2)
elif what == "leftover_miss":
    # Near miss for leftover-processes: the child ends 50 ms after the parent.
    import subprocess

    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.05)"])
    torch.zeros(1, device=dev)
elif what == "signal_kill":
    # Near miss for host-oom-kill: the job dies of SIGKILL, with no OOM evidence.
    import os
    import signal

    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    os.kill(os.getpid(), signal.SIGKILL)
elif what == "context_only":
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    time.sleep(1.0)
else:
    sys.exit("unknown scenario " + what)
