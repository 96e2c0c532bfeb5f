"""Every hook gpudoc installs catches its own failures and goes quiet (issue 42, item 3): gpudoc's folder
gone or a full disk never makes the program's `model(x)`, `model.eval()` or `opt.step()` raise. Real
torch on the CPU, the allocator's readings played by the test (no CUDA here)."""
import errno

import pytest

from shim_env import shim  # noqa: F401  (the fixture)

torch = pytest.importorskip("torch")


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _stats(device=0):
    return {"allocated_bytes": {"all": {"current": 0, "peak": 0}},
            "reserved_bytes": {"all": {"current": 0, "peak": 0}}}


@pytest.fixture
def cuda(shim, monkeypatch):
    """The shim as after CUDA's start, its writes failing as on a full disk."""
    T = shim.torch
    monkeypatch.setattr(T.S, "orig_stats", _stats)
    monkeypatch.setattr(T.S, "orig_reset", lambda device=0: None)
    monkeypatch.setattr(T.S, "cuda", True)
    monkeypatch.setattr(T.S, "devices", [0])
    monkeypatch.setattr(T, "_send_big", _disk_full)
    return T


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(6)])


def test_a_measured_call_whose_record_cannot_be_written_leaves_the_call_alone(cuda):
    model, x = _model(), torch.randn(2, 4)
    expected = model(x)
    assert cuda._where("arm_call", model, "inference") is True
    assert cuda.S.measuring
    out = model(x)  # the measured call: its record's write fails
    assert torch.equal(out, expected)
    assert not cuda.S.measuring
    # Its hooks are gone: the next calls run as without gpudoc.
    from torch.nn.modules import module
    assert not module._global_forward_hooks and not module._global_forward_pre_hooks
    assert torch.equal(model(x), expected)


def test_a_failing_clock_never_reaches_the_model_call(cuda, monkeypatch):
    model, x = _model(), torch.randn(2, 4)
    cuda._forward_clock_on(torch)
    model(x)
    assert cuda.F.root() is model
    monkeypatch.setattr(cuda, "_on_forward", _disk_full)
    model(x)
    assert cuda.F.root is None  # the clock went quiet
    assert "__call__" not in vars(type(model))


def test_a_failing_evaluation_start_never_reaches_eval(cuda, monkeypatch):
    model = _model()
    cuda._watch_eval(torch)
    try:
        cuda.STEP[0] = 50
        monkeypatch.setattr(cuda, "_evaluation", _disk_full)
        model.eval()
        assert not model.training
        assert cuda.S.dead
    finally:
        torch.nn.Module.train = torch.nn.Module.train.__wrapped__


def test_a_failing_step_record_never_reaches_the_step(cuda, monkeypatch):
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(cuda._on_step)
    try:
        monkeypatch.setattr(cuda, "_step_where", _disk_full)
        p.grad = torch.ones(2)
        opt.step()
        assert torch.equal(p.detach(), torch.zeros(2))
        assert cuda.S.dead
    finally:
        handle.remove()
