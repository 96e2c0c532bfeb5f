"""A traceback through the shim's wrappers is the program's own (issue 42, item 10): a forward or a
backward that raises shows the frames it shows without gpudoc, and the program catches the very exception
raised. Python 3.11 and later (3.8-3.10 show the wrapper's frame: docs/framework.md). Real torch on the
CPU."""
import sys
import traceback

import pytest


torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="3.8-3.10 show the wrapper's frame")


class Failing(torch.nn.Module):
    """Raises a new ValueError from forward once `failing` is set, kept as its `error`."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.failing = False
        self.error = None

    def forward(self, x):
        if self.failing:
            self.error = ValueError("bad batch")
            raise self.error
        return self.lin(x)


class FailingBackward(torch.autograd.Function):
    error = None

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        FailingBackward.error = ValueError("bad gradient")
        raise FailingBackward.error


def _caught(call):
    """The exception `call` raised, and its traceback's (file, function) frames."""
    try:
        call()
    except ValueError as e:
        return e, [(f.filename, f.name) for f in traceback.extract_tb(e.__traceback__)]
    raise AssertionError("nothing raised")


def test_a_forward_that_raises_shows_the_same_frames_under_the_forward_clock(shim):
    model, x = Failing(), torch.randn(3, 2)
    model.failing = True
    bare_error, bare = _caught(lambda: model(x))
    model.failing = False
    shim.torch._forward_clock_on(torch)
    model(x)
    assert shim.torch.F.root() is model and type(model).__call__ is shim.torch._clocked_call
    model.failing = True
    error, frames = _caught(lambda: model(x))
    assert error is model.error and type(bare_error) is ValueError
    assert frames == bare, frames
    assert frames[-1][1] == "forward"


def test_a_backward_that_raises_shows_the_same_frames_under_the_backward_wrapper(shim):
    x = torch.ones(3, requires_grad=True)
    bare_error, bare = _caught(lambda: FailingBackward.apply(x).sum().backward())
    real = torch.autograd.backward
    shim.torch._watch_autograd(torch)
    try:
        assert torch.autograd.backward is not real
        error, frames = _caught(lambda: FailingBackward.apply(x).sum().backward())
    finally:
        torch.autograd.backward = real
    assert error is FailingBackward.error and type(bare_error) is ValueError
    assert frames == bare, frames


class Refuses(torch.nn.Module):
    """A submodule whose own train() raises (torch's train() of its parent calls it)."""

    error = None

    def train(self, mode=True):
        Refuses.error = ValueError("frozen")
        raise Refuses.error


def test_a_train_that_raises_shows_the_same_frames_under_the_train_wrapper(shim, monkeypatch):
    from torch.nn.modules import module

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Refuses())
    bare_error, bare = _caught(model.train)
    monkeypatch.setattr(module.Module, "train", module.Module.__dict__["train"])
    shim.torch._watch_eval(torch)
    assert module.Module.__dict__["train"].__code__.co_filename.startswith("<gpudoc's wrapper")
    error, frames = _caught(model.train)
    assert error is Refuses.error and type(bare_error) is ValueError
    assert frames == bare, frames
