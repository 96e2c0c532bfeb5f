"""The forward clock puts nothing into the program's modules (issue 42, item 2): a copy, a `__dict__`
clone or a pickle of a clocked model is the program's alone. Real torch on the CPU."""
import copy
import io
import pickle

import pytest


torch = pytest.importorskip("torch")

from nets import Net  # noqa: E402


class Stateful(Net):
    """A module with its own __getstate__ that keeps its whole __dict__, as Lightning's LightningModule
    does (torch's own leaves out `_compiled_call_impl`)."""

    def __getstate__(self):
        return self.__dict__

    def __setstate__(self, state):
        self.__dict__.update(state)


def _clocked(shim, cls=Net):
    """A model the forward clock has adopted (its first outermost call returned)."""
    torch.manual_seed(0)
    model = cls()
    shim.torch._forward_clock_on(torch)
    x = torch.randn(3, 4)
    model(x)
    assert shim.torch.F.root is not None and shim.torch.F.root() is model
    return model, x


def test_the_clock_puts_nothing_into_the_module(shim):
    torch.manual_seed(0)
    model = Net()
    before = dict(model.__dict__)
    shim.torch._forward_clock_on(torch)
    model(torch.randn(3, 4))
    assert shim.torch.F.root() is model
    assert model.__dict__ == before


def test_a_deep_copy_of_a_clocked_model_computes_with_its_own_weights(shim):
    model, x = _clocked(shim, Stateful)
    best = copy.deepcopy(model)
    expected = best(x).detach().clone()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    assert torch.equal(best(x), expected)
    assert not torch.equal(model(x), expected)
    del model
    assert torch.equal(best(x), expected)  # the original gone, the copy still runs


def test_a_dict_clone_computes_with_its_own_weights(shim):
    model, x = _clocked(shim)
    clone = Net.__new__(Net)
    clone.__dict__ = copy.deepcopy(model.__dict__)
    expected = clone(x).detach().clone()
    with torch.no_grad():
        model.a.weight.zero_()
        model.b.weight.zero_()
    assert torch.equal(clone(x), expected)


def test_the_clock_counts_the_clocked_module_and_not_its_copies(shim):
    model, x = _clocked(shim)
    FWD = shim.torch.FWD
    n = FWD[0]
    copy.deepcopy(model)(x)
    assert FWD[0] == n
    model(x)
    assert FWD[0] == n + 1
    shim.torch._forward_clock_off()
    assert "__call__" not in Net.__dict__
    model(x)
    assert FWD[0] == n + 1


def test_a_module_with_its_own_getstate_pickles_while_clocked(shim):
    model, x = _clocked(shim, Stateful)
    again = pickle.loads(pickle.dumps(model))
    assert torch.equal(again(x), model(x))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(loaded(x), model(x))
    shim.torch._forward_clock_off()


def test_submodules_of_the_models_class_count_in_the_clocks_cost(shim):
    # A Sequential of Sequentials: each inner one's call runs the clock's identity check too, so the
    # calls must come further apart for the clock to stay within budget (MIN_FORWARD_S).
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4)),
                                torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    shim.torch._forward_clock_on(torch)
    model(torch.randn(2, 4))
    assert shim.torch.F.root() is model
    assert shim.torch.F.calls == 3
