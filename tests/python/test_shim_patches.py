"""The registry of what the shim changes in the process (_gpudoc_patch.py; issue 45, item 3): every change
goes through it, each is taken back exactly, a replacement reads as torch's original, and
docs/framework.md's table is the registry's list (GPUDOC_BLESS=1 rewrites it). Real torch on the CPU."""
import atexit
import inspect
import os
import re
import sys
import warnings

import pytest
from shim_env import ROOT, Shim, _stats

torch = pytest.importorskip("torch")
# IPython's own registrations (a fork handler of its history's) are made at its import, not the shim's.
events = pytest.importorskip("IPython.core.events")

DOC = os.path.join(ROOT, "docs", "framework.md")
BEGIN = "<!-- patches: the shim's registry, written by tests/python/test_shim_patches.py -->"
END = "<!-- /patches -->"


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.a(x)


class Shell(object):
    """An IPython shell as the shim sees one: its events."""

    def __init__(self):
        self.events = events.EventManager(self, events.available_events)


def _owners():
    """Every object of torch's a patch could be put on (its modules loaded now, and the classes they
    define), and the model's class, by name."""
    import sys

    found = {"Net": Net}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, module in list(sys.modules.items()):
            if module is None or not (name == "torch" or name.startswith("torch.")):
                continue
            found[name] = module
            for k, v in list(vars(module).items()):
                if isinstance(v, type) and getattr(v, "__module__", None) == name:
                    found["%s.%s" % (name, k)] = v
    return found


# The callbacks registered with Python (atexit, os.register_at_fork), as the `everything` fixture records
# them in place of Python's (whose own lists cannot be read, and which would keep them in pytest's process).
REGISTERED = {"atexit": [], "fork": []}


def _process():
    """What a program could compare of torch and Python: the attributes of torch's objects and the
    model's class (name -> the object itself), torch's global hooks, the callbacks queued or registered."""
    from torch.nn.modules import module
    from torch.optim import optimizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a deprecated name of torch's warns when looked at
        # Behaviour only (torch's own counters change as it runs); a submodule imported meanwhile is none.
        attrs = dict(((owner, k), v) for owner, o in _owners().items() for k, v in list(vars(o).items())
                     if _behaviour(v) and not isinstance(v, type(sys)))
    hooks = dict((name, list(d.values())) for name, d in (
        ("forward", module._global_forward_hooks), ("forward pre", module._global_forward_pre_hooks),
        ("step post", optimizer._global_optimizer_post_hooks),
        ("step pre", optimizer._global_optimizer_pre_hooks)))
    return attrs, hooks, len(torch.cuda._queued_calls), dict((k, list(v)) for k, v in REGISTERED.items())


def _behaviour(v):
    return callable(v) or isinstance(v, (staticmethod, classmethod, property))


def _changed(before, after):
    """(owner, name) of each attribute of an owner known before that is not the same object as before
    (or is new, or went)."""
    owners = set(owner for owner, _ in before) | {"Net"}
    keys = set(before) | set(k for k in after if k[0] in owners)
    return set(k for k in keys if before.get(k, before) is not after.get(k, after))


@pytest.fixture
def everything(tmp_path, monkeypatch):
    """The shim after `import torch` under gpudoc run, CUDA started, a notebook's cells watched, the
    model clocked, a step's forward measured, a hunt's recording hidden and a call measured: every change
    it makes at once. Yields
    the shim, the process before it, and the union of the registry's lists along the way."""
    monkeypatch.delenv("GPUDOC_TORCH", raising=False)
    # The measured step's optimizer, made first: torch changes its own classes as it makes its first (its
    # step's profiling wrapper) and registers its own exit callbacks with the modules it imports then.
    model, x = Net(), torch.randn(2, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    exits, forks = REGISTERED["atexit"], REGISTERED["fork"]
    exits[:], forks[:] = [], []
    monkeypatch.setattr(atexit, "register", exits.append)
    monkeypatch.setattr(atexit, "unregister", lambda fn: exits.remove(fn))
    monkeypatch.setattr(os, "register_at_fork", lambda **when: forks.append(when))
    # Without CUDA torch takes no OOM observer: one that takes it, as a CUDA build's does.
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", lambda fn: None)
    before = _process()
    shim = Shim(tmp_path, torch, full=True)
    T = shim.torch
    seen = []
    try:
        monkeypatch.setattr(T, "_ipython", lambda: None)
        monkeypatch.setattr(T.S, "devices", [0])
        # The allocator's readings played, as after CUDA's start (a measure reads them).
        monkeypatch.setattr(T.S, "orig_stats", _stats)
        monkeypatch.setattr(T.S, "orig_reset", lambda device=0: None)
        T.watch_cells(Shell())
        T._on_cuda_init()
        seen += T._patches().live  # the forward clock's search for the outermost module
        model(x)  # the forward clock takes the model
        assert T.F.root() is model
        assert T._where("arm", opt) is True
        model(x).sum()  # a measured step's forward: the hooks on its graph
        seen += T._patches().live
        T._where("close")
        model.eval()
        T._hide_history()
        seen += T._patches().live
        assert T._where("arm_call", model, "inference") is True
        seen += T._patches().live
        yield T, before, seen
    finally:
        shim.remove()


def test_every_change_of_torch_goes_through_the_registry(everything):
    T, before, _ = everything
    model_call = T._patches().find(Net, "__call__")
    assert model_call is not None and model_call.kind == "added"
    attrs, hooks, queued, callbacks = _process()
    registered = set((p.owner, p.name) for p in T._patches().live if p.kind in ("replaced", "added"))
    names = dict((id(o), n) for n, o in _owners().items())
    assert _changed(before[0], attrs) == set((names[id(o)], k) for o, k in registered)
    assert len(registered) > 5
    ours = [p.new for p in T._patches().live if p.kind == "hook"]
    for kind, found in hooks.items():
        new = [h for h in found if h not in before[1][kind]]
        assert len(new) == len([h for h in ours if h.id in _hook_dict(kind)]), kind
    listed = [p.target for p in T._patches().live if p.kind == "callback"]
    assert queued - before[2] == listed.count("torch.cuda._lazy_call")
    assert len(callbacks["atexit"]) == listed.count("atexit")
    assert len(callbacks["fork"]) == listed.count("os.register_at_fork")


def _hook_dict(kind):
    from torch.nn.modules import module
    from torch.optim import optimizer

    return {"forward": module._global_forward_hooks, "forward pre": module._global_forward_pre_hooks,
            "step post": optimizer._global_optimizer_post_hooks,
            "step pre": optimizer._global_optimizer_pre_hooks}[kind]


def test_taking_the_changes_back_leaves_torch_exactly_as_it_was(everything):
    T, before, _ = everything
    T._where("close")
    T._forward_clock_off()
    lasting = T._patches().remove_all()
    attrs, hooks, _, callbacks = _process()
    assert _changed(before[0], attrs) == set()
    for kind, found in hooks.items():
        assert found == before[1][kind], kind
    assert callbacks["atexit"] == before[3]["atexit"]
    # What stays is what Python or torch keeps for the process's life, and says so.
    assert set(p.target for p in lasting) <= {"torch.cuda._lazy_call", "os.register_at_fork",
                                              "torch._C._cuda_attach_out_of_memory_observer"}
    assert all(not p.removable for p in lasting)


def test_a_replacement_reads_as_the_original(everything):
    T, _, _ = everything
    for p in T._patches().live:
        if p.kind != "replaced":
            continue
        real, new = p.original, p.new
        assert (new.__name__, new.__qualname__, new.__module__, new.__doc__) == (
            real.__name__, real.__qualname__, real.__module__, real.__doc__), p.target
        assert not hasattr(new, "__wrapped__"), p.target
        try:
            expected = inspect.signature(real)
        except ValueError:
            continue  # a builtin of torch._C: no signature to read
        assert inspect.signature(new) == expected, p.target
    call = T._patches().find(Net, "__call__").new
    assert inspect.signature(call) == inspect.signature(torch.nn.Module.__call__)


def test_gpudoc_patches_lists_the_changes_in_place(everything):
    import gpudoc

    T, _, _ = everything
    listed = gpudoc.patches()
    assert listed == T._patches().listing()
    assert {"target": "torch.autograd.backward", "kind": "replaced",
            "why": "counts backward calls, for an OOM's phase", "removable": True} in listed
    T._patches().remove_all()
    assert [p["removable"] for p in gpudoc.patches()] == [False] * len(gpudoc.patches())


def _table(seen):
    rows, done = [], set()
    for p in seen:
        key = (p.shown, p.kind, p.why)
        if key not in done:
            done.add(key)
            rows.append("| `%s` | %s | %s | %s |" % (p.shown, p.kind, p.why, "yes" if p.removable else "no"))
    head = ["| what | change | why | taken back |", "|---|---|---|---|"]
    return "\n".join([BEGIN] + head + rows + [END])


def test_the_docs_list_every_change_the_registry_makes(everything):
    _, _, seen = everything
    with open(DOC) as f:
        doc = f.read()
    table = _table(seen)
    found = re.search(re.escape(BEGIN) + ".*?" + re.escape(END), doc, re.S)
    assert found is not None, "docs/framework.md has no table between %s and %s" % (BEGIN, END)
    if os.environ.get("GPUDOC_BLESS") == "1":
        with open(DOC, "w") as f:
            f.write(doc[:found.start()] + table + doc[found.end():])
        return
    assert found.group(0) == table, "docs/framework.md's table of the shim's changes is stale: run " \
        "GPUDOC_BLESS=1 PYTHONPATH=python target/py-venv/bin/python -m pytest " + __file__
