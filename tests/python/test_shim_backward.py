"""The shim's wrapper of torch.autograd.backward (the evidence of an OOM's phase): a program reads torch's
function of it (its parameters, defaults, annotations, no __wrapped__), and it counts backward calls."""
import inspect

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
