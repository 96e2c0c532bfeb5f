"""A measured call that never comes gives its hooks back (issue 42, item 7): an evaluation that calls a
method of the model (`model.embed(x)`), never the model, ran every module call under two global hooks
until the next training record. Real torch on the CPU."""
import pytest


torch = pytest.importorskip("torch")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 2)

    def embed(self, x):
        return self.emb(x)

    def forward(self, x):
        return self.head(self.emb(x))


def test_an_evaluation_that_never_calls_the_model_gives_the_hooks_back(shim, cuda):
    from torch.nn.modules import module

    model, x = Net(), torch.randn(2, 4)
    assert cuda._where("arm_call", model, "evaluation") is True
    assert module._global_forward_pre_hooks and cuda.S.measuring
    for _ in range(getattr(cuda.S.where_module, "MAX_MISSED", 64) + 1):
        model.embed(x)
    assert not module._global_forward_pre_hooks and not module._global_forward_hooks
    assert not cuda.S.measuring
    # Nothing was sent for a call that never came.
    assert [m for m in shim.messages() if m.get("k") == "where"] == []


def test_an_evaluation_through_a_method_gives_the_hooks_back_at_train(shim, cuda, monkeypatch):
    # An evaluation of fewer module calls than MAX_MISSED: its end, train(), gives the hooks back, and
    # the model's next call (a training one) is not measured as the evaluation's.
    from torch.nn.modules import module

    monkeypatch.setattr(module.Module, "train", module.Module.__dict__["train"])
    cuda._watch_eval(torch)
    cuda.STEP[0] = 20
    model, x = Net(), torch.randn(2, 4)
    model.eval()
    assert module._global_forward_pre_hooks and cuda.S.measuring
    with torch.no_grad():
        model.embed(x)
    model.train()
    assert not module._global_forward_pre_hooks and not module._global_forward_hooks
    assert not cuda.S.measuring
    model(x)
    assert [m for m in shim.messages() if m.get("k") == "where"] == []


def test_an_evaluation_call_that_never_came_is_given_up_at_the_next_step(shim, cuda):
    # Training resumes without a train(): the next optimizer step ends the measure, however far away
    # the records' stride had put the next record.
    from torch.nn.modules import module

    cuda.STEP[0], cuda.STEP[1] = 20, 1 << 30
    cuda.S.measured = True  # the training step was measured: none is armed at this step
    model, x = Net(), torch.randn(2, 4)
    assert cuda._where("arm_call", model, "evaluation") is True
    model.embed(x)
    cuda._on_step(None, (), {})
    assert not module._global_forward_pre_hooks and not module._global_forward_hooks
    assert not cuda.S.measuring
