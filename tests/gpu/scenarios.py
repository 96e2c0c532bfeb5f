"""Real runs for gpudoc's rules, one situation each (run under gpudoc on a GPU; reports and traces are kept
in fixtures/runs/).
    python3 scenarios.py healthy | cache_bloat | spike | thrash | near_capacity | jax_prealloc | context_only"""
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


def mlp_steps(n, hook=None):
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(1024, 4096, device=dev)
    for i in range(n):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
        if hook:
            hook(i)
        torch.cuda.synchronize()
        time.sleep(0.01)


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
elif what == "context_only":
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    time.sleep(1.0)
else:
    sys.exit("unknown scenario " + what)
