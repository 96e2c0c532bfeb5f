"""Every hook gpudoc installs catches its own failures and goes quiet (issue 42, item 3): gpudoc's folder
gone or a full disk never makes the program's `model(x)`, `model.eval()` or `opt.step()` raise. Real
torch on the CPU, the allocator's readings played by the test (no CUDA here)."""
import errno

import pytest


torch = pytest.importorskip("torch")


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def full_disk(cuda, monkeypatch):
    """The shim as after CUDA's start, its writes failing as on a full disk."""
    monkeypatch.setattr(cuda, "_send_big", _disk_full)
    return cuda


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(6)])


def test_a_measured_call_whose_record_cannot_be_written_leaves_the_call_alone(full_disk):
    model, x = _model(), torch.randn(2, 4)
    expected = model(x)
    assert full_disk._where("arm_call", model, "inference") is True
    assert full_disk.S.measuring
    out = model(x)  # the measured call: its record's write fails
    assert torch.equal(out, expected)
    assert not full_disk.S.measuring
    # Its hooks are gone: the next calls run as without gpudoc.
    from torch.nn.modules import module
    assert not module._global_forward_hooks and not module._global_forward_pre_hooks
    assert torch.equal(model(x), expected)


def test_a_failing_clock_never_reaches_the_model_call(full_disk, monkeypatch):
    model, x = _model(), torch.randn(2, 4)
    full_disk._forward_clock_on(torch)
    model(x)
    assert full_disk.F.root() is model
    monkeypatch.setattr(full_disk, "_on_forward", _disk_full)
    model(x)
    assert full_disk.F.root is None  # the clock went quiet
    assert "__call__" not in vars(type(model))


def test_a_failing_evaluation_start_never_reaches_eval(full_disk, monkeypatch):
    model = _model()
    real = torch.nn.Module.__dict__["train"]
    full_disk._watch_eval(torch)
    try:
        full_disk.STEP[0] = 50
        monkeypatch.setattr(full_disk, "_evaluation", _disk_full)
        model.eval()
        assert not model.training
        assert full_disk.S.out.dead
    finally:
        torch.nn.Module.train = real


def test_a_failing_step_record_never_reaches_the_step(full_disk, monkeypatch):
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(full_disk._on_step)
    try:
        monkeypatch.setattr(full_disk, "_step_where", _disk_full)
        p.grad = torch.ones(2)
        opt.step()
        assert torch.equal(p.detach(), torch.zeros(2))
        assert full_disk.S.out.dead
    finally:
        handle.remove()
