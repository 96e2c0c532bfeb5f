# gpudoc's shim, put first on PYTHONPATH by `gpudoc run`. Kept tiny, and valid Python 2 and 3, because
# every Python process of the job compiles it at start-up: it only watches for `import torch`, and loads
# the rest (_gpudoc_torch.py, beside it) when that happens. One shim per process, however gpudoc runs are
# nested; it never raises; and it always runs the sitecustomize the environment had before it.
import os
import sys


def _gpudoc_folders():
    """Every folder on sys.path that holds a gpudoc shim (this one and any other gpudoc's)."""
    out = []
    for p in sys.path:
        try:
            if os.path.isfile(os.path.join(p or ".", ".gpudoc-shim")):
                out.append(os.path.abspath(p or "."))
        except Exception:
            pass
    return out


def _gpudoc_watch(here):
    if getattr(sys, "_gpudoc_shim", None) is not None:
        return
    sys._gpudoc_shim = here
    if sys.version_info < (3, 6) or not os.environ.get("GPUDOC_TORCH_PIPE"):
        return

    class GpudocFinder(object):
        """Sees `import torch` through the other finders, once, and imports nothing unless torch is found."""

        _gpudoc = True
        busy = False

        def find_spec(self, name, path=None, target=None):
            # Other finders that ask every finder in turn (a tracer's, a program's own) call back in here.
            if name != "torch" or GpudocFinder.busy:
                return None
            GpudocFinder.busy = True
            try:
                for finder in list(sys.meta_path):
                    if getattr(finder, "_gpudoc", False) or not hasattr(finder, "find_spec"):
                        continue
                    spec = finder.find_spec(name, path, target)
                    if spec is None or spec.loader is None:
                        continue
                    try:
                        sys.path.insert(0, here)
                        try:
                            import _gpudoc_torch
                        finally:
                            sys.path.remove(here)
                        _gpudoc_torch.hook_loader(spec)
                    except Exception:
                        pass
                    return spec
                return None
            finally:
                GpudocFinder.busy = False

    sys.meta_path.insert(0, GpudocFinder())


def _gpudoc_chain():
    """Runs the sitecustomize this one shadows, if the environment has one: never another gpudoc's."""
    skip = _gpudoc_folders()
    path = [p for p in sys.path if os.path.abspath(p or ".") not in skip]
    if sys.version_info >= (3, 4):
        # The import machinery is loaded at start-up: chaining imports no module of its own.
        machinery = sys.modules.get("_frozen_importlib_external")
        bootstrap = sys.modules.get("_frozen_importlib")
        if machinery is None or bootstrap is None:
            return
        spec = machinery.PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.loader is None:
            return
        module = bootstrap.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    else:
        import imp

        try:
            found = imp.find_module("sitecustomize", path)
        except ImportError:
            return
        try:
            imp.load_module("sitecustomize", *found)
        finally:
            if found[0] is not None:
                found[0].close()


try:
    _gpudoc_watch(os.path.dirname(os.path.abspath(__file__)))
except Exception:
    pass
_gpudoc_chain()
