"""The shim's wrapper of torch.autograd.backward (the evidence of an OOM's phase): a program reads torch's
function of it (its parameters, defaults, annotations, no __wrapped__), and it counts backward calls."""
import inspect
import json

import torch


def test_the_backward_wrapper_reads_as_torchs_and_counts_each_backward(shim):
    real = torch.autograd.backward
    shim.torch._watch_autograd(torch)
    try:
        wrapped = torch.autograd.backward
        assert wrapped is not real
        assert inspect.signature(wrapped) == inspect.signature(real)
        assert not hasattr(wrapped, "__wrapped__")
        assert (wrapped.__name__, wrapped.__module__, wrapped.__doc__) == (
            real.__name__, real.__module__, real.__doc__)
        before = shim.torch.AUTOGRAD[0]
        x = torch.ones(3, requires_grad=True)
        (x * 2).sum().backward()
        assert torch.equal(x.grad, torch.full((3,), 2.0))
        assert shim.torch.AUTOGRAD[0] == before + 1
        assert shim.torch.AUTOGRAD[1] == 0  # none running once it returned
    finally:
        torch.autograd.backward = real



def test_an_oom_says_whether_the_program_made_an_optimizer(shim):
    """`optim` in an OOM's activity: training before its first backward (a gradient accumulation that sums
    its micro-batches' losses) is told from inference by it, from the mark an optimizer's construction puts
    on its class's step (read below a fresh class: this interpreter's other tests have made optimizers)."""
    class Base(torch.optim.Optimizer):
        pass

    class Lion(Base):
        def __init__(self, params):
            super().__init__(params, {})

        def step(self, closure=None):
            pass

    assert not shim.torch._hooked_below(Base)
    Lion(torch.nn.Linear(2, 2).parameters())
    assert shim.torch._hooked_below(Base)
    assert shim.torch._optimizer_made(torch)
    assert json.loads(shim.torch._activity())["optim"] is True


def test_inside_an_autograd_functions_forward_the_programs_grad_mode_is_not_known(shim):
    """torch runs an autograd.Function's forward (torch.compile's, a custom Function's) with grad off: an
    OOM there says nothing of whether the program ran under no_grad, so its activity says grad unknown."""
    seen = {}

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen["inside"] = json.loads(shim.torch._activity())["grad"]
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    Double.apply(torch.ones(2, requires_grad=True))
    assert seen["inside"] is None
    with torch.no_grad():
        assert json.loads(shim.torch._activity())["grad"] is False
    assert json.loads(shim.torch._activity())["grad"] is True
