"""What the shim adds to a training step and to an evaluation, within one process on the CPU, where the
run-to-run noise of whole loops (bench/eval_cost.sh) cancels (bench/README.md, "An evaluation every 100
steps, on the CPU"):
    [SHIM_DIR=FOLDER] python3 bench/eval_parts.py [BLOCKS]
SHIM_DIR: another shim folder than python/gpudoc/_shim (an older commit's, to compare).
bench/eval_loop.py's model (a Sequential subclass of two Sequentials, Linear 64 wide, batch 16, SGD). The
shim's _gpudoc_torch.py is loaded as a GPU run loads it and told that CUDA has started (its allocator
readings played), its hooks put in place as at `import torch` and CUDA's start, and 50 training steps run
(the measured step, the clock counting the model's calls). Then BLOCKS (default 200) alternated blocks,
the shim's hooks taken out and put back between them: 20 training steps; an evaluation (model.eval(), 20
calls under no_grad, model.train()); the same through a method of the model (model.embed(x)). Prints the
median and the fastest microseconds of each, bare and with the shim, and the differences (on a busy
machine the fastest is the one least disturbed)."""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_loop import Net, build, stats  # noqa: E402
import shim_module  # noqa: E402

HERE = os.environ.get("SHIM_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "python", "gpudoc", "_shim")


def load():
    shim = shim_module.load(HERE)
    shim._connect(os.devnull)
    shim._install_peaks(torch)
    shim.S.orig_stats, shim.S.orig_reset = stats, lambda device=0: None
    shim._devices = lambda: [0]
    return shim


class Hooks(object):
    """The shim's hooks on torch, taken out (`off`) and put back (`on`)."""

    def __init__(self, shim):
        from torch.optim import optimizer

        Module = torch.nn.Module
        self.shim, self.optimizer = shim, optimizer
        self.bare = {"train": Module.__dict__["train"], "backward": torch.autograd.backward}
        optimizer.register_optimizer_step_post_hook(shim._on_step)
        shim._watch_autograd(torch)
        shim._on_cuda_init()
        self.shimmed = {"train": Module.__dict__["train"], "backward": torch.autograd.backward}
        self.pre = dict(optimizer._global_optimizer_pre_hooks)
        self.post = dict(optimizer._global_optimizer_post_hooks)

    def set(self, which, cls):
        torch.nn.Module.train, torch.autograd.backward = which["train"], which["backward"]
        if which is self.bare:
            if cls.__dict__.get("__call__") is not None:
                del cls.__call__
            self.optimizer._global_optimizer_pre_hooks.clear()
            self.optimizer._global_optimizer_post_hooks.clear()
        else:
            cls.__call__ = self.shim._clocked_call
            self.optimizer._global_optimizer_pre_hooks.update(self.pre)
            self.optimizer._global_optimizer_post_hooks.update(self.post)


def main():
    blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    shim = load()
    hooks = Hooks(shim)
    model, opt, x = build()

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()

    def evaluate(call):
        model.eval()
        with torch.no_grad():
            for _ in range(20):
                call(x)
        model.train()

    for _ in range(50):
        step()
    evaluate(model)
    evaluate(model.embed)
    assert shim.F.counting and shim.F.root() is model, "the clock counts the model's calls"
    parts = {"20 training steps": lambda: [step() for _ in range(20)],
             "an evaluation, model(x)": lambda: evaluate(model),
             "an evaluation, model.embed(x)": lambda: evaluate(model.embed)}
    times = dict((k, {"bare": [], "shim": []}) for k in parts)
    for i in range(blocks):
        for who in (("bare", "shim") if i % 2 else ("shim", "bare")):
            hooks.set(hooks.bare if who == "bare" else hooks.shimmed, Net)
            for name, run in parts.items():
                t0 = time.perf_counter()
                run()
                times[name][who].append(time.perf_counter() - t0)
    hooks.set(hooks.shimmed, Net)
    for name, t in times.items():
        b, s = statistics.median(t["bare"]) * 1e6, statistics.median(t["shim"]) * 1e6
        lo_b, lo_s = min(t["bare"]) * 1e6, min(t["shim"]) * 1e6
        print("%-30s median: bare %8.1f us  shim %8.1f us  %+7.1f us;" % (name, b, s, s - b)
              + "  fastest: bare %8.1f  shim %8.1f  %+7.1f" % (lo_b, lo_s, lo_s - lo_b))


main()
