"""The shim's torch module loaded from a shim folder as gpudoc run's finder loads it, for the benches that
time it (shim_load.py, clock_call.py, eval_parts.py): the folder's loader (`_gpudoc_pipe.py`, in
sys.modules as gpudoc._shim.pipe, which the torch module's parts read) first, then the module by its
`load`. A folder from before the loader (an older copy to compare with) has its module run directly."""
import os
import sys

LOADER, NAME = "gpudoc._shim.pipe", "gpudoc._shim.torch"


def loader(here):
    """The folder's loader module, run once (None for a folder without one)."""
    path = os.path.join(here, "_gpudoc_pipe.py")
    if not os.path.exists(path):
        return None
    module = sys.modules.get(LOADER)
    if module is None or getattr(module, "_bench_here", None) != here:
        ext = sys.modules["_frozen_importlib_external"]
        module = type(sys)(LOADER)
        module.__file__ = "<gpudoc> " + path
        sys.modules[LOADER] = module
        exec(ext.SourceFileLoader(LOADER, path).get_code(LOADER), module.__dict__)
        module._bench_here = here
    return module


def load(here):
    """A fresh copy of the folder's torch module (the one loaded before, if any, dropped)."""
    sys.modules.pop(NAME, None)
    pipe = loader(here)
    if pipe is not None:
        module = pipe.load(here, "_gpudoc_torch.py", NAME)
        module.S.here = here  # where its parts and the patch registry are read from, as the finder says
        return module
    ext = sys.modules["_frozen_importlib_external"]
    path = os.path.join(here, "_gpudoc_torch.py")
    module = type(sys)(NAME)
    module.__file__ = "<gpudoc> " + path
    sys.modules[NAME] = module
    exec(ext.SourceFileLoader(NAME, path).get_code(NAME), module.__dict__)
    return module
