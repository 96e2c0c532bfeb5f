"""The forward clock of an evaluation after training (docs/framework.md): the model's calls, counted through
training for an OOM's phase, are the clock's again from the program's eval() to its train(). Real torch on
the CPU."""
import pytest


torch = pytest.importorskip("torch")

from nets import Net  # noqa: E402


@pytest.fixture
def trained(shim, cuda, monkeypatch):
    """A model the clock adopted, then 20 optimizer steps (the clock counts its calls only); Module.train
    under the shim's wrapper. Returns (shim's hooks module, model, input)."""
    from torch.nn.modules import module

    monkeypatch.setattr(module.Module, "train", module.Module.__dict__["train"])
    monkeypatch.setattr(cuda.S, "backward_watched", True)
    monkeypatch.setattr(cuda, "_devices", lambda: [0])
    monkeypatch.setattr(cuda, "WHERE", "off")
    model, x = Net(), torch.randn(3, 4)
    cuda._forward_clock_on(torch)
    cuda._watch_eval(torch)
    model(x)
    for _ in range(20):
        model(x)
        cuda._on_step(None, (), {})
    assert cuda.F.counting and cuda.F.root() is model
    return cuda, model, x


def _forward_records(shim):
    return [m["fwd"] for m in shim.messages() if m.get("k") == "s" and "fwd" in m]


def test_an_evaluation_after_training_is_recorded_at_its_calls(shim, trained):
    T, model, x = trained
    before = _forward_records(shim)
    model.eval()
    with torch.no_grad():
        model(x)
    assert [n for n in _forward_records(shim) if n not in before] == [T.FWD[0]]
    model.train()
    assert T.F.counting and not T.F.evaluating


def test_a_fast_evaluation_goes_back_to_counting_the_calls(shim, trained):
    # Calls less than MIN_FORWARD_S apart: the clock's records stop, its count goes on through the
    # evaluation and the training after it (the class keeps the shim's __call__).
    T, model, x = trained
    model.eval()
    with torch.no_grad():
        for _ in range(10):
            model(x)
    assert T.F.counting and T.F.root() is model
    n = T.FWD[0]
    model.train()
    model(x)
    assert T.FWD[0] == n + 1
