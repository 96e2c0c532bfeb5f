"""Issue 42 on a real GPU: what the shim must never change in a training job. One program, run bare and
under `gpudoc run` (the where-walk's measured step falls at step 11 or later), printing one JSON line:
    python3 no_harm.py [--compiled-step]
- blocks checkpointed with torch.utils.checkpoint(use_reentrant=False), the mode PyTorch recommends, and a
  saved_tensors_hooks pair that counts packs and unpacks: the block forwards and the unpacks must be the
  same bare and under gpudoc, and no CheckpointError;
- a copy.deepcopy of the model kept as "best" at step 5, trained on afterwards: the copy must compute with
  its own weights (the same output as a fresh model loaded with its state);
- a module with its own __getstate__ saved with torch.save;
- --compiled-step: the optimizer's step compiled with torch.compile; gpudoc's report must count its steps.
Deterministic algorithms on, so the losses compare exactly."""
import copy
import io
import json
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

torch.use_deterministic_algorithms(True)
D, LAYERS, STEPS = 2048, 6, 30
FORWARDS = [0]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D, 4 * D)
        self.down = nn.Linear(4 * D, D)

    def forward(self, x):
        FORWARDS[0] += 1
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(D, 1)

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False)
        return self.head(x).mean()


class Stateful(nn.Linear):
    """A module whose pickling is its own (as some libraries' are)."""

    def __getstate__(self):
        state = dict(self.__dict__)
        state["saved_by"] = "Stateful.__getstate__"
        return state


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = Model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = opt.step
    if "--compiled-step" in sys.argv:
        step = torch.compile(opt.step)
    packs, unpacks = [0], [0]

    def pack(t):
        packs[0] += 1
        return t

    def unpack(t):
        unpacks[0] += 1
        return t

    x = torch.randn(64, 256, D, device=dev)
    losses, best = [], None
    for i in range(STEPS):
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            loss = model(x)
            loss.backward()
        step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if i == 4:
            best = copy.deepcopy(model)
    fresh = Model().to(dev)
    fresh.load_state_dict(best.state_dict())
    with torch.no_grad():
        copy_own = abs(best(x).item() - fresh(x).item()) < 1e-6
        copy_differs = abs(best(x).item() - model(x).item()) > 1e-6
    buf = io.BytesIO()
    torch.save(Stateful(4, 4), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=False).__dict__.get("saved_by")
    print(json.dumps({"forwards": FORWARDS[0], "packs": packs[0], "unpacks": unpacks[0], "losses": losses,
                      "copy_computes_with_its_own_weights": copy_own, "copy_differs_from_original": copy_differs,
                      "torch_save_getstate": saved}), flush=True)


main()
