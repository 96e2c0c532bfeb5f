"""The where-walk reads what autograd saved without ever unpacking it (issue 42, item 1): unpacking runs
the program's saved-tensor hooks, which recomputes non-reentrant checkpoints (and then fails backward)
and copies save_on_cpu's tensors back. Real torch on the CPU."""
import time

import pytest


torch = pytest.importorskip("torch")
from torch.utils.checkpoint import checkpoint  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)
        self.forwards = 0

    def forward(self, x):
        self.forwards += 1
        return torch.tanh(self.lin(x)).sin()


class Net(torch.nn.Module):
    """Two blocks checkpointed (use_reentrant=False), one plain, one under save_on_cpu."""

    def __init__(self, n=8):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(n) for _ in range(4))

    def forward(self, x):
        for b in self.blocks[:2]:
            x = checkpoint(b, x, use_reentrant=False)
        x = self.blocks[2](x)
        with torch.autograd.graph.save_on_cpu():
            x = self.blocks[3](x)
        return x


class Counted(object):
    """A program's own pack/unpack hooks that count their calls."""

    def __init__(self):
        self.packs = self.unpacks = 0

    def pack(self, t):
        self.packs += 1
        return t

    def unpack(self, t):
        self.unpacks += 1
        return t


def _run(walk):
    """A forward and backward; `walk(root)` between them (the measured step's walk at backward's start).
    What the program computed and saw: gradients, block forwards, hook calls."""
    torch.manual_seed(0)
    net, hooks = Net(), Counted()
    x = torch.randn(3, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
        y = net(x).pow(2)
    seen = walk(y.grad_fn) if walk is not None else None
    y.sum().backward()
    grads = [p.grad.clone() for p in net.parameters()] + [x.grad.clone()]
    return grads, [b.forwards for b in net.blocks], (hooks.packs, hooks.unpacks), seen


class Taken(object):
    """Parts' interface, keeping every tensor the walk counts (Parts itself counts CUDA tensors only)."""

    def __init__(self):
        self.tensors = []

    def add(self, part, t):
        self.tensors.append(t)
        return 1


def test_the_walk_never_unpacks_what_the_program_saved(shim):
    where = shim.where

    def walk(root):
        graph = where.Graph([root], {}, time.perf_counter() + 5)
        taken = Taken()
        graph.saved(taken)
        tensors = [t for t in taken.tensors if isinstance(t, torch.Tensor)]
        return tensors, getattr(graph, "hooked", 0), getattr(graph, "unread", 0)

    bare = _run(None)
    walked = _run(walk)
    # Same gradients, the same forwards (no block recomputed), the same hook calls.
    for a, b in zip(bare[0], walked[0]):
        assert torch.equal(a, b)
    assert walked[1] == bare[1] == [2, 2, 1, 1]
    assert walked[2] == bare[2]
    tensors, hooked, unread = walked[3]
    # Everything under the program's hooks was read as packed: nothing unpacked, nothing unread.
    assert hooked > 0 and unread == 0
    # The walk still places what the forward saved without a hook of its own: here the counting hook
    # packed the tensors themselves, so the plain block's saved tensors (tanh's and sin's results,
    # the input of its Linear) are counted, and save_on_cpu's host copies.
    assert len(tensors) >= 3
    assert all(isinstance(t, torch.Tensor) for t in tensors)


def test_saved_tensors_without_hooks_are_read_as_before(shim):
    x = torch.randn(4, 4, requires_grad=True)
    y = torch.tanh(x)
    tensors, hooked, unread = shim.where._saved(y.grad_fn)
    assert (hooked, unread) == (0, 0)
    assert len(tensors) == 1 and torch.equal(tensors[0], y.detach())


def test_a_checkpointed_block_keeps_nothing_the_walk_counts(shim):
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    calls = []
    y = checkpoint(lambda a: calls.append(1) or lin(a).sin(), x, use_reentrant=False)
    tensors, hooked, _ = shim.where._saved(y.grad_fn)
    assert hooked == 1 and [t for t in tensors if isinstance(t, torch.Tensor)] == []
    assert len(calls) == 1
    y.sum().backward()  # recomputes once, as without the walk
    assert len(calls) == 2
