"""The frameworks' part of the shim (_gpudoc_frameworks.py) in-process, against the fake frameworks of
fixtures/fake_frameworks: what it changes in the program's process is taken back without undoing what the
program did after it (JAX's `sys.excepthook`)."""
import sys

import pytest
from shim_env import HERE, ROOT

FRAMEWORKS = "gpudoc._shim.frameworks"
FAKES = ROOT + "/fixtures/fake_frameworks"
OOM = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 268435456 bytes."


@pytest.fixture
def frameworks(shim, monkeypatch):
    """The frameworks' part loaded as GpudocFinder loads it, its pipe the shim's file, its registry the
    torch part's (one registry per process)."""
    fw = shim.torch.SHARED.load(HERE, "_gpudoc_frameworks.py", FRAMEWORKS)
    monkeypatch.setattr(fw.S, "here", HERE)
    monkeypatch.setattr(fw.S, "pipe", shim.torch.S.out)
    monkeypatch.setattr(fw.S, "registry", None)
    monkeypatch.setattr(fw.S, "views", {})
    monkeypatch.syspath_prepend(FAKES)
    try:
        yield fw
    finally:
        sys.modules.pop(FRAMEWORKS, None)


def _jax(fw, monkeypatch):
    """The fake jax with the shim's part in place, as `import jax` under gpudoc run leaves it."""
    for name in [m for m in sys.modules if m == "jax" or m.startswith("jax.")]:
        monkeypatch.delitem(sys.modules, name)
    import jax

    fw.S.views["jax"] = fw._install_jax(jax)
    return jax


def _ooms(shim):
    return [m for m in shim.messages() if m.get("k") == "oom" and m.get("fw") == "jax"]


def test_jaxs_excepthook_taken_back_leaves_a_hook_the_program_installed_after_it(shim, frameworks,
                                                                                   monkeypatch):
    """The program's hook, installed after gpudoc's, stays the current one; gpudoc's, which it may call,
    then only passes the error on (a hook the program chained to gpudoc's records no OOM any more)."""
    printed = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: printed.append(("first", str(value))))
    _jax(frameworks, monkeypatch)
    ours = sys.excepthook

    def theirs(kind, value, tb):
        printed.append(("theirs", str(value)))
        ours(kind, value, tb)

    sys.excepthook = theirs
    error = RuntimeError(OOM)
    sys.excepthook(RuntimeError, error, None)
    assert len(_ooms(shim)) == 1, "armed: the uncaught RESOURCE_EXHAUSTED error's numbers are recorded"
    frameworks._patches().remove_all()
    assert sys.excepthook is theirs
    assert "sys.excepthook" not in [p["target"] for p in frameworks._patches().listing()]
    printed.clear()
    other = RuntimeError(OOM)
    sys.excepthook(RuntimeError, other, None)
    assert printed == [("theirs", OOM), ("first", OOM)], "the chain passes the error on as before"
    assert len(_ooms(shim)) == 1, "taken back: gpudoc's hook records nothing"


def test_jaxs_excepthook_still_current_is_taken_back_to_the_one_it_found(shim, frameworks, monkeypatch):
    def first(kind, value, tb):
        pass

    monkeypatch.setattr(sys, "excepthook", first)
    _jax(frameworks, monkeypatch)
    ours = sys.excepthook
    assert ours is not first
    frameworks._patches().remove_all()
    assert sys.excepthook is first
    ours(RuntimeError, RuntimeError(OOM), None)  # a copy the program kept: a pass-through now
    assert _ooms(shim) == []
