"""The shim's notebook API (_gpudoc_torch_notebook.py; issue 45, item 5): the notebook extension
calls it and nothing else of the shim's, each of its names is public, documented and called as the
extension's `ShimApi` declares, and each does what the extension relies on. Real torch on the CPU."""
import ast
import inspect
import os

import pytest
from shim_env import HERE, ROOT

torch = pytest.importorskip("torch")
notebook = pytest.importorskip("gpudoc.notebook")


def _api_names():
    return sorted(n for n in vars(notebook.ShimApi) if not n.startswith("_")) + sorted(
        notebook.ShimApi.__annotations__)


def test_every_name_of_the_api_is_the_shims_public_and_documented(shim):
    module = shim.torch
    for name in _api_names():
        assert not name.startswith("_"), name
        value = getattr(module, name)  # the shim has it
        if callable(value) and not isinstance(value, type):
            assert (value.__doc__ or "").strip(), "%s has no doc" % name
            declared = inspect.signature(getattr(notebook.ShimApi, name))
            params = [p for p in declared.parameters if p != "self"]
            assert list(inspect.signature(value).parameters) == params, name
    assert module.API == notebook.API


def test_the_extension_calls_nothing_of_the_shims_but_its_api():
    """Every attribute the extension reads of the shim's API object (`api.x`, `shim.api.x`) is the API's;
    no other object of the shim's is reached (its state, its hunt module)."""
    with open(os.path.join(ROOT, "python", "gpudoc", "notebook.py")) as f:
        tree = ast.parse(f.read())
    names, used = set(_api_names()), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Name) and base.id == "api") or (
                    isinstance(base, ast.Attribute) and base.attr == "api"):
                used.add(node.attr)
    assert used and used <= names, used - names
    source = ast.dump(tree)
    for private in ("_hunt_module", "'S'", "CELL", "_in_use", "_cur", "_Root", "MAX_TB_FRAMES"):
        assert private not in source, private


def test_messages_are_kept_from_keep_messages_on_and_taken_once(shim):
    api = shim.torch
    api._send('{"k":"before"')
    api.keep_messages()
    api._send('{"k":"cell","n":3')
    taken = api.take_messages()
    assert [(m["k"], m.get("n")) for m in taken] == [("cell", 3)]
    assert taken[0]["pid"] == os.getpid()
    assert api.take_messages() == []


def test_the_allocator_is_read_for_each_device_in_use(shim, cuda, monkeypatch):
    stats = {0: {"num_device_alloc": 2, "allocated_bytes": {"all": {"current": 5 << 20, "peak": 6 << 20}},
                 "reserved_bytes": {"all": {"current": 8 << 20, "peak": 8 << 20}}},
             1: {"num_device_alloc": 0}}
    monkeypatch.setattr(cuda.S, "orig_stats", lambda d: stats[d])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert cuda.cuda_ready()
    assert cuda.allocator() == [(0, 5 << 20, 8 << 20)]


def test_a_notebooks_own_shim_starts_no_leak_hunt_at_the_steps(shim, cuda, monkeypatch):
    api = shim.torch
    monkeypatch.setattr(api, "HUNT", "on")
    api.attach(torch, HERE, hunts=False)
    api.STEP[0] = api.WARMUP_STEPS + 5
    api._hunt_step(api.STEP[0])
    assert api.S.hunt is None
    assert [m for m in shim.messages() if m.get("k") == "hunt"] == []


def test_the_extension_takes_gpudoc_runs_shim_and_refuses_another_versions(shim, monkeypatch):
    monkeypatch.setattr(notebook, "_OWN", {})
    found = notebook.find_shim(torch)
    assert found.api is shim.torch and not found.own
    monkeypatch.setattr(shim.torch, "API", notebook.API + 1)
    with pytest.raises(RuntimeError, match="another version's"):
        notebook.find_shim(torch)


def test_a_search_of_one_value_keeps_it_no_longer_than_the_caller_keeps_the_search(shim, cuda):
    import gc
    import weakref

    class Box(object):
        pass

    box = Box()
    s = cuda.search(0, 1.0, value=box)
    assert s.done and s.storages == set()
    ref = weakref.ref(box)
    del box, s  # the search is the caller's: once it goes, nothing of the shim's keeps the value
    gc.collect()
    assert ref() is None
    assert cuda.traceback_frames() == shim.hunt.MAX_TB_FRAMES
